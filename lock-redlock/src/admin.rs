//! Operator and measurement requests on every master: `PING`, force release, the bare
//! primitive a plain client runs, the servers' command counts.

use std::sync::{Arc, OnceLock};

use futures::StreamExt;
use lock_redis::node::{self, Keys};
use lockcore::{LockName, Result};

use crate::backend::RedlockBackend;

impl RedlockBackend {
    /// Sends `PING` to every master at once and returns when all answered, each within the
    /// per-node timeout (for measuring the round trip).
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// `Unavailable` or `Backend` when a master fails.
    pub async fn ping(&self) -> Result<()> {
        let results = self
            .inner
            .per_node(self.inner.cfg.response_timeout, |_, mut c| async move {
                node::ping(&mut c).await
            })
            .collect::<Vec<_>>()
            .await;
        results.into_iter().try_for_each(|(_, r)| r)
    }

    /// Deletes the lock `name` on every master whoever holds it (a writer, or every reader, and
    /// a waiting writer's mark), as an administrator would, and wakes its waiters. Returns
    /// whether any master held it.
    /// [`Locker::force_release`](lockcore::Locker::force_release) does the same on every
    /// backend.
    ///
    /// Cancel safety: dropping the future may have deleted the lock on some masters.
    ///
    /// # Errors
    /// `Unavailable` when fewer than a majority of the masters answered.
    pub async fn force_release(&self, name: &LockName) -> Result<bool> {
        let keys = Arc::new(Keys::new(&self.inner.cfg.namespace, name));
        let notice: Arc<str> = node::revocation_channel(&self.inner.cfg.namespace).into();
        let results = self
            .inner
            .per_node(self.inner.cfg.response_timeout, move |_, mut c| {
                let (keys, notice) = (keys.clone(), notice.clone());
                async move { node::revoke_with_shares(&mut c, &keys, Some(&notice)).await }
            })
            .collect::<Vec<_>>()
            .await;
        let answered = results.iter().filter(|(_, r)| r.is_ok()).count();
        if answered < self.inner.quorum {
            return Err(self.inner.no_majority(answered, results.into_iter()));
        }
        Ok(results.into_iter().any(|(_, r)| matches!(r, Ok(true))))
    }

    /// The bare primitive of `Backend::bare_cycle`.
    pub(crate) async fn bare_redlock_cycle(&self, name: &LockName) -> Result<()> {
        let keys = Arc::new(Keys::new(&self.inner.cfg.namespace, name));
        let token: Arc<str> = lockcore::OwnerToken::random().to_hex().into();
        let timeout = self.inner.cfg.response_timeout;
        let set = {
            let (keys, token) = (keys.clone(), token.clone());
            self.inner.per_node(timeout, move |_, mut c| {
                let (keys, token) = (keys.clone(), token.clone());
                async move {
                    redis::cmd("SET")
                        .arg(&keys.lock)
                        .arg(&*token)
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async::<Option<String>>(&mut c)
                        .await
                        .map_err(|e| node::map_err("SET failed", e))
                }
            })
        };
        let set: Vec<_> = set.collect().await;
        let del: Vec<_> = self
            .inner
            .per_node(timeout, move |_, mut c| {
                let (keys, token) = (keys.clone(), token.clone());
                async move {
                    bare_compare_and_delete()
                        .key(&keys.lock)
                        .arg(&*token)
                        .invoke_async::<i64>(&mut c)
                        .await
                        .map_err(|e| node::map_err("compare-and-delete failed", e))
                }
            })
            .collect()
            .await;
        for (_, r) in set {
            r?;
        }
        for (_, r) in del {
            r?;
        }
        Ok(())
    }

    /// The `INFO commandstats` sum of `Backend::server_requests`.
    pub(crate) async fn commands_served(&self) -> Result<u64> {
        let results: Vec<_> = self
            .inner
            .per_node(self.inner.cfg.response_timeout, |_, mut c| async move {
                node::server_requests(&mut c).await
            })
            .collect()
            .await;
        results.into_iter().map(|(_, r)| r).sum()
    }
}

/// The compare-and-delete a plain Redlock client runs (no notification), for
/// [`Backend::bare_cycle`]; the library's release also publishes to waiters.
fn bare_compare_and_delete() -> &'static redis::Script {
    static SCRIPT: OnceLock<redis::Script> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end \
             return 0",
        )
    })
}
