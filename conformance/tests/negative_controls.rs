//! Negative controls: deliberately broken backends that make the classic mistakes. Each must
//! fail exactly the scenarios named here, which proves the suite catches those mistakes. A
//! correct backend over the same toy store passes everything, so the store is not the cause.
//! Waiters poll with lockcore's own `poll_acquire` (as a real polling backend does), so what is
//! caught is not overstated by an unrealistically tight poll.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use conformance::{Harness, ReplyLoser, RequestCount, Status, run_all};
use lockcore::backend::{AcquireRequest, Acquired, Backend, Backoff, Lease, poll_acquire};
use lockcore::{Capabilities, Error, Instant, LockName, Locker, Result};

/// The mistake a backend makes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Flaw {
    /// None: the control of the controls.
    None,
    /// `SETNX` then `EXPIRE` as two steps; a holder that dies in between leaves a lock forever.
    SetnxThenExpire,
    /// Every holder stores the same value, so anyone's release or extend hits anyone's lock.
    FixedValue,
    /// Release reads the value, then deletes in a second step after a pause.
    ReadThenDelete,
    /// Extend claims success without renewing: the lease runs out under a live holder.
    NeverRenewed,
    /// A waiter retries at once, again and again, instead of sleeping or being notified.
    SpinningWaiter,
    /// The `SETNX` + `GETSET` timestamp lock: the value is the expiry time by the acquiring
    /// client's clock, and a client whose clock says it passed takes the lock over.
    GetsetTimestamp,
    /// The fencing counter lives in a key that expires with the lock, so it restarts after the
    /// lock has been idle for a TTL.
    FencingResetsWhenIdle,
    /// The fencing counter's key expires five TTLs after its last grant: it survives a short
    /// idle period and restarts after a longer one.
    FencingExpiresAfterFiveTtls,
    /// The store keeps a lease for 90 % of the TTL asked for (a TTL rounded down, a server clock
    /// running fast): a 1 s lease ends 100 ms before its holder's validity deadline.
    EarlyExpiry,
    /// Release as `GET` then `DEL` with a short gap (one slow round trip, 3 ms).
    ReadThenDeleteQuick,
    /// Keys are built as file-system-like paths: `.` and empty segments dropped, `..` pops the
    /// segment before it (a name-to-path mapping that normalises instead of escaping).
    PathNormalised,
    /// Declares notification but polls every 435 ms (a fixed interval).
    PollsDeclaringNotify,
    /// `SET NX` with a safety TTL of three TTLs, then `PEXPIRE ttl` in a second step: an
    /// acquire cancelled in between leaves the lock for three TTLs, not one.
    SafetyTtlThenExpire,
    /// Waiters are queued and the queue is reported, but a cancelled waiter removes its entry
    /// only when it is at the head of the queue: one cancelled behind another stays forever.
    CancelLeavesEntryBehindOthers,
    /// Declares notification; a waiter tries, then subscribes to release messages a round trip
    /// later without trying again, and otherwise waits for the holder's expiry or a slow safety
    /// poll: a release between the failed attempt and the subscription is missed.
    SubscribesAfterFailedAttempt,
    /// A server-side queue grants the lock to the waiter at its head on release; a waiter
    /// dropped at that moment removes its queue entry but leaves the lock granted to it held
    /// until its TTL.
    GrantedWaiterLeaks,
    /// The namespace setting is accepted but not put into the keys: two namespaces on one
    /// store share every lock.
    NamespaceIgnored,
    /// Declares a queue (fair, notified): waiters queue in arrival order and only the head
    /// takes the lock, but a release wakes every waiter, and each reads the queue to see
    /// whether it is the head (a herd: one request per waiter per hand-over).
    HerdDeclaringQueue,
    /// An acquire whose reply was lost is retried as a new `SET NX`, which fails on the
    /// request's own grant: the retry waits for it to expire.
    RetryWaitsOnOwnGrant,
}

/// The gap between a failed attempt and the subscription of
/// [`Flaw::SubscribesAfterFailedAttempt`] (a slow subscribe round trip).
const SUBSCRIBE_GAP: Duration = Duration::from_millis(10);

/// How long a waiter of [`Flaw::GrantedWaiterLeaks`] takes to see it was granted the lock
/// after a release message (the round trip that reads the queue).
const GRANT_NOTICE: Duration = Duration::from_millis(10);

/// The safety poll of [`Flaw::SubscribesAfterFailedAttempt`].
const SLOW_SAFETY_POLL: Duration = Duration::from_secs(2);

/// The fixed poll interval of [`Flaw::PollsDeclaringNotify`].
const FIXED_POLL: Duration = Duration::from_millis(435);

/// What [`Flaw::PathNormalised`] makes of a name: the segments between `/`, without `.` and
/// empty ones, `..` removing the segment before it.
fn normalised_path(name: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for seg in name.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    format!("/{}", segments.join("/"))
}

/// A toy key-value store with expiry, standing in for a Redis server.
#[derive(Default)]
struct ToyStore {
    map: Mutex<HashMap<String, (String, Option<Instant>)>>,
    /// Waiters queued per key, in arrival order (for [`Flaw::CancelLeavesEntryBehindOthers`]).
    queues: Mutex<HashMap<String, Vec<u64>>>,
    /// Release messages per key, for the flaws with notification.
    releases: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
    /// Waiters queued per key as (value, TTL), granted the lock on release in this order
    /// ([`Flaw::GrantedWaiterLeaks`]).
    grants: Mutex<HashMap<String, std::collections::VecDeque<(String, Duration)>>>,
}

/// A queue entry of [`Flaw::HerdDeclaringQueue`]: removed when its waiter ends in any way,
/// waking the others (the next head among them).
struct HerdEntry<'a> {
    store: &'a ToyStore,
    key: String,
    id: u64,
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
struct GrantEntry<'a> {
    store: &'a ToyStore,
    key: String,
    value: String,
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
struct QueueEntry<'a> {
    store: &'a ToyStore,
    key: String,
    id: u64,
    finished: bool,
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
    fn with<T>(&self, key: &str, f: impl FnOnce(&mut Option<(String, Option<Instant>)>) -> T) -> T {
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
    fn set_nx(&self, key: &str, value: &str, ttl: Option<Duration>) -> bool {
        self.with(key, |e| {
            if e.is_some() {
                return false;
            }
            *e = Some((value.to_string(), ttl.map(|t| Instant::now() + t)));
            true
        })
    }
    fn expire(&self, key: &str, ttl: Duration) {
        self.with(key, |e| {
            if let Some((_, exp)) = e {
                *exp = Some(Instant::now() + ttl);
            }
        })
    }
    fn get(&self, key: &str) -> Option<String> {
        self.with(key, |e| e.as_ref().map(|(v, _)| v.clone()))
    }
    fn del(&self, key: &str) -> bool {
        self.with(key, |e| e.take().is_some())
    }
    /// Deletes `key` if it holds `value`, grants it to the head of its grant queue if any, and
    /// publishes the release.
    fn compare_and_delete(&self, key: &str, value: &str) -> bool {
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
    fn releases(&self, key: &str) -> Arc<tokio::sync::Notify> {
        self.releases
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default()
            .clone()
    }
    /// When `key` expires, if it is held with an expiry.
    fn expiry(&self, key: &str) -> Option<Instant> {
        self.with(key, |e| e.as_ref().and_then(|(_, exp)| *exp))
    }
    fn set(&self, key: &str, value: &str) {
        self.with(key, |e| *e = Some((value.to_string(), None)))
    }
    fn getset(&self, key: &str, value: &str) -> Option<String> {
        self.with(key, |e| {
            e.replace((value.to_string(), None)).map(|(v, _)| v)
        })
    }
    /// `INCR`, with the key's expiry reset to `ttl` when given (`None`: it never expires).
    fn incr(&self, key: &str, ttl: Option<Duration>) -> u64 {
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
    fn compare_and_expire(&self, key: &str, value: &str, ttl: Duration) -> bool {
        self.with(key, |e| match e {
            Some((v, exp)) if v == value => {
                *exp = Some(Instant::now() + ttl);
                true
            }
            _ => false,
        })
    }
}

#[derive(Debug)]
struct FlawedBackend {
    store: Arc<ToyStoreHandle>,
    flaw: Flaw,
    caps: Capabilities,
    /// How far this client's wall clock runs ahead.
    clock_ahead: Duration,
    /// The key prefix of this client's namespace.
    namespace: &'static str,
    /// Requests this client (and its leases) sent to the store.
    requests: Arc<AtomicU64>,
    /// Armed: the reply to the next request about a key containing these bytes is lost.
    lose_reply_about: Arc<Mutex<Option<Vec<u8>>>>,
    replies_lost: Arc<AtomicU64>,
}

/// `Debug` for the store without printing its contents.
struct ToyStoreHandle(ToyStore);

impl std::fmt::Debug for ToyStoreHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ToyStore")
    }
}

impl FlawedBackend {
    /// This client's wall clock in milliseconds.
    fn clock_ms(&self) -> u128 {
        (SystemTime::now() + self.clock_ahead)
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
    }

    fn fence(&self, key: &str, ttl: Duration) -> u64 {
        let counter = format!("fence:{key}");
        let expiry = match self.flaw {
            Flaw::FencingResetsWhenIdle => Some(ttl),
            Flaw::FencingExpiresAfterFiveTtls => Some(ttl * 5),
            _ => None,
        };
        self.store.0.incr(&counter, expiry)
    }

    /// The store key of a lock.
    fn key(&self, name: &LockName) -> String {
        let key = if self.flaw == Flaw::PathNormalised {
            normalised_path(name.as_str())
        } else {
            name.escaped()
        };
        if self.flaw == Flaw::NamespaceIgnored {
            key
        } else {
            format!("{}{key}", self.namespace)
        }
    }

    /// How long the store keeps a lease asked for `ttl`.
    fn stored_ttl(&self, ttl: Duration) -> Duration {
        if self.flaw == Flaw::EarlyExpiry {
            ttl.mul_f64(0.9)
        } else {
            ttl
        }
    }

    /// The classic timestamp lock: `SETNX key expiry`; if taken and the stored expiry passed by
    /// this client's clock, `GETSET key new-expiry` and win if the old value was the one read.
    fn getset_acquire(&self, key: &str, ttl: Duration) -> Option<String> {
        let store = &self.store.0;
        let now = self.clock_ms();
        let value = format!("{}-{}", now + ttl.as_millis() + 1, fastrand::u64(..));
        if store.set_nx(key, &value, None) {
            return Some(value);
        }
        let current = store.get(key)?;
        let expiry: u128 = current.split('-').next()?.parse().ok()?;
        if expiry >= now {
            return None;
        }
        (store.getset(key, &value).as_deref() == Some(current.as_str())).then_some(value)
    }
}

#[async_trait]
impl Backend for FlawedBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        self.request();
        let out = self.try_acquire_applied(req).await?;
        self.reply(&self.key(&req.name), out)
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        if self.flaw == Flaw::CancelLeavesEntryBehindOthers {
            let store = &self.store.0;
            let key = self.key(&req.name);
            let id = fastrand::u64(..);
            store
                .queues
                .lock()
                .unwrap()
                .entry(key.clone())
                .or_default()
                .push(id);
            let mut entry = QueueEntry {
                store,
                key,
                id,
                finished: false,
            };
            let r = poll_acquire(self, req, deadline, &Backoff::for_ttl(req.ttl)).await;
            entry.finished = true;
            return r;
        }
        if self.flaw == Flaw::SubscribesAfterFailedAttempt {
            let store = &self.store.0;
            let key = self.key(&req.name);
            loop {
                if let Some(a) = self.try_acquire(req).await? {
                    return Ok(Some(a));
                }
                // The holder's expiry comes back with the failed attempt.
                let expiry = store.expiry(&key);
                tokio::time::sleep(SUBSCRIBE_GAP).await;
                let releases = store.releases(&key);
                let released = releases.notified();
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return Ok(None);
                }
                let mut wake = now + SLOW_SAFETY_POLL;
                for t in [expiry, deadline].into_iter().flatten() {
                    wake = wake.min(t);
                }
                tokio::select! {
                    () = released => {}
                    () = tokio::time::sleep_until(wake) => {}
                }
            }
        }
        if self.flaw == Flaw::GrantedWaiterLeaks {
            if let Some(a) = self.try_acquire(req).await? {
                return Ok(Some(a));
            }
            let store = &self.store.0;
            let key = self.key(&req.name);
            let value = req.token.to_hex();
            store
                .grants
                .lock()
                .unwrap()
                .entry(key.clone())
                .or_default()
                .push_back((value.clone(), req.ttl));
            let _entry = GrantEntry {
                store,
                key: key.clone(),
                value: value.clone(),
            };
            let mut woken = false;
            loop {
                let releases = store.releases(&key);
                let released = releases.notified();
                if woken {
                    // The round trip that reads the queue after a release message.
                    tokio::time::sleep(GRANT_NOTICE).await;
                }
                if store.get(&key).as_deref() == Some(value.as_str()) {
                    // Granted by the queue at the release; valid from then.
                    let granted = store
                        .expiry(&key)
                        .map_or_else(Instant::now, |exp| exp - req.ttl);
                    return Ok(Some(Acquired::new(
                        self.lease(key, value, req.ttl),
                        granted,
                    )));
                }
                if store.set_nx(&key, &value, Some(req.ttl)) {
                    return Ok(Some(Acquired::new(
                        self.lease(key, value, req.ttl),
                        Instant::now(),
                    )));
                }
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return Ok(None);
                }
                // Woken by a release (granted to the head) or the holder's expiry.
                let mut wake = now + Duration::from_secs(1);
                for t in [store.expiry(&key), deadline].into_iter().flatten() {
                    wake = wake.min(t);
                }
                woken = tokio::select! {
                    () = released => true,
                    () = tokio::time::sleep_until(wake) => false,
                };
            }
        }
        if self.flaw == Flaw::HerdDeclaringQueue {
            let store = &self.store.0;
            let key = self.key(&req.name);
            let id = fastrand::u64(..);
            store
                .queues
                .lock()
                .unwrap()
                .entry(key.clone())
                .or_default()
                .push(id);
            let _entry = HerdEntry {
                store,
                key: key.clone(),
                id,
            };
            loop {
                let releases = store.releases(&key);
                let released = releases.notified();
                // Every waiter woken reads the queue: the herd.
                self.request();
                let head = store
                    .queues
                    .lock()
                    .unwrap()
                    .get(&key)
                    .and_then(|q| q.first().copied());
                if head == Some(id)
                    && let Some(a) = self.try_acquire(req).await?
                {
                    return Ok(Some(a));
                }
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return Ok(None);
                }
                let mut wake = now + Duration::from_secs(1);
                for t in [store.expiry(&key), deadline].into_iter().flatten() {
                    wake = wake.min(t);
                }
                tokio::select! {
                    () = released => {}
                    () = tokio::time::sleep_until(wake) => {}
                }
            }
        }
        if self.flaw == Flaw::PollsDeclaringNotify {
            loop {
                if let Some(a) = self.try_acquire(req).await? {
                    return Ok(Some(a));
                }
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return Ok(None);
                }
                let wake = now + FIXED_POLL;
                tokio::time::sleep_until(deadline.map_or(wake, |d| wake.min(d))).await;
            }
        }
        if self.flaw != Flaw::SpinningWaiter {
            // What every polling backend uses.
            return poll_acquire(self, req, deadline, &Backoff::for_ttl(req.ttl)).await;
        }
        loop {
            if let Some(a) = self.try_acquire(req).await? {
                return Ok(Some(a));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            tokio::task::yield_now().await;
        }
    }

    async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        if self.flaw == Flaw::GrantedWaiterLeaks {
            let grants = self.store.0.grants.lock().unwrap();
            return Ok(grants.get(&self.key(name)).map_or(0, |q| q.len()));
        }
        if !matches!(
            self.flaw,
            Flaw::CancelLeavesEntryBehindOthers | Flaw::HerdDeclaringQueue
        ) {
            return Err(Error::unsupported("the toy reports no queue"));
        }
        let queues = self.store.0.queues.lock().unwrap();
        Ok(queues.get(&self.key(name)).map_or(0, Vec::len))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        Ok(self.store.0.del(&self.key(name)))
    }

    fn describe(&self) -> String {
        format!("toy://{:?}", self.flaw)
    }
}

impl FlawedBackend {
    /// `try_acquire` as the store applies it, before its reply.
    async fn try_acquire_applied(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        let key = self.key(&req.name);
        let sent = Instant::now();
        let store = &self.store.0;
        let value = if self.flaw == Flaw::GetsetTimestamp {
            match self.getset_acquire(&key, req.ttl) {
                Some(value) => value,
                None => return Ok(None),
            }
        } else {
            let value = match self.flaw {
                Flaw::FixedValue => "locked".to_string(),
                _ => req.token.to_hex(),
            };
            // The key holds this request's own value: its earlier grant, whose reply was lost;
            // the retry gets it again (refreshed), except with the flaw (or a value that is not
            // the request's own).
            let own = || {
                !matches!(self.flaw, Flaw::RetryWaitsOnOwnGrant | Flaw::FixedValue)
                    && store.compare_and_expire(&key, &value, self.stored_ttl(req.ttl))
            };
            if self.flaw == Flaw::SetnxThenExpire {
                if !store.set_nx(&key, &value, None) && !own() {
                    return Ok(None);
                }
                // The second round trip: a holder cancelled or crashed here never sets the
                // expiry.
                tokio::time::sleep(Duration::from_millis(20)).await;
                store.expire(&key, req.ttl);
            } else if self.flaw == Flaw::SafetyTtlThenExpire {
                if !store.set_nx(&key, &value, Some(req.ttl * 3)) && !own() {
                    return Ok(None);
                }
                // The second round trip sets the real TTL; a holder cancelled here leaves the
                // safety TTL.
                tokio::time::sleep(Duration::from_millis(20)).await;
                store.expire(&key, req.ttl);
            } else if !store.set_nx(&key, &value, Some(self.stored_ttl(req.ttl))) && !own() {
                return Ok(None);
            }
            value
        };
        let lease = FlawedLease {
            backend: self.clone_client(),
            fencing: self.fence(&key, req.ttl),
            key,
            value: Mutex::new(value),
        };
        Ok(Some(Acquired::new(lease, sent)))
    }

    /// The reply to a request about `key`, applied on the store: `out`, or lost (the client
    /// hears `Unavailable`) when armed for that key.
    fn reply<T>(&self, key: &str, out: T) -> Result<T> {
        let mut armed = self.lose_reply_about.lock().unwrap();
        let hit = armed
            .as_ref()
            .is_some_and(|p| key.as_bytes().windows(p.len()).any(|w| w == p.as_slice()));
        if !hit {
            return Ok(out);
        }
        *armed = None;
        self.replies_lost.fetch_add(1, Ordering::Relaxed);
        Err(Error::unavailable(
            "toy store: the reply was lost",
            std::io::Error::from(std::io::ErrorKind::ConnectionReset),
        ))
    }

    /// Counts one request to the store.
    fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A lease on `key` holding `value`.
    fn lease(&self, key: String, value: String, ttl: Duration) -> FlawedLease {
        FlawedLease {
            backend: self.clone_client(),
            fencing: self.fence(&key, ttl),
            key,
            value: Mutex::new(value),
        }
    }

    fn clone_client(&self) -> FlawedBackend {
        FlawedBackend {
            store: self.store.clone(),
            flaw: self.flaw,
            caps: self.caps.clone(),
            clock_ahead: self.clock_ahead,
            namespace: self.namespace,
            requests: self.requests.clone(),
            lose_reply_about: self.lose_reply_about.clone(),
            replies_lost: self.replies_lost.clone(),
        }
    }
}

#[derive(Debug)]
struct FlawedLease {
    backend: FlawedBackend,
    key: String,
    value: Mutex<String>,
    fencing: u64,
}

impl FlawedLease {
    /// `release` as the store applies it, before its reply.
    async fn release_applied(&self) -> Result<()> {
        let b = &self.backend;
        b.request();
        let store = &b.store.0;
        let value = self.value.lock().unwrap().clone();
        if matches!(b.flaw, Flaw::ReadThenDelete | Flaw::ReadThenDeleteQuick) {
            if store.get(&self.key).as_deref() != Some(&value) {
                return Err(not_held());
            }
            // The second round trip: by now the lease may have run out and been taken over.
            let gap = if b.flaw == Flaw::ReadThenDelete {
                50
            } else {
                3
            };
            tokio::time::sleep(Duration::from_millis(gap)).await;
            store.del(&self.key);
            return Ok(());
        }
        if store.compare_and_delete(&self.key, &value) {
            Ok(())
        } else {
            Err(not_held())
        }
    }
}

impl FlawedLease {
    /// `extend` as the store applies it, before its reply.
    async fn extend_applied(&self, ttl: Duration) -> Result<Duration> {
        let b = &self.backend;
        b.request();
        let store = &b.store.0;
        let value = self.value.lock().unwrap().clone();
        match b.flaw {
            Flaw::NeverRenewed => Ok(ttl),
            Flaw::GetsetTimestamp => {
                if store.get(&self.key).as_deref() != Some(value.as_str()) {
                    return Err(not_held());
                }
                let new = format!(
                    "{}-{}",
                    b.clock_ms() + ttl.as_millis() + 1,
                    fastrand::u64(..)
                );
                store.set(&self.key, &new);
                *self.value.lock().unwrap() = new;
                Ok(ttl)
            }
            _ if store.compare_and_expire(&self.key, &value, b.stored_ttl(ttl)) => Ok(ttl),
            _ => Err(not_held()),
        }
    }
}

fn not_held() -> Error {
    Error::not_held("not this owner's lease")
}

#[async_trait]
impl Lease for FlawedLease {
    fn fencing_token(&self) -> Option<u64> {
        Some(self.fencing)
    }

    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        let out = self.extend_applied(ttl).await;
        self.backend.reply(&self.key, out)?
    }

    async fn release(&self) -> Result<()> {
        let out = self.release_applied().await;
        self.backend.reply(&self.key, out)?
    }
}

/// Loses a toy client's replies in-process.
struct ToyLosingReplies(FlawedBackend);

impl ReplyLoser for ToyLosingReplies {
    fn lose_next_reply(&self, pattern: &[u8]) {
        *self.0.lose_reply_about.lock().unwrap() = Some(pattern.to_vec());
    }

    fn disarm(&self) -> u64 {
        *self.0.lose_reply_about.lock().unwrap() = None;
        self.0.replies_lost.load(Ordering::Relaxed)
    }
}

struct FlawedHarness {
    store: Arc<ToyStoreHandle>,
    flaw: Flaw,
}

impl FlawedHarness {
    fn backend(&self, clock_ahead: Duration) -> FlawedBackend {
        self.backend_in(clock_ahead, "")
    }

    fn backend_in(&self, clock_ahead: Duration, namespace: &'static str) -> FlawedBackend {
        let mut caps = Capabilities::default();
        caps.force_release = true;
        caps.fencing = true;
        if matches!(
            self.flaw,
            Flaw::PollsDeclaringNotify | Flaw::SubscribesAfterFailedAttempt
        ) {
            caps.wait = lockcore::WaitKind::Notify;
        }
        if self.flaw == Flaw::HerdDeclaringQueue {
            caps.wait = lockcore::WaitKind::Notify;
            caps.fair = true;
        }
        FlawedBackend {
            store: self.store.clone(),
            flaw: self.flaw,
            caps,
            clock_ahead,
            namespace,
            requests: Arc::default(),
            lose_reply_about: Arc::default(),
            replies_lost: Arc::default(),
        }
    }
}

#[async_trait]
impl Harness for FlawedHarness {
    fn label(&self) -> String {
        format!("{:?}", self.flaw)
    }

    async fn client(&self) -> Result<Locker> {
        Ok(Locker::new(self.backend(Duration::ZERO)))
    }

    fn can_revoke(&self) -> bool {
        true
    }

    fn can_skew_clock(&self) -> bool {
        true
    }

    async fn client_with_clock_skew(&self, ahead: Duration) -> Result<Locker> {
        Ok(Locker::new(self.backend(ahead)))
    }

    fn can_open_other_namespace(&self) -> bool {
        true
    }

    async fn client_in_other_namespace(&self) -> Result<Locker> {
        Ok(Locker::new(self.backend_in(Duration::ZERO, "other:")))
    }

    fn can_count_requests(&self) -> bool {
        true
    }

    fn can_lose_replies(&self) -> bool {
        true
    }

    async fn client_losing_replies(&self) -> Result<(Locker, Arc<dyn ReplyLoser>)> {
        let b = self.backend(Duration::ZERO);
        Ok((Locker::new(b.clone_client()), Arc::new(ToyLosingReplies(b))))
    }

    async fn client_counting_requests(&self) -> Result<(Locker, RequestCount)> {
        let b = self.backend(Duration::ZERO);
        let requests = b.requests.clone();
        Ok((
            Locker::new(b),
            RequestCount::new(move || requests.load(Ordering::Relaxed)),
        ))
    }
}

/// Runs the whole suite against a backend with `flaw` and returns the failing scenarios.
fn failing(flaw: Flaw) -> BTreeSet<String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let harness = Arc::new(FlawedHarness {
        store: Arc::new(ToyStoreHandle(ToyStore::default())),
        flaw,
    });
    let report = rt.block_on(run_all(harness, false, |_| {}));
    let mut failed = BTreeSet::new();
    for r in report.results {
        match r.status {
            Status::Fail => {
                eprintln!(
                    "{flaw:?} fails {}: {}",
                    r.scenario,
                    r.reason.unwrap_or_default()
                );
                failed.insert(r.scenario);
            }
            Status::Pass | Status::Unsupported => {}
            Status::Skipped => panic!("{} was skipped", r.scenario),
        }
    }
    failed
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn correct_toy_backend_passes_everything() {
    assert_eq!(failing(Flaw::None), set(&[]));
}

#[test]
fn setnx_then_expire_is_caught() {
    assert_caught(
        Flaw::SetnxThenExpire,
        &["cancelled_acquire_leaves_nothing"],
        // A waiter dropped between its SETNX and its EXPIRE: hit when its poll falls in the
        // 20 ms before the drop.
        &["grant_at_drop_leaves_nothing"],
    );
}

/// `flaw` fails every scenario of `always`, and nothing outside `always` and `sometimes`.
fn assert_caught(flaw: Flaw, always: &[&str], sometimes: &[&str]) {
    let failed = failing(flaw);
    let (always, sometimes) = (set(always), set(sometimes));
    assert!(failed.is_superset(&always), "{failed:?} misses {always:?}");
    let allowed: BTreeSet<String> = always.union(&sometimes).cloned().collect();
    assert!(
        failed.is_subset(&allowed),
        "{failed:?} fails scenarios outside {allowed:?}"
    );
}

#[test]
fn fixed_lock_value_is_caught() {
    assert_eq!(
        failing(Flaw::FixedValue),
        set(&[
            "extend_after_expiry_not_held",
            // The lost guard's release on drop frees the next holder's lock.
            "extend_honours_ttl",
            // A retry after a lost reply cannot tell its own grant from anyone's: it waits.
            "lost_acquire_reply_is_retried_safely",
            "lost_signal_on_expiry",
            "mutual_exclusion_across_expiry",
            "no_resurrection",
            "release_racing_expiry_keeps_next_holder",
            "stale_release_keeps_new_holder",
        ])
    );
}

#[test]
fn read_then_delete_release_is_caught() {
    let failed = failing(Flaw::ReadThenDelete);
    // The delete, sent after the pause, frees the lock a racing client took at the expiry: the
    // suite races a client that polls hard, so this scenario catches it every time.
    let always = set(&["release_racing_expiry_keeps_next_holder"]);
    // The same race after the watchdog's release at the maximum hold time is hit only when a
    // polling waiter comes in between the GET and the DEL: on a loaded machine, not every run.
    let sometimes = set(&["auto_renew_stops_at_max_hold"]);
    assert!(failed.is_superset(&always), "{failed:?} misses {always:?}");
    let allowed: BTreeSet<String> = always.union(&sometimes).cloned().collect();
    assert!(
        failed.is_subset(&allowed),
        "{failed:?} fails scenarios outside {allowed:?}"
    );
}

#[test]
fn lease_never_renewed_is_caught() {
    assert_eq!(
        failing(Flaw::NeverRenewed),
        set(&[
            "auto_renew_keeps_lock",
            "auto_renew_stops_at_max_hold",
            "extend_after_expiry_not_held",
            "extend_honours_ttl",
            "lost_signal_on_revoke",
            "no_resurrection",
        ])
    );
}

#[test]
fn spinning_waiter_is_caught() {
    assert_eq!(
        failing(Flaw::SpinningWaiter),
        set(&["waiter_does_not_spin"])
    );
}

#[test]
fn getset_timestamp_lock_is_caught() {
    assert_eq!(
        failing(Flaw::GetsetTimestamp),
        // Its value is a new expiry each attempt: a retry after a lost reply cannot know its
        // own grant, and waits for it to expire.
        set(&[
            "lost_acquire_reply_is_retried_safely",
            "skewed_clock_cannot_steal"
        ])
    );
}

#[test]
fn fencing_counter_reset_when_idle_is_caught() {
    assert_eq!(
        failing(Flaw::FencingResetsWhenIdle),
        set(&["fencing_tokens_increase"])
    );
}

#[test]
fn fencing_counter_expiring_after_five_idle_ttls_is_caught() {
    assert_eq!(
        failing(Flaw::FencingExpiresAfterFiveTtls),
        set(&["fencing_tokens_increase"])
    );
}

#[test]
fn early_expiry_is_caught() {
    let failed = failing(Flaw::EarlyExpiry);
    // A client polling every millisecond meets the early end in these, every run.
    let always = set(&[
        "auto_renew_stops_at_max_hold",
        "expiry_frees_crashed_holder_after_ttl",
        "extend_honours_ttl",
    ]);
    // These take over with waiting lock() calls, whose backoff can sleep past the 10 % window.
    let sometimes = set(&["lost_signal_on_expiry", "mutual_exclusion_across_expiry"]);
    assert!(failed.is_superset(&always), "{failed:?} misses {always:?}");
    let allowed: BTreeSet<String> = always.union(&sometimes).cloned().collect();
    assert!(
        failed.is_subset(&allowed),
        "{failed:?} fails scenarios outside {allowed:?}"
    );
}

#[test]
fn quick_read_then_delete_release_is_caught() {
    let failed = failing(Flaw::ReadThenDeleteQuick);
    // Releases sent 1 to 3 ms before the expiry, with a racer polling every millisecond, put
    // the 3 ms gap across the expiry.
    let always = set(&["release_racing_expiry_keeps_next_holder"]);
    // As for the slow variant: hit when a polling waiter comes in between.
    let sometimes = set(&["auto_renew_stops_at_max_hold"]);
    assert!(failed.is_superset(&always), "{failed:?} misses {always:?}");
    let allowed: BTreeSet<String> = always.union(&sometimes).cloned().collect();
    assert!(
        failed.is_subset(&allowed),
        "{failed:?} fails scenarios outside {allowed:?}"
    );
}

#[test]
fn path_normalising_keys_are_caught() {
    assert_eq!(failing(Flaw::PathNormalised), set(&["hostile_names"]));
}

#[test]
fn polling_while_declaring_notify_is_caught() {
    assert_eq!(
        failing(Flaw::PollsDeclaringNotify),
        // A release just after the waiter's first attempt waits for the next poll too.
        set(&[
            "missed_wakeup_hands_over_promptly",
            "notify_hands_over_promptly"
        ])
    );
}

#[test]
fn safety_ttl_then_expire_is_caught() {
    assert_caught(
        Flaw::SafetyTtlThenExpire,
        &["cancelled_acquire_leaves_nothing"],
        // A waiter dropped between its SET NX and its PEXPIRE leaves three TTLs (60 s): hit
        // when its poll falls in the 20 ms before the drop.
        &["grant_at_drop_leaves_nothing"],
    );
}

#[test]
fn cancelled_waiter_behind_another_leaving_its_entry_is_caught() {
    assert_eq!(
        failing(Flaw::CancelLeavesEntryBehindOthers),
        set(&["cancelled_wait_leaves_nothing"])
    );
}

#[test]
fn wakeup_missed_before_subscribing_is_caught() {
    assert_eq!(
        failing(Flaw::SubscribesAfterFailedAttempt),
        set(&["missed_wakeup_hands_over_promptly"])
    );
}

#[test]
fn herd_behind_a_declared_queue_is_caught() {
    assert_eq!(
        failing(Flaw::HerdDeclaringQueue),
        set(&["hand_over_without_herd"])
    );
}

#[test]
fn retry_waiting_on_its_own_lost_grant_is_caught() {
    assert_eq!(
        failing(Flaw::RetryWaitsOnOwnGrant),
        set(&["lost_acquire_reply_is_retried_safely"])
    );
}

#[test]
fn lock_granted_to_a_dropped_waiter_is_caught() {
    assert_eq!(
        failing(Flaw::GrantedWaiterLeaks),
        set(&["grant_at_drop_leaves_nothing"])
    );
}

#[test]
fn namespace_left_out_of_keys_is_caught() {
    assert_eq!(
        failing(Flaw::NamespaceIgnored),
        set(&["namespaces_are_independent"])
    );
}
