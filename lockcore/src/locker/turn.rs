//! [`Turn`]: extends of one lease run one at a time, in one byte of its state.
//!
//! A `tokio::sync::Mutex<()>` per lease took 40 bytes of the lease's state (a semaphore and its
//! wait list) for a lock that is almost never contended: only a holder's own `extend` racing
//! the watchdog's renewal waits. Here the lock is a byte, and a waiter sleeps on the lease's one
//! notify (the validity's), which an unlock wakes only when someone waits (issue 24).

use std::sync::atomic::{AtomicU8, Ordering};

use tokio::sync::Notify;

const FREE: u8 = 0;
const TAKEN: u8 = 1;
/// Taken, and someone waits for it: the unlock wakes the waiters.
const CONTENDED: u8 = 2;

#[derive(Default)]
pub(super) struct Turn(AtomicU8);

/// Holds the turn until dropped.
pub(super) struct TurnGuard<'a> {
    turn: &'a Turn,
    notify: &'a Notify,
}

impl Turn {
    /// Waits for the turn. `notify` is where waiters sleep: the same one for every call on this
    /// turn. Not fair (a waiter woken may find the turn taken again, and waits again).
    ///
    /// Cancel safe: a dropped wait holds nothing.
    pub(super) async fn take<'a>(&'a self, notify: &'a Notify) -> TurnGuard<'a> {
        loop {
            // Registered before the check: an unlock after it wakes this waiter.
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let mut seen = self.0.load(Ordering::Acquire);
            loop {
                let (want, taking) = match seen {
                    FREE => (TAKEN, true),
                    TAKEN => (CONTENDED, false),
                    _ => break,
                };
                match self
                    .0
                    .compare_exchange(seen, want, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) if taking => return TurnGuard { turn: self, notify },
                    Ok(_) => break,
                    Err(now) => seen = now,
                }
            }
            notified.await;
        }
    }
}

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        if self.turn.0.swap(FREE, Ordering::AcqRel) == CONTENDED {
            self.notify.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[tokio::test]
    async fn one_at_a_time() {
        // Tasks of one thread interleave at each yield: a second holder would be seen inside.
        let shared = Arc::new((Turn::default(), Notify::new(), AtomicUsize::new(0)));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let shared = shared.clone();
                tokio::spawn(async move {
                    let (turn, notify, inside) = &*shared;
                    for _ in 0..200 {
                        let _t = turn.take(notify).await;
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two at once");
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(shared.0.0.load(Ordering::SeqCst), FREE);
    }

    #[tokio::test]
    async fn a_dropped_wait_holds_nothing() {
        let (turn, notify) = (Turn::default(), Notify::new());
        let held = turn.take(&notify).await;
        let waiting =
            tokio::time::timeout(std::time::Duration::from_millis(10), turn.take(&notify)).await;
        assert!(waiting.is_err(), "the turn is held");
        drop(held);
        drop(turn.take(&notify).await);
    }
}
