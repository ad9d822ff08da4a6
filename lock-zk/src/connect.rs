//! Connecting: from a URL, a [`Config`], a builder or an application's client; the backend
//! assembled on its first session, and what it can do.

use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::{Capabilities, RenewKind, Result, WaitKind};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::backend::{Inner, ZkBackend};
use crate::config::{self, Config};
use crate::contenders::Interop;
use crate::session::{Session, open_client};
use crate::stats::{Stats, bump};
use crate::supervisor::supervise;

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

impl ZkBackend {
    /// Parses `url` (see the crate docs), opens a new ZooKeeper session and makes sure the
    /// namespace node exists.
    ///
    /// Cancel safety: dropping the future before it completes closes the half-open session.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockcore::ErrorKind::InvalidConfig) for a malformed URL
    /// (before any I/O); [`ErrorKind::Unavailable`](lockcore::ErrorKind::Unavailable) when no
    /// server answers; [`ErrorKind::Auth`](lockcore::ErrorKind::Auth) when the credentials do
    /// not open the namespace node (NoAuth, AuthFailed);
    /// [`ErrorKind::Backend`](lockcore::ErrorKind::Backend) when the server refuses otherwise.
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

    pub(crate) async fn open(config: Config) -> Result<ZkBackend> {
        let client = open_client(&config).await?;
        Self::open_on(config, client, true).await
    }

    /// The backend on session `client`; `reopen`: open a new session after it ends.
    pub(crate) async fn open_on(
        config: Config,
        client: zk::Client,
        reopen: bool,
    ) -> Result<ZkBackend> {
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
        tracing::debug!(backend = %backend.redacted_url(), "zookeeper session open");
        Ok(backend)
    }

    pub(crate) fn capabilities_for(
        session_timeout: Duration,
        lost_after: Duration,
        with_acl: bool,
        interop: Interop,
    ) -> Capabilities {
        let mut c = Capabilities::default();
        // Readers are named as Curator's (`__READ__`) or kazoo's (`__rlock__`) read-write lock
        // names them; permits have a name in locksmith's own layout only.
        c.shared = lockcore::Support::Yes;
        c.permits = match interop {
            Interop::Kazoo => lockcore::Support::no(
                "interop=kazoo names nodes as kazoo's locks do, and kazoo has no semaphore in a lock node (its Semaphore keeps leases in a directory of its own): use the default layout for permits",
            ),
            _ => lockcore::Support::Yes,
        };
        c.fencing = true;
        c.fair = true;
        c.wait = WaitKind::Notify;
        c.renew = RenewKind::Native;
        c.lost_detection = true;
        // Session loss is reported by the session task; a lock node deleted behind its holder
        // (an operator's force release) by the lease's watch on its own node.
        c.revoke_detection = true;
        c.loss_detection = lockcore::LossDetection::Pushed {
            within: Duration::from_secs(1),
        };
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
        c.compatibility = crate::compat::table();
        c.notes = vec![
            "a lock node deleted behind its holder (force release) is noticed at once: each held lease watches its own node (one exists request per acquisition), and its lost signal fires when the server reports the node deleted".into(),
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
            "fencing token = creation zxid of the holder's node (one counter across exclusive, shared and permit holders); FIFO by sequence number; one release wakes one waiter (a permit's release at most `limit`, the waiters right behind it)".into(),
            "shared holders in Curator's InterProcessReadWriteLock layout (__READ__ readers; kazoo's __rlock__ with interop=kazoo): a waiting writer queues later readers; permits as __PERMIT__<limit>-lock- nodes (which Curator's InterProcessMutex queues behind); another use of a held name (another limit, a permit beside a lock) is a Conflict".into(),
            match interop {
                Interop::Kazoo => "interop=kazoo: nodes named as kazoo's Lock names them (kazoo waits for them); Curator and go-zookeeper clients must not use these lock nodes (they do not order kazoo's names by sequence)".into(),
                _ => "Curator's protected-mode node names: Curator's InterProcessMutex and go-zookeeper's Lock on the same node exclude locksmith and are excluded; kazoo needs interop=kazoo or extra_lock_patterns=[\"-lock-\"]".into(),
            },
        ];
        c
    }
}
