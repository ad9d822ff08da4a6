//! A waiter's standing in line, the same on every master, and how often it polls for it.
//!
//! Without a shared place each master orders its queue by when each vote reached it, and
//! waiters that vote at once stand in different orders on different masters: one release then
//! names a different head on each, and their split votes are undone and retried.
//!
//! A waiter's safety-net vote (see `acquire.rs`) keeps its queue entries alive and catches a
//! release message that never came; a waiter with many ahead of it needs neither often (a
//! release names the head, and any queued waiter's vote takes a free lock), so it votes less
//! often, and its entries last as much longer: with 100 waiters the polls were most of a
//! hand-over's requests.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use lock_redis::node::QueuePlace;

use crate::sync::lock_mutex;

/// The place (µs, by the server's `TIME`) a waiting `lock()` was given in the queue of the
/// lowest-numbered master that answered it; its later votes bring it to every master, which
/// put it there (see [`lock_redis::node::WaitingVote::ticket`]). One master's clock orders all
/// waiters; no client clock is compared. Also the fewest waiters ahead that a master reported
/// for the latest vote.
pub(crate) struct Ticket {
    place: Mutex<Option<(usize, u64)>>,
    ahead: AtomicU64,
}

impl Default for Ticket {
    fn default() -> Self {
        Ticket {
            place: Mutex::new(None),
            ahead: AtomicU64::new(u64::MAX),
        }
    }
}

/// Waiters ahead per step of [`poll_stretch`].
const AHEAD_PER_STEP: u64 = 16;
/// The most polls' time between two safety votes.
pub(crate) const MAX_STRETCH: u32 = 8;

impl Ticket {
    /// The place to bring to every master, once one is known.
    pub(crate) fn get(&self) -> Option<u64> {
        lock_mutex(&self.place).map(|(_, place)| place)
    }

    /// A vote goes out: the waiters ahead are counted again from its answers.
    pub(crate) fn new_vote(&self) {
        self.ahead.store(u64::MAX, Ordering::Relaxed);
    }

    /// Master `node` put the waiter at `place`: kept unless a lower-numbered master's is.
    pub(crate) fn offer(&self, node: usize, place: QueuePlace) {
        self.ahead.fetch_min(place.ahead, Ordering::Relaxed);
        let mut held = lock_mutex(&self.place);
        if held.is_none_or(|(from, _)| node <= from) {
            *held = Some((node, place.at));
        }
    }

    /// How many polls' time to the next safety vote, by the latest vote's answers (1 when no
    /// master queued it).
    pub(crate) fn poll_stretch(&self) -> u32 {
        match self.ahead.load(Ordering::Relaxed) {
            u64::MAX => 1,
            ahead => 1 + (ahead / AHEAD_PER_STEP).min(u64::from(MAX_STRETCH - 1)) as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(at: u64, ahead: u64) -> QueuePlace {
        QueuePlace { at, ahead }
    }

    #[test]
    fn the_lowest_numbered_master_gives_the_place() {
        let t = Ticket::default();
        assert_eq!(t.get(), None);
        t.offer(2, at(30, 0));
        assert_eq!(t.get(), Some(30));
        t.offer(3, at(40, 0));
        assert_eq!(
            t.get(),
            Some(30),
            "a higher-numbered master's place is not taken"
        );
        t.offer(0, at(10, 0));
        assert_eq!(t.get(), Some(10));
        t.offer(1, at(20, 0));
        assert_eq!(t.get(), Some(10));
    }

    #[test]
    fn waiters_far_back_poll_less_often_up_to_a_bound() {
        let t = Ticket::default();
        assert_eq!(t.poll_stretch(), 1, "not queued anywhere");
        for (ahead, stretch) in [
            (0, 1),
            (15, 1),
            (16, 2),
            (47, 3),
            (111, 7),
            (112, 8),
            (10_000, 8),
        ] {
            t.new_vote();
            t.offer(0, at(1, ahead));
            assert_eq!(t.poll_stretch(), stretch, "{ahead} ahead");
        }
        t.new_vote();
        t.offer(0, at(1, 100));
        t.offer(1, at(1, 3));
        assert_eq!(t.poll_stretch(), 1, "the fewest ahead on any master counts");
        t.new_vote();
        assert_eq!(t.poll_stretch(), 1, "a new vote counts again");
    }
}
