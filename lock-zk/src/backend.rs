//! The client's state (its current session, what it remembers about lock nodes, its
//! counters) and what every part asks of it: a live session, a lock's node, the ACLs.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::{Capabilities, Error, Instant, IntoLockName, Result};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::config::Config;
use crate::contenders::{self, Interop};
use crate::errors::{RETRY_PAUSE, is_retryable, map_err, retry};
use crate::session::Session;
use crate::stats::{Stats, ZkStats};

/// At most this many forged (non-ephemeral) contender paths are remembered.
pub(crate) const MAX_FOREIGN: usize = 4096;

/// At most this many lock nodes are remembered as last won by this client.
pub(crate) const MAX_RECENT_WINS: usize = 1024;

/// Creator-all + world-read: other identities can see lock nodes but neither create nor delete
/// children of the lock nodes (ZooKeeper checks delete against the parent's ACL).
pub(crate) static LOCKED_ACL: [zk::Acl; 2] = [
    zk::Acl::new_const(zk::Permission::ALL, "auth", ""),
    zk::Acl::new_const(zk::Permission::READ, "world", "anyone"),
];

/// A ZooKeeper lock client: one session at a time (a new one after an expiry). See the crate
/// docs for the URL and the recipe.
#[derive(Clone)]
pub struct ZkBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) base: String,
    pub(crate) capabilities: Capabilities,
    pub(crate) session_timeout: Duration,
    pub(crate) lost_after_disconnect: Duration,
    pub(crate) session: watch::Sender<Arc<Session>>,
    /// Cleared when the server refuses CONTAINER nodes; parents are then persistent and
    /// deleted (best effort) on release.
    pub(crate) containers: AtomicBool,
    /// Paths of forged contender nodes (not ephemeral): never waited on.
    pub(crate) foreign: Mutex<HashSet<String>>,
    /// Lock nodes whose last acquisition by this client won: `try_lock` creates at once there
    /// (a client that just held a lock mostly finds it free), elsewhere it lists first.
    pub(crate) recent_wins: Mutex<HashSet<String>>,
    pub(crate) stats: Stats,
    /// Dropped with the backend: stops the session task.
    pub(crate) _shutdown: watch::Sender<()>,
    /// Open a new session after one ends (false on an application's session).
    pub(crate) reopen: bool,
    /// Test hook: the next create "loses" its reply after the server applied it.
    #[cfg(test)]
    pub(crate) drop_next_create_reply: AtomicBool,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("url", &self.redacted_url())
            .field("session_id", &self.session().id)
            .finish()
    }
}

/// The contenders among `children` in queue order, without the forged nodes in `foreign`.
pub(crate) fn queue<'a>(
    children: &'a [String],
    parent: &str,
    foreign: &HashSet<String>,
) -> Vec<(i64, &'a str)> {
    contenders::queue(children, |c| {
        !foreign.is_empty() && foreign.contains(&format!("{parent}/{c}"))
    })
}

impl ZkBackend {
    /// The URL without secrets, with the negotiated session timeout (`Backend::describe`).
    pub(crate) fn redacted_url(&self) -> String {
        self.inner.config.redacted(Some(self.inner.session_timeout))
    }

    /// The current session.
    pub(crate) fn session(&self) -> Arc<Session> {
        self.inner.session.borrow().clone()
    }

    /// A session that has not ended, waiting for the session task to open a new one after an
    /// expiry (at most until `deadline`, or half a session timeout when there is none, so that
    /// `try_lock` answers `Unavailable` soon while no server can be reached).
    pub(crate) async fn live_session(&self, deadline: Option<Instant>) -> Result<Arc<Session>> {
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
    /// [`LostReason::ConnectionLost`](lockcore::LostReason::ConnectionLost): zero (at once) unless `lost_after_disconnect` was set.
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
            node_watches: load(&s.node_watches),
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
    pub(crate) fn check_name(&self, name: &lockcore::LockName) -> Result<()> {
        let escaped = name.escaped();
        if self.inner.config.interop == Interop::Kazoo && escaped != name.as_str() {
            return Err(Error::invalid_name(format!(
                "with interop=kazoo a lock name is one path segment of [A-Za-z0-9_-] (a kazoo client would lock {:?} under the namespace, locksmith {escaped:?})",
                name.as_str()
            )));
        }
        Ok(())
    }

    pub(crate) fn parent_path(&self, name: &lockcore::LockName) -> String {
        format!("{}/{}", self.inner.base, name.escaped())
    }

    pub(crate) fn acls(&self) -> zk::Acls<'static> {
        if self.inner.config.digest.is_some() {
            zk::Acls::new(&LOCKED_ACL)
        } else {
            zk::Acls::anyone_all()
        }
    }

    pub(crate) fn foreign(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.inner.foreign.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn recent_wins(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.inner
            .recent_wins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers whether this client's last acquisition of `parent` won.
    pub(crate) fn note_outcome(&self, parent: &str, won: bool) {
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

    pub(crate) async fn ensure_base(&self, client: &zk::Client) -> Result<()> {
        let opts = zk::CreateMode::Persistent.with_acls(self.acls());
        let base = &self.inner.base;
        retry(|| client.mkdir(base, &opts))
            .await
            .map_err(|e| map_err(format!("creating the namespace node {base}"), e))
    }

    /// Creates the lock's parent node if missing (a CONTAINER where the server has them).
    pub(crate) async fn ensure_parent(&self, client: &zk::Client, parent: &str) -> Result<()> {
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
}
