//! `inspect` over the masters: each is read with lock-redis's inspect script at once (and,
//! where no writer holds it, its readers' shares), and the lock is held when a majority of them
//! has the same owner: a writer, or readers each on a majority.
//!
//! Each master keeps the holder's metadata beside its copy of the lock (written by the same
//! acquire script). Redlock has no fencing counter and no queue: neither is reported.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use lock_redis::inspect::{NodeView, read};
use lock_redis::node::{self, Keys};
use lockcore::{LockInfo, LockMode, LockName, Result, Share};

use crate::backend::RedlockBackend;

impl RedlockBackend {
    /// See [`Backend::inspect`](lockcore::backend::Backend::inspect): one read per master, in
    /// parallel. The TTL left is the shortest among the masters of the majority (the lock is
    /// held while a majority keeps it). Readers (`LockMode::Shared`): every reader whose share
    /// a majority of the masters keeps, each with its shortest TTL left.
    pub(crate) async fn inspect_lock(&self, name: &LockName) -> Result<LockInfo> {
        let keys = Arc::new(Keys::new(&self.inner.cfg.namespace, name));
        let results = self
            .inner
            .per_node(self.inner.cfg.response_timeout, move |_, mut c| {
                let keys = keys.clone();
                async move {
                    let view = read(&mut c, &keys).await?;
                    let shares = match view {
                        Some(_) => Vec::new(),
                        None => node::inspect_shares(&mut c, &keys).await?,
                    };
                    Ok((view, shares))
                }
            })
            .collect::<Vec<_>>()
            .await;
        let answered = results.iter().filter(|(_, r)| r.is_ok()).count();
        if answered < self.inner.quorum {
            return Err(self.inner.no_majority(answered, results.into_iter()));
        }
        let mut by_owner: HashMap<String, Vec<NodeView>> = HashMap::new();
        let mut readers: HashMap<String, Vec<Share>> = HashMap::new();
        // Readers in grant order (of the first master that reported them).
        let mut order = Vec::new();
        for (view, shares) in results.into_iter().filter_map(|(_, r)| r.ok()) {
            if let Some(view) = view {
                by_owner.entry(view.owner.clone()).or_default().push(view);
            }
            for (token, share) in shares {
                let seen = readers.entry(token.clone()).or_default();
                if seen.is_empty() {
                    order.push(token);
                }
                seen.push(share);
            }
        }
        if let Some(views) = by_owner
            .into_values()
            .find(|v| v.len() >= self.inner.quorum)
        {
            let ttl_left = views.iter().filter_map(|v| v.ttl_left).min();
            let holder = views.into_iter().find_map(|v| v.holder);
            return Ok(LockInfo::held(name.clone())
                .with_ttl_left(ttl_left)
                .with_holder(holder)
                .with_mode(Some(LockMode::Exclusive)));
        }
        let shares: Vec<Share> = order
            .into_iter()
            .filter_map(|token| readers.remove(&token))
            .filter(|copies| copies.len() >= self.inner.quorum)
            .map(|copies| {
                let ttl_left = copies.iter().filter_map(|s| s.ttl_left).min();
                let holder = copies.into_iter().find_map(|s| s.holder);
                Share::new(None, ttl_left, holder)
            })
            .collect();
        if shares.is_empty() {
            return Ok(LockInfo::free(name.clone(), None));
        }
        Ok(LockInfo::held(name.clone())
            .with_shares(shares)
            .with_mode(Some(LockMode::Shared)))
    }
}
