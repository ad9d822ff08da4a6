//! Every way out of `locksmith run` finishes its clean-up before the process exits (issue 35):
//! a run that gives up waiting (`--wait` ran out) or is terminated while waiting (SIGTERM,
//! SIGINT) leaves no queue entry behind, so the next holder gets the lock as soon as the holder
//! in front releases it. On ZooKeeper and etcd such an entry (a sequential node, a key under its
//! own lease) would otherwise stay until the session ends or the lease runs out, and everyone
//! queued behind it would wait that long. Runs on the shared servers (`LOCK_TEST_ZK_URL`,
//! `LOCK_TEST_ETCD_URL`); skipped without them.

use std::time::{Duration, Instant};

use locksmith::{LockOptions, Locker};
use rustix::process::Signal;

mod support;
use support::*;

fn url(var: &str) -> Option<String> {
    let url = std::env::var(var).ok();
    if url.is_none() {
        eprintln!("skipped: {var} is not set");
    }
    url
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn unique(tag: &str) -> String {
    format!(
        "run-exits/{tag}/{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    )
}

/// How the run ends while it waits behind a holder.
#[derive(Clone, Copy, Debug)]
enum GiveUp {
    /// `--wait 1s` runs out: exit 75.
    WaitRunsOut,
    /// The signal arrives while it waits: exit 128 + the signal's number.
    Signal(Signal),
}

/// A holder in this process; `locksmith run` queues behind it and gives up as `how` says; the
/// holder releases the moment the run has exited; another client then gets the lock within 1 s
/// (scaled). A queue entry left behind would hold it off until the run's session ends (10 s on
/// ZooKeeper) or its lease runs out (`--ttl`, 30 s on etcd).
fn a_run_that_gives_up_leaves_nothing(var: &str, tag: &str, how: GiveUp) {
    let Some(url) = url(var) else { return };
    let rt = runtime();
    let locker: Locker = rt.block_on(locksmith::connect(&url)).unwrap();
    let name = unique(tag);
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let holder = rt
        .block_on(locker.try_lock(name.as_str(), &opts))
        .unwrap()
        .expect("the name is fresh");
    let out = match how {
        GiveUp::WaitRunsOut => {
            let out = run_cmd(&url, &["--wait", "1s", &name, "--", "true"])
                .output()
                .unwrap();
            assert_eq!(code(&out), 75, "busy after the wait: {}", stderr(&out));
            out
        }
        GiveUp::Signal(sig) => {
            let child = run_cmd(&url, &["--wait", "10m", &name, "--", "true"])
                .spawn()
                .unwrap();
            // In the queue before the signal: the server lists its entry.
            let deadline = Instant::now() + bound(30.0);
            let lock_name = locksmith::LockName::new(name.as_str()).unwrap();
            while rt
                .block_on(locker.backend().queued_waiters(&lock_name))
                .unwrap()
                == 0
            {
                assert!(Instant::now() < deadline, "the run never queued");
                std::thread::sleep(Duration::from_millis(10));
            }
            send(child.id(), sig);
            let out = wait_output(child, bound(10.0));
            assert_eq!(
                code(&out),
                128 + sig.as_raw(),
                "terminated while waiting: {}",
                stderr(&out)
            );
            out
        }
    };
    rt.block_on(holder.release()).unwrap();
    let released = Instant::now();
    let next = rt.block_on(locker.lock(name.as_str(), &opts.clone().wait_timeout(bound(1.0))));
    assert!(
        next.is_ok(),
        "{how:?}: the next holder did not get the lock within {:?} of the release ({:?}); the \
         run said: {}",
        bound(1.0),
        next.err(),
        stderr(&out)
    );
    eprintln!(
        "{tag}: the next holder got the lock {:?} after the release",
        released.elapsed()
    );
    rt.block_on(next.unwrap().release()).unwrap();
}

#[test]
fn zookeeper_a_run_whose_wait_runs_out_leaves_nothing() {
    a_run_that_gives_up_leaves_nothing("LOCK_TEST_ZK_URL", "zk-timeout", GiveUp::WaitRunsOut);
}

#[test]
fn zookeeper_a_run_terminated_while_waiting_leaves_nothing() {
    a_run_that_gives_up_leaves_nothing("LOCK_TEST_ZK_URL", "zk-term", GiveUp::Signal(Signal::TERM));
}

#[test]
fn etcd_a_run_whose_wait_runs_out_leaves_nothing() {
    a_run_that_gives_up_leaves_nothing("LOCK_TEST_ETCD_URL", "etcd-timeout", GiveUp::WaitRunsOut);
}

#[test]
fn etcd_a_run_interrupted_while_waiting_leaves_nothing() {
    a_run_that_gives_up_leaves_nothing(
        "LOCK_TEST_ETCD_URL",
        "etcd-int",
        GiveUp::Signal(Signal::INT),
    );
}

/// No duration makes `run` panic: --max-hold and --kill-grace near u64::MAX seconds (their sum
/// with the kill lead used to overflow) are refused as a bad option (exit 78), and a run with
/// the largest hold the library takes still runs its command.
#[test]
fn huge_durations_are_refused_not_a_panic() {
    let dir = TempDir::new("huge");
    let huge = u64::MAX.to_string();
    for flag in ["--max-hold", "--kill-grace"] {
        let out = run_cmd(&dir.sqlite(), &[flag, &huge, "job", "--", "true"])
            .output()
            .unwrap();
        assert!(
            !stderr(&out).contains("panicked"),
            "{flag}: {}",
            stderr(&out)
        );
        assert_eq!(code(&out), 78, "{flag} {huge}: {}", stderr(&out));
    }
    let out = run_cmd(&dir.sqlite(), &["--max-hold", "30d", "job", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

/// A name that begins with `-` is given with --name; the command sees it.
#[test]
fn a_name_beginning_with_a_dash_goes_after_name() {
    let dir = TempDir::new("dash");
    for form in [&["--name", "-job"][..], &["--name=-job"][..]] {
        let mut args = form.to_vec();
        args.extend(["--", "sh", "-c", "echo \"$LOCKSMITH_LOCK_NAME\""]);
        let out = run_cmd(&dir.sqlite(), &args).output().unwrap();
        assert_eq!(code(&out), 0, "{form:?}: {}", stderr(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "-job\n");
    }
    // Both a NAME and --name: a usage error.
    let out = run_cmd(&dir.sqlite(), &["--name", "a", "b", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}
