//! Operator and measurement requests: force release, a round trip, the bare primitive, the
//! queue's length.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use lockcore::{Error, ErrorKind, Instant, LockName, Result};

use crate::backend::EtcdBackend;
use crate::modes::holders;

/// The TTL of the lease `bare_cycle` uses.
pub(crate) const BARE_TTL_SECS: i64 = 60;

impl EtcdBackend {
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

    /// The request of `Backend::round_trip`.
    pub(crate) async fn read_one_key(&self) -> Result<()> {
        let key = format!("{}/.round-trip", self.inner.config.namespace);
        self.call("reading a key", |mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        })
        .await
        .map(drop)
    }

    /// The bare primitive of `Backend::bare_cycle`.
    pub(crate) async fn bare_put_delete(&self, name: &LockName) -> Result<()> {
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

    /// The count of `Backend::queued_waiters`: the keys that do not hold (behind the holder,
    /// or behind the shared or permit holders), from one keys-only read of the queue.
    pub(crate) async fn count_waiters(&self, name: &LockName) -> Result<usize> {
        let resp = self.read_queue(name, true).await?;
        let keys: Vec<_> = resp.kvs().iter().map(|kv| kv.key()).collect();
        Ok(holders(&keys).into_iter().filter(|holds| !holds).count())
    }
}
