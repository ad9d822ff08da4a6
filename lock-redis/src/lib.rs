//! locksmith backend for Redis: a single node (`redis://`, `rediss://`) or a Redis Cluster
//! (`redis+cluster://h1:p1,h2:p2`, `rediss+cluster://...`).
//!
//! # How a lock is kept
//!
//! * **Acquire** is one Lua script (sent with `EVALSHA`, loaded on `NOSCRIPT`): `SET lock token
//!   PX ttl` if the lock is free and, only then, the fencing counter moves to
//!   `max(last + 1, server TIME in µs)`, the fencing token (so tokens keep increasing after a
//!   restart that lost the counter, or a failover to a replica that missed increments, as long
//!   as the servers' clocks do not step back). When the lock is held, the script returns the
//!   holder's `PTTL` so a waiter can wake when the lease runs out; when it is held by the very
//!   same token (a re-sent script after a dropped connection) it resets the TTL and reports
//!   success. There is never a window with a lock key without TTL.
//! * **Release** is a compare-and-delete script that also `PUBLISH`es on the lock's channel
//!   (on a cluster `SPUBLISH`, sharded pub/sub on the lock's slot);
//!   **extend** is a compare-and-`PEXPIRE` script. Both change nothing and return
//!   [`ErrorKind::NotHeld`](lockcore::ErrorKind::NotHeld) when the token no longer matches.
//! * **Keys**: `<namespace>:{<escaped name>}:lock` and `<namespace>:{<escaped name>}:fence`, and
//!   the channel `<namespace>:{<escaped name>}:released`. The hash tag is
//!   [`LockName::escaped`], which never contains `{` or `}`: a user's `{...}` in a name cannot pick
//!   the slot, and both keys of a name share one slot, so the scripts are legal on a cluster.
//!   The fencing counter key has no TTL: it must outlive every lease to stay increasing.
//! * **Holder metadata** ([`lockcore::Holder`]): `<namespace>:{<escaped name>}:holder` holds
//!   `"<owner token> <metadata>"`, set by the acquire script beside the lock key with the same
//!   TTL; extend, release and revoke treat the two together. [`Locker::inspect`](lockcore::Locker::inspect)
//!   reads the owner, its `PTTL`, the metadata and the fencing counter in one read-only script
//!   ([`inspect`]); the queued waiters are counted by [`Backend::queued_waiters`].
//! * **Queue** (exclusive waiters, not under `interop=`): `<namespace>:{<escaped name>}:queue`
//!   and `:queuexp`, two sorted sets of owner tokens (arrival order; expiry of the entry on the
//!   server's `TIME`, a little past the waiter's next attempt). The acquire script gives a free
//!   lock only to the queue's live head (anyone while it is empty: a `try_lock` is refused
//!   while waiters queue), and a waiting `lock()` that loses joins or refreshes its entry in
//!   the same script. A release publishes `q:<head token>`: only the head acts, so a hand-over
//!   costs the release and one attempt however many clients wait (see `queue` in the source).
//! * **Waiting** (`lock()`): one attempt; if held, subscribe to the lock's channel, attempt again
//!   (so a release between the first attempt and the subscription is not missed), then sleep
//!   until a release message naming this waiter as the queue's head (shares: any release
//!   message, which wakes every reader of every client at once, and one permit waiter per
//!   client), the holder's `PTTL` (expiry publishes nothing; only the queue's head, or for
//!   shares one waiter per client and name, sleeps until it: no herd at expiry), the
//!   safety-net poll (`poll_ms`, jittered; it also keeps the queue entry alive) or the
//!   deadline, whichever comes first. Each client has one RESP3 pub/sub connection (opened at
//!   connect on a single node, where it subscribes to the namespace's revocation notices, see
//!   [`Capabilities::revoke_detection`]; on a cluster on the first wait; resubscribing after
//!   reconnects) shared by all its waiters; waiters of one name share one subscription.
//!
//! # URL
//!
//! `redis[s][+cluster]://[[user]:password@]host[:port][,host[:port]...][/db][?params]`.
//! User name and password are percent-decoded (`redis://:pw@h` for `requirepass`,
//! `redis://user:pw@h` for an ACL user). Query parameters (anything else is refused with
//! [`ErrorKind::InvalidConfig`](lockcore::ErrorKind::InvalidConfig)):
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `namespace` | `locksmith` | key prefix, `[A-Za-z0-9_.:-]{1,64}` |
//! | `min_replicas` | `0` | after winning or extending, `WAIT` for this many replicas; too few: release (or do not extend) and fail with `Unavailable` |
//! | `replica_timeout_ms` | `100` | the `WAIT` timeout |
//! | `tls_ca` | system roots | PEM file of the CA that signed the server certificate (`rediss` only) |
//! | `poll_ms` | `1000` | safety-net poll of a notified waiter (jittered in `[poll/2, poll]`) |
//! | `connect_timeout_ms` | `2000` | connection timeout |
//! | `response_timeout_ms` | `2000` | per-command response timeout |
//! | `interop` | none | `redis-py` or `redisson`: keep locks on that client's layout (below) |
//!
//! # Sharing locks with redis-py or Redisson (`interop=`)
//!
//! With `interop=redis-py` a lock is what redis-py's `Lock` (4.3.4) keeps: a string at the
//! exact lock name (no namespace) holding the owner's token, with a TTL. With
//! `interop=redisson` it is Redisson's `RLock` (4.7.0): a hash at the exact name, one field
//! `<uuid>:1` with count 1, a `PEXPIRE`; a release publishes `0` on
//! `redisson_lock__channel:{<name>}` (Redisson's waiters wake), and waiters here subscribe to
//! that channel (Redisson's releases wake them). In both, acquire, extend and release check
//! the peer's own record in one script, so each side excludes the other; the guard has **no
//! fencing token** (the peer keeps no counter: a token would not order its holders). redis-py
//! announces nothing on release: waiters here see a redis-py release at their next poll
//! (`poll_ms`). Single node or sentinel only (a cluster is refused), without `min_replicas`.
//! [`Interop`] and the capabilities' notes say what holds in each mode.
//!
//! **The default layout and the modes on one name exclude each other**, in both orders: a
//! mode's acquire script first checks the name's key on locksmith's default layout
//! (`<namespace>:{<name>}:lock`, same `namespace`) and its shares and permits, and writes that
//! key (its owner, its TTL) beside the peer's record; extend and release keep the two together.
//! So a fleet can move between the default layout and `interop=` one service at a time without
//! two holders, and the two modes exclude each other too. The real peers read only their own
//! key: a redis-py or Redisson client and a locksmith client on the default layout do not see
//! each other (a declared limit of the compatibility table: locksmith clients that share names
//! with a peer use its mode). See [`lockcore::Capabilities::compatibility_table`].
//!
//! `min_replicas` narrows the failover window of Redis's asynchronous replication but does not
//! close it: `WAIT` only says that replicas received the write, not that a failover will promote
//! one of them. A failover can therefore lose a fresh lock (two holders); the fencing counter
//! stays increasing through it because it never falls below the server clock. With
//! `min_replicas`, acquisitions and extensions both send their script and `WAIT` as one pipeline
//! (one round trip) over a connection of their own (`WAIT` blocks the connection it runs on);
//! an extension that too few replicas acknowledged fails with `Unavailable` and does not move
//! the lease's validity.
//!
//! # Failure modes
//!
//! * **Server restart without persistence** (`save ""`, no AOF; also a crash of a node with
//!   persistence that had not written the key yet): the restarted server has no lock keys, so
//!   **another client can win the lock as soon as the server answers again, while the holder
//!   still believes it holds** (two holders). The holder learns of the loss only at its next
//!   renewal (auto-renew: every `ttl / 3` by default, refused with `NotHeld`, which fires its
//!   lost signal) or, without renewal, when its validity ends: the window is at most one
//!   renewal interval plus a round trip after the restart, never more than the lease's
//!   validity. Fencing tokens stay increasing through it (see the acquire script), so a fenced
//!   resource rejects the old holder's writes. Run Redis with `appendonly yes` and
//!   `appendfsync always` to keep locks across a restart, or use fencing.
//! * **A server clock jumping forward** (or a key expired early by anything else): the key
//!   expires before the holder's validity ends, and another client can win while the holder
//!   believes it holds, until its next renewal is refused (or its validity ends). Keep server
//!   clocks NTP-slewed, not stepped; fence writes.
//! * **Failover** to a replica that missed the write: the same, see `min_replicas` above.
//! * **Holder process killed or paused**: the lock frees when its TTL runs out (never before);
//!   a paused holder learns of the loss when it resumes (its validity deadline has passed).
//!
//! Passwords never appear in `Debug`, [`Backend::describe`], logs or error messages.
//!
//! The single-node protocol (scripts, key layout, connection setup, subscriptions) is the public
//! [`node`] module, shared with `lock-redlock`.
#![deny(missing_docs)]

mod batch;
mod config;
mod conn;
mod error;
pub mod inspect;
mod interop;
pub mod node;
mod queue;
mod registration;
mod revoked;
mod shares;
mod subs;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::backend::OwnerToken;
use lockcore::backend::{
    AcquireRequest, Acquired, Backend, Backoff, CleanUpIfCancelled, Lease, ReleaseIfCancelled,
    poll_attempts,
};
use lockcore::{Capabilities, Error, Instant, LockInfo, LockMode, LockName, Result, WaitKind};

use crate::batch::{Layout, Renewals};
pub use crate::config::Config;
use crate::conn::Conn;
pub use crate::interop::Interop;
use crate::node::{AcquireWith, ExpiryWatch, Keys, Node, NodeAttempt, Replicas};
pub use crate::registration::REGISTRATION;
use crate::shares::ShareAttempt;

enum Attempt {
    Won(Acquired),
    Held {
        pttl: Option<Duration>,
        /// This waiter is the head of the name's queue (see [`queue`]).
        head: bool,
    },
}

struct Inner {
    node: Node,
    /// Only with `min_replicas`: `WAIT` blocks the connection it runs on, so the script + `WAIT`
    /// pipelines of acquisitions and extensions go through this one, never through the node's
    /// command connection (other commands never queue behind a `WAIT`).
    wait_conn: Option<(Conn, Replicas)>,
    /// Single node without `min_replicas`: extends batched into one script call (see
    /// [`batch`]).
    renewals: Option<Renewals>,
    /// The peer whose layout and protocol this client follows (`interop=`), if any.
    interop: Option<Interop>,
    caps: Capabilities,
    describe: String,
    /// The namespace's revocation channel, subscribed (see [`revoked`]): `None` on a cluster,
    /// under `interop=`, or when the subscription failed at connect.
    revocations: Option<node::Waiting>,
}

impl Inner {
    /// The keys and channel of `name`: locksmith's own layout, or the peer's under `interop=`.
    fn keys(&self, name: &LockName) -> Keys {
        match self.interop {
            Some(peer) => peer.keys(&self.node.config().namespace, name),
            None => self.node.keys(name),
        }
    }
}

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
        let caps = Self::capabilities_for(&cfg);
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
            }),
        })
    }

    fn capabilities_for(cfg: &Config) -> Capabilities {
        let mut c = Capabilities::default();
        c.fencing = true;
        // Exclusive waiters queue on the server (see `queue`); under interop= the peer's
        // layout has no queue, and the interop capabilities say not fair.
        c.fair = true;
        c.wait = WaitKind::Notify;
        c.lost_detection = false;
        // force_release tells the holder's client on the namespace's revocation channel (a
        // single node's own layout; see `revoked`).
        c.revoke_detection = !cfg.cluster && cfg.interop.is_none();
        // Elsewhere the next renewal finds the key gone (the default).
        if c.revoke_detection {
            c.loss_detection = lockcore::LossDetection::Pushed {
                within: Duration::from_secs(1),
            };
        }
        c.reentrant = false;
        c.expiry_after_ttl = true;
        c.force_release = true;
        c.inspect = true;
        c.min_ttl = Duration::from_millis(1);
        // With min_replicas, shares are acknowledged by replicas as exclusive locks are.
        c.shared = lockcore::Support::Yes;
        c.permits = lockcore::Support::Yes;
        c.notes = vec![
            "fencing tokens are max(last + 1, server TIME in microseconds): they keep increasing \
             across a restart without persistence and across a failover to a replica that missed \
             increments, as long as the servers' clocks do not step back by more than the time \
             between the last grant and the restart (keep them NTP-synced, slewing); a clock set \
             back further can repeat tokens"
                .into(),
            "asynchronous replication: a failover right after an acquire can lose the lock \
             (min_replicas narrows this window with WAIT but does not close it)"
                .into(),
            "a restart without persistence loses every lock: another client can win as soon \
             as the server answers again, while the holder learns of the loss only at its next \
             renewal (within ttl/3 by default, plus a round trip) or when its validity ends \
             (two holders in that window; fencing tokens keep increasing)"
                .into(),
            "fair among exclusive waiters: a server-side queue per name (two sorted sets beside \
             the lock key, entries expiring on the server's clock poll_ms + 2 s after their \
             waiter's last attempt); a free lock goes to the queue's head only, a release names \
             the head and wakes no one else (a hand-over costs the release and one attempt), a \
             try_lock is refused while waiters queue; readers and permits do not queue (a \
             waiting writer's mark keeps readers from starving it); a crashed head holds a free \
             lock up until its entry expires and the next waiter's safety poll; a failover to a \
             replica that missed queue writes may reorder waiters (each re-joins at its next \
             attempt)"
                .into(),
            "lease expiry publishes nothing: the queue's head (shares: one waiter per client) \
             also wakes at the holder's PTTL, and every waiter polls every poll_ms as a safety \
             net for lost messages (the poll also keeps its queue entry alive)"
                .into(),
            "lost leases are detected by the contract (renewal refused, validity deadline), not \
             by the backend; a force_release publishes the owner tokens it took away on the \
             namespace's revocation channel (<namespace>:revoked, subscribed by every client at \
             connect), and their holders' lost signals fire at once (single node only; a notice \
             sent while a client's pub/sub connection is down is lost: its next renewal finds \
             out)"
                .into(),
        ];
        if cfg.cluster {
            c.notes.push(
                "cluster: release notifications use sharded pub/sub (SPUBLISH/SSUBSCRIBE, Redis \
                 7) on the lock's slot, not a broadcast to every node"
                    .into(),
            );
        }
        if !cfg.cluster {
            c.compatibility = interop::compatibility();
        }
        match cfg.interop {
            Some(peer) => peer.capabilities(c),
            None => c,
        }
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
    /// for; zero once no `lock()` call waits.
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

    /// One acquire script. Dropped while the script is in flight (a cancelled `lock()`), the
    /// script may still win on the server: the token's lock is then released in the background
    /// (compare-and-delete: it frees nothing that is not this attempt's), so nothing is left
    /// held until its TTL.
    /// `waits`: the attempt belongs to a waiting `lock()`, whose writer marks itself as waiting
    /// behind shared holders (see [`shares`]); a `try_lock` marks nothing.
    async fn attempt(&self, req: &AcquireRequest, keys: &Keys, waits: bool) -> Result<Attempt> {
        let mut behind = self.lease(req, None);
        behind.behind_attempt = true;
        let in_flight = ReleaseIfCancelled::arm(behind, &req.background);
        let outcome = if req.mode != LockMode::Exclusive {
            // WAIT blocks its connection: with min_replicas, shares go through the WAIT one.
            let (mut conn, replicas) = match &self.inner.wait_conn {
                Some((conn, replicas)) => (conn.clone(), Some(*replicas)),
                None => (self.inner.node.conn(), None),
            };
            let sent_at = Instant::now();
            let token = req.token.to_hex();
            let holder = req.holder.encode();
            let ask = shares::ShareAsk {
                ttl: req.ttl,
                mode: req.mode,
                entry: self.queue_entry(waits),
                fencing: true,
            };
            shares::acquire(&mut conn, keys, &token, &holder, ask, replicas)
                .await
                .map(|attempt| match attempt {
                    ShareAttempt::Won { fence } => {
                        Attempt::Won(Acquired::new(self.won_lease(req, Some(fence)), sent_at))
                    }
                    ShareAttempt::Held { wait } => Attempt::Held {
                        pttl: wait,
                        head: false,
                    },
                })
        } else if let Some(wait_conn) = &self.inner.wait_conn {
            self.attempt_with_replicas(req, keys, wait_conn, waits)
                .await
        } else {
            let mut conn = self.inner.node.conn();
            let sent_at = Instant::now();
            self.run_acquire(&mut conn, req, keys, waits)
                .await
                .map(|attempt| self.outcome(req, attempt, sent_at))
        };
        in_flight.disarm();
        outcome
    }

    /// The lease of `req`'s token.
    fn lease(&self, req: &AcquireRequest, fence: Option<u64>) -> RedisLease {
        RedisLease {
            inner: self.inner.clone(),
            name: req.name.clone(),
            token: req.token,
            // No counter under interop= (the peer keeps none), none moved when no token was
            // wanted.
            fenced: self.inner.interop.is_none() && fence.is_some(),
            fence: fence.unwrap_or(0),
            share: req.mode != LockMode::Exclusive,
            behind_attempt: false,
        }
    }

    /// The lease of a won attempt, its lost signal reachable by a revocation notice (see
    /// [`revoked`]) until the lease is dropped.
    fn won_lease(&self, req: &AcquireRequest, fence: Option<u64>) -> RedisLease {
        if self.inner.revocations.is_some() {
            self.inner
                .node
                .watch_revoked(req.token.uuid().as_u128(), req.lost.clone());
        }
        self.lease(req, fence)
    }

    /// How long a writer's mark (see [`shares`]) lasts: past the writer's next attempt, which
    /// comes at a release, at the earliest shared holder's expiry, or at the safety poll (at
    /// most `poll_ms` away), whichever is first.
    fn writer_slack(&self) -> Duration {
        node::writer_mark_ttl(self.inner.node.config().poll)
    }

    async fn run_acquire(
        &self,
        conn: &mut Conn,
        req: &AcquireRequest,
        keys: &Keys,
        waits: bool,
    ) -> Result<(NodeAttempt, Option<u64>)> {
        match self.inner.interop {
            Some(peer) => Ok((
                peer.acquire(conn, keys, &peer.owner(&req.token), req.ttl)
                    .await?,
                None,
            )),
            None => {
                let holder = req.holder.encode();
                let token = req.token.to_hex();
                let slack = Some(if waits {
                    self.writer_slack()
                } else {
                    Duration::ZERO
                });
                let with = AcquireWith {
                    // Without a token wanted, the counter is left alone (three calls fewer).
                    fencing: req.fencing.wanted(),
                    replicas: None,
                    beside_shares: slack,
                    queue: Some(self.queue_entry(waits)),
                };
                node::acquire_queued(conn, keys, &token, &holder, req.ttl, with)
                    .await
                    .map(|(attempt, _, position)| (attempt, position))
            }
        }
    }

    fn outcome(
        &self,
        req: &AcquireRequest,
        (attempt, position): (NodeAttempt, Option<u64>),
        sent_at: Instant,
    ) -> Attempt {
        match attempt {
            NodeAttempt::Won { fence } => {
                Attempt::Won(Acquired::new(self.won_lease(req, fence), sent_at))
            }
            NodeAttempt::Held { pttl } => Attempt::Held {
                pttl,
                head: position == Some(0),
            },
        }
    }

    /// The TTL of a queue entry for an attempt (see [`queue`]): a waiting `lock()` joins the
    /// queue, a `try_lock` (zero) does not.
    fn queue_entry(&self, waits: bool) -> Duration {
        if waits {
            queue::entry_ttl(self.inner.node.config().poll)
        } else {
            Duration::ZERO
        }
    }

    /// Whether `req` waits in the name's server-side queue: exclusive requests on locksmith's
    /// own layout (a peer's layout under `interop=` has no queue; shares are counted as queued
    /// waiters but take no place in the order).
    fn queues(&self, req: &AcquireRequest) -> bool {
        self.inner.interop.is_none() && req.mode == LockMode::Exclusive
    }

    /// The connection the exclusive attempts of this client go through (the `WAIT` one with
    /// `min_replicas`): a waiter leaves the queue on it, behind its last attempt.
    fn attempt_conn(&self) -> Conn {
        match &self.inner.wait_conn {
            Some((conn, _)) => conn.clone(),
            None => self.inner.node.conn(),
        }
    }

    async fn attempt_with_replicas(
        &self,
        req: &AcquireRequest,
        keys: &Keys,
        (conn, replicas): &(Conn, Replicas),
        waits: bool,
    ) -> Result<Attempt> {
        let sent_at = Instant::now();
        let token = req.token.to_hex();
        // Script and WAIT pipelined: one round trip, no client-side serialisation.
        let result = node::acquire_queued(
            &mut conn.clone(),
            keys,
            &token,
            &req.holder.encode(),
            req.ttl,
            AcquireWith {
                fencing: req.fencing.wanted(),
                replicas: Some(*replicas),
                // Shared holders hold the name too; a waiting writer marks itself.
                beside_shares: Some(if waits {
                    self.writer_slack()
                } else {
                    Duration::ZERO
                }),
                queue: Some(self.queue_entry(waits)),
            },
        )
        .await;
        let err = match result {
            Ok((attempt @ NodeAttempt::Held { .. }, _, position)) => {
                return Ok(self.outcome(req, (attempt, position), sent_at));
            }
            Ok((attempt, Some(n), position)) if n >= i64::from(replicas.count) => {
                return Ok(self.outcome(req, (attempt, position), sent_at));
            }
            Ok((_, acked, _)) => Error::new(
                lockcore::ErrorKind::Unavailable,
                format!(
                    "only {} of {} replicas acknowledged the lock within {:?}; released it",
                    acked.unwrap_or(0),
                    replicas.count,
                    replicas.timeout
                ),
            ),
            // Whether the script ran is unknown: release in case it did (owner-checked).
            Err(e) => e,
        };
        // Over the WAIT connection first: a script still queued there (its reply timed out)
        // runs before this release, never after it.
        let released = match queue::release(&mut conn.clone(), keys, &token).await {
            Ok(held) => Ok(held),
            Err(_) => queue::release(&mut self.inner.node.conn(), keys, &token).await,
        };
        if let Err(e) = released {
            tracing::warn!(error = %e, "could not release an under-replicated lock; it frees after its ttl");
        }
        Err(err)
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
        match self.attempt(req, &keys, false).await? {
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
        let keys = self.keys(&req.name);
        let queued = self.queues(req);
        let token = req.token.to_hex();
        // Armed before the first attempt, which may queue this waiter (or count a waiting
        // share); disarmed when it wins (the winning script took it out of the queue).
        let in_queue = self.inner.interop.is_none().then(|| {
            let leave = queue::Leave {
                conn: self.attempt_conn(),
                keys: keys.clone(),
                token: token.clone(),
            };
            CleanUpIfCancelled::arm(leave, &req.background)
        });
        let won = |a, in_queue: Option<CleanUpIfCancelled<queue::Leave>>| {
            if let Some(q) = in_queue {
                q.disarm();
            }
            Ok(Some(a))
        };
        // Uncontended fast path: no subscription round trip when the lock is free.
        let mut pttl = match self.attempt(req, &keys, true).await? {
            Attempt::Won(a) => return won(a, in_queue),
            Attempt::Held { pttl, .. } => pttl,
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        let waiting = match self.inner.node.subscriptions().join(&keys.channel).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "cannot subscribe to release notifications; polling instead");
                // The attempts of a waiting lock(): a writer marks itself behind readers, and
                // each attempt keeps its queue entry alive (the backoff stays below its TTL).
                let backoff = Backoff::for_ttl(req.ttl);
                let got = poll_attempts(req, deadline, &backoff, || async {
                    Ok(match self.attempt(req, &keys, true).await? {
                        Attempt::Won(a) => Some(a),
                        Attempt::Held { .. } => None,
                    })
                })
                .await?;
                return match got {
                    Some(a) => won(a, in_queue),
                    None => Ok(None),
                };
            }
        };
        // Registered before the next attempt: a release naming this waiter as the queue's head
        // while the attempt is in flight is kept for it.
        let head_wake = queued.then(|| waiting.queued(&token));
        let poll = self.inner.node.config().poll;
        let mut expiry = ExpiryWatch::new(waiting.channel());
        loop {
            // Registered before the attempt: a release published while it is in flight wakes us.
            // Readers on their own notify: a release wakes all of them, not one per client.
            let notified = if req.mode == LockMode::Shared {
                waiting.channel().readers.notified()
            } else {
                waiting.channel().notify.notified()
            };
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Subscribed now: this attempt sees any release that came before the subscription.
            let head = match self.attempt(req, &keys, true).await? {
                Attempt::Won(a) => {
                    expiry.won();
                    return won(a, in_queue);
                }
                Attempt::Held { pttl: p, head } => {
                    pttl = p.or(pttl);
                    head
                }
            };
            // Subscribed and seen held: a release from now on wakes this waiter.
            req.waiting.mark();
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            // The safety net: lost messages, a crashed head's entry expired (nothing announces
            // it), and, for a queued waiter, its entry kept alive.
            let safety = poll / 2 + poll.mul_f64(fastrand::f64() / 2.0);
            let mut wake = now + safety;
            // Expiry publishes nothing: one waiter comes back when the holder's lease runs out,
            // not all of them (no herd at expiry): the queue's head, or without a queue one
            // waiter per client.
            let watches_expiry = if queued { head } else { expiry.claim() };
            if let Some(p) = pttl.take()
                && watches_expiry
            {
                wake = wake.min(now + p + Duration::from_millis(fastrand::u64(1..=5)));
            }
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            let woken = async {
                match &head_wake {
                    // Only a release naming this waiter (it is the head): the others sleep on.
                    Some(h) => h.notify().notified().await,
                    None => notified.as_mut().await,
                }
            };
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
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

/// A held Redis lease. Its keys and the owner string the server stores are derived from the
/// name and the token when a request needs them, not kept: with many leases on one client, the
/// five key strings and the token's text were most of a lease's memory (issue 24), while a
/// request formats them in well under a microsecond.
struct RedisLease {
    inner: Arc<Inner>,
    name: LockName,
    token: OwnerToken,
    /// The fencing token, where `fenced` (an `Option<u64>` in two fields: with the flag beside
    /// the other flags the lease fits a smaller allocation, issue 24).
    fence: u64,
    fenced: bool,
    /// A shared holder's or a permit's lease (see [`shares`]), not the lock key.
    share: bool,
    /// Released over the `WAIT` connection (`min_replicas`): the clean-up of a cancelled
    /// attempt, whose script went over that connection. Redis serves one connection's commands
    /// in order, so the release comes after the script; over the command connection it could
    /// overtake it, find nothing, and leave what the script then won held for its TTL.
    behind_attempt: bool,
}

impl fmt::Debug for RedisLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLease")
            .field("key", &self.keys().lock)
            .field("token", &self.token)
            .field("fencing", &self.fencing_token())
            .finish()
    }
}

impl Drop for RedisLease {
    fn drop(&mut self) {
        if !self.behind_attempt && self.inner.revocations.is_some() {
            self.inner.node.unwatch_revoked(self.token.uuid().as_u128());
        }
    }
}

fn not_held() -> Error {
    Error::not_held("the lease expired or belongs to another holder")
}

impl RedisLease {
    /// The lease's keys and channel (locksmith's layout, or the peer's under `interop=`).
    fn keys(&self) -> Keys {
        self.inner.keys(&self.name)
    }

    /// What the lock records as its owner: the owner token (or the peer's form of it).
    fn owner(&self) -> String {
        match self.inner.interop {
            Some(peer) => peer.owner(&self.token),
            None => self.token.to_hex(),
        }
    }
}

#[async_trait]
impl Lease for RedisLease {
    fn fencing_token(&self) -> Option<u64> {
        self.fenced.then_some(self.fence)
    }

    /// One compare-and-pexpire script, one round trip; on a single node, extends that fall due
    /// together share one script call (the validity still counts from the caller's send).
    ///
    /// Cancel safety: dropping the future may or may not have extended the lease.
    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        if !self.share
            && let Some(renewals) = &self.inner.renewals
        {
            // The batch derives the keys and owner itself, into a buffer it reuses.
            let held = renewals.extend(&self.name, self.token, ttl).await?;
            return if held { Ok(ttl) } else { Err(not_held()) };
        }
        let (keys, owner) = (self.keys(), self.owner());
        if self.share {
            let (mut conn, replicas) = match &self.inner.wait_conn {
                Some((conn, replicas)) => (conn.clone(), Some(*replicas)),
                None => (self.inner.node.conn(), None),
            };
            let held = shares::extend(&mut conn, &keys, &owner, ttl, replicas).await?;
            return if held { Ok(ttl) } else { Err(not_held()) };
        }
        let Some((conn, replicas)) = &self.inner.wait_conn else {
            let mut conn = self.inner.node.conn();
            let held = match self.inner.interop {
                Some(peer) => peer.extend(&mut conn, &keys, &owner, ttl).await?,
                None => node::extend(&mut conn, &keys, &owner, ttl).await?,
            };
            return if held { Ok(ttl) } else { Err(not_held()) };
        };
        // With min_replicas an extension counts only once replicas have it too: a promoted
        // replica with the old TTL would free the lock early.
        let (held, acked) =
            node::extend_replicated(&mut conn.clone(), &keys, &owner, ttl, Some(*replicas)).await?;
        if !held {
            return Err(not_held());
        }
        let acked = acked.unwrap_or(0);
        if acked < i64::from(replicas.count) {
            return Err(Error::new(
                lockcore::ErrorKind::Unavailable,
                format!(
                    "only {acked} of {} replicas acknowledged the extension within {:?}; the \
                     lease's validity is not extended",
                    replicas.count, replicas.timeout
                ),
            ));
        }
        Ok(ttl)
    }

    /// One compare-and-delete script that also wakes the waiters.
    ///
    /// Cancel safety: dropping the future may leave the lock held until its TTL runs out.
    async fn release(&self) -> Result<()> {
        let mut conn = match (&self.inner.wait_conn, self.behind_attempt) {
            (Some((conn, _)), true) => conn.clone(),
            _ => self.inner.node.conn(),
        };
        let (keys, owner) = (self.keys(), self.owner());
        let held = match self.inner.interop {
            _ if self.share => shares::release(&mut conn, &keys, &owner).await?,
            Some(peer) => peer.release(&mut conn, &keys, &owner).await?,
            None => queue::release(&mut conn, &keys, &owner).await?,
        };
        if held { Ok(()) } else { Err(not_held()) }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_lease_stays_small() {
        // One per held lease: 56 bytes and malloc's header fit a 64-byte chunk (issue 24).
        assert!(
            size_of::<super::RedisLease>() <= 56,
            "{} bytes",
            size_of::<super::RedisLease>()
        );
    }
}
