//! A waiter's place in line, one for every master: without it each master orders its queue
//! by when each vote reached it, and waiters that vote at once stand in different orders on
//! different masters, so that one release names a different head on each and their split
//! votes are undone and retried (most of a hand-over's requests past some tens of waiters).

use std::sync::Mutex;

use crate::sync::lock_mutex;

/// The place (µs, by the server's `TIME`) a waiting `lock()` was given in the queue of the
/// lowest-numbered master that answered it; its later votes bring it to every master, which
/// put it there (see [`lock_redis::node::WaitingVote::ticket`]). One master's clock orders all
/// waiters; no client clock is compared.
#[derive(Default)]
pub(crate) struct Ticket(Mutex<Option<(usize, u64)>>);

impl Ticket {
    /// The place to bring to every master, once one is known.
    pub(crate) fn get(&self) -> Option<u64> {
        lock_mutex(&self.0).map(|(_, place)| place)
    }

    /// Master `node` put the waiter at `place`: kept unless a lower-numbered master's is.
    pub(crate) fn offer(&self, node: usize, place: u64) {
        let mut held = lock_mutex(&self.0);
        if held.is_none_or(|(from, _)| node <= from) {
            *held = Some((node, place));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_numbered_master_gives_the_place() {
        let t = Ticket::default();
        assert_eq!(t.get(), None);
        t.offer(2, 30);
        assert_eq!(t.get(), Some(30));
        t.offer(3, 40);
        assert_eq!(
            t.get(),
            Some(30),
            "a higher-numbered master's place is not taken"
        );
        t.offer(0, 10);
        assert_eq!(t.get(), Some(10));
        t.offer(1, 20);
        assert_eq!(t.get(), Some(10));
    }
}
