//! The `locksmith` command: conformance reports and benchmarks of lock backends, and a lock
//! around a command (the cron-job use case).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod admin_cmd;
mod bench;
mod bench_table;
mod duration;
mod group;
mod handover_latency;
mod harness;
mod provenance;
mod renew_bench;
mod report_cmd;
mod run_cmd;
mod steady;

use duration::{Wait, parse_duration, parse_wait};

/// Exit codes of `locksmith run` besides the command's own; see `locksmith run --help`.
pub mod exit {
    /// The default for a busy lock (`--wait 0`) or a wait that timed out: nothing ran
    /// (sysexits EX_TEMPFAIL); `--busy-exit-code` changes it.
    pub const LOCK_BUSY: u8 = 75;
    /// The lock was lost while the command ran, and the command was terminated.
    pub const LOCK_LOST: u8 = 70;
    /// `--max-hold` was reached and the command was terminated (timeout(1)'s code).
    pub const MAX_HOLD: u8 = 124;
    /// The lock service could not be reached or failed (sysexits EX_UNAVAILABLE).
    pub const UNAVAILABLE: u8 = 69;
    /// Bad URL, lock name, TTL or option (sysexits EX_CONFIG).
    pub const CONFIG: u8 = 78;
    /// The lock service refused the credentials: wrong user or password, or a user without the
    /// rights ([`ErrorKind::Auth`](locksmith::ErrorKind::Auth) on every backend; sysexits
    /// EX_NOPERM).
    pub const AUTH: u8 = 77;
    /// The command was found but could not be executed (shell convention).
    pub const CANNOT_EXECUTE: u8 = 126;
    /// The command was not found (shell convention).
    pub const NOT_FOUND: u8 = 127;
}

#[derive(Parser, Debug)]
#[command(
    name = "locksmith",
    version,
    about = "Distributed locks behind one contract: conformance reports, benchmarks, and a lock around a command"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs the conformance suite against each URL and writes report.{json,md,html}.
    ///
    /// Exit code: 0 when no scenario failed (unsupported and skipped are not failures, nor
    /// passes), 1 when some failed, 2 on a usage error or when the report cannot be written.
    Report(ReportArgs),
    /// Runs a command while holding a lock (for cron jobs): at most one copy runs at a time.
    Run(RunArgs),
    /// Measures each URL: uncontended try_lock+release against the backend's round trip and bare
    /// primitive, hand-over between tasks and between separate OS processes (per-process
    /// counts and spread), fairness over a longer run with more processes (the fewest
    /// acquisitions of one process against a fair share), and server requests per hand-over
    /// with many waiters.
    Bench(BenchArgs),
    /// Who holds a lock: holder host, process id, label and when acquired, fencing token, TTL
    /// left and queued waiters, as the server has them.
    ///
    /// Exit code: 0 when the lock is held, 1 when it is free, 2 on an error (bad URL or name,
    /// server unreachable, a backend that cannot inspect locks).
    Status(StatusArgs),
    /// Frees a lock whoever holds it (an operator's override; needs --force). The holder's
    /// lease is refused at its next renewal and its lost signal fires.
    ///
    /// Exit code: 0 when something was released, 1 when the lock was not held, 2 on an error
    /// or without --force.
    Unlock(UnlockArgs),
    /// Internal: one process of `bench`'s multi-process runs.
    #[command(name = "__bench-worker", hide = true)]
    BenchWorker(BenchWorkerArgs),
    /// Internal: the process holding the leases of `bench --renewals`.
    #[command(name = "__renew-worker", hide = true)]
    RenewWorker(RenewWorkerArgs),
    /// The holder process of the report's crash scenarios: takes a lock and reports it as JSON
    /// lines until killed.
    #[command(hide = true)]
    Holder {
        /// The holder's flags (see `conformance::holder`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Args, Debug)]
struct ReportArgs {
    /// Where to write report.json, report.md and report.html.
    #[arg(long, default_value = "target/conformance")]
    out: PathBuf,
    /// Skip the benchmark (latency and hand-over figures).
    #[arg(long)]
    no_bench: bool,
    /// Put a fault matrix beside the scenario matrix (the Faults matrix and the fault times
    /// table): the JSON file the fault suite writes (`cargo run -p faults --bin
    /// locksmith-faults -- FILE`: every backend under holder kill and pause, server restart,
    /// partition, leader loss, slow replies, quorum loss, a node restarted empty and a clock
    /// jump, on throw-away topologies; not part of this command, which needs no server
    /// packages).
    #[arg(long, value_name = "FILE")]
    faults: Option<PathBuf>,
    /// Run only these scenarios (comma-separated names; the tests use it).
    #[arg(long, hide = true, value_delimiter = ',')]
    scenarios: Vec<String>,
    /// Lock service URLs, e.g. memory:// redis://127.0.0.1:6379 "postgres://u:pw@h/db?strategy=lease".
    /// Without any: the two embedded backends, memory:// and a SQLite file in the output
    /// directory (no server needed).
    urls: Vec<String>,
}

/// The lock service of `status` and `unlock`, as `run` takes it.
#[derive(Args, Debug)]
struct ServiceArgs {
    /// The lock service URL, e.g. redis://127.0.0.1:6379 or postgres://u:pw@h/db. Prefer the
    /// LOCKSMITH_URL environment variable: a password in argv shows in `ps`.
    #[arg(long, env = "LOCKSMITH_URL", hide_env_values = true)]
    url: String,
    /// How long connecting to the lock service may take before giving up (exit 2).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    connect_timeout: Duration,
}

#[derive(Args, Debug)]
struct StatusArgs {
    #[command(flatten)]
    service: ServiceArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// The lock's name.
    name: String,
}

#[derive(Args, Debug)]
struct UnlockArgs {
    #[command(flatten)]
    service: ServiceArgs,
    /// Really free the lock whoever holds it (refused without it).
    #[arg(long)]
    force: bool,
    /// The lock's name.
    name: String,
}

#[derive(Args, Debug)]
#[command(after_long_help = RUN_HELP)]
struct RunArgs {
    /// The lock service URL, e.g. redis://127.0.0.1:6379 or postgres://u:pw@h/db. Prefer the
    /// LOCKSMITH_URL environment variable: a password in argv shows in `ps`.
    #[arg(long, env = "LOCKSMITH_URL", hide_env_values = true)]
    url: String,
    /// Lease TTL: if locksmith dies, the lock frees after this long (`30s`, `1.5`, `500ms`).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
    /// How long to wait for a busy lock: `forever` (the default, as flock), a duration, or 0
    /// (one attempt).
    #[arg(short, long, default_value = "forever", value_parser = parse_wait)]
    wait: Wait,
    /// One attempt, no waiting (the same as --wait 0, flock's -n).
    #[arg(short = 'n', long, conflicts_with = "wait")]
    nonblock: bool,
    /// How long connecting to the lock service may take before giving up (exit 69).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    connect_timeout: Duration,
    /// The command runs for at most this long; then it is terminated (exit 124, as timeout(1)).
    /// The lease is renewed while the command runs and until --kill-grace after this, so that
    /// the command stops under the lock.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    max_hold: Duration,
    /// After SIGTERM, how long the command gets to exit before SIGKILL (shortened when the
    /// lock's validity would end sooner).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    kill_grace: Duration,
    /// The exit code when the lock is busy (no wait) or the wait timed out (flock's -E).
    #[arg(short = 'E', long, default_value_t = exit::LOCK_BUSY)]
    busy_exit_code: u8,
    /// No message when the lock is busy (so cron does not mail every skip); errors still print.
    #[arg(short, long)]
    quiet: bool,
    /// A label stored with the lock's holder metadata, shown by `locksmith status` (at most 256
    /// bytes, no control characters; readable by anyone who can read the lock).
    #[arg(long)]
    label: Option<String>,
    /// Take one of N permits of a semaphore instead of the lock: at most N copies of the
    /// command run at once across hosts. Every user of the name must give the same N; another
    /// N is refused while the name is held (exit 78).
    #[arg(long, value_name = "N", conflicts_with = "shared")]
    permits: Option<u32>,
    /// Take the lock shared, as a reader: the command runs beside other `--shared` holders,
    /// never beside a plain `run` (a writer) of the same name; a waiting writer goes first.
    #[arg(long)]
    shared: bool,
    /// The lock's name. A name that begins with `-` goes after --name instead.
    #[arg(required_unless_present = "name_option", value_name = "NAME")]
    name: Option<String>,
    /// The lock's name, in place of the NAME argument: for a name that begins with `-`
    /// (`--name=-job` or `--name -job`).
    #[arg(
        long = "name",
        id = "name_option",
        value_name = "NAME",
        conflicts_with = "name",
        allow_hyphen_values = true
    )]
    name_option: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "COMMAND")]
    command: Vec<String>,
}

impl RunArgs {
    /// The lock's name, from the NAME argument or --name.
    fn lock_name(&self) -> &str {
        self.name
            .as_deref()
            .or(self.name_option.as_deref())
            .unwrap_or_default()
    }

    /// What the run takes: the lock alone, a share (`--shared`) or a permit (`--permits N`).
    fn mode(&self) -> locksmith::LockMode {
        match (self.permits, self.shared) {
            (Some(limit), _) => locksmith::LockMode::Permit { limit },
            (None, true) => locksmith::LockMode::Shared,
            (None, false) => locksmith::LockMode::Exclusive,
        }
    }

    /// The effective wait: `--nonblock` is `--wait 0`.
    fn wait(&self) -> Wait {
        if self.nonblock {
            Wait::For(Duration::ZERO)
        } else {
            self.wait
        }
    }
}

const RUN_HELP: &str = "\
The command never outlives the lock. It runs in a process group of its own, under a small
guard process that kills the whole group if locksmith dies (even by SIGKILL: Linux
parent-death signal). Every catchable signal sent to locksmith (SIGINT, SIGTERM, SIGHUP,
SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGWINCH, SIGTSTP, SIGCONT, ...) is forwarded to the
whole group; after SIGTERM, SIGINT, SIGHUP or SIGQUIT the group gets SIGKILL if it is still
running --kill-grace later. While locksmith runs, the command runs only under the lock: when
the lock is at risk (no renewal has landed and at most half the TTL of validity is left: the
lock service is slow or unreachable), is lost (a renewal is refused), or --max-hold is reached,
the group gets SIGTERM, then SIGKILL after --kill-grace or shortly before the lock's validity
ends, whichever comes first (at once when the lock is already lost). Processes the command
leaves behind in its group are terminated the same way before the lock is released. What
this cannot cover: while locksmith itself is stopped (SIGSTOP, a frozen VM) it cannot act, and
the lease may run out under a command that keeps running; the command then learns nothing
until locksmith resumes and ends it. Pass LOCKSMITH_FENCING_TOKEN to what the command writes
where that matters. (Being in its own group, the command cannot read from the terminal; give
it input from a file or pipe.)

Every way out cleans up before locksmith exits (for 5 s at most; past that, what is left frees
with its TTL or session): the release after the command, and the queue entry of a wait that
timed out, failed, or was ended by SIGTERM, SIGINT, SIGHUP or SIGQUIT (then locksmith exits
with 128+N without running the command), so no one queued behind it waits for its session
or lease to end.

A lock name that begins with `-` goes after --name (`--name=-job`).

The command runs with LOCKSMITH_LOCK_NAME and, where the backend gives fencing tokens,
LOCKSMITH_FENCING_TOKEN in its environment (pass the token to whatever you write to).
memory:// is refused: its locks exist inside one process only. On one host without a
server, use sqlite:///path/to/locks.db.

Exit codes:
  the command's own   it ran and exited (128+N if it was killed by signal N)
  75 (--busy-exit-code) the lock was busy (--nonblock / --wait 0) or the wait timed out
  128+N               signal N (SIGTERM, SIGINT, SIGHUP, SIGQUIT) ended the wait
  70                  the lock was lost while the command ran; it was terminated
  124                 --max-hold was reached; the command was terminated
  69                  the lock service could not be reached (see --connect-timeout) or failed
  77                  the lock service refused the credentials (wrong user or password)
  78                  bad URL, lock name, TTL or option; --permits N while the name is held
                      with another N, or as a plain lock (a conflict); a backend that cannot
                      give --permits or --shared
  126 / 127           the command could not be executed / was not found
  2                   usage error

Example (cron, the password not in argv):
  LOCKSMITH_URL=redis://:pw@127.0.0.1:6379 locksmith run -n -q nightly-backup -- /usr/local/bin/backup.sh

At most 3 crawlers at once across hosts, each permit a lease as above:
  locksmith run --permits 3 crawler-slots -- ./crawl.sh
Readers together, a writer alone (a waiting writer goes before later readers):
  locksmith run --shared config -- ./read-config.sh
  locksmith run config -- ./write-config.sh";

#[derive(Args, Debug)]
struct BenchArgs {
    /// How long each contended run lasts (tasks, processes); for the waiters' requests per
    /// hand-over, how long their steady window lasts (from every waiter waiting to the stop).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    secs: Duration,
    /// Separate OS processes (one client each) handing the lock around.
    #[arg(long, default_value_t = 4)]
    processes: usize,
    /// Waiting clients in all for the server requests per hand-over.
    #[arg(long, default_value_t = 100)]
    waiters: usize,
    /// Over how many processes the waiters are spread.
    #[arg(long, default_value_t = 10)]
    waiter_processes: usize,
    /// Processes (one client each) of the fairness run: the fewest acquisitions of one
    /// process against a fair share (0 skips it).
    #[arg(long, default_value_t = 8)]
    fair_processes: usize,
    /// How long the fairness run lasts.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    fair_secs: Duration,
    /// Instead of the figures above: the cost of holding this many auto-renewed leases on one
    /// client (distinct names), measured from outside the worker process that holds them: its
    /// RSS and CPU share over --renewal-window, and on Redis the renewals the server applied.
    #[arg(long, value_name = "LEASES")]
    renewals: Option<usize>,
    /// The TTL of the --renewals leases (renewed every third of it).
    #[arg(long, default_value = "30s", value_parser = parse_duration, requires = "renewals")]
    renewal_ttl: Duration,
    /// How long --renewals measures, after the leases are taken and one renewal interval has
    /// passed.
    #[arg(long, default_value = "20s", value_parser = parse_duration, requires = "renewals")]
    renewal_window: Duration,
    /// Every acquisition asks for no fencing token (`LockOptions::no_fencing`): what a holder
    /// that fences nothing pays (PostgreSQL's row lock then writes nothing). Without it, the
    /// default options: a token wherever the backend gives them.
    #[arg(long)]
    no_fencing: bool,
    /// Also write the table as a Markdown file carrying the command, the build, the date and
    /// the machine's load average (the user guide's figures chapter is such a file).
    #[arg(long, value_name = "PATH")]
    markdown: Option<PathBuf>,
    /// Lock service URLs. Without any: memory:// and a SQLite file in target/conformance.
    urls: Vec<String>,
}

impl BenchArgs {
    fn plan(&self) -> bench::Plan {
        bench::Plan {
            secs: self.secs,
            processes: self.processes.max(1),
            waiters: self.waiters.max(1),
            waiter_processes: self.waiter_processes.max(1),
            fair_processes: self.fair_processes,
            fair_secs: self.fair_secs,
            fencing: if self.no_fencing {
                locksmith::Fencing::NotWanted
            } else {
                locksmith::Fencing::IfAvailable
            },
        }
    }
}

/// `__renew-worker`: the process of `bench --renewals` (internal).
#[derive(Args, Debug)]
struct RenewWorkerArgs {
    /// Leases to take and hold on one client.
    #[arg(long)]
    leases: usize,
    /// Their TTL in milliseconds.
    #[arg(long)]
    ttl_ms: u64,
}

/// `__bench-worker`: one process of `bench`'s multi-process runs (internal).
#[derive(Args, Debug)]
struct BenchWorkerArgs {
    /// Clients in this process.
    #[arg(long)]
    clients: usize,
    /// How long to contend, in milliseconds, after `go`.
    #[arg(long)]
    millis: u64,
    /// Loop the backend's bare primitive (`Backend::bare_cycle`) instead of `lock` + `release`.
    #[arg(long)]
    bare: bool,
    /// Print `queued` once every client has been seen waiting, and stop at a `stop` line on
    /// stdin (--millis then only bounds the run).
    #[arg(long)]
    steady: bool,
    /// The lock's name.
    name: String,
}

fn main() -> ExitCode {
    // `locksmith run` starts the command through this same binary as its guard process.
    if let Some(code) = group::guard_main() {
        return ExitCode::from(code);
    }
    let cli = Cli::parse();
    // `run` works on the main thread only (a current-thread runtime): the guard's parent-death
    // signal is tied to the thread that spawned it, and the main thread lives as long as the
    // process. The other commands use two worker threads.
    let runtime = match cli.command {
        Command::Run(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
    };
    let rt = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("locksmith: cannot start the tokio runtime: {e}");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    let code = match cli.command {
        Command::Run(a) => rt.block_on(run_cmd::run(a)),
        // On a worker thread of the runtime, as a service's tasks run (what the bench measures
        // should be what a service sees): a future driven by the thread that blocks on the
        // runtime makes every request cross threads to the clients' connection tasks, which
        // run on the workers.
        command => rt.block_on(async move {
            match tokio::spawn(dispatch(command)).await {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("locksmith: the command failed: {e}");
                    exit::UNAVAILABLE
                }
            }
        }),
    };
    // Let background tasks (releases) end with the runtime before exiting.
    rt.shutdown_timeout(Duration::from_secs(5));
    ExitCode::from(code)
}

/// Every command but `run`, on the runtime's workers.
async fn dispatch(command: Command) -> u8 {
    match command {
        Command::Report(a) => {
            let urls = if a.urls.is_empty() {
                report_cmd::embedded_urls(&a.out)
            } else {
                a.urls
            };
            report_cmd::report(
                &urls,
                &a.out,
                (!a.no_bench).then(bench::Plan::default),
                a.faults.as_deref(),
                &a.scenarios,
            )
            .await
        }
        Command::Holder { args } => {
            conformance::holder::holder_main(
                args,
                |url| async move { locksmith::connect(&url).await },
            )
            .await;
            0
        }
        // Run on the main thread by `main`.
        Command::Run(_) => 2,
        Command::Status(a) => {
            admin_cmd::status(&a.service.url, &a.name, a.json, a.service.connect_timeout).await
        }
        Command::Unlock(a) => {
            admin_cmd::unlock(&a.service.url, &a.name, a.force, a.service.connect_timeout).await
        }
        Command::Bench(a) => {
            let urls = if a.urls.is_empty() {
                report_cmd::embedded_urls(Path::new("target/conformance"))
            } else {
                a.urls.clone()
            };
            if let Some(Err(e)) = urls
                .iter()
                .any(|u| u.starts_with("sqlite:"))
                .then(|| std::fs::create_dir_all("target/conformance"))
            {
                eprintln!("locksmith: cannot create target/conformance: {e}");
                return 2;
            }
            if let Some(leases) = a.renewals {
                let plan = renew_bench::RenewPlan {
                    leases,
                    ttl: a.renewal_ttl,
                    window: a.renewal_window,
                };
                let mut code = 0;
                for url in &urls {
                    code = code.max(renew_bench::bench(url, plan).await);
                }
                return code;
            }
            bench::bench(&urls, a.plan(), a.markdown.as_deref()).await
        }
        Command::BenchWorker(a) => {
            let run = bench::WorkerRun {
                clients: a.clients,
                millis: a.millis,
                bare: a.bare,
                steady: a.steady,
            };
            bench::worker(&a.name, run).await
        }
        Command::RenewWorker(a) => {
            renew_bench::worker(a.leases, Duration::from_millis(a.ttl_ms)).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_run() {
        let cli = Cli::try_parse_from([
            "locksmith",
            "run",
            "--url",
            "memory://",
            "--wait",
            "0",
            "--ttl",
            "5s",
            "job",
            "--",
            "echo",
            "-n",
            "hi",
        ])
        .unwrap();
        let Command::Run(a) = cli.command else {
            panic!("not run")
        };
        assert_eq!(a.wait, Wait::For(Duration::ZERO));
        assert_eq!(a.ttl, Duration::from_secs(5));
        assert_eq!(a.max_hold, Duration::from_secs(3600));
        assert_eq!(a.lock_name(), "job");
        assert_eq!(a.command, ["echo", "-n", "hi"]);
        // Garbage durations and a missing command are usage errors.
        assert!(
            Cli::try_parse_from([
                "locksmith",
                "run",
                "--url",
                "m://",
                "--ttl",
                "5x",
                "j",
                "--",
                "x"
            ])
            .unwrap_err()
            .to_string()
            .contains("invalid duration")
        );
        assert!(Cli::try_parse_from(["locksmith", "run", "--url", "m://", "j"]).is_err());
    }

    #[test]
    fn parses_report_defaults() {
        let cli = Cli::try_parse_from(["locksmith", "report"]).unwrap();
        let Command::Report(a) = cli.command else {
            panic!("not report")
        };
        assert!(a.urls.is_empty(), "the embedded backends are chosen later");
        assert_eq!(a.out, PathBuf::from("target/conformance"));
        assert!(!a.no_bench);
    }
}
