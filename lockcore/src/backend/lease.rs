//! What a backend hands back: the [`Lease`] it holds, with the moment and TTL of its winning
//! request ([`Acquired`]), and the outcome of a set taken in one request ([`SetAttempt`]).

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::Result;

use super::async_trait;

/// A held lease, as returned by a backend.
///
/// `extend` and `release` must be owner-checked and atomic (compare-and-extend,
/// compare-and-delete): on a lease that is no longer this token's they change nothing and return
/// [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld).
#[async_trait]
pub trait Lease: Send + Sync + fmt::Debug + 'static {
    /// The fencing token, if the backend gives them.
    fn fencing_token(&self) -> Option<u64>;

    /// Resets the lease's TTL to `ttl` from now, if it is still this owner's, and returns the
    /// TTL the server granted, counted from when the request was sent (servers that grant
    /// leases themselves, like etcd, may grant another than asked; most return `ttl`).
    ///
    /// Never re-creates a lease: on a lease that was released, expired or taken over it creates
    /// nothing and returns `NotHeld`.
    ///
    /// Cancel safety: dropping the future may or may not have extended the lease; either way the
    /// lease stays owner-checked.
    async fn extend(&self, ttl: Duration) -> Result<Duration>;

    /// Releases the lease, if it is still this owner's. Called once (again only after a call was
    /// cancelled).
    ///
    /// Cancel safety: dropping the future may leave the lock held until its TTL runs out.
    async fn release(&self) -> Result<()>;
}

/// A held lease, boxed.
pub type BoxLease = Box<dyn Lease>;

/// A successful acquisition: the lease, the moment the request that won it was sent and the TTL
/// granted, from which the contract computes the validity deadline
/// (`sent_at + granted_ttl - drift margin`).
///
/// `#[non_exhaustive]`: build one with [`Acquired::new`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Acquired {
    /// The lease.
    pub lease: BoxLease,
    /// When the winning request was sent (taken just before sending it, on the monotonic clock).
    pub sent_at: Instant,
    /// The TTL the server granted, when it differs from the one asked for.
    pub granted_ttl: Option<Duration>,
}

impl Acquired {
    /// Wraps a lease won by a request sent at `sent_at`, granted the TTL asked for.
    pub fn new(lease: impl Lease, sent_at: Instant) -> Self {
        Acquired {
            lease: Box::new(lease),
            sent_at,
            granted_ttl: None,
        }
    }

    /// The server granted `ttl` (counted from `sent_at`) instead of the TTL asked for.
    pub fn with_granted_ttl(mut self, ttl: Duration) -> Self {
        self.granted_ttl = Some(ttl);
        self
    }
}

/// What [`Backend::try_acquire_all`](super::Backend::try_acquire_all) did: every lock of the set,
/// or none.
#[derive(Debug)]
#[non_exhaustive]
pub enum SetAttempt {
    /// Every lock, one [`Acquired`] per request, in the order of the requests.
    All(Vec<Acquired>),
    /// None was taken: the request at this index (the first found) is held by someone else,
    /// or has waiters queued ahead of it.
    Busy(usize),
}
