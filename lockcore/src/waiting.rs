//! Which acquisitions wait: a backend marks its request once the request is waiting (its
//! attempt found the lock held and a release or expiry will now reach it), and the
//! [`Locker`](crate::Locker) counts those per lock name until the call returns. Where a backend
//! keeps no queue a test or an operator can ask, this is how they learn that a waiter is in
//! place, instead of sleeping and hoping.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::LockName;

/// The waiting calls of one client, per lock name.
#[derive(Debug, Default)]
pub(crate) struct WaitBoard {
    waiting: Mutex<HashMap<LockName, usize>>,
}

impl WaitBoard {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LockName, usize>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn count(&self, name: &LockName) -> usize {
        self.lock().get(name).copied().unwrap_or(0)
    }

    fn add(&self, name: &LockName) {
        *self.lock().entry(name.clone()).or_insert(0) += 1;
    }

    fn remove(&self, name: &LockName) {
        let mut waiting = self.lock();
        if let Some(n) = waiting.get_mut(name) {
            *n -= 1;
            if *n == 0 {
                waiting.remove(name);
            }
        }
    }
}

/// Carried by an [`AcquireRequest`](crate::backend::AcquireRequest): the backend calls
/// [`WaitMark::mark`] once the request waits, and may call it again (only the first counts).
/// The mark is cleared when the call ends, however it ends (won, timed out, failed, dropped).
#[derive(Clone, Debug, Default)]
pub struct WaitMark {
    entry: Option<Arc<MarkEntry>>,
}

#[derive(Debug)]
struct MarkEntry {
    board: Arc<WaitBoard>,
    name: LockName,
    marked: AtomicBool,
    /// Every call of [`WaitMark::mark`], counted: `lock()` learns from it whether an attempt
    /// heard from the server (it found the lock held) before it failed.
    marks: AtomicU64,
}

impl WaitMark {
    /// A mark counted on `board` under `name`.
    pub(crate) fn on(board: Arc<WaitBoard>, name: LockName) -> Self {
        WaitMark {
            entry: Some(Arc::new(MarkEntry {
                board,
                name,
                marked: AtomicBool::new(false),
                marks: AtomicU64::new(0),
            })),
        }
    }

    /// The request waits: its attempt found the lock held, and the backend is ready to be
    /// woken (subscribed, queued, or polling). Call it after the attempt that follows any
    /// subscription, so that a release from now on reaches the waiter.
    pub fn mark(&self) {
        if let Some(e) = &self.entry {
            e.marks.fetch_add(1, Ordering::AcqRel);
            if !e.marked.swap(true, Ordering::AcqRel) {
                e.board.add(&e.name);
            }
        }
    }

    /// How many times [`WaitMark::mark`] was called: a change across an attempt says the
    /// server answered it (the lock was found held).
    pub(crate) fn marks(&self) -> u64 {
        self.entry
            .as_ref()
            .map_or(0, |e| e.marks.load(Ordering::Acquire))
    }

    /// The call ended: no longer counted.
    pub(crate) fn clear(&self) {
        if let Some(e) = &self.entry {
            e.clear();
        }
    }
}

impl MarkEntry {
    fn clear(&self) {
        if self.marked.swap(false, Ordering::AcqRel) {
            self.board.remove(&self.name);
        }
    }
}

impl Drop for MarkEntry {
    fn drop(&mut self) {
        self.clear();
    }
}

/// How a backend's `acquire` spends its deadline, for backends whose one attempt either waits
/// (queues and is woken) or not: without a deadline `attempt(true, None)`, the wait unbounded;
/// with a deadline already past, a single attempt `attempt(false, None)`; else
/// `attempt(true, Some(deadline))`, dropped at the deadline (then `Ok(None)`: not acquired).
/// The attempt must clean up after itself when dropped.
///
/// Cancel safety: as the attempt's.
pub async fn acquire_within<T, F, Fut>(
    deadline: Option<crate::Instant>,
    mut attempt: F,
) -> crate::Result<Option<T>>
where
    F: FnMut(bool, Option<crate::Instant>) -> Fut,
    Fut: std::future::Future<Output = crate::Result<Option<T>>>,
{
    match deadline {
        None => attempt(true, None).await,
        // No time to wait: a single attempt.
        Some(d) if d <= crate::Instant::now() => attempt(false, None).await,
        Some(d) => tokio::time::timeout_at(d, attempt(true, Some(d)))
            .await
            // The dropped attempt cleans up behind it.
            .unwrap_or(Ok(None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// No deadline waits unbounded, a past one makes one attempt without waiting, a future one
    /// waits until it and then gives up with nothing acquired.
    #[tokio::test(start_paused = true)]
    async fn acquire_within_spends_the_deadline() {
        let asked = |wait: bool, until: Option<crate::Instant>| async move {
            crate::Result::Ok(Some((wait, until)))
        };
        assert_eq!(
            acquire_within(None, asked).await.unwrap(),
            Some((true, None))
        );
        let past = crate::Instant::now();
        assert_eq!(
            acquire_within(Some(past), asked).await.unwrap(),
            Some((false, None))
        );
        let later = crate::Instant::now() + Duration::from_secs(5);
        assert_eq!(
            acquire_within(Some(later), asked).await.unwrap(),
            Some((true, Some(later)))
        );
        let never = |_, _| std::future::pending::<crate::Result<Option<()>>>();
        assert_eq!(acquire_within(Some(later), never).await.unwrap(), None);
        assert!(crate::Instant::now() >= later);
    }

    #[test]
    fn a_mark_counts_once_until_cleared_or_dropped() {
        let board = Arc::new(WaitBoard::default());
        let name = LockName::new("n").unwrap();
        let a = WaitMark::on(board.clone(), name.clone());
        let b = WaitMark::on(board.clone(), name.clone());
        assert_eq!(board.count(&name), 0);
        a.mark();
        a.mark();
        b.mark();
        assert_eq!(board.count(&name), 2);
        a.clear();
        assert_eq!(board.count(&name), 1);
        drop(b);
        assert_eq!(board.count(&name), 0);
        WaitMark::default().mark();
    }
}
