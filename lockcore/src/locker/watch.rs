//! A lease's link to its client's watchdog: the [`WatchRef`] a guard keeps to hand its lease
//! over, move its deadline and end its watch ([`Command`]s on the watchdog's channel), and the
//! [`RenewSlot`] that stops a renewal in flight when the guard ends.
//!
//! Generic over the lease state `S` the channel carries (the locker's `GuardShared`): that
//! state keeps its `WatchRef`, and the watchdog reads the state, so this file names neither.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use tokio::sync::mpsc;
use tokio::time::Instant;

/// What a guard tells its client's watchdog about lease `id`.
pub(super) enum Command<S> {
    /// Watch the lease from now on, renewed every renewal interval (first at the instant given)
    /// when given.
    Watch(u64, Arc<S>, Option<Instant>),
    /// Look at the lease again: its deadline moved.
    Rearm(u64),
    /// Forget the lease.
    Forget(u64),
}

/// A guard's handle on its watch (kept in its lease state).
pub(super) struct WatchRef<S> {
    id: u64,
    tx: mpsc::UnboundedSender<Command<S>>,
}

impl<S> WatchRef<S> {
    /// The watch of lease `id`, told through `tx`.
    pub(super) fn new(id: u64, tx: mpsc::UnboundedSender<Command<S>>) -> Self {
        WatchRef { id, tx }
    }

    /// Hands the lease over: watched from now on, renewed every renewal interval (first at
    /// `first_renewal`) when given.
    pub(super) fn start(&self, shared: Arc<S>, first_renewal: Option<Instant>) {
        // A send fails only once the runtime is gone, with the task: nothing left to watch.
        let _ = self.tx.send(Command::Watch(self.id, shared, first_renewal));
    }

    /// The validity deadline moved other than by the watchdog's own renewal (a holder's extend,
    /// which may shorten it): look at the lease again.
    pub(super) fn rearm(&self) {
        let _ = self.tx.send(Command::Rearm(self.id));
    }

    /// Ends the watch: the record goes. (Never blocks: a drop calls it.)
    pub(super) fn forget(&self) {
        let _ = self.tx.send(Command::Forget(self.id));
    }
}

/// Whether a renewal of the lease is in flight, so that the guard's end can stop it at once
/// (the task would otherwise act on its reply after the release). One byte in the lease's
/// state: the renewal watches it (woken through the validity's notify) instead of holding an
/// abort handle, an allocation per renewal (issue 24).
#[derive(Default)]
pub(super) struct RenewSlot(AtomicU8);

const IDLE: u8 = 0;
const RENEWING: u8 = 1;
/// The guard ended its watch: no renewal starts any more.
const STOPPED: u8 = 2;

impl RenewSlot {
    /// A renewal starts; false once the watch was stopped.
    pub(super) fn begin(&self) -> bool {
        self.0
            .compare_exchange(IDLE, RENEWING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The renewal's outcome is in; false once the watch was stopped.
    pub(super) fn finish(&self) -> bool {
        self.0
            .compare_exchange(RENEWING, IDLE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub(super) fn is_stopped(&self) -> bool {
        self.0.load(Ordering::Acquire) == STOPPED
    }

    /// Stops renewals for good: `None` when they were stopped already, else whether a renewal
    /// was in flight (it must be woken to drop its extend).
    pub(super) fn stop(&self) -> Option<bool> {
        match self.0.swap(STOPPED, Ordering::AcqRel) {
            STOPPED => None,
            was => Some(was == RENEWING),
        }
    }
}
