//! The client: its masters, quorum and capabilities, and how it connects.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lock_redis::node::{Keys, Node};
use lockcore::{Capabilities, Error, ErrorKind, Instant, LockName, Result};

use crate::config::{Config, Parsed};
use crate::slots::{Identity, Slot, run_id_of, same_server};
use crate::subscriptions::NameSubs;
use crate::sync::lock_mutex;

pub(crate) struct Inner {
    pub(crate) cfg: Parsed,
    pub(crate) slots: Vec<Arc<Slot>>,
    pub(crate) identity: Arc<Identity>,
    pub(crate) quorum: usize,
    pub(crate) caps: Capabilities,
    pub(crate) waits: Mutex<HashMap<String, Arc<NameSubs>>>,
    pub(crate) sweeper: AtomicBool,
}

/// A Redlock client over N independent Redis masters. Every [`RedlockBackend::connect`] makes a
/// new, independent client (one command connection per master, plus one pub/sub connection per
/// master opened on the first wait). Clones share them.
#[derive(Clone)]
pub struct RedlockBackend {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("url", &self.inner.cfg.redacted)
            .field("quorum", &self.inner.quorum)
            .finish()
    }
}

impl RedlockBackend {
    /// Parses `url` (see the [crate docs](crate) for its form and parameters) and connects to
    /// every master at once. Masters that cannot be reached are reconnected in the background.
    ///
    /// Cancel safety: dropping the future closes whatever connections it had opened.
    ///
    /// # Errors
    /// `InvalidConfig` for a malformed URL (never quoted), an unreadable `tls_ca` file, or two
    /// nodes that reach the same Redis server (the same `run_id`, under two names); `Auth`
    /// when a master refuses the credentials (wrong password); `Unavailable` when fewer than a
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
                    revocations: Mutex::new(None),
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
            *lock_mutex(&s.revocations) = crate::slots::listen(&node, s.connect_timeout).await;
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

    /// The pub/sub channel a release of `name` publishes on, on every master (for operators and
    /// tests).
    pub fn release_channel(&self, name: &LockName) -> String {
        Keys::new(&self.inner.cfg.namespace, name).channel
    }

    /// How many lock names this client keeps release subscriptions for (they linger a few
    /// seconds after the last wait).
    pub fn waited_names(&self) -> usize {
        lock_mutex(&self.inner.waits).len()
    }
}

pub(crate) fn capabilities(cfg: &Parsed) -> Capabilities {
    // force_release publishes the owner tokens it took away on every master's revocation
    // channel, which every client subscribes to at connect (see `lock_redis::node`).
    let mut c = lock_redis::script_family(true);
    c.fencing = false;
    c.fair = false;
    c.permits = lockcore::Support::no(
        "a majority of independent masters does not keep a count: each master counts its own \
         permits, so a permit won on one majority can be won again on another after a master \
         restarts without persistence (DistributedLock refuses semaphores on Redlock too)",
    );
    // Readers and writers each need a majority (see the crate docs, "Read-write locks").
    c.shared = lockcore::Support::Yes;
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
        "read-write locks: a reader holds a share on a majority of the masters, a writer the \
         lock key on a majority; two majorities share a master, which refuses one of them, so a \
         reader and a writer never both hold (under the same assumptions as the exclusive lock: \
         persistence or delayed restarts, no clock jumps); a waiting writer's mark, set on every \
         master where it finds readers, refuses later readers there: on a majority, no new \
         reader wins; on a minority, new readers can still win a majority of the others until \
         the writer's next vote marks them; no fencing tokens in either mode"
            .into(),
        "not fair: split votes retry after a random, growing delay; a release wakes only the \
         waiter at the head of each master's queue of waiters (queues expire on the masters' \
         clocks and decide whom to wake, not who wins), and waiters also vote at the holder's \
         expiry (one per client) and at a jittered safety poll"
            .into(),
    ];
    c
}
