//! The lease pool: leases whose lock was released cleanly, reused by the next acquisition of
//! the same TTL (no grant on the acquisition's path), and new grants.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lockcore::{Error, ErrorKind, Instant, Result};

use crate::backend::EtcdBackend;
use crate::keeper::LeaseCell;

/// Leases kept for reuse per TTL.
pub(crate) const POOL_PER_TTL: usize = 64;

impl EtcdBackend {
    /// A lease with the TTL `secs` (asked): a pooled one that still has at least half its TTL
    /// left, or a new grant. Returns it with whether it is new.
    pub(crate) async fn lease_for(&self, secs: u64) -> Result<(Arc<LeaseCell>, bool)> {
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

    pub(crate) async fn grant(&self, secs: u64) -> Result<Arc<LeaseCell>> {
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

    pub(crate) fn pool_put(&self, secs: u64, cell: Arc<LeaseCell>) {
        let mut pool = self.inner.pool.lock().unwrap_or_else(|e| e.into_inner());
        let list = pool.entry(secs).or_default();
        if list.len() < POOL_PER_TTL {
            list.push(cell);
        }
    }

    /// Revokes a lease that carries nothing any more, in the background (best effort).
    pub(crate) fn revoke_later(&self, id: i64) {
        self.inner.keeper.release(id);
        let mut lease = self.inner.client.lease_client();
        let timeout = self.inner.config.timeout;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(timeout, lease.revoke(id)).await;
        });
    }
}
