//! What reports and benchmarks ask of a server, every dialect in one place: its version, a
//! round trip, the bare primitive a lock is measured against, its request counter. On
//! PostgreSQL and MariaDB each is a statement on a pooled connection (the dialect's statement
//! here, run by [`Conns`]); SQLite has a library version and a round trip, no server.

#[cfg(any(feature = "postgres", feature = "mysql"))]
use futures::FutureExt;
use lockcore::{LockName, Result};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use sqlx::{AssertSqlSafe, ConnectOptions};

use crate::Inner;
use crate::config::Parsed;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::config::Strategy;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::conns::Conns;

/// The server's version string, for reports.
///
/// Cancel safe.
pub(crate) async fn server_version(inner: &Inner) -> Result<String> {
    match inner {
        #[cfg(feature = "postgres")]
        Inner::Pg(b) => {
            let (v,): (String,) = b.conns().fetch_row("SHOW server_version").await?;
            Ok(format!("PostgreSQL {v}"))
        }
        #[cfg(feature = "mysql")]
        Inner::My(b) => Ok(b
            .conns()
            .fetch_row::<(String,)>("SELECT VERSION()")
            .await?
            .0),
        #[cfg(feature = "sqlite")]
        Inner::Lite(b) => b.server_version().await,
    }
}

/// A `SELECT 1` round trip (the floor of any lock operation).
///
/// Cancel safe.
pub(crate) async fn ping(inner: &Inner) -> Result<()> {
    match inner {
        #[cfg(feature = "postgres")]
        Inner::Pg(b) => b.conns().ping().await,
        #[cfg(feature = "mysql")]
        Inner::My(b) => b.conns().ping().await,
        #[cfg(feature = "sqlite")]
        Inner::Lite(b) => b.ping().await,
    }
}

/// One cycle of the bare primitive of the strategy (see [`Conns::bare_cycle`]): row-lock
/// `pg_advisory_lock` + unlock or `GET_LOCK` + `RELEASE_LOCK`; lease: a row's insert and
/// delete. SQLite measures none (a local file).
///
/// Cancel safe.
pub(crate) async fn bare_cycle(inner: &Inner, config: &Parsed, name: &LockName) -> Result<()> {
    // Unused where only SQLite is built.
    let _ = (name, config);
    match inner {
        #[cfg(feature = "postgres")]
        Inner::Pg(b) => {
            let lock = "SELECT pg_advisory_lock(hashtext($1))";
            let unlock = "SELECT pg_advisory_unlock(hashtext($1))";
            let lease = (config.table.as_str(), "$1");
            let row_lock = config.strategy == Strategy::RowLock;
            b.conns()
                .bare_cycle(name, (lock, unlock), row_lock, lease)
                .await
        }
        #[cfg(feature = "mysql")]
        Inner::My(b) => {
            let (lock, unlock) = (
                "SELECT GET_LOCK(SHA1(?), 10)",
                "SELECT RELEASE_LOCK(SHA1(?))",
            );
            let lease = (config.table.as_str(), "?");
            let row_lock = config.strategy == Strategy::RowLock;
            b.conns()
                .bare_cycle(name, (lock, unlock), row_lock, lease)
                .await
        }
        #[cfg(feature = "sqlite")]
        Inner::Lite(_) => Err(lockcore::Error::unsupported(
            "sqlite: no bare primitive is measured (a local file)",
        )),
    }
}

/// Requests the server has answered: PostgreSQL's finished transactions (`pg_stat_database`:
/// every statement of this crate is one; sessions publish their counts at most once a second,
/// so read it a second after the load stops), MariaDB's `Questions` (pings not counted).
///
/// Cancel safe.
pub(crate) async fn server_requests(inner: &Inner) -> Result<u64> {
    match inner {
        #[cfg(feature = "postgres")]
        Inner::Pg(b) => {
            let sql = "SELECT (sum(xact_commit) + sum(xact_rollback))::int8 FROM pg_stat_database";
            let (n,): (i64,) = b.conns().fetch_row(sql).await?;
            Ok(n as u64)
        }
        #[cfg(feature = "mysql")]
        Inner::My(b) => {
            let sql = "SHOW GLOBAL STATUS LIKE 'Questions'";
            let (_, v): (String, String) = b.conns().fetch_row(sql).await?;
            Ok(v.parse::<u64>().unwrap_or(0))
        }
        #[cfg(feature = "sqlite")]
        Inner::Lite(_) => Err(lockcore::Error::unsupported(
            "sqlite has no server to count requests",
        )),
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<O, M, DB> Conns<O, M>
where
    O: ConnectOptions,
    O::Connection: sqlx::Connection<Database = DB> + Sized,
    M: Send + 'static,
    DB: sqlx::Database,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'c> &'c mut O::Connection: sqlx::Executor<'c, Database = DB>,
{
    /// The row `sql` (no parameters) answers.
    ///
    /// Cancel safe.
    pub(crate) async fn fetch_row<R>(&self, sql: &'static str) -> Result<R>
    where
        R: for<'r> sqlx::FromRow<'r, DB::Row> + Send + Unpin + 'static,
    {
        self.run(self.bound(), sql, |c| {
            sqlx::query_as::<DB, R>(sql).fetch_one(c).boxed()
        })
        .await
    }

    /// The row `sql` answers for `name`, its only parameter (`what`: for errors).
    ///
    /// Cancel safe.
    pub(crate) async fn row_of<R>(&self, what: &str, sql: &str, name: &str) -> Result<R>
    where
        R: for<'r> sqlx::FromRow<'r, DB::Row> + Send + Unpin + 'static,
        for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        let (sql, name) = (sql.to_owned(), name.to_owned());
        self.run(self.bound(), what, move |c| {
            sqlx::query_as::<DB, R>(AssertSqlSafe(sql.clone()))
                .bind(name.clone())
                .fetch_one(c)
                .boxed()
        })
        .await
    }

    /// Every row `sql` answers for `name`, its only parameter (`what`: for errors).
    ///
    /// Cancel safe.
    pub(crate) async fn rows_of<R>(&self, what: &str, sql: &str, name: &str) -> Result<Vec<R>>
    where
        R: for<'r> sqlx::FromRow<'r, DB::Row> + Send + Unpin + 'static,
        for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        let (sql, name) = (sql.to_owned(), name.to_owned());
        self.run(self.bound(), what, move |c| {
            sqlx::query_as::<DB, R>(AssertSqlSafe(sql.clone()))
                .bind(name.clone())
                .fetch_all(c)
                .boxed()
        })
        .await
    }

    /// A `SELECT 1` round trip.
    ///
    /// Cancel safe.
    pub(crate) async fn ping(&self) -> Result<()> {
        self.run(self.bound(), "SELECT 1", |c| {
            async move { sqlx::raw_sql("SELECT 1").execute(c).await.map(|_| ()) }.boxed()
        })
        .await
    }

    /// The bare primitive of a strategy, one cycle on one connection: `lock` then `unlock`,
    /// each binding `name` alone (the row lock's session lock and its release: a name of its
    /// own hashed, not the lock's key), or for a lease the insert then the delete of a row of
    /// `table` (`placeholder`: the dialect's parameter) for a name of its own.
    ///
    /// Cancel safe: a dropped cycle's connection is closed (and its session lock with it).
    pub(crate) async fn bare_cycle(
        &self,
        name: &LockName,
        (lock, unlock): (&'static str, &'static str),
        row_lock: bool,
        (table, placeholder): (&str, &str),
    ) -> Result<()>
    where
        for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        let (first, second, param) = if row_lock {
            (lock.to_owned(), unlock.to_owned(), name.as_str().to_owned())
        } else {
            (
                format!("INSERT INTO {table} (name, owner) VALUES ({placeholder}, 'bare')"),
                format!("DELETE FROM {table} WHERE name = {placeholder}"),
                format!("{}\u{1}bare", name.as_str()),
            )
        };
        self.run(self.bound(), "bare cycle", move |c| {
            let (first, second, param) = (first.clone(), second.clone(), param.clone());
            async move {
                sqlx::query::<DB>(AssertSqlSafe(first))
                    .bind(param.clone())
                    .execute(&mut *c)
                    .await?;
                sqlx::query::<DB>(AssertSqlSafe(second))
                    .bind(param)
                    .execute(&mut *c)
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await
    }
}
