//! [`Backend`] for [`SqlBackend`]: each call handed to the dialect's backend.

use lockcore::backend::{AcquireRequest, Acquired, Backend};
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use lockcore::backend::{Backoff, poll_attempts};
use lockcore::{Capabilities, Error, LockInfo, LockName, Result};

use crate::{Inner, SqlBackend, Strategy, each_dialect};

#[lockcore::backend::async_trait]
impl Backend for SqlBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        each_dialect!(&self.inner, b => b.try_acquire(req).await)
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<lockcore::Instant>,
    ) -> Result<Option<Acquired>> {
        #[cfg(any(feature = "mysql", feature = "sqlite"))]
        let backoff = Backoff::for_ttl(req.ttl);
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.acquire(req, deadline).await,
            #[cfg(feature = "mysql")]
            Inner::My(b) if self.config.strategy == Strategy::RowLock => {
                b.acquire(req, deadline).await
            }
            // MySQL leases poll with backoff and full jitter, every attempt bounded by the
            // deadline.
            #[cfg(feature = "mysql")]
            Inner::My(b) => {
                poll_attempts(req, deadline, &backoff, || b.acquire(req, deadline)).await
            }
            // SQLite leases poll with backoff and full jitter; the attempts of a waiting
            // lock() (a writer marks itself waiting behind readers).
            #[cfg(feature = "sqlite")]
            Inner::Lite(b) => poll_attempts(req, deadline, &backoff, || b.attempt(req, true)).await,
        }
    }

    /// The lease strategy only (the only one declaring [`Capabilities::atomic_multi`]): every
    /// member's single exclusive attempt, with a `try_lock`'s parameters, in the order given
    /// (canonical), in one transaction on one connection; rolled back at the first member not
    /// won (`Busy` with it), committed when all are.
    ///
    /// Cancel safety: run detached as a single attempt is; a caller gone before the commit
    /// rolls the transaction back, and a set committed for a caller gone is released in the
    /// background.
    async fn try_acquire_all(
        &self,
        reqs: &[AcquireRequest],
    ) -> Result<lockcore::backend::SetAttempt> {
        if !self.capabilities.atomic_multi.is_yes() {
            return Err(Error::unsupported(
                "the row-lock strategy takes a set one lock at a time",
            ));
        }
        if let Some(r) = reqs
            .iter()
            .find(|r| r.mode != lockcore::LockMode::Exclusive)
        {
            return Err(Error::unsupported(format!(
                "sql leases take exclusive sets in one transaction, not {}",
                r.mode
            )));
        }
        if reqs.is_empty() {
            return Ok(lockcore::backend::SetAttempt::All(Vec::new()));
        }
        each_dialect!(&self.inner, b => b.try_set(reqs).await)
    }

    async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        // Used by the PostgreSQL arm only.
        let _ = name;
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.queued_waiters(name).await,
            #[allow(unreachable_patterns)]
            _ => Err(lockcore::Error::unsupported(
                "this database does not report its queued lock waiters",
            )),
        }
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        self.revoke(name).await
    }

    /// One statement: the lock row, with `pg_locks` (PostgreSQL) or `IS_USED_LOCK` (MariaDB)
    /// for a row lock.
    ///
    /// Cancel safe.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        each_dialect!(&self.inner, b => b.inspect(name).await)
    }

    async fn round_trip(&self) -> Result<()> {
        SqlBackend::ping(self).await
    }

    async fn bare_cycle(&self, name: &LockName) -> Result<()> {
        crate::probes::bare_cycle(&self.inner, &self.config, name).await
    }

    /// The row lock's bare cycle is `pg_advisory_lock` / `GET_LOCK`, which wait.
    fn bare_cycle_waits(&self) -> bool {
        self.config.strategy == Strategy::RowLock
    }

    async fn server_requests(&self) -> Result<u64> {
        crate::probes::server_requests(&self.inner).await
    }

    async fn server_version(&self) -> Option<String> {
        crate::probes::server_version(&self.inner).await.ok()
    }

    fn describe(&self) -> String {
        match self.config.interop {
            Some(peer) => format!(
                "{} (strategy={}, table={}, interop={peer})",
                self.config.redacted, self.config.strategy, self.config.table
            ),
            None => format!(
                "{} (strategy={}, table={})",
                self.config.redacted, self.config.strategy, self.config.table
            ),
        }
    }
}
