//! `interop=redis-py` and `interop=redisson` against the real peers, as processes of their own:
//! redis-py's `Lock` (Debian `python3-redis`), and Redisson's `RLock` protocol (Redisson is Java
//! from Maven, which this machine cannot reach: `tests/peers/redis_peer.py` runs Redisson
//! 4.7.0's own Lua scripts, copied verbatim, through redis-py, and waits as Redisson does).
//! Both directions (the peer holds and locksmith waits; locksmith holds and the peer waits) and
//! a contention loop whose critical sections must never overlap.
//!
//! Needs `LOCK_TEST_REDIS_URL` (skipped when unset, failing under `LOCK_TEST_REQUIRE_ALL`) and
//! `/usr/bin/python3` with `python3-redis` (installed by `scripts/install-servers.sh`; a missing peer
//! fails the test).

use std::time::Duration;

use conformance::require_env;
use faultkit::{PeerCommand, PeerProcess, Window, check_windows, now_unix_micros, unix_micros_at};
use lock_redis::RedisBackend;
use lockcore::{LockName, LockOptions, Locker};

fn unique(prefix: &str) -> String {
    format!("interop-{prefix}-{:016x}", fastrand::u64(..))
}

fn scaled(secs: f64) -> Duration {
    Duration::from_secs_f64(secs * conformance::time_scale())
}

async fn peer(kind: &str, url: &str, name: &str) -> PeerProcess {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/redis_peer.py");
    // Debian's interpreter, which python3-redis installs for (a `python3` earlier on PATH, a
    // pyenv or venv one, may lack the module).
    let mut p = PeerCommand::new(kind, "/usr/bin/python3")
        .args([script, kind, url, name])
        .package("python3-redis")
        .spawn()
        .unwrap();
    let ready = p.expect("ready", scaled(20.0)).await.unwrap();
    if kind == "redis-py" {
        // The version the mode follows (Debian bookworm's python3-redis).
        assert!(ready.contains("4."), "redis-py version: {ready}");
    }
    p
}

/// `try_lock` of `name` is refused: the peer holds it.
async fn assert_peer_holds(locker: &Locker, name: &str, opts: &LockOptions) {
    let got = locker.try_lock(name, opts).await.unwrap();
    assert!(got.is_none(), "the peer holds {name}: try_lock must refuse");
}

/// Tells the peer to end, and waits until it has.
async fn quit(mut p: PeerProcess) {
    p.send("quit").await.unwrap();
    p.wait(scaled(20.0)).await.unwrap();
}

async fn client(url: &str, kind: &str, poll_ms: u64) -> Locker {
    let sep = if url.contains('?') { '&' } else { '?' };
    let backend = RedisBackend::connect(&format!("{url}{sep}interop={kind}&poll_ms={poll_ms}"))
        .await
        .unwrap();
    Locker::new(backend)
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// What the lock looks like on the server while locksmith holds it: the peer's own layout.
async fn assert_layout(conn: &mut redis::aio::MultiplexedConnection, kind: &str, name: &str) {
    let kind_of: String = redis::cmd("TYPE")
        .arg(name)
        .query_async(conn)
        .await
        .unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(name)
        .query_async(conn)
        .await
        .unwrap();
    assert!(pttl > 0, "the lock key has a TTL ({pttl})");
    match kind {
        "redis-py" => {
            assert_eq!(kind_of, "string");
            let token: String = redis::cmd("GET").arg(name).query_async(conn).await.unwrap();
            assert_eq!(token.len(), 32, "{token}");
        }
        _ => {
            assert_eq!(kind_of, "hash");
            let fields: Vec<(String, i64)> = redis::cmd("HGETALL")
                .arg(name)
                .query_async(conn)
                .await
                .unwrap();
            assert_eq!(fields.len(), 1, "{fields:?}");
            assert!(
                fields[0].0.ends_with(":1") && fields[0].1 == 1,
                "{fields:?}"
            );
        }
    }
}

async fn peer_holds_locksmith_waits(kind: &str) {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let name = unique(kind);
    let mut conn = raw(&url).await;
    // Redisson: no poll at all (one hour), and the peer's lease is far longer than the wait, so
    // only Redisson's unlock message can wake the waiter in time. redis-py announces nothing:
    // the waiter polls.
    let poll_ms = if kind == "redisson" { 3_600_000 } else { 50 };
    let locker = client(&url, kind, poll_ms).await;
    let mut p = peer(kind, &url, &name).await;
    p.send("hold 600000").await.unwrap();
    p.expect("acquired", scaled(20.0)).await.unwrap();

    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_timeout(scaled(30.0));
    assert_peer_holds(&locker, &name, &opts).await;
    let waiter = {
        let locker = locker.clone();
        let (name, opts) = (name.clone(), opts.clone());
        tokio::spawn(async move {
            let guard = locker.lock(name.as_str(), &opts).await;
            (guard, now_unix_micros())
        })
    };
    if kind == "redisson" {
        // The waiter listens on Redisson's channel before the peer lets go.
        let channel = format!("redisson_lock__channel:{{{name}}}");
        faultkit::wait_until("the waiter subscribed", scaled(20.0), || {
            let mut conn = conn.clone();
            let channel = channel.clone();
            async move {
                let (_, n): (String, i64) = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(&channel)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                Ok(n >= 1)
            }
        })
        .await
        .unwrap();
    }
    assert!(!waiter.is_finished(), "locksmith won while {kind} held");
    p.send("release").await.unwrap();
    let released = unix_micros_at(&p.expect("released", scaled(20.0)).await.unwrap(), 1).unwrap();
    let (guard, won_at) = waiter.await.unwrap();
    let guard = guard
        .unwrap_or_else(|e| panic!("locksmith did not get the lock after {kind} released it: {e}"));
    assert!(
        won_at >= released,
        "won at {won_at}, released at {released}"
    );
    assert_eq!(
        guard.fencing_token(),
        None,
        "no fencing token in interop mode"
    );
    assert_layout(&mut conn, kind, &name).await;
    guard.release().await.unwrap();
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0);
    quit(p).await;
}

async fn locksmith_holds_peer_waits(kind: &str) {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let name = unique(kind);
    let mut conn = raw(&url).await;
    let locker = client(&url, kind, 1000).await;
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_timeout(scaled(20.0));
    let guard = locker.lock(name.as_str(), &opts).await.unwrap();
    assert_layout(&mut conn, kind, &name).await;

    let mut p = peer(kind, &url, &name).await;
    p.send("try 600000").await.unwrap();
    p.expect("busy", scaled(20.0)).await.unwrap();
    p.send("wait 600000").await.unwrap();
    p.expect("waiting", scaled(20.0)).await.unwrap();
    assert!(!p.has_output(), "the peer printed {:?}", p.seen());
    let released = now_unix_micros();
    guard.release().await.unwrap();
    let line = p.expect("acquired", scaled(30.0)).await.unwrap();
    assert!(
        unix_micros_at(&line, 1).unwrap() >= released,
        "{line} before {released}"
    );
    if kind == "redisson" {
        // Redisson's waiter sleeps until the holder's TTL (30 s) unless the unlock message
        // wakes it: it must have been woken by the message locksmith published.
        assert!(line.ends_with("message"), "{line}");
    }
    // Now the peer holds: locksmith must not get in.
    assert_peer_holds(&locker, &name, &opts).await;
    p.send("release").await.unwrap();
    p.expect("released", scaled(20.0)).await.unwrap();
    quit(p).await;
}

/// Both sides loop acquire / critical section / release on one name for a few seconds.
async fn contention(kind: &str) {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let name = unique(kind);
    let locker = client(&url, kind, 50).await;
    let mut p = peer(kind, &url, &name).await;
    let seconds = 3.0;
    p.send(&format!("loop {seconds} 10000")).await.unwrap();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_timeout(scaled(30.0));
    let mut windows = Vec::new();
    let end = lockcore::Instant::now() + Duration::from_secs_f64(seconds);
    while lockcore::Instant::now() < end {
        let guard = locker.lock(name.as_str(), &opts).await.unwrap();
        let start_us = now_unix_micros();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let end_us = now_unix_micros();
        guard.release().await.unwrap();
        windows.push(Window::new("locksmith", start_us, end_us));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    windows.extend(p.loop_windows(kind, scaled(60.0)).await.unwrap());
    let ours = windows.iter().filter(|w| w.side == "locksmith").count();
    eprintln!(
        "{kind} contention: {ours} locksmith windows, {} peer windows, no overlap checked",
        windows.len() - ours
    );
    check_windows(&windows, &["locksmith", kind], 3).unwrap();
    quit(p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_holds_locksmith_waits() {
    peer_holds_locksmith_waits("redis-py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locksmith_holds_redis_py_waits() {
    locksmith_holds_peer_waits("redis-py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_contention() {
    contention("redis-py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_holds_locksmith_waits() {
    peer_holds_locksmith_waits("redisson").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locksmith_holds_redisson_waits() {
    locksmith_holds_peer_waits("redisson").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_contention() {
    contention("redisson").await;
}

/// Capabilities say what holds: no fencing in either mode; Redisson notifies, redis-py polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_tell_the_truth() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let py = client(&url, "redis-py", 1000).await;
    let caps = py.capabilities();
    assert!(!caps.fencing && !caps.fair && !caps.reentrant);
    assert_eq!(caps.wait, lockcore::WaitKind::Poll);
    let rs = client(&url, "redisson", 1000).await;
    let caps = rs.capabilities();
    assert!(!caps.fencing && !caps.fair && !caps.reentrant);
    assert_eq!(caps.wait, lockcore::WaitKind::Notify);
    // A guard that asks for fencing is refused before any I/O.
    let e = rs
        .try_lock(
            LockName::new(unique("fenced")).unwrap(),
            &LockOptions::new().require_fencing(true),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), lockcore::ErrorKind::Unsupported, "{e}");
}
