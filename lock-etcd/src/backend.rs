//! The client's state (one gRPC channel, one watch, one keep-alive stream, the lease pool)
//! and the requests every part sends through it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Txn, TxnResponse};
use lockcore::backend::OwnerToken;
use lockcore::{Capabilities, Instant, IntoLockName, LockName, Result};

use crate::config::Config;
use crate::errors::{map_err, maybe_applied, not_applied, timed_out};
use crate::keeper::{Keeper, LeaseCell};
use crate::watch::Dispatch;

/// Pause before re-sending a request that could not be sent.
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(10);

/// Counters of what the backend did, for tests and figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdStats {
    /// Leases granted (a lease is reused after a clean release).
    pub leases_granted: u64,
    /// Predecessor deletions that woke a waiter (one per hand-over with no herd).
    pub wakeups: u64,
    /// Ownership re-checks after a wake-up.
    pub rechecks: u64,
    /// Lost signals fired because the lock key was deleted behind its holder.
    pub deleted_behind: u64,
    /// Events the client's watch received.
    pub watch_events: u64,
}

#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) leases_granted: AtomicU64,
    pub(crate) wakeups: AtomicU64,
    pub(crate) rechecks: AtomicU64,
    pub(crate) deleted_behind: AtomicU64,
    /// Numbers this client's acquisition attempts, so that each attempt has its own key name.
    pub(crate) attempts: AtomicU64,
}

/// An etcd lock client: one gRPC channel, one watch, one keep-alive stream. See the crate docs.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) config: Config,
    pub(crate) capabilities: Capabilities,
    pub(crate) dispatch: Dispatch,
    pub(crate) keeper: Keeper,
    /// Leases whose lock was released cleanly, by granted TTL in seconds.
    pub(crate) pool: Mutex<HashMap<u64, Vec<Arc<LeaseCell>>>>,
    pub(crate) bare_lease: tokio::sync::Mutex<Option<Arc<LeaseCell>>>,
    /// The keys of abandoned attempts whose clean-up has not deleted them (yet), by owner token:
    /// a retry of the same acquisition deletes them instead of queueing behind them (a key's
    /// name is its lease's id, not the token: see `queue.rs`).
    pub(crate) abandoned: Mutex<HashMap<OwnerToken, Vec<String>>>,
    pub(crate) stats: Stats,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("url", &self.inner.config.redacted())
            .finish()
    }
}

impl EtcdBackend {
    /// The key prefix of lock `name`: its holder's and waiters' keys are directly below it.
    pub fn lock_prefix(&self, name: impl IntoLockName) -> Result<String> {
        Ok(self.dir(&name.into_lock_name()?))
    }

    pub(crate) fn dir(&self, name: &LockName) -> String {
        format!("{}/{}/", self.inner.config.namespace, name.escaped())
    }

    /// The underlying client (sharing this backend's channel), for advanced use and tests.
    /// Deleting lock keys through it breaks the locks they carry.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Counters of what this backend did.
    pub fn stats(&self) -> EtcdStats {
        let s = &self.inner.stats;
        EtcdStats {
            leases_granted: s.leases_granted.load(Ordering::Relaxed),
            wakeups: s.wakeups.load(Ordering::Relaxed),
            rechecks: s.rechecks.load(Ordering::Relaxed),
            deleted_behind: s.deleted_behind.load(Ordering::Relaxed),
            watch_events: self.inner.dispatch.events(),
        }
    }

    /// One request, bounded by the configured timeout. A request that was not applied (no
    /// connection to the member the channel picked, or that member has no leader) is retried
    /// until the timeout: sending it again cannot apply it twice.
    pub(crate) async fn call<T, Fut>(&self, what: &str, f: impl FnMut(Client) -> Fut) -> Result<T>
    where
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        Ok(self.send(what, Resend::IfNotApplied, f).await?.value)
    }

    /// [`EtcdBackend::call`] for a request that may be applied twice (a read, or a delete or
    /// revoke that only removes what it names): also sent again, until the timeout, after its
    /// connection broke once it may have been sent. Neither the lost reply of an applied
    /// request nor a request lost on its way is then more than a prompt re-send (a release
    /// that gave up there left its key for its lease's whole TTL). The answer says whether an
    /// earlier copy may have been applied, so that "nothing to remove" can mean "removed".
    pub(crate) async fn call_idempotent<T, Fut>(
        &self,
        what: &str,
        f: impl FnMut(Client) -> Fut,
    ) -> Result<Answer<T>>
    where
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.send(what, Resend::IfMaybeApplied, f).await
    }

    async fn send<T, Fut>(
        &self,
        what: &str,
        resend: Resend,
        mut f: impl FnMut(Client) -> Fut,
    ) -> Result<Answer<T>>
    where
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let timeout = self.inner.config.timeout;
        let deadline = Instant::now() + timeout;
        let mut maybe_applied_before = false;
        loop {
            match tokio::time::timeout_at(deadline, f(self.inner.client.clone())).await {
                Ok(Ok(value)) => {
                    return Ok(Answer {
                        value,
                        maybe_applied_before,
                    });
                }
                Ok(Err(e)) if Instant::now() + RETRY_PAUSE < deadline && not_applied(&e) => {
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Ok(Err(e))
                    if Instant::now() + RETRY_PAUSE < deadline
                        && resend == Resend::IfMaybeApplied
                        && maybe_applied(&e) =>
                {
                    maybe_applied_before = true;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Ok(Err(e)) => return Err(map_err(what, e)),
                Err(_) => return Err(timed_out(what, timeout)),
            }
        }
    }

    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        self.call(what, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// [`EtcdBackend::txn`] for a transaction that may be applied twice (see
    /// [`EtcdBackend::call_idempotent`]).
    pub(crate) async fn txn_idempotent(&self, what: &str, txn: Txn) -> Result<Answer<TxnResponse>> {
        self.call_idempotent(what, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }
}

/// When [`EtcdBackend::send`] sends a failed request again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resend {
    /// Only when it surely was not applied.
    IfNotApplied,
    /// Also when it may have been (see [`EtcdBackend::call_idempotent`]).
    IfMaybeApplied,
}

/// The answer to a request, and whether an earlier copy of it may have been applied (its
/// connection broke after it may have been sent, and it was sent again).
pub(crate) struct Answer<T> {
    pub(crate) value: T,
    pub(crate) maybe_applied_before: bool,
}

/// At most this many owner tokens are remembered with abandoned keys (see `Inner::abandoned`);
/// past it a retry waits for such a key's lease to expire, as for anyone else's.
const ABANDONED_MAX: usize = 1024;

impl EtcdBackend {
    /// The keys of abandoned attempts, by owner token.
    fn abandoned_keys(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerToken, Vec<String>>> {
        self.inner
            .abandoned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers `key`, put (or maybe put) by an abandoned attempt of the acquisition `token`.
    pub(crate) fn abandon(&self, token: OwnerToken, key: &str) {
        let mut map = self.abandoned_keys();
        if map.len() < ABANDONED_MAX || map.contains_key(&token) {
            map.entry(token).or_default().push(key.to_owned());
        }
    }

    /// Forgets `key` of an abandoned attempt of `token`: it is deleted.
    pub(crate) fn forget_abandoned(&self, token: OwnerToken, key: &str) {
        let mut map = self.abandoned_keys();
        if let Some(keys) = map.get_mut(&token) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                map.remove(&token);
            }
        }
    }

    /// Whether `key` was put by an abandoned attempt of the acquisition `token`.
    pub(crate) fn is_abandoned(&self, token: &OwnerToken, key: &[u8]) -> bool {
        self.abandoned_keys()
            .get(token)
            .is_some_and(|keys| keys.iter().any(|k| k.as_bytes() == key))
    }
}

pub(crate) fn ttl_secs(ttl: Duration) -> u64 {
    ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)
}
