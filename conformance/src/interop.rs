//! What the backends' interop and integration tests do alike around a peer client's process
//! (faultkit's [`PeerProcess`]): wait for server-side state, hand a lock over to the peer, and
//! contend with the peer's loop. Each backend's tests give only their peer and their lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use faultkit::{PeerProcess, Window, check_windows, now_unix_micros, unix_micros_at};
use lockcore::{Instant, LockGuard, LockOptions, Locker};

use crate::time_scale;

/// A lock name no other test run uses: `prefix`, the time in nanoseconds, the process id and
/// a counter (tests share their servers with other runs).
pub fn unique(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{nanos:x}-{}-{n}", std::process::id())
}

/// `secs` seconds, scaled by the test time scale ([`time_scale`]).
pub fn scaled_secs(secs: u64) -> Duration {
    Duration::from_secs(secs).mul_f64(time_scale())
}

/// Polls `f` every 10 ms until it is true or `within` passes; whether it became true. For
/// server-side state with no event to await (a peer's node queued, a waiter counted).
///
/// Cancel safe.
pub async fn eventually<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let found = poll_until(within, || {
        let ready = f();
        async move { ready.await.then_some(()) }
    });
    found.await.is_some()
}

/// Polls `f` every 10 ms until it gives a value or `within` passes; the value, if one came.
/// [`eventually`] for state whose value the caller wants (a queue's head, a key's holder).
///
/// Cancel safe.
pub async fn poll_until<T, F, Fut>(within: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + within;
    loop {
        if let Some(value) = f().await {
            return Some(value);
        }
        if Instant::now() >= end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The time (µs since the epoch) the peer printed with its `HELD <µs>` line, read within
/// `within`.
///
/// # Panics
/// When no such line comes.
pub async fn peer_held(peer: &mut PeerProcess, within: Duration) -> u64 {
    let line = peer.expect("HELD", within).await.unwrap();
    unix_micros_at(&line, 1).unwrap()
}

/// Releases through `release` and asserts that the peer, queued behind it, held only after
/// (its `HELD` line within 20 scaled seconds). `what` names the peer and what was released
/// in the failure ("etcdctl behind the set").
///
/// # Panics
/// When the peer held before the release, or never.
pub async fn peer_holds_after(
    peer: &mut PeerProcess,
    what: &str,
    release: impl std::future::Future<Output = ()>,
) {
    let released = now_unix_micros();
    release.await;
    let held = peer_held(peer, scaled_secs(20)).await;
    assert!(
        held > released,
        "{what}: the peer held at {held} µs, before the release at {released} µs"
    );
}

/// Ends a peer that holds: a line on its stdin releases, it says `RELEASED` and exits.
///
/// # Panics
/// When it does not, within 20 scaled seconds each.
pub async fn release_peer(peer: &mut PeerProcess) {
    peer.send("").await.unwrap();
    peer.expect("RELEASED", scaled_secs(20)).await.unwrap();
    peer.wait(scaled_secs(20)).await.unwrap();
}

/// locksmith loops lock / 2 ms critical section / release on `name` while `peer` runs its loop
/// (reporting `WINDOW start end` lines and `DONE n`, read within `within`): no two critical
/// sections of either side overlap and both sides get the lock. Returns how many critical
/// sections locksmith and the peer had.
///
/// # Panics
/// When the sections overlap, a side never held, or either side fails.
pub async fn contend_with_peer(
    locker: &Locker,
    name: &str,
    opts: &LockOptions,
    peer: &mut PeerProcess,
    peer_label: &str,
    within: Duration,
) -> (usize, usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let ours = {
        let (locker, name, opts, stop) =
            (locker.clone(), name.to_owned(), opts.clone(), stop.clone());
        tokio::spawn(async move {
            let mut windows: Vec<Window> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let g = locker.lock(&name, &opts).await.unwrap();
                let start = now_unix_micros();
                tokio::time::sleep(Duration::from_millis(2)).await;
                let end = now_unix_micros();
                g.release().await.unwrap();
                windows.push(Window::new("locksmith", start, end));
            }
            windows
        })
    };
    let theirs = peer.loop_windows(peer_label, within).await.unwrap();
    peer.wait(scaled_secs(20)).await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let ours = ours.await.unwrap();
    let counts = (ours.len(), theirs.len());
    check_windows(&[ours, theirs].concat(), &["locksmith", peer_label], 1).unwrap();
    counts
}

/// Starts `locker.lock(name, opts)` in a task that returns the guard and when it was won (µs
/// since the epoch), for a test that makes locksmith wait behind a peer.
pub fn spawn_timed_lock(
    locker: &Locker,
    name: &str,
    opts: &LockOptions,
) -> tokio::task::JoinHandle<(LockGuard, u64)> {
    let (locker, name, opts) = (locker.clone(), name.to_owned(), opts.clone());
    tokio::spawn(async move {
        let g = locker.lock(&name, &opts).await.unwrap();
        (g, now_unix_micros())
    })
}

/// Makes the holding `peer` release (a line on its stdin; it says `RELEASED <µs>`) and asserts
/// that `waiter` ([`spawn_timed_lock`]), queued behind it, wins within 20 scaled seconds and
/// only after; returns the guard. `what` names the waiter in the failure.
///
/// # Panics
/// When the waiter is not woken, or won before the peer released.
pub async fn wins_after_peer_releases(
    peer: &mut PeerProcess,
    waiter: tokio::task::JoinHandle<(LockGuard, u64)>,
    what: &str,
) -> LockGuard {
    peer.send("").await.unwrap();
    let line = peer.expect("RELEASED", scaled_secs(20)).await.unwrap();
    let released = unix_micros_at(&line, 1).unwrap();
    let (guard, won_at) = tokio::time::timeout(scaled_secs(20), waiter)
        .await
        .unwrap_or_else(|_| panic!("{what} was not woken by the peer's release"))
        .unwrap();
    assert!(
        won_at > released,
        "{what} won at {won_at} µs, before the peer released at {released} µs"
    );
    guard
}

/// `first` takes the free lock `name`; `second`, another client of the same locks (built
/// another way: from a URL, from an existing client), is refused it. Returns `first`'s guard.
///
/// # Panics
/// When `first` does not get the lock or `second` gets it too.
pub async fn held_by_one_client_only(
    first: &Locker,
    second: &Locker,
    name: &str,
    opts: &LockOptions,
) -> LockGuard {
    let guard = first.try_lock(name, opts).await.unwrap().expect("free");
    let beside = second.try_lock(name, opts).await.unwrap();
    assert!(beside.is_none(), "two clients of one lock both hold {name}");
    guard
}

/// `locker` takes `name` within 5 scaled seconds (its holder released it) and releases it.
///
/// # Panics
/// When it does not.
pub async fn taken_and_released(locker: &Locker, name: &str, opts: &LockOptions) {
    let opts = opts.clone().wait_timeout(scaled_secs(5));
    let guard = locker.lock(name, &opts).await.unwrap();
    guard.release().await.unwrap();
}
