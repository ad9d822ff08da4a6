//! Issue 33: locksmith's default layout and an `interop=` mode on one name exclude each other,
//! in both orders, for every way the default layout takes a name (exclusive, shared, permits,
//! multi-lock). Before, the two layouts kept different keys and both held at once.
//!
//! Needs `LOCK_TEST_REDIS_URL` (skipped when unset, failing under `LOCK_TEST_REQUIRE_ALL`).

use std::time::Duration;

use conformance::require_env;
use lock_redis::RedisBackend;
use lockcore::{ErrorKind, LockOptions, Locker};

fn unique(prefix: &str) -> String {
    format!("layouts-{prefix}-{:016x}", fastrand::u64(..))
}

async fn client(url: &str, interop: Option<&str>) -> Locker {
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = match interop {
        Some(kind) => format!("{url}{sep}interop={kind}&poll_ms=100"),
        None => format!("{url}{sep}poll_ms=100"),
    };
    Locker::new(RedisBackend::connect(&url).await.unwrap())
}

fn opts() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(30))
}

/// Whether a `try_lock` with `options` got the name (a refusal, `Conflict`, counts as not).
async fn got(locker: &Locker, name: &str, options: &LockOptions) -> bool {
    match locker.try_lock(name, options).await {
        Ok(Some(g)) => {
            g.release().await.unwrap();
            true
        }
        Ok(None) => false,
        Err(e) if e.kind() == ErrorKind::Conflict => false,
        Err(e) => panic!("try_lock on {name}: {e}"),
    }
}

/// Each way the default layout takes a name, against `kind`'s holder, both orders; then the
/// name is free for both once released (nothing left behind).
async fn default_and_interop_exclude(kind: &str) {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let default = client(&url, None).await;
    let peer = client(&url, Some(kind)).await;
    let ways = [
        ("exclusive", opts()),
        ("shared", opts().shared()),
        ("permits", opts().permits(3)),
    ];
    for (way, how) in &ways {
        let name = unique(&format!("{kind}-{way}"));
        // The default layout first: the interop holder is kept out.
        let g = default.try_lock(name.as_str(), how).await.unwrap().unwrap();
        assert!(
            !got(&peer, &name, &opts()).await,
            "interop={kind} took {name} beside a default-layout {way} holder"
        );
        g.release().await.unwrap();
        // The interop mode first: the default layout is kept out.
        let g = peer
            .try_lock(name.as_str(), &opts())
            .await
            .unwrap()
            .unwrap();
        assert!(
            !got(&default, &name, how).await,
            "a default-layout {way} holder took {name} beside interop={kind}'s"
        );
        g.release().await.unwrap();
        assert!(got(&default, &name, how).await, "{name} left held ({way})");
        assert!(got(&peer, &name, &opts()).await, "{name} left held");
    }
    // A multi-lock on the default layout (atomic on one node) against an interop holder.
    let (a, b) = (
        unique(&format!("{kind}-set-a")),
        unique(&format!("{kind}-set-b")),
    );
    let g = peer.try_lock(b.as_str(), &opts()).await.unwrap().unwrap();
    assert!(
        default
            .try_lock_all([a.as_str(), b.as_str()], &opts())
            .await
            .unwrap()
            .is_none(),
        "a default-layout multi-lock took {b} beside interop={kind}'s holder"
    );
    g.release().await.unwrap();
    let set = default
        .try_lock_all([a.as_str(), b.as_str()], &opts())
        .await
        .unwrap()
        .unwrap();
    assert!(!got(&peer, &a, &opts()).await && !got(&peer, &b, &opts()).await);
    set.release().await.unwrap();
}

/// The two interop modes on one name exclude each other through the default layout's key
/// (before, a string and a hash at one key: a WRONGTYPE error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_and_redisson_modes_exclude_each_other() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let py = client(&url, Some("redis-py")).await;
    let rs = client(&url, Some("redisson")).await;
    for (first, second) in [(&py, &rs), (&rs, &py)] {
        let name = unique("modes");
        let g = first
            .try_lock(name.as_str(), &opts())
            .await
            .unwrap()
            .unwrap();
        assert!(
            second
                .try_lock(name.as_str(), &opts())
                .await
                .unwrap()
                .is_none(),
            "both interop modes held {name}"
        );
        g.release().await.unwrap();
        assert!(got(second, &name, &opts()).await, "{name} left held");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_layout_and_redis_py_mode_exclude_each_other() {
    default_and_interop_exclude("redis-py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_layout_and_redisson_mode_exclude_each_other() {
    default_and_interop_exclude("redisson").await;
}

/// Until `locker`'s `lock()` on `name` waits (its backend said so) or `task` ended (it took
/// the name at once), within `bound`.
async fn waits_or_finished<T>(
    locker: &Locker,
    name: &str,
    task: &tokio::task::JoinHandle<T>,
    bound: Duration,
) {
    let give_up = lockcore::Instant::now() + bound;
    while locker.waiting(name).unwrap() == 0 && !task.is_finished() {
        assert!(
            lockcore::Instant::now() < give_up,
            "{name}: the waiter neither waited nor finished"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A waiting `lock()` on the default layout gets the name once the interop holder releases
/// (its release announces on the default layout's channel too), and the other way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_either_layout_get_the_name_after_a_release() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let bound = Duration::from_secs_f64(20.0 * conformance::time_scale());
    for kind in ["redis-py", "redisson"] {
        let default = client(&url, None).await;
        let peer = client(&url, Some(kind)).await;
        let name = unique(&format!("{kind}-wait"));
        let g = peer.lock(name.as_str(), &opts()).await.unwrap();
        let waiter = {
            let (default, name) = (default.clone(), name.clone());
            tokio::spawn(async move {
                default
                    .lock(name.as_str(), &opts().wait_timeout(bound))
                    .await
            })
        };
        waits_or_finished(&default, &name, &waiter, bound).await;
        assert!(
            !waiter.is_finished(),
            "the default layout took {name} beside {kind}'s"
        );
        g.release().await.unwrap();
        let g = waiter.await.unwrap().unwrap();
        let other = {
            let (peer, name) = (peer.clone(), name.clone());
            tokio::spawn(async move { peer.lock(name.as_str(), &opts().wait_timeout(bound)).await })
        };
        waits_or_finished(&peer, &name, &other, bound).await;
        assert!(
            !other.is_finished(),
            "{kind} took {name} beside the default layout's"
        );
        g.release().await.unwrap();
        other.await.unwrap().unwrap().release().await.unwrap();
    }
}
