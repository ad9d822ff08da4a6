//! locksmith backend for SQL databases through [sqlx]: PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! ```no_run
//! # async fn demo() -> lockcore::Result<()> {
//! use lockcore::{LockOptions, Locker};
//! let backend = lock_sql::SqlBackend::connect(
//!     "postgres://app:secret@db/app?sslmode=require&strategy=row-lock",
//! )
//! .await?;
//! let locker = Locker::new(backend);
//! let guard = locker.lock("jobs/nightly", &LockOptions::new()).await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # URL
//!
//! `postgres://` / `postgresql://`, `mysql://` (MariaDB too; `mariadb://` is an alias) and
//! `sqlite://path`. Parameters read here, and removed before the URL goes to sqlx:
//!
//! * `strategy=lease` (default, every database) or `strategy=row-lock` (PostgreSQL and MySQL/
//!   MariaDB; refused on SQLite with `InvalidConfig`). Lease is the default because it works
//!   everywhere and has a real server-side TTL.
//! * `table=` the lock table (default `locksmith_locks`), `^[A-Za-z_][A-Za-z0-9_]{0,62}$`.
//!   It is created on connect if missing. Do not use one table with both strategies.
//! * `pool_max=` the most connections this client opens (default 10 for leases, 4 on SQLite, 64
//!   for row locks: every held row lock occupies one connection for as long as it is held, and a
//!   client holding `pool_max` locks waits for a connection to take another).
//!
//! Every other parameter (`sslmode`, `ssl-mode`, `application_name`, ...) goes to sqlx as is.
//! Passwords never appear in `Debug`, [`Backend::describe`], logs or errors.
//!
//! # Strategies
//!
//! **row-lock**: the lock is a row of the lock table locked with `SELECT ... FOR UPDATE` in a
//! transaction kept open on a connection dedicated to the holder. Waiters queue in the server's
//! own lock queue (no polling; FIFO on PostgreSQL). The lock lives as long as the holding
//! connection: a crashed holder frees it at once (`expiry_after_ttl = false`). The TTL is enforced
//! by lockcore's watchdog (which releases at the validity deadline unless renewed), `extend` checks
//! the connection is alive, a background task pings the holding connection every
//! `min(ttl/3, 1 s)` and fires [`LostReason::ConnectionLost`](lockcore::LostReason) when it fails,
//! and a server-side guard (`idle_in_transaction_session_timeout` on PostgreSQL,
//! `idle_transaction_timeout` on MariaDB, both `ttl + 1 s`) kills the session of a holder that
//! stops talking (a wedged process) so it cannot keep the lock forever. Fencing tokens come from a
//! PostgreSQL sequence (never rolled back) or, on MySQL, from a per-name counter row updated in
//! autocommit on another connection after the lock is won.
//!
//! **lease**: a row per name (bound as a parameter, never pasted into SQL) with the owner token,
//! a fencing counter and `expires_at` computed on the database clock. It is taken over only once
//! expired, in one statement; release and extend only touch the row carrying the caller's token.
//! PostgreSQL waiters are woken by `LISTEN/NOTIFY` (with a capped poll as a safety net), MySQL and
//! SQLite waiters poll with backoff and jitter.
#![deny(missing_docs)]

mod config;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod rowlock;

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::fmt;
use std::time::Duration;

use lockcore::backend::{AcquireRequest, Acquired, Backend};
use lockcore::{Capabilities, Error, LockName, Result};

use config::{Config, Dialect};
pub use config::{DEFAULT_TABLE, Strategy, validate_table};

/// A client of one SQL database: a connection pool plus the lock table.
///
/// Two `SqlBackend`s connected separately never share a connection; within one backend, every
/// row-lock holder has a connection of its own for as long as it holds the lock.
pub struct SqlBackend {
    inner: Inner,
    config: Config,
    capabilities: Capabilities,
}

enum Inner {
    #[cfg(feature = "postgres")]
    Pg(pg::PgBackend),
    #[cfg(feature = "mysql")]
    My(mysql::MyBackend),
    #[cfg(feature = "sqlite")]
    Lite(sqlite::LiteBackend),
}

impl fmt::Debug for SqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlBackend")
            .field("url", &self.config.redacted)
            .field("strategy", &self.config.strategy)
            .field("table", &self.config.table)
            .finish()
    }
}

impl SqlBackend {
    /// Parses `url`, connects a pool and creates the lock table if it is missing.
    ///
    /// Cancel safety: dropping the future leaves nothing behind but possibly the (idempotently
    /// created) lock table.
    ///
    /// # Errors
    /// `InvalidConfig` for a malformed URL, an unknown scheme or parameter value, a bad table name
    /// or `strategy=row-lock` on SQLite; `Unavailable` when the server cannot be reached;
    /// `Backend` when it refuses (authentication, permissions).
    pub async fn connect(url: &str) -> Result<SqlBackend> {
        let config = Config::parse(url)?;
        let inner = match config.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => Inner::Pg(pg::PgBackend::connect(&config).await?),
            #[cfg(feature = "mysql")]
            Dialect::MySql => Inner::My(mysql::MyBackend::connect(&config).await?),
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => Inner::Lite(sqlite::LiteBackend::connect(&config).await?),
            #[allow(unreachable_patterns)]
            other => {
                return Err(Error::invalid_config(format!(
                    "lock-sql was built without support for {other:?}"
                )));
            }
        };
        let capabilities = capabilities(config.dialect, config.strategy);
        Ok(SqlBackend {
            inner,
            config,
            capabilities,
        })
    }

    /// The strategy in use.
    pub fn strategy(&self) -> Strategy {
        self.config.strategy
    }

    /// The lock table.
    pub fn table(&self) -> &str {
        &self.config.table
    }

    /// Frees `name` behind its holder's back, as an administrator would: a lease row is expired
    /// (its fencing counter kept), a row lock's holding session is terminated
    /// (`pg_terminate_backend` / `KILL`). The holder learns it through its next renewal
    /// (lease) or its connection health check (row lock). Returns whether anything was held.
    ///
    /// Cancel safety: dropping the future may or may not have revoked the lock.
    ///
    /// # Errors
    /// `Unavailable` or `Backend` when the database fails.
    pub async fn revoke(&self, name: &LockName) -> Result<bool> {
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.revoke(name).await,
            #[cfg(feature = "mysql")]
            Inner::My(b) => b.revoke(name).await,
            #[cfg(feature = "sqlite")]
            Inner::Lite(b) => b.revoke(name).await,
        }
    }

    /// A `SELECT 1` round trip on a pooled connection (for benchmarks: the floor of any lock
    /// operation).
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// `Unavailable` or `Backend` when the database fails.
    pub async fn ping(&self) -> Result<()> {
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.ping().await,
            #[cfg(feature = "mysql")]
            Inner::My(b) => b.ping().await,
            #[cfg(feature = "sqlite")]
            Inner::Lite(b) => b.ping().await,
        }
    }
}

fn capabilities(dialect: Dialect, strategy: Strategy) -> Capabilities {
    let mut c = Capabilities::default();
    c.fencing = true;
    c.reentrant = false;
    // MariaDB row locks are freed by killing the holder's connection, whose id is recorded
    // when the lock is won and may be stale (reused by another holder) by the time an operator
    // acts: not safe enough to offer.
    c.force_release = !(dialect == Dialect::MySql && strategy == Strategy::RowLock);
    match strategy {
        Strategy::RowLock => {
            // The server's lock queue: waiters sleep in the server and are woken by it.
            c.wait = lockcore::WaitKind::Notify;
            c.renew = lockcore::RenewKind::Native;
            c.lost_detection = true;
            c.expiry_after_ttl = false;
            // PostgreSQL queues row-lock waiters on the tuple lock in arrival order; InnoDB's
            // order is not promised (and long waits are re-queued in chunks), so not declared.
            c.fair = dialect == Dialect::Postgres;
            c.min_ttl = Duration::from_millis(100);
            c.notes = vec![
                "row-lock: the lock lives as long as the holder's connection; a crash frees it at once".into(),
                "row-lock: the ttl is enforced by the client watchdog and by a server-side idle-transaction timeout of ttl + 1 s".into(),
                "row-lock: every held lock occupies one pooled connection (pool_max)".into(),
            ];
            if dialect == Dialect::MySql {
                c.notes.push(
                    "mysql row-lock: the server-side guard has 1 s granularity; waits without a deadline are re-queued every 5 s".into(),
                );
            }
        }
        Strategy::Lease => {
            c.wait = if dialect == Dialect::Postgres {
                lockcore::WaitKind::Notify
            } else {
                lockcore::WaitKind::Poll
            };
            c.renew = lockcore::RenewKind::Emulated;
            c.lost_detection = false;
            c.expiry_after_ttl = true;
            c.min_ttl = Duration::from_millis(10);
            c.notes = vec!["lease: expiry is judged on the database clock".into()];
            if dialect == Dialect::Sqlite {
                c.notes.push(
                    "sqlite: one host only (a file shared by processes, WAL mode); expiry has millisecond resolution".into(),
                );
            }
        }
    }
    c
}

#[lockcore::backend::async_trait]
impl Backend for SqlBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.try_acquire(req).await,
            #[cfg(feature = "mysql")]
            Inner::My(b) => b.try_acquire(req).await,
            #[cfg(feature = "sqlite")]
            Inner::Lite(b) => b.try_acquire(req).await,
        }
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<lockcore::Instant>,
    ) -> Result<Option<Acquired>> {
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.acquire(req, deadline).await,
            #[cfg(feature = "mysql")]
            Inner::My(b) if self.config.strategy == Strategy::RowLock => {
                b.acquire(req, deadline).await
            }
            // MySQL and SQLite leases poll with backoff and full jitter.
            #[allow(unreachable_patterns)]
            _ => {
                lockcore::backend::poll_acquire(
                    self,
                    req,
                    deadline,
                    &lockcore::backend::Backoff::for_ttl(req.ttl),
                )
                .await
            }
        }
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        if !self.capabilities.force_release {
            return Err(lockcore::Error::unsupported(
                "force_release is not offered for MariaDB row locks (the holder's connection id may be stale)",
            ));
        }
        self.revoke(name).await
    }

    async fn round_trip(&self) -> Result<()> {
        SqlBackend::ping(self).await
    }

    fn describe(&self) -> String {
        format!(
            "{} (strategy={}, table={})",
            self.config.redacted, self.config.strategy, self.config.table
        )
    }
}

/// Maps a sqlx error: connection-level failures are `Unavailable`, the rest `Backend`. The text
/// is scrubbed of the password in case a driver echoes the URL.
pub(crate) fn map_err(config: &Config, what: &str, e: sqlx::Error) -> Error {
    let text = config.scrub(e.to_string());
    let msg = format!("{what}: {text}");
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => Error::new(lockcore::ErrorKind::Unavailable, msg),
        sqlx::Error::Configuration(_) => Error::invalid_config(msg),
        _ => Error::new(lockcore::ErrorKind::Backend, msg),
    }
}

/// The database error's code (SQLSTATE on PostgreSQL, the result code on SQLite).
#[allow(dead_code)]
pub(crate) fn db_code(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

/// How long the server-side guard of a row-lock holder waits: the TTL plus one second.
#[allow(dead_code)]
pub(crate) fn guard_timeout(ttl: Duration) -> Duration {
    ttl + Duration::from_secs(1)
}

/// The outcome of an owner-checked update or delete of a lease row: exactly one row means it
/// was still the caller's; none means it expired or another holder has it, and nothing changed.
pub(crate) fn owner_checked(rows: u64) -> Result<()> {
    if rows == 1 {
        Ok(())
    } else {
        Err(lockcore::Error::not_held(
            "the lease expired or belongs to another holder",
        ))
    }
}
