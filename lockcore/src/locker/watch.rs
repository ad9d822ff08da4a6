//! A lease's link to its client's watchdog: the [`Inbox`] where guards leave what the watchdog
//! must know (a lease to watch, a deadline that moved, a watch that ended), the [`WatchRef`] a
//! guard keeps to leave it there, and the [`RenewSlot`] that stops a renewal in flight when the
//! guard ends.
//!
//! The inbox wakes the watchdog's task only when it must act earlier than it would anyway: a
//! new lease is left there without a wake-up when the task is already due to wake at or before
//! that lease's first renewal or deadline (it takes the lease then), and a watch that ends is
//! never worth a wake-up (its renewal, if one is in flight, is stopped through the lease's
//! own state; its record goes at the task's next wake-up). An uncontended lock and release
//! cycle whose lease ends before its first renewal thus costs the task nothing: the lease is
//! put in and taken out again before the task ever looks (issue 38; a channel used to wake it
//! twice per cycle).
//!
//! Generic over the lease state `S` it carries (the locker's `GuardShared`): that state keeps
//! its `WatchRef`, and the watchdog reads the state, so this file names neither.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::Instant;

/// A lease handed over and not yet taken by the task: its state and first renewal.
pub(super) type NewWatch<S> = (Arc<S>, Option<Instant>);

/// What the task finds in the inbox when it looks.
pub(super) struct Taken<S> {
    /// Leases to watch from now on (id, state, first renewal).
    pub(super) new: Vec<(u64, NewWatch<S>)>,
    /// Watches that ended (their records go).
    pub(super) forgotten: Vec<u64>,
    /// Leases whose deadline a holder's extend moved (look at them again).
    pub(super) rearmed: Vec<u64>,
    /// The client and all its guards are gone: the task ends.
    pub(super) closed: bool,
}

/// Where the task is, as far as the guards need to know.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum TaskState {
    /// Running (or woken and about to run): it looks at the inbox before it sleeps again.
    Busy,
    /// Asleep until this instant (`None`: until woken).
    Asleep(Option<Instant>),
    /// Gone with its runtime: nothing will read the inbox again.
    Gone,
}

struct Mailbox<S> {
    new: HashMap<u64, NewWatch<S>>,
    forgotten: Vec<u64>,
    rearmed: Vec<u64>,
    closed: bool,
    task: TaskState,
    /// Leases watched now: handed over, and neither forgotten by their guard nor ended by the
    /// task (a loss, a refused renewal, the deadline).
    watched: usize,
    /// The records the task kept when it last went to sleep (ended watches' included, until
    /// its next wake-up).
    records: usize,
}

/// The watchdog's inbox (one per client).
pub(super) struct Inbox<S> {
    mailbox: Mutex<Mailbox<S>>,
    wake: Notify,
}

impl<S> Default for Inbox<S> {
    fn default() -> Self {
        Inbox {
            mailbox: Mutex::new(Mailbox {
                new: HashMap::new(),
                forgotten: Vec::new(),
                rearmed: Vec::new(),
                closed: false,
                // Not polled yet: its first poll looks at the inbox.
                task: TaskState::Busy,
                watched: 0,
                records: 0,
            }),
            wake: Notify::new(),
        }
    }
}

impl<S> Inbox<S> {
    fn lock(&self) -> MutexGuard<'_, Mailbox<S>> {
        // Nothing panics while holding it; a poisoned lock still holds consistent state.
        self.mailbox
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wakes the task if it sleeps past `at` (`None`: whatever it sleeps until).
    fn wake_before(&self, mailbox: &mut Mailbox<S>, at: Option<Instant>) {
        if let TaskState::Asleep(until) = mailbox.task {
            let late = match (until, at) {
                (None, _) | (_, None) => true,
                (Some(until), Some(at)) => at < until,
            };
            if late {
                mailbox.task = TaskState::Busy;
                self.wake.notify_one();
            }
        }
    }

    /// The task takes what the guards left, and counts as busy until [`Inbox::sleep_until`].
    pub(super) fn take(&self) -> Taken<S> {
        let mut m = self.lock();
        m.task = TaskState::Busy;
        Taken {
            // Taken whole, not drained: a drained map keeps its capacity, and a burst of new
            // leases (10,000 taken in a row) would keep ~60 bytes a lease here for good
            // (lock-redis lease_memory counts it).
            new: std::mem::take(&mut m.new).into_iter().collect(),
            forgotten: std::mem::take(&mut m.forgotten),
            rearmed: std::mem::take(&mut m.rearmed),
            closed: m.closed,
        }
    }

    /// The task, keeping `records`, goes to sleep until `until` (`None`: until woken), unless
    /// something arrived since it looked (false: it looks again first). Wake it with
    /// [`Inbox::woken`].
    pub(super) fn sleep_until(&self, until: Option<Instant>, records: usize) -> bool {
        let mut m = self.lock();
        m.records = records;
        if !m.new.is_empty() || !m.forgotten.is_empty() || !m.rearmed.is_empty() || m.closed {
            return false;
        }
        m.task = TaskState::Asleep(until);
        true
    }

    /// Resolves when a guard needs the sleeping task.
    pub(super) async fn woken(&self) {
        self.wake.notified().await;
    }

    /// The task ended one lease's watch itself (a loss, a refused renewal, the deadline).
    pub(super) fn ended_by_task(&self) {
        let mut m = self.lock();
        m.watched = m.watched.saturating_sub(1);
    }

    /// The task is gone (its runtime shut down, or the client closed): what is left here is
    /// dropped, and nothing is kept from now on.
    pub(super) fn task_gone(&self) {
        let mut m = self.lock();
        m.task = TaskState::Gone;
        let new = std::mem::take(&mut m.new);
        m.forgotten.clear();
        m.rearmed.clear();
        // The leases' states may hold this inbox (through their `WatchRef`): dropped unlocked.
        drop(m);
        drop(new);
    }

    /// The client and every guard of it are gone: the task ends.
    pub(super) fn close(&self) {
        let mut m = self.lock();
        m.closed = true;
        self.wake_before(&mut m, None);
    }

    /// How many leases are watched now.
    #[cfg(test)]
    pub(super) fn watched(&self) -> usize {
        self.lock().watched
    }

    /// How many records the task kept when it last went to sleep.
    #[cfg(test)]
    pub(super) fn records(&self) -> usize {
        self.lock().records
    }

    /// Whether the task sleeps (for the tests that count its wake-ups).
    #[cfg(test)]
    pub(super) fn is_asleep(&self) -> bool {
        matches!(self.lock().task, TaskState::Asleep(_))
    }
}

/// A guard's handle on its watch (kept in its lease state).
pub(super) struct WatchRef<S> {
    id: u64,
    inbox: Arc<Inbox<S>>,
}

impl<S> WatchRef<S> {
    /// The watch of lease `id`, told through `inbox`.
    pub(super) fn new(id: u64, inbox: Arc<Inbox<S>>) -> Self {
        WatchRef { id, inbox }
    }

    /// Hands the lease over: watched from now on, renewed every renewal interval (first at
    /// `first_renewal`) when given. `first_look` is the first instant the watchdog must act on
    /// it (its first renewal or its validity deadline, whichever comes first): the task is
    /// woken only if it sleeps past that.
    pub(super) fn start(
        &self,
        shared: Arc<S>,
        first_renewal: Option<Instant>,
        first_look: Instant,
    ) {
        let mut m = self.inbox.lock();
        if m.task == TaskState::Gone {
            // The runtime is gone, with the task: nothing is left to watch.
            return;
        }
        m.watched += 1;
        m.new.insert(self.id, (shared, first_renewal));
        self.inbox.wake_before(&mut m, Some(first_look));
    }

    /// The validity deadline moved other than by the watchdog's own renewal (a holder's extend,
    /// which may shorten it): the task looks at the lease again, now.
    pub(super) fn rearm(&self) {
        let mut m = self.inbox.lock();
        if m.task == TaskState::Gone {
            return;
        }
        // A lease not taken yet needs no entry: the task reads the deadline when it takes it.
        if !m.new.contains_key(&self.id) {
            m.rearmed.push(self.id);
        }
        // Holders' extends are rare: the task looks at once rather than guess its next wake-up.
        self.inbox.wake_before(&mut m, None);
    }

    /// Ends the watch (its renewals are stopped already: [`RenewSlot::stop`]). Wakes nobody: a
    /// lease the task has not taken yet leaves the inbox at once, and a record the task keeps
    /// goes at its next wake-up (which it would do nothing at for this lease). Never blocks
    /// for long: a drop calls it.
    pub(super) fn forget(&self) {
        let mut m = self.inbox.lock();
        m.watched = m.watched.saturating_sub(1);
        if m.task == TaskState::Gone {
            return;
        }
        match m.new.remove(&self.id) {
            Some(taken_out) => {
                drop(m);
                drop(taken_out);
            }
            None => m.forgotten.push(self.id),
        }
    }
}

/// Whether the watchdog has a renewal of the lease in flight, so that the guard's end can stop
/// it at once (the task would otherwise act on its reply after the release). One byte in the
/// lease's state: the renewal watches it (woken through the validity's notify) instead of
/// holding an abort handle, an allocation per renewal (issue 24).
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
