//! Connecting: the channel's options (TLS, credentials, require-leader), the members that
//! answer, the backend assembled on a connected client, and what it can do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use lockcore::{Capabilities, Error, RenewKind, Result, WaitKind};

use crate::backend::{EtcdBackend, Inner, Stats};
use crate::config::Config;
use crate::errors::{map_err, timed_out};
use crate::keeper::Keeper;
use crate::members::{PROBE_TIMEOUT, probe, track_members};
use crate::watch::Dispatch;

/// The largest TTL accepted (etcd's own maximum lease TTL is 9,000,000,000 s; a day is plenty).
pub(crate) const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// The host a backend made from an application's client reports (it cannot see the client's
/// endpoints).
pub(crate) const APPLICATION_CLIENT: &str = "application-client";

/// The margin before a lease's possible expiry at which a holder without an acknowledged
/// keep-alive is reported lost: the backend's drift margin (the contract's default).
pub(crate) fn lost_margin(ttl: Duration) -> Duration {
    Capabilities::default().drift_margin(ttl)
}

impl EtcdBackend {
    /// Parses `url` (see the crate docs), connects to the listed members (authenticating when
    /// the URL has a user) and starts the client's watch.
    ///
    /// Cancel safety: dropping the future before it completes leaves nothing behind but
    /// connections being closed.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockcore::ErrorKind::InvalidConfig) for a malformed URL or an unreadable CA file (before any
    /// I/O); [`ErrorKind::Auth`](lockcore::ErrorKind::Auth) for credentials the server refuses; [`ErrorKind::Unavailable`](lockcore::ErrorKind::Unavailable)
    /// when no member answers (or none passes TLS verification); [`ErrorKind::Backend`](lockcore::ErrorKind::Backend) for other refusals.
    pub async fn connect(url: &str) -> Result<EtcdBackend> {
        Self::from_config(Config::parse(url)?).await
    }

    /// Connects from a [`Config`] (deserialized from a config file, say), validated exactly as
    /// a URL is ([`Config::validate`]).
    ///
    /// Cancel safety: as [`EtcdBackend::connect`].
    ///
    /// # Errors
    /// As [`EtcdBackend::connect`].
    pub async fn from_config(config: Config) -> Result<EtcdBackend> {
        let config = config.validate()?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.timeout)
            .with_keep_alive(Duration::from_secs(5), config.timeout)
            .with_auto_token_refresh(true)
            // `hasleader: true` on every request and watch, as Go's clientv3.WithRequireLeader:
            // a member cut off from the quorum fails requests at once and cancels its watches
            // (after about three election timeouts), instead of serving a watch that stays
            // silent while the lock changes hands.
            .with_require_leader(true);
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            options = options.with_user(user.clone(), password.expose().to_owned());
        }
        if config.tls {
            let mut tls = etcd_client::TlsOptions::new();
            if let Some(ca) = &config.ca {
                let pem = std::fs::read(ca).map_err(|e| {
                    Error::invalid_config(format!("reading the CA file {}", ca.display()))
                        .with_source(e)
                })?;
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
            }
            if let Some(d) = &config.domain {
                tls = tls.domain_name(d.clone());
            }
            options = options.with_tls(tls);
        }
        // The client's channel balances over its endpoints and does not route around one that
        // refuses connections: give it the members that answer, and keep that set current.
        let endpoints = config.endpoints();
        let up = probe(&config.hosts, config.timeout.min(PROBE_TIMEOUT)).await;
        let live: Vec<String> = endpoints
            .iter()
            .zip(&up)
            .filter(|(_, up)| **up)
            .map(|(e, _)| e.clone())
            .collect();
        let first = if live.is_empty() {
            endpoints.clone()
        } else {
            live
        };
        let what = format!("connecting to etcd at {}", config.hosts.join(","));
        let client =
            match tokio::time::timeout(config.timeout * 2, Client::connect(&first, Some(options)))
                .await
            {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return Err(map_err(what, e)),
                Err(_) => return Err(timed_out(&what, config.timeout * 2)),
            };
        let tracked = (endpoints.len() > 1).then_some((endpoints, first));
        Self::assemble(client, config, tracked).await
    }

    /// Uses a client the application already has: its channel, endpoints, TLS and
    /// credentials, so the application keeps one connection to etcd. Locks live under
    /// `namespace` (as a URL's path says it: `app/locks`; empty: `locksmith`, as a URL without
    /// one). The backend opens its one watch and one keep-alive stream on that channel. Unlike
    /// a backend from a URL it does not track which members answer (the client's own balancing
    /// applies), and [`describe`](lockcore::backend::Backend::describe) names the client
    /// (`application-client`), not its endpoints.
    ///
    /// ```no_run
    /// # async fn f() -> lockcore::Result<()> {
    /// use lock_etcd::etcd_client;
    /// let client = etcd_client::Client::connect(["127.0.0.1:2379"], None).await.unwrap();
    /// let backend = lock_etcd::EtcdBackend::from_client(client, "app/locks").await?;
    /// let locker = lockcore::Locker::new(backend);
    /// # Ok(()) }
    /// ```
    ///
    /// Cancel safety: dropping the future before it completes leaves nothing behind (the
    /// watch it was opening is closed).
    ///
    /// # Errors
    /// `InvalidConfig` for a bad namespace; `Unavailable` when the watch cannot be opened.
    pub async fn from_client(client: Client, namespace: &str) -> Result<EtcdBackend> {
        let config = Config {
            tls: false,
            hosts: vec![APPLICATION_CLIENT.to_owned()],
            namespace: namespace.to_owned(),
            user: None,
            password: None,
            ca: None,
            domain: None,
            timeout: crate::config::DEFAULT_TIMEOUT,
        }
        .validate()?;
        Self::assemble(client, config, None).await
    }

    /// The backend on a connected client; `tracked`: the configured endpoints and those that
    /// answered, for the task that keeps the client's endpoint set current.
    pub(crate) async fn assemble(
        client: Client,
        config: Config,
        tracked: Option<(Vec<String>, Vec<String>)>,
    ) -> Result<EtcdBackend> {
        let prefix = format!("{}/", config.namespace).into_bytes();
        let dispatch = Dispatch::start(client.watch_client(), prefix, config.timeout).await?;
        let keeper = Keeper::start(client.lease_client(), lost_margin);
        let capabilities = Self::capabilities_for();
        let backend = EtcdBackend {
            inner: Arc::new(Inner {
                client,
                config,
                capabilities,
                dispatch,
                keeper,
                pool: Mutex::new(HashMap::new()),
                bare_lease: tokio::sync::Mutex::new(None),
                abandoned: Mutex::new(HashMap::new()),
                stats: Stats::default(),
            }),
        };
        if let Some((endpoints, first)) = tracked {
            tokio::spawn(track_members(
                Arc::downgrade(&backend.inner),
                endpoints,
                first,
            ));
        }
        tracing::debug!(backend = %backend.inner.config.redacted(), "etcd client connected");
        Ok(backend)
    }

    pub(crate) fn capabilities_for() -> Capabilities {
        let mut c = Capabilities::default();
        // Both in the lock's one queue (see the crate docs): each share or permit is a key of
        // its own, with its own lease, fencing token and lost signal.
        c.shared = lockcore::Support::Yes;
        c.permits = lockcore::Support::Yes;
        // An exclusive set in one transaction (`set.rs`).
        c.atomic_multi = lockcore::Support::Yes;
        c.fencing = true;
        c.fair = true;
        c.wait = WaitKind::Notify;
        // Not Native: the contract's Native is session-bound (a crashed holder's lock frees
        // within seconds whatever its TTL, and extend only checks the session). Each lock here
        // is its own etcd lease of the TTL asked, which a crash leaves held until that TTL
        // (expiry_after_ttl) and whose validity is a clock bound. The contract's watchdog
        // renews it: each renewal is one keep-alive on the client's one keep-alive stream.
        c.renew = RenewKind::Emulated;
        c.lost_detection = true;
        // A watch on the holder's own key reports its deletion.
        c.revoke_detection = true;
        c.loss_detection = lockcore::LossDetection::Pushed {
            within: Duration::from_secs(1),
        };
        // etcd fixes a lease's TTL when it grants it: extend to another TTL moves the key to a
        // new lease granted that TTL (same create revision, so same token and queue place).
        c.extend_sets_ttl = true;
        c.reentrant = false;
        c.expiry_after_ttl = true;
        c.force_release = true;
        c.inspect = true;
        // Any TTL is taken: etcd grants whole seconds (at least its minimum), and the TTL
        // granted is reported, so the validity (and the last renewal before a maximum hold
        // time) count what the server really gave.
        c.min_ttl = Duration::from_millis(1);
        c.max_ttl = MAX_TTL;
        c.compatibility = crate::compat::table();
        c.notes = vec![
            "the TTL is an etcd lease in whole seconds (rounded up, at least the server's minimum lease TTL); the TTL granted is what the validity counts".into(),
            "held leases are renewed by the contract (auto_renew or extend: one keep-alive on the client's one keep-alive stream each, until the maximum hold time), queued waiters' leases by the client itself on that stream; a crashed holder's lock frees one TTL after its last renewal".into(),
            "renewal is emulated, not native: native (session-bound) renewal frees a crashed holder's lock within seconds whatever its TTL; here each lock is an etcd lease of the TTL asked, held after a crash until that TTL, so that the validity stays a clock bound on the server's lease. A per-client session lease (etcd's concurrency.Session) would free crashed locks sooner but make the validity depend on the keep-alive task noticing a lapse in time (late in a paused process)".into(),
            "lost signal: the lock key deleted behind the holder or its lease's keep-alive refused (renewal refused), the lease run out unrenewed (validity expired), or, after an extend to another TTL whose outcome is unknown, no keep-alive acknowledged for the lease the key may have moved to before it may expire (connection lost)".into(),
            "waiters: the watch and requests require a leader (a member cut off from the quorum cancels the watch); a waiter re-checks the queue at least once per lease TTL (1 to 10 s) even when its watch is silent; a queued waiter's lease is kept alive through outages (FIFO place kept while it lives)".into(),
            "fencing token = the lock key's create revision; FIFO by create revision; one release wakes one waiter (one synced watch per client)".into(),
            "shared holders and permits are keys of the one queue, their mode a suffix of the key name: a reader holds when no exclusive key is ahead of it (a waiting writer holds up later readers), a permit when fewer than its limit of keys are ahead; a waiter waits for the deletions that let it in (one look at the queue per hand-over); another limit, or a semaphore beside a mutex or read-write lock, is refused as a conflict; an etcd concurrency.Mutex key counts as exclusive".into(),
            "leader election follows etcd's concurrency.Election (etcdctl elect): a campaign's key holds the campaign value alone (raw bytes) instead of the holder metadata, the leader is the key with the lowest create revision, the term its create revision; an etcdctl elect leader's proposal reads as the leader's value".into(),
            "extend with the TTL acquired with is one keep-alive; another TTL (longer or shorter) moves the key to a new lease granted that TTL (one grant, one owner-checked transaction keeping the create revision; the old lease is revoked in the background)".into(),
        ];
        c
    }
}
