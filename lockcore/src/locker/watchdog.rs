//! The watchdog: one task per [`Locker`](crate::Locker) (client) that renews its leases (when
//! asked) up to their maximum hold time, fires a lease's lost signal at its validity deadline
//! and releases a lease whose validity ran out.
//!
//! A task and two timers per lease cost about a kilobyte each before any client library (issue
//! 24: 100,000 auto-renewed leases on one client took 217 MiB). Here a lease is a compact record
//! in one map, and one timer heap holds, per lease, the next instant it needs looking at: its
//! next renewal or its validity deadline, whichever comes first. Renewals that fall due are
//! issued concurrently (at most [`MAX_IN_FLIGHT`] at once), so one slow renewal does not hold
//! the others back; each is cut off at its lease's validity deadline, as before.
//!
//! What a lease goes through is the same as when it had a task of its own: the first renewal one
//! renewal interval after the acquisition's send, the next one interval after each success, a
//! quarter interval after a failure (never past the deadline); the last one asks for what is
//! left of the maximum hold; a refused renewal or a loss the backend reported ends the watch; the
//! validity deadline passing fires the lost signal and releases the lease. Releasing, dropping or
//! abandoning the guard ends its watch at once (a renewal in flight is aborted); its record goes
//! at the task's next wake-up.
//!
//! Guards hand leases over and end their watches through an [`Inbox`] that wakes the task only
//! when it would otherwise sleep past what they left: an uncontended lock and release wakes it
//! not at all (issue 38).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::backend::{Backend, Background};
use crate::compact_time::CompactInstant;
use crate::{ErrorKind, Result};

use super::lease::GuardShared;
use super::watch::{Inbox, WatchRef};

/// Renewals in flight at once per client. Beyond it, due renewals wait their turn in order
/// (their validity deadlines still watched): it bounds the memory and the burst a client puts
/// on its server when many leases fall due together, while leaving room for far more renewals
/// per round trip than a client issues (100,000 leases with a 30 s TTL are 10,000 renewals a
/// second: at this cap a round trip may take 400 ms before they fall behind).
pub(super) const MAX_IN_FLIGHT: usize = 4096;

/// A client's watchdog: started with its first watched lease, ended when the client and every
/// guard of it are gone (this is dropped with the last of them).
#[derive(Default)]
pub(super) struct Watchdog {
    inbox: OnceLock<Arc<Inbox<GuardShared>>>,
    next_id: AtomicU64,
    /// How many times the task was polled (woken), for the tests.
    polls: Arc<AtomicU64>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(inbox) = self.inbox.get() {
            inbox.close();
        }
    }
}

/// Held by the task's future: once it is gone (ended, or dropped with its runtime, polled or
/// not), what guards leave in the inbox is dropped, not kept.
struct TaskEnd(Arc<Inbox<GuardShared>>);

impl Drop for TaskEnd {
    fn drop(&mut self) {
        self.0.task_gone();
    }
}

impl Watchdog {
    /// A new watch for a lease, before its record is handed over with [`WatchRef::start`]:
    /// starts the task if this is the client's first.
    pub(super) fn reserve(
        &self,
        runtime: &Handle,
        backend: &Arc<dyn Backend>,
        background: &Background,
    ) -> WatchRef<GuardShared> {
        let inbox = self.inbox.get_or_init(|| {
            let inbox = Arc::new(Inbox::default());
            let mut task = Box::pin(run(
                backend.clone(),
                background.clone(),
                TaskEnd(inbox.clone()),
            ));
            let polls = self.polls.clone();
            runtime.spawn(std::future::poll_fn(move |cx| {
                polls.fetch_add(1, Ordering::Relaxed);
                task.as_mut().poll(cx)
            }));
            inbox
        });
        WatchRef::new(self.next_id.fetch_add(1, Ordering::Relaxed), inbox.clone())
    }

    /// How many leases are watched now.
    #[cfg(test)]
    pub(super) fn watched(&self) -> usize {
        self.inbox.get().map_or(0, |inbox| inbox.watched())
    }

    /// How many times the task was polled so far.
    #[cfg(test)]
    pub(super) fn polls(&self) -> u64 {
        self.polls.load(Ordering::Relaxed)
    }

    /// How many records the task kept when it last went to sleep.
    #[cfg(test)]
    pub(super) fn records(&self) -> usize {
        self.inbox.get().map_or(0, |inbox| inbox.records())
    }

    /// Whether the task sleeps (until a timer or a guard wakes it).
    #[cfg(test)]
    pub(super) fn is_asleep(&self) -> bool {
        self.inbox.get().is_some_and(|inbox| inbox.is_asleep())
    }
}

/// One watched lease: 32 bytes in the map (its TTL and renewal interval are the guard's, in
/// its [`GuardShared`]), plus its item in the timer heap.
struct Entry {
    shared: Arc<GuardShared>,
    /// `None`: not renewed now (watched for the deadline only).
    next_renew: CompactInstant,
    /// Bumped whenever the lease is scheduled anew: heap items with another are stale.
    seq: u32,
    state: State,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    /// Due, waiting for a free renewal slot (its deadline still in the heap).
    Queued,
    /// A renewal in flight (nothing in the heap: the renewal is cut off at the deadline).
    Renewing,
}

/// How a renewal ended.
enum Renewed {
    Ok {
        asked: Duration,
    },
    Refused,
    Failed {
        error: crate::Error,
        valid_until: Instant,
    },
    /// The validity deadline passed first.
    TimedOut,
    /// The guard ended meanwhile.
    Aborted,
}

/// A timer-heap item: when, the lease's id, its `seq` then (24 bytes: see [`CompactInstant`]).
type HeapItem = (CompactInstant, u64, u32);

/// What a renewal needs: the lease's id and state, the backend, the TTL asked for and the
/// validity deadline it is cut off at.
type RenewalArgs = (u64, Arc<GuardShared>, Arc<dyn Backend>, Duration, Instant);

/// `F`: the future of [`renewal`], held unboxed in the set (its type is only known by
/// inference: `make` is that function), so that starting a renewal allocates only the set's
/// node, not a box besides (issue 24).
struct Scheduler<F> {
    backend: Arc<dyn Backend>,
    background: Background,
    entries: HashMap<u64, Entry>,
    /// (when, lease id, its seq then), earliest first. Never a none instant.
    heap: BinaryHeap<Reverse<HeapItem>>,
    /// Due leases waiting for a free renewal slot, in the order they fell due.
    queued: VecDeque<u64>,
    renewing: FuturesUnordered<F>,
    make: fn(RenewalArgs) -> F,
    inbox: Arc<Inbox<GuardShared>>,
}

/// One renewal of a lease, cut off at its validity deadline, and dropped as soon as the guard
/// ends its watch ([`GuardShared::stop_watch`]).
async fn renewal((id, shared, backend, asked, valid_until): RenewalArgs) -> (u64, Renewed) {
    let caps = backend.capabilities();
    let extend = tokio::time::timeout_at(valid_until, shared.extend(asked, caps, true));
    tokio::pin!(extend);
    let renewed = loop {
        // Registered before the check: a stop after it wakes this renewal.
        let notified = shared.validity().changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if shared.renewal.is_stopped() {
            break Renewed::Aborted;
        }
        tokio::select! {
            biased;
            result = &mut extend => break match result {
                Err(_elapsed) => Renewed::TimedOut,
                Ok(result) => classify(result, asked, valid_until),
            },
            // The deadline moved or the watch stopped: look again.
            () = notified => {}
        }
    };
    (id, renewed)
}

async fn run(backend: Arc<dyn Backend>, background: Background, end: TaskEnd) {
    let inbox = end.0.clone();
    let mut s = Scheduler {
        backend,
        background,
        entries: HashMap::new(),
        heap: BinaryHeap::new(),
        queued: VecDeque::new(),
        renewing: FuturesUnordered::new(),
        make: renewal,
        inbox: inbox.clone(),
    };
    // One timer for the whole client, moved to the earliest item of the heap.
    let sleep = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(sleep);
    let mut armed: Option<Instant> = None;
    loop {
        // What the guards left first (cheap, and a forgotten lease must not be renewed), then
        // whatever is due, then queued renewals into freed slots.
        let taken = inbox.take();
        for (id, (shared, first_renewal)) in taken.new {
            s.watch(id, shared, first_renewal);
        }
        for id in taken.forgotten {
            s.entries.remove(&id);
        }
        for id in taken.rearmed {
            s.rearm(id);
        }
        if taken.closed {
            // The client and every guard of it are gone (their watches all ended): nothing
            // is left to watch.
            return;
        }
        s.fire_due();
        s.start_queued();
        let wake = s.heap.peek().and_then(|Reverse((at, _, _))| at.get());
        if let Some(at) = wake
            && armed != Some(at)
        {
            sleep.as_mut().reset(at);
            armed = Some(at);
        }
        // Guards wake the task only when it would sleep past what they left (see `Inbox`).
        if !inbox.sleep_until(wake, s.entries.len()) {
            continue;
        }
        tokio::select! {
            () = inbox.woken() => {}
            Some((id, renewed)) = s.renewing.next(), if !s.renewing.is_empty() => {
                s.renewed(id, renewed);
            }
            () = &mut sleep, if wake.is_some() => armed = None,
        }
    }
}

impl<F: Future<Output = (u64, Renewed)>> Scheduler<F> {
    /// Watches the lease from now on, renewed every renewal interval (first at
    /// `first_renewal`) when given.
    fn watch(&mut self, id: u64, shared: Arc<GuardShared>, first_renewal: Option<Instant>) {
        let entry = Entry {
            shared,
            next_renew: CompactInstant::new(first_renewal),
            seq: 0,
            state: State::Idle,
        };
        self.entries.insert(id, entry);
        self.look_at(id, Instant::now());
    }

    /// A holder's extend moved the lease's deadline: look at it again.
    fn rearm(&mut self, id: u64) {
        if self
            .entries
            .get(&id)
            .is_some_and(|e| e.state != State::Renewing)
        {
            self.look_at(id, Instant::now());
        }
    }

    /// Removes the lease's record and ends its watch, unless its guard ended it first (then
    /// the guard counted it out).
    fn end(&mut self, id: u64) {
        if let Some(e) = self.entries.remove(&id)
            && e.shared.renewal.stop().is_some()
        {
            self.inbox.ended_by_task();
        }
    }

    /// Puts `id` in the heap at `at`, making its earlier items stale.
    fn schedule(&mut self, id: u64, at: Instant) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.seq = e.seq.wrapping_add(1);
            self.heap
                .push(Reverse((CompactInstant::new(Some(at)), id, e.seq)));
        }
    }

    fn fire_due(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((at, id, seq))) = self.heap.peek().copied() {
            if at.get().is_some_and(|at| at > now) {
                break;
            }
            self.heap.pop();
            if self.entries.get(&id).is_some_and(|e| e.seq == seq) {
                self.look_at(id, now);
            }
        }
    }

    /// What the lease's own task did when it woke: end the watch on a reported loss, fire the
    /// signal and release at a passed deadline, renew when due, else sleep until the next of
    /// the two.
    fn look_at(&mut self, id: u64, now: Instant) {
        let Some(e) = self.entries.get(&id) else {
            return;
        };
        if e.shared.notifier.is_fired() {
            // Lost (reported by the backend, or a refused renewal): nothing left to do.
            self.end(id);
            return;
        }
        let valid_until = e.shared.valid_until();
        if now >= valid_until {
            let shared = e.shared.clone();
            self.end(id);
            shared.notifier.fire(shared.validity().expiry_reason());
            if shared.begin_release() {
                shared.release_in_background(&self.background);
            }
            return;
        }
        match (e.state, e.next_renew.get()) {
            (State::Renewing, _) => {}
            (State::Queued, _) => self.schedule(id, valid_until),
            (State::Idle, Some(at)) if at <= now => {
                if self.renewing.len() < MAX_IN_FLIGHT {
                    self.start_renewal(id, now);
                } else {
                    self.set_state(id, State::Queued);
                    self.queued.push_back(id);
                    self.schedule(id, valid_until);
                }
            }
            (State::Idle, next) => {
                self.schedule(id, next.map_or(valid_until, |r| r.min(valid_until)));
            }
        }
    }

    fn set_state(&mut self, id: u64, state: State) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.state = state;
        }
    }

    fn start_queued(&mut self) {
        while self.renewing.len() < MAX_IN_FLIGHT
            && let Some(id) = self.queued.pop_front()
        {
            if self
                .entries
                .get(&id)
                .is_some_and(|e| e.state == State::Queued)
            {
                self.set_state(id, State::Idle);
                self.look_at(id, Instant::now());
            }
        }
    }

    /// The lease's next renewal, due now (or the end of its renewals at the maximum hold).
    fn start_renewal(&mut self, id: u64, now: Instant) {
        let min_ttl = self.backend.capabilities().min_ttl;
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        let valid_until = e.shared.valid_until();
        if e.shared.renew_interval().is_none() {
            e.next_renew = CompactInstant::new(None);
            self.schedule(id, valid_until);
            return;
        }
        // The last renewal asks the server for what is left of the hold, so that the lock frees
        // there even if the release at the deadline is lost. No hold deadline
        // (`AutoRenew::forever`): every renewal asks for the whole TTL.
        let asked = match e.shared.hold_deadline.get() {
            Some(hold_deadline) => e
                .shared
                .ttl()
                .min(hold_deadline.saturating_duration_since(now)),
            None => e.shared.ttl(),
        };
        if asked < min_ttl.max(Duration::from_millis(1)) {
            e.shared.validity().renewal_ended_by_hold();
            e.next_renew = CompactInstant::new(None);
            self.schedule(id, valid_until);
            return;
        }
        if !e.shared.renewal.begin() {
            self.end(id);
            return;
        }
        e.state = State::Renewing;
        // Its heap items are stale from now: the renewal itself is cut off at the deadline.
        e.seq = e.seq.wrapping_add(1);
        let args = (
            id,
            e.shared.clone(),
            self.backend.clone(),
            asked,
            valid_until,
        );
        self.renewing.push((self.make)(args));
    }

    fn renewed(&mut self, id: u64, renewed: Renewed) {
        let now = Instant::now();
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if !e.shared.renewal.finish() {
            self.end(id);
            return;
        }
        e.state = State::Idle;
        match renewed {
            Renewed::Ok { asked } => {
                e.next_renew = CompactInstant::new(
                    e.shared
                        .renew_interval()
                        .filter(|_| asked == e.shared.ttl())
                        .map(|i| now + i),
                );
                if e.next_renew.get().is_none() {
                    // The last renewal: the lease ends where the hold does.
                    e.shared.validity().renewal_ended_by_hold();
                }
            }
            Renewed::Refused | Renewed::Aborted => {
                self.end(id);
                return;
            }
            Renewed::Failed { error, valid_until } => {
                tracing::warn!(error = %format!("{error:#}"), "lease renewal failed; retrying before the validity deadline");
                let quarter = e.shared.renew_interval().map_or(Duration::ZERO, |i| i / 4);
                e.next_renew = CompactInstant::new(Some((now + quarter).min(valid_until)));
            }
            // The deadline check below fires the signal and releases.
            Renewed::TimedOut => e.next_renew = CompactInstant::new(None),
        }
        self.look_at(id, now);
    }
}

fn classify(result: Result<Duration>, asked: Duration, valid_until: Instant) -> Renewed {
    match result {
        Ok(_granted) => Renewed::Ok { asked },
        Err(e) if e.kind() == ErrorKind::NotHeld => Renewed::Refused,
        Err(error) => Renewed::Failed { error, valid_until },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_stays_small() {
        // One per watched lease in the map, and one item per lease in the heap (issue 24:
        // 100,000 auto-renewed leases on one client).
        assert_size_at_most!(Entry, 24);
        assert!(size_of::<Reverse<HeapItem>>() <= 24);
    }
}
