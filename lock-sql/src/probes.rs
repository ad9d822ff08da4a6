//! What reports and benchmarks ask of a server (PostgreSQL or MariaDB), on a pooled
//! connection: one row of a statement (its version, its request counter), a round trip, the
//! bare primitive a lock is measured against. Each dialect gives only the statements.

use futures::FutureExt;
use lockcore::{LockName, Result};
use sqlx::{AssertSqlSafe, ConnectOptions};

use crate::conns::Conns;

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
