//! locksmith backend for Redlock: one lock over N independent Redis masters (`redlock://`,
//! `redlocks://` with TLS), won by a majority of them.
//!
//! Every node runs the single-node protocol of `lock-redis` ([`lock_redis::node`]: the same
//! acquire, extend and release scripts, key layout, name escaping and connection setup); this
//! crate adds the quorum on top.
//!
//! # The algorithm
//!
//! * **Acquire**: the acquire script (`SET lock token NX PX ttl`, no fencing counter) is sent to
//!   every node at once, each answer awaited at most `node_timeout_ms`. The lock is won when a
//!   majority (`N/2 + 1`) answered "won" and the validity `ttl - elapsed - drift` is still
//!   positive (drift: 1 % of the TTL + 2 ms, declared in [`Capabilities::drift_ppm`] and
//!   [`Capabilities::drift_fixed`]; the lease's validity deadline is `sent_at + ttl - drift`,
//!   with `sent_at` taken before the first request went out). The call returns as soon as a
//!   majority answered: a slow or dead node costs nothing while the others answer.
//! * **On failure** the attempt is undone on every node that may hold its key — the nodes that
//!   said "won" *and* those whose answer was lost or late — before anything else happens, so no
//!   partial key is left to split later votes. Inside a waiting `lock()` the undo is an
//!   owner-checked `PEXPIRE 1` (silent: waking every waiter for a key that was never a lock
//!   would make waiters storm), for `try_lock` and cancelled calls it is the owner-checked
//!   delete that also publishes. A cancelled call's undo runs in the request's background
//!   (`Locker::flush` waits for it).
//! * **Retry**: an attempt that won some nodes but not a majority was a split vote; it retries
//!   after a random delay that grows with consecutive splits (exponential backoff with full
//!   jitter), so contenders spread out instead of colliding again (no split-vote livelock). An
//!   attempt that won nothing waits for a notification.
//! * **Waiting** by notification: a release publishes on each node's release channel; a waiter
//!   subscribes on every node (lock-redis's pub/sub subscriptions, one connection per node per
//!   client) and wakes on the first message (a release names itself in its message, the same
//!   on every master, so the copies from the other masters wake no second vote of that client),
//!   or, for one waiter per client (expiry publishes nothing; one waiter, not all, comes back),
//!   at the moment the holder's keys expire on a majority (from the `PTTL`s the failed attempt
//!   saw), or at a jittered safety-net poll
//!   (`poll_ms`). Subscriptions linger a few seconds after a wait, so a busy lock does not pay
//!   `SUBSCRIBE`/`UNSUBSCRIBE` on every wait.
//! * **Extend**: owner-checked compare-and-`PEXPIRE` on every node; it succeeds only when a
//!   majority confirmed within the validity, which is recomputed from the moment the renewal was
//!   sent (confirmations are awaited that long, not only one node timeout). When a majority refuses, the lease is reported `NotHeld` (the guard's lost signal
//!   fires); when too few nodes answer, the renewal fails and the contract fires the lost signal
//!   at the validity deadline.
//! * **Release**: owner-checked compare-and-delete (publishing on the node's channel) sent to
//!   every node at once; released when a majority confirmed (the rest finish in the
//!   background). Confirmations are awaited until the lease's validity ends (at least one node
//!   timeout), so a lock that sits on exactly a majority is not reported unreleased because one
//!   of its masters answered late.
//! * **Nodes down**: with a minority down, locks work as before; with a majority down, attempts
//!   fail with `Unavailable` at once (a node's failure counts when its connection errs or its
//!   per-node timeout passes). Nodes that were down at connect time, or later, are reconnected
//!   in the background; `connect` itself needs a majority reachable.
//!
//! # What Redlock does not give you
//!
//! Read this before choosing Redlock: it is a lock for efficiency (avoiding duplicate work), not
//! for correctness. Where two holders at once would corrupt data, use a backend with fencing
//! tokens and have the resource check them.
//!
//! * **No fencing tokens.** A master that restarts without persistence forgets both the lock
//!   keys and any counter, so no per-node counter stays monotonic; the capability is declared
//!   absent. Where a paused or slow holder must not corrupt a resource, use a backend with
//!   fencing (ZooKeeper, etcd, PostgreSQL/MySQL lease, single Redis).
//! * **Two holders after a node restarts empty** before the TTL ends: the node votes again, and
//!   a new client can win a majority with it while the old holder still believes it holds the
//!   lock. The fault test `restarted_empty_master_allows_a_second_holder` (`tests/faults.rs`)
//!   shows it. Run the masters
//!   with `appendonly yes` + `appendfsync always`, or keep a restarted master out of service for
//!   one max TTL ("delayed restart"), to avoid it.
//! * **Two holders after a clock jump** on a node: a node whose clock runs fast expires the key
//!   early (simulated with `PEXPIRE`, as a forward jump would). The fault test
//!   `early_expiry_on_a_master_allows_a_second_holder` (`tests/faults.rs`) shows it; the same
//!   test shows that with the key on all five masters one early expiry is not enough.
//! * **The node timeout is a trade-off** (see the URL section): short, a hung master costs
//!   little but a healthy master on a busy machine loses its vote (uncontended acquisitions
//!   refused); long, more of the validity can go to waiting. The default (a tenth of the TTL,
//!   50 ms..1 s) keeps at least 90 % of the validity.
//! * Timing assumptions: the validity is computed on the client's monotonic clock with the
//!   declared drift margin; a GC pause or a stopped process can outlive the validity without
//!   the holder noticing (no fencing, see above).
//!
//! # URL
//!
//! `redlock[s]://[[user]:password@]host[:port],[[user]:password@]host[:port],...[/db][?params]`:
//! each comma-separated node has its own user name and password (percent-encoded; a `,` in a
//! password is `%2C`). The path (database) and the query parameters apply to every node and are
//! those of the Redis backend (`namespace`, `tls_ca`, `poll_ms`, `connect_timeout_ms`,
//! `response_timeout_ms`), plus:
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `node_timeout_ms` | a tenth of the TTL, within 50 ms..1 s | how long one node may take to answer an acquire before its vote counts as lost |
//!
//! **The node timeout.** The Redlock specification asks for a per-node timeout that is small
//! compared with the TTL: a dead or stopped node then costs an attempt little, and the validity
//! left after the vote stays close to the TTL. Without `node_timeout_ms` it is a tenth of each
//! lock's TTL, at least 50 ms and at most 1 s (100 ms for a 1 s TTL, 1 s for 10 s and more):
//! at most 10 % of the validity goes to waiting for votes, and a healthy master on a busy
//! machine (where a reply can take tens of milliseconds) does not lose its vote. A fixed short
//! timeout (the earlier default was 50 ms) loses votes under load and turns uncontended
//! acquisitions into refusals; set `node_timeout_ms` only to trade that for a faster give-up on
//! hung masters. The node timeout bounds votes only: an extend waits for a majority of
//! confirmations until its new validity would end, and a release until the lease's validity
//! ends (both at least one node timeout), because there a late confirmation is still good.
//!
//! `min_replicas` is refused (masters of a Redlock have no replicas to wait for). A node listed
//! twice is refused (each master votes once), also under another name (`localhost` and
//! `127.0.0.1`, two DNS names): masters are told apart by the `run_id` their server reports
//! (`INFO server`, random per redis-server process). Two nodes on one server fail `connect` with
//! `InvalidConfig`; found when a master unreachable at connect time connects later, the late
//! node never votes and every attempt of the client fails with `InvalidConfig` (held locks
//! still renew and release). A master whose user may not run `INFO` is not checked (a warning
//! says so). Passwords never appear in `Debug`,
//! [`Backend::describe`], logs or errors.
#![deny(missing_docs)]

mod config;
mod inspect;
mod registration;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lock_redis::node::{self, Conn, ExpiryWatch, Keys, Node, NodeAttempt, Waiting};
use lockcore::backend::{AcquireRequest, Acquired, Backend, Background, Backoff, Lease};
use lockcore::{Capabilities, Error, ErrorKind, Instant, LockInfo, LockName, Result, WaitKind};

pub use crate::config::Config;
use crate::config::Parsed;
pub use crate::registration::REGISTRATION;

/// How long an idle name's subscriptions linger before they are dropped.
const SUBSCRIPTION_LINGER: Duration = Duration::from_secs(3);
/// The least time between two background reconnection attempts of one node.
const RECONNECT_EVERY: Duration = Duration::from_millis(250);

fn lock_mutex<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One master: its configuration and, once connected, its client.
struct Slot {
    /// Its place in the URL (0-based), for messages.
    index: usize,
    cfg: node::Config,
    connect_timeout: Duration,
    response_timeout: Duration,
    node: Mutex<Option<Arc<Node>>>,
    reconnecting: AtomicBool,
    last_try: Mutex<Option<Instant>>,
    /// What all slots of one client share to tell their servers apart.
    identity: Arc<Identity>,
}

/// The masters' identities, shared by the slots of one client: a vote counts once per
/// redis-server process, so two entries of the URL that reach one server (`localhost` and
/// `127.0.0.1`, two DNS names) must not both vote.
struct Identity {
    /// Every slot, to compare a node connected late with the others.
    slots: OnceLock<Vec<Weak<Slot>>>,
    /// Held while a late node is identified and installed: two slots reaching one server at
    /// once must not both pass the check before either is installed.
    checking: tokio::sync::Mutex<()>,
    /// Why attempts are refused: set when a node connected late is the server of another slot.
    duplicate: OnceLock<String>,
}

/// The message of a master listed twice.
fn same_server<'a>(mut a: &'a Slot, mut b: &'a Slot, run_id: &str) -> String {
    if b.index < a.index {
        std::mem::swap(&mut a, &mut b);
    }
    format!(
        "nodes {} ({}) and {} ({}) are the same Redis server (run_id {run_id}): each master must \
         be listed once, or it votes twice and a majority of the list is not a majority of the \
         servers",
        a.index + 1,
        a.cfg.redacted(),
        b.index + 1,
        b.cfg.redacted(),
    )
}

/// The `run_id` of `node`'s server, or `None` (with a warning) when it would not say: a user
/// without the right to run `INFO` cannot be told apart, and is not refused for it.
async fn run_id_of(slot: &Slot, node: &Node) -> Option<String> {
    let mut conn = node.conn();
    let asked = node::server_run_id(&mut conn);
    match tokio::time::timeout(slot.response_timeout, asked).await {
        Ok(Ok(id)) => Some(id),
        Ok(Err(e)) => {
            tracing::warn!(node = %slot.cfg.redacted(), error = %e, "cannot tell which Redis server this master is (INFO server); it is not checked against the others");
            None
        }
        Err(_) => {
            tracing::warn!(node = %slot.cfg.redacted(), "INFO server timed out; this master is not checked against the others");
            None
        }
    }
}

impl Slot {
    /// The connected node, or `None` (and a background reconnection is started, unless this
    /// slot turned out to be another slot's server).
    fn get(self: &Arc<Self>) -> Option<Arc<Node>> {
        if let Some(n) = lock_mutex(&self.node).as_ref() {
            return Some(n.clone());
        }
        if self.identity.duplicate.get().is_none() {
            self.reconnect();
        }
        None
    }

    fn reconnect(self: &Arc<Self>) {
        {
            let mut last = lock_mutex(&self.last_try);
            if last.is_some_and(|t| t.elapsed() < RECONNECT_EVERY) {
                return;
            }
            if self.reconnecting.swap(true, Ordering::AcqRel) {
                return;
            }
            *last = Some(Instant::now());
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.reconnecting.store(false, Ordering::Release);
            return;
        };
        let slot = self.clone();
        rt.spawn(async move {
            if let Ok(Ok(n)) =
                tokio::time::timeout(slot.connect_timeout, Node::connect(&slot.cfg)).await
            {
                slot.install(Arc::new(n)).await;
            }
            slot.reconnecting.store(false, Ordering::Release);
        });
    }

    /// Installs a node connected after `connect` returned, unless its server is the one of
    /// another connected slot: then it never votes, and every attempt of this client fails
    /// with `InvalidConfig` (the configuration is wrong; held locks still renew and release).
    async fn install(self: &Arc<Self>, node: Arc<Node>) {
        let _checking = self.identity.checking.lock().await;
        if let Some(id) = run_id_of(self, &node).await {
            let others: Vec<(Arc<Slot>, Arc<Node>)> = self
                .identity
                .slots
                .get()
                .into_iter()
                .flatten()
                .filter_map(Weak::upgrade)
                .filter(|s| s.index != self.index)
                .filter_map(|s| {
                    let n = lock_mutex(&s.node).clone()?;
                    Some((s, n))
                })
                .collect();
            // Asked now, not remembered from connect: a server restarted since has a new one.
            let ids = futures::future::join_all(others.iter().map(|(s, n)| run_id_of(s, n))).await;
            if let Some((other, _)) = others
                .iter()
                .zip(&ids)
                .find(|(_, other_id)| other_id.as_deref() == Some(id.as_str()))
                .map(|(o, _)| o)
            {
                let msg = same_server(other, self, &id);
                tracing::error!("{msg}; this Redlock client refuses every lock from now on");
                let _ = self.identity.duplicate.set(msg);
                return;
            }
        }
        *lock_mutex(&self.node) = Some(node);
    }
}

/// The lingering subscriptions of one lock name: at most one [`Waiting`] per node.
struct NameSubs {
    channel: String,
    waitings: Vec<OnceLock<Waiting>>,
    /// The releases (their messages) a waiter of this client has already acted on: one
    /// release reaches every master, and each copy would wake another waiter into a vote.
    acted_on: Mutex<VecDeque<Arc<str>>>,
    joining: Vec<AtomicBool>,
    users: AtomicUsize,
    idle_since: Mutex<Instant>,
}

/// One waiter's use of a [`NameSubs`]; dropping it marks the entry idle.
struct SubsUse(Arc<NameSubs>);

impl Drop for SubsUse {
    fn drop(&mut self) {
        *lock_mutex(&self.0.idle_since) = Instant::now();
        self.0.users.fetch_sub(1, Ordering::AcqRel);
    }
}

type Notified<'a> = Pin<Box<tokio::sync::futures::Notified<'a>>>;

/// How many recent releases a client remembers having acted on, per lock name.
const ACTED_ON_MEMORY: usize = 16;

/// The message a Redlock release publishes on every master: the same on all of them, and
/// different for every release (see [`NameSubs::first_to_act`]).
fn release_message() -> String {
    format!("{RELEASE_PREFIX}{:016x}", fastrand::u64(..))
}

/// What marks a release message as named by [`release_message`].
const RELEASE_PREFIX: &str = "release:";

/// A waiter's armed notifications: one per subscribed master, with that master's channel.
struct Armed<'a> {
    notified: Vec<Notified<'a>>,
    channels: Vec<&'a lock_redis::node::Channel>,
}

impl Armed<'_> {
    /// A new notification for master `i` in place of the one that fired (the others stay
    /// registered, so nothing published meanwhile is missed).
    fn rearm(&mut self, i: usize) {
        let mut n = Box::pin(self.channels[i].notify.notified());
        n.as_mut().enable();
        self.notified[i] = n;
    }
}

impl NameSubs {
    /// One enabled notification future per subscribed node, after discarding a permit left by a
    /// message that arrived while nobody waited (it would wake this waiter for nothing).
    fn arm(&self) -> Armed<'_> {
        let channels: Vec<_> = self
            .waitings
            .iter()
            .filter_map(OnceLock::get)
            .map(Waiting::channel)
            .collect();
        let notified = channels
            .iter()
            .map(|c| {
                let mut n = Box::pin(c.notify.notified());
                if n.as_mut().enable() {
                    n = Box::pin(c.notify.notified());
                    n.as_mut().enable();
                }
                n
            })
            .collect();
        Armed { notified, channels }
    }

    /// Whether the waiter woken by `message` should vote: not when a waiter of this client
    /// already acted on the same release (a copy from another master). A message this client
    /// cannot attribute (unnamed, or unknown after a reconnection) always counts: skipping a
    /// release could leave every waiter asleep until its poll. Safe to skip a copy: the waiter
    /// that acted on it read the message before voting, so its vote came after that release.
    fn first_to_act(&self, message: Option<Arc<str>>) -> bool {
        let Some(message) = message.filter(|m| m.starts_with(RELEASE_PREFIX)) else {
            return true;
        };
        let mut acted_on = lock_mutex(&self.acted_on);
        if acted_on.contains(&message) {
            return false;
        }
        if acted_on.len() == ACTED_ON_MEMORY {
            acted_on.pop_front();
        }
        acted_on.push_back(message);
        true
    }
}

/// Waits for the first of `armed` (forever when empty); returns its index.
async fn first_of(armed: &mut Armed<'_>) -> usize {
    if armed.notified.is_empty() {
        return std::future::pending().await;
    }
    futures::future::select_all(armed.notified.iter_mut())
        .await
        .1
}

struct Inner {
    cfg: Parsed,
    slots: Vec<Arc<Slot>>,
    identity: Arc<Identity>,
    quorum: usize,
    caps: Capabilities,
    waits: Mutex<HashMap<String, Arc<NameSubs>>>,
    sweeper: AtomicBool,
}

/// A Redlock client over N independent Redis masters. Every [`RedlockBackend::connect`] makes a
/// new, independent client (one command connection per master, plus one pub/sub connection per
/// master opened on the first wait). Clones share them.
#[derive(Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("url", &self.inner.cfg.redacted)
            .field("quorum", &self.inner.quorum)
            .finish()
    }
}

type NodeFuture<T> = Pin<Box<dyn Future<Output = (usize, Result<T>)> + Send>>;

/// How a failed attempt undoes its keys.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Undo {
    /// Owner-checked delete that publishes (waiters re-check).
    Release,
    /// Owner-checked `PEXPIRE 1`: gone within a millisecond, wakes nobody.
    Silent,
}

enum Attempt {
    Won(Acquired),
    Lost {
        /// Some node said "won": a split vote, retried after a random delay.
        split: bool,
        /// When the keys of other holders will have expired on enough nodes for a majority.
        free_in: Option<Duration>,
    },
}

impl RedlockBackend {
    /// Parses `url` (see the [crate docs](crate) for its form and parameters) and connects to
    /// every master at once. Masters that cannot be reached are reconnected in the background.
    ///
    /// Cancel safety: dropping the future closes whatever connections it had opened.
    ///
    /// # Errors
    /// `InvalidConfig` for a malformed URL (never quoted), an unreadable `tls_ca` file, or two
    /// nodes that reach the same Redis server (the same `run_id`, under two names); `Backend`
    /// when a master refuses the connection (wrong password); `Unavailable` when fewer than a
    /// majority of the masters can be reached.
    pub async fn connect(url: &str) -> Result<RedlockBackend> {
        Self::from_config(Config::parse(url)?).await
    }

    /// Connects from a [`Config`] (deserialized from a config file, say), validated exactly as
    /// a URL is ([`Config::validate`]).
    ///
    /// Cancel safety: as [`RedlockBackend::connect`].
    ///
    /// # Errors
    /// As [`RedlockBackend::connect`].
    pub async fn from_config(config: Config) -> Result<RedlockBackend> {
        let cfg = Parsed::from_config(config)?;
        let identity = Arc::new(Identity {
            slots: OnceLock::new(),
            checking: tokio::sync::Mutex::new(()),
            duplicate: OnceLock::new(),
        });
        let slots: Vec<Arc<Slot>> = cfg
            .nodes
            .iter()
            .enumerate()
            .map(|(index, c)| {
                Arc::new(Slot {
                    index,
                    cfg: c.clone(),
                    connect_timeout: cfg.connect_timeout,
                    response_timeout: cfg.response_timeout,
                    node: Mutex::new(None),
                    reconnecting: AtomicBool::new(false),
                    last_try: Mutex::new(Some(Instant::now())),
                    identity: identity.clone(),
                })
            })
            .collect();
        let _ = identity
            .slots
            .set(slots.iter().map(Arc::downgrade).collect());
        let results = futures::future::join_all(slots.iter().map(|s| async move {
            let node = match tokio::time::timeout(s.connect_timeout, Node::connect(&s.cfg)).await {
                Ok(r) => r?,
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        "connecting timed out (connect_timeout_ms)",
                    ));
                }
            };
            let run_id = run_id_of(s, &node).await;
            Ok((node, run_id))
        }))
        .await;
        let quorum = cfg.quorum();
        let mut up = 0;
        let mut last_err = None;
        // Which slot reached which server: one server under two names would vote twice.
        let mut servers: HashMap<String, usize> = HashMap::new();
        for (i, (slot, r)) in slots.iter().zip(results).enumerate() {
            match r {
                Ok((n, run_id)) => {
                    if let Some(id) = run_id {
                        if let Some(&first) = servers.get(&id) {
                            return Err(Error::invalid_config(same_server(
                                &slots[first],
                                slot,
                                &id,
                            )));
                        }
                        servers.insert(id, i);
                    }
                    *lock_mutex(&slot.node) = Some(Arc::new(n));
                    up += 1;
                }
                Err(e) if e.kind() == ErrorKind::Unavailable => {
                    tracing::warn!(node = %slot.cfg.redacted(), error = %e, "redlock master unreachable; reconnecting in the background");
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        if up < quorum {
            let msg = format!(
                "only {up} of {} Redis masters reachable, a majority ({quorum}) is needed",
                slots.len()
            );
            return Err(match last_err {
                Some(e) => Error::unavailable(msg, e),
                None => Error::new(ErrorKind::Unavailable, msg),
            });
        }
        let caps = capabilities(&cfg);
        Ok(RedlockBackend {
            inner: Arc::new(Inner {
                cfg,
                slots,
                identity,
                quorum,
                caps,
                waits: Mutex::new(HashMap::new()),
                sweeper: AtomicBool::new(false),
            }),
        })
    }

    /// How many masters are configured.
    pub fn node_count(&self) -> usize {
        self.inner.slots.len()
    }

    /// How many masters must agree: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// The Redis key that holds the lock `name` on every master (for operators and tests).
    pub fn lock_key(&self, name: &LockName) -> String {
        Keys::new(&self.inner.cfg.namespace, name).lock
    }

    /// How many lock names this client keeps release subscriptions for (they linger a few
    /// seconds after the last wait).
    pub fn waited_names(&self) -> usize {
        lock_mutex(&self.inner.waits).len()
    }

    /// Sends `PING` to every master at once and returns when all answered, each within the
    /// per-node timeout (for measuring the round trip).
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// `Unavailable` or `Backend` when a master fails.
    pub async fn ping(&self) -> Result<()> {
        let results = self
            .inner
            .per_node(self.inner.cfg.response_timeout, |mut c| async move {
                node::ping(&mut c).await
            })
            .collect::<Vec<_>>()
            .await;
        results.into_iter().try_for_each(|(_, r)| r)
    }

    /// Deletes the lock `name` on every master whoever holds it, as an administrator would, and
    /// wakes its waiters. Returns whether any master held it.
    /// [`Locker::force_release`](lockcore::Locker::force_release) does the same on every
    /// backend.
    ///
    /// Cancel safety: dropping the future may have deleted the lock on some masters.
    ///
    /// # Errors
    /// `Unavailable` when fewer than a majority of the masters answered.
    pub async fn force_release(&self, name: &LockName) -> Result<bool> {
        let keys = Arc::new(Keys::new(&self.inner.cfg.namespace, name));
        let results = self
            .inner
            .per_node(self.inner.cfg.response_timeout, move |mut c| {
                let keys = keys.clone();
                async move { node::revoke(&mut c, &keys).await }
            })
            .collect::<Vec<_>>()
            .await;
        let answered = results.iter().filter(|(_, r)| r.is_ok()).count();
        if answered < self.inner.quorum {
            return Err(self.inner.no_majority(answered, results.into_iter()));
        }
        Ok(results.into_iter().any(|(_, r)| matches!(r, Ok(true))))
    }

    /// One attempt on every node (see the crate docs), undone by `undo` when it fails.
    async fn attempt(
        &self,
        req: &AcquireRequest,
        keys: &Arc<Keys>,
        token: &Arc<str>,
        undo: Undo,
    ) -> Result<Attempt> {
        let inner = &self.inner;
        if let Some(msg) = inner.identity.duplicate.get() {
            return Err(Error::invalid_config(msg.clone()));
        }
        let n = inner.slots.len();
        let ttl = req.ttl;
        // Armed until the attempt is decided: a call dropped with requests in flight releases
        // on every node in the background.
        let mut cancel_guard = UndoOnDrop {
            inner: inner.clone(),
            keys: keys.clone(),
            token: token.clone(),
            background: req.background.clone(),
            ttl,
            armed: true,
        };
        let holder: Arc<str> = req.holder.encode().into();
        let sent_at = Instant::now();
        let mut pending = {
            let (keys, token) = (keys.clone(), token.clone());
            inner.per_node(inner.cfg.node_timeout(ttl), move |mut c| {
                let (keys, token, holder) = (keys.clone(), token.clone(), holder.clone());
                async move { node::acquire(&mut c, &keys, &token, &holder, ttl, false).await }
            })
        };
        let mut others = vec![false; n];
        let (mut won, mut held, mut failed) = (0, 0, 0);
        let mut pttls = Vec::new();
        let mut errors: Vec<(usize, Result<()>)> = Vec::new();
        while let Some((i, r)) = pending.next().await {
            match r {
                Ok(NodeAttempt::Won { .. }) => won += 1,
                Ok(NodeAttempt::Held { pttl }) => {
                    others[i] = true;
                    held += 1;
                    pttls.push(pttl.unwrap_or(ttl));
                }
                Err(e) => {
                    failed += 1;
                    errors.push((i, Err(e)));
                }
            }
            if won >= inner.quorum || held + failed > n - inner.quorum {
                break;
            }
        }
        // Late answers are still ours to wait for (a late "won" is undone below or released
        // with the lease); the caller does not wait for them.
        inner.drain(pending, &req.background);
        if won >= inner.quorum && sent_at.elapsed() + inner.caps.drift_margin(ttl) < ttl {
            cancel_guard.armed = false;
            let lease = RedlockLease {
                inner: inner.clone(),
                keys: keys.clone(),
                token: token.clone(),
                background: req.background.clone(),
                ttl: Mutex::new(ttl),
                valid_until: Mutex::new(sent_at + ttl - inner.caps.drift_margin(ttl)),
            };
            return Ok(Attempt::Won(Acquired::new(lease, sent_at)));
        }
        // Undo on every node that may hold our key, including those whose answer was lost,
        // and only then go on: a retry with the same token must not meet a late undo.
        let targets: Vec<usize> = (0..n).filter(|i| !others[*i]).collect();
        if !targets.is_empty() {
            let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
            let task = inner
                .clone()
                .undo(keys.clone(), token.clone(), targets, undo, ttl);
            req.background.spawn(async move {
                task.await;
                let _ = done_tx.send(());
            });
            cancel_guard.armed = false;
            let _ = done_rx.await;
        }
        cancel_guard.armed = false;
        if n - failed < inner.quorum {
            return Err(inner.no_majority(n - failed, errors.into_iter()));
        }
        // The holder's keys must expire on enough nodes for a majority to be free.
        let need = inner.quorum as isize - (n - held) as isize;
        let free_in = (need > 0).then(|| {
            pttls.sort();
            pttls[(need as usize - 1).min(pttls.len() - 1)]
        });
        Ok(Attempt::Lost {
            split: won > 0,
            free_in,
        })
    }

    /// Subscribes to the release channel of `keys` on every connected node, or reuses the
    /// lingering subscriptions of an earlier wait.
    async fn subscribe(&self, keys: &Keys, ttl: Duration) -> SubsUse {
        let inner = &self.inner;
        let entry = {
            let mut waits = lock_mutex(&inner.waits);
            let entry = waits
                .entry(keys.channel.clone())
                .or_insert_with(|| {
                    Arc::new(NameSubs {
                        channel: keys.channel.clone(),
                        waitings: (0..inner.slots.len()).map(|_| OnceLock::new()).collect(),
                        acted_on: Mutex::default(),
                        joining: (0..inner.slots.len())
                            .map(|_| AtomicBool::new(false))
                            .collect(),
                        users: AtomicUsize::new(0),
                        idle_since: Mutex::new(Instant::now()),
                    })
                })
                .clone();
            entry.users.fetch_add(1, Ordering::AcqRel);
            entry
        };
        self.start_sweeper();
        let mut joins = Vec::new();
        for (i, slot) in inner.slots.iter().enumerate() {
            if entry.waitings[i].get().is_some() || entry.joining[i].swap(true, Ordering::AcqRel) {
                continue;
            }
            let Some(node) = slot.get() else {
                entry.joining[i].store(false, Ordering::Release);
                continue;
            };
            // Joined in a task: a slow node's subscription completes (and is used by the next
            // wait) without holding this waiter up past the node timeout.
            let (entry, timeout) = (entry.clone(), inner.cfg.connect_timeout);
            joins.push(tokio::spawn(async move {
                let joined =
                    tokio::time::timeout(timeout, node.subscriptions().join(&entry.channel)).await;
                match joined {
                    Ok(Ok(w)) => {
                        let _ = entry.waitings[i].set(w);
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "SUBSCRIBE on a redlock master failed")
                    }
                    Err(_) => tracing::debug!("SUBSCRIBE on a redlock master timed out"),
                }
                entry.joining[i].store(false, Ordering::Release);
            }));
        }
        if !joins.is_empty() {
            let _ = tokio::time::timeout(
                inner.cfg.node_timeout(ttl),
                futures::future::join_all(joins),
            )
            .await;
        }
        SubsUse(entry)
    }

    /// Drops subscriptions of names nobody waited for in [`SUBSCRIPTION_LINGER`].
    fn start_sweeper(&self) {
        if self.inner.sweeper.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SUBSCRIPTION_LINGER).await;
                let Some(inner) = weak.upgrade() else { return };
                lock_mutex(&inner.waits).retain(|_, e| {
                    e.users.load(Ordering::Acquire) > 0
                        || lock_mutex(&e.idle_since).elapsed() < SUBSCRIPTION_LINGER
                });
            }
        });
    }

    fn split_delay(&self, splits: u32, ttl: Duration) -> Duration {
        // At least the 1 ms after which silently undone keys are gone.
        let backoff = Backoff {
            initial: Duration::from_millis(2),
            max: Backoff::for_ttl(ttl).max,
        };
        Duration::from_millis(1) + backoff.delay(splits.saturating_sub(1))
    }
}

/// Releases on every node when a call is dropped mid-attempt.
struct UndoOnDrop {
    inner: Arc<Inner>,
    keys: Arc<Keys>,
    token: Arc<str>,
    background: Background,
    ttl: Duration,
    armed: bool,
}

impl Drop for UndoOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let all = (0..self.inner.slots.len()).collect();
            self.background.spawn(self.inner.clone().undo(
                self.keys.clone(),
                self.token.clone(),
                all,
                Undo::Release,
                self.ttl,
            ));
        }
    }
}

impl Inner {
    /// Runs `op` on every node at once, each bounded by `timeout`; a node that is not connected
    /// answers `Unavailable` at once.
    fn per_node<T, F, Fut>(&self, timeout: Duration, op: F) -> FuturesUnordered<NodeFuture<T>>
    where
        T: Send + 'static,
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, slot)| -> NodeFuture<T> {
                match slot.get() {
                    Some(node) => {
                        let fut = op(node.conn());
                        Box::pin(async move {
                            let r = match tokio::time::timeout(timeout, fut).await {
                                Ok(r) => r,
                                Err(_) => Err(Error::new(
                                    ErrorKind::Unavailable,
                                    format!("a Redis master did not answer within {timeout:?}"),
                                )),
                            };
                            (i, r)
                        })
                    }
                    None => Box::pin(async move {
                        (
                            i,
                            Err(Error::new(
                                ErrorKind::Unavailable,
                                "a Redis master is not connected (reconnecting)",
                            )),
                        )
                    }),
                }
            })
            .collect()
    }

    /// Lets the answers still in flight finish in the background.
    fn drain<T: Send + 'static>(
        &self,
        pending: FuturesUnordered<NodeFuture<T>>,
        background: &Background,
    ) {
        if !pending.is_empty() {
            background.spawn(async move {
                pending.for_each(|_| async {}).await;
            });
        }
    }

    /// Undoes an attempt's keys on `targets`.
    async fn undo(
        self: Arc<Self>,
        keys: Arc<Keys>,
        token: Arc<str>,
        targets: Vec<usize>,
        how: Undo,
        ttl: Duration,
    ) {
        let message: Arc<str> = release_message().into();
        let futs: FuturesUnordered<_> = targets
            .into_iter()
            .filter_map(|i| self.slots[i].get())
            .map(|node| {
                let (keys, token, message) = (keys.clone(), token.clone(), message.clone());
                // Bounded, but longer than one vote: an undo lost here leaves a key until its
                // TTL.
                let timeout = self.cfg.node_timeout(ttl) * 4;
                async move {
                    let mut c = node.conn();
                    let op = async {
                        match how {
                            Undo::Release => {
                                node::release_announced(&mut c, &keys, &token, &message).await
                            }
                            Undo::Silent => {
                                node::extend(&mut c, &keys, &token, Duration::from_millis(1)).await
                            }
                        }
                    };
                    if let Ok(Err(e)) = tokio::time::timeout(timeout, op).await {
                        tracing::debug!(error = %e, "undoing a redlock attempt on a master failed");
                    }
                }
            })
            .collect();
        futs.for_each(|_| async {}).await;
    }

    fn no_majority<T>(
        &self,
        answered: usize,
        results: impl Iterator<Item = (usize, Result<T>)>,
    ) -> Error {
        let msg = format!(
            "only {answered} of {} Redis masters answered, a majority ({}) is needed",
            self.slots.len(),
            self.quorum
        );
        match results.filter_map(|(_, r)| r.err()).last() {
            Some(e) => Error::unavailable(msg, e),
            None => Error::new(ErrorKind::Unavailable, msg),
        }
    }
}

fn capabilities(cfg: &Parsed) -> Capabilities {
    let mut c = Capabilities::default();
    c.fencing = false;
    c.fair = false;
    c.wait = WaitKind::Notify;
    c.lost_detection = false;
    c.reentrant = false;
    c.expiry_after_ttl = true;
    c.force_release = true;
    c.inspect = true;
    // Below this the per-node timeouts and the drift margin leave no validity.
    c.min_ttl = Duration::from_millis(10);
    c.drift_ppm = 10_000;
    c.drift_fixed = Duration::from_millis(2);
    c.notes = vec![
        format!(
            "Redlock over {} independent masters: a lock is won with {} of them",
            cfg.nodes.len(),
            cfg.quorum()
        ),
        "no fencing tokens: a master that restarts without persistence forgets its keys and any \
         counter, so no token scheme stays monotonic; use a fencing backend (ZooKeeper, etcd, \
         SQL lease, single Redis) where a paused holder must not corrupt the resource"
            .into(),
        "two holders are possible when a master restarts empty (no AOF fsync always) before the \
         TTL ends, or when a master's clock jumps forward and expires the key early; the fault \
         tests restarted_empty_master_allows_a_second_holder and \
         early_expiry_on_a_master_allows_a_second_holder (lock-redlock/tests/faults.rs) \
         demonstrate both: a lock for efficiency, not for correctness"
            .into(),
        format!(
            "validity = TTL - elapsed - drift (1 % + 2 ms), measured from before the first \
             request was sent; a vote later than the node timeout ({}) is lost; release and \
             extend wait for a majority of confirmations until the validity ends",
            match cfg.node_timeout {
                Some(t) => format!("node_timeout_ms={}", t.as_millis()),
                None => "a tenth of the TTL, 50 ms..1 s".into(),
            }
        ),
        "not fair: split votes retry after a random, growing delay; waiters wake on the first \
         release message of any master, at the holder's expiry, or at a jittered safety poll"
            .into(),
    ];
    c
}

#[async_trait]
impl Backend for RedlockBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    /// One attempt on every master at once; a failed attempt is undone (owner-checked delete
    /// that publishes) on every master that may hold its key before this returns.
    ///
    /// Cancel safety: a dropped attempt is undone on every master in the request's background
    /// (`Locker::flush` waits for it).
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        let keys = Arc::new(Keys::new(&self.inner.cfg.namespace, &req.name));
        let token: Arc<str> = req.token.to_hex().into();
        match self.attempt(req, &keys, &token, Undo::Release).await? {
            Attempt::Won(a) => Ok(Some(a)),
            Attempt::Lost { .. } => Ok(None),
        }
    }

    /// Waits by notification, retrying split votes after random delays (see the crate docs).
    ///
    /// Cancel safety: a dropped wait undoes its attempt in flight on every master in the
    /// request's background (`Locker::flush` waits for it) and leaves its subscriptions to
    /// linger a few seconds; nothing is left on the servers beyond that.
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        let keys = Arc::new(Keys::new(&self.inner.cfg.namespace, &req.name));
        let token: Arc<str> = req.token.to_hex().into();
        let mut splits = 0u32;
        let split = match self.attempt(req, &keys, &token, Undo::Silent).await? {
            Attempt::Won(a) => return Ok(Some(a)),
            Attempt::Lost { split, .. } => split,
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        let subs = self.subscribe(&keys, req.ttl).await;
        let poll = self.inner.cfg.poll;
        // When to vote again without a release message; `None`: at once. A split vote first
        // waits its random delay; a held lock is re-checked at once, now that the
        // subscriptions see any release.
        let mut next_vote = split.then(|| {
            splits += 1;
            Instant::now() + self.split_delay(splits, req.ttl)
        });
        // Expiry publishes nothing: one waiter per client (the holder of this role, on the
        // first subscribed master's channel) comes back when the holder's keys run out, not
        // all of them. Without any subscription every waiter keeps its own expiry timer.
        let mut expiry = subs
            .0
            .waitings
            .iter()
            .find_map(OnceLock::get)
            .map(|w| ExpiryWatch::new(w.channel()));
        // Armed before every vote: a release published while it is in flight wakes us.
        let mut armed = subs.0.arm();
        loop {
            if let Some(mut at) = next_vote {
                if let Some(d) = deadline {
                    at = at.min(d);
                }
                let woken_by = tokio::select! {
                    i = first_of(&mut armed) => Some(i),
                    _ = tokio::time::sleep_until(at) => None,
                };
                if let Some(i) = woken_by
                    && !subs.0.first_to_act(armed.channels[i].last_message())
                {
                    // A copy of a release another waiter of this client votes on: sleep on
                    // towards the same time.
                    armed.rearm(i);
                    continue;
                }
                armed = subs.0.arm();
            }
            let (split, free_in) = match self.attempt(req, &keys, &token, Undo::Silent).await? {
                Attempt::Won(a) => {
                    if let Some(e) = expiry.as_mut() {
                        e.won();
                    }
                    return Ok(Some(a));
                }
                Attempt::Lost { split, free_in } => (split, free_in),
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            next_vote = Some(if split {
                splits += 1;
                now + self.split_delay(splits, req.ttl)
            } else {
                splits = 0;
                let safety = poll / 2 + poll.mul_f64(fastrand::f64() / 2.0);
                let mut at = now + safety;
                if let Some(p) = free_in
                    && expiry.as_mut().is_none_or(ExpiryWatch::claim)
                {
                    // Come back when the holder's keys run out.
                    at = at.min(now + p + Duration::from_millis(fastrand::u64(1..=5)));
                }
                at
            });
        }
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        RedlockBackend::force_release(self, name).await
    }

    /// One read per master in parallel; held when a majority has the same owner.
    ///
    /// Cancel safe.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        self.inspect_lock(name).await
    }

    /// `PING` on every master at once, until all answered.
    async fn round_trip(&self) -> Result<()> {
        self.ping().await
    }

    /// The bare Redlock primitive, as a plain client would run it: `SET NX PX` on every master
    /// at once, awaiting all answers, then the compare-and-delete script on every master at
    /// once, awaiting all answers.
    async fn bare_cycle(&self, name: &LockName) -> Result<()> {
        let keys = Arc::new(Keys::new(&self.inner.cfg.namespace, name));
        let token: Arc<str> = lockcore::OwnerToken::random().to_hex().into();
        let timeout = self.inner.cfg.response_timeout;
        let set = {
            let (keys, token) = (keys.clone(), token.clone());
            self.inner.per_node(timeout, move |mut c| {
                let (keys, token) = (keys.clone(), token.clone());
                async move {
                    redis::cmd("SET")
                        .arg(&keys.lock)
                        .arg(&*token)
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async::<Option<String>>(&mut c)
                        .await
                        .map_err(|e| node::map_err("SET failed", e))
                }
            })
        };
        let set: Vec<_> = set.collect().await;
        let del: Vec<_> = self
            .inner
            .per_node(timeout, move |mut c| {
                let (keys, token) = (keys.clone(), token.clone());
                async move {
                    bare_compare_and_delete()
                        .key(&keys.lock)
                        .arg(&*token)
                        .invoke_async::<i64>(&mut c)
                        .await
                        .map_err(|e| node::map_err("compare-and-delete failed", e))
                }
            })
            .collect()
            .await;
        for (_, r) in set {
            r?;
        }
        for (_, r) in del {
            r?;
        }
        Ok(())
    }

    /// The sum of `INFO commandstats` calls over every master.
    async fn server_requests(&self) -> Result<u64> {
        let results: Vec<_> = self
            .inner
            .per_node(self.inner.cfg.response_timeout, |mut c| async move {
                node::server_requests(&mut c).await
            })
            .collect()
            .await;
        results.into_iter().map(|(_, r)| r).sum()
    }

    fn describe(&self) -> String {
        self.inner.cfg.redacted.clone()
    }
}

/// The compare-and-delete a plain Redlock client runs (no notification), for
/// [`Backend::bare_cycle`]; the library's release also publishes to waiters.
fn bare_compare_and_delete() -> &'static redis::Script {
    static SCRIPT: OnceLock<redis::Script> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end \
             return 0",
        )
    })
}

/// A lock held on a majority of the masters.
struct RedlockLease {
    inner: Arc<Inner>,
    keys: Arc<Keys>,
    token: Arc<str>,
    background: Background,
    /// The TTL last granted (acquire or extend).
    ttl: Mutex<Duration>,
    /// The validity deadline: sent time of the last granted acquire or extend + its TTL - drift.
    valid_until: Mutex<Instant>,
}

impl RedlockLease {
    /// How long a release waits for a majority of confirmations: what is left of the validity
    /// (after it, the keys run out on the masters anyway), at least the per-node timeout of the
    /// lease's TTL. Not the acquire's per-node timeout alone: a release that reached every
    /// master must not be reported failed because one of the three masters holding the lock
    /// answered a few milliseconds late on a busy machine. Each request is also bounded by the
    /// connections' own response timeout.
    fn release_budget(&self) -> Duration {
        let ttl = *lock_mutex(&self.ttl);
        let remaining = lock_mutex(&self.valid_until).saturating_duration_since(Instant::now());
        remaining.max(self.inner.cfg.node_timeout(ttl))
    }
}

impl fmt::Debug for RedlockLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockLease")
            .field("key", &self.keys.lock)
            .field("token", &self.token)
            .finish()
    }
}

/// Counts per-node answers of an owner-checked script until a majority said yes or can no
/// longer say it; the rest finish in the background.
async fn majority(
    inner: &Inner,
    mut pending: FuturesUnordered<NodeFuture<bool>>,
    background: &Background,
) -> std::result::Result<(), (usize, usize, Vec<(usize, Result<bool>)>)> {
    let n = inner.slots.len();
    let (mut yes, mut no) = (0, 0);
    let mut errors = Vec::new();
    while let Some((i, r)) = pending.next().await {
        match r {
            Ok(true) => yes += 1,
            Ok(false) => no += 1,
            Err(e) => errors.push((i, Err(e))),
        }
        if yes >= inner.quorum || no + errors.len() > n - inner.quorum {
            break;
        }
    }
    inner.drain(pending, background);
    if yes >= inner.quorum {
        Ok(())
    } else {
        Err((yes, no, errors))
    }
}

/// Neither a majority confirmed nor a majority refused: too many masters did not answer.
fn unconfirmed(inner: &Inner, yes: usize, no: usize, errors: Vec<(usize, Result<bool>)>) -> Error {
    let msg = format!(
        "{yes} of {} Redis masters confirmed, {no} no longer held the lease and {} did not \
         answer in time: a majority ({}) is needed",
        inner.slots.len(),
        errors.len(),
        inner.quorum
    );
    match errors.into_iter().filter_map(|(_, r)| r.err()).last() {
        Some(e) => Error::unavailable(msg, e),
        None => Error::new(ErrorKind::Unavailable, msg),
    }
}

fn not_held(confirmed: usize, inner: &Inner) -> Error {
    Error::not_held(format!(
        "only {confirmed} of {} Redis masters still hold this lease, a majority ({}) is needed",
        inner.slots.len(),
        inner.quorum
    ))
}

#[async_trait]
impl Lease for RedlockLease {
    fn fencing_token(&self) -> Option<u64> {
        None
    }

    /// Compare-and-`PEXPIRE` on every master at once; granted when a majority confirmed within
    /// the validity recomputed from when it was sent (awaited that long).
    ///
    /// Cancel safety: dropping the future may have extended the lease on some masters; it stays
    /// owner-checked.
    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        let inner = &self.inner;
        let sent_at = Instant::now();
        let drift = inner.caps.drift_margin(ttl);
        // A confirmation counts until the new validity ends (it is computed from the send
        // time), not only within the acquire's per-node timeout: one master answering late on
        // a busy machine must not fail a renewal the others confirmed.
        let budget = ttl.saturating_sub(drift).max(inner.cfg.node_timeout(ttl));
        let pending = {
            let (keys, token) = (self.keys.clone(), self.token.clone());
            inner.per_node(budget, move |mut c| {
                let (keys, token) = (keys.clone(), token.clone());
                async move { node::extend(&mut c, &keys, &token, ttl).await }
            })
        };
        match majority(inner, pending, &self.background).await {
            Ok(()) if sent_at.elapsed() + drift < ttl => {
                *lock_mutex(&self.ttl) = ttl;
                *lock_mutex(&self.valid_until) = sent_at + ttl - drift;
                Ok(ttl)
            }
            Ok(()) => Err(Error::new(
                ErrorKind::Unavailable,
                "the renewal reached a majority only after its validity had passed",
            )),
            Err((yes, no, errors)) => {
                if inner.slots.len() - no < inner.quorum {
                    Err(not_held(yes, inner))
                } else {
                    Err(unconfirmed(inner, yes, no, errors))
                }
            }
        }
    }

    /// Compare-and-delete (publishing to the waiters) on every master at once; released when a
    /// majority confirmed (the others finish in the background), awaited until the lease's
    /// validity ends (at least one node timeout), see [`RedlockLease::release_budget`].
    ///
    /// Cancel safety: dropping the future may leave the lock held on some masters until its TTL
    /// runs out.
    async fn release(&self) -> Result<()> {
        let inner = &self.inner;
        let pending = {
            let (keys, token) = (self.keys.clone(), self.token.clone());
            let message: Arc<str> = release_message().into();
            inner.per_node(self.release_budget(), move |mut c| {
                let (keys, token, message) = (keys.clone(), token.clone(), message.clone());
                async move { node::release_announced(&mut c, &keys, &token, &message).await }
            })
        };
        match majority(inner, pending, &self.background).await {
            Ok(()) => Ok(()),
            Err((yes, no, errors)) => {
                if inner.slots.len() - no < inner.quorum {
                    Err(not_held(yes, inner))
                } else {
                    Err(unconfirmed(inner, yes, no, errors))
                }
            }
        }
    }
}
