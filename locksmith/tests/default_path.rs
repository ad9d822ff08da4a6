//! Issue 38, the default path at the bare cost: an uncontended `try_lock` + `release` with
//! default options sends the server as many requests as the backend's bare primitive
//! (`Backend::bare_cycle`, the fewest requests that take and give back the lock), counted by a
//! proxy in front of the client, and spawns no task before the caller has its guard. What the
//! defaults add (the fencing token, the holder's metadata, the wake-up of waiters) rides in
//! those requests, never in more of them. On the shared Redis server (`LOCK_TEST_REDIS_URL`)
//! when set. Redlock is left out: it answers once a majority granted and finishes the other
//! masters' requests in a task, so neither count is exact when the guard is returned.

use conformance::ClientProxies;
use locksmith::{LockName, LockOptions};

/// Cycles counted after one of each to warm up (scripts loaded, connections open).
const CYCLES: u64 = 20;

async fn default_cycle_sends_what_the_bare_cycle_sends(url: &str) {
    let proxies = ClientProxies::new();
    let (through, sent) = proxies.counting(url).await.expect("counting proxies");
    let locker = locksmith::connect(&through).await.expect("connect");
    let tag = fastrand::u32(..);
    let name = LockName::new(format!("default-path-{tag:08x}")).unwrap();
    let bare_name = LockName::new(format!("default-path-bare-{tag:08x}")).unwrap();
    let opts = LockOptions::new();
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };

    locker
        .try_lock(&name, &opts)
        .await
        .unwrap()
        .expect("free")
        .release()
        .await
        .unwrap();
    locker.backend().bare_cycle(&bare_name).await.unwrap();

    let before = sent.get();
    for _ in 0..CYCLES {
        let tasks_before = tasks();
        let guard = locker.try_lock(&name, &opts).await.unwrap().expect("free");
        assert_eq!(
            tasks(),
            tasks_before,
            "{url}: a task spawned before the guard was returned"
        );
        guard.release().await.unwrap();
    }
    let library = sent.get() - before;

    let before = sent.get();
    for _ in 0..CYCLES {
        locker.backend().bare_cycle(&bare_name).await.unwrap();
    }
    let bare = sent.get() - before;
    locker.flush().await;
    assert!(bare > 0, "{url}: the proxy counted no bare request");
    assert_eq!(
        library as f64 / CYCLES as f64,
        bare as f64 / CYCLES as f64,
        "{url}: requests per default-options cycle against the bare cycle's"
    );
}

#[tokio::test]
async fn redis_default_cycle_sends_what_the_bare_cycle_sends() {
    if let Ok(url) = std::env::var("LOCK_TEST_REDIS_URL") {
        default_cycle_sends_what_the_bare_cycle_sends(&url).await;
    }
}
