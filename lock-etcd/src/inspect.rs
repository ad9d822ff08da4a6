//! `inspect`: the lock's queue in one read (holder first), then the holder lease's TTL.
//!
//! The holder's metadata is the value of its key ([`Holder::encode`], written by the acquire
//! transaction's put: no extra request), the fencing token its create revision, the waiters the
//! keys behind it.

use std::time::Duration;

use etcd_client::{GetOptions, SortOrder, SortTarget};
use lockcore::{Holder, LockInfo, LockName, Result};

use crate::backend::EtcdBackend;

impl EtcdBackend {
    /// See [`Backend::inspect`](lockcore::backend::Backend::inspect). Two reads when held (the
    /// queue, the holder lease's time to live), one when free. The TTL left is in whole seconds
    /// (etcd's lease granularity).
    pub(crate) async fn inspect_lock(&self, name: &LockName) -> Result<LockInfo> {
        let dir = self.dir(name);
        let resp = self
            .call("reading the lock's queue", |mut c| {
                let dir = dir.clone();
                async move {
                    c.get(
                        dir,
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_sort(SortTarget::Create, SortOrder::Ascend),
                        ),
                    )
                    .await
                }
            })
            .await?;
        let Some(head) = resp.kvs().first() else {
            return Ok(LockInfo::free(name.clone(), Some(0)));
        };
        let waiters = resp.kvs().len() - 1;
        let lease = head.lease();
        let ttl_left = if lease == 0 {
            None
        } else {
            let ttl = self
                .call("reading the holder's lease", |mut c| async move {
                    c.lease_time_to_live(lease, None).await
                })
                .await?;
            // -1: the lease expired between the two reads.
            u64::try_from(ttl.ttl()).ok().map(Duration::from_secs)
        };
        Ok(LockInfo::held(name.clone())
            .with_fencing_token(u64::try_from(head.create_revision()).ok())
            .with_ttl_left(ttl_left)
            .with_holder(head.value_str().ok().and_then(Holder::decode))
            .with_waiters(Some(waiters)))
    }
}
