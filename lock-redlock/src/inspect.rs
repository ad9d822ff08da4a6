//! `inspect` over the masters: each is read with lock-redis's inspect script at once, and the
//! lock is held when a majority of them has the same owner.
//!
//! Each master keeps the holder's metadata beside its copy of the lock (written by the same
//! acquire script). Redlock has no fencing counter and no queue: neither is reported.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use lock_redis::inspect::{NodeView, read};
use lock_redis::node::Keys;
use lockcore::{LockInfo, LockName, Result};

use crate::backend::RedlockBackend;

impl RedlockBackend {
    /// See [`Backend::inspect`](lockcore::backend::Backend::inspect): one read per master, in
    /// parallel. The TTL left is the shortest among the masters of the majority (the lock is
    /// held while a majority keeps it).
    pub(crate) async fn inspect_lock(&self, name: &LockName) -> Result<LockInfo> {
        let keys = Arc::new(Keys::new(&self.inner.cfg.namespace, name));
        let results = self
            .inner
            .per_node(self.inner.cfg.response_timeout, move |mut c| {
                let keys = keys.clone();
                async move { read(&mut c, &keys).await }
            })
            .collect::<Vec<_>>()
            .await;
        let answered = results.iter().filter(|(_, r)| r.is_ok()).count();
        if answered < self.inner.quorum {
            return Err(self.inner.no_majority(answered, results.into_iter()));
        }
        let mut by_owner: HashMap<String, Vec<NodeView>> = HashMap::new();
        for view in results.into_iter().filter_map(|(_, r)| r.ok().flatten()) {
            by_owner.entry(view.owner.clone()).or_default().push(view);
        }
        let Some(views) = by_owner
            .into_values()
            .find(|v| v.len() >= self.inner.quorum)
        else {
            return Ok(LockInfo::free(name.clone(), None));
        };
        let ttl_left = views.iter().filter_map(|v| v.ttl_left).min();
        let holder = views.into_iter().find_map(|v| v.holder);
        Ok(LockInfo::held(name.clone())
            .with_ttl_left(ttl_left)
            .with_holder(holder))
    }
}
