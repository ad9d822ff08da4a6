//! `locksmith bench`: the conformance benchmark (uncontended latency against the backend's
//! round trip and bare primitive, hand-over between tasks) plus what needs separate OS
//! processes: hand-over between processes (per-process counts, spread), fairness over a longer
//! run with more processes (the fewest acquisitions of one process against a fair share), and
//! the server's requests per hand-over with many waiters spread over several processes.
//!
//! The processes are this binary run as `locksmith __bench-worker` (the URL in its
//! environment, never in argv). Each connects its clients, says `ready`, waits for `go` on
//! stdin, loops `lock` + `release` for the given time, and prints the moments its `lock()`
//! calls returned and its releases were sent (see [`crate::handover_latency`]), then its counts.
//! The waiters run that counts requests also says when all its clients wait and stops when
//! told: its figures are counted over a steady window ([`crate::steady`]).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use conformance::{
    ClientProxies, Figures, HandoverLatency, ProcessHandover, RequestCount, ServerRequests,
};
use locksmith::{ErrorKind, Fencing, LockName, LockOptions, Locker};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::bench_table::{self, Conditions, Row, cells, plain_table, shown_command};
use crate::handover_latency::{self, Stamp, TIMES_PREFIX};
use crate::harness::{UrlHarness, labels};
use crate::steady::{self, OncePerWaiter, QUEUED, STOP, Sample, Samples, Stop};

/// The environment variable that hands a worker its URL.
const WORKER_URL_ENV: &str = "LOCKSMITH_BENCH_URL";
/// Set (to `off`) when the workers' acquisitions ask for no fencing token.
const WORKER_FENCING_ENV: &str = "LOCKSMITH_BENCH_FENCING";

/// Starts this binary as a worker process (`args` adds its subcommand and flags), the URL in
/// its environment (never in argv, which any user can read), stdin and stdout piped, killed
/// when its handle is dropped.
pub(crate) fn spawn_worker(url: &str, args: impl FnOnce(&mut Command)) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?;
    let mut command = Command::new(exe);
    args(&mut command);
    command
        .env(WORKER_URL_ENV, url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("starting a worker process: {e}"))
}

/// The URL a worker process was given (see [`spawn_worker`]).
pub(crate) fn worker_url() -> locksmith::Result<String> {
    std::env::var(WORKER_URL_ENV)
        .map_err(|_| locksmith::Error::invalid_config(format!("{WORKER_URL_ENV} is not set")))
}

/// What the multi-process measurements use.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// How long each contended run lasts.
    pub secs: Duration,
    /// Processes (one client each) for the process hand-over rate.
    pub processes: usize,
    /// Waiting clients in all for requests per hand-over.
    pub waiters: usize,
    /// Over how many processes the waiters are spread.
    pub waiter_processes: usize,
    /// Processes (one client each) of the fairness run; 0 skips it.
    pub fair_processes: usize,
    /// How long the fairness run lasts.
    pub fair_secs: Duration,
    /// Whether every acquisition (in-process and in the workers) asks for a fencing token.
    pub fencing: Fencing,
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            secs: Duration::from_secs(2),
            processes: 4,
            waiters: 100,
            waiter_processes: 10,
            fair_processes: 8,
            fair_secs: Duration::from_secs(10),
            fencing: Fencing::IfAvailable,
        }
    }
}

/// Why the multi-process runs do not apply to a URL, if they do not.
fn single_process_only(url: &str) -> Option<&'static str> {
    locksmith::scheme_of(url)
        .is_ok_and(|s| s == "memory")
        .then_some("memory:// locks exist inside one process")
}

/// Adds the multi-process figures of `url` to `figures` (left `None` where they do not apply
/// or failed; a failure is printed). Returns the requests run's one-off cost per waiter, where
/// counted.
pub async fn add_process_figures(
    url: &str,
    label: &str,
    figures: &mut Figures,
    plan: Plan,
) -> Option<OncePerWaiter> {
    if let Some(why) = single_process_only(url) {
        eprintln!("[bench] {label}: no multi-process figures: {why}");
        return None;
    }
    eprintln!(
        "[bench] {label}: hand-over across {} processes, then {} waiters over {} processes ({} s each)",
        plan.processes,
        plan.waiters,
        plan.waiter_processes,
        plan.secs.as_secs_f64()
    );
    match processes(url, plan.processes, plan.secs, plan.fencing, Loop::Library).await {
        Ok((p, latency)) => {
            figures.processes = Some(p);
            figures.handover_latency = latency;
        }
        Err(e) => eprintln!("[bench] {label}: process hand-over failed: {e}"),
    }
    if plan.processes > 0 && bare_cycle_waits(url).await {
        eprintln!(
            "[bench] {label}: the bare primitive's hand-over across {} processes ({} s)",
            plan.processes,
            plan.secs.as_secs_f64()
        );
        match processes(url, plan.processes, plan.secs, plan.fencing, Loop::Bare).await {
            Ok((p, _)) => figures.bare_processes = Some(p),
            Err(e) => eprintln!("[bench] {label}: bare hand-over failed: {e}"),
        }
    }
    if plan.fair_processes > 0 {
        eprintln!(
            "[bench] {label}: fairness across {} processes ({} s)",
            plan.fair_processes,
            plan.fair_secs.as_secs_f64()
        );
        match processes(
            url,
            plan.fair_processes,
            plan.fair_secs,
            plan.fencing,
            Loop::Library,
        )
        .await
        {
            Ok((p, _)) => figures.fairness = Some(p),
            Err(e) => eprintln!("[bench] {label}: fairness run failed: {e}"),
        }
    }
    match server_requests(url, label, plan).await {
        Ok((r, once)) => {
            figures.server_requests = Some(r);
            Some(once)
        }
        Err(e) => {
            eprintln!("[bench] {label}: requests per hand-over failed: {e}");
            None
        }
    }
}

/// What the worker processes loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loop {
    /// `lock` + `release` through the library.
    Library,
    /// The backend's bare primitive ([`locksmith::Backend::bare_cycle`]), where it waits.
    Bare,
}

/// Whether the backend of `url` has a bare primitive that waits (so that processes looping it
/// hand a lock over); false when it cannot be asked.
async fn bare_cycle_waits(url: &str) -> bool {
    match locksmith::connect(url).await {
        Ok(probe) => {
            let waits = probe.backend().bare_cycle_waits();
            probe.flush().await;
            waits
        }
        Err(_) => false,
    }
}

/// `processes` processes with one client each contend for `secs`: their hand-over rate, and
/// the latency of their hand-overs between processes where they stamped them.
async fn processes(
    url: &str,
    processes: usize,
    secs: Duration,
    fencing: Fencing,
    looped: Loop,
) -> Result<(ProcessHandover, Option<HandoverLatency>), String> {
    let run = contend(url, processes, 1, secs, None, fencing, looped).await?;
    let latency = handover_latency::latency(handover_latency::cross_process_handovers(&run.stamps));
    let per_process: Vec<u64> = run.counts.iter().map(|c| c.iter().sum()).collect();
    let total: u64 = per_process.iter().sum();
    let handover = ProcessHandover {
        processes,
        secs: secs.as_secs_f64(),
        handover_per_sec: total as f64 / secs.as_secs_f64(),
        per_process,
    };
    Ok((handover, latency))
}

/// `plan.waiters` clients over `plan.waiter_processes` processes contend, counted over a
/// steady window of `plan.secs` ([`crate::steady`]): from the moment every waiter has been
/// seen waiting to the moment before the workers are told to stop. The figures of
/// [`ServerRequests`] are the window's (its `handovers` the acquisitions stamped in it); what
/// the rest of the run counted beyond the window's rate is the one-off cost per waiter.
///
/// The waiters' own requests are counted too, by proxies in front of them where the servers
/// are on loopback ([`ClientProxies::counting`]): a server's counter includes what its scripts
/// run inside (Redis counts each command of a Lua script) and whatever else the server serves
/// (PostgreSQL's transaction counter is the database's), while the herd goal is about what
/// clients send. The probe reading the server's counter does not go through them.
async fn server_requests(
    url: &str,
    label: &str,
    plan: Plan,
) -> Result<(ServerRequests, OncePerWaiter), String> {
    let probe = locksmith::connect(url).await.map_err(|e| e.to_string())?;
    let per_process = plan.waiters.div_ceil(plan.waiter_processes.max(1));
    let proxies = ClientProxies::new();
    let counted = if ClientProxies::can_proxy(url) {
        Some(
            proxies
                .counting(url)
                .await
                .map_err(|e| format!("starting the counting proxies: {e}"))?,
        )
    } else {
        None
    };
    let run = contend(
        counted
            .as_ref()
            .map_or(url, |(through, _)| through.as_str()),
        plan.waiter_processes,
        per_process,
        plan.secs,
        Some(Counters {
            server: &probe,
            clients: counted.as_ref().map(|(_, count)| count),
        }),
        plan.fencing,
        Loop::Library,
    )
    .await?;
    probe.flush().await;
    let samples = run
        .samples
        .ok_or_else(|| "the waiters run took no samples".to_owned())?;
    let waiters = per_process * plan.waiter_processes;
    let all: u64 = run.counts.iter().flatten().sum();
    let window = samples
        .window_ns()
        .map(|(from, to)| steady::acquisitions_within(&run.stamps, from, to));
    let mut out = ServerRequests {
        waiters,
        processes: plan.waiter_processes,
        handovers: window.unwrap_or(0),
        ..ServerRequests::default()
    };
    let mut once = OncePerWaiter::default();
    if let Err(e) = &samples.start.server
        && e.kind() == ErrorKind::Unsupported
    {
        out.unsupported = Some(e.to_string());
    }
    let Some(window) = window else {
        eprintln!(
            "[bench] {label}: not every waiter was seen waiting within the run: no steady \
             window, no requests per hand-over"
        );
        return Ok((out, once));
    };
    match samples.server() {
        _ if out.unsupported.is_some() => {}
        Some(Err(e)) => return Err(format!("reading the server's request counter: {e}")),
        Some(Ok(readings)) => {
            if let Some(c) = steady::counted(readings, window, all, waiters) {
                out.requests = Some(c.steady);
                out.per_handover = Some(c.per_handover);
                once.server = Some(c.once_per_waiter);
            }
        }
        None => {}
    }
    if let Some(c) = samples
        .sent()
        .and_then(|readings| steady::counted(readings, window, all, waiters))
    {
        out.client_requests = Some(c.steady);
        out.client_per_handover = Some(c.per_handover);
        once.sent = Some(c.once_per_waiter);
    }
    let (from, to) = samples.window_ns().unwrap_or_default();
    eprintln!(
        "[bench] {label}: steady window {:.2} s (system clock {from}..{to} ns), {window} of \
         {all} hand-overs: {} sent and {} at the server per hand-over; once per waiter: {} \
         sent, {} at the server",
        to.saturating_sub(from) as f64 / 1e9,
        out.client_per_handover
            .map_or("-".into(), |v| format!("{v:.3}")),
        out.per_handover.map_or("-".into(), |v| format!("{v:.3}")),
        once.sent.map_or("-".into(), |v| format!("{v:.1}")),
        once.server.map_or("-".into(), |v| format!("{v:.1}")),
    );
    Ok((out, once))
}

/// What a contended run counts: the server's request counter (read through `server`), and the
/// requests the workers send where proxies count them.
struct Counters<'a> {
    server: &'a Locker,
    clients: Option<&'a RequestCount>,
}

/// What one contended run gave: per process, per client acquisitions; the counters' samples
/// when asked for.
struct Contended {
    counts: Vec<Vec<u64>>,
    /// Per process, its stamps (none where the bare primitive was looped).
    stamps: Vec<Vec<Stamp>>,
    /// With counters: their readings ([`crate::steady`]).
    samples: Option<Samples>,
}

/// A started worker process.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Worker {
    /// Writes `word` and a newline to the worker's stdin.
    async fn tell(&mut self, word: &str) -> Result<(), String> {
        self.stdin
            .write_all(format!("{word}\n").as_bytes())
            .await
            .map_err(|e| format!("telling a worker {word:?}: {e}"))
    }

    /// The next line the worker prints, within `limit`.
    async fn line(&mut self, limit: Duration) -> Result<String, String> {
        match tokio::time::timeout(limit, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => Err("a worker process ended without answering".into()),
            Ok(Err(e)) => Err(format!("reading a worker: {e}")),
            Err(_) => Err(format!("a worker did not answer within {limit:?}")),
        }
    }
}

/// How long the waiters run waits for every waiter to be seen waiting (at least): past it,
/// the run has no steady window.
const QUEUED_LIMIT: Duration = Duration::from_secs(30);

/// Starts `processes` workers with `clients` each on one fresh name, waits until all are
/// connected, starts them together, and collects their counts. With `counters`, the run is
/// counted over a steady window of `secs` ([`crate::steady`]); without, it lasts `secs`.
async fn contend(
    url: &str,
    processes: usize,
    clients: usize,
    secs: Duration,
    counters: Option<Counters<'_>>,
    fencing: Fencing,
    looped: Loop,
) -> Result<Contended, String> {
    let name = format!("lsbench-procs-{:08x}", fastrand::u32(..));
    let connect_limit = Duration::from_secs(60);
    let counted = counters.is_some();
    // A counted run stops when told; its deadline only bounds a run whose parent went silent.
    let run_limit = if counted {
        secs + QUEUED_LIMIT.max(secs) + connect_limit
    } else {
        secs
    };
    let mut workers = Vec::with_capacity(processes);
    for _ in 0..processes {
        let mut child = spawn_worker(url, |c| {
            c.arg("__bench-worker")
                .args(["--clients", &clients.to_string()])
                .args(["--millis", &run_limit.as_millis().to_string()])
                .arg(&name)
                .args((looped == Loop::Bare).then_some("--bare"))
                .args(counted.then_some("--steady"))
                .env(
                    WORKER_FENCING_ENV,
                    if fencing.wanted() { "default" } else { "off" },
                );
        })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("a worker process has no pipes".into());
        };
        workers.push(Worker {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        });
    }
    for w in &mut workers {
        let line = w.line(connect_limit).await?;
        if line != "ready" {
            return Err(format!("a worker could not start: {line}"));
        }
    }
    let start = match &counters {
        Some(c) => Some(Sample::take(c.server, c.clients).await),
        None => None,
    };
    for w in &mut workers {
        w.tell("go").await?;
    }
    let mut window = None;
    if let Some(c) = &counters {
        if every_waiter_queued(&mut workers, QUEUED_LIMIT.max(secs)).await? {
            let from = Sample::take(c.server, c.clients).await;
            // The window's length: what it counts is a steady state, whenever it starts.
            tokio::time::sleep(secs).await;
            window = Some((from, Sample::take(c.server, c.clients).await));
        }
        for w in &mut workers {
            w.tell(STOP).await?;
        }
    }
    let mut counts = Vec::with_capacity(processes);
    let mut stamps = Vec::with_capacity(processes);
    for w in &mut workers {
        let mut line = w.line(run_limit + connect_limit).await?;
        if line == QUEUED {
            // Seen waiting after the parent gave up waiting for it.
            line = w.line(run_limit + connect_limit).await?;
        }
        if let Some(words) = line.strip_prefix(TIMES_PREFIX) {
            stamps.push(
                handover_latency::parse_times(words)
                    .ok_or_else(|| "a worker printed a malformed times line".to_owned())?,
            );
            line = w.line(connect_limit).await?;
        }
        let Some(numbers) = line.strip_prefix("counts ") else {
            return Err(format!("a worker failed: {line}"));
        };
        let parsed: Result<Vec<u64>, _> = numbers.split_whitespace().map(str::parse).collect();
        counts.push(parsed.map_err(|_| format!("a worker printed {line:?}"))?);
    }
    for w in workers {
        let Worker {
            mut child, stdin, ..
        } = w;
        // Its stdin closed: nothing more to read there.
        drop(stdin);
        let _ = child.wait().await;
    }
    let samples = match (start, &counters) {
        (Some(start), Some(c)) => Some(Samples {
            start,
            steady: window,
            end: Sample::take(c.server, c.clients).await,
        }),
        _ => None,
    };
    Ok(Contended {
        counts,
        stamps,
        samples,
    })
}

/// Waits until every worker said [`QUEUED`] (each of its clients has been seen waiting), at
/// most `limit`: false if one did not in time.
async fn every_waiter_queued(workers: &mut [Worker], limit: Duration) -> Result<bool, String> {
    let deadline = tokio::time::Instant::now() + limit;
    for w in workers {
        // Cancel safe (`Lines::next_line`): a line that comes later is read later.
        match tokio::time::timeout_at(deadline, w.lines.next_line()).await {
            Ok(Ok(Some(line))) if line == QUEUED => {}
            Ok(Ok(Some(line))) => return Err(format!("a worker failed: {line}")),
            Ok(Ok(None)) => return Err("a worker process ended without answering".into()),
            Ok(Err(e)) => return Err(format!("reading a worker: {e}")),
            Err(_) => return Ok(false),
        }
    }
    Ok(true)
}

/// How a worker process runs (`locksmith __bench-worker` flags).
#[derive(Clone, Copy, Debug)]
pub struct WorkerRun {
    /// Clients in the process.
    pub clients: usize,
    /// How long it contends after `go`, in milliseconds (at most, with `steady`).
    pub millis: u64,
    /// Loops the backend's bare primitive instead of `lock` + `release`.
    pub bare: bool,
    /// Prints [`QUEUED`] once every client has been seen waiting, and stops at a [`STOP`]
    /// line on stdin (or at `millis`, whichever comes first).
    pub steady: bool,
}

/// `locksmith __bench-worker`: connects `run.clients` clients to the URL in its environment,
/// prints `ready`, waits for `go`, loops `lock` + `release` (with `bare`, the backend's bare
/// primitive) on `name` with every client for `millis` (with `steady`, until told to stop, and
/// prints `queued` once each client has waited), prints its stamps (`times ...`, see
/// [`handover_latency::times_line`]) then `counts N N ...`. Returns the exit code.
pub async fn worker(name: &str, run: WorkerRun) -> u8 {
    match worker_inner(name, run).await {
        Ok((counts, stamps)) => {
            println!("{}", handover_latency::times_line(&stamps));
            let counts: Vec<String> = counts.iter().map(u64::to_string).collect();
            println!("counts {}", counts.join(" "));
            0
        }
        Err(e) => {
            // One line: the parent reads it as the failure.
            println!("error {}", e.to_string().replace('\n', " "));
            1
        }
    }
}

async fn worker_inner(name: &str, run: WorkerRun) -> locksmith::Result<(Vec<u64>, Vec<Stamp>)> {
    let WorkerRun {
        clients,
        millis,
        bare,
        steady,
    } = run;
    let url = worker_url()?;
    let name = LockName::new(name)?;
    let mut lockers = Vec::with_capacity(clients);
    for _ in 0..clients {
        lockers.push(locksmith::connect(&url).await?);
    }
    println!("ready");
    let mut go = String::new();
    let mut stdin = BufReader::new(tokio::io::stdin());
    stdin
        .read_line(&mut go)
        .await
        .map_err(|e| locksmith::Error::new(ErrorKind::Backend, format!("reading stdin: {e}")))?;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(millis);
    // Without `steady` nothing reads stdin again: a read left pending on it would hold up the
    // runtime's shutdown.
    let stop = Stop::new(deadline, steady.then_some(stdin));
    let _queued =
        steady.then(|| steady::report_queued(lockers.clone(), name.clone(), stop.clone()));
    // The default options, as a user who sets nothing gets them: TTL 30 s, waiting without a
    // deadline, the guard renewed in the background (issue 38: on Redis a granted hand-over
    // holds without a second request only when the lease is renewed).
    let opts = LockOptions::new();
    let opts = if std::env::var(WORKER_FENCING_ENV).is_ok_and(|v| v == "off") {
        opts.no_fencing()
    } else {
        opts
    };
    let tasks: Vec<_> = lockers
        .iter()
        .map(|locker| {
            let (locker, name, opts) = (locker.clone(), name.clone(), opts.clone());
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut count = 0u64;
                let mut stamps = Vec::new();
                if bare {
                    // Cut off when the run stops: the lock it may hold goes with its
                    // connection or its TTL; the run is over.
                    while let Some(cycle) = stop.until(locker.backend().bare_cycle(&name)).await {
                        cycle?;
                        count += 1;
                    }
                    return Ok((count, stamps));
                }
                // A wait cut off when the run stops is dropped: cancel safe by the contract.
                while let Some(guard) = stop.until(locker.lock(&name, &opts)).await {
                    let guard = guard?;
                    stamps.push(Stamp::Acquired(handover_latency::now_ns()));
                    count += 1;
                    stamps.push(Stamp::Released(handover_latency::now_ns()));
                    guard.release().await?;
                    if stop.is_set() {
                        break;
                    }
                }
                Ok::<_, locksmith::Error>((count, stamps))
            })
        })
        .collect();
    let mut counts = Vec::with_capacity(tasks.len());
    let mut stamps = Vec::new();
    for t in tasks {
        let (n, of_client) = t
            .await
            .map_err(|e| locksmith::Error::new(ErrorKind::Backend, e.to_string()))??;
        counts.push(n);
        stamps.extend(of_client);
    }
    for l in &lockers {
        l.flush().await;
    }
    Ok((counts, stamps))
}

/// `locksmith bench URL...`: measures every URL and prints one table; with `markdown`, also
/// writes it as a Markdown file that says how and when it was measured ([`bench_table::markdown`]).
/// Returns 0, 1 if a measurement failed, or 2 if the file could not be written.
pub async fn bench(urls: &[String], plan: Plan, markdown: Option<&Path>) -> u8 {
    let started = Conditions::now();
    let labels = labels(urls);
    let mut rows: Vec<Row> = Vec::new();
    let mut code = 0;
    for (label, url) in labels.into_iter().zip(urls) {
        let harness = UrlHarness::probe(label.clone(), url.clone()).await;
        eprintln!(
            "[bench] {label}: {} (in-process figures, about 4 s)",
            harness.shown_url()
        );
        match conformance::measure_with(&harness, plan.fencing).await {
            Ok(mut f) => {
                if f.round_trip_p50_us.is_some() {
                    f.round_trip_one_thread_p50_us = round_trip_on_one_thread(url).await;
                }
                let once = add_process_figures(url, &label, &mut f, plan).await;
                rows.push(Row {
                    label,
                    figures: f,
                    once,
                });
            }
            Err(e) => {
                eprintln!("[bench] {label}: measurement failed: {e}");
                code = 1;
            }
        }
    }
    let cells = cells(&rows);
    print!("{}", plain_table(&cells));
    if let Some(path) = markdown {
        let command = shown_command(std::env::args());
        let text = bench_table::markdown(&command, &started, &Conditions::now(), &cells);
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("locksmith: cannot write {}: {e}", path.display());
            return 2;
        }
        eprintln!("[bench] figures written to {}", path.display());
    }
    code
}

/// Round trips measured on a current-thread runtime of their own (a thread apart), 1,000
/// after 100 to warm up: the median in µs, `None` when the client cannot connect or has no
/// round trip to measure.
async fn round_trip_on_one_thread(url: &str) -> Option<f64> {
    let url = url.to_owned();
    let measure = move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        rt.block_on(async move {
            let client = locksmith::connect(&url).await.ok()?;
            let backend = client.backend();
            let mut samples = Vec::with_capacity(1000);
            for i in 0..1100 {
                let start = std::time::Instant::now();
                backend.round_trip().await.ok()?;
                if i >= 100 {
                    samples.push(start.elapsed());
                }
            }
            client.flush().await;
            samples.sort();
            Some(samples[samples.len() / 2].as_secs_f64() * 1e6)
        })
    };
    tokio::task::spawn_blocking(measure).await.ok().flatten()
}
