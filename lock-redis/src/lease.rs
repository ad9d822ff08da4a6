//! A held lease of a [`RedisBackend`](crate::RedisBackend): its renewal and release, by the
//! mode it was taken in (exclusive, share, a peer's layout) and the connection it must use.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::backend::{AcquireRequest, Lease, OwnerToken};
use lockcore::{Error, LockMode, LockName, Result};

use crate::client::Inner;
use crate::keys::Keys;
use crate::node;
use crate::queue;
use crate::script::under_replicated;
use crate::shares;

impl Inner {
    /// The lease of `req`'s token.
    pub(crate) fn lease(self: &Arc<Self>, req: &AcquireRequest, fence: Option<u64>) -> RedisLease {
        RedisLease {
            inner: Arc::clone(self),
            name: req.name.clone(),
            token: req.token,
            // No counter under interop= (the peer keeps none), none moved when no token was
            // wanted.
            fenced: self.interop.is_none() && fence.is_some(),
            fence: fence.unwrap_or(0),
            share: req.mode != LockMode::Exclusive,
            behind_attempt: false,
        }
    }

    /// The lease of a won attempt, its lost signal reachable by a revocation notice (see
    /// [`revoked`]) until the lease is dropped.
    pub(crate) fn won_lease(
        self: &Arc<Self>,
        req: &AcquireRequest,
        fence: Option<u64>,
    ) -> RedisLease {
        if self.revocations.is_some() {
            self.node
                .watch_revoked(req.token.uuid().as_u128(), req.lost.clone());
        }
        self.lease(req, fence)
    }

    /// A waiting request's token, reachable by a revocation notice from the time it waits
    /// (see [`revoked`]), not only once it holds: a release may grant the lock to this
    /// waiter (`handover=grant`), or its attempt may win, and a `force_release` may take it
    /// away before the waiter has its lease; the notice then fires the request's lost signal
    /// (which its guard will carry), instead of being dropped and leaving the revocation to the
    /// first renewal. A notice can name a waiting token only after the server gave it the lock
    /// (a grant, or a winning attempt, both revoked since). Should the waiter leave that grant
    /// untaken (stale or too old, see `Inner::granted`) and win the freed lock afresh, its guard
    /// starts lost: a spurious loss in that narrow race, never a missed one. `None` when this
    /// client hears no notices. Dropping the watch unregisters the token;
    /// [`WaitingWatch::won`] leaves it to the lease.
    pub(crate) fn watch_while_waiting(
        self: &Arc<Self>,
        req: &AcquireRequest,
    ) -> Option<WaitingWatch> {
        self.revocations.as_ref()?;
        let token = req.token.uuid().as_u128();
        self.node.watch_revoked(token, req.lost.clone());
        Some(WaitingWatch {
            inner: Some(Arc::clone(self)),
            token,
        })
    }
}

/// A waiting request's revocation registration ([`Inner::watch_while_waiting`]).
pub(crate) struct WaitingWatch {
    /// `None` once won.
    inner: Option<Arc<Inner>>,
    token: u128,
}

impl WaitingWatch {
    /// The request won: its lease (registered by [`Inner::won_lease`]) unregisters the token
    /// when it is dropped.
    pub(crate) fn won(mut self) {
        self.inner = None;
    }
}

impl Drop for WaitingWatch {
    fn drop(&mut self) {
        if let Some(inner) = &self.inner {
            inner.node.unwatch_revoked(self.token);
        }
    }
}

/// A held Redis lease. Its keys and the owner string the server stores are derived from the
/// name and the token when a request needs them, not kept: with many leases on one client, the
/// five key strings and the token's text were most of a lease's memory (issue 24), while a
/// request formats them in well under a microsecond.
pub(crate) struct RedisLease {
    inner: Arc<Inner>,
    name: LockName,
    token: OwnerToken,
    /// The fencing token, where `fenced` (an `Option<u64>` in two fields: with the flag beside
    /// the other flags the lease fits a smaller allocation, issue 24).
    fence: u64,
    fenced: bool,
    /// A shared holder's or a permit's lease (see [`shares`]), not the lock key.
    share: bool,
    /// Released over the `WAIT` connection (`min_replicas`): the clean-up of a cancelled
    /// attempt, whose script went over that connection. Redis serves one connection's commands
    /// in order, so the release comes after the script; over the command connection it could
    /// overtake it, find nothing, and leave what the script then won held for its TTL.
    pub(crate) behind_attempt: bool,
}

impl fmt::Debug for RedisLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLease")
            .field("key", &self.keys().lock)
            .field("token", &self.token)
            .field("fencing", &self.fencing_token())
            .finish()
    }
}

impl Drop for RedisLease {
    fn drop(&mut self) {
        if !self.behind_attempt && self.inner.revocations.is_some() {
            self.inner.node.unwatch_revoked(self.token.uuid().as_u128());
        }
    }
}

fn not_held() -> Error {
    Error::not_held("the lease expired or belongs to another holder")
}

impl RedisLease {
    /// The lease's keys and channel (locksmith's layout, or the peer's under `interop=`).
    fn keys(&self) -> Keys {
        self.inner.keys(&self.name)
    }

    /// What the lock records as its owner: the owner token (or the peer's form of it).
    fn owner(&self) -> String {
        match self.inner.interop {
            Some(peer) => peer.owner(&self.token),
            None => self.token.to_hex(),
        }
    }
}

#[async_trait]
impl Lease for RedisLease {
    fn fencing_token(&self) -> Option<u64> {
        self.fenced.then_some(self.fence)
    }

    /// One compare-and-pexpire script, one round trip; on a single node, extends that fall due
    /// together share one script call (the validity still counts from the caller's send).
    ///
    /// Cancel safety: dropping the future may or may not have extended the lease.
    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        if !self.share
            && let Some(renewals) = &self.inner.renewals
        {
            // The batch derives the keys and owner itself, into a buffer it reuses.
            let held = renewals.extend(&self.name, self.token, ttl).await?;
            return if held { Ok(ttl) } else { Err(not_held()) };
        }
        let (keys, owner) = (self.keys(), self.owner());
        if self.share {
            let (mut conn, replicas) = match &self.inner.wait_conn {
                Some((conn, replicas)) => (conn.clone(), Some(*replicas)),
                None => (self.inner.node.conn(), None),
            };
            let held = shares::extend(&mut conn, &keys, &owner, ttl, replicas).await?;
            return if held { Ok(ttl) } else { Err(not_held()) };
        }
        let Some((conn, replicas)) = &self.inner.wait_conn else {
            let mut conn = self.inner.node.conn();
            let held = match self.inner.interop {
                Some(peer) => peer.extend(&mut conn, &keys, &owner, ttl).await?,
                None => node::extend(&mut conn, &keys, &owner, ttl).await?,
            };
            return if held { Ok(ttl) } else { Err(not_held()) };
        };
        // With min_replicas an extension counts only once replicas have it too: a promoted
        // replica with the old TTL would free the lock early.
        let (held, acked) =
            node::extend_replicated(&mut conn.clone(), &keys, &owner, ttl, Some(*replicas)).await?;
        if !held {
            return Err(not_held());
        }
        if acked.unwrap_or(0) < i64::from(replicas.count) {
            let then = "; the lease's validity is not extended";
            return Err(under_replicated("the extension", acked, replicas, then));
        }
        Ok(ttl)
    }

    /// One compare-and-delete script that also wakes the waiters.
    ///
    /// Cancel safety: dropping the future may leave the lock held until its TTL runs out.
    async fn release(&self) -> Result<()> {
        let mut conn = match (&self.inner.wait_conn, self.behind_attempt) {
            (Some((conn, _)), true) => conn.clone(),
            _ => self.inner.node.conn(),
        };
        let (keys, owner) = (self.keys(), self.owner());
        let held = match self.inner.interop {
            _ if self.share => shares::release(&mut conn, &keys, &owner).await?,
            Some(peer) => peer.release(&mut conn, &keys, &owner).await?,
            None => {
                let grant = self.inner.grants();
                queue::release_handing_over(&mut conn, &keys, &owner, grant).await?
            }
        };
        if held { Ok(()) } else { Err(not_held()) }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_lease_stays_small() {
        // One per held lease: 56 bytes and malloc's header fit a 64-byte chunk (issue 24).
        assert!(
            size_of::<super::RedisLease>() <= 56,
            "{} bytes",
            size_of::<super::RedisLease>()
        );
    }
}
