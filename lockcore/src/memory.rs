//! The in-memory reference backend (`memory://`): every capability of the contract, in one
//! process. Locks are shared by every [`MemoryBackend`] connected to the same named store.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{
    AcquireRequest, Acquired, Backend, Lease, LostNotifier, OwnerToken, SetAttempt,
};
use crate::{
    Capabilities, Error, LockInfo, LockMode, LockName, LossDetection, LostReason, Result, Share,
    Support, WaitKind,
};

/// A process-local lock service: FIFO waiters woken by notification, TTL expiry, fencing tokens
/// and lost-lease signals.
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    store: Arc<Store>,
    store_name: String,
    capabilities: Arc<Capabilities>,
    link: Link,
}

/// This client's link to the store, as a network link to a server: how long its replies take
/// to come back (the operation takes effect at once, as a request reaching the server; the
/// reply arrives this much later, as over a slow network), and how many requests it sent.
#[derive(Debug, Clone, Default)]
struct Link {
    reply_delay_nanos: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    /// Armed: the reply to the next request about a name containing these bytes is lost.
    lose_reply_about: Arc<Mutex<Option<Vec<u8>>>>,
    replies_lost: Arc<AtomicU64>,
}

impl Link {
    /// Counts one request; its reply delay.
    fn send(&self) -> Duration {
        self.requests.fetch_add(1, Ordering::Relaxed);
        Duration::from_nanos(self.reply_delay_nanos.load(Ordering::Relaxed))
    }

    /// The reply to a request about `name`, applied on the store: `out`, or lost (the request
    /// took effect, the client hears `Unavailable`, as from a connection reset) when armed for
    /// that name.
    fn reply<T>(&self, name: &LockName, out: T) -> Result<T> {
        let mut armed = self
            .lose_reply_about
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let hit = armed.as_ref().is_some_and(|p| {
            p.is_empty()
                || name
                    .as_str()
                    .as_bytes()
                    .windows(p.len())
                    .any(|w| w == p.as_slice())
        });
        if !hit {
            return Ok(out);
        }
        *armed = None;
        self.replies_lost.fetch_add(1, Ordering::Relaxed);
        Err(Error::unavailable(
            "memory store: the reply was lost",
            std::io::Error::from(std::io::ErrorKind::ConnectionReset),
        ))
    }

    /// Waits out `delay`, read when the request was sent.
    async fn wait(delay: Duration) {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
}

#[derive(Debug, Default)]
struct Store {
    slots: Mutex<HashMap<LockName, Slot>>,
    fencing: AtomicU64,
    next_waiter: AtomicU64,
}

#[derive(Debug, Default)]
struct Slot {
    /// In grant order: one exclusive holder, or shared holders, or permit holders.
    holders: Vec<Holder>,
    queue: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Holder {
    mode: LockMode,
    token: OwnerToken,
    expires: Instant,
    lost: LostNotifier,
    fencing: u64,
    /// The metadata of the acquisition, kept as a server would keep it.
    meta: crate::Holder,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    mode: LockMode,
    wake: Arc<Notify>,
}

impl Slot {
    fn drop_expired(&mut self, now: Instant) {
        self.holders.retain(|h| h.expires > now);
    }

    /// The holder with `token`.
    fn holder_mut(&mut self, token: OwnerToken) -> Option<&mut Holder> {
        self.holders.iter_mut().find(|h| h.token == token)
    }

    /// Whether `mode` may join the holders now (leaving the queue aside).
    fn fits(&self, mode: &LockMode) -> bool {
        match self.holders.first() {
            None => true,
            Some(first) => {
                first.mode.compatible(mode)
                    && match mode {
                        LockMode::Permit { limit } => self.holders.len() < *limit as usize,
                        _ => true,
                    }
            }
        }
    }

    /// A use of the name that `mode` cannot join, by a holder or a waiter: a semaphore with
    /// another limit, or a semaphore beside a mutex or read-write lock. Contention between an
    /// exclusive and a shared acquisition is no conflict.
    fn conflict(&self, mode: &LockMode) -> Option<Error> {
        let holders = self.holders.iter().map(|h| h.mode);
        mode.conflict_among(holders.chain(self.queue.iter().map(|w| w.mode)))
    }

    /// The earliest expiry among the holders: when a place may free up.
    fn next_expiry(&self) -> Option<Instant> {
        self.holders.iter().map(|h| h.expires).min()
    }

    fn wake_head(&self) {
        if let Some(w) = self.queue.front() {
            w.wake.notify_one();
        }
    }

    fn is_unused(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty()
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
            link: Link::default(),
        }
    }

    /// Another client of the same store (with no reply delay).
    pub fn new_client(&self) -> Self {
        MemoryBackend {
            link: Link::default(),
            ..self.clone()
        }
    }

    /// This client with every reply delayed by `delay` (see [`MemoryBackend::set_reply_delay`]).
    pub fn with_reply_delay(self, delay: Duration) -> Self {
        self.set_reply_delay(delay);
        self
    }

    /// How many requests this client (and the leases it acquired) sent to the store so far:
    /// each attempt, each look a waiter takes at the queue when woken, each extend and
    /// release. For tests of the server work a hand-over costs.
    pub fn requests(&self) -> u64 {
        self.link.requests.load(Ordering::Relaxed)
    }

    /// Loses the reply to this client's next request (or its leases') about a name containing
    /// `name_part` (any name when empty): the store applies the request and the client hears
    /// `Unavailable`, as when a connection is reset after the server applied what it sent. For
    /// tests of lost replies (a retried acquire must not wait on its own grant).
    pub fn lose_next_reply_about(&self, name_part: &[u8]) {
        *self
            .link
            .lose_reply_about
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(name_part.to_vec());
    }

    /// Disarms [`MemoryBackend::lose_next_reply_about`]; how many replies this client lost so
    /// far.
    pub fn disarm_reply_loss(&self) -> u64 {
        *self
            .link
            .lose_reply_about
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        self.link.replies_lost.load(Ordering::Relaxed)
    }

    /// Delays the replies of this client, and of the leases it acquired, by `delay` from now on:
    /// each operation takes effect at once, as a request reaching the server would, and its
    /// reply comes back `delay` later, as over a slow network. For tests of latency on the reply
    /// path (validity counted from when a request was sent, concurrent extends).
    pub fn set_reply_delay(&self, delay: Duration) {
        let nanos = delay.as_nanos().min(u128::from(u64::MAX)) as u64;
        self.link.reply_delay_nanos.store(nanos, Ordering::Relaxed);
    }

    /// What the memory backend declares.
    pub fn declared_capabilities() -> Capabilities {
        Capabilities {
            fencing: true,
            fair: true,
            wait: WaitKind::Notify,
            lost_detection: true,
            revoke_detection: true,
            // force_release fires the holder's lost signal itself, before it returns.
            loss_detection: LossDetection::Pushed {
                within: Duration::ZERO,
            },
            force_release: true,
            inspect: true,
            shared: Support::Yes,
            permits: Support::Yes,
            atomic_multi: Support::Yes,
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
        let held = !slot.holders.is_empty();
        for h in slot.holders.drain(..) {
            h.lost.fire(LostReason::RenewalRefused);
        }
        slot.wake_head();
        held
    }

    fn grant(&self, slot: &mut Slot, req: &AcquireRequest, now: Instant) -> Acquired {
        let fencing = self.store.fencing.fetch_add(1, Ordering::Relaxed) + 1;
        // A retry of a grant whose reply was lost replaces its own entry.
        slot.holders.retain(|h| h.token != req.token);
        slot.holders.push(Holder {
            mode: req.mode,
            token: req.token,
            expires: now + req.ttl,
            lost: req.lost.clone(),
            fencing,
            meta: req.holder.clone(),
        });
        Acquired::new(
            MemoryLease {
                store: self.store.clone(),
                name: req.name.clone(),
                token: req.token,
                fencing,
                link: self.link.clone(),
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
        let delay = self.link.send();
        let now = Instant::now();
        let granted = {
            let mut slots = self.store.lock();
            let slot = slots.entry(req.name.clone()).or_default();
            slot.drop_expired(now);
            match slot.conflict(&req.mode) {
                Some(e) => Err(e),
                None => {
                    // Waiters are served first: a try_lock does not barge ahead of the queue. A
                    // holder with this request's token is this request's own grant, whose reply
                    // was lost: the retry gets it again.
                    let own = slot.holder_mut(req.token).is_some();
                    Ok(((slot.fits(&req.mode) && slot.queue.is_empty()) || own)
                        .then(|| self.grant(slot, req, now)))
                }
            }
        };
        Link::wait(delay).await;
        self.link.reply(&req.name, granted)?
    }

    /// Every member under one hold of the store: each is taken as [`Backend::try_acquire`]
    /// would take it (free, no waiters queued), or none is.
    async fn try_acquire_all(&self, reqs: &[AcquireRequest]) -> Result<SetAttempt> {
        let delay = self.link.send();
        let now = Instant::now();
        let granted = {
            let mut slots = self.store.lock();
            let mut busy = None;
            for (i, req) in reqs.iter().enumerate() {
                let slot = slots.entry(req.name.clone()).or_default();
                slot.drop_expired(now);
                if let Some(e) = slot.conflict(&req.mode) {
                    return Err(e);
                }
                let own = slot.holder_mut(req.token).is_some();
                if !((slot.fits(&req.mode) && slot.queue.is_empty()) || own) {
                    busy = Some(i);
                    break;
                }
            }
            match busy {
                Some(i) => SetAttempt::Busy(i),
                None => SetAttempt::All(
                    reqs.iter()
                        .map(|req| {
                            let slot = slots.entry(req.name.clone()).or_default();
                            self.grant(slot, req, now)
                        })
                        .collect(),
                ),
            }
        };
        Link::wait(delay).await;
        for req in reqs {
            self.link.reply(&req.name, ())?;
        }
        Ok(granted)
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
            // Each look at the queue is a request (a waiter woken for nothing costs one).
            let delay = self.link.send();
            let wait_until = {
                let now = Instant::now();
                let mut slots = self.store.lock();
                let slot = slots.entry(req.name.clone()).or_default();
                slot.drop_expired(now);
                if !entry.queued
                    && let Some(e) = slot.conflict(&req.mode)
                {
                    return Err(e);
                }
                let is_head = slot.queue.front().is_none_or(|w| w.id == entry.id);
                // This request's own grant whose reply was lost: the retry gets it again.
                let own = slot.holder_mut(req.token).is_some();
                if (slot.fits(&req.mode) && is_head) || own {
                    if entry.queued {
                        let id = entry.id;
                        slot.queue.retain(|w| w.id != id);
                        entry.queued = false;
                    }
                    let acquired = self.grant(slot, req, now);
                    // The next waiter now waits for this holder's expiry.
                    slot.wake_head();
                    Err(acquired)
                } else if deadline.is_some_and(|d| now >= d) {
                    return Ok(None);
                } else {
                    if !entry.queued {
                        slot.queue.push_back(Waiter {
                            id: entry.id,
                            mode: req.mode,
                            wake: wake.clone(),
                        });
                        entry.queued = true;
                    }
                    let expiry = slot.next_expiry().filter(|_| is_head);
                    Ok(match (deadline, expiry) {
                        (Some(d), Some(e)) => Some(d.min(e)),
                        (d, e) => d.or(e),
                    })
                }
            };
            let wait_until = match wait_until {
                Ok(wait_until) => {
                    req.waiting.mark();
                    wait_until
                }
                Err(acquired) => {
                    Link::wait(delay).await;
                    return self.link.reply(&req.name, Some(acquired));
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

    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        let now = Instant::now();
        let mut slots = self.store.lock();
        let Some(slot) = slots.get_mut(name) else {
            return Ok(LockInfo::free(name.clone(), Some(0)));
        };
        slot.drop_expired(now);
        let waiters = Some(slot.queue.len());
        Ok(match slot.holders.as_slice() {
            [] => LockInfo::free(name.clone(), waiters),
            [h] if h.mode == LockMode::Exclusive => LockInfo::held(name.clone())
                .with_fencing_token(Some(h.fencing))
                .with_ttl_left(Some(h.expires.saturating_duration_since(now)))
                .with_holder(Some(h.meta.clone()))
                .with_waiters(waiters)
                .with_mode(Some(h.mode)),
            all => LockInfo::held(name.clone())
                .with_shares(
                    all.iter()
                        .map(|h| {
                            Share::new(
                                Some(h.fencing),
                                Some(h.expires.saturating_duration_since(now)),
                                Some(h.meta.clone()),
                            )
                        })
                        .collect(),
                )
                .with_waiters(waiters)
                .with_mode(Some(all[0].mode)),
        })
    }

    async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        Ok(self
            .store
            .lock()
            .get(name)
            .map_or(0, |slot| slot.queue.len()))
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
    link: Link,
}

impl MemoryLease {
    fn with_own_slot<T>(&self, f: impl FnOnce(&mut Slot, Instant) -> T) -> Result<T> {
        let now = Instant::now();
        let mut slots = self.store.lock();
        let slot = slots.get_mut(&self.name).ok_or_else(not_held)?;
        slot.drop_expired(now);
        if slot.holder_mut(self.token).is_none() {
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
        let delay = self.link.send();
        let token = self.token;
        let done = self.with_own_slot(|slot, now| {
            if let Some(h) = slot.holder_mut(token) {
                h.expires = now + ttl;
            }
        });
        Link::wait(delay).await;
        self.link.reply(&self.name, done.map(|()| ttl))?
    }

    async fn release(&self) -> Result<()> {
        let delay = self.link.send();
        let token = self.token;
        let done = self.with_own_slot(|slot, _| {
            slot.holders.retain(|h| h.token != token);
            slot.wake_head();
        });
        Link::wait(delay).await;
        self.link.reply(&self.name, done)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorKind, LockOptions, Locker};

    #[tokio::test]
    async fn inspect_reports_holder_waiters_and_force_release_fires_lost() {
        let store = "inspect-memory";
        let holder = Locker::new(MemoryBackend::connect(store));
        let admin = Locker::new(MemoryBackend::connect(store));
        let free = admin.inspect("job").await.unwrap();
        assert!(!free.held && free.holder.is_none() && free.ttl_left.is_none());
        assert_eq!(free.waiters, Some(0));

        let opts = LockOptions::new().label("nightly backup");
        let guard = holder.lock("job", &opts).await.unwrap();
        let waiter = {
            let l = holder.clone();
            tokio::spawn(async move { l.lock("job", &LockOptions::new()).await })
        };
        while admin.backend().queued_waiters(guard.name()).await.unwrap() < 1 {
            tokio::task::yield_now().await;
        }
        let info = admin.inspect("job").await.unwrap();
        assert!(info.held);
        assert_eq!(info.fencing_token, guard.fencing_token());
        assert!(info.ttl_left.unwrap() <= opts.ttl_value() && !info.ttl_left.unwrap().is_zero());
        assert_eq!(info.waiters, Some(1));
        let h = info.holder.unwrap();
        assert_eq!(h.pid, std::process::id());
        assert_eq!(h.label.as_deref(), Some("nightly backup"));
        assert_eq!(h.clock, crate::AcquiredClock::Holder);

        let lost = guard.lost();
        assert!(admin.force_release("job").await.unwrap());
        lost.lost().await;
        let next = waiter.await.unwrap().unwrap();
        assert_ne!(next.fencing_token(), info.fencing_token);
        next.release().await.unwrap();
        assert!(!admin.force_release("job").await.unwrap());
    }

    #[tokio::test]
    async fn bad_labels_and_unsupported_backends_are_refused_before_io() {
        let locker = Locker::new(MemoryBackend::connect("inspect-refused"));
        let err = locker
            .try_lock("a", &LockOptions::new().label("two\nlines"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
        assert!(!locker.inspect("a").await.unwrap().held);

        let mut caps = MemoryBackend::declared_capabilities();
        caps.inspect = false;
        caps.force_release = false;
        let mut backend = MemoryBackend::connect("inspect-refused");
        backend.capabilities = Arc::new(caps);
        let blind = Locker::new(backend);
        assert_eq!(
            blind.inspect("a").await.unwrap_err().kind(),
            ErrorKind::Unsupported
        );
        assert_eq!(
            blind.force_release("a").await.unwrap_err().kind(),
            ErrorKind::Unsupported
        );
    }
}
