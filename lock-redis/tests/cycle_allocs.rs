//! How many heap bytes one uncontended default `lock()` + `release()` cycle allocates on a
//! Redis client, beside the backend's bare cycle (`SET NX PX` + compare-and-delete,
//! `Backend::bare_cycle`) on the same client (issue 38: the default path at the bare cost).
//! Counted by a counting global allocator (`cap`, its cumulative `total_allocated`), so the
//! figure is the code's, not the machine's: every byte the process allocates during the cycle,
//! in the caller's task, the connection's driver and the locker's watchdog alike (the bytes
//! are freed again by the cycle's end: this is churn, not a lasting cost). The median over many
//! cycles is compared (a buffer that grows once lands in one cycle only). One test in its own
//! binary, so nothing else runs beside it.
//!
//! Needs `LOCK_TEST_REDIS_URL` (skipped when unset, failing under `LOCK_TEST_REQUIRE_ALL`).

use std::alloc::System;

use cap::Cap;
use conformance::require_env;
use lock_redis::RedisBackend;
use lockcore::backend::Backend;
use lockcore::{LockName, LockOptions, Locker};

/// Every allocation of this test binary goes through this wrapper (no limit).
#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// The heap bytes this process has allocated so far (freed or not).
fn allocated() -> usize {
    ALLOCATOR.total_allocated()
}

/// Heap bytes allocated per default cycle at most (the median). Measured 2026-12-05 (debug
/// build, `cargo test -p lock-redis --test cycle_allocs -- --nocapture`, four runs): lock
/// 10,788-10,904, release 5,870, total 16,658-16,774; the bare cycle 5,100-5,132 (about 2.5 KB
/// a command in the client's request path, which every cycle pays). The budget is that
/// figure with a small margin, so that a new allocation on the default path is a decision, not
/// an accident.
const BUDGET_PER_CYCLE: usize = 17_500;

fn median(mut v: Vec<usize>) -> usize {
    v.sort_unstable();
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_cycle_fits_its_allocation_budget() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    const WARM: usize = 50;
    const CYCLES: usize = 300;
    let backend = RedisBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone());
    let name = LockName::new(format!("lsallocs-{:016x}", fastrand::u64(..))).unwrap();
    let opts = LockOptions::new();
    let (mut locks, mut releases, mut bare) = (vec![], vec![], vec![]);
    for i in 0..WARM + CYCLES {
        let before = allocated();
        let g = locker.lock(&name, &opts).await.unwrap();
        let held = allocated();
        g.release().await.unwrap();
        let released = allocated();
        backend.bare_cycle(&name).await.unwrap();
        let after = allocated();
        if i >= WARM {
            locks.push(held - before);
            releases.push(released - held);
            bare.push(after - released);
        }
    }
    let (lock, release, bare) = (median(locks), median(releases), median(bare));
    eprintln!(
        "heap bytes allocated per uncontended default cycle (median of {CYCLES}): lock {lock}, \
         release {release}, total {}; the bare cycle {bare}",
        lock + release
    );
    assert!(
        lock + release <= BUDGET_PER_CYCLE,
        "{} heap bytes allocated per default cycle (lock {lock} + release {release}; budget \
         {BUDGET_PER_CYCLE}; the bare cycle {bare})",
        lock + release
    );
}
