#![doc = include_str!("docs.md")]
#![deny(missing_docs)]

mod backend;
mod capabilities;
mod compat;
mod config;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod conns;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod inspect;
mod interop;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod lease;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod probes;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod registration;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod rowlock;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod sets;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod shares;
mod sql_errors;

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(feature = "postgres")]
mod pg_xact;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::fmt;

use lockcore::{Capabilities, Error, LockName, Result};

use capabilities::capabilities;
pub use config::{Config, DEFAULT_TABLE, Handover, Strategy, sqlx_params, validate_table};
use config::{Dialect, Parsed};
pub use interop::{Interop, MAX_GET_LOCK_BYTES, MAX_GET_LOCK_CHARS};
#[cfg(feature = "postgres")]
pub use pg_xact::PgXactLock;
#[cfg(feature = "mysql")]
pub use registration::MYSQL;
#[cfg(feature = "postgres")]
pub use registration::POSTGRES;
#[cfg(feature = "sqlite")]
pub use registration::SQLITE;

/// A client of one SQL database: a connection pool plus the lock table.
///
/// Two `SqlBackend`s connected separately never share a connection; within one backend, every
/// row-lock holder has a connection of its own for as long as it holds the lock.
pub struct SqlBackend {
    inner: Inner,
    config: Parsed,
    capabilities: Capabilities,
}

/// `$body` with `$b` bound to the dialect's backend, whichever it is.
macro_rules! each_dialect {
    ($inner:expr, $b:ident => $body:expr) => {
        match $inner {
            #[cfg(feature = "postgres")]
            Inner::Pg($b) => $body,
            #[cfg(feature = "mysql")]
            Inner::My($b) => $body,
            #[cfg(feature = "sqlite")]
            Inner::Lite($b) => $body,
        }
    };
}
pub(crate) use each_dialect;

enum Inner {
    #[cfg(feature = "postgres")]
    Pg(Box<pg::PgBackend>),
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
        Self::from_config(Config::parse(url)?).await
    }

    /// Connects from a [`Config`] (deserialized from a config file, say), validated exactly as
    /// a URL is.
    ///
    /// Cancel safety: as [`SqlBackend::connect`].
    ///
    /// # Errors
    /// As [`SqlBackend::connect`].
    pub async fn from_config(config: Config) -> Result<SqlBackend> {
        let config = Parsed::from_config(config)?;
        let inner = match config.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => Inner::Pg(Box::new(pg::PgBackend::connect(&config).await?)),
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
        Ok(SqlBackend::assemble(config, inner))
    }

    /// A lease backend on an SQLite pool the application already has, so it does not open a
    /// second one: the lock table (`table`, created if missing) lives in the pool's database
    /// file. The pool's own settings are kept: give it a `busy_timeout` (sqlx's default is 5 s)
    /// and WAL journaling for several processes, as [`SqlBackend::connect`] does.
    ///
    /// Cancel safety: dropping the future leaves nothing behind but possibly the (idempotently
    /// created) lock table.
    ///
    /// # Errors
    /// `InvalidConfig` for a bad table name or an in-memory database (its locks would not be
    /// shared between the pool's connections); `Unavailable` or `Backend` when the table cannot
    /// be created.
    #[cfg(feature = "sqlite")]
    pub async fn from_sqlite_pool(pool: sqlx::SqlitePool, table: &str) -> Result<SqlBackend> {
        let file = pool.connect_options().get_filename().to_owned();
        let mut url = url::Url::parse("sqlite://").expect("a valid URL");
        url.set_path(&file.to_string_lossy());
        let mut settings = Config::new(url.to_string());
        settings.table = table.to_owned();
        let config = Parsed::from_config(settings)?;
        let inner = Inner::Lite(sqlite::LiteBackend::with_pool(&config, pool).await?);
        Ok(SqlBackend::assemble(config, inner))
    }

    /// A backend on the connection settings of a PostgreSQL pool the application already has
    /// (host, credentials, TLS: no second URL or password to configure). Statements run on
    /// connections of this crate's own, opened with those settings as needed (a held row lock
    /// keeps a connection of its own, and sqlx's pool would add a ping per checkout): the
    /// application's pool is left alone.
    ///
    /// Cancel safety: as [`SqlBackend::connect`].
    ///
    /// # Errors
    /// As [`SqlBackend::connect`] (`InvalidConfig` for a bad table name).
    #[cfg(feature = "postgres")]
    pub async fn from_pg_pool(
        pool: &sqlx::PgPool,
        strategy: Strategy,
        table: &str,
    ) -> Result<SqlBackend> {
        let opts = (*pool.connect_options()).clone();
        let config = pool_config(PoolServer::of_pg(&opts), strategy, table)?;
        let inner = Inner::Pg(Box::new(pg::PgBackend::connect_with(&config, opts).await?));
        Ok(SqlBackend::assemble(config, inner))
    }

    /// A backend on the connection settings of a MySQL/MariaDB pool the application already
    /// has, as [`SqlBackend::from_pg_pool`] does for PostgreSQL (no second URL or password; this
    /// crate's own connections, opened with those settings; the application's pool is left
    /// alone).
    ///
    /// ```no_run
    /// # async fn f() -> lockcore::Result<()> {
    /// let pool = sqlx::MySqlPool::connect("mysql://app:pw@db/app").await.unwrap();
    /// let backend =
    ///     lock_sql::SqlBackend::from_mysql_pool(&pool, lock_sql::Strategy::Lease, "app_locks")
    ///         .await?;
    /// let locker = lockcore::Locker::new(backend);
    /// # Ok(()) }
    /// ```
    ///
    /// Cancel safety: as [`SqlBackend::connect`].
    ///
    /// # Errors
    /// As [`SqlBackend::connect`] (`InvalidConfig` for a bad table name).
    #[cfg(feature = "mysql")]
    pub async fn from_mysql_pool(
        pool: &sqlx::MySqlPool,
        strategy: Strategy,
        table: &str,
    ) -> Result<SqlBackend> {
        let opts = (*pool.connect_options()).clone();
        let config = pool_config(PoolServer::of_mysql(&opts), strategy, table)?;
        let inner = Inner::My(mysql::MyBackend::connect_with(&config, opts).await?);
        Ok(SqlBackend::assemble(config, inner))
    }

    fn assemble(config: Parsed, inner: Inner) -> SqlBackend {
        let capabilities = capabilities(&config);
        SqlBackend {
            inner,
            config,
            capabilities,
        }
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
    /// (its fencing counter kept), a row lock's holding session, as the server reports it at
    /// this moment (`pg_locks` / `IS_USED_LOCK`), is terminated (`pg_terminate_backend` /
    /// `KILL CONNECTION`). A PostgreSQL lease's holders (and readers, permits) are told at
    /// once: the revoke sends a `NOTIFY` naming their owner tokens, which their clients hear
    /// (lost signal within a second). A MariaDB or SQLite lease's holder learns it at its next
    /// renewal, a row lock's holder by its connection health check. Returns whether anything
    /// was held.
    ///
    /// Cancel safety: dropping the future may or may not have revoked the lock.
    ///
    /// # Errors
    /// `Unsupported` where [`Capabilities::force_release`] is not offered; `Unavailable` or
    /// `Backend` when the database fails.
    pub async fn revoke(&self, name: &LockName) -> Result<bool> {
        if !self.capabilities.force_release {
            return Err(lockcore::Error::unsupported(
                "this backend cannot force-release locks",
            ));
        }
        each_dialect!(&self.inner, b => b.revoke(name).await)
    }

    /// A `SELECT 1` round trip on a pooled connection (for benchmarks: the floor of any lock
    /// operation).
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// `Unavailable` or `Backend` when the database fails.
    pub async fn ping(&self) -> Result<()> {
        crate::probes::ping(&self.inner).await
    }
}

/// The server, user and database of an application's pool (never its password).
#[cfg(any(feature = "postgres", feature = "mysql"))]
struct PoolServer<'a> {
    scheme: &'static str,
    host: &'a str,
    port: u16,
    user: &'a str,
    database: Option<&'a str>,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<'a> PoolServer<'a> {
    #[cfg(feature = "postgres")]
    fn of_pg(o: &'a sqlx::postgres::PgConnectOptions) -> Self {
        let (host, port, user) = (o.get_host(), o.get_port(), o.get_username());
        PoolServer {
            scheme: "postgres",
            host,
            port,
            user,
            database: o.get_database(),
        }
    }

    #[cfg(feature = "mysql")]
    fn of_mysql(o: &'a sqlx::mysql::MySqlConnectOptions) -> Self {
        let (host, port, user) = (o.get_host(), o.get_port(), o.get_username());
        PoolServer {
            scheme: "mysql",
            host,
            port,
            user,
            database: o.get_database(),
        }
    }
}

/// The settings of a backend made on an application's pool: a URL naming the server, user and
/// database (for `describe()` and errors only: the connection settings are the pool's own,
/// password included, which never enters this URL).
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn pool_config(server: PoolServer<'_>, strategy: Strategy, table: &str) -> Result<Parsed> {
    let mut url = url::Url::parse(&format!("{}://localhost", server.scheme)).expect("a valid URL");
    let _ = url.set_host(Some(server.host));
    let _ = url.set_port(Some(server.port));
    let _ = url.set_username(server.user);
    url.set_path(server.database.unwrap_or(""));
    let mut settings = Config::new(url.to_string());
    settings.strategy = strategy;
    settings.table = table.to_owned();
    Parsed::from_config(settings)
}
