//! The lost-lease signal.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

/// Why a lease is known lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LostReason {
    /// A renewal was refused: the lease was no longer the holder's.
    RenewalRefused,
    /// The validity deadline passed without a successful renewal: the server could not be
    /// reached in time, or auto-renewal was off. (The end of the maximum hold time is
    /// [`LostReason::MaxHoldReached`].)
    ValidityExpired,
    /// The maximum hold time of the guard's auto-renewal ([`AutoRenew::until`](crate::AutoRenew::until),
    /// one hour by default) has passed: renewal stopped there on purpose and the lock was
    /// released, whether or not the server could be reached. A holder that needs longer asks for
    /// a longer maximum hold.
    MaxHoldReached,
    /// The backend session that carried the lease expired.
    SessionExpired,
    /// The connection that carried the lease dropped (the server released the lock).
    ConnectionLost,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::RenewalRefused => "renewal refused",
            LostReason::ValidityExpired => "validity deadline passed",
            LostReason::MaxHoldReached => "maximum hold time reached",
            LostReason::SessionExpired => "session expired",
            LostReason::ConnectionLost => "connection lost",
        })
    }
}

/// What [`LostSignal::at_risk`] saw: the lease is lost, or about to end. (Closed: a lease at
/// risk is one or the other.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Risk {
    /// The lease is known lost.
    Lost(LostReason),
    /// The lease is still the holder's until `valid_until`, which is within the margin asked
    /// for, and no renewal has moved it.
    Ending {
        /// The validity deadline: stop what must not outlive the lease before it.
        valid_until: Instant,
    },
}

/// How a guard ended, as [`LostSignal::ended`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ended {
    /// The holder ended the lease while it was still held: [`LockGuard::release`](crate::LockGuard::release)
    /// (whatever the server answered), a dropped guard, or
    /// [`LockGuard::abandon`](crate::LockGuard::abandon).
    Released,
    /// The lease was known lost first, for this reason.
    Lost(LostReason),
}

/// The sending half, given to backends with each acquisition so they can report a loss they see
/// first (a session expiry, a dropped connection). The first reason reported wins.
#[derive(Clone)]
pub struct LostNotifier(Arc<NotifierInner>);

struct NotifierInner {
    tx: watch::Sender<Option<LostReason>>,
    /// When the first reason was reported (shared with the signals).
    fired_at: Arc<std::sync::OnceLock<Instant>>,
    /// Called once with the first reason (the locker's spans and metrics).
    hook: std::sync::OnceLock<LostHook>,
}

/// What the locker runs when a lease is first reported lost.
pub(crate) type LostHook = Box<dyn Fn(LostReason) + Send + Sync>;

impl fmt::Debug for LostNotifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LostNotifier")
            .field(&*self.0.tx.borrow())
            .finish()
    }
}

impl LostNotifier {
    /// A new notifier and its signal.
    pub fn new() -> (LostNotifier, LostSignal) {
        let (tx, rx) = watch::channel(None);
        let fired_at = Arc::new(std::sync::OnceLock::new());
        (
            LostNotifier(Arc::new(NotifierInner {
                tx,
                fired_at: fired_at.clone(),
                hook: std::sync::OnceLock::new(),
            })),
            LostSignal {
                reported: rx,
                fired_at,
                validity: None,
            },
        )
    }

    /// Reports the lease lost; returns false if it was already reported.
    pub fn fire(&self, reason: LostReason) -> bool {
        let first = self.0.tx.send_if_modified(|state| {
            if state.is_none() {
                // Before the reason is visible: whoever sees the reason sees when.
                let _ = self.0.fired_at.set(Instant::now());
                *state = Some(reason);
                true
            } else {
                false
            }
        });
        if first && let Some(hook) = self.0.hook.get() {
            hook(reason);
        }
        first
    }

    /// Sets what runs on the first loss (once per notifier; the caller makes the hook
    /// idempotent, as a loss reported while it is being set may reach it twice). A loss already
    /// reported runs it at once.
    pub(crate) fn set_hook(&self, hook: LostHook) {
        if self.0.hook.set(hook).is_ok()
            && let Some(reason) = self.reason()
            && let Some(hook) = self.0.hook.get()
        {
            hook(reason);
        }
    }

    /// Whether the lease was reported lost.
    pub fn is_fired(&self) -> bool {
        self.0.tx.borrow().is_some()
    }

    /// The reason reported, if any.
    pub fn reason(&self) -> Option<LostReason> {
        *self.0.tx.borrow()
    }

    /// Resolves when every signal is gone (the guard and every clone of its signal): backends
    /// use it to stop watching a lease nobody listens to any more.
    ///
    /// Cancel safe.
    pub async fn closed(&self) {
        self.0.tx.closed().await
    }
}

/// A lease's validity deadline, shared by its guard, its watchdog and its signals.
#[derive(Debug)]
pub(crate) struct Validity {
    until: Mutex<Instant>,
    /// Where the maximum hold time ends the lease, when auto-renewal is on: the end of the hold
    /// (the validity never runs past it), moved to the deadline of the last renewal when that
    /// renewal asked for what was left of the hold only. A deadline that passes at or after it
    /// is [`LostReason::MaxHoldReached`].
    hold_end: Mutex<Option<Instant>>,
    /// Woken whenever the deadline moves, so that sleepers re-arm (an extend may shorten it).
    pub(crate) moved: tokio::sync::Notify,
    /// Set once the lease is released (or abandoned): a deadline passing after that is no loss.
    /// Set through [`Validity::end`], which wakes [`LostSignal::ended`].
    pub(crate) ended: AtomicBool,
}

impl Validity {
    pub(crate) fn new(until: Instant, hold: Option<Instant>) -> Self {
        Validity {
            until: Mutex::new(until),
            hold_end: Mutex::new(hold),
            moved: tokio::sync::Notify::new(),
            ended: AtomicBool::new(false),
        }
    }

    pub(crate) fn until(&self) -> Instant {
        *self.until.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_until(&self, at: Instant) {
        *self.until.lock().unwrap_or_else(|e| e.into_inner()) = at;
    }

    /// Moves the deadline to `at` (later or earlier) unless it has already passed: a lease past
    /// its validity was lost, and a late confirmation cannot bring it back. Returns whether it
    /// moved.
    pub(crate) fn renew_to(&self, at: Instant) -> bool {
        let mut until = self.until.lock().unwrap_or_else(|e| e.into_inner());
        if Instant::now() >= *until {
            return false;
        }
        *until = at;
        drop(until);
        self.moved.notify_waiters();
        true
    }

    /// Moves the deadline earlier to `at` (never later). Returns whether it moved.
    pub(crate) fn shorten_to(&self, at: Instant) -> bool {
        let mut until = self.until.lock().unwrap_or_else(|e| e.into_inner());
        if at >= *until {
            return false;
        }
        *until = at;
        drop(until);
        self.moved.notify_waiters();
        true
    }

    /// The holder ended the lease (released, dropped or abandoned it).
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.moved.notify_waiters();
    }

    /// Whether the deadline passed while the lease was still held.
    pub(crate) fn expired(&self) -> bool {
        !self.ended.load(Ordering::Acquire) && Instant::now() >= self.until()
    }

    /// Why a passed deadline ended the lease: the maximum hold time when the deadline was the
    /// hold's end (renewal stopped on purpose), otherwise the validity running out.
    pub(crate) fn expiry_reason(&self) -> LostReason {
        let hold_end = *self.hold_end.lock().unwrap_or_else(|e| e.into_inner());
        match hold_end {
            Some(end) if self.until() >= end => LostReason::MaxHoldReached,
            _ => LostReason::ValidityExpired,
        }
    }

    /// Renewal stopped for the maximum hold time at the current deadline (its last renewal asked
    /// for the rest of the hold, which the drift margin ends a little before the hold does).
    pub(crate) fn renewal_ended_by_hold(&self) {
        let mut hold_end = self.hold_end.lock().unwrap_or_else(|e| e.into_inner());
        if hold_end.is_some() {
            *hold_end = Some(self.until());
        }
    }

    /// The reason, if the deadline passed while the lease was still held.
    pub(crate) fn expired_reason(&self) -> Option<LostReason> {
        self.expired().then(|| self.expiry_reason())
    }
}

/// Fires when the lease is known lost: reported by the backend or the watchdog, or the validity
/// deadline passed. Clone it freely; select on [`LostSignal::lost`] in the critical section to
/// stop work that must not outlive the lease.
///
/// [`LostSignal::lost`] never resolves for a lease that ends normally; a helper task that must
/// also stop when the guard is released or dropped awaits [`LostSignal::ended`] instead.
#[derive(Clone, Debug)]
pub struct LostSignal {
    reported: watch::Receiver<Option<LostReason>>,
    fired_at: Arc<std::sync::OnceLock<Instant>>,
    validity: Option<Arc<Validity>>,
}

impl LostSignal {
    pub(crate) fn with_validity(mut self, validity: Arc<Validity>) -> Self {
        self.validity = Some(validity);
        self
    }

    /// The reason, if the lease is known lost.
    pub fn reason(&self) -> Option<LostReason> {
        let reported = *self.reported.borrow();
        reported.or_else(|| self.validity.as_ref().and_then(|v| v.expired_reason()))
    }

    /// Whether the lease is known lost.
    pub fn is_lost(&self) -> bool {
        self.reason().is_some()
    }

    /// When the lease became known lost, if it is: when the backend reported the loss, or the
    /// validity deadline that passed. From that instant the holder is told it holds nothing,
    /// which is what a check of mutual exclusion compares another holder's start with (an
    /// observer waking on [`LostSignal::lost`] sees it later, by its own scheduling delay).
    pub fn lost_at(&self) -> Option<Instant> {
        let reported = self
            .reported
            .borrow()
            .is_some()
            .then(|| self.fired_at.get().copied())
            .flatten();
        let expired = self
            .validity
            .as_ref()
            .and_then(|v| v.expired().then(|| v.until()));
        match (reported, expired) {
            (Some(r), Some(e)) => Some(r.min(e)),
            (r, e) => r.or(e),
        }
    }

    /// Waits until the lease is known lost and returns why. Pending forever if the lease is
    /// released normally (by [`LockGuard::release`](crate::LockGuard::release) or a drop): a
    /// release is not a loss. To wait for either end, use [`LostSignal::ended`].
    ///
    /// Cancel safe: dropping the future loses nothing.
    pub async fn lost(&self) -> LostReason {
        let deadline = async {
            let Some(validity) = &self.validity else {
                return std::future::pending().await;
            };
            loop {
                let moved = validity.moved.notified();
                tokio::select! {
                    _ = tokio::time::sleep_until(validity.until()) => {}
                    _ = moved => continue,
                }
                if let Some(reason) = validity.expired_reason() {
                    return reason;
                }
                if validity.ended.load(Ordering::Acquire) {
                    return std::future::pending().await;
                }
                // Renewed meanwhile: sleep until the new deadline.
            }
        };
        tokio::select! {
            reason = self.reported() => reason,
            reason = deadline => reason,
        }
    }

    /// Waits until the lease is *at risk*: lost, or still valid but ending within `margin` with
    /// no renewal having moved its validity deadline (the server is slow or unreachable, or
    /// nothing renews the lease). Curator tells its users SUSPENDED before LOST; this is that
    /// warning, early enough to stop work that must not outlive the lease while the lease is
    /// still the holder's.
    ///
    /// While renewal works, the deadline keeps moving ahead: an auto-renewed lease renewed every
    /// `fraction × ttl` never has less than about `(1 − fraction) × ttl` left (two thirds of the
    /// TTL with the default third). Choose `margin` below that, or the signal fires on a healthy
    /// lease; a renewal that lands after the signal fired does not take it back. Pending forever
    /// once the lease is released normally, like [`LostSignal::lost`].
    ///
    /// Cancel safe: dropping the future loses nothing.
    pub async fn at_risk(&self, margin: Duration) -> Risk {
        let ending = async {
            let Some(validity) = &self.validity else {
                return std::future::pending().await;
            };
            loop {
                let moved = validity.moved.notified();
                let warn_at = validity
                    .until()
                    .checked_sub(margin)
                    .unwrap_or_else(Instant::now);
                tokio::select! {
                    _ = tokio::time::sleep_until(warn_at) => {}
                    _ = moved => continue,
                }
                if validity.ended.load(Ordering::Acquire) {
                    return std::future::pending().await;
                }
                let until = validity.until();
                let now = Instant::now();
                if now >= until {
                    return Risk::Lost(LostReason::ValidityExpired);
                }
                if until - now <= margin {
                    return Risk::Ending { valid_until: until };
                }
                // Renewed meanwhile: wait for the new deadline's margin.
            }
        };
        tokio::select! {
            // A known loss wins over a deadline that is merely near.
            biased;
            reason = self.lost() => Risk::Lost(reason),
            risk = ending => risk,
        }
    }

    /// Waits until the guard ended, either way: [`Ended::Released`] once its holder released,
    /// dropped or abandoned it while it was held, [`Ended::Lost`] once the lease is known lost
    /// (as [`LostSignal::lost`]). Resolves at once if the guard has already ended. A helper task
    /// (a progress reporter, a heartbeat) awaits it to stop with the guard.
    ///
    /// A signal made by a backend without a guard (from [`LostNotifier::new`]) counts as
    /// released when every notifier is dropped without a loss.
    ///
    /// Cancel safe: dropping the future loses nothing.
    pub async fn ended(&self) -> Ended {
        if let Some(ended) = self.ended_now() {
            return ended;
        }
        let released = async {
            match &self.validity {
                Some(validity) => loop {
                    // Registered before the check: the holder's end notifies after setting it.
                    let moved = validity.moved.notified();
                    if validity.ended.load(Ordering::Acquire) {
                        return;
                    }
                    moved.await;
                },
                None => {
                    let mut rx = self.reported.clone();
                    if rx.wait_for(|r| r.is_some()).await.is_ok() {
                        // A loss: `lost()` below reports it.
                        std::future::pending::<()>().await;
                    }
                }
            }
        };
        tokio::select! {
            () = released => Ended::Released,
            reason = self.lost() => Ended::Lost(reason),
        }
    }

    /// How the guard ended, if it did. A holder ends a lease only while it is not known lost, so
    /// the holder's end, when set, came first.
    fn ended_now(&self) -> Option<Ended> {
        if self
            .validity
            .as_ref()
            .is_some_and(|v| v.ended.load(Ordering::Acquire))
        {
            return Some(Ended::Released);
        }
        self.reason().map(Ended::Lost)
    }

    /// Waits for a loss reported through the [`LostNotifier`] only, ignoring the deadline.
    pub(crate) async fn reported(&self) -> LostReason {
        let mut rx = self.reported.clone();
        let reason = rx.wait_for(|r| r.is_some()).await.ok().and_then(|r| *r);
        match reason {
            Some(reason) => reason,
            // Every notifier is gone without a loss: the lease ended normally.
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn at_risk_fires_within_the_margin_unless_renewed() {
        let start = Instant::now();
        let ttl = Duration::from_secs(3);
        let margin = Duration::from_secs(1);
        let (n, s) = LostNotifier::new();
        let validity = Arc::new(Validity::new(start + ttl, None));
        let s = s.with_validity(validity.clone());

        // Renewed every second (a third of the TTL) for 5 s: never within the margin.
        let renewer = {
            let validity = validity.clone();
            async move {
                for i in 1..=5 {
                    tokio::time::sleep_until(start + Duration::from_secs(i)).await;
                    assert!(validity.renew_to(Instant::now() + ttl));
                }
            }
        };
        let risk = tokio::select! {
            risk = s.at_risk(margin) => Some(risk),
            () = renewer => None,
        };
        assert_eq!(risk, None, "a lease renewed in time is not at risk");

        // Renewal stops: the last deadline is start + 8 s; the warning comes at 7 s.
        let risk = s.at_risk(margin).await;
        assert_eq!(
            risk,
            Risk::Ending {
                valid_until: start + Duration::from_secs(8)
            }
        );
        assert_eq!(Instant::now(), start + Duration::from_secs(7));
        assert!(!s.is_lost(), "at risk is before lost");

        // A loss reported by the backend is at risk too.
        n.fire(LostReason::RenewalRefused);
        assert_eq!(
            s.at_risk(margin).await,
            Risk::Lost(LostReason::RenewalRefused)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn at_risk_never_fires_after_a_normal_end() {
        let (n, s) = LostNotifier::new();
        let validity = Arc::new(Validity::new(Instant::now() + Duration::from_secs(2), None));
        let s = s.with_validity(validity.clone());
        validity.ended.store(true, Ordering::Release);
        drop(n);
        let never =
            tokio::time::timeout(Duration::from_secs(10), s.at_risk(Duration::from_secs(1))).await;
        assert!(never.is_err(), "a released lease is not at risk");
    }

    #[tokio::test(start_paused = true)]
    async fn lost_at_is_the_first_report_or_the_passed_deadline() {
        let start = Instant::now();
        let (n, s) = LostNotifier::new();
        let validity = Arc::new(Validity::new(start + Duration::from_secs(2), None));
        let s = s.with_validity(validity);
        assert_eq!(s.lost_at(), None);
        tokio::time::sleep(Duration::from_secs(1)).await;
        n.fire(LostReason::ConnectionLost);
        tokio::time::sleep(Duration::from_millis(500)).await;
        n.fire(LostReason::SessionExpired);
        assert_eq!(s.lost_at(), Some(start + Duration::from_secs(1)));
        // A deadline that passed later does not move it.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(s.lost_at(), Some(start + Duration::from_secs(1)));

        // Not reported: the deadline, once passed.
        let (_n, s) = LostNotifier::new();
        let validity = Arc::new(Validity::new(Instant::now() + Duration::from_secs(2), None));
        let s = s.with_validity(validity.clone());
        let deadline = validity.until();
        assert_eq!(s.lost_at(), None);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(s.lost_at(), Some(deadline));
    }

    #[tokio::test]
    async fn first_reason_wins_and_release_is_not_loss() {
        let (n, s) = LostNotifier::new();
        assert!(!s.is_lost());
        assert!(n.fire(LostReason::SessionExpired));
        assert!(!n.fire(LostReason::ValidityExpired));
        assert_eq!(s.lost().await, LostReason::SessionExpired);

        let (n, s) = LostNotifier::new();
        drop(n);
        let never = tokio::time::timeout(std::time::Duration::from_millis(20), s.lost()).await;
        assert!(never.is_err(), "a lease that ended normally is not lost");
    }
}
