//! The masters' queues of waiters (see the crate docs, "Waiting"): a waiting lock() is queued
//! on every master that refused its vote, a release wakes the queue's head only, and a waiter
//! that gives up or is dropped leaves every queue (its entry does not wait for its TTL). Runs
//! on the shared test masters (`LOCK_TEST_REDLOCK_URL`, `LOCK_TEST_REDLOCK_URLS`).

use std::time::Duration;

use conformance::require_env;
use lock_redlock::RedlockBackend;
use lockcore::{Instant, LockName, LockOptions, Locker};

fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", fastrand::u64(..))
}

/// The entries of the queue of `key` (the lock key) on every master.
async fn queued_per_master(urls: &[String], lock_key: &str) -> Vec<i64> {
    let key = lock_key.replace(":lock", ":queuexp");
    let mut out = Vec::new();
    for u in urls {
        let mut c = redis::Client::open(u.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        out.push(
            redis::cmd("ZCARD")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap(),
        );
    }
    out
}

/// Polls `cond` (faultkit's poll, every 50 ms) until it holds, failing after a generous bound.
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    faultkit::wait_until(what, Duration::from_secs(10), || {
        let c = cond();
        async move { Ok(c.await) }
    })
    .await
    .unwrap();
}

/// Two clients queue behind a holder; the first gives up (a timeout), the second is dropped:
/// both leave every master's queue at once. A third then waits and is handed the lock by the
/// holder's release (woken as the head, well before its 10 s safety poll), and no entry is
/// left once it released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_leave_every_queue_and_the_head_is_woken() {
    let (Some(url), Some(urls)) = (
        require_env("LOCK_TEST_REDLOCK_URL"),
        require_env("LOCK_TEST_REDLOCK_URLS"),
    ) else {
        return;
    };
    let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
    // A safety poll of 10 s: a hand-over within a few seconds comes from the release message.
    let url = format!("{url}?poll_ms=10000");
    let backend = RedlockBackend::connect(&url).await.unwrap();
    let name = LockName::new(unique("rl-queue")).unwrap();
    let key = backend.lock_key(&name);
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_timeout(Duration::from_secs(20));
    let holder = Locker::new(backend);
    let g = holder.try_lock(&name, &opts).await.unwrap().unwrap();

    let gives_up = Locker::new(RedlockBackend::connect(&url).await.unwrap());
    let short = opts.clone().wait_timeout(Duration::from_millis(300));
    assert!(gives_up.lock(&name, &short).await.is_err());
    gives_up.flush().await;
    assert_eq!(queued_per_master(&urls, &key).await, vec![0; urls.len()]);

    let dropped = Locker::new(RedlockBackend::connect(&url).await.unwrap());
    let task = {
        let (dropped, name, opts) = (dropped.clone(), name.clone(), opts.clone());
        tokio::spawn(async move { dropped.lock(&name, &opts).await })
    };
    eventually("the waiter is queued on every master", || async {
        queued_per_master(&urls, &key).await.iter().all(|n| *n == 1)
    })
    .await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    dropped.flush().await;
    assert_eq!(queued_per_master(&urls, &key).await, vec![0; urls.len()]);

    let next = Locker::new(RedlockBackend::connect(&url).await.unwrap());
    let task = {
        let (next, name, opts) = (next.clone(), name.clone(), opts.clone());
        tokio::spawn(async move { next.lock(&name, &opts).await })
    };
    eventually("the next waiter is queued on every master", || async {
        queued_per_master(&urls, &key).await.iter().all(|n| *n == 1)
    })
    .await;
    let released = Instant::now();
    g.release().await.unwrap();
    let g2 = tokio::time::timeout(Duration::from_secs(8), task)
        .await
        .expect("the queued waiter was not woken by the release")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(5));
    // Out of the queue of every master its vote won; a master the vote reached before the
    // holder's release refused it and keeps its entry, which the winner's own release takes out.
    g2.release().await.unwrap();
    next.flush().await;
    assert_eq!(queued_per_master(&urls, &key).await, vec![0; urls.len()]);
}
