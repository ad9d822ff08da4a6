//! [`LockGuard`]: a held lock, released on drop.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{AcquireRequest, Acquired, Backend, OwnerToken};
use crate::compact_time::{CompactDuration, CompactInstant};
use crate::{AutoRenew, Error, LockName, LockOptions, LostSignal, RenewKind, Result};

use super::inner::LockerInner;
use super::lease::GuardShared;

/// A held lock. Release it with [`LockGuard::release`] to learn the outcome; dropping it hands
/// the release to a background task of the [`Locker`] (never blocking, and not immediate: the
/// lock is free a round trip later).
///
/// A guard dropped after the runtime its [`Locker`] was created on has shut down cannot release:
/// the release task is dropped unrun, the lock frees by its TTL (or with its session), and
/// [`Locker::flush`] does not wait for it. Release guards (or [`Locker::flush`]) before shutting
/// a runtime down.
///
/// Check [`LockGuard::lost`] (or [`LockGuard::is_valid`]) before acting on the lock's behalf,
/// and pass [`LockGuard::fencing_token`] to the resource you protect where the backend has one.
///
/// [`Locker`]: crate::Locker
/// [`Locker::flush`]: crate::Locker::flush
#[must_use = "the lock is released as soon as the guard is dropped: bind it (`let guard = ...` or `let _guard = ...`; `let _ = ...` releases at once)"]
pub struct LockGuard {
    /// The lease's state (name, token, TTL, validity, ...), shared with the watchdog: kept
    /// there once rather than copied here, so that a caller holding many guards pays for a few
    /// words each (issue 24).
    shared: Arc<GuardShared>,
    /// Its lost signal is counted, not kept (`LostNotifier::hold_signal`: the notifier in
    /// `shared` reaches the same state), 8 bytes less per guard (issue 24).
    locker: Arc<LockerInner>,
    finished: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.shared.name)
            .field("token", &self.shared.token)
            .field("fencing_token", &self.fencing_token())
            .field("lost", &self.shared.notifier.signal_reason())
            .finish()
    }
}

impl LockGuard {
    /// A guard for a lease just acquired: sets its validity, hooks the lost signal's telemetry
    /// and hands the lease to the locker's watchdog where it needs one.
    pub(super) fn start(
        locker: &Arc<LockerInner>,
        request: AcquireRequest,
        signal: LostSignal,
        acquired: Acquired,
        options: &LockOptions,
    ) -> LockGuard {
        let ttl = request.ttl;
        let caps = locker.backend.capabilities();
        let granted = acquired.granted_ttl.unwrap_or(ttl);
        // The maximum hold time ends the lease whatever the TTL: the validity never runs past
        // it, and the watchdog releases the lock there.
        let hold_deadline = options
            .auto_renew_value()
            .and_then(AutoRenew::max_hold)
            .map(|hold| acquired.sent_at + hold);
        let telemetry = locker.telemetry.clone();
        telemetry.held.increment(1.0);
        let acquired_at = acquired.sent_at;
        // The lost signal notices a passed deadline by itself, and a TTL backend's server frees
        // the lock by itself: the watchdog is needed only to renew, or to release a
        // session-bound lease at its deadline. Not watching the others keeps the watchdog's
        // wake-ups off the uncontended path.
        let renew = options.auto_renew_value();
        let needs_watchdog =
            renew.is_some() || !caps.expiry_after_ttl || caps.renew == RenewKind::Native;
        let watch = needs_watchdog.then(|| {
            locker
                .watchdog
                .reserve(&locker.runtime, &locker.backend, &locker.background)
        });
        let interval = renew.map(|r| ttl.mul_f64(r.fraction()));
        let shared = Arc::new(GuardShared {
            name: request.name,
            token: request.token,
            ttl: CompactDuration::new(Some(ttl)),
            renew_interval: CompactDuration::new(interval),
            telemetry,
            acquired_at: CompactInstant::new(Some(acquired_at)),
            lease: acquired.lease,
            notifier: request.lost,
            release_started: AtomicBool::new(false),
            loss_recorded: AtomicBool::new(false),
            extending: Default::default(),
            hold_deadline: CompactInstant::new(hold_deadline),
            watch,
            renewal: Default::default(),
        });
        shared.notifier.attach_validity(
            shared.deadline(acquired.sent_at, granted, caps),
            hold_deadline,
        );
        // The lost span and counter, once (a loss already reported runs it now).
        let hook: std::sync::Weak<GuardShared> = Arc::downgrade(&shared);
        shared.notifier.set_hook(hook);
        // A first validity shorter than the TTL (a lock handed over with a short claim) is
        // renewed within it, at the same fraction of it.
        let first_renewal = renew.map(|r| {
            let i = ttl.min(granted).mul_f64(r.fraction());
            acquired.sent_at + i
        });
        if let Some(watch) = &shared.watch {
            let valid_until = shared.valid_until();
            let first_look = first_renewal.map_or(valid_until, |r| r.min(valid_until));
            watch.start(shared.clone(), first_renewal, first_look);
        }
        shared.notifier.hold_signal(signal);
        LockGuard {
            shared,
            locker: locker.clone(),
            finished: false,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.shared.name
    }

    /// This acquisition's random owner token.
    pub fn token(&self) -> OwnerToken {
        self.shared.token
    }

    /// The fencing token: strictly increasing across successive holders of this name, on
    /// backends that declare `fencing`. May be `None` when the options said
    /// [`no_fencing`](crate::LockOptions::no_fencing) (the backend skipped making one); ask
    /// for [`Fencing::Required`](crate::Fencing::Required) to be sure of one.
    pub fn fencing_token(&self) -> Option<u64> {
        self.shared.lease.fencing_token()
    }

    /// When the request that won the lock was sent.
    pub fn acquired_at(&self) -> Instant {
        self.shared.acquired_at()
    }

    /// The TTL asked for.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl()
    }

    /// Until when the lease is surely this holder's, on the monotonic clock: the moment the
    /// winning (or last renewing) request was sent, plus the TTL, minus a drift margin.
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// Whether the lease is still within its validity and not known lost.
    pub fn is_valid(&self) -> bool {
        !self.is_lost() && Instant::now() < self.valid_until()
    }

    /// The loss reported through the lease's notifier (by the backend or the watchdog), not
    /// what the signal computes from the deadline: what the watchdog's tests look at.
    #[cfg(test)]
    pub(super) fn reported(&self) -> Option<crate::LostReason> {
        self.shared.notifier.reason()
    }

    /// The lost signal: fires when the lease is known lost.
    pub fn lost(&self) -> LostSignal {
        self.shared.notifier.signal()
    }

    /// Extends the lease to `ttl` from now (shorter or longer than before), never past the
    /// maximum hold time of its auto-renewal. Extends of one guard run one at a time (a second
    /// waits for the first), so the validity follows what the server applied last.
    ///
    /// Once the lease is known lost it stays lost: after the lost signal fired (or the validity
    /// deadline passed), `extend` returns `NotHeld` without asking the server, and a reply that
    /// comes back after the validity deadline counts as lost too.
    ///
    /// Cancel safety: dropping the future may or may not have extended the lease on the server;
    /// the validity deadline is only moved on a confirmed success.
    ///
    /// # Errors
    /// `NotHeld` if the lease is no longer this holder's (nothing changes), `InvalidConfig` for a
    /// bad TTL, `Unavailable` or `Backend` on failure.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let caps = self.locker.backend.capabilities();
        // Only the TTL is checked: the guard's renewal policy was checked when it was acquired.
        LockOptions::new().ttl(ttl).no_auto_renew().validate(caps)?;
        self.shared.extend(ttl, caps, false).await.map(drop)
    }

    /// Releases the lock and reports how it went.
    ///
    /// Cancel safety: if the future is dropped before it completes, the release goes on in the
    /// background as if the guard had been dropped.
    ///
    /// # Errors
    /// `NotHeld` if the lease had already expired or been taken over (nothing was freed);
    /// `Unavailable` or `Backend` on failure (the lock then frees after its TTL).
    pub async fn release(mut self) -> Result<()> {
        self.stop_watchdog();
        self.finished = true;
        if self.is_lost() {
            // Released after the loss: the signal stays fired, and the release is still sent.
        } else {
            self.shared.end_by_holder();
        }
        if !self.shared.begin_release() {
            return Err(Error::not_held(
                "the lease ran past its validity and was already released",
            ));
        }
        let mut on_cancel = ReleaseOnCancel {
            shared: Some(self.shared.clone()),
            locker: self.locker.clone(),
        };
        let result = self.shared.release_traced().await;
        on_cancel.shared = None;
        result
    }

    /// Stops renewal and forgets the lease without releasing it: the lock stays held until its
    /// TTL runs out (or, on session-bound backends, until the session ends). Meant for tests that
    /// play a crashed holder.
    pub fn abandon(mut self) {
        self.stop_watchdog();
        self.finished = true;
        self.shared.end_by_holder();
        self.shared.release_started.store(true, Ordering::Release);
    }

    fn stop_watchdog(&mut self) {
        self.shared.stop_watch();
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.shared.telemetry.held.decrement(1.0);
        // A loss the signal computed (the validity deadline passed) but nothing reported yet is
        // reported now, so the lost span and counter see every loss known by the guard's end.
        if let Some(reason) = self.shared.notifier.signal_reason() {
            self.shared.notifier.fire(reason);
        }
        self.stop_watchdog();
        if !self.finished && !self.is_lost() {
            self.shared.end_by_holder();
        }
        if !self.finished && self.shared.begin_release() {
            self.locker.release_in_background(self.shared.clone());
        }
        // Last, as a kept signal would have been dropped after the body.
        self.shared.notifier.drop_held_signal();
    }
}

impl LockGuard {
    /// Whether the lease is known lost ([`LostSignal::is_lost`]).
    fn is_lost(&self) -> bool {
        self.shared.notifier.signal_reason().is_some()
    }
}

struct ReleaseOnCancel {
    shared: Option<Arc<GuardShared>>,
    locker: Arc<LockerInner>,
}

impl Drop for ReleaseOnCancel {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            self.locker.release_in_background(shared);
        }
    }
}
