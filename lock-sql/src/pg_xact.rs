//! PostgreSQL: a lock that lives inside the caller's own transaction (`pg_advisory_xact_lock`),
//! so that an update and the lock that guards it commit (or roll back) together.

use std::time::Duration;

use lockcore::{Error, IntoLockName, LockName, Result};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

use crate::config::validate_table;

/// SQLSTATE lock_not_available: lock_timeout ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// SQLSTATE undefined_table.
const UNDEFINED_TABLE: &str = "42P01";
/// SQLSTATE undefined_function: the lease check beside the table (see `crate::pg::exclusion`)
/// is missing, the table was made by an older version.
const UNDEFINED_FUNCTION: &str = "42883";

/// A lock held by a PostgreSQL transaction the application owns: taken with
/// `pg_advisory_xact_lock` on the connection or transaction the caller passes in, released by
/// the transaction's commit or rollback (there is no release call, and no lease: the lock lives
/// exactly as long as the transaction).
///
/// It excludes the row-lock strategy's holders, writers and readers alike, of a
/// [`SqlBackend`](crate::SqlBackend) on the same table and name (the same advisory key,
/// `hashtextextended(name, seed of the table)`, taken exclusively), and the lease strategy's
/// (exclusive, readers and permits): holding the key, it reads the lease row and backs off
/// from a live lease, and a lease attempt takes the key for its own transaction, so it is busy
/// while a transaction lock holds the name (see the crate docs, *One name, one lock*). Its
/// fencing token comes from the same per-name counter in the lock table: bumped in the caller's
/// transaction, so it is committed with the caller's writes. A transaction that rolls back
/// rolls its token back too (the next holder may get the same number), which is safe for writes
/// made in that transaction; a token handed to another store must only be used after the
/// commit.
///
/// The lock table must exist: connecting a `SqlBackend` (PostgreSQL, any strategy) with this
/// table creates it.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use lock_sql::PgXactLock;
/// let locks = PgXactLock::new(lock_sql::DEFAULT_TABLE)?;
/// let mut tx = pool.begin().await?;
/// let token = locks.lock(&mut tx, "accounts/42", None).await?;
/// sqlx::query("UPDATE accounts SET balance = balance - 10, fence = $1 WHERE id = 42")
///     .bind(token as i64)
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?; // the update and the lock's release, together
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PgXactLock {
    table: String,
    try_sql: String,
    wait_sql: String,
}

impl PgXactLock {
    /// Locks of the lock table `table` (the one a `SqlBackend` names with `table=`; by default
    /// [`DEFAULT_TABLE`](crate::DEFAULT_TABLE)).
    ///
    /// # Errors
    /// `InvalidConfig` for a table name that is not a plain identifier.
    pub fn new(table: &str) -> Result<Self> {
        validate_table(table)?;
        let key = crate::pg::exclusion::name_key("$1", table);
        // Holding the key, a live lease of the name makes the name busy (see
        // `crate::pg::exclusion`): the check's own query sees every lease committed before
        // the key was granted.
        let leased = crate::pg::exclusion::lease_holds(table, "$1", false);
        // The same counter as the row-lock strategy: taken after the advisory lock (materialized
        // CTE), so two holders never bump it at once.
        let fence = |from: &str, cond: &str| {
            format!(
                "INSERT INTO {table} AS r (name, fence) SELECT $1, 1 FROM {from} WHERE {cond} \
                 ON CONFLICT (name) DO UPDATE SET fence = r.fence + 1 RETURNING r.fence"
            )
        };
        let try_sql = format!(
            "WITH a AS MATERIALIZED (SELECT pg_try_advisory_xact_lock({key}) AS got), \
             l AS MATERIALIZED (SELECT CASE WHEN got THEN NOT {leased} ELSE false END AS got \
               FROM a) {}",
            fence("l", "got")
        );
        // lock_timeout is set for this statement only (put back before the statement ends,
        // so the caller's later statements keep their own setting).
        let wait_sql = format!(
            "WITH o AS MATERIALIZED (SELECT current_setting('lock_timeout') AS old), \
             s AS MATERIALIZED (SELECT set_config('lock_timeout', $2, true) AS t FROM o), \
             a AS MATERIALIZED (SELECT pg_advisory_xact_lock({key}) IS NULL AS x FROM s), \
             l AS MATERIALIZED (SELECT NOT {leased} AS got FROM a), \
             f AS ({}) \
             SELECT f.fence FROM f, o WHERE set_config('lock_timeout', o.old, true) IS NOT NULL",
            fence("l", "got")
        );
        Ok(PgXactLock {
            table: table.to_owned(),
            try_sql,
            wait_sql,
        })
    }

    /// The lock table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// One attempt to take the lock in the caller's transaction: its fencing token, or
    /// `Ok(None)` if another transaction, a row-lock holder or a live lease (the lease
    /// strategy on this table) has it. Found held by a lease, the attempt still keeps the
    /// name's advisory key until the transaction ends (PostgreSQL gives a transaction's key
    /// back only then): row locks and leases of the name see it busy meanwhile.
    ///
    /// Cancel safety: dropping the future may leave the statement running on the server and
    /// the lock taken in the transaction; roll the transaction back.
    ///
    /// # Errors
    /// `InvalidName` for a bad name and `InvalidConfig` when `conn` is not in a transaction
    /// (a lock outside one would end with its own statement), both before any I/O;
    /// `InvalidConfig` when the lock table does not exist; `Backend` or `Unavailable` when the
    /// statement fails (which, as any failed statement, aborts the caller's transaction).
    pub async fn try_lock(
        &self,
        conn: &mut PgConnection,
        name: impl IntoLockName,
    ) -> Result<Option<u64>> {
        let name = name.into_lock_name()?;
        in_transaction(conn)?;
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(self.try_sql.clone()))
            .bind(name.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map(|f| f.map(|f| f as u64))
            .map_err(|e| self.error(&name, e))
    }

    /// Takes the lock in the caller's transaction, waiting up to `wait` (`None`: until taken):
    /// its fencing token. Waiters for another transaction lock or a row lock queue in the
    /// server (PostgreSQL's lock queue), with no polling; a name a lease holds (the lease
    /// strategy on this table) is looked at again with a backoff until it is free.
    ///
    /// A wait that runs out leaves the caller's transaction as it was (the wait runs in a
    /// savepoint that is rolled back), so the caller can go on without the lock.
    ///
    /// Cancel safety: dropping the future may leave the statement running on the server and
    /// the lock taken in the transaction; roll the transaction back.
    ///
    /// # Errors
    /// `InvalidName`, and `InvalidConfig` when `conn` is not in a transaction, before any I/O;
    /// `Timeout` when `wait` ran out; `InvalidConfig` when the lock table does not exist;
    /// `Backend` or `Unavailable` when the statement fails.
    pub async fn lock(
        &self,
        conn: &mut PgConnection,
        name: impl IntoLockName,
        wait: Option<Duration>,
    ) -> Result<u64> {
        let name = name.into_lock_name()?;
        in_transaction(conn)?;
        let deadline = wait.map(|w| tokio::time::Instant::now() + w);
        let backoff = lockcore::backend::Backoff::for_ttl(Duration::from_secs(1));
        let mut leased = 0u32;
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
            let timeout =
                left.map_or_else(|| "0".to_owned(), |w| format!("{}ms", w.as_millis().max(1)));
            // A lock_timeout error aborts the transaction it happens in, and a key taken
            // under a live lease must be given back: wait in a savepoint.
            let mut savepoint = conn.begin().await.map_err(|e| self.error(&name, e))?;
            let got = sqlx::query_scalar::<_, i64>(AssertSqlSafe(self.wait_sql.clone()))
                .bind(name.as_str())
                .bind(timeout)
                .fetch_optional(&mut *savepoint)
                .await;
            match got {
                Ok(Some(fence)) => {
                    savepoint.commit().await.map_err(|e| self.error(&name, e))?;
                    return Ok(fence as u64);
                }
                Ok(None) => {
                    // A live lease holds the name: the rollback gives the key back.
                    savepoint
                        .rollback()
                        .await
                        .map_err(|e| self.error(&name, e))?;
                    let now = tokio::time::Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        return Err(timed_out(&name, wait));
                    }
                    let mut wake = now + backoff.delay(leased);
                    leased = leased.saturating_add(1);
                    if let Some(d) = deadline {
                        wake = wake.min(d);
                    }
                    tokio::time::sleep_until(wake).await;
                }
                Err(e) => {
                    savepoint
                        .rollback()
                        .await
                        .map_err(|e| self.error(&name, e))?;
                    if crate::sql_errors::db_code(&e).as_deref() == Some(LOCK_NOT_AVAILABLE) {
                        return Err(timed_out(&name, wait));
                    }
                    return Err(self.error(&name, e));
                }
            }
        }
    }

    fn error(&self, name: &LockName, e: sqlx::Error) -> Error {
        let code = crate::sql_errors::db_code(&e);
        if code.as_deref() == Some(UNDEFINED_FUNCTION) {
            return Error::invalid_config(format!(
                "the lock table {:?} does not exist, or was made by an older version (the \
                 lease check beside it is missing): connect a SqlBackend with table={} once to \
                 create them",
                self.table, self.table
            ));
        }
        if code.as_deref() == Some(UNDEFINED_TABLE) {
            return Error::invalid_config(format!(
                "the lock table {:?} does not exist: connect a SqlBackend with table={} once \
                 to create it",
                self.table, self.table
            ));
        }
        let what = format!("taking the transaction lock {:?}", name.as_str());
        if crate::conns::is_conn_err(&e) {
            Error::unavailable(what, e)
        } else {
            Error::backend(what, e)
        }
    }
}

fn timed_out(name: &LockName, wait: Option<Duration>) -> Error {
    Error::timeout(format!(
        "{:?} was not free within {:?}",
        name.as_str(),
        wait.unwrap_or_default()
    ))
}

fn in_transaction(conn: &PgConnection) -> Result<()> {
    if conn.is_in_transaction() {
        Ok(())
    } else {
        Err(Error::invalid_config(
            "a transaction lock needs a transaction: pass a sqlx Transaction (`&mut tx`), or \
             a connection after `begin()`",
        ))
    }
}
