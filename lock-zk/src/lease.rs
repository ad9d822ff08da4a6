//! A held ZooKeeper lock: the contender node at the head of the queue, alive with its session.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lockcore::backend::{Lease, async_trait};
use lockcore::{Error, Result};
use zookeeper_client as zk;

use crate::backend::ZkBackend;
use crate::errors::{RETRY_PAUSE, is_retryable, map_err};
use crate::session::Session;

/// A held ZooKeeper lock: the contender node at the head of the queue.
pub(crate) struct ZkLease {
    pub(crate) backend: ZkBackend,
    pub(crate) session: Arc<Session>,
    /// Key in the session's registry of held leases.
    pub(crate) id: u64,
    pub(crate) path: String,
    pub(crate) czxid: i64,
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

pub(crate) fn not_held(why: &str) -> Error {
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
