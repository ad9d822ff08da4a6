//! A toy key-value store with expiry (a stand-in for a Redis server) and the queue entries the
//! flawed backends keep in it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::Instant;

/// A toy key-value store with expiry, standing in for a Redis server.
#[derive(Default)]
pub(super) struct ToyStore {
    pub(super) map: Mutex<HashMap<String, (String, Option<Instant>)>>,
    /// Waiters queued per key, in arrival order (for [`Flaw::CancelLeavesEntryBehindOthers`]).
    pub(super) queues: Mutex<HashMap<String, Vec<u64>>>,
    /// Release messages per key, for the flaws with notification.
    pub(super) releases: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
    /// Waiters queued per key as (value, TTL), granted the lock on release in this order
    /// ([`Flaw::GrantedWaiterLeaks`]).
    pub(super) grants: Mutex<HashMap<String, std::collections::VecDeque<(String, Duration)>>>,
}

/// A queue entry of [`Flaw::HerdDeclaringQueue`]: removed when its waiter ends in any way,
/// waking the others (the next head among them).
pub(super) struct HerdEntry<'a> {
    pub(super) store: &'a ToyStore,
    pub(super) key: String,
    pub(super) id: u64,
}

impl Drop for HerdEntry<'_> {
    fn drop(&mut self) {
        if let Some(q) = self.store.queues.lock().unwrap().get_mut(&self.key) {
            q.retain(|id| *id != self.id);
        }
        self.store.releases(&self.key).notify_waiters();
    }
}

/// A queue entry of [`Flaw::GrantedWaiterLeaks`]; dropping it removes the entry, but not a lock
/// already granted to it (the flaw).
pub(super) struct GrantEntry<'a> {
    pub(super) store: &'a ToyStore,
    pub(super) key: String,
    pub(super) value: String,
}

impl Drop for GrantEntry<'_> {
    fn drop(&mut self) {
        if let Some(q) = self.store.grants.lock().unwrap().get_mut(&self.key) {
            q.retain(|(v, _)| *v != self.value);
        }
    }
}

/// A waiter's queue entry; dropping it removes the entry, except for a cancelled waiter that
/// is not at the head.
pub(super) struct QueueEntry<'a> {
    pub(super) store: &'a ToyStore,
    pub(super) key: String,
    pub(super) id: u64,
    pub(super) finished: bool,
}

impl Drop for QueueEntry<'_> {
    fn drop(&mut self) {
        let mut queues = self.store.queues.lock().unwrap();
        let queue = queues.entry(self.key.clone()).or_default();
        if self.finished || queue.first() == Some(&self.id) {
            queue.retain(|id| *id != self.id);
        }
    }
}

impl ToyStore {
    /// Queues a new waiter on `key` (at the back); its id.
    pub(super) fn enqueue(&self, key: &str) -> u64 {
        let id = fastrand::u64(..);
        self.queues
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default()
            .push(id);
        id
    }

    pub(super) fn with<T>(
        &self,
        key: &str,
        f: impl FnOnce(&mut Option<(String, Option<Instant>)>) -> T,
    ) -> T {
        let mut map = self.map.lock().unwrap();
        let mut entry = map
            .remove(key)
            .filter(|(_, exp)| exp.is_none_or(|e| e > Instant::now()));
        let out = f(&mut entry);
        if let Some(e) = entry {
            map.insert(key.to_string(), e);
        }
        out
    }
    pub(super) fn set_nx(&self, key: &str, value: &str, ttl: Option<Duration>) -> bool {
        self.with(key, |e| {
            if e.is_some() {
                return false;
            }
            *e = Some((value.to_string(), ttl.map(|t| Instant::now() + t)));
            true
        })
    }
    pub(super) fn expire(&self, key: &str, ttl: Duration) {
        self.with(key, |e| {
            if let Some((_, exp)) = e {
                *exp = Some(Instant::now() + ttl);
            }
        })
    }
    pub(super) fn get(&self, key: &str) -> Option<String> {
        self.with(key, |e| e.as_ref().map(|(v, _)| v.clone()))
    }
    pub(super) fn del(&self, key: &str) -> bool {
        self.with(key, |e| e.take().is_some())
    }
    /// Deletes `key` if it holds `value`, grants it to the head of its grant queue if any, and
    /// publishes the release.
    pub(super) fn compare_and_delete(&self, key: &str, value: &str) -> bool {
        let deleted = self.with(key, |e| {
            if e.as_ref().is_some_and(|(v, _)| v == value) {
                *e = None;
                if let Some((next, ttl)) = self
                    .grants
                    .lock()
                    .unwrap()
                    .get_mut(key)
                    .and_then(|q| q.pop_front())
                {
                    *e = Some((next, Some(Instant::now() + ttl)));
                }
                true
            } else {
                false
            }
        });
        if deleted {
            self.releases(key).notify_waiters();
        }
        deleted
    }
    /// The release messages of `key`.
    pub(super) fn releases(&self, key: &str) -> Arc<tokio::sync::Notify> {
        self.releases
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default()
            .clone()
    }
    /// When `key` expires, if it is held with an expiry.
    pub(super) fn expiry(&self, key: &str) -> Option<Instant> {
        self.with(key, |e| e.as_ref().and_then(|(_, exp)| *exp))
    }
    pub(super) fn set(&self, key: &str, value: &str) {
        self.with(key, |e| *e = Some((value.to_string(), None)))
    }
    pub(super) fn getset(&self, key: &str, value: &str) -> Option<String> {
        self.with(key, |e| {
            e.replace((value.to_string(), None)).map(|(v, _)| v)
        })
    }
    /// `INCR`, with the key's expiry reset to `ttl` when given (`None`: it never expires).
    pub(super) fn incr(&self, key: &str, ttl: Option<Duration>) -> u64 {
        self.with(key, |e| {
            let n = e
                .as_ref()
                .and_then(|(v, _)| v.parse::<u64>().ok())
                .unwrap_or(0)
                + 1;
            let exp = match (ttl, e.as_ref()) {
                (Some(t), _) => Some(Instant::now() + t),
                (None, Some((_, exp))) => *exp,
                (None, None) => None,
            };
            *e = Some((n.to_string(), exp));
            n
        })
    }
    pub(super) fn compare_and_expire(&self, key: &str, value: &str, ttl: Duration) -> bool {
        self.with(key, |e| match e {
            Some((v, exp)) if v == value => {
                *exp = Some(Instant::now() + ttl);
                true
            }
            _ => false,
        })
    }
}
