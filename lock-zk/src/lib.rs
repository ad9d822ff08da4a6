//! locksmith backend for Apache ZooKeeper (`zk://`): the Curator `InterProcessMutex` recipe,
//! written against [`zookeeper_client`] so that fencing, cancellation and the lost signal follow
//! the locksmith contract.
//!
//! # URL
//!
//! `zk://host1:port1[,host2:port2...][/chroot][?params]` (port defaults to 2181). Parameters:
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `session_timeout_ms` | 10000 | session timeout asked of the server (it clamps it to its `[minSessionTimeout, maxSessionTimeout]`) |
//! | `namespace` | `locksmith` | top-level node (under the chroot) holding every lock |
//! | `digest` | none | `user:password` for ZooKeeper `digest` auth; every node this backend creates then gets the ACL creator-all + world-read |
//! | `lost_after_disconnect` | `0` | how long a disconnection may last before held leases are reported lost, as a fraction (0 to 0.5) of the session timeout; 0 is Curator's standard policy (a suspended connection is a lost lock) |
//! | `interop` | `curator` | whose node names this client makes: `curator` (Curator's protected-mode names, which Curator and go-zookeeper see) or `kazoo` (kazoo's names); see [Interoperating](#interoperating-with-other-lock-clients) |
//!
//! Unknown or malformed parameters are [`ErrorKind::InvalidConfig`](lockcore::ErrorKind) errors.
//! The digest password never appears in `Debug`, [`Backend::describe`], logs or errors. The
//! factor can also be set in code: [`ZkBackend::builder`].
//!
//! # ACLs
//!
//! With `digest` credentials the namespace node, every lock node and every contender node carry
//! the ACL *creator-all + world-read*: other identities can list and read them (to see who
//! waits), but cannot create contenders under a lock node, nor delete a holder's node (ZooKeeper
//! checks a delete against the parent's ACL). Give every client of one lock the same digest
//! identity. **Without credentials every node is world-writable** (`world:anyone` all): any
//! client of the ensemble can delete a holder's node and take the lock. Use `digest` wherever
//! the ensemble is shared.
//!
//! TLS: the `zookeeper-client` crate supports TLS (its `tls` feature), but this backend does not
//! wire it yet: `zk://` connections are plain TCP.
//!
//! # The recipe
//!
//! A lock `name` is the node `<chroot>/<namespace>/<name.escaped()>` (a CONTAINER node, so the
//! server removes it once empty; persistent plus a best-effort delete on servers without
//! containers). Each contender creates an EPHEMERAL_SEQUENTIAL child
//! `_c_<owner-token>-lock-<seq>` (32 lowercase hex digits of token, 10 digits of sequence;
//! `<owner-token>__lock__<seq>` with `interop=kazoo`), lists the children (the list is sent
//! right behind the create, so both take one round trip) and holds the lock when its sequence is
//! the lowest among the contenders; otherwise it sets a one-shot watch on its immediate
//! predecessor only (one release wakes one waiter). When the predecessor was the only node
//! ahead, its deletion makes the waiter the holder without listing again. A contender is every
//! child that Curator, go-zookeeper or kazoo treats as one, whoever made it: a name ending in
//! `lock-`, `__lock__` or `__rlock__` and the 10-digit sequence, ordered by that sequence
//! (the lock node's one counter, shared by all its sequential children). A child with none of
//! these markers is made by no lock client and is not a contender.
//!
//! * `try_lock` lists the children first: on a held lock it costs one read and writes nothing.
//!   Where this client's last acquisition of the lock won, it creates at once instead (a client
//!   that just held a lock mostly finds it free): the first `try_lock` after that on a lock
//!   someone else took costs the create, the listing and a delete, and the next ones one read.
//! * A create whose reply was lost (connection loss) is recovered by the owner token in the
//!   name (Curator's protection mode); when a retry made a second node, every child with the
//!   caller's owner prefix is the caller's: the lowest is kept, the rest deleted, so a contender
//!   never waits on its own node.
//! * A predecessor that no live client can hold through (a node someone forged with a
//!   contender's name) is ignored for the rest of the backend's life, so it cannot block a lock
//!   forever: one created after this contender's node yet numbered before it (the server
//!   numbers sequential children in creation order, so its creator chose the number), or one
//!   of Curator's shape that is not ephemeral (Curator, go-zookeeper and locksmith only make
//!   ephemeral nodes). A persistent node of kazoo's shape is waited for: kazoo's
//!   `acquire(ephemeral=False)` holds through one. Any other forged contender blocks the lock
//!   as it blocks Curator and kazoo, until an operator deletes it (`force_release`); with
//!   `digest` credentials nobody else can create one.
//! * Fencing token: the creation zxid of the holder's node, which increases across successive
//!   holders even when the parent node was deleted and re-created.
//! * Holder metadata ([`lockcore::Holder`]): each contender node's data, written by its create;
//!   `inspect` lists the contenders and reads the head's data and stat (acquired at = the node's
//!   `ctime`, on the server's clock). A lock has no TTL of its own (it lives with the session).
//! * The lease is the ZooKeeper session: the server keeps the node while the session lives;
//!   the TTL is enforced by lockcore's validity watchdog, and `extend` sends a `sync` (to reach
//!   the leader) followed by one `exists` of the node, in one round trip.
//!
//! # Interoperating with other lock clients
//!
//! A lock `name` is the node `<chroot>/<namespace>/<name>` (names of `[A-Za-z0-9_-]` are not
//! escaped): give that path to the other clients. With the default settings, locksmith never
//! holds a lock that a Curator or go-zookeeper client holds on the same node, and they never
//! hold one locksmith holds:
//!
//! * **Curator** `InterProcessMutex` (`new InterProcessMutex(client, "/locksmith/NAME")`):
//!   Curator treats every child of the lock node as a contender, sorted by the text after the
//!   last `lock-` in its name (`StandardLockInternalsDriver.fixForSorting`), and waits on the
//!   child right before its own with a watch. locksmith's names have Curator's protected-mode
//!   shape (`_c_<id>-lock-<seq>`) by design, so both order one queue by the server's sequence
//!   and each wakes the other by deleting its node. What holds: mutual exclusion, FIFO
//!   fairness across both, notification both ways, locksmith's fencing token (the creation
//!   zxid of its node; Curator has none) and renewal (the ZooKeeper session, on both sides).
//!   Curator lacks fencing tokens and locksmith's lost signal (a Curator holder learns a loss
//!   from its connection-state listener). Curator's `InterProcessReadWriteLock` and
//!   semaphores use other markers and cannot share a node with locksmith.
//! * **go-zookeeper** `zk.NewLock(conn, "/locksmith/NAME", acl)`: the same node names as
//!   Curator's protected mode, every child a contender ordered by its sequence (go-zookeeper
//!   `lock.go`, `parseSeq`); what holds and what it lacks as for Curator. Tested with Debian's
//!   2018 client, which fails with a parse error (rather than overlapping) on a child without
//!   `-` before its sequence, such as kazoo's names; later releases parse those too.
//! * **kazoo** `Lock` (`client.Lock("/locksmith/NAME")`) only sees children named
//!   `...__lock__<seq>` (and `__rlock__` for a `WriteLock`): it would not wait for locksmith's
//!   default nodes. Two ways: `interop=kazoo` (locksmith then names its nodes
//!   `<owner-token>__lock__<seq>`, which kazoo's `Lock`, `WriteLock` and `ReadLock` see as a
//!   writer), or, without changing locksmith, `client.Lock(path,
//!   extra_lock_patterns=["-lock-"])` on the kazoo side (kazoo 2.7.1 and later). In both,
//!   locksmith waits for kazoo's readers and writers (persistent ones from
//!   `acquire(ephemeral=False)` included), the queue is one FIFO by sequence, and each side
//!   wakes the other (kazoo watches its predecessor too). kazoo lacks fencing tokens and a lost
//!   signal beyond its connection listener. With `interop=kazoo` a name outside
//!   `[A-Za-z0-9_-]` is refused ([`ErrorKind::InvalidName`](lockcore::ErrorKind)): kazoo
//!   would lock the unescaped path.
//! * **Curator and kazoo do not exclude each other** on one node (kazoo ignores Curator's
//!   names; Curator orders kazoo's by their whole text, not by sequence), so a lock node that
//!   Curator clients use must not be used with `interop=kazoo`, nor by kazoo clients: locksmith
//!   in either mode waits for every peer's node, but it cannot make Curator see a kazoo-named
//!   node in sequence order. locksmith clients of both modes exclude each other.
//!
//! # Sessions and the lost signal
//!
//! One task per backend (not per lease) watches the session and keeps the registry of held
//! leases. Held leases are reported lost:
//! * at once when the connection drops ([`LostReason::ConnectionLost`]; Curator's standard
//!   policy: a suspended connection is a lost lock, since the session may be expiring on the
//!   server), or after `lost_after_disconnect` x the session timeout when that is set;
//! * when a `sync` sent every third of the session timeout while leases are held is not
//!   answered within a third of the session timeout ([`LostReason::ConnectionLost`]): the
//!   connection looks alive but the server cannot reach the leader (a follower cut off from the
//!   quorum keeps answering pings while the leader expires the session);
//! * when the session expires ([`LostReason::SessionExpired`]). The backend then opens a new
//!   session, as Curator does: later acquisitions work without rebuilding the backend, and
//!   waiters of the old session queue again on the new one within their deadline;
//! * when the node was deleted by someone else: at the next `extend` (auto-renewal), which is
//!   refused ([`LostReason::RenewalRefused`]).
//!
//! The remaining window: the lost signal comes at most 2/3 of the session timeout after the
//! holder last reached the leader, before the server can expire the session; a holder paused
//! (GC, SIGSTOP) across that point learns it only after it runs again, when another holder may
//! already work: only the fencing token protects the resource then.
//!
//! Each [`ZkBackend::connect`] opens its own session; clones of a `Locker` share it.
#![deny(missing_docs)]

mod config;
mod contenders;
mod inspect;
mod registration;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lockcore::backend::{
    AcquireRequest, Acquired, Backend, Background, Lease, LostNotifier, async_trait,
};
use lockcore::{
    Capabilities, Error, Instant, IntoLockName, LostReason, RenewKind, Result, WaitKind,
};
use tokio::sync::watch;
use zookeeper_client as zk;

pub use crate::config::{Config, Digest};
pub use crate::contenders::Interop;
pub use crate::registration::REGISTRATION;

type ZkResult<T> = std::result::Result<T, zk::Error>;

/// Pause between retries of an idempotent request after a connection loss (the client queues
/// requests until it has reconnected, so this only avoids a hot loop on a flapping link).
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// At most this many forged (non-ephemeral) contender paths are remembered.
const MAX_FOREIGN: usize = 4096;
/// At most this many lock nodes are remembered as last won by this client.
const MAX_RECENT_WINS: usize = 1024;

/// Creator-all + world-read: other identities can see lock nodes but neither create nor delete
/// children of the lock nodes (ZooKeeper checks delete against the parent's ACL).
static LOCKED_ACL: [zk::Acl; 2] = [
    zk::Acl::new_const(zk::Permission::ALL, "auth", ""),
    zk::Acl::new_const(zk::Permission::READ, "world", "anyone"),
];

/// Counters of what the backend did, for tests and monitoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkStats {
    /// Predecessor watches that fired and woke a waiter (one per hand-over with no herd).
    pub watch_wakeups: u64,
    /// Contender nodes created.
    pub nodes_created: u64,
    /// Creates whose reply was lost and whose node was found again by its owner token.
    pub creates_recovered: u64,
    /// Extra nodes of one contender (a retried create whose first attempt was applied) deleted.
    pub duplicates_removed: u64,
    /// Forged contender nodes (not ephemeral) found and ignored.
    pub foreign_ignored: u64,
    /// Lost signals fired by this backend (not by lockcore's watchdog).
    pub lost_fired: u64,
    /// Contenders waiting right now on a predecessor watch that the server has set.
    pub waiting: u64,
    /// Sessions opened (1 + the sessions opened after an expiry).
    pub sessions: u64,
    /// Leases held right now in the current session.
    pub held: u64,
}

#[derive(Debug, Default)]
struct Stats {
    watch_wakeups: AtomicU64,
    nodes_created: AtomicU64,
    creates_recovered: AtomicU64,
    duplicates_removed: AtomicU64,
    foreign_ignored: AtomicU64,
    lost_fired: AtomicU64,
    waiting: AtomicU64,
    sessions: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Counts one contender in [`ZkStats::waiting`] while alive (cancellation included).
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn new(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Waiting(gauge)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One ZooKeeper session and the leases held in it.
struct Session {
    client: zk::Client,
    id: i64,
    registry: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    next: u64,
    /// Set while the connection is suspended or the session ended: a lease registered
    /// meanwhile is lost at once.
    suspended: Option<LostReason>,
    leases: HashMap<u64, LostNotifier>,
}

impl Session {
    fn new(client: zk::Client) -> Arc<Session> {
        Arc::new(Session {
            id: client.session_id().0,
            client,
            registry: Mutex::new(Registry::default()),
        })
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a held lease; reports it lost at once if the session is suspended.
    fn register(&self, lost: LostNotifier, stats: &Stats) -> u64 {
        let mut reg = self.registry();
        reg.next += 1;
        let id = reg.next;
        match reg.suspended {
            Some(reason) => {
                if lost.fire(reason) {
                    bump(&stats.lost_fired);
                }
            }
            None => {
                reg.leases.insert(id, lost);
            }
        }
        id
    }

    fn unregister(&self, id: u64) {
        self.registry().leases.remove(&id);
    }

    fn held(&self) -> usize {
        self.registry().leases.len()
    }

    /// Reports every held lease lost and keeps reporting new ones until [`Session::resume`].
    fn suspend(&self, reason: LostReason, stats: &Stats) {
        let drained: Vec<LostNotifier> = {
            let mut reg = self.registry();
            // An expiry outranks a suspension.
            if reg.suspended != Some(LostReason::SessionExpired) {
                reg.suspended = Some(reason);
            }
            reg.leases.drain().map(|(_, n)| n).collect()
        };
        for lost in drained {
            if lost.fire(reason) {
                bump(&stats.lost_fired);
                tracing::debug!(session = self.id, %reason, "zookeeper lock lost");
            }
        }
    }

    fn resume(&self) {
        let mut reg = self.registry();
        if reg.suspended == Some(LostReason::ConnectionLost) {
            reg.suspended = None;
        }
    }

    fn ended(&self) -> bool {
        self.client.state().is_terminated()
    }
}

/// A ZooKeeper lock client: one session at a time (a new one after an expiry). See the crate
/// docs for the URL and the recipe.
#[derive(Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    base: String,
    capabilities: Capabilities,
    session_timeout: Duration,
    lost_after_disconnect: Duration,
    session: watch::Sender<Arc<Session>>,
    /// Cleared when the server refuses CONTAINER nodes; parents are then persistent and
    /// deleted (best effort) on release.
    containers: AtomicBool,
    /// Paths of forged contender nodes (not ephemeral): never waited on.
    foreign: Mutex<HashSet<String>>,
    /// Lock nodes whose last acquisition by this client won: `try_lock` creates at once there
    /// (a client that just held a lock mostly finds it free), elsewhere it lists first.
    recent_wins: Mutex<HashSet<String>>,
    stats: Stats,
    /// Dropped with the backend: stops the session task.
    _shutdown: watch::Sender<()>,
    /// Open a new session after one ends (false on an application's session).
    reopen: bool,
    /// Test hook: the next create "loses" its reply after the server applied it.
    #[cfg(test)]
    drop_next_create_reply: AtomicBool,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("url", &self.describe())
            .field("session_id", &self.session().id)
            .finish()
    }
}

fn map_err(what: impl Into<String>, e: zk::Error) -> Error {
    use zk::Error as E;
    match e {
        E::ConnectionLoss
        | E::Timeout
        | E::NoHosts
        | E::SessionExpired
        | E::SessionMoved
        | E::ClientClosed
        | E::Throttled => Error::unavailable(what, e),
        // The client reports a broken connection (reset, refused, a read that timed out) as a
        // custom error around the I/O error: the request may not have reached the server, as
        // with ConnectionLoss, so it is Unavailable (lock() retries it within its deadline, a
        // server restart must not end a wait with an error).
        E::Custom(_) if is_connection_failure(&e) => Error::unavailable(what, e),
        _ => Error::backend(what, e),
    }
}

fn is_connection_failure(e: &zk::Error) -> bool {
    // The client wraps the I/O error in an `Arc<dyn Error>` (downcasting cannot see through it)
    // or says "no response from connection in N ms"; its only other custom errors are SASL's.
    !e.to_string().to_ascii_lowercase().contains("sasl")
}

/// The request may or may not have been applied and the session lives on: retry it (every
/// retried request here is idempotent or recovers by owner token). A broken connection counts,
/// whichever way the client reports it: a release that gave up on a reset connection left its
/// node behind for the whole session, and every contender waited on it (the zk-ensemble
/// `leader_loss` stall).
fn is_retryable(e: &zk::Error) -> bool {
    match e {
        zk::Error::ConnectionLoss => true,
        zk::Error::Custom(_) => is_connection_failure(e),
        _ => false,
    }
}

/// The session of a request is gone (expired, closed): the request is retried on the next one.
fn is_session_end(e: &zk::Error) -> bool {
    matches!(e, zk::Error::SessionExpired | zk::Error::ClientClosed)
}

/// The contenders among `children` in queue order, without the forged nodes in `foreign`.
fn queue<'a>(
    children: &'a [String],
    parent: &str,
    foreign: &HashSet<String>,
) -> Vec<(i64, &'a str)> {
    contenders::queue(children, |c| {
        !foreign.is_empty() && foreign.contains(&format!("{parent}/{c}"))
    })
}

/// Settings beyond the URL, for [`ZkBackend::builder`].
#[derive(Debug)]
pub struct ZkBuilder {
    config: Config,
}

impl ZkBuilder {
    /// How long a disconnection may last before held leases are reported lost, as a fraction
    /// of the negotiated session timeout (the URL's `lost_after_disconnect`). 0, the default,
    /// is Curator's standard policy: a suspended connection is a lost lock.
    ///
    /// # Errors
    /// `InvalidConfig` outside `0..=0.5` (a larger grace could report the loss after the server
    /// expired the session).
    pub fn lost_after_disconnect(mut self, factor: f64) -> Result<Self> {
        config::check_lost_after_disconnect(factor)?;
        self.config.lost_after_disconnect = factor;
        Ok(self)
    }

    /// Opens the session, as [`ZkBackend::connect`].
    ///
    /// Cancel safety: dropping the future before it completes closes the half-open session.
    ///
    /// # Errors
    /// As [`ZkBackend::connect`].
    pub async fn connect(self) -> Result<ZkBackend> {
        ZkBackend::open(self.config).await
    }
}

/// Opens one session with the settings of `config`.
async fn open_client(config: &Config) -> Result<zk::Client> {
    let mut connector = zk::Client::connector()
        .with_session_timeout(config.session_timeout)
        // Fail the first connection once every host was tried, instead of retrying for a
        // whole session timeout; reconnections later still cycle through the hosts.
        .with_fail_eagerly();
    if let Some(d) = &config.digest {
        connector = connector.with_auth("digest", &d.auth_bytes());
    }
    let hosts = config.connect_string();
    let connect_bound = config.session_timeout * 2 + Duration::from_secs(5);
    match tokio::time::timeout(connect_bound, connector.connect(&hosts)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(map_err(format!("connecting to ZooKeeper at {hosts}"), e)),
        Err(_) => Err(Error::new(
            lockcore::ErrorKind::Unavailable,
            format!("connecting to ZooKeeper at {hosts}: no session within {connect_bound:?}"),
        )),
    }
}

impl ZkBackend {
    /// Parses `url` (see the crate docs), opens a new ZooKeeper session and makes sure the
    /// namespace node exists.
    ///
    /// Cancel safety: dropping the future before it completes closes the half-open session.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockcore::ErrorKind::InvalidConfig) for a malformed URL
    /// (before any I/O); [`ErrorKind::Unavailable`](lockcore::ErrorKind::Unavailable) when no
    /// server answers; [`ErrorKind::Backend`](lockcore::ErrorKind::Backend) when the server
    /// refuses (for example NoAuth on an existing namespace node).
    pub async fn connect(url: &str) -> Result<ZkBackend> {
        Self::open(Config::parse(url)?).await
    }

    /// Opens a session from a [`Config`] (deserialized from a config file, say), validated
    /// exactly as a URL is ([`Config::validate`]).
    ///
    /// Cancel safety: dropping the future before it completes closes the half-open session.
    ///
    /// # Errors
    /// As [`ZkBackend::connect`].
    pub async fn from_config(config: Config) -> Result<ZkBackend> {
        Self::open(config.validate()?).await
    }

    /// Parses `url` for settings made in code before connecting:
    /// `ZkBackend::builder(url)?.lost_after_disconnect(0.25)?.connect().await`.
    ///
    /// # Errors
    /// `InvalidConfig` for a malformed URL.
    pub fn builder(url: &str) -> Result<ZkBuilder> {
        Ok(ZkBuilder {
            config: Config::parse(url)?,
        })
    }

    /// A backend on a ZooKeeper session the application already has (its connect string,
    /// chroot and credentials), with locks under `namespace` (empty: `locksmith`, as a URL
    /// without `namespace=`). The application owns that session: this backend opens none of its
    /// own, so after the session expires (held locks are then reported lost) every call returns
    /// `Unavailable` until the application makes a new backend from its new client; a backend
    /// from a URL opens a new session by itself instead. Lock nodes get open ACLs, as from a
    /// URL without `digest=`.
    ///
    /// ```no_run
    /// # async fn f() -> lockcore::Result<()> {
    /// let client = zookeeper_client::Client::connect("127.0.0.1:2181").await.unwrap();
    /// let backend = lock_zk::ZkBackend::from_client(client, "app").await?;
    /// let locker = lockcore::Locker::new(backend);
    /// # Ok(()) }
    /// ```
    ///
    /// Cancel safety: dropping the future leaves at most the namespace node created.
    ///
    /// # Errors
    /// `InvalidConfig` for a bad namespace; `Unavailable` when the session cannot reach a
    /// server to create the namespace node.
    pub async fn from_client(client: zk::Client, namespace: &str) -> Result<ZkBackend> {
        let mut config = Config::parse("zk://application-client")?;
        if !namespace.is_empty() {
            config.namespace = namespace.to_owned();
        }
        Self::open_on(config.validate()?, client, false).await
    }

    async fn open(config: Config) -> Result<ZkBackend> {
        let client = open_client(&config).await?;
        Self::open_on(config, client, true).await
    }

    /// The backend on session `client`; `reopen`: open a new session after it ends.
    async fn open_on(config: Config, client: zk::Client, reopen: bool) -> Result<ZkBackend> {
        let session_timeout = client.session_timeout();
        let lost_after_disconnect = session_timeout.mul_f64(config.lost_after_disconnect);
        let base = config.base_path();
        let (shutdown, shutdown_rx) = watch::channel(());
        let inner = Inner {
            capabilities: Self::capabilities_for(
                session_timeout,
                lost_after_disconnect,
                config.digest.is_some(),
                config.interop,
            ),
            session: watch::Sender::new(Session::new(client)),
            base,
            session_timeout,
            lost_after_disconnect,
            containers: AtomicBool::new(true),
            foreign: Mutex::new(HashSet::new()),
            recent_wins: Mutex::new(HashSet::new()),
            stats: Stats::default(),
            _shutdown: shutdown,
            reopen,
            #[cfg(test)]
            drop_next_create_reply: AtomicBool::new(false),
            config,
        };
        bump(&inner.stats.sessions);
        let backend = ZkBackend {
            inner: Arc::new(inner),
        };
        tokio::spawn(supervise(Arc::downgrade(&backend.inner), shutdown_rx));
        let session = backend.session();
        backend.ensure_base(&session.client).await?;
        tracing::debug!(backend = %backend.describe(), "zookeeper session open");
        Ok(backend)
    }

    fn capabilities_for(
        session_timeout: Duration,
        lost_after: Duration,
        with_acl: bool,
        interop: Interop,
    ) -> Capabilities {
        let mut c = Capabilities::default();
        c.fencing = true;
        c.fair = true;
        c.wait = WaitKind::Notify;
        c.renew = RenewKind::Native;
        c.lost_detection = true;
        // Session loss is reported by the session task; a lock node deleted behind its holder
        // (an operator's force release) is noticed at the holder's next renewal or check only
        // (no per-lease watch: one session task per client).
        c.revoke_detection = false;
        c.reentrant = false;
        // A crashed holder's node lives until its session times out, one session timeout
        // after its last heartbeat whatever the TTL asked for (earlier than the TTL when the
        // TTL is longer, later when shorter), and a lease used without lockcore's watchdog
        // never expires by time at all while its session lives. So the lock does not expire
        // "after the TTL".
        c.expiry_after_ttl = false;
        c.force_release = true;
        c.inspect = true;
        // The TTL is lockcore's validity deadline, enforced by its watchdog (which releases
        // the node when it passes); the session keeps the node alive meanwhile, so any TTL
        // works. Below 10 ms renewal would be mostly round trips.
        c.min_ttl = Duration::from_millis(10);
        c.max_ttl = lockcore::MAX_TTL;
        let disconnect = if lost_after.is_zero() {
            "at once when the connection drops (Curator's standard policy)".to_owned()
        } else {
            format!(
                "{} ms after the connection drops (lost_after_disconnect)",
                lost_after.as_millis()
            )
        };
        c.notes = vec![
            "a lock node deleted behind its holder (force release) is noticed at the holder's next renewal or extend, not by itself".into(),
            format!(
                "the lease is the ZooKeeper session (negotiated timeout {} ms): a crashed holder's lock frees one session timeout after its last heartbeat, independent of the TTL",
                session_timeout.as_millis()
            ),
            "the TTL is enforced by lockcore's validity watchdog; extend() sends sync (to the leader) and exists in one round trip".into(),
            format!(
                "lost signal: {disconnect}; when a sync to the leader goes unanswered for 1/3 of the session timeout (a follower cut off from the quorum); on session expiry (a new session is opened); a node deleted by someone else at the next renewal"
            ),
            "remaining window: the lost signal comes at most 2/3 of the session timeout after the holder last reached the leader, before the session can expire; a holder paused past that (GC, SIGSTOP) learns it late: use the fencing token".into(),
            if with_acl {
                "digest ACL: nodes are creator-all + world-read; other identities cannot delete a holder's node or queue".into()
            } else {
                "no credentials: nodes are world-writable, any client of the ensemble can delete a holder's node (use ?digest=user:password)".into()
            },
            "plain TCP only: TLS is not wired (the zookeeper-client crate has it behind its tls feature)".into(),
            "fencing token = creation zxid of the holder's node; FIFO by sequence number; one release wakes one waiter".into(),
            match interop {
                Interop::Kazoo => "interop=kazoo: nodes named as kazoo's Lock names them (kazoo waits for them); Curator and go-zookeeper clients must not use these lock nodes (they do not order kazoo's names by sequence)".into(),
                _ => "Curator's protected-mode node names: Curator's InterProcessMutex and go-zookeeper's Lock on the same node exclude locksmith and are excluded; kazoo needs interop=kazoo or extra_lock_patterns=[\"-lock-\"]".into(),
            },
        ];
        c
    }

    /// The current session.
    fn session(&self) -> Arc<Session> {
        self.inner.session.borrow().clone()
    }

    /// A session that has not ended, waiting for the session task to open a new one after an
    /// expiry (at most until `deadline`, or half a session timeout when there is none, so that
    /// `try_lock` answers `Unavailable` soon while no server can be reached).
    async fn live_session(&self, deadline: Option<Instant>) -> Result<Arc<Session>> {
        let mut rx = self.inner.session.subscribe();
        let until = deadline.unwrap_or_else(|| Instant::now() + self.inner.session_timeout / 2);
        loop {
            let session = rx.borrow_and_update().clone();
            if !session.ended() {
                return Ok(session);
            }
            if tokio::time::timeout_at(until, rx.changed()).await.is_err() {
                return Err(Error::new(
                    lockcore::ErrorKind::Unavailable,
                    format!(
                        "the ZooKeeper session ended ({}) and no new one could be opened yet",
                        session.client.state()
                    ),
                ));
            }
        }
    }

    /// The session timeout the server granted.
    pub fn session_timeout(&self) -> Duration {
        self.inner.session_timeout
    }

    /// How long a disconnection lasts before held leases are reported lost with
    /// [`LostReason::ConnectionLost`]: zero (at once) unless `lost_after_disconnect` was set.
    pub fn lost_after_disconnect(&self) -> Duration {
        self.inner.lost_after_disconnect
    }

    /// Whether lock nodes are CONTAINER nodes (removed by the server once empty); false after
    /// the server refused them, in which case releases delete empty lock nodes (best effort).
    pub fn uses_containers(&self) -> bool {
        self.inner.containers.load(Ordering::Relaxed)
    }

    /// The current ZooKeeper session id.
    pub fn session_id(&self) -> i64 {
        self.session().id
    }

    /// Counters of what this backend did.
    pub fn stats(&self) -> ZkStats {
        let s = &self.inner.stats;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ZkStats {
            watch_wakeups: load(&s.watch_wakeups),
            nodes_created: load(&s.nodes_created),
            creates_recovered: load(&s.creates_recovered),
            duplicates_removed: load(&s.duplicates_removed),
            foreign_ignored: load(&s.foreign_ignored),
            lost_fired: load(&s.lost_fired),
            waiting: load(&s.waiting),
            sessions: load(&s.sessions),
            held: self.session().held() as u64,
        }
    }

    /// The underlying client of the current session, for advanced use and tests. Deleting
    /// lock nodes through it breaks the locks they carry.
    pub fn client(&self) -> zk::Client {
        self.session().client.clone()
    }

    /// The node of lock `name` whose children are the contenders.
    pub fn lock_path(&self, name: impl IntoLockName) -> Result<String> {
        let name = name.into_lock_name()?;
        self.check_name(&name)?;
        Ok(self.parent_path(&name))
    }

    /// With `interop=kazoo`, refuses a name that this crate escapes (a kazoo client names the
    /// node's path as it is: `/locksmith/a.b` is not `/locksmith/a%2Eb`, and they would not
    /// exclude each other). Curator's layout keeps the escaping of earlier releases.
    fn check_name(&self, name: &lockcore::LockName) -> Result<()> {
        let escaped = name.escaped();
        if self.inner.config.interop == Interop::Kazoo && escaped != name.as_str() {
            return Err(Error::invalid_name(format!(
                "with interop=kazoo a lock name is one path segment of [A-Za-z0-9_-] (a kazoo client would lock {:?} under the namespace, locksmith {escaped:?})",
                name.as_str()
            )));
        }
        Ok(())
    }

    fn parent_path(&self, name: &lockcore::LockName) -> String {
        format!("{}/{}", self.inner.base, name.escaped())
    }

    fn acls(&self) -> zk::Acls<'static> {
        if self.inner.config.digest.is_some() {
            zk::Acls::new(&LOCKED_ACL)
        } else {
            zk::Acls::anyone_all()
        }
    }

    fn foreign(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.inner.foreign.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn recent_wins(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.inner
            .recent_wins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers whether this client's last acquisition of `parent` won.
    fn note_outcome(&self, parent: &str, won: bool) {
        let mut wins = self.recent_wins();
        if won {
            if wins.len() >= MAX_RECENT_WINS && !wins.contains(parent) {
                wins.clear();
            }
            wins.insert(parent.to_owned());
        } else {
            wins.remove(parent);
        }
    }

    /// Deletes every contender node of `name` (the holder's and the waiters'), as an operator's
    /// override: the holder's lease is refused at its next renewal and waiters queue again.
    /// Returns how many nodes were deleted. Needs an identity allowed to delete them (the same
    /// digest user).
    ///
    /// Prefer [`Locker::force_release`](lockcore::Locker::force_release), the same on every
    /// backend (it returns whether something was deleted).
    ///
    /// Cancel safety: dropping the future may leave some nodes deleted and others not.
    ///
    /// # Errors
    /// `InvalidName`; `Unavailable` or `Backend` (NoAuth included) from ZooKeeper.
    pub async fn force_release(&self, name: impl IntoLockName) -> Result<usize> {
        let parent = self.lock_path(name)?;
        let client = self.live_session(None).await?.client.clone();
        let children = match retry(|| client.list_children(&parent)).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(0),
            Err(e) => return Err(map_err("listing contenders", e)),
        };
        let mut deleted = 0;
        for (_, child) in queue(&children, &parent, &HashSet::new()) {
            let path = format!("{parent}/{child}");
            match retry(|| client.delete(&path, None)).await {
                Ok(()) => deleted += 1,
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(map_err("deleting a contender node", e)),
            }
        }
        Ok(deleted)
    }

    async fn ensure_base(&self, client: &zk::Client) -> Result<()> {
        let opts = zk::CreateMode::Persistent.with_acls(self.acls());
        let base = &self.inner.base;
        retry(|| client.mkdir(base, &opts))
            .await
            .map_err(|e| map_err(format!("creating the namespace node {base}"), e))
    }

    /// Creates the lock's parent node if missing (a CONTAINER where the server has them).
    async fn ensure_parent(&self, client: &zk::Client, parent: &str) -> Result<()> {
        for _ in 0..8 {
            let containers = self.inner.containers.load(Ordering::Relaxed);
            let mode = if containers {
                zk::CreateMode::Container
            } else {
                zk::CreateMode::Persistent
            };
            match client
                .create(parent, &[], &mode.with_acls(self.acls()))
                .await
            {
                Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
                Err(zk::Error::Unimplemented) if containers => {
                    tracing::info!("server refuses CONTAINER nodes; using persistent lock nodes");
                    self.inner.containers.store(false, Ordering::Relaxed);
                }
                // The namespace (or chroot) node went away: make it again.
                Err(zk::Error::NoNode) => self.ensure_base(client).await?,
                Err(e) if is_retryable(&e) => tokio::time::sleep(RETRY_PAUSE).await,
                Err(e) => return Err(map_err(format!("creating the lock node {parent}"), e)),
            }
        }
        Err(Error::new(
            lockcore::ErrorKind::Backend,
            format!("could not create the lock node {parent}: it keeps disappearing"),
        ))
    }

    /// The recipe, retried on a new session when the session ends (the caller bounds the
    /// wait by dropping the future; the contender guard then deletes the node).
    async fn run(
        &self,
        req: &AcquireRequest,
        wait: bool,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        self.check_name(&req.name)?;
        loop {
            let session = self.live_session(deadline).await?;
            match self.attempt(&session, req, wait).await? {
                Attempt::Won(a) => return Ok(Some(a)),
                Attempt::Busy => return Ok(None),
                Attempt::SessionEnded => {
                    tracing::debug!(
                        "zookeeper session ended during an acquisition; retrying on the next one"
                    );
                }
            }
        }
    }

    /// One acquisition on one session. `wait == false`: one attempt (the node is deleted
    /// again if not lowest).
    async fn attempt(
        &self,
        session: &Arc<Session>,
        req: &AcquireRequest,
        wait: bool,
    ) -> Result<Attempt> {
        let parent = self.parent_path(&req.name);
        let client = &session.client;
        let owner = req.token.to_hex();
        let mut contender = ContenderGuard::new(
            client.clone(),
            parent.clone(),
            self.inner.config.interop.node_prefix(&owner),
            req.background.clone(),
        );
        // Children first: on a held lock, one read and no write. Skipped where this client's
        // last acquisition won (it mostly finds the lock free again: create at once).
        if !wait && !self.recent_wins().contains(&parent) {
            match client.list_children(&parent).await {
                Ok(children) => {
                    let foreign = self.foreign();
                    if !queue(&children, &parent, &foreign).is_empty() {
                        contender.state = GuardState::Done;
                        return Ok(Attempt::Busy);
                    }
                }
                Err(zk::Error::NoNode) => {}
                Err(e) if is_retryable(&e) => {}
                Err(e) if is_session_end(&e) => return Ok(Attempt::SessionEnded),
                Err(e) => return Err(map_err(format!("listing {parent}"), e)),
            }
        }
        'create: loop {
            // Taken before the requests that may prove us the holder.
            let mut sent_at = Instant::now();
            let (created, listed) = self
                .create_and_list(client, &parent, &contender, req.holder.encode().as_bytes())
                .await;
            let mut mine: Option<(String, Option<i64>)> = None;
            match created {
                Ok((stat, seq)) => {
                    bump(&self.inner.stats.nodes_created);
                    let name = format!("{}{seq}", contender.name_prefix);
                    contender.state = GuardState::Created(format!("{parent}/{name}"));
                    mine = Some((name, Some(stat.czxid)));
                }
                Err(zk::Error::NoNode) => {
                    self.ensure_parent(client, &parent).await?;
                    continue 'create;
                }
                // Applied or not: the listing below finds the node by the owner token.
                Err(e) if is_retryable(&e) => {}
                Err(e) if is_session_end(&e) => return Ok(Attempt::SessionEnded),
                Err(e) => {
                    return Err(map_err(
                        format!("creating a contender node under {parent}"),
                        e,
                    ));
                }
            }
            let mut listed = Some(listed);
            loop {
                let listing = match listed.take() {
                    Some(Err(e)) if is_retryable(&e) => {
                        sent_at = Instant::now();
                        retry(|| client.list_children(&parent)).await
                    }
                    Some(r) => r,
                    None => {
                        sent_at = Instant::now();
                        retry(|| client.list_children(&parent)).await
                    }
                };
                let children = match listing {
                    Ok(c) => c,
                    // The parent is gone (a container the server removed once it was empty,
                    // e.g. while our create's reply was lost): no node of ours can be under it,
                    // since an ephemeral child keeps its parent. Queue again under a new one.
                    Err(zk::Error::NoNode) => {
                        if session.ended() {
                            return Ok(Attempt::SessionEnded);
                        }
                        contender.state = GuardState::Creating;
                        self.ensure_parent(client, &parent).await?;
                        continue 'create;
                    }
                    Err(e) => return self.list_failed(&parent, e),
                };
                let (node, q) = {
                    let foreign = self.foreign();
                    let q: Vec<(i64, String)> = queue(&children, &parent, &foreign)
                        .into_iter()
                        .map(|(s, n)| (s, n.to_owned()))
                        .collect();
                    (self.own_node(&q, &contender, &mut mine), q)
                };
                let Some(node_name) = node else {
                    // No node of ours: the create was not applied, or the node vanished
                    // (revoked by an operator, or the session expired). Queue again.
                    if session.ended() {
                        return Ok(Attempt::SessionEnded);
                    }
                    contender.state = GuardState::Creating;
                    continue 'create;
                };
                let path = format!("{parent}/{node_name}");
                contender.state = GuardState::Created(path.clone());
                let pos = q
                    .iter()
                    .position(|(_, n)| *n == node_name)
                    .expect("own node is in the queue");
                if pos == 0 {
                    let czxid = match &mine {
                        Some((_, Some(czxid))) => *czxid,
                        // Recovered after a lost reply: read its creation zxid.
                        _ => match retry(|| client.check_stat(&path)).await {
                            Ok(Some(stat)) => stat.czxid,
                            Ok(None) => continue,
                            Err(e) if is_session_end(&e) => return Ok(Attempt::SessionEnded),
                            Err(e) => return Err(map_err(format!("reading {path}"), e)),
                        },
                    };
                    contender.state = GuardState::Done;
                    return Ok(Attempt::Won(self.won(session, req, path, czxid, sent_at)));
                }
                if !wait {
                    // The guard deletes the node (sent at once, retried in the background).
                    self.note_outcome(&parent, false);
                    return Ok(Attempt::Busy);
                }
                let only_one_ahead = pos == 1;
                let predecessor = format!("{parent}/{}", q[pos - 1].1);
                match client.check_and_watch_stat(&predecessor).await {
                    // Gone before the watch was set: look again.
                    Ok((None, _)) => {}
                    Ok((Some(stat), _))
                        if contenders::cannot_hold(
                            &q[pos - 1].1,
                            stat.ephemeral_owner,
                            stat.czxid,
                            mine.as_ref().and_then(|(_, czxid)| *czxid),
                        ) =>
                    {
                        // Not a contender: someone made a node with a contender's name (see
                        // `cannot_hold`). Never wait on it (it would never go away).
                        tracing::warn!(path = %predecessor, "ignoring a forged node with a contender's name");
                        bump(&self.inner.stats.foreign_ignored);
                        let mut foreign = self.foreign();
                        if foreign.len() >= MAX_FOREIGN {
                            foreign.clear();
                        }
                        foreign.insert(predecessor);
                        listed = Some(Ok(children));
                        continue;
                    }
                    Ok((Some(_), watcher)) => {
                        let waiting = Waiting::new(&self.inner.stats.waiting);
                        let event = watcher.changed().await;
                        drop(waiting);
                        bump(&self.inner.stats.watch_wakeups);
                        match event.event_type {
                            zk::EventType::NodeDeleted if only_one_ahead => {
                                // Nothing else was ahead, and nodes created later sort after
                                // ours: the lock is ours without listing again. The TTL counts
                                // from now (the server keeps the node for the session, so no
                                // server-side clock runs on it).
                                if let Some((_, Some(czxid))) = mine {
                                    contender.state = GuardState::Done;
                                    return Ok(Attempt::Won(self.won(
                                        session,
                                        req,
                                        path,
                                        czxid,
                                        Instant::now(),
                                    )));
                                }
                            }
                            zk::EventType::Session if event.session_state.is_terminated() => {
                                return Ok(Attempt::SessionEnded);
                            }
                            // Another event (a reconnection, a data change): look again.
                            _ => {}
                        }
                    }
                    Err(e) if is_retryable(&e) => tokio::time::sleep(RETRY_PAUSE).await,
                    Err(e) if is_session_end(&e) => return Ok(Attempt::SessionEnded),
                    Err(e) => return Err(map_err(format!("watching {predecessor}"), e)),
                }
            }
        }
    }

    fn list_failed(&self, parent: &str, e: zk::Error) -> Result<Attempt> {
        if is_session_end(&e) {
            Ok(Attempt::SessionEnded)
        } else {
            Err(map_err(format!("listing {parent}"), e))
        }
    }

    /// Sends the create and, right behind it, the listing of the parent: the server handles
    /// a session's requests in order, so the listing sees the new node, and both cost one
    /// round trip.
    async fn create_and_list(
        &self,
        client: &zk::Client,
        parent: &str,
        contender: &ContenderGuard,
        data: &[u8],
    ) -> (
        ZkResult<(zk::Stat, zk::CreateSequence)>,
        ZkResult<Vec<String>>,
    ) {
        let prefix = format!("{parent}/{}", contender.name_prefix);
        let opts = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        // The node's data is the holder's metadata, read by `inspect`.
        let create = client.create(&prefix, data, &opts);
        let list = client.list_children(parent);
        let (created, listed) = tokio::join!(create, list);
        #[cfg(test)]
        let created = match created {
            Ok(_)
                if self
                    .inner
                    .drop_next_create_reply
                    .swap(false, Ordering::SeqCst) =>
            {
                Err(zk::Error::ConnectionLoss)
            }
            other => other,
        };
        (created, listed)
    }

    /// This contender's node in the queue `q`: every child with the caller's owner prefix is
    /// its own (a retried create may have made a second one after a lost reply); the lowest is
    /// kept and the others deleted, so the contender never waits on its own node. `mine` is
    /// the node known to be ours (name, creation zxid when known); it becomes the one kept.
    fn own_node(
        &self,
        q: &[(i64, String)],
        contender: &ContenderGuard,
        mine: &mut Option<(String, Option<i64>)>,
    ) -> Option<String> {
        let mut own = q
            .iter()
            .filter(|(_, n)| n.starts_with(&contender.name_prefix));
        let (_, keep) = own.next()?;
        for (_, extra) in own {
            bump(&self.inner.stats.duplicates_removed);
            tracing::debug!(node = %extra, "deleting a second node of one contender");
            let path = format!("{}/{extra}", contender.parent);
            let client = contender.client.clone();
            let delete = client.delete(&path, None);
            contender.background.spawn(async move {
                if let Err(e) = delete.await
                    && is_retryable(&e)
                {
                    let _ = retry(|| client.delete(&path, None)).await;
                }
            });
        }
        if !matches!(mine, Some((name, _)) if name == keep) {
            bump(&self.inner.stats.creates_recovered);
            tracing::debug!(node = %keep, "recovered a create whose reply was lost");
            *mine = Some((keep.clone(), None));
        }
        Some(keep.clone())
    }

    fn won(
        &self,
        session: &Arc<Session>,
        req: &AcquireRequest,
        path: String,
        czxid: i64,
        sent_at: Instant,
    ) -> Acquired {
        let id = session.register(req.lost.clone(), &self.inner.stats);
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.note_outcome(parent, true);
        }
        let lease = ZkLease {
            backend: self.clone(),
            session: session.clone(),
            id,
            path,
            czxid,
        };
        Acquired::new(lease, sent_at)
    }
}

enum Attempt {
    Won(Acquired),
    Busy,
    SessionEnded,
}

async fn retry<T, F, Fut>(f: F) -> ZkResult<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ZkResult<T>>,
{
    loop {
        match f().await {
            Err(e) if is_retryable(&e) => tokio::time::sleep(RETRY_PAUSE).await,
            other => return other,
        }
    }
}

#[derive(Debug)]
enum GuardState {
    /// A create may be in flight: clean up by owner token.
    Creating,
    /// Our node exists at this path.
    Created(String),
    /// Nothing to clean up (holder, or already deleted).
    Done,
}

/// Deletes the contender's node when an acquisition ends without the lock (cancelled, timed
/// out, failed, busy). Never blocks: the delete is sent from `drop` (the client sends requests
/// in call order) and its retries run on the request's [`Background`], which
/// `Locker::flush` waits for.
struct ContenderGuard {
    client: zk::Client,
    parent: String,
    name_prefix: String,
    background: Background,
    state: GuardState,
}

impl ContenderGuard {
    fn new(
        client: zk::Client,
        parent: String,
        name_prefix: String,
        background: Background,
    ) -> Self {
        ContenderGuard {
            client,
            parent,
            name_prefix,
            background,
            state: GuardState::Creating,
        }
    }
}

impl Drop for ContenderGuard {
    fn drop(&mut self) {
        let state = std::mem::replace(&mut self.state, GuardState::Done);
        let client = self.client.clone();
        match state {
            GuardState::Done => {}
            GuardState::Created(path) => {
                let first = client.delete(&path, None);
                self.background.spawn(async move {
                    if let Err(e) = first.await
                        && is_retryable(&e)
                    {
                        let _ = retry(|| client.delete(&path, None)).await;
                    }
                });
            }
            GuardState::Creating => {
                let (parent, prefix) = (self.parent.clone(), self.name_prefix.clone());
                // Listed after the create was sent, so the list sees its node if it was made.
                // (get_children's future owns its request; list_children's borrows the client.)
                let list = client.get_children(&parent);
                self.background.spawn(async move {
                    let children = match list.await {
                        Ok((c, _)) => c,
                        Err(e) if is_retryable(&e) => {
                            match retry(|| client.list_children(&parent)).await {
                                Ok(c) => c,
                                Err(_) => return,
                            }
                        }
                        Err(_) => return,
                    };
                    for child in children.iter().filter(|c| c.starts_with(&prefix)) {
                        let path = format!("{parent}/{child}");
                        let _ = retry(|| client.delete(&path, None)).await;
                    }
                });
            }
        }
    }
}

#[async_trait]
impl Backend for ZkBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    /// One attempt: list the children (a held lock costs this one read); if free, create a
    /// contender node and keep it only if it is the lowest.
    ///
    /// Cancel safety: a dropped attempt deletes its node in the background (found by owner
    /// token if the create was still in flight).
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        self.run(req, false, None).await
    }

    /// Queues behind the current holder and waits on a watch of the immediate predecessor;
    /// after a session expiry, queues again on the new session.
    ///
    /// Cancel safety: a dropped or timed-out wait deletes its node in the background.
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        match deadline {
            None => self.run(req, true, None).await,
            // No time to wait: a single attempt.
            Some(d) if d <= Instant::now() => self.run(req, false, None).await,
            Some(d) => match tokio::time::timeout_at(d, self.run(req, true, Some(d))).await {
                Ok(r) => r,
                // The dropped attempt's guard deletes the node.
                Err(_elapsed) => Ok(None),
            },
        }
    }

    async fn force_release(&self, name: &lockcore::LockName) -> Result<bool> {
        ZkBackend::force_release(self, name)
            .await
            .map(|deleted| deleted > 0)
    }

    async fn round_trip(&self) -> Result<()> {
        // `exists` on the root: the cheapest read that reaches the server.
        self.session()
            .client
            .check_stat("/")
            .await
            .map(drop)
            .map_err(|e| map_err("exists /", e))
    }

    /// The bare primitive: create an EPHEMERAL_SEQUENTIAL node under the lock's node, then
    /// delete it (two requests), without listing or watching.
    ///
    /// Cancel safety: a dropped cycle may leave its node until the session ends.
    async fn bare_cycle(&self, name: &lockcore::LockName) -> Result<()> {
        let client = self.live_session(None).await?.client.clone();
        let parent = self.parent_path(name);
        let opts = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let prefix = format!("{parent}/_bare-");
        loop {
            match client.create(&prefix, &[], &opts).await {
                Ok((_, seq)) => {
                    let path = format!("{prefix}{seq}");
                    return client
                        .delete(&path, None)
                        .await
                        .map_err(|e| map_err("deleting the bare node", e));
                }
                Err(zk::Error::NoNode) => self.ensure_parent(&client, &parent).await?,
                Err(e) => return Err(map_err("creating the bare node", e)),
            }
        }
    }

    /// The sum of `zk_packets_received` from the `mntr` four-letter command of every listed
    /// server (the server must whitelist `mntr`).
    ///
    /// Cancel safe.
    async fn server_requests(&self) -> Result<u64> {
        let mut total = 0;
        let mut last_err = None;
        let mut answered = false;
        for host in &self.inner.config.hosts {
            match four_letter(host, "mntr").await {
                Ok(text) => match mntr_value(&text, "zk_packets_received") {
                    Some(n) => {
                        total += n;
                        answered = true;
                    }
                    None => {
                        last_err = Some(Error::new(
                            lockcore::ErrorKind::Unsupported,
                            format!(
                                "{host}: mntr has no zk_packets_received (is mntr in 4lw.commands.whitelist?)"
                            ),
                        ))
                    }
                },
                Err(e) => last_err = Some(e),
            }
        }
        match (answered, last_err) {
            (true, _) => Ok(total),
            (false, Some(e)) => Err(e),
            (false, None) => Err(Error::new(
                lockcore::ErrorKind::Unavailable,
                "no ZooKeeper server answered mntr",
            )),
        }
    }

    /// The head contender's node: its data (the holder's metadata), creation time and zxid.
    ///
    /// Cancel safe.
    async fn inspect(&self, name: &lockcore::LockName) -> Result<lockcore::LockInfo> {
        self.inspect_lock(name).await
    }

    /// The contender nodes behind the head of the queue (one listing).
    ///
    /// Cancel safe.
    async fn queued_waiters(&self, name: &lockcore::LockName) -> Result<usize> {
        let client = self.live_session(None).await?.client.clone();
        let parent = self.parent_path(name);
        match retry(|| client.list_children(&parent)).await {
            Ok(children) => {
                let foreign = self.foreign();
                Ok(queue(&children, &parent, &foreign).len().saturating_sub(1))
            }
            Err(zk::Error::NoNode) => Ok(0),
            Err(e) => Err(map_err(format!("listing {parent}"), e)),
        }
    }

    fn describe(&self) -> String {
        self.inner.config.redacted(Some(self.inner.session_timeout))
    }
}

/// Sends a four-letter command to `host` and returns the answer.
async fn four_letter(host: &str, command: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = async {
        let mut stream = tokio::net::TcpStream::connect(host).await?;
        stream.write_all(command.as_bytes()).await?;
        let mut out = Vec::new();
        stream.read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    match tokio::time::timeout(Duration::from_secs(5), io).await {
        Ok(Ok(out)) => Ok(String::from_utf8_lossy(&out).into_owned()),
        Ok(Err(e)) => Err(Error::unavailable(format!("{command} to {host}"), e)),
        Err(_) => Err(Error::new(
            lockcore::ErrorKind::Unavailable,
            format!("{command} to {host}: no answer within 5 s"),
        )),
    }
}

/// The value of `key` in `mntr` output (`key<TAB>value` lines).
fn mntr_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once('\t')?;
        (k.trim() == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A held ZooKeeper lock: the contender node at the head of the queue.
struct ZkLease {
    backend: ZkBackend,
    session: Arc<Session>,
    /// Key in the session's registry of held leases.
    id: u64,
    path: String,
    czxid: i64,
}

impl fmt::Debug for ZkLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLease")
            .field("path", &self.path)
            .field("czxid", &self.czxid)
            .finish()
    }
}

impl Drop for ZkLease {
    fn drop(&mut self) {
        self.session.unregister(self.id);
    }
}

fn not_held(why: &str) -> Error {
    Error::not_held(format!("the ZooKeeper lock is no longer held: {why}"))
}

#[async_trait]
impl Lease for ZkLease {
    fn fencing_token(&self) -> Option<u64> {
        u64::try_from(self.czxid).ok()
    }

    /// Syncs with the leader and checks that the node is still this session's, in one round
    /// trip (the `exists` is sent right behind the `sync`, and the server answers a session's
    /// requests in order); the session itself is kept alive by the client's heartbeats.
    ///
    /// Cancel safety: read-only; dropping the future changes nothing.
    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        let client = &self.session.client;
        let state = client.state();
        if state == zk::SessionState::Expired {
            return Err(not_held("the session expired"));
        }
        if state.is_terminated() {
            return Err(Error::new(
                lockcore::ErrorKind::Unavailable,
                format!("the ZooKeeper session ended ({state})"),
            ));
        }
        if state != zk::SessionState::SyncConnected {
            return Err(Error::new(
                lockcore::ErrorKind::Unavailable,
                "disconnected from ZooKeeper; the session may still be alive",
            ));
        }
        let sync = client.sync(&self.path);
        let exists = client.check_stat(&self.path);
        let (synced, stat) = tokio::join!(sync, exists);
        match synced {
            Ok(()) => {}
            Err(zk::Error::SessionExpired) => return Err(not_held("the session expired")),
            Err(e) => return Err(map_err("syncing with the leader", e)),
        }
        match stat {
            Ok(Some(stat)) if stat.ephemeral_owner == self.session.id => Ok(ttl),
            Ok(_) => Err(not_held("the lock node was deleted")),
            Err(zk::Error::SessionExpired) => Err(not_held("the session expired")),
            Err(e) => Err(map_err("checking the lock node", e)),
        }
    }

    /// Deletes the node (the next waiter's watch fires).
    ///
    /// Cancel safety: dropping the future may leave the node in place until the session ends
    /// (the delete may already have been sent, in which case the lock is free).
    async fn release(&self) -> Result<()> {
        self.session.unregister(self.id);
        let client = &self.session.client;
        let inner = &self.backend.inner;
        let mut lost_reply = false;
        loop {
            match client.delete(&self.path, None).await {
                Ok(()) => break,
                // A retried delete whose first attempt was applied.
                Err(zk::Error::NoNode) if lost_reply => break,
                Err(zk::Error::NoNode) => return Err(not_held("the lock node was already gone")),
                Err(zk::Error::SessionExpired) => {
                    return Err(not_held(
                        "the session expired (the server deleted the node)",
                    ));
                }
                Err(e) if is_retryable(&e) => {
                    lost_reply = true;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(e) => return Err(map_err("deleting the lock node", e)),
            }
        }
        if !inner.containers.load(Ordering::Relaxed)
            && let Some((parent, _)) = self.path.rsplit_once('/')
        {
            // Best effort: fails with NotEmpty when someone queues; a contender that finds
            // the parent gone re-creates it (create_and_list handles NoNode).
            let f = client.delete(parent, None);
            tokio::spawn(async move {
                let _ = f.await;
            });
        }
        Ok(())
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn reason_for(state: zk::SessionState) -> LostReason {
    if state == zk::SessionState::Expired {
        LostReason::SessionExpired
    } else {
        LostReason::ConnectionLost
    }
}

/// The backend's one background task: watches each session in turn, reports held leases lost
/// (see the crate docs), and opens a new session after one ends. Ends with the backend.
async fn supervise(weak: Weak<Inner>, mut shutdown: watch::Receiver<()>) {
    let mut sessions = match weak.upgrade() {
        Some(inner) => inner.session.subscribe(),
        None => return,
    };
    loop {
        let session = sessions.borrow_and_update().clone();
        let Some((grace, config, reopen)) = weak
            .upgrade()
            .map(|i| (i.lost_after_disconnect, i.config.clone(), i.reopen))
        else {
            return;
        };
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = watch_session(&session, grace, &weak) => {}
        }
        drop(session);
        if !reopen {
            // The application's session: it opens the next one.
            return;
        }
        // The session ended: open a new one, with a bounded back-off while no server answers.
        let mut pause = Duration::from_millis(50);
        loop {
            let opened = tokio::select! {
                _ = shutdown.changed() => return,
                r = open_client(&config) => r,
            };
            match opened {
                Ok(client) => {
                    let Some(inner) = weak.upgrade() else { return };
                    bump(&inner.stats.sessions);
                    tracing::info!(
                        session = client.session_id().0,
                        "opened a new zookeeper session after the last one ended"
                    );
                    inner.session.send_replace(Session::new(client));
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "opening a new zookeeper session failed; retrying");
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

type SyncFuture = Pin<Box<dyn Future<Output = ZkResult<()>> + Send>>;

/// Watches one session until it ends, reporting held leases lost on a disconnection (after
/// `grace`), on a `sync` to the leader unanswered for a third of the session timeout, and on
/// the end of the session.
async fn watch_session(session: &Arc<Session>, grace: Duration, weak: &Weak<Inner>) {
    let client = session.client.clone();
    let mut states = client.state_watcher();
    let beat_every = client.session_timeout() / 3;
    let suspend = |reason: LostReason| {
        if let Some(inner) = weak.upgrade() {
            session.suspend(reason, &inner.stats);
        }
    };
    let mut disconnected_since: Option<Instant> = None;
    let mut next_beat = Instant::now() + beat_every;
    // The sync in flight and when it was sent.
    let mut beat: Option<(Instant, SyncFuture)> = None;
    let mut beat_late = false;
    loop {
        let state = states.peek_state();
        if state.is_terminated() {
            suspend(reason_for(state));
            return;
        }
        let grace_end = disconnected_since.map(|t| t + grace);
        let beat_deadline = beat
            .as_ref()
            .filter(|_| !beat_late)
            .map(|(sent, _)| *sent + beat_every);
        tokio::select! {
            state = states.changed() => {
                if state.is_terminated() {
                    continue;
                }
                if state == zk::SessionState::SyncConnected {
                    disconnected_since = None;
                    session.resume();
                } else if disconnected_since.is_none() {
                    if grace.is_zero() {
                        suspend(LostReason::ConnectionLost);
                    } else {
                        disconnected_since = Some(Instant::now());
                    }
                }
            }
            _ = sleep_until_opt(grace_end) => {
                disconnected_since = None;
                suspend(LostReason::ConnectionLost);
            }
            result = async { beat.as_mut().expect("guarded").1.as_mut().await }, if beat.is_some() => {
                beat = None;
                next_beat = Instant::now() + beat_every;
                if beat_late && result.is_ok() && states.peek_state() == zk::SessionState::SyncConnected {
                    // The leader answers again: new leases need not be reported lost.
                    session.resume();
                }
                beat_late = false;
            }
            _ = sleep_until_opt(beat_deadline) => {
                // Connected, but the leader does not answer: the session may be expiring.
                beat_late = true;
                tracing::warn!(session = session.id, "a sync to the zookeeper leader went unanswered for 1/3 of the session timeout; reporting held locks lost");
                suspend(LostReason::ConnectionLost);
            }
            _ = tokio::time::sleep_until(next_beat), if beat.is_none() => {
                next_beat = Instant::now() + beat_every;
                // Only while leases are held: an idle client sends nothing.
                if session.held() > 0 && states.peek_state() == zk::SessionState::SyncConnected {
                    let c = client.clone();
                    beat = Some((Instant::now(), Box::pin(async move { c.sync("/").await })));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mntr_parsing() {
        let text = "zk_version\t3.8.0\nzk_packets_received\t1234\nzk_packets_sent\t99\n";
        assert_eq!(mntr_value(text, "zk_packets_received"), Some(1234));
        assert_eq!(mntr_value(text, "zk_missing"), None);
    }

    /// Protection mode: a create applied by the server whose reply is lost is found again by
    /// the owner token, leaving exactly one node.
    #[tokio::test]
    async fn lost_create_reply_is_recovered() {
        let Some(url) = conformance::require_env("LOCK_TEST_ZK_URL") else {
            return;
        };
        let backend = ZkBackend::connect(&url).await.unwrap();
        let name = lockcore::LockName::new(format!("protect-{}", fastrand_suffix())).unwrap();
        let req = AcquireRequest::new(
            name.clone(),
            lockcore::OwnerToken::random(),
            Duration::from_secs(10),
        );
        backend
            .inner
            .drop_next_create_reply
            .store(true, Ordering::SeqCst);
        let acquired = backend.try_acquire(&req).await.unwrap().expect("free lock");
        assert_eq!(backend.stats().creates_recovered, 1);
        let parent = backend.parent_path(&name);
        let kids = backend.client().list_children(&parent).await.unwrap();
        assert_eq!(kids.len(), 1, "{kids:?}");
        assert!(kids[0].contains(&req.token.to_hex()));
        acquired.lease.release().await.unwrap();
    }

    fn fastrand_suffix() -> String {
        format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        )
    }
}
