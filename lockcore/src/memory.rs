//! The in-memory reference backend (`memory://`): every capability of the contract, in one
//! process. Locks are shared by every [`MemoryBackend`] connected to the same named store.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{AcquireRequest, Acquired, Backend, Lease, LostNotifier, OwnerToken};
use crate::{Capabilities, Error, LockName, LostReason, Result, WaitKind};

/// A process-local lock service: FIFO waiters woken by notification, TTL expiry, fencing tokens
/// and lost-lease signals.
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    store: Arc<Store>,
    store_name: String,
    capabilities: Arc<Capabilities>,
}

#[derive(Debug, Default)]
struct Store {
    slots: Mutex<HashMap<LockName, Slot>>,
    fencing: AtomicU64,
    next_waiter: AtomicU64,
}

#[derive(Debug, Default)]
struct Slot {
    holder: Option<Holder>,
    queue: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Holder {
    token: OwnerToken,
    expires: Instant,
    lost: LostNotifier,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    wake: Arc<Notify>,
}

impl Slot {
    fn drop_expired(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| h.expires <= now) {
            self.holder = None;
        }
    }

    fn wake_head(&self) {
        if let Some(w) = self.queue.front() {
            w.wake.notify_one();
        }
    }

    fn is_unused(&self) -> bool {
        self.holder.is_none() && self.queue.is_empty()
    }
}

fn registry() -> &'static Mutex<HashMap<String, Weak<Store>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<Store>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl MemoryBackend {
    /// A client of the named store of this process: every backend connected to the same name
    /// shares its locks (as clients of one server would). The store lives while a client does.
    pub fn connect(store_name: &str) -> Self {
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        reg.retain(|_, s| s.strong_count() > 0);
        let store = match reg.get(store_name).and_then(Weak::upgrade) {
            Some(store) => store,
            None => {
                let store = Arc::new(Store::default());
                reg.insert(store_name.to_owned(), Arc::downgrade(&store));
                store
            }
        };
        MemoryBackend {
            store,
            store_name: store_name.to_owned(),
            capabilities: Arc::new(Self::declared_capabilities()),
        }
    }

    /// Another client of the same store.
    pub fn new_client(&self) -> Self {
        self.clone()
    }

    /// What the memory backend declares.
    pub fn declared_capabilities() -> Capabilities {
        Capabilities {
            fencing: true,
            fair: true,
            wait: WaitKind::Notify,
            lost_detection: true,
            force_release: true,
            notes: vec!["process-local: excludes tasks of one process only".into()],
            ..Capabilities::default()
        }
    }

    /// Frees `name` whoever holds it; the holder's lost signal fires at once. Returns whether it
    /// was held.
    pub fn force_release_now(&self, name: &LockName) -> bool {
        let mut slots = self.store.lock();
        let Some(slot) = slots.get_mut(name) else {
            return false;
        };
        slot.drop_expired(Instant::now());
        let held = match slot.holder.take() {
            Some(h) => {
                h.lost.fire(LostReason::RenewalRefused);
                true
            }
            None => false,
        };
        slot.wake_head();
        held
    }

    fn grant(&self, slot: &mut Slot, req: &AcquireRequest, now: Instant) -> Acquired {
        slot.holder = Some(Holder {
            token: req.token,
            expires: now + req.ttl,
            lost: req.lost.clone(),
        });
        let fencing = self.store.fencing.fetch_add(1, Ordering::Relaxed) + 1;
        Acquired::new(
            MemoryLease {
                store: self.store.clone(),
                name: req.name.clone(),
                token: req.token,
                fencing,
            },
            now,
        )
    }
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, HashMap<LockName, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Removes a waiter from its queue when its `acquire` ends in any way, cancellation included.
struct QueueEntry<'a> {
    store: &'a Store,
    name: &'a LockName,
    id: u64,
    queued: bool,
}

impl Drop for QueueEntry<'_> {
    fn drop(&mut self) {
        if !self.queued {
            return;
        }
        let mut slots = self.store.lock();
        if let Some(slot) = slots.get_mut(self.name) {
            let was_head = slot.queue.front().is_some_and(|w| w.id == self.id);
            slot.queue.retain(|w| w.id != self.id);
            if was_head {
                slot.wake_head();
            }
            if slot.is_unused() {
                slots.remove(self.name);
            }
        }
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        let now = Instant::now();
        let mut slots = self.store.lock();
        let slot = slots.entry(req.name.clone()).or_default();
        slot.drop_expired(now);
        // Waiters are served first: a try_lock does not barge ahead of the queue.
        if slot.holder.is_none() && slot.queue.is_empty() {
            return Ok(Some(self.grant(slot, req, now)));
        }
        Ok(None)
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        let wake = Arc::new(Notify::new());
        let mut entry = QueueEntry {
            store: &self.store,
            name: &req.name,
            id: self.store.next_waiter.fetch_add(1, Ordering::Relaxed),
            queued: false,
        };
        loop {
            let wait_until = {
                let now = Instant::now();
                let mut slots = self.store.lock();
                let slot = slots.entry(req.name.clone()).or_default();
                slot.drop_expired(now);
                let is_head = slot.queue.front().is_none_or(|w| w.id == entry.id);
                if slot.holder.is_none() && is_head {
                    if entry.queued {
                        slot.queue.pop_front();
                        entry.queued = false;
                    }
                    let acquired = self.grant(slot, req, now);
                    // The next waiter now waits for this holder's expiry.
                    slot.wake_head();
                    return Ok(Some(acquired));
                }
                if deadline.is_some_and(|d| now >= d) {
                    return Ok(None);
                }
                if !entry.queued {
                    slot.queue.push_back(Waiter {
                        id: entry.id,
                        wake: wake.clone(),
                    });
                    entry.queued = true;
                }
                let expiry = slot.holder.as_ref().filter(|_| is_head).map(|h| h.expires);
                match (deadline, expiry) {
                    (Some(d), Some(e)) => Some(d.min(e)),
                    (d, e) => d.or(e),
                }
            };
            match wait_until {
                Some(at) => {
                    tokio::select! {
                        _ = wake.notified() => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => wake.notified().await,
            }
        }
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        Ok(self.force_release_now(name))
    }

    fn describe(&self) -> String {
        format!("memory://{}", self.store_name)
    }
}

#[derive(Debug)]
struct MemoryLease {
    store: Arc<Store>,
    name: LockName,
    token: OwnerToken,
    fencing: u64,
}

impl MemoryLease {
    fn with_own_slot<T>(&self, f: impl FnOnce(&mut Slot, Instant) -> T) -> Result<T> {
        let now = Instant::now();
        let mut slots = self.store.lock();
        let slot = slots.get_mut(&self.name).ok_or_else(not_held)?;
        slot.drop_expired(now);
        if slot.holder.as_ref().is_none_or(|h| h.token != self.token) {
            return Err(not_held());
        }
        let out = f(slot, now);
        if slot.is_unused() {
            slots.remove(&self.name);
        }
        Ok(out)
    }
}

fn not_held() -> Error {
    Error::not_held("the lease expired or belongs to another holder")
}

#[async_trait]
impl Lease for MemoryLease {
    fn fencing_token(&self) -> Option<u64> {
        Some(self.fencing)
    }

    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        self.with_own_slot(|slot, now| {
            if let Some(h) = slot.holder.as_mut() {
                h.expires = now + ttl;
            }
        })?;
        Ok(ttl)
    }

    async fn release(&self) -> Result<()> {
        self.with_own_slot(|slot, _| {
            slot.holder = None;
            slot.wake_head();
        })
    }
}
