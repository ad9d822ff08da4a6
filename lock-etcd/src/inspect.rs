//! `inspect`: the lock's queue in one read (holders first), then each holder lease's TTL.
//!
//! A holder's metadata is the value of its key ([`Holder::encode`], written by the acquire
//! transaction's put: no extra request), the fencing token its create revision, the mode its
//! key name's suffix; the waiters are the keys that do not hold. A value that is not metadata
//! and not empty is a bare value, an election leader's proposal (a locksmith campaign's or an
//! etcd `concurrency.Election` candidate's): [`LockInfo::value`].

use std::time::Duration;

use etcd_client::{GetOptions, GetResponse, SortOrder, SortTarget};
use lockcore::{Holder, LockInfo, LockMode, LockName, Result, Share};

use crate::backend::EtcdBackend;
use crate::modes::{holders, mode_of};

impl EtcdBackend {
    /// The lock's queue in one read, oldest key first (its keys alone when `keys_only`).
    ///
    /// Cancel safe.
    pub(crate) async fn read_queue(&self, name: &LockName, keys_only: bool) -> Result<GetResponse> {
        let dir = self.dir(name);
        self.call("reading the lock's queue", |mut c| {
            let dir = dir.clone();
            let mut options = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend);
            if keys_only {
                options = options.with_keys_only();
            }
            async move { c.get(dir, Some(options)).await }
        })
        .await
    }

    /// See [`Backend::inspect`](lockcore::backend::Backend::inspect). One read when free; when
    /// held, one more per holder (its lease's time to live), sent together. The TTL left is in
    /// whole seconds (etcd's lease granularity).
    pub(crate) async fn inspect_lock(&self, name: &LockName) -> Result<LockInfo> {
        let resp = self.read_queue(name, false).await?;
        let kvs = resp.kvs();
        let Some(head) = kvs.first() else {
            return Ok(LockInfo::free(name.clone(), Some(0)));
        };
        let holds = holders(&kvs.iter().map(|kv| kv.key()).collect::<Vec<_>>());
        let held: Vec<_> = kvs.iter().zip(&holds).filter(|(_, h)| **h).collect();
        let waiters = kvs.len() - held.len();
        // The lease reads go out together: a semaphore's holders are read in one round trip.
        let ttls: Vec<_> = held
            .iter()
            .map(|(kv, _)| {
                let (backend, lease) = (self.clone(), kv.lease());
                tokio::spawn(async move { backend.ttl_left(lease).await })
            })
            .collect();
        let value = value_of(head.value());
        let mut shares = Vec::with_capacity(held.len());
        for ((kv, _), ttl) in held.iter().zip(ttls) {
            let ttl_left = ttl.await.map_err(|e| {
                lockcore::Error::new(
                    lockcore::ErrorKind::Backend,
                    format!("reading a holder's lease: {e}"),
                )
            })??;
            shares.push(Share::new(
                u64::try_from(kv.create_revision()).ok(),
                ttl_left,
                kv.value_str().ok().and_then(Holder::decode),
            ));
        }
        let info = LockInfo::held(name.clone()).with_waiters(Some(waiters));
        match mode_of(head.key()) {
            LockMode::Exclusive => {
                let first = shares.first();
                Ok(info
                    .with_fencing_token(first.and_then(|s| s.fencing_token))
                    .with_ttl_left(first.and_then(|s| s.ttl_left))
                    .with_holder(first.and_then(|s| s.holder.clone()))
                    .with_value(value)
                    .with_mode(Some(LockMode::Exclusive)))
            }
            mode => Ok(info.with_shares(shares).with_mode(Some(mode))),
        }
    }

    /// The time to live of lease `lease` (none for a key without one, or a lease that expired
    /// since the queue was read).
    async fn ttl_left(&self, lease: i64) -> Result<Option<Duration>> {
        if lease == 0 {
            return Ok(None);
        }
        let ttl = self
            .call("reading a holder's lease", |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await?;
        // -1: the lease expired between the two reads.
        Ok(u64::try_from(ttl.ttl()).ok().map(Duration::from_secs))
    }
}

/// A key's bare value: `None` for holder metadata ([`Holder::encode`]) and for an empty value
/// (an etcd `concurrency.Mutex` key's); anything else is the proposal of an election leader
/// (a locksmith campaign's or an `etcdctl elect` candidate's), not UTF-8 shown lossily.
pub(crate) fn value_of(stored: &[u8]) -> Option<String> {
    let is_metadata = std::str::from_utf8(stored)
        .ok()
        .and_then(Holder::decode)
        .is_some();
    (!stored.is_empty() && !is_metadata).then(|| String::from_utf8_lossy(stored).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_value_is_what_is_not_metadata_nor_empty() {
        let meta = Holder::current(Some("10.0.0.1:8080".to_owned())).encode();
        assert_eq!(value_of(meta.as_bytes()), None);
        assert_eq!(value_of(b""), None);
        assert_eq!(value_of(b"10.0.0.1:8080").as_deref(), Some("10.0.0.1:8080"));
        assert_eq!(value_of(b"a\xffb").as_deref(), Some("a\u{fffd}b"));
    }
}
