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
//! | `digest` | none | `user:password` for ZooKeeper `digest` auth; lock nodes then get the ACL creator-all + world-read |
//!
//! Unknown or malformed parameters are [`ErrorKind::InvalidConfig`](lockcore::ErrorKind) errors.
//! The digest password never appears in `Debug`, [`Backend::describe`], logs or errors.
//!
//! # The recipe
//!
//! A lock `name` is the node `<chroot>/<namespace>/<name.escaped()>` (a CONTAINER node, so the
//! server removes it once empty; persistent plus a best-effort delete on servers without
//! containers). Each contender creates an EPHEMERAL_SEQUENTIAL child `_c_<owner-token>-lock-<seq>`,
//! lists the children and holds the lock when its sequence is the lowest; otherwise it sets a
//! one-shot data watch on its immediate predecessor only (one release wakes one waiter) and
//! re-checks when it fires. The owner token in the name makes a create whose reply was lost
//! recoverable (Curator's protection mode): after the reconnection the contender finds its own
//! node among the children instead of leaving an orphan.
//!
//! * Fencing token: the creation zxid of the holder's node, which increases across successive
//!   holders even when the parent node was deleted and re-created.
//! * The lease is the ZooKeeper session: the server keeps the node while the session lives;
//!   the TTL is enforced by lockcore's validity watchdog, and `extend` verifies the session and
//!   the node with one `exists` round trip.
//! * Lost signal: session expiry ([`LostReason::SessionExpired`]), the node deleted by someone
//!   else ([`LostReason::RenewalRefused`]), or a disconnection lasting long enough that the
//!   session may be expiring on the server ([`LostReason::ConnectionLost`]; see
//!   [`ZkBackend::lost_after_disconnect`]).
//!
//! Each [`ZkBackend::connect`] opens its own session; clones of a `Locker` share it.
#![deny(missing_docs)]

mod config;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lockcore::backend::{AcquireRequest, Acquired, Backend, Lease, LostNotifier, async_trait};
use lockcore::{
    Capabilities, Error, Instant, IntoLockName, LostReason, RenewKind, Result, WaitKind,
};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::config::Config;

type ZkResult<T> = std::result::Result<T, zk::Error>;

/// Every contender node name starts with this, then the owner token.
const NODE_PREFIX: &str = "_c_";
/// Between the owner token and the server-assigned sequence number.
const NODE_MARK: &str = "-lock-";
/// Pause between retries of an idempotent request after a connection loss (the client queues
/// requests until it has reconnected, so this only avoids a hot loop on a flapping link).
const RETRY_PAUSE: Duration = Duration::from_millis(20);

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
    /// Lost signals fired by this backend (not by lockcore's watchdog).
    pub lost_fired: u64,
    /// Contenders waiting right now on a predecessor watch that the server has set.
    pub waiting: u64,
}

#[derive(Debug, Default)]
struct Stats {
    watch_wakeups: AtomicU64,
    nodes_created: AtomicU64,
    creates_recovered: AtomicU64,
    lost_fired: AtomicU64,
    waiting: AtomicU64,
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

/// A ZooKeeper lock client: one session. See the crate docs for the URL and the recipe.
#[derive(Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: zk::Client,
    config: Config,
    base: String,
    capabilities: Capabilities,
    session_timeout: Duration,
    lost_after_disconnect: Duration,
    /// Cleared when the server refuses CONTAINER nodes; parents are then persistent and
    /// deleted (best effort) on release.
    containers: AtomicBool,
    stats: Stats,
    /// Test hook: the next create "loses" its reply after the server applied it.
    #[cfg(test)]
    drop_next_create_reply: AtomicBool,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("url", &self.describe())
            .field("session_id", &self.inner.client.session_id())
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
        _ => Error::backend(what, e),
    }
}

fn is_retryable(e: &zk::Error) -> bool {
    matches!(e, zk::Error::ConnectionLoss)
}

/// The sequence number of a contender node name, `None` for foreign nodes.
fn sequence_of(name: &str) -> Option<i64> {
    if !name.starts_with(NODE_PREFIX) {
        return None;
    }
    let (_, seq) = name.rsplit_once(NODE_MARK)?;
    if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    seq.parse().ok()
}

/// Contender names sorted by sequence (the queue order).
fn queue(children: &[String]) -> Vec<(i64, &str)> {
    let mut q: Vec<(i64, &str)> = children
        .iter()
        .filter_map(|c| sequence_of(c).map(|s| (s, c.as_str())))
        .collect();
    q.sort_unstable();
    q
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
        let config = Config::parse(url)?;
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
        let client = match tokio::time::timeout(connect_bound, connector.connect(&hosts)).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(map_err(format!("connecting to ZooKeeper at {hosts}"), e)),
            Err(_) => {
                return Err(Error::new(
                    lockcore::ErrorKind::Unavailable,
                    format!(
                        "connecting to ZooKeeper at {hosts}: no session within {connect_bound:?}"
                    ),
                ));
            }
        };
        let session_timeout = client.session_timeout();
        // The client declares a silent connection dead after 2/5 of the session timeout without
        // a reply; 4/15 more makes ConnectionLost fire at most 2/3 of the session timeout after
        // the last reply, before the server can have expired the session (it waits a full
        // timeout after the last request it heard).
        let lost_after_disconnect = session_timeout * 4 / 15;
        let base = config.base_path();
        let inner = Inner {
            capabilities: Self::capabilities_for(session_timeout, lost_after_disconnect),
            client,
            base,
            session_timeout,
            lost_after_disconnect,
            containers: AtomicBool::new(true),
            stats: Stats::default(),
            #[cfg(test)]
            drop_next_create_reply: AtomicBool::new(false),
            config,
        };
        let backend = ZkBackend {
            inner: Arc::new(inner),
        };
        backend.ensure_base().await?;
        tracing::debug!(backend = %backend.describe(), "zookeeper session open");
        Ok(backend)
    }

    fn capabilities_for(session_timeout: Duration, lost_after: Duration) -> Capabilities {
        let mut c = Capabilities::default();
        c.fencing = true;
        c.fair = true;
        c.wait = WaitKind::Notify;
        c.renew = RenewKind::Native;
        c.lost_detection = true;
        c.reentrant = false;
        // A crashed holder's node lives until its session times out, one session timeout
        // after its last heartbeat whatever the TTL asked for (earlier than the TTL when the
        // TTL is longer, later when shorter), and a lease used without lockcore's watchdog
        // never expires by time at all while its session lives. So the lock does not expire
        // "after the TTL".
        c.expiry_after_ttl = false;
        c.force_release = true;
        // The TTL is lockcore's validity deadline, enforced by its watchdog (which releases
        // the node when it passes); the session keeps the node alive meanwhile, so any TTL
        // works. Below 10 ms renewal would be mostly round trips.
        c.min_ttl = Duration::from_millis(10);
        c.max_ttl = lockcore::MAX_TTL;
        c.notes = vec![
            format!(
                "the lease is the ZooKeeper session (negotiated timeout {} ms): a crashed holder's lock frees one session timeout after its last heartbeat, independent of the TTL",
                session_timeout.as_millis()
            ),
            "the TTL is enforced by lockcore's validity watchdog; extend() checks the session and the node with one exists round trip".into(),
            format!(
                "lost signal: session expiry, lock node deleted by someone else, or disconnected for {} ms (at most 2/3 of the session timeout after the last server reply)",
                lost_after.as_millis()
            ),
            "with a TTL longer than the session timeout, a partitioned holder relies on the lost signal (checked by is_valid) rather than the validity deadline".into(),
            "fencing token = creation zxid of the holder's node; FIFO by sequence number; one release wakes one waiter".into(),
        ];
        c
    }

    /// The session timeout the server granted.
    pub fn session_timeout(&self) -> Duration {
        self.inner.session_timeout
    }

    /// How long a disconnection lasts before held leases are reported lost with
    /// [`LostReason::ConnectionLost`]: 4/15 of the session timeout, which with the client's
    /// dead-connection detection (2/5 of the session timeout without a reply) bounds the loss
    /// report to 2/3 of the session timeout after the last reply from the server.
    pub fn lost_after_disconnect(&self) -> Duration {
        self.inner.lost_after_disconnect
    }

    /// Whether lock nodes are CONTAINER nodes (removed by the server once empty); false after
    /// the server refused them, in which case releases delete empty lock nodes (best effort).
    pub fn uses_containers(&self) -> bool {
        self.inner.containers.load(Ordering::Relaxed)
    }

    /// The ZooKeeper session id.
    pub fn session_id(&self) -> i64 {
        self.inner.client.session_id().0
    }

    /// Counters of what this backend did.
    pub fn stats(&self) -> ZkStats {
        let s = &self.inner.stats;
        ZkStats {
            watch_wakeups: s.watch_wakeups.load(Ordering::Relaxed),
            nodes_created: s.nodes_created.load(Ordering::Relaxed),
            creates_recovered: s.creates_recovered.load(Ordering::Relaxed),
            lost_fired: s.lost_fired.load(Ordering::Relaxed),
            waiting: s.waiting.load(Ordering::Relaxed),
        }
    }

    /// The underlying client (sharing this backend's session), for advanced use and tests.
    /// Deleting lock nodes through it breaks the locks they carry.
    pub fn client(&self) -> &zk::Client {
        &self.inner.client
    }

    /// The node of lock `name` whose children are the contenders.
    pub fn lock_path(&self, name: impl IntoLockName) -> Result<String> {
        Ok(self.parent_path(&name.into_lock_name()?))
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

    /// Deletes every contender node of `name` (the holder's and the waiters'), as an operator's
    /// override: the holder's lost signal fires and waiters queue again. Returns how many
    /// nodes were deleted. Needs an identity allowed to delete them (the same digest user).
    ///
    /// Cancel safety: dropping the future may leave some nodes deleted and others not.
    ///
    /// # Errors
    /// `InvalidName`; `Unavailable` or `Backend` (NoAuth included) from ZooKeeper.
    pub async fn force_release(&self, name: impl IntoLockName) -> Result<usize> {
        let parent = self.parent_path(&name.into_lock_name()?);
        let children = match self
            .retry(|| self.inner.client.list_children(&parent))
            .await
        {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(0),
            Err(e) => return Err(map_err("listing contenders", e)),
        };
        let mut deleted = 0;
        for (_, child) in queue(&children) {
            let path = format!("{parent}/{child}");
            match self.retry(|| self.inner.client.delete(&path, None)).await {
                Ok(()) => deleted += 1,
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(map_err("deleting a contender node", e)),
            }
        }
        Ok(deleted)
    }

    /// Retries an idempotent request after connection losses (the session survives them;
    /// terminal errors such as SessionExpired end the loop).
    async fn retry<T, F, Fut>(&self, f: F) -> ZkResult<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = ZkResult<T>>,
    {
        retry(f).await
    }

    async fn ensure_base(&self) -> Result<()> {
        let opts = zk::CreateMode::Persistent.with_acls(self.acls());
        let base = &self.inner.base;
        self.retry(|| self.inner.client.mkdir(base, &opts))
            .await
            .map_err(|e| map_err(format!("creating the namespace node {base}"), e))
    }

    /// Creates the lock's parent node if missing (a CONTAINER where the server has them).
    async fn ensure_parent(&self, parent: &str) -> Result<()> {
        for _ in 0..8 {
            let containers = self.inner.containers.load(Ordering::Relaxed);
            let mode = if containers {
                zk::CreateMode::Container
            } else {
                zk::CreateMode::Persistent
            };
            match self
                .inner
                .client
                .create(parent, &[], &mode.with_acls(self.acls()))
                .await
            {
                Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
                Err(zk::Error::Unimplemented) if containers => {
                    tracing::info!("server refuses CONTAINER nodes; using persistent lock nodes");
                    self.inner.containers.store(false, Ordering::Relaxed);
                }
                // The namespace (or chroot) node went away: make it again.
                Err(zk::Error::NoNode) => self.ensure_base().await?,
                Err(e) if is_retryable(&e) => tokio::time::sleep(RETRY_PAUSE).await,
                Err(e) => return Err(map_err(format!("creating the lock node {parent}"), e)),
            }
        }
        Err(Error::new(
            lockcore::ErrorKind::Backend,
            format!("could not create the lock node {parent}: it keeps disappearing"),
        ))
    }

    /// Creates this contender's node, recovering a create whose reply was lost.
    async fn create_contender(&self, parent: &str, contender: &mut ContenderGuard) -> Result<Node> {
        let prefix = format!("{parent}/{}", contender.name_prefix);
        let opts = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let client = &self.inner.client;
        loop {
            contender.state = GuardState::Creating;
            let result = client.create(&prefix, &[], &opts).await;
            #[cfg(test)]
            let result = match result {
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
            match result {
                Ok((stat, seq)) => {
                    self.inner
                        .stats
                        .nodes_created
                        .fetch_add(1, Ordering::Relaxed);
                    let name = format!("{}{seq}", contender.name_prefix);
                    let path = format!("{parent}/{name}");
                    contender.state = GuardState::Created(path.clone());
                    return Ok(Node {
                        path,
                        name,
                        czxid: stat.czxid,
                    });
                }
                Err(zk::Error::NoNode) => self.ensure_parent(parent).await?,
                Err(e) if is_retryable(&e) => {
                    // The create may or may not have been applied: look for our own node by
                    // the owner token in its name (protection mode).
                    if let Some(node) = self.find_own(parent, &contender.name_prefix).await? {
                        self.inner
                            .stats
                            .creates_recovered
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(path = %node.path, "recovered a create whose reply was lost");
                        contender.state = GuardState::Created(node.path.clone());
                        return Ok(node);
                    }
                }
                Err(e) => {
                    return Err(map_err(
                        format!("creating a contender node under {parent}"),
                        e,
                    ));
                }
            }
        }
    }

    async fn find_own(&self, parent: &str, name_prefix: &str) -> Result<Option<Node>> {
        let client = &self.inner.client;
        let children = match self.retry(|| client.list_children(parent)).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(map_err(format!("listing {parent}"), e)),
        };
        let Some(name) = children
            .into_iter()
            .find(|c| c.starts_with(name_prefix) && sequence_of(c).is_some())
        else {
            return Ok(None);
        };
        let path = format!("{parent}/{name}");
        match self.retry(|| client.check_stat(&path)).await {
            Ok(Some(stat)) => Ok(Some(Node {
                path,
                name,
                czxid: stat.czxid,
            })),
            Ok(None) => Ok(None),
            Err(e) => Err(map_err(format!("reading {path}"), e)),
        }
    }

    /// The recipe. `wait == false`: one attempt (the node is deleted again if not lowest).
    /// Waits without deadline otherwise: the caller bounds it by dropping the future, and the
    /// contender guard then deletes the node.
    async fn run(&self, req: &AcquireRequest, wait: bool) -> Result<Option<Acquired>> {
        let parent = self.parent_path(&req.name);
        let client = &self.inner.client;
        let mut contender = ContenderGuard::new(client.clone(), parent.clone(), req.token);
        'create: loop {
            let node = self.create_contender(&parent, &mut contender).await?;
            loop {
                // Taken before the request that may prove us the holder: the server hears it
                // later, so the session (and node) lives at least a session timeout past it.
                let sent_at = Instant::now();
                let children = match self.retry(|| client.list_children(&parent)).await {
                    Ok(c) => c,
                    Err(zk::Error::NoNode) => Vec::new(),
                    Err(e) => return Err(map_err(format!("listing {parent}"), e)),
                };
                let q = queue(&children);
                let Some(pos) = q.iter().position(|(_, n)| *n == node.name) else {
                    // Our node vanished: revoked by an operator, or the session expired (then
                    // the next request fails with SessionExpired). Queue again.
                    if client.state().is_terminated() {
                        return Err(Error::new(
                            lockcore::ErrorKind::Unavailable,
                            format!("the ZooKeeper session ended ({})", client.state()),
                        ));
                    }
                    contender.state = GuardState::Done;
                    continue 'create;
                };
                if pos == 0 {
                    contender.state = GuardState::Done;
                    let lease = self.lease(req, node);
                    return Ok(Some(Acquired::new(lease, sent_at)));
                }
                if !wait {
                    contender.state = GuardState::Done;
                    return match retry(|| client.delete(&node.path, None)).await {
                        Ok(()) | Err(zk::Error::NoNode) => Ok(None),
                        Err(e) => {
                            // Leave it to the background clean-up rather than fail the attempt.
                            contender.state = GuardState::Created(node.path.clone());
                            tracing::debug!(error = %e, "deleting a losing try_lock node failed; retrying in the background");
                            Ok(None)
                        }
                    };
                }
                let predecessor = format!("{parent}/{}", q[pos - 1].1);
                match client.get_and_watch_data(&predecessor).await {
                    // Gone before the watch was set: look again.
                    Err(zk::Error::NoNode) => continue,
                    Err(e) if is_retryable(&e) => tokio::time::sleep(RETRY_PAUSE).await,
                    Err(e) => return Err(map_err(format!("watching {predecessor}"), e)),
                    Ok((_, _, watcher)) => {
                        let waiting = Waiting::new(&self.inner.stats.waiting);
                        let event = watcher.changed().await;
                        drop(waiting);
                        self.inner
                            .stats
                            .watch_wakeups
                            .fetch_add(1, Ordering::Relaxed);
                        if event.event_type == zk::EventType::Session
                            && event.session_state.is_terminated()
                        {
                            return Err(Error::new(
                                lockcore::ErrorKind::Unavailable,
                                format!(
                                    "the ZooKeeper session ended ({}) while waiting",
                                    event.session_state
                                ),
                            ));
                        }
                    }
                }
            }
        }
    }

    fn lease(&self, req: &AcquireRequest, node: Node) -> ZkLease {
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = Arc::new(LeaseShared {
            backend: self.clone(),
            path: node.path,
            czxid: node.czxid,
            stop: stop_tx,
        });
        tokio::spawn(watch_lease(shared.clone(), req.lost.clone(), stop_rx));
        ZkLease { shared }
    }
}

async fn retry<T, F, Fut>(f: F) -> ZkResult<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ZkResult<T>>,
{
    loop {
        match f().await {
            Err(e) if is_retryable(&e) => tokio::time::sleep(RETRY_PAUSE).await,
            other => return other,
        }
    }
}

#[derive(Debug)]
struct Node {
    path: String,
    name: String,
    czxid: i64,
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
/// out, failed). Never blocks: the delete is sent from `drop` (the client sends requests in
/// call order) and its retries run in a spawned task.
struct ContenderGuard {
    client: zk::Client,
    parent: String,
    name_prefix: String,
    state: GuardState,
}

impl ContenderGuard {
    fn new(client: zk::Client, parent: String, token: lockcore::OwnerToken) -> Self {
        ContenderGuard {
            client,
            parent,
            name_prefix: format!("{NODE_PREFIX}{}{NODE_MARK}", token.to_hex()),
            state: GuardState::Creating,
        }
    }
}

impl Drop for ContenderGuard {
    fn drop(&mut self) {
        let state = std::mem::replace(&mut self.state, GuardState::Done);
        if matches!(state, GuardState::Done) {
            return;
        }
        // Without a runtime the session's end removes the ephemeral node anyway.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        match state {
            GuardState::Created(path) => {
                let first = client.delete(&path, None);
                rt.spawn(async move {
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
                rt.spawn(async move {
                    let Ok(children) = retry(|| client.list_children(&parent)).await else {
                        return;
                    };
                    for child in children.iter().filter(|c| c.starts_with(&prefix)) {
                        let path = format!("{parent}/{child}");
                        let _ = retry(|| client.delete(&path, None)).await;
                    }
                });
            }
            GuardState::Done => {}
        }
    }
}

#[async_trait]
impl Backend for ZkBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    /// One attempt: create a contender node, and keep it only if it is the lowest.
    ///
    /// Cancel safety: a dropped attempt deletes its node in the background (found by owner
    /// token if the create was still in flight).
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        self.run(req, false).await
    }

    /// Queues behind the current holder and waits on a watch of the immediate predecessor.
    ///
    /// Cancel safety: a dropped or timed-out wait deletes its node in the background.
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        match deadline {
            None => self.run(req, true).await,
            // No time to wait: a single attempt.
            Some(d) if d <= Instant::now() => self.run(req, false).await,
            Some(d) => match tokio::time::timeout_at(d, self.run(req, true)).await {
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
        self.inner
            .client
            .check_stat("/")
            .await
            .map(drop)
            .map_err(|e| map_err("exists /", e))
    }

    fn describe(&self) -> String {
        self.inner.config.redacted(Some(self.inner.session_timeout))
    }
}

struct LeaseShared {
    backend: ZkBackend,
    path: String,
    czxid: i64,
    /// Set before the release deletes the node, so the watcher does not report our own
    /// delete as a loss; also stops the watcher.
    stop: watch::Sender<bool>,
}

/// A held ZooKeeper lock: the contender node at the head of the queue.
struct ZkLease {
    shared: Arc<LeaseShared>,
}

impl fmt::Debug for ZkLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLease")
            .field("path", &self.shared.path)
            .field("czxid", &self.shared.czxid)
            .finish()
    }
}

fn not_held(why: &str) -> Error {
    Error::not_held(format!("the ZooKeeper lock is no longer held: {why}"))
}

#[async_trait]
impl Lease for ZkLease {
    fn fencing_token(&self) -> Option<u64> {
        u64::try_from(self.shared.czxid).ok()
    }

    /// Checks that the session is connected and the node is still ours (one `exists` round
    /// trip); the session itself is kept alive by the client's heartbeats.
    ///
    /// Cancel safety: read-only; dropping the future changes nothing.
    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        let client = &self.shared.backend.inner.client;
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
        match client.check_stat(&self.shared.path).await {
            Ok(Some(stat)) if stat.ephemeral_owner == client.session_id().0 => Ok(ttl),
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
        let shared = &self.shared;
        shared.stop.send_replace(true);
        let inner = &shared.backend.inner;
        let mut lost_reply = false;
        loop {
            match inner.client.delete(&shared.path, None).await {
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
            && let Some((parent, _)) = shared.path.rsplit_once('/')
        {
            // Best effort: fails with NotEmpty when someone queues; a contender that finds
            // the parent gone re-creates it (create_contender handles NoNode).
            let f = inner.client.delete(parent, None);
            tokio::spawn(async move {
                let _ = f.await;
            });
        }
        Ok(())
    }
}

enum NodeOutcome {
    Deleted,
    SessionEnded(zk::SessionState),
    Failed(zk::Error),
}

/// Watches the holder's own node until it is deleted or the session ends.
async fn watch_node(client: zk::Client, path: String, session: i64) -> NodeOutcome {
    loop {
        match client.check_and_watch_stat(&path).await {
            Ok((None, _)) => return NodeOutcome::Deleted,
            Ok((Some(stat), _)) if stat.ephemeral_owner != session => return NodeOutcome::Deleted,
            Ok((Some(_), watcher)) => {
                let event = watcher.changed().await;
                match event.event_type {
                    zk::EventType::NodeDeleted => return NodeOutcome::Deleted,
                    zk::EventType::Session if event.session_state.is_terminated() => {
                        return NodeOutcome::SessionEnded(event.session_state);
                    }
                    // Data changed or a non-terminal session event: watch again.
                    _ => {}
                }
            }
            Err(e) if is_retryable(&e) => tokio::time::sleep(RETRY_PAUSE).await,
            Err(zk::Error::SessionExpired) => {
                return NodeOutcome::SessionEnded(zk::SessionState::Expired);
            }
            Err(e) => return NodeOutcome::Failed(e),
        }
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

/// Fires the lost signal of one lease; ends when the lease is released or nobody listens.
async fn watch_lease(
    shared: Arc<LeaseShared>,
    lost: LostNotifier,
    mut stop: watch::Receiver<bool>,
) {
    let inner = &shared.backend.inner;
    let client = &inner.client;
    let mut states = client.state_watcher();
    let connected = |s: zk::SessionState| s == zk::SessionState::SyncConnected;
    let mut disconnected_since = (!connected(states.state())).then(Instant::now);
    let node = watch_node(client.clone(), shared.path.clone(), client.session_id().0);
    tokio::pin!(node);
    let mut node_done = false;
    let reason = loop {
        if let Some(s) = Some(states.peek_state()).filter(|s| s.is_terminated()) {
            break reason_for(s);
        }
        let lost_at = disconnected_since.map(|t| t + inner.lost_after_disconnect);
        tokio::select! {
            _ = lost.closed() => return,
            _ = stop.wait_for(|s| *s) => return,
            state = states.changed() => {
                if state.is_terminated() {
                    break reason_for(state);
                }
                if connected(state) {
                    disconnected_since = None;
                } else if disconnected_since.is_none() {
                    disconnected_since = Some(Instant::now());
                }
            }
            _ = sleep_until_opt(lost_at) => break LostReason::ConnectionLost,
            outcome = &mut node, if !node_done => match outcome {
                NodeOutcome::Deleted => break LostReason::RenewalRefused,
                NodeOutcome::SessionEnded(s) => break reason_for(s),
                NodeOutcome::Failed(e) => {
                    tracing::warn!(error = %e, path = %shared.path, "watching the lock node failed; only the session is watched now");
                    node_done = true;
                }
            },
        }
    };
    // Our own release deletes the node too: not a loss.
    if *stop.borrow() {
        return;
    }
    if lost.fire(reason) {
        inner.stats.lost_fired.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(path = %shared.path, %reason, "zookeeper lock lost");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_parsing_and_order() {
        let kids: Vec<String> = [
            "_c_bbb-lock-0000000010",
            "_c_aaa-lock-0000000002",
            "foreign",
            "_c_ccc-lock-x",
            "_c_ddd-lock-0000000003",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let q = queue(&kids);
        let names: Vec<&str> = q.iter().map(|(_, n)| *n).collect();
        assert_eq!(
            names,
            [
                "_c_aaa-lock-0000000002",
                "_c_ddd-lock-0000000003",
                "_c_bbb-lock-0000000010"
            ]
        );
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
