//! What only backend authors need: the small [`Backend`] and [`Lease`] traits a backend
//! implements, the [`AcquireRequest`] it is handed and the [`Acquired`] it returns, the
//! [`LostNotifier`] it fires, the [`Background`] it runs cleanup on, the guard that cleans up an
//! acquisition cancelled in flight ([`CleanUpIfCancelled`]), and the polling helpers
//! ([`Backoff`], [`poll_acquire`]).
//!
//! Users never need this module: they call [`Locker`](crate::Locker), which adds validation,
//! waiting (with retries of transient errors), auto-renewal, the lost signal and release on
//! drop, the same for every backend.
//!
//! The module's files, one concern each: `request` (the [`OwnerToken`] and the
//! [`AcquireRequest`]), `lease` (the [`Lease`] and [`Acquired`] a backend returns),
//! `background` ([`Background`]), `cleanup` (what a cancelled acquisition leaves to undo),
//! `detached` (attempts that run on after their caller left), `poll` (polling with
//! [`Backoff`]), `revocations` (the leases a revocation notice reaches: [`Revocations`]); this
//! file is the [`Backend`] trait.

mod background;
mod cleanup;
mod detached;
mod lease;
mod poll;
mod request;
mod revocations;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

use crate::{Capabilities, LockInfo, LockName, Result};

/// The attribute backends implement [`Backend`] and [`Lease`] with (re-exported so that every
/// backend names the same version).
pub use async_trait::async_trait;

pub use self::background::Background;
pub use self::cleanup::{CancelCleanUp, CleanUpIfCancelled, CleanUpTask, ReleaseIfCancelled};
pub use self::detached::{AttemptOutcome, CallerGone, acquire_detached, acquire_detached_for};
pub use self::lease::{Acquired, BoxLease, Lease, SetAttempt};
pub use self::poll::{Backoff, poll_acquire, poll_attempts};
pub use self::request::{AcquireRequest, OwnerToken};
pub use self::revocations::{RevocationWatch, Revocations};
pub use crate::lost::{LostNotifier, LostReporter};

/// A lock backend: one client (connection pool, session) to one lock service.
///
/// Two `Backend` values created separately must behave as independent clients: they never share
/// a session or a held connection, so that locks exclude each other between them.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// What this instance can do.
    fn capabilities(&self) -> &Capabilities;

    /// One attempt: the lease, or `Ok(None)` if someone else holds the lock.
    ///
    /// Cancel safety: a dropped attempt must leave no lock behind beyond `req.ttl`.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>>;

    /// Waits for the lock until `deadline` (`None`: no deadline); `Ok(None)` when the deadline
    /// passed. The default polls [`Backend::try_acquire`] with [`Backoff`]; backends that can be
    /// notified override it and declare [`WaitKind::Notify`](crate::WaitKind::Notify).
    ///
    /// Cancel safety: a dropped wait must leave no lock and no queue entry behind beyond
    /// `req.ttl`.
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        poll_acquire(self, req, deadline, &Backoff::for_ttl(req.ttl)).await
    }

    /// One attempt at every request of `reqs` in one request to the server (one transaction):
    /// every lease, or none ([`SetAttempt::Busy`] with the first member found held). Backends
    /// that can do it declare [`Capabilities::atomic_multi`]; the requests are then exclusive,
    /// for distinct names in canonical (byte) order, with one TTL and one fencing choice.
    /// [`Locker::try_lock_all`](crate::Locker::try_lock_all) and
    /// [`Locker::lock_all`](crate::Locker::lock_all) use it instead of a sequence of
    /// [`Backend::try_acquire`]. A member is busy wherever a [`Backend::try_acquire`] of it
    /// would not have taken it (a holder, or waiters a `try_lock` would not jump).
    ///
    /// Cancel safety: a dropped attempt must leave no lock of the set behind beyond `ttl` (a
    /// set the server grants after the drop is released, as a dropped `try_acquire`'s lock).
    async fn try_acquire_all(&self, reqs: &[AcquireRequest]) -> Result<SetAttempt> {
        let _ = reqs;
        Err(crate::Error::unsupported(
            "this backend cannot take several locks in one request",
        ))
    }

    /// Frees `name` whoever holds it, as an operator would (Redisson's `forceUnlock`); the
    /// holder's lease is then refused at its next renewal or check, and its lost signal fires
    /// (at once where the backend declares [`Capabilities::revoke_detection`]). Returns whether
    /// something was released. Backends that can do it declare
    /// [`Capabilities::force_release`]; users call
    /// [`Locker::force_release`](crate::Locker::force_release).
    ///
    /// Cancel safety: dropping the future may or may not have freed the lock.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let _ = name;
        Err(crate::Error::unsupported(
            "this backend cannot force-release locks",
        ))
    }

    /// What the server has for `name`: held or free, the fencing token, the TTL left, the
    /// holder's metadata, the queued waiters (see [`LockInfo`]). One read, no lock taken.
    /// Backends that can do it declare [`Capabilities::inspect`]; users call
    /// [`Locker::inspect`](crate::Locker::inspect).
    ///
    /// Cancel safe.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        let _ = name;
        Err(crate::Error::unsupported(
            "this backend cannot inspect locks",
        ))
    }

    /// One cheap round trip to the server (`PING`, `SELECT 1`, `exists`): the floor that the
    /// benchmark compares acquire + release with. Unsupported by default (and for `memory://`,
    /// which has no server).
    ///
    /// Cancel safe.
    async fn round_trip(&self) -> Result<()> {
        Err(crate::Error::unsupported(
            "this backend has no round trip to measure",
        ))
    }

    /// The backend's bare lock primitive without the library around it: one acquire and one
    /// release of `name` in the fewest server requests the mechanism allows (for example
    /// `SET NX PX` then the compare-and-delete script; `BEGIN; SELECT ... FOR UPDATE; COMMIT`;
    /// an etcd put-if-absent with a lease, then a delete). The benchmark measures it interleaved
    /// with [`Locker::try_lock`](crate::Locker::try_lock) + release, by the same client, and
    /// reports the ratio. Unsupported by default.
    ///
    /// Cancel safety: dropping the future may leave `name` held until the TTL of its bare
    /// acquisition runs out; use a name nobody else locks.
    async fn bare_cycle(&self, name: &LockName) -> Result<()> {
        let _ = name;
        Err(crate::Error::unsupported(
            "this backend has no bare primitive to measure",
        ))
    }

    /// Whether [`bare_cycle`](Self::bare_cycle) waits while `name` is held (a blocking
    /// primitive such as `pg_advisory_lock` or `GET_LOCK`), so that processes looping it hand
    /// the lock over to each other: the benchmark's bare hand-over rate, the floor the
    /// library's own hand-over rate is judged against. False by default (a bare `SET NX` or an
    /// insert fails on a held name instead of waiting).
    fn bare_cycle_waits(&self) -> bool {
        false
    }

    /// The number of requests the server has handled so far, from its own statistics (Redis
    /// `INFO commandstats`, ZooKeeper `mntr`, etcd's metrics, PostgreSQL's `pg_stat_database`):
    /// the benchmark divides its growth by the hand-overs to show server requests per
    /// hand-over (a herd shows as growth with the number of waiters). Unsupported by default.
    ///
    /// Cancel safe.
    async fn server_requests(&self) -> Result<u64> {
        Err(crate::Error::unsupported(
            "this backend does not report server request counts",
        ))
    }

    /// The server's name and version as it reports it (`redis 7.0.15` from `INFO server`,
    /// PostgreSQL's `version()`, ...), for the report's provenance. `None` by default and when
    /// the server cannot say.
    ///
    /// Cancel safe.
    async fn server_version(&self) -> Option<String> {
        None
    }

    /// How many `acquire` calls are queued waiting for `name` right now, as the server sees
    /// them (queue entries, sequential nodes, blocked lock requests). The suite uses it to know
    /// that a waiter is enqueued instead of sleeping and hoping. Unsupported by default; fair
    /// backends implement it.
    ///
    /// Cancel safe.
    async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        let _ = name;
        Err(crate::Error::unsupported(
            "this backend does not report its queued waiters",
        ))
    }

    /// A description for logs and reports, with any secret (password) redacted.
    fn describe(&self) -> String;
}

#[async_trait]
impl<B: Backend + ?Sized> Backend for Arc<B> {
    fn capabilities(&self) -> &Capabilities {
        (**self).capabilities()
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        (**self).try_acquire(req).await
    }
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        (**self).acquire(req, deadline).await
    }
    async fn try_acquire_all(&self, reqs: &[AcquireRequest]) -> Result<SetAttempt> {
        (**self).try_acquire_all(reqs).await
    }
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        (**self).force_release(name).await
    }
    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        (**self).inspect(name).await
    }
    async fn round_trip(&self) -> Result<()> {
        (**self).round_trip().await
    }
    async fn bare_cycle(&self, name: &LockName) -> Result<()> {
        (**self).bare_cycle(name).await
    }
    fn bare_cycle_waits(&self) -> bool {
        (**self).bare_cycle_waits()
    }
    async fn server_requests(&self) -> Result<u64> {
        (**self).server_requests().await
    }
    async fn server_version(&self) -> Option<String> {
        (**self).server_version().await
    }
    async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        (**self).queued_waiters(name).await
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
}
