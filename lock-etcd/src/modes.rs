//! Shared holders and semaphore permits in the one queue of a lock: the mode is a suffix of each
//! contender's key name, so that the keys-only reads of the queue (the only reads on the
//! acquisition path) show it, and an exclusive key keeps the name it always had (an etcd
//! `concurrency.Mutex` key, which has no suffix, reads as exclusive too).
//!
//! Which key holds, from the keys created before it (its create revision orders the queue):
//! * exclusive: none (etcd's mutex);
//! * shared: no exclusive one (etcd's `recipes.RWMutex`): readers among readers never wait, and
//!   a waiting writer holds up the readers behind it;
//! * one of `limit` permits: fewer than `limit`.

use std::pin::Pin;
use std::task::{Context, Poll};

use lockcore::{Error, LockMode};
use tokio::sync::oneshot;

use crate::watch::Wake;

/// The key-name suffix of a shared key.
const SHARED: &str = ":shared";
/// The key-name suffix of a permit key, followed by the limit in decimal.
const PERMIT: &str = ":permit-";

/// The suffix `mode` adds to an acquisition's key name: none for an exclusive one, so that
/// exclusive keys are named as before and as other clients of the queue expect.
pub(crate) fn key_suffix(mode: &LockMode) -> String {
    match mode {
        LockMode::Exclusive => String::new(),
        LockMode::Shared => SHARED.to_owned(),
        LockMode::Permit { limit } => format!("{PERMIT}{limit}"),
    }
}

/// The mode a queue key was put with. A key without a suffix of ours (locksmith's exclusive
/// keys, an etcd `concurrency.Mutex` key, anything else) is exclusive: the mode that excludes
/// everyone, so an unknown key is never shared with.
pub(crate) fn mode_of(key: &[u8]) -> LockMode {
    if key.ends_with(SHARED.as_bytes()) {
        return LockMode::Shared;
    }
    let limit = key
        .windows(PERMIT.len())
        .rposition(|w| w == PERMIT.as_bytes())
        .and_then(|at| std::str::from_utf8(&key[at + PERMIT.len()..]).ok())
        .and_then(|n| n.parse().ok());
    match limit {
        Some(limit) => LockMode::Permit { limit },
        None => LockMode::Exclusive,
    }
}

/// A use of the name that `mode` cannot join, among the keys ahead of it: a semaphore with
/// another limit, or a semaphore beside a mutex or read-write lock. (An exclusive key ahead of a
/// shared request is contention, not a conflict.)
pub(crate) fn conflict<'a>(
    mode: &LockMode,
    ahead: impl IntoIterator<Item = &'a [u8]>,
) -> Option<Error> {
    mode.conflict_among(ahead.into_iter().map(mode_of))
}

/// What a contender does next, from the keys ahead of it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next<'a> {
    /// It holds.
    Hold,
    /// It holds once `needed` of these keys (key, create revision) are deleted: no other change
    /// can make it hold (keys are only ever added behind it).
    Wait {
        keys: Vec<(&'a [u8], i64)>,
        needed: usize,
    },
}

/// Whether a `mode` contender holds given the keys `ahead` of it (key, create revision, in
/// ascending create revision), and otherwise which deletions to wait for. Each waits for as few
/// keys as it can, so that one deletion wakes only the waiter it lets in (no herd): an exclusive
/// waiter for its predecessor (it looks again then), a shared one for the last exclusive key
/// ahead, a permit waiter for any `needed` of the keys ahead (counted on the client's watch, one
/// look at the queue once they are gone).
pub(crate) fn next<'a>(mode: &LockMode, ahead: &[(&'a [u8], i64)]) -> Next<'a> {
    let waiting_for = match mode {
        LockMode::Exclusive => ahead.last().map(|k| (vec![*k], 1)),
        LockMode::Shared => ahead
            .iter()
            .rev()
            .find(|(key, _)| mode_of(key) == LockMode::Exclusive)
            .map(|k| (vec![*k], 1)),
        LockMode::Permit { limit } => {
            let limit = *limit as usize;
            (ahead.len() >= limit).then(|| (ahead.to_vec(), ahead.len() - limit + 1))
        }
    };
    match waiting_for {
        None => Next::Hold,
        Some((keys, needed)) => Next::Wait { keys, needed },
    }
}

/// Which of a queue's keys (in ascending create revision) hold: each key holds by [`next`]
/// over the keys before it.
pub(crate) fn holders(queue: &[&[u8]]) -> Vec<bool> {
    let mut exclusive_ahead = false;
    queue
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let mode = mode_of(key);
            let holds = match mode {
                LockMode::Exclusive => i == 0,
                LockMode::Shared => !exclusive_ahead,
                LockMode::Permit { limit } => i < limit as usize,
            };
            exclusive_ahead |= mode == LockMode::Exclusive;
            holds
        })
        .collect()
}

/// Resolves once `needed` of `subs` report a deletion ([`Wake::Deleted`]), or at once on a
/// resync (or a subscription dropped by the watch), after which the waiter looks at the server.
pub(crate) async fn deletions(mut subs: Vec<oneshot::Receiver<Wake>>, needed: usize) -> Wake {
    match subs.len().checked_sub(needed.max(1)) {
        Some(left) => deleted_down_to(&mut subs, left).await,
        // Fewer keys than needed: once they are all gone (or at a resync), look again.
        None => {
            deleted_down_to(&mut subs, 0).await;
            Wake::Resync
        }
    }
}

/// Resolves once at most `left` of `subs` have not reported a deletion (those that did are
/// removed), or at once on a resync (or a subscription dropped by the watch), after which the
/// waiter looks at the server. Cancel safe: the subscriptions left stay in `subs`.
pub(crate) async fn deleted_down_to(subs: &mut Vec<oneshot::Receiver<Wake>>, left: usize) -> Wake {
    std::future::poll_fn(|cx: &mut Context<'_>| {
        let mut i = 0;
        while i < subs.len() {
            match Pin::new(&mut subs[i]).poll(cx) {
                Poll::Pending => i += 1,
                Poll::Ready(Ok(Wake::Deleted)) => {
                    subs.swap_remove(i);
                }
                Poll::Ready(_) => return Poll::Ready(Wake::Resync),
            }
        }
        if subs.len() <= left {
            Poll::Ready(Wake::Deleted)
        } else {
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    const P3: LockMode = LockMode::Permit { limit: 3 };

    #[test]
    fn the_suffix_reads_back_as_its_mode_and_anything_else_is_exclusive() {
        for mode in [LockMode::Exclusive, LockMode::Shared, P3] {
            let key = format!("locksmith/n/0123abcd-1f{}", key_suffix(&mode));
            assert_eq!(mode_of(key.as_bytes()), mode, "{key}");
        }
        // etcd's concurrency.Mutex key, and a suffix that is no number.
        assert_eq!(mode_of(b"locksmith/n/694d8a2b3c"), LockMode::Exclusive);
        assert_eq!(mode_of(b"locksmith/n/x:permit-"), LockMode::Exclusive);
        assert_eq!(mode_of(b"locksmith/n/x:permit-3a"), LockMode::Exclusive);
    }

    #[test]
    fn semaphores_refuse_other_limits_and_other_uses_only() {
        let (w, r) = (b"d/a-1".as_slice(), b"d/b-2:shared".as_slice());
        let (p3, p5) = (b"d/c-3:permit-3".as_slice(), b"d/e-4:permit-5".as_slice());
        assert!(conflict(&LockMode::Shared, [w, r]).is_none());
        assert!(conflict(&LockMode::Exclusive, [r, w]).is_none());
        assert!(conflict(&P3, [p3, p3]).is_none());
        let e = conflict(&P3, [p3, p5]).expect("another limit");
        assert_eq!(e.kind(), lockcore::ErrorKind::Conflict);
        assert!(conflict(&P3, [w]).is_some());
        assert!(conflict(&P3, [r]).is_some());
        assert!(conflict(&LockMode::Shared, [p3]).is_some());
        assert!(conflict(&LockMode::Exclusive, [p3]).is_some());
    }

    #[test]
    fn readers_wait_for_the_last_writer_ahead_and_permits_for_enough_deletions() {
        let w1 = (b"d/a-1".as_slice(), 10);
        let r = (b"d/b-2:shared".as_slice(), 11);
        let w2 = (b"d/c-3".as_slice(), 12);
        assert_eq!(next(&LockMode::Shared, &[r, r]), Next::Hold);
        assert_eq!(
            next(&LockMode::Shared, &[w1, r, w2, r]),
            Next::Wait {
                keys: vec![w2],
                needed: 1
            }
        );
        assert_eq!(
            next(&LockMode::Exclusive, &[r, r]),
            Next::Wait {
                keys: vec![r],
                needed: 1
            }
        );
        assert_eq!(next(&LockMode::Exclusive, &[]), Next::Hold);
        let p = (b"d/e-4:permit-3".as_slice(), 13);
        assert_eq!(next(&P3, &[p, p]), Next::Hold);
        assert_eq!(
            next(&P3, &[p, p, p, p]),
            Next::Wait {
                keys: vec![p, p, p, p],
                needed: 2
            }
        );
    }

    #[test]
    fn holders_are_the_keys_nothing_ahead_keeps_out() {
        let (w, r, p) = (
            b"d/a-1".as_slice(),
            b"d/b-2:shared".as_slice(),
            b"d/c-3:permit-2".as_slice(),
        );
        assert_eq!(holders(&[r, r, w, r]), [true, true, false, false]);
        assert_eq!(holders(&[w, r]), [true, false]);
        assert_eq!(holders(&[p, p, p]), [true, true, false]);
        assert!(holders(&[]).is_empty());
    }

    #[tokio::test]
    async fn deletions_resolve_after_enough_of_them_or_at_a_resync() {
        let (tx, subs): (Vec<_>, Vec<_>) = (0..3).map(|_| oneshot::channel()).unzip();
        let mut wait = Box::pin(deletions(subs, 2));
        let mut tx = tx.into_iter();
        tx.next().unwrap().send(Wake::Deleted).unwrap();
        assert!(futures_poll(&mut wait).is_none(), "one of two deletions");
        tx.next().unwrap().send(Wake::Deleted).unwrap();
        assert_eq!(futures_poll(&mut wait), Some(Wake::Deleted));

        let (tx, rx) = oneshot::channel();
        let mut wait = Box::pin(deletions(vec![rx], 1));
        tx.send(Wake::Resync).unwrap();
        assert_eq!(futures_poll(&mut wait), Some(Wake::Resync));
    }

    /// One poll of `fut`, with a waker that does nothing.
    fn futures_poll<F: std::future::Future + Unpin>(fut: &mut F) -> Option<F::Output> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match Pin::new(fut).poll(&mut cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        }
    }
}
