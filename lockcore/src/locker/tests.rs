//! Tests of the locker, its guards and their watchdog.

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::memory::MemoryBackend;
use crate::{AutoRenew, LostReason};

#[tokio::test]
async fn with_lock_runs_the_work_and_releases() {
    let locker = Locker::new(MemoryBackend::connect("with_lock_runs"));
    let opts = LockOptions::new();
    let out = locker
        .with_lock("x", &opts, async |_: &LockGuard| {
            // Held while the work runs.
            let other = Locker::new(MemoryBackend::connect("with_lock_runs"));
            other
                .try_lock("x", &LockOptions::new())
                .await
                .map(|g| g.is_none())
        })
        .await
        .unwrap();
    assert_eq!(out.ok(), Some(true));
    assert!(locker.try_lock("x", &opts).await.unwrap().is_some());
}

#[tokio::test]
async fn with_lock_stops_the_work_when_the_lease_is_lost() {
    let locker = Locker::new(MemoryBackend::connect("with_lock_lost"));
    let opts = LockOptions::new()
        .ttl(Duration::from_millis(100))
        .no_auto_renew();
    let started = Instant::now();
    let finished = AtomicBool::new(false);
    let err = locker
        .with_lock("x", &opts, async |_: &LockGuard| {
            tokio::time::sleep(Duration::from_secs(30)).await;
            finished.store(true, Ordering::Release);
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            WithLockError::Lost {
                reason: LostReason::ValidityExpired,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(
        !finished.load(Ordering::Acquire),
        "the work was not stopped"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the work was not stopped"
    );
}

/// Issue 21: a work that finished but whose release failed was reported as `NotHeld`, as a
/// lost lease is, and its output was thrown away.
#[tokio::test]
async fn with_lock_keeps_the_output_when_only_the_release_fails() {
    let backend = MemoryBackend::connect("with_lock_release_fails");
    let locker = Locker::new(backend.clone());
    let err = locker
        .with_lock("x", &LockOptions::new(), async |g: &LockGuard| {
            // Taken away after the work's last await point: the work finishes, the release
            // finds the lease gone.
            assert!(backend.force_release_now(g.name()));
            42
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert_eq!(err.lost_reason(), None, "{err:?}");
    assert!(
        matches!(err, WithLockError::ReleaseFailed { .. }),
        "{err:?}"
    );
    assert_eq!(err.into_output(), Some(42), "the work's output was lost");
    // The conversion for `?` says the work finished.
    let err = locker
        .with_lock("x", &LockOptions::new(), async |g: &LockGuard| {
            backend.force_release_now(g.name());
        })
        .await
        .unwrap_err();
    let err = Error::from(err);
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    assert!(err.to_string().contains("finished"), "{err}");
    assert!(std::error::Error::source(&err).is_some());
}

/// Issue 21: a helper task awaiting `lost()` hung forever after a normal release; `ended()`
/// resolves for a release, a drop without release, and a loss.
#[tokio::test(start_paused = true)]
async fn ended_resolves_on_release_drop_and_loss() {
    use crate::Ended;
    let a = Locker::new(MemoryBackend::connect("ended"));
    let helper = |g: &LockGuard| {
        let signal = g.lost();
        tokio::spawn(async move { signal.ended().await })
    };

    let g = a.lock("released", &LockOptions::new()).await.unwrap();
    let task = helper(&g);
    let lost = g.lost();
    tokio::task::yield_now().await;
    g.release().await.unwrap();
    let ended = tokio::time::timeout(SEC, task).await;
    assert_eq!(
        ended.expect("hangs after release").unwrap(),
        Ended::Released
    );
    // `lost()` keeps its meaning: a release is not a loss.
    assert!(tokio::time::timeout(60 * SEC, lost.lost()).await.is_err());
    assert_eq!(lost.ended().await, Ended::Released, "already ended");

    let g = a.lock("dropped", &LockOptions::new()).await.unwrap();
    let task = helper(&g);
    tokio::task::yield_now().await;
    drop(g);
    let ended = tokio::time::timeout(SEC, task).await;
    assert_eq!(ended.expect("hangs after drop").unwrap(), Ended::Released);

    let g = a
        .lock("lost", &LockOptions::new().ttl(SEC).no_auto_renew())
        .await
        .unwrap();
    let task = helper(&g);
    let ended = tokio::time::timeout(2 * SEC, task).await;
    assert_eq!(
        ended.expect("hangs after a loss").unwrap(),
        Ended::Lost(LostReason::ValidityExpired)
    );
    // Released after the loss: still a loss.
    let lost = g.lost();
    let _ = g.release().await;
    assert_eq!(lost.ended().await, Ended::Lost(LostReason::ValidityExpired));
}

/// A client of `store` whose `acquire` fails with `Unavailable` the next `failures` times,
/// as over a connection that drops.
#[derive(Debug)]
struct Flaky {
    inner: MemoryBackend,
    failures: std::sync::atomic::AtomicUsize,
    /// Every call that reached the backend.
    calls: std::sync::atomic::AtomicUsize,
}

impl Flaky {
    fn new(store: &str, failures: usize) -> Self {
        Flaky {
            inner: MemoryBackend::connect(store),
            failures: failures.into(),
            calls: 0.into(),
        }
    }
}

#[crate::backend::async_trait]
impl Backend for Flaky {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        self.calls.fetch_add(1, Ordering::AcqRel);
        self.inner.try_acquire(req).await
    }
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        self.calls.fetch_add(1, Ordering::AcqRel);
        let failing = self
            .failures
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(Error::unavailable("connection reset", "test"));
        }
        self.inner.acquire(req, deadline).await
    }
    fn describe(&self) -> String {
        "flaky".into()
    }
}

const SEC: Duration = Duration::from_secs(1);

/// §1.1: ttl 30 s with a 5 s maximum hold used to keep the lock 29.7 s.
#[tokio::test(start_paused = true)]
async fn max_hold_below_the_first_renewal_ends_the_lease_there() {
    let a = Locker::new(MemoryBackend::connect("max_hold_short"));
    let b = Locker::new(MemoryBackend::connect("max_hold_short"));
    let opts = LockOptions::new()
        .ttl(30 * SEC)
        .auto_renew(AutoRenew::until(5 * SEC));
    let g = a.lock("x", &opts).await.unwrap();
    let start = g.acquired_at();
    assert!(g.valid_until() <= start + 5 * SEC, "validity past max hold");
    let lost = g.lost();
    let reason = tokio::time::timeout(6 * SEC, lost.lost())
        .await
        .expect("the lease did not end at the maximum hold time");
    assert_eq!(reason, LostReason::MaxHoldReached);
    let g2 = b
        .lock("x", &LockOptions::new().wait_timeout(SEC))
        .await
        .expect("the lock was not released at the maximum hold time");
    assert!(g2.acquired_at() <= start + 5 * SEC + Duration::from_millis(10));
    assert!(!g.is_valid());
}

/// §1.1: the renewals stop at the maximum hold time exactly, also when it is not a multiple
/// of the renewal interval.
#[tokio::test(start_paused = true)]
async fn max_hold_between_renewals_ends_the_lease_there() {
    let a = Locker::new(MemoryBackend::connect("max_hold_between"));
    let b = Locker::new(MemoryBackend::connect("max_hold_between"));
    let opts = LockOptions::new()
        .ttl(3 * SEC)
        .auto_renew(AutoRenew::until(Duration::from_millis(4500)));
    let g = a.lock("x", &opts).await.unwrap();
    let start = g.acquired_at();
    tokio::time::sleep(4 * SEC).await;
    assert!(g.is_valid(), "renewal stopped early");
    assert!(
        b.try_lock("x", &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    let g2 = b
        .lock("x", &LockOptions::new().wait_timeout(5 * SEC))
        .await
        .unwrap();
    let at = g2.acquired_at() - start;
    assert!(
        at <= Duration::from_millis(4510),
        "taken over {at:?} after acquiring"
    );
    assert!(at >= Duration::from_millis(4400), "taken over {at:?}");
    // Issue 21: the end of the hold was reported as `ValidityExpired`, the reason of an
    // unreachable server.
    assert_eq!(g.lost().reason(), Some(LostReason::MaxHoldReached));
}

/// Issue 21: a renewal that cannot reach the server before the validity deadline is
/// `ValidityExpired`, not the maximum hold time (which is far away here).
#[tokio::test(start_paused = true)]
async fn unreachable_renewal_is_validity_expired_not_max_hold() {
    let backend = MemoryBackend::connect("unreachable_renewal");
    let a = Locker::new(backend.clone());
    let opts = LockOptions::new()
        .ttl(3 * SEC)
        .auto_renew(AutoRenew::until(600 * SEC));
    let g = a.lock("x", &opts).await.unwrap();
    // Every reply from now on comes after the validity deadline.
    backend.set_reply_delay(10 * SEC);
    let reason = tokio::time::timeout(4 * SEC, g.lost().lost())
        .await
        .expect("the lease outlived its validity without a renewal");
    assert_eq!(reason, LostReason::ValidityExpired);
    assert!(g.acquired_at().elapsed() < 600 * SEC);
}

/// §1.2: after the lost signal fired at the validity deadline, an extend used to succeed
/// (the server lease had milliseconds left) and `is_lost()` turned false again.
#[tokio::test(start_paused = true)]
async fn once_lost_always_lost() {
    let a = Locker::new(MemoryBackend::connect("once_lost"));
    let opts = LockOptions::new().ttl(SEC).no_auto_renew();
    let g = a.lock("x", &opts).await.unwrap();
    let reason = g.lost().lost().await;
    assert_eq!(reason, LostReason::ValidityExpired);
    assert!(
        Instant::now() < g.acquired_at() + SEC,
        "the server lease should still run here"
    );
    let err = g.extend(SEC).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(g.lost().is_lost(), "the lost signal was taken back");
    assert!(!g.is_valid());
    assert_eq!(g.extend(SEC).await.unwrap_err().kind(), ErrorKind::NotHeld);
}

/// §1.2: an extend sent before the validity deadline whose reply comes back after it cannot
/// bring the lease back.
#[tokio::test(start_paused = true)]
async fn extend_confirmed_after_the_deadline_stays_lost() {
    let backend = MemoryBackend::connect("late_extend");
    let a = Locker::new(backend.clone());
    let opts = LockOptions::new().ttl(SEC).no_auto_renew();
    let g = a.lock("x", &opts).await.unwrap();
    tokio::time::sleep_until(g.valid_until() - Duration::from_millis(5)).await;
    backend.set_reply_delay(Duration::from_millis(50));
    let err = g.extend(SEC).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(g.lost().is_lost());
    assert!(!g.is_valid());
}

/// §1.3: two extends in flight used to leave the validity of whichever reply came last,
/// although the server applied the other one last.
#[tokio::test(start_paused = true)]
async fn concurrent_extends_follow_what_the_server_applied_last() {
    let backend = MemoryBackend::connect("concurrent_extends");
    let a = Locker::new(backend.clone());
    let b = Locker::new(MemoryBackend::connect("concurrent_extends"));
    // Only the extends below move the deadline.
    let opts = LockOptions::new().ttl(5 * SEC).no_auto_renew();
    let g = a.lock("x", &opts).await.unwrap();
    backend.set_reply_delay(Duration::from_millis(500));
    let slow = g.extend(10 * SEC);
    let fast = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        backend.set_reply_delay(Duration::ZERO);
        g.extend(2 * SEC).await
    };
    let (slow, fast) = tokio::join!(slow, fast);
    slow.unwrap();
    fast.unwrap();
    let until = g.valid_until();
    tokio::time::sleep_until(until - Duration::from_millis(1)).await;
    assert!(
        b.try_lock("x", &LockOptions::new())
            .await
            .unwrap()
            .is_none(),
        "the guard believes it is valid for {:?} more, but another client took the lock",
        until - g.acquired_at()
    );
    assert!(g.is_valid());
}

/// §1.4: a guard dropped after its runtime shut down cannot release; `flush` must not wait
/// for that release forever, and the lock frees by its TTL.
#[test]
fn drop_after_the_runtime_shut_down_does_not_hang_flush() {
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = rt();
    let (locker, guard) = first.block_on(async {
        let l = Locker::new(MemoryBackend::connect("after_shutdown"));
        let g = l
            .lock("x", &LockOptions::new().ttl(Duration::from_millis(300)))
            .await
            .unwrap();
        (l, g)
    });
    drop(first);
    rt().block_on(async {
        drop(guard);
        assert_eq!(locker.pending_releases(), 0);
        tokio::time::timeout(5 * SEC, locker.flush())
            .await
            .expect("flush() hangs on a release that can never run");
        let other = Locker::new(MemoryBackend::connect("after_shutdown"));
        assert!(
            other
                .try_lock("x", &LockOptions::new())
                .await
                .unwrap()
                .is_none(),
            "nothing released the lock: it frees by its TTL"
        );
        let g = other
            .lock("x", &LockOptions::new().wait_timeout(5 * SEC))
            .await
            .expect("the lock frees by its TTL");
        g.release().await.unwrap();
    });
}

/// §1.5: a TTL at or below the drift margin (a guard born lost) and a renewal point after
/// the validity end used to be accepted.
#[tokio::test]
async fn impossible_ttls_are_refused() {
    let a = Locker::new(MemoryBackend::connect("impossible_ttls"));
    let margin = a.capabilities().drift_margin(Duration::from_millis(2));
    for ttl in [margin, Duration::from_millis(1), Duration::from_millis(2)] {
        let err = a
            .try_lock("x", &LockOptions::new().ttl(ttl))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "ttl {ttl:?}: {err}");
    }
    let late_renewal = LockOptions::new()
        .ttl(Duration::from_millis(10))
        .auto_renew(AutoRenew::until(SEC).interval_fraction(0.8));
    let err = a.try_lock("x", &late_renewal).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    let g = a.try_lock("x", &LockOptions::new()).await.unwrap().unwrap();
    assert_eq!(
        g.extend(Duration::from_millis(2)).await.unwrap_err().kind(),
        ErrorKind::InvalidConfig
    );
    assert!(g.is_valid());
}

/// §1.7: one connection error in a wait with time left used to end the whole wait.
#[tokio::test(start_paused = true)]
async fn transient_errors_inside_a_wait_are_retried() {
    let holder = Locker::new(MemoryBackend::connect("transient"));
    let g = holder.lock("x", &LockOptions::new()).await.unwrap();
    let waiter = Locker::new(Flaky::new("transient", 3));
    let release = async {
        tokio::time::sleep(2 * SEC).await;
        g.release().await.unwrap();
    };
    let opts = LockOptions::new().wait_timeout(10 * SEC);
    let (got, ()) = tokio::join!(waiter.lock("x", &opts), release);
    let got = got.expect("the wait was not retried after a transient error");
    assert!(got.acquired_at() - Instant::now() < SEC);
}

/// §1.7: errors that persist end the wait: at the deadline, or after 30 s without one.
#[tokio::test(start_paused = true)]
async fn persistent_unavailable_ends_the_wait() {
    let waiter = Locker::new(Flaky::new("persistent", usize::MAX));
    let start = Instant::now();
    let err = waiter
        .lock("x", &LockOptions::new().wait_timeout(2 * SEC))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(start.elapsed() >= 2 * SEC && start.elapsed() < 3 * SEC);
    let start = Instant::now();
    let err = waiter.lock("x", &LockOptions::new()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(start.elapsed() >= 30 * SEC && start.elapsed() < 32 * SEC);
    // Other errors are not retried.
    let a = Locker::new(MemoryBackend::connect("persistent"));
    assert_eq!(
        a.lock("", &LockOptions::new()).await.unwrap_err().kind(),
        ErrorKind::InvalidName
    );
}

/// §1.9: `with_lock` renews by default: a 40 s job under a 30 s TTL used to lose the lock.
#[tokio::test(start_paused = true)]
async fn with_lock_renews_by_default_and_hands_over_the_guard() {
    let a = Locker::new(MemoryBackend::connect("with_lock_renews"));
    let b = Locker::new(MemoryBackend::connect("with_lock_renews"));
    let token = a
        .with_lock("x", &LockOptions::new(), async |g: &LockGuard| {
            tokio::time::sleep(40 * SEC).await;
            assert!(g.is_valid());
            assert!(
                b.try_lock("x", &LockOptions::new())
                    .await
                    .unwrap()
                    .is_none()
            );
            g.fencing_token()
        })
        .await
        .expect("the lease was lost during a 40 s job");
    assert!(token.is_some());
    assert!(
        b.try_lock("x", &LockOptions::new())
            .await
            .unwrap()
            .is_some()
    );
}

/// Issue 21: guards from `lock()` and `try_lock()` were not renewed by default (only
/// `with_lock`'s were): a 45 s job under the default 30 s TTL silently lost its lock.
#[tokio::test(start_paused = true)]
async fn every_guard_is_renewed_while_it_exists() {
    let a = Locker::new(MemoryBackend::connect("renewed_by_default"));
    let b = Locker::new(MemoryBackend::connect("renewed_by_default"));
    let opts = LockOptions::new();
    let from_lock = a.lock("lock", &opts).await.unwrap();
    let from_try = a.try_lock("try", &opts).await.unwrap().unwrap();
    tokio::time::sleep(45 * SEC).await;
    for g in [&from_lock, &from_try] {
        assert!(g.is_valid(), "{:?} lost after 45 s", g.name());
        assert!(
            b.try_lock(g.name().as_str(), &opts)
                .await
                .unwrap()
                .is_none(),
            "another client took {:?} from a live guard",
            g.name()
        );
    }
    // Released or dropped: renewal stops and the lock is free.
    from_lock.release().await.unwrap();
    drop(from_try);
    a.flush().await;
    for name in ["lock", "try"] {
        assert!(b.try_lock(name, &opts).await.unwrap().is_some(), "{name}");
    }
    // Bounded by the default maximum hold time.
    let g = a.lock("held", &opts).await.unwrap();
    let reason = tokio::time::timeout(crate::DEFAULT_MAX_HOLD + SEC, g.lost().lost())
        .await
        .expect("renewed past the default maximum hold time");
    assert_eq!(reason, LostReason::MaxHoldReached);
    assert!(g.acquired_at().elapsed() >= crate::DEFAULT_MAX_HOLD - SEC);
    // The explicit opt-out: the lease ends one TTL in, guard or not.
    let g = a
        .lock("unrenewed", &LockOptions::new().no_auto_renew())
        .await
        .unwrap();
    let reason = tokio::time::timeout(31 * SEC, g.lost().lost())
        .await
        .expect("no_auto_renew still renewed");
    assert_eq!(reason, LostReason::ValidityExpired);
    assert!(b.lock("unrenewed", &opts).await.is_ok());
}

/// §1.9: `lock()` waits until acquired by default (it used to give up after 30 s).
#[tokio::test(start_paused = true)]
async fn lock_waits_until_acquired_by_default() {
    let a = Locker::new(MemoryBackend::connect("waits_by_default"));
    let b = Locker::new(MemoryBackend::connect("waits_by_default"));
    let g = a
        .lock("x", &LockOptions::new().ttl(600 * SEC))
        .await
        .unwrap();
    let release = async {
        tokio::time::sleep(120 * SEC).await;
        g.release().await.unwrap();
    };
    let opts = LockOptions::new();
    let started = Instant::now();
    let (got, ()) = tokio::join!(b.lock("x", &opts), release);
    let got = got.expect("lock() gave up before the lock was free");
    assert!(got.acquired_at() - started >= 120 * SEC);
}

/// A shorter extend moves the lost signal (and the watchdog's release) earlier: both used to
/// sleep until the old deadline.
#[tokio::test(start_paused = true)]
async fn shorter_extend_moves_the_deadline_earlier() {
    let a = Locker::new(MemoryBackend::connect("shorter_extend"));
    let g = a
        .lock(
            "x",
            &LockOptions::new()
                .ttl(10 * SEC)
                .auto_renew(AutoRenew::until(600 * SEC)),
        )
        .await
        .unwrap();
    let lost = g.lost();
    let waiting = tokio::spawn(async move { lost.lost().await });
    tokio::task::yield_now().await;
    let start = Instant::now();
    // Auto-renewal then renews to the full TTL at its next tick; stop it from doing so by
    // checking before that tick.
    g.extend(SEC).await.unwrap();
    assert!(g.valid_until() <= start + SEC);
    let reason = tokio::time::timeout(2 * SEC, waiting)
        .await
        .expect("the lost signal still waited for the old deadline")
        .unwrap();
    assert_eq!(reason, LostReason::ValidityExpired);
}

/// Bad names and options get typed errors before any I/O and change nothing (moved here from
/// the conformance suite, where it exercised this validation and not the backends).
#[tokio::test]
async fn invalid_input_is_refused_before_any_io() {
    let backend = Arc::new(Flaky::new("invalid_input", 0));
    let a = Locker::from_arc(backend.clone());
    let too_long = "x".repeat(crate::MAX_NAME_LEN + 1);
    for bad in ["", "nul\0byte", "new\nline", "esc\u{1b}", too_long.as_str()] {
        assert_eq!(
            a.try_lock(bad, &LockOptions::new())
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidName,
            "{bad:?}"
        );
        assert_eq!(
            a.lock(bad, &LockOptions::new()).await.unwrap_err().kind(),
            ErrorKind::InvalidName
        );
    }
    for (what, bad) in [
        ("zero", LockOptions::new().ttl(Duration::ZERO)),
        ("huge", LockOptions::new().ttl(Duration::MAX)),
        (
            "bad renew",
            LockOptions::new().auto_renew(AutoRenew::until(Duration::ZERO)),
        ),
    ] {
        assert_eq!(
            a.try_lock("x", &bad).await.unwrap_err().kind(),
            ErrorKind::InvalidConfig,
            "{what}"
        );
    }
    for (what, opts) in [("require_fair on a", LockOptions::new().require_fair(true))] {
        let supported = a.capabilities().fair;
        match a.try_lock("x", &opts).await {
            Err(e) => assert!(
                !supported && e.kind() == ErrorKind::Unsupported,
                "{what}: {e}"
            ),
            Ok(g) => {
                assert!(supported, "{what} accepted");
                drop(g);
            }
        }
    }
    let calls = backend.calls.load(Ordering::Acquire);
    // Only the supported require_fair attempt reached the backend.
    assert_eq!(calls, 1, "refused input reached the backend");
    a.flush().await;
    assert!(
        a.try_lock("x", &LockOptions::new())
            .await
            .unwrap()
            .is_some()
    );
}

/// `Locker::waiting` counts a `lock` call from the moment its backend marks it waiting until it
/// returns: won, timed out, or dropped.
#[tokio::test]
async fn waiting_counts_a_lock_call_until_it_returns_or_is_dropped() {
    let holder = Locker::new(MemoryBackend::connect("waiting_counts"));
    let waiter = Locker::new(MemoryBackend::connect("waiting_counts"));
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let held = holder.lock("x", &opts).await.unwrap();
    assert_eq!(waiter.waiting("x").unwrap(), 0);

    let until_waiting = async |n: usize| {
        while waiter.waiting("x").unwrap() < n {
            tokio::task::yield_now().await;
        }
    };
    // Won after a wait.
    let wait = tokio::spawn({
        let (waiter, opts) = (waiter.clone(), opts.clone().wait_forever());
        async move { waiter.lock("x", &opts).await }
    });
    until_waiting(1).await;
    assert_eq!(
        holder.waiting("x").unwrap(),
        0,
        "counted by the waiting client only"
    );
    held.release().await.unwrap();
    let won = wait.await.unwrap().unwrap();
    assert_eq!(waiter.waiting("x").unwrap(), 0);

    // Dropped while waiting.
    let dropped = tokio::spawn({
        let (waiter, opts) = (waiter.clone(), opts.clone().wait_forever());
        async move { waiter.lock("x", &opts).await }
    });
    until_waiting(1).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    assert_eq!(waiter.waiting("x").unwrap(), 0);

    // Timed out.
    let timed_out = waiter
        .lock("x", &opts.clone().wait_timeout(Duration::from_millis(20)))
        .await;
    assert_eq!(timed_out.unwrap_err().kind(), ErrorKind::Timeout);
    assert_eq!(waiter.waiting("x").unwrap(), 0);
    won.release().await.unwrap();
}

/// Issue 24: the watchdog of a client is one task with a timer heap, not a task per lease.
/// 2,000 auto-renewed leases on one client are renewed (another client finds every one held
/// after more than three TTLs) by at most one task more than none.
#[tokio::test(start_paused = true)]
async fn many_leases_are_renewed_by_one_task() {
    let a = Locker::new(MemoryBackend::connect("many_leases"));
    let b = Locker::new(MemoryBackend::connect("many_leases"));
    let opts = LockOptions::new().ttl(3 * SEC);
    let tasks_before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let mut guards = Vec::new();
    for i in 0..2000 {
        guards.push(a.try_lock(format!("l{i}"), &opts).await.unwrap().unwrap());
    }
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
        - tasks_before;
    assert!(tasks <= 1, "{tasks} tasks keep 2,000 leases");
    tokio::time::sleep(10 * SEC).await;
    assert_eq!(a.inner.watchdog.watched(), 2000);
    for g in &guards {
        assert!(g.is_valid(), "{:?} lost", g.name());
    }
    for i in (0..2000).step_by(97) {
        let name = format!("l{i}");
        assert!(b.try_lock(&*name, &opts).await.unwrap().is_none(), "{name}");
    }
}

/// Polls (real time, with a deadline) until `locker`'s watchdog watches `n` leases.
async fn until_watched(locker: &Locker, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while locker.inner.watchdog.watched() != n {
        assert!(
            std::time::Instant::now() < deadline,
            "{} leases watched, expected {n}",
            locker.inner.watchdog.watched()
        );
        tokio::task::yield_now().await;
    }
}

/// A released, dropped or abandoned guard's record leaves the watchdog (no leak), and a lease
/// that needs no watching (not renewed, on a backend whose server ends it at its TTL) never
/// gets one.
#[tokio::test]
async fn an_ended_guards_record_is_removed() {
    let a = Locker::new(MemoryBackend::connect("records_removed"));
    let opts = LockOptions::new();
    let mut guards = Vec::new();
    for i in 0..100 {
        guards.push(a.try_lock(format!("r{i}"), &opts).await.unwrap().unwrap());
    }
    until_watched(&a, 100).await;
    guards.truncate(40);
    until_watched(&a, 40).await;
    for g in guards.drain(30..) {
        g.release().await.unwrap();
    }
    until_watched(&a, 30).await;
    for g in guards.drain(20..) {
        g.abandon();
    }
    until_watched(&a, 20).await;
    drop(guards);
    until_watched(&a, 0).await;
    let unwatched = a
        .try_lock("unrenewed", &LockOptions::new().no_auto_renew())
        .await
        .unwrap()
        .unwrap();
    let renewed = a.try_lock("renewed", &opts).await.unwrap().unwrap();
    until_watched(&a, 1).await;
    drop((unwatched, renewed));
    until_watched(&a, 0).await;
    a.flush().await;
}

/// A client whose leases on `slow` take `delay` to extend (the others are as fast as memory).
#[derive(Debug)]
struct SlowRenewals {
    inner: MemoryBackend,
    slow: &'static str,
    delay: Duration,
}

#[derive(Debug)]
struct SlowLease(crate::backend::BoxLease, Duration);

#[crate::backend::async_trait]
impl crate::backend::Lease for SlowLease {
    fn fencing_token(&self) -> Option<u64> {
        self.0.fencing_token()
    }
    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        tokio::time::sleep(self.1).await;
        self.0.extend(ttl).await
    }
    async fn release(&self) -> Result<()> {
        self.0.release().await
    }
}

impl SlowRenewals {
    fn wrap(&self, req: &AcquireRequest, acquired: Option<Acquired>) -> Option<Acquired> {
        acquired.map(|a| {
            if req.name.as_str() == self.slow {
                Acquired {
                    lease: Box::new(SlowLease(a.lease, self.delay)),
                    ..a
                }
            } else {
                a
            }
        })
    }
}

#[crate::backend::async_trait]
impl Backend for SlowRenewals {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        let acquired = self.inner.try_acquire(req).await?;
        Ok(self.wrap(req, acquired))
    }
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        let acquired = self.inner.acquire(req, deadline).await?;
        Ok(self.wrap(req, acquired))
    }
    fn describe(&self) -> String {
        "slow renewals".into()
    }
}

/// Renewals go out concurrently: one lease whose renewal takes 2.5 s (past its validity: it is
/// lost at its deadline, not before) holds back none of the others, whose validity never drops
/// below what a renewal every third of the TTL leaves (a one-at-a-time watchdog would let it
/// fall to 0.5 s, and lose them).
#[tokio::test(start_paused = true)]
async fn a_slow_renewal_does_not_delay_the_others() {
    let a = Locker::new(SlowRenewals {
        inner: MemoryBackend::connect("slow_renewal"),
        slow: "slow",
        delay: Duration::from_millis(2500),
    });
    let opts = LockOptions::new().ttl(3 * SEC);
    let slow = a.try_lock("slow", &opts).await.unwrap().unwrap();
    let mut fast = Vec::new();
    for i in 0..50 {
        fast.push(a.try_lock(format!("f{i}"), &opts).await.unwrap().unwrap());
    }
    let slow_deadline = slow.valid_until();
    let start = Instant::now();
    let mut least_left = 3 * SEC;
    while Instant::now() < start + 8 * SEC {
        tokio::time::sleep(Duration::from_millis(50)).await;
        for g in &fast {
            least_left = least_left.min(g.valid_until().saturating_duration_since(Instant::now()));
        }
        if Instant::now() < slow_deadline {
            assert_eq!(slow.reported(), None, "the slow lease was given up early");
        }
    }
    assert!(
        least_left >= Duration::from_millis(1800),
        "a fast lease was left with {least_left:?} of validity"
    );
    assert!(fast.iter().all(LockGuard::is_valid));
    assert_eq!(slow.reported(), Some(LostReason::ValidityExpired));
    assert_eq!(slow.lost().lost_at(), Some(slow_deadline));
}

/// When renewals fail, the watchdog reports every lease lost at its validity deadline: not
/// before (it is still the holder's) and not after (another holder may be granted it then).
#[tokio::test(start_paused = true)]
async fn lost_is_reported_at_the_deadline_when_renewals_fail() {
    let backend = MemoryBackend::connect("renewals_fail");
    let a = Locker::new(backend.clone());
    let opts = LockOptions::new().ttl(3 * SEC);
    let mut guards = Vec::new();
    for i in 0..200 {
        guards.push(a.try_lock(format!("x{i}"), &opts).await.unwrap().unwrap());
    }
    // Every reply from now on comes after the validity deadline.
    backend.set_reply_delay(10 * SEC);
    let deadline = guards.iter().map(LockGuard::valid_until).max().unwrap();
    assert!(guards.iter().all(|g| g.valid_until() == deadline));
    tokio::time::sleep_until(deadline - Duration::from_millis(1)).await;
    assert!(guards.iter().all(|g| g.reported().is_none()), "early");
    tokio::time::sleep_until(deadline + Duration::from_millis(1)).await;
    for g in &guards {
        assert_eq!(g.reported(), Some(LostReason::ValidityExpired));
        assert_eq!(g.lost().lost_at(), Some(deadline));
    }
    // Every record went with its loss.
    until_watched(&a, 0).await;
}

/// A guard released while its renewal is in flight: the renewal is abandoned with it, so its
/// late answer (refused: the lock is gone) is no loss.
#[tokio::test(start_paused = true)]
async fn a_renewal_in_flight_ends_with_its_guard() {
    let a = Locker::new(SlowRenewals {
        inner: MemoryBackend::connect("renewal_in_flight"),
        slow: "x",
        delay: Duration::from_millis(500),
    });
    let g = a
        .try_lock("x", &LockOptions::new().ttl(3 * SEC))
        .await
        .unwrap()
        .unwrap();
    let lost = g.lost();
    // The first renewal goes out at 1 s and answers at 1.5 s.
    tokio::time::sleep_until(g.acquired_at() + Duration::from_millis(1200)).await;
    g.release().await.unwrap();
    tokio::time::sleep(5 * SEC).await;
    assert_eq!(lost.reason(), None);
    assert_eq!(lost.ended().await, crate::Ended::Released);
    assert_eq!(a.inner.watchdog.watched(), 0);
}

#[test]
fn a_guard_is_a_few_words() {
    // A caller holding many leases keeps their guards (issue 24: 100,000 on one client); what
    // they share with the watchdog lives once, in the lease's shared state.
    assert_size_at_most!(LockGuard, 40);
    assert!(size_of::<LostSignal>() <= 16);
}

/// Yields (real time, with a deadline) until `locker`'s watchdog task sleeps.
async fn until_the_watchdog_sleeps(locker: &Locker) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !locker.inner.watchdog.is_asleep() {
        assert!(
            std::time::Instant::now() < deadline,
            "the watchdog task never went to sleep"
        );
        tokio::task::yield_now().await;
    }
}

/// Issue 38: an uncontended lock and release with default options (auto-renewed) leaves the
/// watchdog task asleep. The lease is handed over and taken back before its first renewal,
/// which the task is due to wake for anyway (it watches an earlier lease): it used to be woken
/// twice per cycle, by the hand-over and by the release.
#[tokio::test]
async fn lock_release_cycles_do_not_wake_the_watchdog() {
    let a = Locker::new(MemoryBackend::connect("cycles_no_wakeup"));
    let opts = LockOptions::new();
    // One long-held lease: the task sleeps until its first renewal.
    let held = a.try_lock("held", &opts).await.unwrap().unwrap();
    until_the_watchdog_sleeps(&a).await;
    let polls = a.inner.watchdog.polls();
    for _ in 0..100 {
        // Yields where a server's round trip would let the task run.
        let g = a.try_lock("cycled", &opts).await.unwrap().unwrap();
        tokio::task::yield_now().await;
        g.release().await.unwrap();
        tokio::task::yield_now().await;
    }
    // Anything woken runs now (a current-thread runtime: the task runs when this one yields).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        a.inner.watchdog.polls() - polls,
        0,
        "watchdog task wake-ups for 100 lock and release cycles"
    );
    assert_eq!(a.inner.watchdog.watched(), 1);
    held.release().await.unwrap();
}

/// A lease handed over while the watchdog sleeps until later (a 30 s lease's first renewal)
/// whose own first renewal is due earlier wakes the task: it is renewed on time, and one whose
/// first renewal is later waits for the task's next wake-up and is renewed too.
#[tokio::test(start_paused = true)]
async fn a_lease_due_before_the_watchdogs_wake_up_is_renewed_on_time() {
    let a = Locker::new(MemoryBackend::connect("due_earlier"));
    let b = Locker::new(MemoryBackend::connect("due_earlier"));
    let long = a
        .try_lock("long", &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    until_the_watchdog_sleeps(&a).await;
    let short = a
        .try_lock("short", &LockOptions::new().ttl(3 * SEC))
        .await
        .unwrap()
        .unwrap();
    let later = a
        .try_lock("later", &LockOptions::new().ttl(60 * SEC))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(70 * SEC).await;
    for g in [&long, &short, &later] {
        assert!(g.is_valid(), "{:?} lost", g.name());
        assert!(
            b.try_lock(g.name().as_str(), &LockOptions::new())
                .await
                .unwrap()
                .is_none(),
            "{:?} free",
            g.name()
        );
    }
}

/// An ended watch's record leaves the task's map at its next wake-up (no leak), though ending
/// it woke nothing.
#[tokio::test(start_paused = true)]
async fn ended_watches_leave_the_task_at_its_next_wake_up() {
    let a = Locker::new(MemoryBackend::connect("records_go"));
    let opts = LockOptions::new().ttl(3 * SEC);
    let mut guards = Vec::new();
    for i in 0..50 {
        guards.push(a.try_lock(format!("g{i}"), &opts).await.unwrap().unwrap());
    }
    until_the_watchdog_sleeps(&a).await;
    assert_eq!(a.inner.watchdog.records(), 50);
    let kept = guards.pop().unwrap();
    for g in guards {
        g.release().await.unwrap();
    }
    assert_eq!(a.inner.watchdog.watched(), 1);
    // The first renewals are due at 1 s.
    tokio::time::sleep(2 * SEC).await;
    until_the_watchdog_sleeps(&a).await;
    assert_eq!(a.inner.watchdog.records(), 1);
    assert!(kept.is_valid());
}
