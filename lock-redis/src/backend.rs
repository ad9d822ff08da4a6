//! [`RedisBackend`]: connecting a client and the `Backend` contract over the single-node
//! protocol (attempts in `attempt`, waiting in `wait`, leases in `lease`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::backend::{AcquireRequest, Acquired, Backend};
use lockcore::{Capabilities, Error, Instant, LockInfo, LockMode, LockName, Result};

use crate::attempt::Attempt;
use crate::batch::{Layout, Renewals};
use crate::client::Inner;
use crate::config::Config;
use crate::interop::Interop;
use crate::keys::Keys;
use crate::node::{self, Node, Replicas};
use crate::{capabilities, inspect, queue, shares};

/// A Redis (single node or Cluster) lock client. Every [`RedisBackend::connect`] makes a new,
/// independent client: one multiplexed reconnecting command connection, plus one pub/sub
/// connection opened on the first wait. Clones share them.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.inner.describe)
            .field("subscriptions", self.inner.node.subscriptions())
            .finish()
    }
}

impl RedisBackend {
    /// Parses `url` (see the [crate docs](crate) for its form and parameters) and connects a new
    /// client.
    ///
    /// Cancel safety: dropping the future closes whatever connection it had opened.
    ///
    /// # Errors
    /// `InvalidConfig` for a malformed URL, an unknown or malformed parameter, or an unreadable
    /// `tls_ca` file (the URL, which may hold a password, is never quoted); `Unavailable` when the
    /// server cannot be reached; `Auth` when it refuses the credentials (wrong password).
    pub async fn connect(url: &str) -> Result<RedisBackend> {
        Self::from_config(Config::parse(url)?).await
    }

    /// Connects a new client from a [`Config`] (deserialized from a config file, say), validated
    /// exactly as a URL is ([`Config::validate`]).
    ///
    /// Cancel safety: dropping the future closes whatever connection it had opened.
    ///
    /// # Errors
    /// As [`RedisBackend::connect`].
    pub async fn from_config(cfg: Config) -> Result<RedisBackend> {
        let cfg = cfg.validate()?;
        // Fails now, not at the first lock, on wrong credentials or an unreachable cluster.
        let node = Node::connect(&cfg).await?;
        Self::with_node(cfg, node).await
    }

    /// A backend on the settings of a `redis::Client` the application already has (address,
    /// TLS, credentials, database: no second URL or password to configure), with locks under
    /// `namespace` (empty: `locksmith`, as a URL without `namespace=`). Like every backend it
    /// opens its own connections with those settings (one multiplexed command connection, and
    /// one pub/sub connection on the first wait; RESP3, whatever the client asked): the
    /// application's connections are left alone. Single node only (a cluster or Sentinel setup
    /// goes through [`RedisBackend::connect`]).
    ///
    /// ```no_run
    /// # async fn f() -> lockcore::Result<()> {
    /// let client = redis::Client::open("redis://127.0.0.1/").unwrap();
    /// let backend = lock_redis::RedisBackend::from_client(&client, "app").await?;
    /// let locker = lockcore::Locker::new(backend);
    /// # Ok(()) }
    /// ```
    ///
    /// Cancel safety: dropping the future closes whatever connection it had opened.
    ///
    /// # Errors
    /// `InvalidConfig` for a bad namespace or a Unix-socket client; otherwise as
    /// [`RedisBackend::connect`].
    pub async fn from_client(client: &redis::Client, namespace: &str) -> Result<RedisBackend> {
        let info = client.get_connection_info();
        let (tls, host, port) = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => (false, host.clone(), *port),
            redis::ConnectionAddr::TcpTls { host, port, .. } => (true, host.clone(), *port),
            _ => {
                return Err(Error::invalid_config(
                    "a Redis client on a Unix socket is not supported; give a TCP client or a URL",
                ));
            }
        };
        // For describe(), errors and the options the client does not carry; the connection
        // settings are the client's own (the password is kept as a Secret, never shown).
        let mut cfg = Config::parse("redis://localhost")?;
        cfg.tls = tls;
        cfg.nodes = vec![(host, port)];
        cfg.username = info.redis_settings().username().map(str::to_owned);
        cfg.password = info.redis_settings().password().map(lockcore::Secret::new);
        cfg.db = info.redis_settings().db();
        if !namespace.is_empty() {
            cfg.namespace = namespace.to_owned();
        }
        let cfg = cfg.validate()?;
        let node = Node::from_client(&cfg, client).await?;
        Self::with_node(cfg, node).await
    }

    async fn with_node(cfg: Config, node: Node) -> Result<RedisBackend> {
        let wait_conn = if cfg.min_replicas > 0 {
            let extra = cfg.replica_timeout + Duration::from_millis(500);
            let replicas = Replicas {
                count: cfg.min_replicas,
                timeout: cfg.replica_timeout,
            };
            Some((node.slow_conn(extra).await?, replicas))
        } else {
            None
        };
        let caps = capabilities::for_config(&cfg);
        let describe = cfg.redacted();
        let interop = cfg.interop;
        // Before the first lock: a revocation of a lock this client holds must find it
        // listening.
        let revocations = match interop {
            Some(_) => None,
            None => node.listen_for_revocations().await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot subscribe to revocation notices; a revoked lock is noticed at its next renewal");
                None
            }),
        };
        let renewals =
            (!cfg.cluster && wait_conn.is_none() && interop.is_none_or(Interop::batched_renewals))
                .then(|| {
                    let layout = Layout {
                        namespace: cfg.namespace.clone(),
                        interop,
                    };
                    Renewals::start(node.conn(), layout)
                });
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                node,
                wait_conn,
                renewals,
                interop,
                caps,
                describe,
                revocations,
                lingering: Arc::default(),
            }),
        })
    }

    /// The keys and channel of `name`: locksmith's own layout, or the peer's under `interop=`.
    fn keys(&self, name: &LockName) -> Keys {
        self.inner.keys(name)
    }

    /// The peer this client shares its locks with (`interop=`), if any.
    pub fn interop(&self) -> Option<Interop> {
        self.inner.interop
    }

    /// The Redis key that holds the lock `name` (for operators and tests).
    pub fn lock_key(&self, name: &LockName) -> String {
        self.keys(name).lock
    }

    /// The pub/sub channel on which releases of `name` are announced.
    pub fn channel(&self, name: &LockName) -> String {
        self.keys(name).channel
    }

    /// The Redis key of the fencing counter of `name` (empty under `interop=`: no counter).
    pub fn fence_key(&self, name: &LockName) -> String {
        self.keys(name).fence
    }

    /// How many lock names this client holds pub/sub subscriptions (or pending unsubscriptions)
    /// for; zero once no `lock()` call waits and the last wait's subscription stopped lingering
    /// (a second after it ended).
    pub fn waited_names(&self) -> usize {
        // Not the namespace's revocation channel, which the client keeps for its lifetime.
        let revocations = usize::from(self.inner.revocations.is_some());
        self.inner
            .node
            .subscriptions()
            .tracked()
            .saturating_sub(revocations)
    }

    /// Deletes the lock `name` whoever holds it, as an administrator would, and wakes its
    /// waiters. Returns whether it was held. The holder learns it at once from the revocation
    /// notice (single node, see [`Capabilities::revoke_detection`]), else at its next renewal.
    /// [`Locker::force_release`](lockcore::Locker::force_release) does the same on every
    /// backend.
    ///
    /// Cancel safety: dropping the future may or may not have deleted the lock.
    ///
    /// # Errors
    /// `Unavailable` or `Backend` when the server fails.
    pub async fn force_release(&self, name: &LockName) -> Result<bool> {
        let keys = self.keys(name);
        let mut conn = self.inner.node.conn();
        match self.inner.interop {
            Some(peer) => peer.revoke(&mut conn, &keys).await,
            None => {
                let notice = node::revocation_channel(&self.inner.node.config().namespace);
                node::revoke_with_shares(&mut conn, &keys, Some(&notice)).await
            }
        }
    }

    /// Sends `PING` and returns once it is answered (for measuring the round trip).
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// `Unavailable` or `Backend` when the server fails.
    pub async fn ping(&self) -> Result<()> {
        node::ping(&mut self.inner.node.conn()).await
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    /// One atomic acquire script.
    ///
    /// Cancel safety: a dropped attempt may have taken the lock; it then frees after `req.ttl`.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        let keys = self.keys(&req.name);
        match self.inner.attempt(req, &keys, false, None).await? {
            Attempt::Won(a) => Ok(Some(a)),
            Attempt::Held { .. } => Ok(None),
        }
    }

    /// Waits by notification (see the crate docs): exclusive waiters in the name's server-side
    /// queue (see `queue`), woken only when a release names them as its head; readers woken all
    /// at once, in every client, by any release that names no queue head; permits (and every
    /// waiter under `interop=`) woken one per client by any release.
    ///
    /// Cancel safety: dropping the future unregisters the waiter (the last waiter of a name
    /// unsubscribes in the background) and takes it out of the queue in the background (on
    /// the connection of its attempts, so after an attempt still in flight; the next head is
    /// told if it was the head of a free lock); a lock won by an attempt in flight at the drop
    /// is released in the background. A waiter that times out or fails leaves the queue the
    /// same way. A crashed waiter's entry expires on the server's clock within
    /// `poll_ms + 2 s` of its last attempt.
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        self.inner.wait_for(req, deadline).await
    }

    /// How many exclusive waiters are in the server-side queue of `name` (live entries, by
    /// the server's clock); unsupported under `interop=` (no queue).
    ///
    /// Cancel safe.
    async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        if self.inner.interop.is_some() {
            return Err(Error::unsupported(
                "no waiters' queue under interop= (the peer's layout has none)",
            ));
        }
        queue::count(&mut self.inner.node.conn(), &self.inner.node.keys(name)).await
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        RedisBackend::force_release(self, name).await
    }

    /// One read-only script: the owner, its PTTL, the metadata beside it, the fencing counter.
    /// The queue is read by [`Backend::queued_waiters`], not here.
    ///
    /// Cancel safe.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        let keys = self.inner.node.keys(name);
        let mut conn = self.inner.node.conn();
        Ok(match inspect::read(&mut conn, &keys).await? {
            Some(v) => LockInfo::held(name.clone())
                .with_fencing_token(v.fence)
                .with_ttl_left(v.ttl_left)
                .with_holder(v.holder)
                .with_mode(Some(LockMode::Exclusive)),
            None => match shares::inspect(&mut conn, &keys).await? {
                (Some(mode), all) => LockInfo::held(name.clone())
                    .with_shares(all)
                    .with_mode(Some(mode)),
                (None, _) => LockInfo::free(name.clone(), None),
            },
        })
    }

    async fn round_trip(&self) -> Result<()> {
        RedisBackend::ping(self).await
    }

    /// `SET NX PX`, then the compare-and-delete script: two round trips, as the issue's bare
    /// primitive (see [`node::bare_cycle`]).
    async fn bare_cycle(&self, name: &LockName) -> Result<()> {
        node::bare_cycle(&mut self.inner.node.conn(), &self.inner.node.keys(name)).await
    }

    /// The sum of `calls=` over `INFO commandstats` (on a cluster, over every primary).
    async fn server_requests(&self) -> Result<u64> {
        node::server_requests(&mut self.inner.node.conn()).await
    }

    async fn server_version(&self) -> Option<String> {
        node::server_version(&mut self.inner.node.conn()).await.ok()
    }

    fn describe(&self) -> String {
        self.inner.describe.clone()
    }
}
