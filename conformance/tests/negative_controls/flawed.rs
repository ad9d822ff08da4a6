//! The broken backends: each [`Flaw`] a classic mistake, over the toy store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use conformance::{Harness, ReplyLoser, RequestCount};
use lockcore::backend::{AcquireRequest, Acquired, Backend, Backoff, Lease, poll_acquire};
use lockcore::{Capabilities, Error, Instant, LockName, Locker, Result};

use super::toy::{GrantEntry, HerdEntry, QueueEntry, ToyStore};

/// The mistake a backend makes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Flaw {
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
/// [`Flaw::SubscribesAfterFailedAttempt`] (a slow subscribe round trip on a loaded network): 20
/// of the scenario's 30 ms of release offsets fall in it, so each of its two batches of 12
/// catches it all but once in 500,000 (at 10 ms a full run once missed it in both).
pub(super) const SUBSCRIBE_GAP: Duration = Duration::from_millis(20);

/// How long a waiter of [`Flaw::GrantedWaiterLeaks`] takes to see it was granted the lock
/// after a release message (the round trip that reads the queue).
pub(super) const GRANT_NOTICE: Duration = Duration::from_millis(10);

/// The safety poll of [`Flaw::SubscribesAfterFailedAttempt`].
pub(super) const SLOW_SAFETY_POLL: Duration = Duration::from_secs(2);

/// The fixed poll interval of [`Flaw::PollsDeclaringNotify`].
pub(super) const FIXED_POLL: Duration = Duration::from_millis(435);

/// What [`Flaw::PathNormalised`] makes of a name: the segments between `/`, without `.` and
/// empty ones, `..` removing the segment before it.
pub(super) fn normalised_path(name: &str) -> String {
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
pub(super) struct ToyStoreHandle(pub(super) ToyStore);

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
            let id = store.enqueue(&key);
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
                req.waiting.mark();
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
            let id = store.enqueue(&key);
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
                req.waiting.mark();
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
            req.waiting.mark();
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

pub(super) struct FlawedHarness {
    store: Arc<ToyStoreHandle>,
    flaw: Flaw,
}

impl FlawedHarness {
    /// A harness of clients with `flaw` over a new toy store.
    pub(super) fn new(flaw: Flaw) -> Self {
        FlawedHarness {
            store: Arc::new(ToyStoreHandle(ToyStore::default())),
            flaw,
        }
    }

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
        // Counted where a count can catch a flaw: the declared queue that herds, and the correct
        // toy (the figure a backend without a queue reports). Every other flaw's herd figure
        // would catch nothing and cost seconds of polling waiters.
        matches!(self.flaw, Flaw::HerdDeclaringQueue | Flaw::None)
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
