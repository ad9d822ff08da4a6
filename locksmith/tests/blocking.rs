//! `locksmith::blocking` from synchronous code: the same contract, and a runtime that outlives
//! every guard it hands out. On the memory backend and on the real Redis server
//! (`LOCK_TEST_REDIS_URL`), where a release that never happened would show.
#![cfg(feature = "blocking")]

use std::time::{Duration, Instant};

use locksmith::blocking;
use locksmith::{ErrorKind, LockOptions, WithLockError};

fn scaled(ms: u64) -> Duration {
    Duration::from_millis(ms).mul_f64(conformance::time_scale())
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", fastrand::u32(..))
}

/// Polls `free` until it says the lock is free or `bound` passes; how long it took.
fn until_free(bound: Duration, mut free: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < bound {
        if free() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

#[test]
fn a_synchronous_program_locks_waits_and_releases() {
    let store = unique("memory://blocking");
    let a = blocking::connect(&store).unwrap();
    let b = blocking::connect(&store).unwrap();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_timeout(scaled(50));
    let guard = a.lock("job", &opts).unwrap();
    assert!(guard.is_valid());
    assert!(guard.fencing_token().is_some());
    assert!(
        b.try_lock("job", &opts).unwrap().is_none(),
        "contention is Ok(None)"
    );
    assert_eq!(b.lock("job", &opts).unwrap_err().kind(), ErrorKind::Timeout);
    guard.extend(Duration::from_secs(20)).unwrap();
    guard.release().unwrap();
    let again = b
        .try_lock("job", &opts)
        .unwrap()
        .expect("free after release");
    drop(again);

    // with_lock keeps the work's output; a lease lost while it ran is reported with it.
    let out = a.with_lock("job", &opts.clone().wait_timeout(scaled(2_000)), |g| {
        g.fencing_token()
    });
    assert!(matches!(out, Ok(Some(_))), "{out:?}");
    let lost = a.with_lock("job", &opts.clone().wait_timeout(scaled(2_000)), |_g| {
        // Taken away behind the holder's back: the work still finishes.
        a.block_on(
            a.as_async()
                .backend()
                .force_release(&"job".try_into().unwrap()),
        )
        .unwrap();
        7
    });
    match lost {
        Err(WithLockError::ReleaseFailed { output: 7, error }) => {
            assert_eq!(error.kind(), ErrorKind::NotHeld, "{error}")
        }
        other => panic!("expected ReleaseFailed with the output, got {other:?}"),
    }
}

/// The locker is dropped first; the guard it handed out stays renewed past its TTL, and its
/// drop releases the lock at once (the runtime stops only after the release is done).
fn guard_outlives_its_locker(url: &str) {
    let name = unique("outlives");
    let a = blocking::connect(url).unwrap();
    let b = blocking::connect(url).unwrap();
    let ttl = scaled(400);
    let guard = a.lock(name.as_str(), &LockOptions::new().ttl(ttl)).unwrap();
    drop(a);
    // The property is "held for longer than its TTL without a locker": it takes that long.
    std::thread::sleep(ttl * 3);
    assert!(guard.is_valid(), "renewal stopped with the locker");
    assert!(
        b.try_lock(name.as_str(), &LockOptions::new())
            .unwrap()
            .is_none(),
        "the lock ran out while its guard lived"
    );
    drop(guard);
    // Dropping the last owner of the runtime waits for the release: free now, not after a TTL.
    let g = b
        .try_lock(name.as_str(), &LockOptions::new())
        .unwrap()
        .expect("the dropped guard's lock was released before its runtime stopped");
    g.release().unwrap();
}

#[test]
fn guard_outlives_its_locker_memory() {
    guard_outlives_its_locker(&unique("memory://blocking"));
}

#[cfg(feature = "redis")]
#[test]
fn guard_outlives_its_locker_redis() {
    if let Some(url) = conformance::require_env("LOCK_TEST_REDIS_URL") {
        guard_outlives_its_locker(&url);
    }
}

/// A blocking guard and locker dropped inside async code neither panic nor block, and the lock
/// is still released promptly (the shutdown goes on in a thread of its own).
fn dropped_inside_async_code(url: &str) {
    let name = unique("in-async");
    let a = blocking::connect(url).unwrap();
    let b = blocking::connect(url).unwrap();
    let ttl = Duration::from_secs(30);
    let guard = a.lock(name.as_str(), &LockOptions::new().ttl(ttl)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    rt.block_on(async move {
        drop(guard);
        drop(a);
    });
    assert!(
        started.elapsed() < scaled(1_000),
        "dropping inside async code blocked for {:?}",
        started.elapsed()
    );
    let freed = until_free(scaled(5_000), || {
        b.try_lock(name.as_str(), &LockOptions::new())
            .unwrap()
            .is_some()
    });
    assert!(
        freed.is_some(),
        "not released within 5 s of the drop (TTL {ttl:?})"
    );
}

#[test]
fn dropped_inside_async_code_memory() {
    dropped_inside_async_code(&unique("memory://blocking"));
}

#[cfg(feature = "redis")]
#[test]
fn dropped_inside_async_code_redis() {
    if let Some(url) = conformance::require_env("LOCK_TEST_REDIS_URL") {
        dropped_inside_async_code(&url);
    }
}

#[test]
fn blocking_calls_from_async_code_panic_with_a_clear_message() {
    let a = blocking::connect(&unique("memory://blocking")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let caught = rt.block_on(async {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = a.try_lock("x", &LockOptions::new());
        }))
    });
    let msg = caught.expect_err("a blocking call inside a runtime must panic");
    let text = msg
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| msg.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(text.contains("runtime"), "{text}");
}

/// Issue 37: the blocking API at parity with the async one: `inspect`, `force_release`,
/// `lock_all` / `try_lock_all`, `campaign` / `leader`.
fn parity_with_the_async_api(url: &str) {
    let a = blocking::connect(url).unwrap();
    let b = blocking::connect(url).unwrap();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_timeout(scaled(2_000))
        .label("blocking-parity");
    let name = unique("parity");

    // inspect and force_release.
    let guard = a.lock(name.as_str(), &opts).unwrap();
    let info = b.inspect(name.as_str()).unwrap();
    assert!(info.held, "{info:?}");
    assert_eq!(
        info.holder.as_ref().and_then(|h| h.label.as_deref()),
        Some("blocking-parity"),
        "{info:?}"
    );
    assert!(b.force_release(name.as_str()).unwrap(), "it was held");
    assert!(!b.inspect(name.as_str()).unwrap().held);
    let _ = guard.release();

    // lock_all / try_lock_all: a set, and contention on one of its names is Ok(None).
    let (x, y) = (unique("parity-x"), unique("parity-y"));
    let set = a.lock_all([x.as_str(), y.as_str()], &opts).unwrap();
    assert!(set.is_valid() && set.lost().is_none());
    assert_eq!(set.names().len(), 2);
    assert!(
        b.try_lock_all([y.as_str()], &opts).unwrap().is_none(),
        "contention is Ok(None)"
    );
    set.release().unwrap();
    let again = b
        .try_lock_all([x.as_str(), y.as_str()], &opts)
        .unwrap()
        .expect("free after release");
    again.release().unwrap();

    // campaign / leader / resign.
    let election = unique("parity-election");
    assert_eq!(b.leader(election.as_str()).unwrap(), None);
    let leadership = a
        .campaign(
            election.as_str(),
            "10.0.0.7:80",
            &locksmith::CampaignOptions::new(),
        )
        .unwrap();
    assert!(leadership.is_leader() && !leadership.lost().is_lost());
    let leader = b.leader(election.as_str()).unwrap().expect("a leader");
    assert_eq!(leader.value.as_deref(), Some("10.0.0.7:80"));
    assert_eq!(leader.term, leadership.term());
    leadership.resign().unwrap();
    assert_eq!(b.leader(election.as_str()).unwrap(), None);
}

#[test]
fn parity_with_the_async_api_memory() {
    parity_with_the_async_api(&unique("memory://parity"));
}

#[test]
fn parity_with_the_async_api_redis() {
    if let Some(url) = conformance::require_env("LOCK_TEST_REDIS_URL") {
        parity_with_the_async_api(&url);
    }
}
