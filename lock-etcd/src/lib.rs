//! locksmith backend for etcd v3 (`etcd://`, `etcds://`): the recipe of etcd's own mutex, done
//! so that fencing, fairness, cancellation and the lost signal follow the locksmith contract.
//!
//! # URL
//!
//! `etcd[s]://[user:password@]host1:port1[,host2:port2...][/prefix][?params]` (port defaults to
//! 2379; `etcds` is TLS with certificate verification). Every listed member is an endpoint; a
//! dead one does not stop [`EtcdBackend::connect`] while another answers.
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `ca` | none | PEM file of the CA that signed the servers' certificates (`etcds://`) |
//! | `domain` | the host | the name to verify in the server certificate (`etcds://`) |
//! | `timeout_ms` | 5000 | how long one request may take before it is `Unavailable` |
//!
//! `user:password` authenticates with etcd's RBAC (the user needs read-write permission on the
//! prefix). The password never appears in `Debug`, [`Backend::describe`], logs or errors.
//!
//! # The recipe
//!
//! A lock `name` owns the keys under `<prefix>/<name.escaped()>/` (the escaping has no `/`, so
//! no name's keys are a prefix of another's). Each acquisition attempt puts its own key
//! `<dir><owner token>-<attempt>`, attached to a lease, in one transaction; the key with the
//! lowest create revision holds the lock. A waiter waits only for the deletion of its
//! predecessor (the key with the highest create revision below its own), so one release wakes
//! one waiter: FIFO, no herd. Ownership is always checked by create revision, and renewal also
//! by the lease carrying the key.
//!
//! * Uncontended `try_lock`/`lock`: one transaction ("if the directory is empty, put my key"),
//!   plus a keep-alive sent alongside it on the client's keep-alive stream when the lease is
//!   reused. Release: one transaction deleting the key only if its create revision is ours.
//! * Waiting: one long-lived watch per client over the whole prefix, created once and so
//!   *synced* (etcd 3.4 delays events for watches created at a past revision by up to 100 ms,
//!   the reason Go's `concurrency.Mutex` hands over at ~40/s); waiters subscribe to it. Requests
//!   and the watch carry etcd's require-leader flag (a member cut off from the quorum cancels
//!   the watch and refuses requests, and the watch is re-opened elsewhere), and a waiter
//!   re-checks the queue at least once per lease TTL (1 to 10 s) even if its watch stays
//!   silent (a client from [`EtcdBackend::from_client`] keeps its own require-leader setting).
//! * Leases: one etcd lease per held lock (reused after a clean release), granted by the server
//!   (whole seconds, at least the server's minimum; the TTL granted is reported). The client
//!   keeps held and queued leases alive itself on one keep-alive stream (every TTL/3) until the
//!   guard is released or dropped; a crashed holder's lock frees when its lease expires, one TTL
//!   after its last keep-alive. A queued waiter's lease is kept alive through outages too (its
//!   place in the queue holds while the lease lives; a waiter whose lease did expire queues
//!   again at the end).
//! * Extend: with the TTL acquired with, one keep-alive (plus a read of the key, in parallel).
//!   etcd cannot change a lease's TTL, so another TTL moves the key to a new lease granted that
//!   TTL: a grant, then one transaction re-putting the key with the new lease if its create
//!   revision is still ours (a put keeps the create revision: same fencing token, same place in
//!   the queue, no waiter woken); the old lease is revoked in the background. If the answer to
//!   that transaction is lost (an error, or the future dropped), the new lease is kept alive
//!   too until the next `extend` or `release` reads which lease carries the key.
//! * A live holder whose lease ran out unrenewed deletes its key at the lease's end (the server
//!   itself expires leases only on a 500 ms sweep), so a lease ends at its TTL.
//! * Lost signal: the key deleted behind the holder (revoked, expired, admin delete) or a
//!   keep-alive of its lease refused ([`LostReason::RenewalRefused`]); the lease ran out
//!   unrenewed ([`LostReason::ValidityExpired`], as the contract's own validity deadline); and
//!   [`LostReason::ConnectionLost`] in one case only: after an extend to another TTL whose
//!   outcome is unknown, no keep-alive of the lease the key may have moved to was acknowledged
//!   before that lease may expire. (A held lease is renewed by the contract's `extend`, whose
//!   failures end the validity, not by a background keep-alive.) A deletion is matched to the
//!   held key by revision: a deletion of an earlier key of the same name never fires it.
//! * Fencing token: the key's create revision, which increases across holders, restarts and
//!   leader changes.
//! * Holder metadata ([`lockcore::Holder`]): the value of each contender's key, written by the
//!   acquiring put. `inspect` reads the queue (holder first, waiters behind) in one request and
//!   the holder lease's time to live in a second.
//!
//! # Interoperating with other lock clients
//!
//! etcd's own `concurrency.Mutex` (Go; `etcdctl lock`, and the etcd `v3lock` service's `Lock`
//! RPC, which runs the same Mutex) shares a lock with locksmith with the default settings, no
//! setting needed: `etcdctl lock locksmith/NAME -- CMD` and locksmith's lock `NAME` (default
//! prefix `locksmith`) exclude each other. The Mutex puts the key `<pfx>/<lease id in hex>`
//! and holds when its key has the lowest create revision of all keys under `<pfx>/`
//! (`client/v3/concurrency/mutex.go`), whatever their names; locksmith does the same over the
//! same keys. So both order one queue by create revision, and each wakes the other by deleting
//! its key (the Mutex waits with a watch on the last key created before its own, locksmith on
//! its whole-prefix watch). What holds: mutual exclusion, FIFO fairness, notification both ways,
//! fencing (one counter for both: the key's create revision, which `etcdctl lock -- CMD` passes
//! to CMD as `ETCD_LOCK_REV`, and which is locksmith's fencing token), renewal (each side keeps
//! its own lease alive). What the peer lacks: locksmith's lost signal (the Mutex's holder
//! learns a loss only from its session's `Done` channel) and an unrenewed end (an `etcdctl
//! lock` holder that crashed frees the lock when its session lease expires, 60 s by default).
//! Give the Mutex the prefix [`EtcdBackend::lock_prefix`] reports, without its trailing `/`:
//! names outside `[A-Za-z0-9_-]` are percent-encoded (`a.b` is `locksmith/a%2Eb`).
#![deny(missing_docs)]

mod config;
mod inspect;
mod keeper;
mod registration;
mod watch;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse,
};
use lockcore::backend::{
    AcquireRequest, Acquired, Backend, Background, Lease, LostNotifier, async_trait,
};
use lockcore::{
    Capabilities, Error, ErrorKind, Instant, IntoLockName, LockInfo, LockName, LostReason,
    RenewKind, Result, WaitKind,
};
use tokio::sync::watch as tokio_watch;

pub use crate::config::Config;
use crate::keeper::{Keeper, LeaseCell, Renewal};
pub use crate::registration::REGISTRATION;
use crate::watch::{Dispatch, Floor, Wake};
/// The etcd client this backend speaks through (etcd-client 0.21.1 with its gRPC code checked in,
/// so it builds without `protoc`: `vendor/etcd-client/README.md`). Build the client you pass to
/// [`EtcdBackend::from_client`] with it.
pub use etcd_client;

/// The largest TTL accepted (etcd's own maximum lease TTL is 9,000,000,000 s; a day is plenty).
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Leases kept for reuse per TTL.
const POOL_PER_TTL: usize = 64;
/// Pause before re-sending a request that could not be sent.
const RETRY_PAUSE: Duration = Duration::from_millis(10);
/// How often the members listed in the URL are probed (TCP connect), so that the client's
/// channel only balances over those that answer.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long a member has to accept a TCP connection to count as up.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a waiter waits on its watch before it re-checks the queue anyway, at most: a watch
/// can be silent (a member cut off from the quorum, before require-leader cancels it), and the
/// wait must still end once the lock is free. One keys-only read per waiter per period; the
/// waiter's lease TTL within these bounds (see `recheck_every`).
const RECHECK_MIN: Duration = Duration::from_secs(1);
const RECHECK_MAX: Duration = Duration::from_secs(10);
/// The TTL of the lease `bare_cycle` uses.
const BARE_TTL_SECS: i64 = 60;
/// The host a backend made from an application's client reports (it cannot see the client's
/// endpoints).
const APPLICATION_CLIENT: &str = "application-client";

/// The etcd client error in the contract's terms.
pub(crate) fn map_err(what: impl Into<String>, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    let what = what.into();
    match &e {
        // gRPC codes: 1 cancelled, 3 invalid argument, 4 deadline exceeded, 14 unavailable.
        E::GRpcStatus(s) => match s.code() as i32 {
            1 | 4 | 14 => Error::unavailable(what, e),
            // tonic reports a connection reset mid-request (a member killed or restarted) as
            // code 2 "transport error": transient, as 14 is (the faults matrix's server_restart).
            2 if s.message() == "transport error" => Error::unavailable(what, e),
            3 => Error::new(ErrorKind::InvalidConfig, what).with_source(e),
            _ => Error::backend(what, e),
        },
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => {
            Error::unavailable(what, e)
        }
        E::InvalidArgs(_) | E::InvalidUri(_) | E::InvalidMetadataValue(_) => {
            Error::new(ErrorKind::InvalidConfig, what).with_source(e)
        }
        _ => Error::backend(what, e),
    }
}

/// Whether a failed request failed because its lease does not exist (expired or revoked).
fn lease_not_found(e: &Error) -> bool {
    e.to_string().contains("lease not found")
}

/// Whether a request failed without being applied, so that sending it again cannot apply it
/// twice: it was not sent (its member refused the connection), or its member has no leader
/// (require-leader makes such a member refuse requests before executing them, and one
/// waiting for a leader refuses with the same error; the channel then picks a member again).
fn not_applied(e: &etcd_client::Error) -> bool {
    let msg = e.to_string();
    msg.contains("tcp connect error")
        || msg.contains("Connection refused")
        || msg.contains("etcdserver: no leader")
}

fn timed_out(what: &str, after: Duration) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("{what}: no answer from etcd within {after:?}"),
    )
}

/// Counters of what the backend did, for tests and figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdStats {
    /// Leases granted (a lease is reused after a clean release).
    pub leases_granted: u64,
    /// Predecessor deletions that woke a waiter (one per hand-over with no herd).
    pub wakeups: u64,
    /// Ownership re-checks after a wake-up.
    pub rechecks: u64,
    /// Lost signals fired because the lock key was deleted behind its holder.
    pub deleted_behind: u64,
    /// Events the client's watch received.
    pub watch_events: u64,
}

#[derive(Default)]
struct Stats {
    leases_granted: AtomicU64,
    wakeups: AtomicU64,
    rechecks: AtomicU64,
    deleted_behind: AtomicU64,
    /// Numbers this client's acquisition attempts, so that each attempt has its own key name.
    attempts: AtomicU64,
}

/// An etcd lock client: one gRPC channel, one watch, one keep-alive stream. See the crate docs.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: Config,
    capabilities: Capabilities,
    dispatch: Dispatch,
    keeper: Keeper,
    /// Leases whose lock was released cleanly, by granted TTL in seconds.
    pool: Mutex<HashMap<u64, Vec<Arc<LeaseCell>>>>,
    bare_lease: tokio::sync::Mutex<Option<Arc<LeaseCell>>>,
    stats: Stats,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("url", &self.inner.config.redacted())
            .finish()
    }
}

/// The margin before a lease's possible expiry at which a holder without an acknowledged
/// keep-alive is reported lost: the backend's drift margin (the contract's default).
fn lost_margin(ttl: Duration) -> Duration {
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
    /// [`ErrorKind::InvalidConfig`] for a malformed URL or an unreadable CA file (before any
    /// I/O), and for credentials the server refuses; [`ErrorKind::Unavailable`] when no member
    /// answers (or none passes TLS verification); [`ErrorKind::Backend`] for other refusals.
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
    /// applies), and [`describe`](lockcore::Backend::describe) names the client
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
    async fn assemble(
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
        tracing::debug!(backend = %backend.describe(), "etcd client connected");
        Ok(backend)
    }

    fn capabilities_for() -> Capabilities {
        let mut c = Capabilities::default();
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
        c.revoke_detection = true;
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
        c.notes = vec![
            "the TTL is an etcd lease in whole seconds (rounded up, at least the server's minimum lease TTL); the TTL granted is what the validity counts".into(),
            "held leases are renewed by the contract (auto_renew or extend: one keep-alive on the client's one keep-alive stream each, until the maximum hold time), queued waiters' leases by the client itself on that stream; a crashed holder's lock frees one TTL after its last renewal".into(),
            "renewal is emulated, not native: native (session-bound) renewal frees a crashed holder's lock within seconds whatever its TTL; here each lock is an etcd lease of the TTL asked, held after a crash until that TTL, so that the validity stays a clock bound on the server's lease. A per-client session lease (etcd's concurrency.Session) would free crashed locks sooner but make the validity depend on the keep-alive task noticing a lapse in time (late in a paused process)".into(),
            "lost signal: the lock key deleted behind the holder or its lease's keep-alive refused (renewal refused), the lease run out unrenewed (validity expired), or, after an extend to another TTL whose outcome is unknown, no keep-alive acknowledged for the lease the key may have moved to before it may expire (connection lost)".into(),
            "waiters: the watch and requests require a leader (a member cut off from the quorum cancels the watch); a waiter re-checks the queue at least once per lease TTL (1 to 10 s) even when its watch is silent; a queued waiter's lease is kept alive through outages (FIFO place kept while it lives)".into(),
            "fencing token = the lock key's create revision; FIFO by create revision; one release wakes one waiter (one synced watch per client)".into(),
            "extend with the TTL acquired with is one keep-alive; another TTL (longer or shorter) moves the key to a new lease granted that TTL (one grant, one owner-checked transaction keeping the create revision; the old lease is revoked in the background)".into(),
        ];
        c
    }

    /// The key prefix of lock `name`: its holder's and waiters' keys are directly below it.
    pub fn lock_prefix(&self, name: impl IntoLockName) -> Result<String> {
        Ok(self.dir(&name.into_lock_name()?))
    }

    fn dir(&self, name: &LockName) -> String {
        format!("{}/{}/", self.inner.config.namespace, name.escaped())
    }

    /// The underlying client (sharing this backend's channel), for advanced use and tests.
    /// Deleting lock keys through it breaks the locks they carry.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Counters of what this backend did.
    pub fn stats(&self) -> EtcdStats {
        let s = &self.inner.stats;
        EtcdStats {
            leases_granted: s.leases_granted.load(Ordering::Relaxed),
            wakeups: s.wakeups.load(Ordering::Relaxed),
            rechecks: s.rechecks.load(Ordering::Relaxed),
            deleted_behind: s.deleted_behind.load(Ordering::Relaxed),
            watch_events: self.inner.dispatch.events(),
        }
    }

    /// One request, bounded by the configured timeout. A request that was not applied (no
    /// connection to the member the channel picked, or that member has no leader) is retried
    /// until the timeout: sending it again cannot apply it twice.
    async fn call<T, Fut>(&self, what: &str, mut f: impl FnMut(Client) -> Fut) -> Result<T>
    where
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let timeout = self.inner.config.timeout;
        let deadline = Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, f(self.inner.client.clone())).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if not_applied(&e) && Instant::now() + RETRY_PAUSE < deadline => {
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Ok(Err(e)) => return Err(map_err(what, e)),
                Err(_) => return Err(timed_out(what, timeout)),
            }
        }
    }

    async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        self.call(what, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Deletes every key of `name` (holder and waiters), as an operator would. Returns how many
    /// keys were deleted.
    ///
    /// Prefer [`Locker::force_release`](lockcore::Locker::force_release), the same on every
    /// backend (it returns whether something was deleted).
    ///
    /// Cancel safety: dropping the future may or may not have deleted them.
    pub async fn force_release(&self, name: &LockName) -> Result<i64> {
        let dir = self.dir(name);
        let resp = self
            .call("deleting the lock's keys", |mut c| {
                let dir = dir.clone();
                async move {
                    c.delete(dir, Some(etcd_client::DeleteOptions::new().with_prefix()))
                        .await
                }
            })
            .await?;
        Ok(resp.deleted())
    }

    /// A lease with the TTL `secs` (asked): a pooled one that still has at least half its TTL
    /// left, or a new grant. Returns it with whether it is new.
    async fn lease_for(&self, secs: u64) -> Result<(Arc<LeaseCell>, bool)> {
        let now = Instant::now();
        if let Some(list) = self
            .inner
            .pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&secs)
        {
            while let Some(cell) = list.pop() {
                if cell.expires() > now + cell.ttl / 2 {
                    return Ok((cell, false));
                }
                // Expiring anyway; a keyless lease costs the server nothing but memory.
            }
        }
        Ok((self.grant(secs).await?, true))
    }

    async fn grant(&self, secs: u64) -> Result<Arc<LeaseCell>> {
        let sent = Instant::now();
        let resp = self
            .call("granting a lease", |mut c| async move {
                c.lease_grant(secs as i64, None).await
            })
            .await?;
        if !resp.error().is_empty() || resp.ttl() <= 0 {
            return Err(Error::new(
                ErrorKind::Backend,
                format!("etcd refused a lease: {}", resp.error()),
            ));
        }
        self.inner
            .stats
            .leases_granted
            .fetch_add(1, Ordering::Relaxed);
        Ok(LeaseCell::new(
            resp.id(),
            Duration::from_secs(resp.ttl() as u64),
            sent,
        ))
    }

    fn pool_put(&self, secs: u64, cell: Arc<LeaseCell>) {
        let mut pool = self.inner.pool.lock().unwrap_or_else(|e| e.into_inner());
        let list = pool.entry(secs).or_default();
        if list.len() < POOL_PER_TTL {
            list.push(cell);
        }
    }

    /// Revokes a lease that carries nothing any more, in the background (best effort).
    fn revoke_later(&self, id: i64) {
        self.inner.keeper.release(id);
        let mut lease = self.inner.client.lease_client();
        let timeout = self.inner.config.timeout;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(timeout, lease.revoke(id)).await;
        });
    }

    /// The recipe. `wait == false`: one transaction that puts the key only if the lock's
    /// directory is empty. Otherwise queue and wait without deadline (the caller bounds it by
    /// dropping the future; the queue guard then deletes the key in the background).
    async fn run(&self, req: &AcquireRequest, wait: bool) -> Result<Option<Acquired>> {
        let secs = ttl_secs(req.ttl);
        let dir = self.dir(&req.name);
        let mut queued = QueueGuard {
            backend: self.clone(),
            key: String::new(),
            secs,
            state: QueueState::Idle,
            background: req.background.clone(),
        };
        let dispatch = &self.inner.dispatch;
        // The keys of this acquisition's attempts start so (see below).
        let own_prefix = format!("{dir}{}-", req.token.to_hex());
        'enqueue: loop {
            // Each attempt puts a key of its own name: the owner token (the same for a retried
            // acquisition) and this client's attempt number. The clean-up of an abandoned
            // attempt, still running, can then never meet the key of a later attempt (a re-put
            // of the same name would keep the old create revision, so that comparing it would
            // not tell the two apart).
            let attempt = self.inner.stats.attempts.fetch_add(1, Ordering::Relaxed);
            let key = format!("{dir}{}-{attempt:x}", req.token.to_hex());
            queued.key = key.clone();
            let (cell, fresh) = self.lease_for(secs).await?;
            queued.state = QueueState::Sending(cell.clone());
            // Taken before the transaction: a deletion that races our subscriptions is logged.
            let floor = dispatch.floor();
            // A pooled lease is renewed when its lock is released: if that renewal is recent
            // (within 1 % of the TTL), its TTL counts from it and no keep-alive is needed here.
            let recent = !fresh && renewed_lately(&cell);
            let refresh = (!fresh && !recent).then(|| self.inner.keeper.refresh(cell.clone()));
            let sent_at = Instant::now();
            // The value is the holder's metadata (the owner token is in the key's name).
            let put = TxnOp::put(
                key.as_str(),
                req.holder.encode(),
                Some(PutOptions::new().with_lease(cell.id)),
            );
            let empty = Compare::create_revision(dir.as_str(), CompareOp::Equal, 0).with_prefix();
            let queue = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_keys_only();
            let txn = if wait {
                Txn::new()
                    .when([empty])
                    .and_then([put.clone()])
                    .or_else([put, TxnOp::get(dir.as_str(), Some(queue))])
            } else {
                Txn::new()
                    .when([empty])
                    .and_then([put])
                    .or_else([TxnOp::get(dir.as_str(), Some(queue.with_limit(1)))])
            };
            let resp = match self.txn("acquiring the lock", txn).await {
                Ok(r) => r,
                // The pooled lease expired meanwhile: nothing was written.
                Err(e) if lease_not_found(&e) => {
                    queued.state = QueueState::Idle;
                    continue 'enqueue;
                }
                Err(e) => return Err(e),
            };
            // Our key's create revision: the transaction's own (the key name is new), as the
            // queue listing sent behind the put also shows.
            let mut revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            for op in resp.op_responses() {
                if let TxnOpResponse::Get(get) = op
                    && let Some(own) = get.kvs().iter().find(|kv| kv.key() == key.as_bytes())
                {
                    revision = own.create_revision();
                }
            }
            if resp.succeeded() || wait {
                queued.state = QueueState::Queued(cell.clone(), revision);
            } else {
                queued.state = QueueState::Idle;
            }
            // The lease's TTL counts from the keep-alive sent with the transaction, or for a
            // new lease from its grant's send (the lease expires one TTL after the grant, not
            // after this transaction: counting from here would overstate the validity by the
            // grant's round trip).
            let (lease_sent, granted) = match refresh {
                None if recent => (sent_at, cell.expires().saturating_duration_since(sent_at)),
                None => (cell.expires() - cell.ttl, cell.ttl),
                Some(rx) => match rx.await {
                    Ok(Ok(Renewal::Alive { sent, ttl })) => (sent.min(sent_at), ttl),
                    Ok(Ok(Renewal::Gone)) => {
                        // The key (if put) died with the lease: start over with a new one.
                        queued.state = QueueState::Idle;
                        continue 'enqueue;
                    }
                    Ok(Err(e)) => {
                        return Err(Error::new(
                            ErrorKind::Unavailable,
                            format!("keeping the lock's lease alive: {e}"),
                        ));
                    }
                    Err(_) => {
                        return Err(Error::new(
                            ErrorKind::Unavailable,
                            "the lease keeper stopped",
                        ));
                    }
                },
            };
            if resp.succeeded() {
                queued.state = QueueState::Done;
                let lease = self.hold(req, cell, key, revision, floor);
                return Ok(Some(
                    Acquired::new(lease, lease_sent).with_granted_ttl(granted),
                ));
            }
            if !wait {
                drop(floor);
                self.pool_put(secs, cell);
                return Ok(None);
            }
            // Queued: keep the queue key alive while waiting.
            self.inner.keeper.keep(cell.clone(), None);
            let mut own = Some(dispatch.deleted(key.as_bytes(), revision, &floor));
            let mut gone = None;
            for op in resp.op_responses() {
                if let TxnOpResponse::Get(get) = op
                    && let Some(pred) = get
                        .kvs()
                        .iter()
                        .filter(|kv| kv.create_revision() < revision && kv.key() != key.as_bytes())
                        .max_by_key(|kv| kv.create_revision())
                    // An earlier attempt of ours ahead: the re-check deletes it (see there).
                    && !pred.key().starts_with(own_prefix.as_bytes())
                {
                    gone = Some(dispatch.deleted(pred.key(), pred.create_revision(), &floor));
                }
            }
            drop(floor);
            let recheck = recheck_every(cell.ttl);
            loop {
                if let Some(pred) = gone.take() {
                    tokio::select! {
                        w = pred => {
                            if w == Ok(Wake::Deleted) {
                                self.inner.stats.wakeups.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        _ = wait_opt(&mut own) => {
                            // Our key was deleted (revoked, its lease expired), or the watch
                            // resynced. The re-check below tells: it compares our key's create
                            // revision, and queues again if the key is gone.
                            own = None;
                        }
                        // The watch may be silent (its member cut off from the quorum, before
                        // require-leader cancels it; an application's client without it): look
                        // anyway, so that a free lock is noticed within this period.
                        _ = tokio::time::sleep(recheck) => {}
                    }
                }
                // Who is ahead of us now? Sent with a keep-alive so that the lease's TTL counts
                // from here if we hold the lock, unless the lease was renewed lately (within 1 %
                // of its TTL, as when this process released it just before queueing again).
                self.inner.stats.rechecks.fetch_add(1, Ordering::Relaxed);
                let floor = dispatch.floor();
                let refresh =
                    (!renewed_lately(&cell)).then(|| self.inner.keeper.refresh(cell.clone()));
                let sent_at = Instant::now();
                let ahead = GetOptions::new()
                    .with_prefix()
                    .with_max_create_revision(revision - 1)
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_limit(1)
                    .with_keys_only();
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        revision,
                    )])
                    .and_then([TxnOp::get(dir.as_str(), Some(ahead))]);
                let resp = self.txn("checking the lock queue", txn).await?;
                let renewal = match refresh {
                    Some(rx) => rx.await,
                    None => Ok(Ok(Renewal::Alive {
                        sent: sent_at,
                        ttl: cell.expires().saturating_duration_since(sent_at),
                    })),
                };
                if !resp.succeeded() || matches!(renewal, Ok(Ok(Renewal::Gone))) {
                    // Our key is gone: queue again.
                    self.inner.keeper.release(cell.id);
                    queued.state = QueueState::Idle;
                    continue 'enqueue;
                }
                if own.is_none() {
                    // The subscription fired (a resync): subscribe again.
                    own = Some(dispatch.deleted(key.as_bytes(), revision, &floor));
                }
                let mut ahead = None;
                for op in resp.op_responses() {
                    if let TxnOpResponse::Get(get) = op {
                        ahead = get
                            .kvs()
                            .first()
                            .map(|kv| (kv.key().to_vec(), kv.create_revision()));
                    }
                }
                match ahead {
                    Some((pred, created)) if pred.starts_with(own_prefix.as_bytes()) => {
                        drop(floor);
                        // An earlier attempt of this same acquisition (the contract retries an
                        // attempt that failed `Unavailable` with the same token), whose
                        // clean-up failed or has not run yet: ours to delete, not to wait for
                        // until its lease expires. Then look again at once.
                        let txn = Txn::new()
                            .when([Compare::create_revision(
                                pred.as_slice(),
                                CompareOp::Equal,
                                created,
                            )])
                            .and_then([TxnOp::delete(pred.as_slice(), None)]);
                        self.txn("deleting an abandoned attempt's key", txn).await?;
                    }
                    Some((pred, created)) => {
                        gone = Some(dispatch.deleted(&pred, created, &floor));
                        drop(floor);
                    }
                    None => {
                        let (lease_sent, granted) = match renewal {
                            Ok(Ok(Renewal::Alive { sent, ttl })) => (sent.min(sent_at), ttl),
                            // No answer to the keep-alive: count from the last one answered.
                            _ => (cell.expires() - cell.ttl, cell.ttl),
                        };
                        queued.state = QueueState::Done;
                        let lease = self.hold(req, cell, key, revision, floor);
                        return Ok(Some(
                            Acquired::new(lease, lease_sent).with_granted_ttl(granted),
                        ));
                    }
                }
            }
        }
    }

    /// Makes the lease of a won lock: kept alive until released or dropped, watched for
    /// deletion behind the holder.
    fn hold(
        &self,
        req: &AcquireRequest,
        cell: Arc<LeaseCell>,
        key: String,
        revision: i64,
        floor: Floor,
    ) -> EtcdLease {
        let secs = ttl_secs(req.ttl);
        let (stop, stop_rx) = tokio_watch::channel(false);
        self.inner.keeper.release(cell.id);
        let shared = Arc::new(LeaseShared {
            backend: self.clone(),
            key,
            revision,
            lease: Mutex::new(Leases {
                current: (cell, secs),
                pending: None,
            }),
            lost: req.lost.clone(),
            background: req.background.clone(),
            moved: tokio::sync::Notify::new(),
            stop,
        });
        // The lease lives its TTL from the last keep-alive: the contract's watchdog extends it.
        // The floor, taken before the winning transaction, covers a deletion racing this point.
        let deleted = self
            .inner
            .dispatch
            .deleted(shared.key.as_bytes(), revision, &floor);
        drop(floor);
        tokio::spawn(watch_held(
            shared.clone(),
            req.lost.clone(),
            stop_rx,
            deleted,
        ));
        EtcdLease { shared }
    }
}

/// Where an acquisition stands, for the clean-up when it ends without the lock.
enum QueueState {
    /// Nothing written.
    Idle,
    /// A transaction that may put the key is in flight.
    Sending(Arc<LeaseCell>),
    /// The key is in the queue with this create revision.
    Queued(Arc<LeaseCell>, i64),
    /// The lock is ours (or the key was handled): nothing to clean up.
    Done,
}

/// Deletes this acquisition's queue key when it ends without the lock (cancelled, timed out,
/// failed), in the background so that [`lockcore::Locker::flush`] waits for it. At worst the key
/// dies with its lease, which is no longer kept alive.
struct QueueGuard {
    backend: EtcdBackend,
    key: String,
    secs: u64,
    state: QueueState,
    background: Background,
}

impl Drop for QueueGuard {
    fn drop(&mut self) {
        let state = std::mem::replace(&mut self.state, QueueState::Done);
        let (cell, revision) = match state {
            QueueState::Idle | QueueState::Done => return,
            QueueState::Sending(cell) => (cell, None),
            QueueState::Queued(cell, rev) => (cell, Some(rev)),
        };
        let backend = self.backend.clone();
        let key = std::mem::take(&mut self.key);
        let secs = self.secs;
        backend.inner.keeper.release(cell.id);
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.background.spawn(async move {
            // Without a known revision the put may still be in flight: revoking the lease
            // removes the key whenever it lands (the lease is this acquisition's alone).
            let Some(rev) = revision else {
                let id = cell.id;
                let _ = backend
                    .call("revoking a lease", |mut c| async move { c.lease_revoke(id).await })
                    .await;
                return;
            };
            // The key name is this attempt's alone; the create revision and the lease make sure
            // anyway that only the key this attempt put is deleted.
            let txn = Txn::new()
                .when([
                    Compare::create_revision(key.as_str(), CompareOp::Equal, rev),
                    Compare::lease(key.as_str(), CompareOp::Equal, cell.id),
                ])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            match backend.txn("deleting a queue key", txn).await {
                Ok(_) => backend.pool_put(secs, cell),
                Err(e) => {
                    tracing::debug!(error = %e, "deleting a cancelled waiter's key failed; it dies with its lease");
                }
            }
        });
    }
}

/// Fires the lost signal when the held key is deleted by someone else; frees the lock when its
/// lease runs out unrenewed while the guard lives; stops keeping the lease alive once nobody
/// holds the guard any more.
async fn watch_held(
    shared: Arc<LeaseShared>,
    lost: LostNotifier,
    mut stop: tokio_watch::Receiver<bool>,
    mut deleted: tokio::sync::oneshot::Receiver<Wake>,
) {
    let backend = &shared.backend;
    loop {
        let stopped = stop.clone();
        // Taken before reading the lease: a move after this point wakes the loop to re-arm.
        let moved = shared.moved.notified();
        let expires = shared.lease().0.expires();
        tokio::select! {
            _ = async { drop(stop.wait_for(|s| *s).await) } => return,
            _ = moved => {}
            _ = tokio::time::sleep_until(expires) => {
                // A renewal (or a move to a new lease) answered meanwhile pushed the end back.
                if shared.lease().0.expires() > Instant::now() || *stopped.borrow() {
                    continue;
                }
                // The lease ran out without a renewal; the holder's validity ended earlier (it
                // is this end minus the drift margin). Free the lock now, as the server would
                // at its next expiry sweep (every 500 ms), so that a lease ends at its TTL.
                let cell = shared.lease().0;
                backend.inner.keeper.release(cell.id);
                lost.fire(LostReason::ValidityExpired);
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        shared.key.as_str(),
                        CompareOp::Equal,
                        shared.revision,
                    )])
                    .and_then([TxnOp::delete(shared.key.as_str(), None)]);
                if let Err(e) = backend.txn("deleting an expired lock key", txn).await {
                    tracing::debug!(error = %e, "deleting an expired lock key failed; it expires with its lease");
                }
                return;
            }
            _ = lost.closed() => {
                // The guard is gone without a release (abandoned): the lock frees by its TTL
                // (that of the lease an unfinished move may have put the key on, too).
                backend.inner.keeper.release(shared.lease().0.id);
                if let Some((p, _)) = shared.pending() {
                    backend.inner.keeper.release(p.id);
                }
                return;
            }
            w = &mut deleted => {
                // After a resync, look (with a new subscription taken first).
                let floor = backend.inner.dispatch.floor();
                let gone = match w {
                    Ok(Wake::Deleted) => true,
                    _ => shared.key_lease().await.map(|l| l.is_none()).unwrap_or(false),
                };
                if *stopped.borrow() {
                    return;
                }
                if gone {
                    backend.inner.keeper.release(shared.lease().0.id);
                    if let Some((p, _)) = shared.pending() {
                        backend.inner.keeper.release(p.id);
                    }
                    if lost.fire(LostReason::RenewalRefused) {
                        backend.inner.stats.deleted_behind.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(key = %shared.key, "etcd lock key deleted behind its holder");
                    }
                    return;
                }
                deleted = backend
                    .inner
                    .dispatch
                    .deleted(shared.key.as_bytes(), shared.revision, &floor);
            }
        }
    }
}

/// How long a waiter waits on its watch before it re-checks the queue: its lease's TTL (a
/// crashed predecessor's key lives about that long anyway), within [`RECHECK_MIN`] and
/// [`RECHECK_MAX`].
fn recheck_every(ttl: Duration) -> Duration {
    ttl.clamp(RECHECK_MIN, RECHECK_MAX)
}

/// Whether `cell`'s lease has at least 99 % of its TTL left (a keep-alive answered within the
/// last 1 % of the TTL): a lock taken with it counts that much as granted, without a keep-alive.
fn renewed_lately(cell: &LeaseCell) -> bool {
    cell.expires() >= Instant::now() + (cell.ttl - cell.ttl / 100)
}

async fn wait_opt(
    rx: &mut Option<tokio::sync::oneshot::Receiver<Wake>>,
) -> std::result::Result<Wake, tokio::sync::oneshot::error::RecvError> {
    match rx {
        Some(rx) => rx.await,
        None => std::future::pending().await,
    }
}

/// TCP-connects to every host at once; true for those that accept within `timeout`.
async fn probe(hosts: &[String], timeout: Duration) -> Vec<bool> {
    let mut set = tokio::task::JoinSet::new();
    for (i, host) in hosts.iter().enumerate() {
        let host = host.clone();
        set.spawn(async move {
            let ok = matches!(
                tokio::time::timeout(timeout, tokio::net::TcpStream::connect(host)).await,
                Ok(Ok(_))
            );
            (i, ok)
        });
    }
    let mut up = vec![false; hosts.len()];
    while let Some(joined) = set.join_next().await {
        if let Ok((i, ok)) = joined {
            up[i] = ok;
        }
    }
    up
}

/// Keeps the client's endpoints to the listed members that accept connections (never fewer
/// than one), until the backend is gone.
async fn track_members(
    inner: std::sync::Weak<Inner>,
    endpoints: Vec<String>,
    mut current: Vec<String>,
) {
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let client = strong.client.clone();
        let hosts = strong.config.hosts.clone();
        drop(strong);
        let up = probe(&hosts, PROBE_TIMEOUT).await;
        for (endpoint, up) in endpoints.iter().zip(up) {
            let listed = current.contains(endpoint);
            if up && !listed && client.add_endpoint(endpoint).await.is_ok() {
                tracing::debug!(%endpoint, "etcd member answers again");
                current.push(endpoint.clone());
            } else if !up
                && listed
                && current.len() > 1
                && client.remove_endpoint(endpoint).await.is_ok()
            {
                tracing::debug!(%endpoint, "etcd member does not answer; not used");
                current.retain(|e| e != endpoint);
            }
        }
    }
}

fn ttl_secs(ttl: Duration) -> u64 {
    ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)
}

#[async_trait]
impl Backend for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    /// One transaction: put this acquisition's key only if the lock has no key at all.
    ///
    /// Cancel safety: a dropped attempt revokes its lease in the background (which removes a
    /// key that may have landed); at worst the key dies with the lease after the TTL.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        self.run(req, false).await
    }

    /// Queues (one transaction) and waits for the predecessor's deletion on the client's watch.
    ///
    /// Cancel safety: a dropped or timed-out wait deletes its queue key in the background
    /// (covered by [`lockcore::Locker::flush`]); at worst the key dies with its lease.
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        match deadline {
            None => self.run(req, true).await,
            Some(d) if d <= Instant::now() => self.run(req, false).await,
            Some(d) => match tokio::time::timeout_at(d, self.run(req, true)).await {
                Ok(r) => r,
                Err(_elapsed) => Ok(None),
            },
        }
    }

    /// Deletes every key of the lock (admin delete).
    ///
    /// Cancel safety: dropping the future may or may not have freed the lock.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        EtcdBackend::force_release(self, name).await.map(|n| n > 0)
    }

    /// The queue in one read; the holder's key value is its metadata.
    ///
    /// Cancel safe.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        self.inspect_lock(name).await
    }

    /// A linearizable read of one key: the cheapest request that goes through the leader.
    ///
    /// Cancel safe.
    async fn round_trip(&self) -> Result<()> {
        let key = format!("{}/.round-trip", self.inner.config.namespace);
        self.call("reading a key", |mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        })
        .await
        .map(drop)
    }

    /// `Txn(if create_revision(key) == 0 then put(key, lease))`, then `Delete(key)`, with a
    /// long-lived lease granted once.
    ///
    /// Cancel safety: dropping the future may leave the key until the lease expires (60 s).
    async fn bare_cycle(&self, name: &LockName) -> Result<()> {
        let lease = {
            let mut slot = self.inner.bare_lease.lock().await;
            match &*slot {
                Some(c) if c.expires() > Instant::now() + Duration::from_secs(30) => c.clone(),
                _ => {
                    let c = self.grant(BARE_TTL_SECS as u64).await?;
                    *slot = Some(c.clone());
                    c
                }
            }
        };
        let key = format!("{}bare", self.dir(name));
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(lease.id)),
            )]);
        let resp = self.txn("bare put-if-absent", txn).await?;
        if !resp.succeeded() {
            return Err(Error::new(
                ErrorKind::Backend,
                "bare cycle: the key was there already",
            ));
        }
        self.call("bare delete", |mut c| {
            let key = key.clone();
            async move { c.delete(key, None).await }
        })
        .await?;
        Ok(())
    }

    /// The keys under the lock's prefix behind the holder's (one read).
    ///
    /// Cancel safe.
    async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        let dir = self.dir(name);
        let resp = self
            .call("counting the lock's queue", |mut c| {
                let dir = dir.clone();
                async move {
                    c.get(dir, Some(GetOptions::new().with_prefix().with_count_only()))
                        .await
                }
            })
            .await?;
        Ok(usize::try_from(resp.count()).unwrap_or(0).saturating_sub(1))
    }

    /// The sum of `grpc_server_msg_received_total` from the first member's `/metrics`: every
    /// unary request and every message on a stream (keep-alives, watch requests).
    ///
    /// Cancel safe.
    async fn server_requests(&self) -> Result<u64> {
        metrics::requests(&self.inner.config).await
    }

    fn describe(&self) -> String {
        self.inner.config.redacted()
    }
}

mod metrics;

struct LeaseShared {
    backend: EtcdBackend,
    key: String,
    revision: i64,
    /// The lease the key is attached to, and the one an unfinished move may have put it on.
    lease: Mutex<Leases>,
    /// The holder's lost signal (fired by the keeper for a pending lease, see `Leases`).
    lost: LostNotifier,
    /// Where the revocation of a lease the key moved away from runs (`Locker::flush` waits).
    background: Background,
    /// Notified when the key moved to a new lease (the watcher re-arms its expiry timer).
    moved: tokio::sync::Notify,
    /// Set before the release deletes the key, so that the watcher does not report our own
    /// delete as a loss; also stops the watcher.
    stop: tokio_watch::Sender<bool>,
}

/// A lease with the TTL it was asked for in whole seconds (the pool's key).
type TtlLease = (Arc<LeaseCell>, u64);

struct Leases {
    /// The lease the key is known to be attached to. An extend to another TTL moves the key to
    /// a new lease.
    current: TtlLease,
    /// A lease the key may have moved to: a move whose transaction was sent but whose answer
    /// was not seen (an ambiguous failure, or the extend dropped meanwhile). Until the next
    /// extend or release reads the key and settles which lease carries it, the keeper keeps
    /// this one alive too (with the holder's lost signal: `ConnectionLost` if no keep-alive is
    /// acknowledged before it may expire), so that the key lives whichever lease it is on.
    pending: Option<TtlLease>,
}

impl LeaseShared {
    /// The lease the key is attached to now, and the TTL it was asked for (whole seconds).
    fn lease(&self) -> TtlLease {
        self.leases().current.clone()
    }

    fn pending(&self) -> Option<TtlLease> {
        self.leases().pending.clone()
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, Leases> {
        self.lease.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the current lease alive once (a keep-alive on the client's stream, sent alongside
    /// a read of the key for ownership by create revision and lease): the lease's own TTL,
    /// counted from the keep-alive.
    async fn keep_alive(&self, cell: Arc<LeaseCell>) -> Result<Duration> {
        let refresh = self.backend.inner.keeper.refresh(cell.clone());
        let on = self.key_lease().await?;
        let renewal = match refresh.await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("renewing the etcd lease: {e}"),
                ));
            }
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    "the lease keeper stopped",
                ));
            }
        };
        match (renewal, on) {
            (Renewal::Gone, _) => Err(not_held("its lease expired or was revoked")),
            (Renewal::Alive { .. }, None) => Err(not_held("its key was deleted")),
            // Renewing a lease that does not carry the key would grant nothing.
            (Renewal::Alive { .. }, Some(lease)) if lease != cell.id => {
                Err(not_held("its key is on a lease this holder does not renew"))
            }
            (Renewal::Alive { ttl, .. }, Some(_)) => Ok(ttl),
        }
    }

    /// Settles an unfinished move (see `Leases::pending`): reads which lease carries the key
    /// and makes that one current, revoking the other. Nothing to do (no request) without one.
    async fn settle(&self) -> Result<()> {
        let Some((pending, secs)) = self.pending() else {
            return Ok(());
        };
        let on = self.key_lease().await?;
        let mut leases = self.leases();
        let current = leases.current.0.clone();
        // Another call settled it meanwhile.
        if leases
            .pending
            .as_ref()
            .is_none_or(|(p, _)| p.id != pending.id)
        {
            return Ok(());
        }
        match on {
            Some(lease) if lease == pending.id => {
                leases.current = (pending, secs);
                leases.pending = None;
                drop(leases);
                self.adopted(current.id);
                Ok(())
            }
            Some(lease) if lease == current.id => {
                leases.pending = None;
                drop(leases);
                self.revoke_in_background(pending.id);
                Ok(())
            }
            // Deleted, or on a lease we never asked for: not ours to renew. The watcher fires
            // the lost signal for a deletion; the pending lease is left to expire (it may
            // carry the key if the read was stale, and revoking it would free the lock sooner).
            _ => Err(not_held(
                "its key was deleted or is on a lease this holder does not renew",
            )),
        }
    }

    /// The key moved to the pending lease, now current: the holder renews it by `extend`
    /// from here on, not the keeper; the old lease carries no key any more.
    fn adopted(&self, old: i64) {
        let new = self.lease().0.id;
        self.backend.inner.keeper.release(new);
        self.moved.notify_one();
        self.revoke_in_background(old);
    }

    /// Moves the key to a new lease granted `secs` (etcd cannot change a lease's TTL): a grant,
    /// then one transaction that re-puts the key with the new lease only if its create revision
    /// is still ours (a put on an existing key keeps its create revision, so the fencing token
    /// and the queue position stay), then the old lease is revoked in the background. Returns
    /// the TTL granted, counted from the grant's send (after the caller's send time).
    ///
    /// From the transaction's send until its answer is seen, the new lease is pending (see
    /// `Leases::pending`): kept alive, never revoked while the key may be on it.
    async fn move_lease(&self, secs: u64) -> Result<Duration> {
        let backend = &self.backend;
        let new = backend.grant(secs).await?;
        backend
            .inner
            .keeper
            .keep(new.clone(), Some(self.lost.clone()));
        self.leases().pending = Some((new.clone(), secs));
        let put = TxnOp::put(
            self.key.as_str(),
            "",
            Some(PutOptions::new().with_lease(new.id).with_ignore_value()),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                self.revision,
            )])
            .and_then([put]);
        // On an error the put may or may not have landed: the new lease stays pending (kept
        // alive), and the next extend or release settles it. Revoking it here would delete the
        // key if the put landed, freeing the lock while the holder's validity runs on.
        let resp = backend
            .txn("moving the lock key to a new lease", txn)
            .await?;
        let mut leases = self.leases();
        if leases.pending.as_ref().is_none_or(|(p, _)| p.id != new.id) {
            // Settled by a concurrent call meanwhile.
            drop(leases);
            return if resp.succeeded() {
                Ok(new.ttl)
            } else {
                Err(not_held(
                    "its key was deleted (expired, revoked or released)",
                ))
            };
        }
        leases.pending = None;
        if !resp.succeeded() {
            drop(leases);
            self.revoke_in_background(new.id);
            return Err(not_held(
                "its key was deleted (expired, revoked or released)",
            ));
        }
        let granted = new.ttl;
        let (old, _) = std::mem::replace(&mut leases.current, (new, secs));
        drop(leases);
        self.adopted(old.id);
        Ok(granted)
    }

    /// Revokes a lease on the lock's background (covered by `Locker::flush`), best effort.
    fn revoke_in_background(&self, id: i64) {
        let backend = self.backend.clone();
        backend.inner.keeper.release(id);
        self.background.spawn(async move {
            if let Err(e) = backend
                .call("revoking a lease", |mut c| async move { c.lease_revoke(id).await })
                .await
            {
                tracing::debug!(error = %e, lease = id, "revoking a lease failed; it expires by its TTL");
            }
        });
    }

    /// The lease carrying our key (by create revision); `None` if the key is not ours any more.
    async fn key_lease(&self) -> Result<Option<i64>> {
        let resp = self
            .backend
            .call("reading the lock key", |mut c| {
                let key = self.key.clone();
                async move { c.get(key, Some(GetOptions::new().with_keys_only())).await }
            })
            .await?;
        Ok(resp
            .kvs()
            .first()
            .filter(|kv| kv.create_revision() == self.revision)
            .map(|kv| kv.lease()))
    }
}

/// A held etcd lock: its key (the lowest create revision under the lock's prefix) and lease.
struct EtcdLease {
    shared: Arc<LeaseShared>,
}

impl fmt::Debug for EtcdLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLease")
            .field("key", &self.shared.key)
            .field("create_revision", &self.shared.revision)
            .field("lease", &format_args!("{:x}", self.shared.lease().0.id))
            .field(
                "pending_lease",
                &self.shared.pending().map(|(p, _)| format!("{:x}", p.id)),
            )
            .finish()
    }
}

fn not_held(why: &str) -> Error {
    Error::not_held(format!("the etcd lock is no longer held: {why}"))
}

#[async_trait]
impl Lease for EtcdLease {
    fn fencing_token(&self) -> Option<u64> {
        u64::try_from(self.shared.revision).ok()
    }

    /// The TTL the lease was asked with: one keep-alive of the lease, sent alongside a read of
    /// the key (ownership by create revision), granting the lease's TTL counted from the
    /// keep-alive. Another TTL: the key moves to a new lease granted that TTL (a grant and one
    /// owner-checked transaction; the old lease is revoked in the background), since etcd cannot
    /// change a lease's TTL.
    ///
    /// Cancel safety: dropping the future may or may not have renewed the lease or moved the
    /// key to the new one; the key keeps its create revision and owner either way. A lease the
    /// key may have moved to is kept alive until the next `extend` or `release` reads which
    /// lease carries the key (the other is then revoked), so the key never sits on a lease
    /// nobody renews; an unsent new lease expires by its TTL.
    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        let shared = &self.shared;
        let secs = ttl_secs(ttl);
        shared.settle().await?;
        let (cell, current) = shared.lease();
        if secs == current {
            shared.keep_alive(cell).await
        } else {
            shared.move_lease(secs).await
        }
    }

    /// Deletes the key if its create revision is still ours (the next waiter's watch fires).
    ///
    /// Cancel safety: dropping the future may leave the key until its lease expires (the
    /// delete may already have been applied, in which case the lock is free).
    async fn release(&self) -> Result<()> {
        let shared = &self.shared;
        shared.stop.send_replace(true);
        let inner = &shared.backend.inner;
        inner.keeper.release(shared.lease().0.id);
        let pending = shared.pending();
        if let Some((p, _)) = &pending {
            inner.keeper.release(p.id);
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                shared.key.as_str(),
                CompareOp::Equal,
                shared.revision,
            )])
            .and_then([TxnOp::delete(shared.key.as_str(), None)]);
        let resp = shared.backend.txn("releasing the lock", txn).await?;
        // Read after the transaction: an extend that moved the key to a new lease has swapped it.
        let (cell, secs) = shared.lease();
        if let Some((p, _)) = pending {
            // The key was on one of the two, and is deleted (or gone) now: neither is reused.
            shared.backend.revoke_later(p.id);
            shared.backend.revoke_later(cell.id);
            return if resp.succeeded() {
                Ok(())
            } else {
                Err(not_held(
                    "its key was deleted (expired, revoked or released)",
                ))
            };
        }
        if resp.succeeded() {
            // Renewed now, off the next acquisition's path: that one then needs no keep-alive.
            drop(inner.keeper.refresh(cell.clone()));
            shared.backend.pool_put(secs, cell);
            Ok(())
        } else {
            shared.backend.revoke_later(cell.id);
            Err(not_held(
                "its key was deleted (expired, revoked or released)",
            ))
        }
    }
}

/// Tests that need the crate's insides (the client's watch), on the real server
/// (`LOCK_TEST_ETCD_URL`).
#[cfg(test)]
mod tests {
    use super::*;

    fn scaled(d: Duration) -> Duration {
        d.mul_f64(conformance::time_scale())
    }

    /// Polls `cond` until it holds, failing after `within` (scaled).
    async fn eventually(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
        let end = Instant::now() + scaled(within);
        while !cond() {
            assert!(Instant::now() < end, "{what}: not within {within:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A deletion of an earlier key of the same name (still in the deletion log because an
    /// older floor is held, as by a waiter in the middle of its transaction) does not wake a
    /// subscriber to the newer key; the newer key's own deletion does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_earlier_deletion_of_the_same_name_does_not_wake_the_newer_key() {
        let Some(url) = conformance::require_env("LOCK_TEST_ETCD_URL") else {
            return;
        };
        let backend = EtcdBackend::connect(&url).await.unwrap();
        let dispatch = &backend.inner.dispatch;
        let key = format!(
            "{}k",
            backend
                .lock_prefix(format!("replay-{:08x}", fastrand::u32(..)))
                .unwrap()
        );
        let mut kv = backend.client().kv_client();
        let rev = |h: Option<&etcd_client::ResponseHeader>| h.unwrap().revision();
        let older = dispatch.floor();
        kv.put(key.as_str(), "", None).await.unwrap();
        let deleted = rev(kv.delete(key.as_str(), None).await.unwrap().header());
        eventually("the first deletion seen", Duration::from_secs(5), || {
            dispatch.revision() >= deleted
        })
        .await;
        let floor = dispatch.floor();
        let created = rev(kv.put(key.as_str(), "", None).await.unwrap().header());
        let mut rx = dispatch.deleted(key.as_bytes(), created, &floor);
        drop(floor);
        eventually("the re-put seen", Duration::from_secs(5), || {
            dispatch.revision() >= created
        })
        .await;
        assert_eq!(
            rx.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty),
            "the deletion of the earlier key woke the subscriber to the newer one"
        );
        kv.delete(key.as_str(), None).await.unwrap();
        let woke = tokio::time::timeout(scaled(Duration::from_secs(5)), rx)
            .await
            .expect("the newer key's deletion wakes");
        assert_eq!(woke, Ok(Wake::Deleted));
        drop(older);
    }

    /// A waiter whose watch is silent (muted here, as a watch on a member cut off from the
    /// quorum stays silent) still notices that the lock is free: it re-checks the queue within
    /// one re-check period (its lease TTL, at least 1 s) after the release.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_with_a_silent_watch_rechecks_within_the_bound() {
        let Some(url) = conformance::require_env("LOCK_TEST_ETCD_URL") else {
            return;
        };
        let holder = lockcore::Locker::new(EtcdBackend::connect(&url).await.unwrap());
        let backend = EtcdBackend::connect(&url).await.unwrap();
        backend.inner.dispatch.mute();
        let waiter = lockcore::Locker::new(backend.clone());
        let name = format!("silent-{:08x}", fastrand::u32(..));
        let ttl = Duration::from_secs(1);
        let opts = lockcore::LockOptions::new()
            .ttl(ttl)
            .auto_renew(lockcore::AutoRenew::until(Duration::from_secs(600)))
            .wait_timeout(scaled(Duration::from_secs(30)));
        let g = holder.try_lock(&name, &opts).await.unwrap().expect("free");
        let waiting = {
            let (waiter, name, opts) = (waiter.clone(), name.clone(), opts.clone());
            tokio::spawn(async move { waiter.lock(&name, &opts).await })
        };
        let lock_name = LockName::new(name.clone()).unwrap();
        let end = Instant::now() + scaled(Duration::from_secs(10));
        while backend.queued_waiters(&lock_name).await.unwrap() < 1 {
            assert!(Instant::now() < end, "the waiter did not queue");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Held (and renewed) past a few re-check periods: the re-checks see the holder.
        let rechecks = backend.stats().rechecks;
        let end = Instant::now() + scaled(Duration::from_secs(10));
        while backend.stats().rechecks < rechecks + 2 {
            assert!(
                Instant::now() < end,
                "the waiter did not re-check on its timer"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!waiting.is_finished(), "the waiter got a held lock");
        let released = Instant::now();
        g.release().await.unwrap();
        let g2 = tokio::time::timeout(recheck_every(ttl) + scaled(Duration::from_secs(2)), waiting)
            .await
            .expect("the waiter noticed the free lock within its re-check period")
            .unwrap()
            .unwrap();
        eprintln!("taken {:?} after the release", released.elapsed());
        assert_eq!(backend.stats().wakeups, 0, "the watch was not silent");
        g2.release().await.unwrap();
    }
}
