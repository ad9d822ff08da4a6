//! A held lease's state, shared by its guard and its watchdog: the validity deadline, extends
//! one at a time, the loss latch and the release.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{Background, BoxLease, LostNotifier, OwnerToken};
use crate::compact_time::{CompactDuration, CompactInstant};
use crate::lost::{HookedBy, LostHook, Validity};

use super::turn::Turn;
use crate::telemetry::Telemetry;
use crate::{Capabilities, Error, ErrorKind, LockName, LostReason, Result};

use super::watch::{RenewSlot, WatchRef};

pub(crate) struct GuardShared {
    pub(super) name: LockName,
    pub(super) token: OwnerToken,
    /// The TTL asked for (what each auto-renewal asks for again): [`GuardShared::ttl`].
    pub(super) ttl: CompactDuration,
    /// How often the watchdog renews the lease, when auto-renewal is on:
    /// [`GuardShared::renew_interval`].
    pub(super) renew_interval: CompactDuration,
    pub(super) telemetry: Arc<Telemetry>,
    /// When the winning request was sent (8 bytes: see [`CompactInstant`]).
    pub(super) acquired_at: CompactInstant,
    pub(super) lease: BoxLease,
    /// The lost signal's sending half; its state holds the lease's validity too (one
    /// allocation for both: issue 24).
    pub(super) notifier: LostNotifier,
    pub(super) release_started: AtomicBool,
    /// The loss went to the telemetry (once per lease).
    pub(super) loss_recorded: AtomicBool,
    /// Held across each extend: extends of one guard (the watchdog's and the user's) run one at
    /// a time, so the validity always follows the request the server applied last.
    pub(super) extending: Turn,
    /// Acquired at plus the maximum hold time, when auto-renewal is on.
    pub(super) hold_deadline: CompactInstant,
    /// The lease's watch by the locker's watchdog, where it needs one (renewal, or the release
    /// of a session-bound lease at its deadline).
    pub(super) watch: Option<WatchRef<GuardShared>>,
    /// Whether the watchdog has a renewal of it in flight (stopped when the guard ends).
    pub(super) renewal: RenewSlot,
}

/// A lease's losses are told to its state (the lost signal's notifier holds it weakly).
impl HookedBy for LostNotifier {
    type Hook = GuardShared;
}

impl LostHook for GuardShared {
    fn lost(&self, reason: LostReason) {
        if !self.loss_recorded.swap(true, Ordering::AcqRel) {
            self.telemetry
                .lost(self.name.as_str(), reason, self.acquired_at().elapsed());
        }
    }
}

impl GuardShared {
    pub(super) fn ttl(&self) -> Duration {
        self.ttl.get().expect("always set")
    }

    pub(super) fn renew_interval(&self) -> Option<Duration> {
        self.renew_interval.get()
    }

    pub(super) fn acquired_at(&self) -> Instant {
        self.acquired_at.get().expect("always set")
    }

    /// The lease's validity deadline (kept in the lost signal's state).
    pub(super) fn validity(&self) -> &Validity {
        self.notifier.validity()
    }

    pub(super) fn valid_until(&self) -> Instant {
        self.validity().until()
    }

    /// The validity of a lease granted `granted` by a request sent at `sent`: minus the drift
    /// margin, never past the maximum hold time.
    pub(super) fn deadline(
        &self,
        sent: Instant,
        granted: Duration,
        caps: &Capabilities,
    ) -> Instant {
        let until = sent + granted.saturating_sub(caps.drift_margin(granted));
        match self.hold_deadline.get() {
            Some(hold) => until.min(hold),
            None => until,
        }
    }

    /// Extends the lease to `ttl`, one extend at a time per guard. Once the lease is known lost
    /// it stays lost: an extend after the lost signal fired, or whose reply comes back after the
    /// validity deadline passed, returns `NotHeld` and the signal stays fired.
    pub(super) async fn extend(
        &self,
        ttl: Duration,
        caps: &Capabilities,
        auto: bool,
    ) -> Result<Duration> {
        let span = tracing::info_span!(
            "lock.renew",
            lock = self.name.as_str(),
            backend = &*self.telemetry.backend,
            auto,
            outcome = tracing::field::Empty,
        );
        let result = self
            .extend_inner(ttl, caps, auto)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(_) => "renewed",
            Err(e) if e.kind() == ErrorKind::NotHeld => "refused",
            Err(_) => "error",
        };
        span.record("outcome", outcome);
        self.telemetry.renewed(outcome);
        result
    }

    pub(super) async fn extend_inner(
        &self,
        ttl: Duration,
        caps: &Capabilities,
        auto: bool,
    ) -> Result<Duration> {
        let _one_at_a_time = self.extending.take(&self.validity().changed).await;
        if self.release_started.load(Ordering::Acquire) {
            return Err(Error::not_held("the lease has been released"));
        }
        self.latch_loss()?;
        let sent = Instant::now();
        // A shorter TTL takes effect on the server the moment it applies the request, which the
        // holder cannot tell from a lost reply or a dropped future: believe the shorter validity
        // from the send on, so that an unconfirmed extend never leaves the holder trusting more
        // than the server may grant (a second holder otherwise, faults' lost_extend_reply).
        if self.validity().shorten_to(self.deadline(sent, ttl, caps)) && !auto {
            self.rearm();
        }
        match self.lease.extend(ttl).await {
            Ok(granted) => {
                let renewed = self.validity().renew_to(self.deadline(sent, granted, caps));
                if !auto {
                    // The watchdog looks again (its own renewals it follows itself).
                    self.rearm();
                }
                if !renewed {
                    self.notifier.fire(self.validity().expiry_reason());
                    return Err(Error::not_held(
                        "the validity deadline passed before the extend was confirmed; the lease counts as lost",
                    ));
                }
                Ok(granted)
            }
            Err(e) => {
                if e.kind() == ErrorKind::NotHeld {
                    self.notifier.fire(LostReason::RenewalRefused);
                }
                Err(e)
            }
        }
    }

    /// `NotHeld` if the lease is known lost (reported, or past its validity), making a passed
    /// deadline a reported loss so that it stays lost.
    pub(super) fn latch_loss(&self) -> Result<()> {
        if let Some(reason) = self.notifier.reason() {
            return Err(Error::not_held(format!("the lease was lost: {reason}")));
        }
        if let Some(reason) = self.validity().expired_reason() {
            self.notifier.fire(reason);
            return Err(Error::not_held(format!("the lease was lost: {reason}")));
        }
        Ok(())
    }

    /// True for the one caller that may release the lease. A user's release (or drop, or
    /// abandon) also ends the lease for the lost signal; the watchdog's release at the deadline
    /// does not, since the deadline passing is the loss.
    pub(super) fn begin_release(&self) -> bool {
        !self.release_started.swap(true, Ordering::AcqRel)
    }

    /// The lease's release, in a `lock.release` span.
    pub(super) async fn release_traced(&self) -> Result<()> {
        let span = tracing::info_span!(
            "lock.release",
            lock = self.name.as_str(),
            backend = &*self.telemetry.backend,
            outcome = tracing::field::Empty,
            held_ms = self.acquired_at().elapsed().as_millis() as u64,
        );
        let result = self.lease.release().instrument(span.clone()).await;
        span.record(
            "outcome",
            match &result {
                Ok(()) => "released",
                Err(e) if e.kind() == ErrorKind::NotHeld => "not_held",
                Err(_) => "error",
            },
        );
        result
    }

    /// Tells the watchdog that a holder's extend moved the deadline (maybe earlier).
    fn rearm(&self) {
        if let Some(watch) = &self.watch {
            watch.rearm();
        }
    }

    pub(super) fn end_by_holder(&self) {
        self.validity().end();
    }

    /// Ends this lease's watch, if it has one: stops a renewal in flight and removes its
    /// record. Idempotent.
    pub(super) fn stop_watch(&self) {
        let Some(watch) = &self.watch else { return };
        match self.renewal.stop() {
            None => return,
            // The renewal listens on the validity's notify (see the watchdog's `renewal`): it
            // sees the stop and drops its extend.
            Some(true) => self.validity().changed.notify_waiters(),
            Some(false) => {}
        }
        watch.forget();
    }

    /// Hands this lease's release to `background` (a dropped guard's, or one whose validity
    /// ran out): never blocks, and runs to completion as long as the runtime does.
    pub(super) fn release_in_background(self: Arc<Self>, background: &Background) {
        background.spawn(async move {
            if let Err(e) = self.release_traced().await
                && e.kind() != ErrorKind::NotHeld
            {
                tracing::warn!(error = %format!("{e:#}"), "background release failed; the lock frees after its ttl");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_lease_state_stays_small() {
        // With its reference counts and malloc's header, 120 bytes fit a 144-byte chunk (issue
        // 24: 100,000 leases on one client). The validity is in the lost signal's state.
        assert_size_at_most!(super::GuardShared, 120);
        assert!(size_of::<crate::LockGuard>() <= 24);
    }
}
