//! Black-box checks of `locksmith run --permits N` and `locksmith run --shared`, as users run
//! them: 6 separate `locksmith` processes looping on one name against each real server whose
//! backend gives both (for `--shared`, also PostgreSQL's row lock); each loop's second
//! `locksmith` is SIGKILLed mid-command (once the command says on its stdout that it started,
//! and its pid). Each command logs when it starts and ends (wall clock, ns); a killed one ends
//! with its `locksmith` (the guard's parent-death signal kills its group), when this test sees
//! it gone from `/proc` (or a zombie), polled without a pause from the kill on: a backend may
//! free a killed holder's lock at once (the row lock's server does when the connection closes),
//! so the end must be the command's, not an allowance. The log must never show more than N
//! commands at once, nor a plain `run` beside any other.

use std::io::Write;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use conformance::require_env;

const PROCESSES: usize = 6;
const LIMIT: usize = 3;

/// What one `locksmith run` did: its command's start and end (ns since the epoch).
#[derive(Clone, Copy, Debug)]
struct Interval {
    start: u128,
    end: u128,
    writer: bool,
    /// When its locksmith was killed (`end` is then when the command was seen gone).
    killed_at: Option<u128>,
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn scale() -> f64 {
    conformance::time_scale()
}

/// Runs the 6 loops for `run_for` with `mode(i)` the arguments of process `i`; each loop's
/// second `locksmith` is killed with SIGKILL once its command has started (the command tells
/// on its stdout). The commands' intervals and how many were killed.
fn run_loops(
    url: &str,
    name: &str,
    mode: impl Fn(usize) -> Vec<&'static str> + Sync,
    run_for: Duration,
) -> (Vec<Interval>, usize) {
    let dir = std::env::temp_dir().join(format!(
        "locksmith-primitives-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log");
    // (run, when its locksmith was killed, when its command was seen gone).
    let kills: Mutex<Vec<(u64, u128, u128)>> = Mutex::default();
    let (unreachable, spawned) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let deadline = Instant::now() + run_for;
    std::thread::scope(|s| {
        for i in 0..PROCESSES {
            let (log, mode, unreachable, spawned, kills) =
                (&log, &mode, &unreachable, &spawned, &kills);
            s.spawn(move || {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let id = (i as u64) << 32 | n;
                    let kill = n == 1;
                    n += 1;
                    let writer = u8::from(!mode(i).contains(&"--shared") && !mode(i).contains(&"--permits"));
                    // Start and end lines, each one short append (atomic on a local file); the
                    // start also goes to stdout, where a loop that kills this run waits for it.
                    let script = format!(
                        "echo \"s {id} {writer} $(date +%s%N)\" >> {log}; echo started $$; sleep 0.0$(( RANDOM % 9 + 1 )); echo \"e {id} {writer} $(date +%s%N)\" >> {log}",
                        log = log.display()
                    );
                    let mut child = Command::new(env!("CARGO_BIN_EXE_locksmith"))
                        .arg("run")
                        .args(["--ttl", "2s", "--quiet"])
                        .args(mode(i))
                        .arg(name)
                        .args(["--", "bash", "-c", &script])
                        .env("LOCKSMITH_URL", url)
                        .stdin(Stdio::null())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .spawn()
                        .expect("spawning locksmith");
                    spawned.fetch_add(1, Ordering::Relaxed);
                    if kill {
                        let mut started = String::new();
                        let stdout = child.stdout.take().expect("piped");
                        let read = BufReader::new(stdout).read_line(&mut started).unwrap();
                        if read > 0 {
                            let pid: u32 = started.trim().strip_prefix("started ").unwrap().parse().unwrap();
                            let at = now_ns();
                            child.kill().unwrap();
                            let dead = dead_at(pid);
                            let _ = child.wait();
                            kills.lock().unwrap().push((id, at, dead));
                            continue;
                        }
                        // Ended before its command started (the service unreachable): judged
                        // as any other run below.
                    }
                    let out = child.wait_with_output().unwrap();
                    let code = out.status.code();
                    // 0: ran. 69: the service could not be reached in time (a short ZooKeeper
                    // session allows 2/5 of it to connect, which a loaded machine can miss):
                    // counted, and bounded below. Anything else (78, a refused option) is a
                    // failure of locksmith itself.
                    if code == Some(69) {
                        unreachable.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    assert_eq!(
                        code,
                        Some(0),
                        "locksmith run {:?} exited {}: {}",
                        mode(i),
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            });
        }
    });
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let kills = kills.into_inner().unwrap();
    let mut starts = std::collections::HashMap::new();
    let mut ends = std::collections::HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let [kind, id, writer, t] = f[..] else {
            panic!("a torn log line {line:?}");
        };
        let (id, t): (u64, u128) = (id.parse().unwrap(), t.parse().unwrap());
        match kind {
            "s" => {
                starts.insert(id, (t, writer == "1"));
            }
            _ => {
                ends.insert(id, t);
            }
        }
    }
    let mut intervals = Vec::new();
    for (id, (start, writer)) in &starts {
        let (end, killed_at) = match ends.get(id) {
            Some(e) => (*e, None),
            None => match kills.iter().find(|(k, _, _)| k == id) {
                Some((_, at, dead)) => (*dead, Some(*at)),
                None => panic!("command {id} started and neither ended nor was killed"),
            },
        };
        intervals.push(Interval {
            start: *start,
            end,
            writer: *writer,
            killed_at,
        });
    }
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(slowest) = kills.iter().map(|(_, at, dead)| dead - at).max() {
        eprintln!(
            "killed commands were gone within {:.1} ms of their locksmith's kill",
            slowest as f64 / 1e6
        );
    }
    let (unreachable, spawned) = (unreachable.into_inner(), spawned.into_inner());
    assert!(
        unreachable * 4 <= spawned,
        "{unreachable} of {spawned} locksmith runs could not reach {url} (exit 69)"
    );
    if unreachable > 0 {
        eprintln!("{unreachable} of {spawned} runs could not reach the service in time (exit 69)");
    }
    (intervals, kills.len())
}

/// When process `pid` (a command whose `locksmith` was just killed) is gone or a zombie (its
/// parent, the guard, died with it: nobody may reap it soon), in ns since the epoch: `/proc`
/// polled without a pause, so the time is at most a scheduling delay late, never early.
fn dead_at(pid: u32) -> u128 {
    let stat = format!("/proc/{pid}/stat");
    let give_up = Instant::now() + Duration::from_secs(10).mul_f64(scale());
    loop {
        // The state is the field after the command name, which ends at the last ')'.
        let alive = std::fs::read_to_string(&stat).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        });
        if !alive {
            return now_ns();
        }
        assert!(
            Instant::now() < give_up,
            "command {pid} still ran 10 s after its locksmith was killed"
        );
        std::thread::yield_now();
    }
}

/// The most commands at once, and the most at once beside a writer (a writer and anyone).
/// With `lock_dies_with_locksmith` a killed command counts until its locksmith's kill, not
/// until it was gone: see [`shared_readers_never_run_beside_a_writer_across_processes_and_kills`].
fn overlaps(intervals: &[Interval], lock_dies_with_locksmith: bool) -> (usize, usize) {
    let mut events: Vec<(u128, i32, bool)> = Vec::new();
    for i in intervals {
        let end = match i.killed_at {
            Some(at) if lock_dies_with_locksmith => at,
            _ => i.end,
        };
        events.push((i.start, 1, i.writer));
        events.push((end, -1, i.writer));
    }
    // Ends before starts at the same instant.
    events.sort_by_key(|&(t, d, _)| (t, d));
    let (mut all, mut writers, mut most, mut beside_writer) = (0i32, 0i32, 0, 0);
    for (_, d, w) in events {
        all += d;
        if w {
            writers += d;
        }
        most = most.max(all as usize);
        if writers > 0 {
            beside_writer = beside_writer.max(all as usize);
        }
    }
    (most, beside_writer)
}

/// The servers whose backends give permits and shared locks (scripts/servers.sh), with the
/// parameter that picks the backend's kind that does: the SQL lease strategy, and a short
/// ZooKeeper session (a killed holder's node goes with its session, whatever the TTL); for
/// shared locks (`readers`) also PostgreSQL's row lock.
fn urls(readers: bool) -> Option<Vec<(&'static str, String)>> {
    let mut all = Vec::new();
    let row_lock = (
        "postgres-row-lock",
        "LOCK_TEST_POSTGRES_URL",
        Some(("strategy", "row-lock")),
    );
    for (label, var, param) in [
        ("redis", "LOCK_TEST_REDIS_URL", None),
        ("etcd", "LOCK_TEST_ETCD_URL", None),
        (
            "zk",
            "LOCK_TEST_ZK_URL",
            Some(("session_timeout_ms", "2000")),
        ),
        (
            "postgres-lease",
            "LOCK_TEST_POSTGRES_URL",
            Some(("strategy", "lease")),
        ),
        (
            "mysql-lease",
            "LOCK_TEST_MYSQL_URL",
            Some(("strategy", "lease")),
        ),
        ("sqlite", "LOCK_TEST_SQLITE_URL", None),
    ]
    .into_iter()
    .chain(readers.then_some(row_lock))
    {
        let url = require_env(var)?;
        let url = match param {
            Some((key, value)) => conformance::url_with_param(&url, key, value),
            None => url,
        };
        all.push((label, url));
    }
    Some(all)
}

#[test]
fn permits_hold_across_processes_and_kills() {
    let Some(urls) = urls(false) else { return };
    for (label, url) in urls {
        let name = format!("cli-permits-{:08x}", fastrand::u32(..));
        let run_for = Duration::from_secs(4).mul_f64(scale());
        let limit = LIMIT.to_string();
        let limit: &'static str = Box::leak(limit.into_boxed_str());
        let (intervals, killed) = run_loops(&url, &name, |_| vec!["--permits", limit], run_for);
        let (most, _) = overlaps(&intervals, false);
        writeln!(
            std::io::stderr(),
            "{label} permits: {} commands ran, {killed} locksmith processes killed, at most \
             {most} at once",
            intervals.len()
        )
        .unwrap();
        assert!(
            killed > 0,
            "{label}: no process was killed: the test proves less than it claims"
        );
        assert!(
            most <= LIMIT,
            "{label}: {most} commands ran at once under --permits {LIMIT}"
        );
        assert!(
            most >= 2,
            "{label}: never more than one command at once: --permits {LIMIT} gave nothing \
             beyond a mutex"
        );
    }
}

#[test]
fn shared_readers_never_run_beside_a_writer_across_processes_and_kills() {
    let Some(urls) = urls(true) else { return };
    for (label, url) in urls {
        let run_for = Duration::from_secs(4).mul_f64(scale());
        // Four readers, two writers. Readers running together is up to chance where waiting
        // writers hold new readers back (writer preference) and killed holders keep the name
        // for their TTL: a round of a dozen commands may see none, so up to three rounds (a
        // fresh name each) run until one does; every command of every round is checked.
        let (mut intervals, mut killed, mut most) = (Vec::new(), 0, 0);
        for _round in 0..3 {
            let name = format!("cli-shared-{:08x}", fastrand::u32(..));
            let (round, round_killed) = run_loops(
                &url,
                &name,
                |i| if i < 4 { vec!["--shared"] } else { vec![] },
                run_for,
            );
            // 1 when a writer ran (alone), 0 when none did in this round. A row lock lives as
            // long as its locksmith's connection: `kill -9` of locksmith frees it at once,
            // while its guard process needs a moment (its own scheduling: milliseconds on a
            // busy machine) to kill the command's group, and a writer's command can start in
            // that window (README, "locksmith run"). So there a killed command counts until
            // the kill, and how long killed commands outlived it is bounded below; on the
            // lease backends the lock outlives a killed locksmith by its TTL, and a killed
            // command counts until it was seen gone.
            let row_lock = label == "postgres-row-lock";
            let (together, beside_writer) = overlaps(&round, row_lock);
            if row_lock {
                let outlived = round
                    .iter()
                    .filter_map(|i| i.killed_at.map(|at| i.end.saturating_sub(at)))
                    .max()
                    .unwrap_or(0);
                let bound = Duration::from_secs(2).mul_f64(scale());
                assert!(
                    outlived < bound.as_nanos(),
                    "{label}: a killed command ran {:.1} ms past its locksmith's kill",
                    outlived as f64 / 1e6
                );
                let (_, seen_beside) = overlaps(&round, false);
                if seen_beside > 1 {
                    eprintln!(
                        "{label}: a writer's command started while a killed holder's command \
                         was still dying (at most {:.1} ms after the kill): the row lock's \
                         kill window",
                        outlived as f64 / 1e6
                    );
                }
            }
            assert!(
                beside_writer <= 1,
                "{label}: a writer ran beside {} other commands",
                beside_writer - 1
            );
            intervals.extend(round);
            killed += round_killed;
            most = most.max(together);
            if most >= 2 {
                break;
            }
        }
        let writers = intervals.iter().filter(|i| i.writer).count();
        writeln!(
            std::io::stderr(),
            "{label} shared: {} commands ran ({writers} writers), {killed} killed, at most \
             {most} at once, never one beside a writer",
            intervals.len()
        )
        .unwrap();
        assert!(
            killed > 0,
            "{label}: no process was killed: the test proves less than it claims"
        );
        assert!(
            writers > 0,
            "{label}: no writer ever ran: the writers starved"
        );
        assert!(
            most >= 2,
            "{label}: readers never ran together in three rounds"
        );
    }
}
