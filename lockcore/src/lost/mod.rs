//! The lost-lease signal.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::compact_time::AtomicInstant;

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
pub struct LostNotifier(Arc<NotifierInner>);

/// The state a lease's notifiers and signals share: one small allocation per lease (a
/// `tokio::sync::watch` channel took about 350 bytes of the ~2 KB a held lease cost; issue 24).
/// A guard's validity lives here too ([`LostNotifier::attach_validity`], [`Validity`]), and one
/// notify wakes the waiters of both: an allocation and a wait list less per lease than when the
/// validity had its own (waiters look again at what they wait for, so waking one on the other's
/// change only costs a look). One flat struct, so that its small fields share their padding:
/// 88 bytes, a 112-byte chunk with the reference counts.
pub(crate) struct NotifierInner {
    /// The first reason reported ([`reason_code`]), 0 while none is.
    reason: AtomicU8,
    /// When the first reason was reported (set before the reason is visible).
    fired_at: AtomicInstant,
    /// Told once of the first reason (the locker's spans and metrics): the lease's own state,
    /// weakly (a thin pointer), so that no closure is allocated per lease.
    hook: std::sync::OnceLock<std::sync::Weak<Hook>>,
    /// Live [`LostNotifier`]s: once none is left, a signal without a guard's validity counts as
    /// released ([`LostSignal::ended`]).
    notifiers: AtomicU32,
    /// Live [`LostSignal`]s: once none is left, [`LostNotifier::closed`] resolves.
    signals: AtomicU32,
    /// Whether a guard's validity is attached: the signals then watch its deadline too.
    attached: AtomicBool,
    /// The validity deadline, once attached (an atomic for its 8 bytes and no lock: see
    /// [`AtomicInstant`]). Always set.
    until: AtomicInstant,
    /// Where the maximum hold time ends the lease, when auto-renewal is on: the end of the hold
    /// (the validity never runs past it), moved to the deadline of the last renewal when that
    /// renewal asked for what was left of the hold only. A deadline that passes at or after it
    /// is [`LostReason::MaxHoldReached`].
    hold_end: AtomicInstant,
    /// Woken whenever the deadline moves, so that sleepers re-arm (an extend may shorten it),
    /// on the first report, and when the last notifier or the last signal goes.
    pub(crate) changed: tokio::sync::Notify,
    /// Set once the lease is released (or abandoned): a deadline passing after that is no loss.
    /// Set through [`Validity::end`], which wakes [`LostSignal::ended`].
    pub(crate) ended: AtomicBool,
}

impl NotifierInner {
    fn reason(&self) -> Option<LostReason> {
        reason_of(self.reason.load(Ordering::Acquire))
    }

    /// [`LostSignal::reason`].
    fn signal_reason(&self) -> Option<LostReason> {
        self.reason().or_else(|| {
            self.attached
                .load(Ordering::Acquire)
                .then(|| self.expired_reason())
                .flatten()
        })
    }

    /// Waits until `done` holds, checking it again whenever the state changes.
    async fn wait_for<T>(&self, mut done: impl FnMut(&Self) -> Option<T>) -> T {
        loop {
            // Registered before the check: a change after it wakes this waiter.
            let changed = self.changed.notified();
            if let Some(out) = done(self) {
                return out;
            }
            changed.await;
        }
    }
}

/// `reason` as stored in [`NotifierInner::reason`] (never 0; [`reason_of`] reverses it).
fn reason_code(reason: LostReason) -> u8 {
    match reason {
        LostReason::RenewalRefused => 1,
        LostReason::ValidityExpired => 2,
        LostReason::MaxHoldReached => 3,
        LostReason::SessionExpired => 4,
        LostReason::ConnectionLost => 5,
    }
}

fn reason_of(code: u8) -> Option<LostReason> {
    Some(match code {
        0 => return None,
        1 => LostReason::RenewalRefused,
        2 => LostReason::ValidityExpired,
        3 => LostReason::MaxHoldReached,
        4 => LostReason::SessionExpired,
        _ => LostReason::ConnectionLost,
    })
}

/// What the locker runs when a lease is first reported lost.
pub(crate) trait LostHook: Send + Sync {
    /// The lease was first reported lost, for `reason` (may be called twice, see
    /// [`LostNotifier::set_hook`]).
    fn lost(&self, reason: LostReason);
}

/// Names the one type that is told of losses ([`Hook`]): the locker's lease state, which
/// implements it for [`LostNotifier`] where it is defined. The notifier's state keeps a thin
/// pointer to it (a `Weak<dyn LostHook>` would be twice the size: 8 bytes more per lease, and
/// past the 112-byte chunk, issue 24), and this file, below the locker, does not name the
/// locker (no import circle, issue 36).
pub(crate) trait HookedBy {
    /// What is told of this notifier's first loss.
    type Hook: LostHook;
}

/// What is told of a lease's first loss: the locker's lease state (see [`HookedBy`]).
pub(crate) type Hook = <LostNotifier as HookedBy>::Hook;

impl fmt::Debug for LostNotifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LostNotifier")
            .field(&self.0.reason())
            .finish()
    }
}

impl Clone for LostNotifier {
    fn clone(&self) -> Self {
        self.0.notifiers.fetch_add(1, Ordering::Relaxed);
        LostNotifier(self.0.clone())
    }
}

impl Drop for LostNotifier {
    fn drop(&mut self) {
        if self.0.notifiers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.changed.notify_waiters();
        }
    }
}

/// Reports the lease of `inner` lost ([`LostNotifier::fire`], [`LostReporter::fire`]).
fn fire(inner: &NotifierInner, reason: LostReason) -> bool {
    if inner.reason.load(Ordering::Acquire) != 0 {
        return false;
    }
    // Before the reason is visible: whoever sees the reason sees when. (Two first reports
    // racing set it once, at the earlier of the two.)
    inner.fired_at.set_if_none(Instant::now());
    let first = inner
        .reason
        .compare_exchange(0, reason_code(reason), Ordering::AcqRel, Ordering::Acquire)
        .is_ok();
    if first {
        inner.changed.notify_waiters();
        if let Some(hook) = inner.hook.get().and_then(std::sync::Weak::upgrade) {
            hook.lost(reason);
        }
    }
    first
}

/// A look at one request's lifetime from a late attempt of it (see
/// the backend module's `acquire_detached_for`): the request's notifier state, without counting as
/// one of its notifiers.
pub(crate) struct RequestWatch(Arc<NotifierInner>);

impl RequestWatch {
    /// Waits until the request is over (its last notifier gone: no attempt of it can still be
    /// claimed and no guard of it holds) or its guard's lease ended (released or abandoned):
    /// true. False when `within` passed first (the request or its guard lives on).
    pub(crate) async fn over_within(self, within: Duration) -> bool {
        let over = self.0.wait_for(|s| {
            (s.notifiers.load(Ordering::Acquire) == 0 || s.ended.load(Ordering::Acquire))
                .then_some(())
        });
        tokio::time::timeout(within, over).await.is_ok()
    }
}

/// Reports one request's lease lost, as [`LostNotifier::fire`] does, without counting as one of
/// its notifiers: what a registry of held leases keeps (see
/// the backend module's `Revocations`). A notifier kept there would keep the request
/// alive, and the late win of a cancelled attempt of it would stay held until its TTL instead
/// of being released (see the backend module's `acquire_detached_for`).
#[derive(Clone)]
pub struct LostReporter(Arc<NotifierInner>);

impl fmt::Debug for LostReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LostReporter")
            .field(&self.0.reason())
            .finish()
    }
}

impl LostReporter {
    /// Reports the lease lost; returns false if it was already reported.
    pub fn fire(&self, reason: LostReason) -> bool {
        fire(&self.0, reason)
    }
}

impl LostNotifier {
    /// A watch of this request's lifetime that does not keep it alive.
    pub(crate) fn watch(&self) -> RequestWatch {
        RequestWatch(self.0.clone())
    }

    /// What reports this lease lost without keeping its request alive.
    pub fn reporter(&self) -> LostReporter {
        LostReporter(self.0.clone())
    }

    /// A new notifier and its signal.
    pub fn new() -> (LostNotifier, LostSignal) {
        let inner = Arc::new(NotifierInner {
            reason: AtomicU8::new(0),
            fired_at: AtomicInstant::new(None),
            hook: std::sync::OnceLock::new(),
            notifiers: AtomicU32::new(1),
            signals: AtomicU32::new(1),
            attached: AtomicBool::new(false),
            // Unused until a guard attaches it.
            until: AtomicInstant::new(Some(Instant::now())),
            hold_end: AtomicInstant::new(None),
            changed: tokio::sync::Notify::new(),
            ended: AtomicBool::new(false),
        });
        (LostNotifier(inner.clone()), LostSignal { inner })
    }

    /// Makes this lease a guard's: its signals also fire when the validity deadline `until`
    /// passes while it is held, and `hold` is where the maximum hold time ends it. Called once,
    /// before the guard hands out its signal.
    pub(crate) fn attach_validity(&self, until: Instant, hold: Option<Instant>) {
        let v = &*self.0;
        v.set_until(until);
        v.hold_end.store(hold);
        self.0.attached.store(true, Ordering::Release);
    }

    /// The lease's validity (a guard's, once attached).
    pub(crate) fn validity(&self) -> &Validity {
        &self.0
    }

    /// Reports the lease lost; returns false if it was already reported.
    pub fn fire(&self, reason: LostReason) -> bool {
        fire(&self.0, reason)
    }

    /// Sets what runs on the first loss (once per notifier; the caller makes the hook
    /// idempotent, as a loss reported while it is being set may reach it twice). A loss already
    /// reported runs it at once.
    /// The hook is held weakly: once it is gone, nothing runs.
    pub(crate) fn set_hook(&self, hook: std::sync::Weak<Hook>) {
        if self.0.hook.set(hook).is_ok()
            && let Some(reason) = self.reason()
            && let Some(hook) = self.0.hook.get().and_then(std::sync::Weak::upgrade)
        {
            hook.lost(reason);
        }
    }

    /// Whether the lease was reported lost.
    pub fn is_fired(&self) -> bool {
        self.0.reason.load(Ordering::Acquire) != 0
    }

    /// The reason reported, if any.
    pub fn reason(&self) -> Option<LostReason> {
        self.0.reason()
    }

    /// What this lease's signals say ([`LostSignal::reason`]): the reported loss, or the
    /// attached validity's passed deadline.
    pub(crate) fn signal_reason(&self) -> Option<LostReason> {
        self.0.signal_reason()
    }

    /// A new signal of this lease, as a clone of its first one.
    pub(crate) fn signal(&self) -> LostSignal {
        self.0.signals.fetch_add(1, Ordering::Relaxed);
        LostSignal {
            inner: self.0.clone(),
        }
    }

    /// Takes over `signal` (of this lease) as a bare count of a live signal, ended by
    /// [`LostNotifier::drop_held_signal`]: a guard keeps its signal so, 8 bytes less per guard
    /// than a pointer (issue 24), its notifier already pointing at the shared state.
    pub(crate) fn hold_signal(&self, signal: LostSignal) {
        debug_assert!(Arc::ptr_eq(&self.0, &signal.inner));
        self.0.signals.fetch_add(1, Ordering::Relaxed);
        drop(signal);
    }

    /// Ends a count taken by [`LostNotifier::hold_signal`].
    pub(crate) fn drop_held_signal(&self) {
        if self.0.signals.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.changed.notify_waiters();
        }
    }

    /// Resolves when every signal is gone (the guard and every clone of its signal): backends
    /// use it to stop watching a lease nobody listens to any more.
    ///
    /// Cancel safe.
    pub async fn closed(&self) {
        self.0
            .wait_for(|s| (s.signals.load(Ordering::Acquire) == 0).then_some(()))
            .await
    }
}

/// A lease's validity deadline, shared by its guard, its watchdog and its signals: the part of
/// the signal's state ([`NotifierInner`]) a guard attaches.
pub(crate) type Validity = NotifierInner;

impl Validity {
    pub(crate) fn until(&self) -> Instant {
        self.until
            .load()
            .expect("the validity deadline is always set")
    }

    pub(crate) fn set_until(&self, at: Instant) {
        self.until.store(Some(at));
    }

    /// Moves the deadline to `at` (later or earlier) unless it has already passed: a lease past
    /// its validity was lost, and a late confirmation cannot bring it back. Returns whether it
    /// moved.
    pub(crate) fn renew_to(&self, at: Instant) -> bool {
        let now = Instant::now();
        self.move_deadline(at, |until| now < until)
    }

    /// Moves the deadline earlier to `at` (never later). Returns whether it moved.
    pub(crate) fn shorten_to(&self, at: Instant) -> bool {
        self.move_deadline(at, |until| at < until)
    }

    /// Moves a set deadline to `at` when `applies` to it, and wakes the waiters.
    fn move_deadline(&self, at: Instant, applies: impl Fn(Instant) -> bool) -> bool {
        let moved = self
            .until
            .update(|until| until.filter(|u| applies(*u)).map(|_| Some(at)));
        if moved {
            self.changed.notify_waiters();
        }
        moved
    }

    /// The holder ended the lease (released, dropped or abandoned it).
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Whether the deadline passed while the lease was still held.
    pub(crate) fn expired(&self) -> bool {
        !self.ended.load(Ordering::Acquire) && Instant::now() >= self.until()
    }

    /// Why a passed deadline ended the lease: the maximum hold time when the deadline was the
    /// hold's end (renewal stopped on purpose), otherwise the validity running out.
    pub(crate) fn expiry_reason(&self) -> LostReason {
        match self.hold_end.load() {
            Some(end) if self.until() >= end => LostReason::MaxHoldReached,
            _ => LostReason::ValidityExpired,
        }
    }

    /// Renewal stopped for the maximum hold time at the current deadline (its last renewal asked
    /// for the rest of the hold, which the drift margin ends a little before the hold does).
    pub(crate) fn renewal_ended_by_hold(&self) {
        let until = self.until();
        self.hold_end.update(|end| end.map(|_| Some(until)));
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
pub struct LostSignal {
    inner: Arc<NotifierInner>,
}

impl Clone for LostSignal {
    fn clone(&self) -> Self {
        self.inner.signals.fetch_add(1, Ordering::Relaxed);
        LostSignal {
            inner: self.inner.clone(),
        }
    }
}

impl Drop for LostSignal {
    fn drop(&mut self) {
        if self.inner.signals.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.changed.notify_waiters();
        }
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal")
            .field("reported", &self.inner.reason())
            .field("valid_until", &self.validity().map(Validity::until))
            .finish()
    }
}

impl LostSignal {
    /// The guard's validity, if one is attached.
    fn validity(&self) -> Option<&Validity> {
        self.inner
            .attached
            .load(Ordering::Acquire)
            .then_some(&*self.inner)
    }

    /// The reason, if the lease is known lost.
    pub fn reason(&self) -> Option<LostReason> {
        self.inner.signal_reason()
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
        let reported = self.inner.reason().and_then(|_| self.inner.fired_at.load());
        let expired = self.validity().and_then(|v| v.expired().then(|| v.until()));
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
            let Some(validity) = self.validity() else {
                return std::future::pending().await;
            };
            loop {
                let moved = validity.changed.notified();
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
            let Some(validity) = self.validity() else {
                return std::future::pending().await;
            };
            loop {
                let moved = validity.changed.notified();
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
            match self.validity() {
                Some(validity) => loop {
                    // Registered before the check: the holder's end notifies after setting it.
                    let moved = validity.changed.notified();
                    if validity.ended.load(Ordering::Acquire) {
                        return;
                    }
                    moved.await;
                },
                None => {
                    let lost = self
                        .inner
                        .wait_for(|s| {
                            if s.reason().is_some() {
                                Some(true)
                            } else {
                                (s.notifiers.load(Ordering::Acquire) == 0).then_some(false)
                            }
                        })
                        .await;
                    if lost {
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
            .validity()
            .is_some_and(|v| v.ended.load(Ordering::Acquire))
        {
            return Some(Ended::Released);
        }
        self.reason().map(Ended::Lost)
    }

    /// Waits for a loss reported through the [`LostNotifier`] only, ignoring the deadline.
    pub(crate) async fn reported(&self) -> LostReason {
        // Every notifier gone without a loss (the lease ended normally) leaves it pending.
        self.inner.wait_for(NotifierInner::reason).await
    }
}

#[cfg(test)]
mod tests;
