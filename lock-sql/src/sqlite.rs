//! SQLite: leases only, in a file shared by the processes of one host (WAL mode, busy timeout).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{AcquireRequest, Acquired, CallerGone, Lease, acquire_detached};
use lockcore::{Error, Instant, LockInfo, LockName, OwnerToken, Result};
use sqlx::AssertSqlSafe;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::config::Parsed;
use crate::sql_errors::map_err;

/// Unix time in seconds (millisecond resolution) on the database's clock.
const NOW: &str = "((julianday('now') - 2440587.5) * 86400.0)";

struct Sql {
    acquire: String,
    extend: String,
    release: String,
    revoke: String,
    inspect: String,
}

pub(crate) struct LiteBackend {
    config: Parsed,
    pool: SqlitePool,
    sql: Arc<Sql>,
}

/// SQLITE_BUSY / SQLITE_LOCKED and their extended codes: another connection holds the write
/// lock beyond the busy timeout. Retried, never reported as a failure of the lock itself.
fn is_busy(e: &sqlx::Error) -> bool {
    crate::sql_errors::db_code(e)
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| matches!(c & 0xff, 5 | 6))
}

/// Runs `op` again while SQLite reports busy, for up to about two seconds.
async fn retry_busy<T, F, Fut>(op: F) -> sqlx::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = sqlx::Result<T>>,
{
    retry_busy_while(|| true, op).await
}

/// [`retry_busy`], retrying only while `wanted` says so.
async fn retry_busy_while<T, F, Fut>(wanted: impl Fn() -> bool, mut op: F) -> sqlx::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = sqlx::Result<T>>,
{
    let give_up = Instant::now() + Duration::from_secs(2);
    let mut attempt = 0u32;
    loop {
        match op().await {
            Err(e) if is_busy(&e) && Instant::now() < give_up && wanted() => {
                attempt += 1;
                let cap = 2u64 << attempt.min(6);
                tokio::time::sleep(Duration::from_millis(fastrand::u64(1..=cap))).await;
            }
            other => return other,
        }
    }
}

/// Adds the `holder` column (the holder's metadata) to a table created before it existed. Two
/// clients may race to add it: the loser's "duplicate column" is the outcome it wanted.
async fn add_holder_column(config: &Parsed, pool: &SqlitePool) -> Result<()> {
    let t = &config.table;
    let probe = format!("SELECT count(*) FROM pragma_table_info('{t}') WHERE name = 'holder'");
    let present: i64 =
        retry_busy(|| sqlx::query_scalar(AssertSqlSafe(probe.clone())).fetch_one(pool))
            .await
            .map_err(|e| map_err(config, "reading the lock table's columns", e))?;
    if present > 0 {
        return Ok(());
    }
    let alter = format!("ALTER TABLE {t} ADD COLUMN holder TEXT");
    match retry_busy(|| sqlx::raw_sql(AssertSqlSafe(alter.clone())).execute(pool)).await {
        Ok(_) => Ok(()),
        Err(e) if e.to_string().contains("duplicate column") => Ok(()),
        Err(e) => Err(map_err(config, "adding the holder column", e)),
    }
}

impl LiteBackend {
    pub(crate) async fn connect(config: &Parsed) -> Result<LiteBackend> {
        let opts = SqliteConnectOptions::from_str(&config.sqlx_url)
            .map_err(|e| Error::invalid_config(config.scrub(format!("invalid sqlite URL: {e}"))))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            // No ping before every checkout: that would add a round trip to every lock
            // operation. A connection that died idle fails its next statement instead, which
            // surfaces as `Unavailable` (and sqlx drops it from the pool).
            .test_before_acquire(false)
            .max_connections(config.pool_max)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts)
            .await
            .map_err(|e| map_err(config, "opening the sqlite database", e))?;
        Self::with_pool(config, pool).await
    }

    /// On a pool the application already has (its own settings kept).
    pub(crate) async fn with_pool(config: &Parsed, pool: SqlitePool) -> Result<LiteBackend> {
        let t = &config.table;
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {t} (name TEXT NOT NULL PRIMARY KEY, owner TEXT, \
               fence INTEGER NOT NULL DEFAULT 0, expires_at REAL NOT NULL DEFAULT 0)"
        );
        retry_busy(|| sqlx::raw_sql(AssertSqlSafe(ddl.clone())).execute(&pool))
            .await
            .map_err(|e| map_err(config, "creating the lock table", e))?;
        add_holder_column(config, &pool).await?;
        let sql = Sql {
            acquire: format!(
                "INSERT INTO {t} (name, owner, fence, expires_at, holder) \
                 VALUES (?1, ?2, 1, {NOW} + ?3, ?4) \
                 ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, fence = fence + 1, \
                   expires_at = excluded.expires_at, holder = excluded.holder \
                 WHERE owner IS NULL OR expires_at <= {NOW} \
                 RETURNING fence"
            ),
            extend: format!(
                "UPDATE {t} SET expires_at = {NOW} + ?3 \
                 WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW}"
            ),
            release: format!(
                "UPDATE {t} SET owner = NULL, expires_at = 0 \
                 WHERE name = ?1 AND owner = ?2 AND expires_at > {NOW}"
            ),
            revoke: format!(
                "UPDATE {t} SET owner = NULL, expires_at = 0 \
                 WHERE name = ?1 AND owner IS NOT NULL AND expires_at > {NOW}"
            ),
            inspect: format!(
                "SELECT fence, expires_at - {NOW}, holder FROM {t} \
                 WHERE name = ?1 AND owner IS NOT NULL AND expires_at > {NOW}"
            ),
        };
        Ok(LiteBackend {
            config: config.clone(),
            pool,
            sql: Arc::new(sql),
        })
    }

    /// The SQLite library's version, for the report.
    pub(crate) async fn server_version(&self) -> Result<String> {
        sqlx::query_scalar::<_, String>("SELECT sqlite_version()")
            .fetch_one(&self.pool)
            .await
            .map(|v| format!("SQLite {v}"))
            .map_err(|e| map_err(&self.config, "SELECT sqlite_version()", e))
    }

    pub(crate) async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(|e| map_err(&self.config, "SELECT 1", e))
    }

    pub(crate) async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        let token = req.token.to_hex();
        let holder = req.holder.encode();
        let lease = {
            let (pool, config, sql) = (self.pool.clone(), self.config.clone(), self.sql.clone());
            let (name, token) = (req.name.clone(), req.token);
            move |fencing| LiteLease {
                pool,
                config,
                sql,
                name,
                token,
                fencing,
            }
        };
        let (pool, config, sql) = (self.pool.clone(), self.config.clone(), self.sql.clone());
        let (name, ttl) = (req.name.clone(), req.ttl);
        // SQLite's worker thread runs a statement even after its caller is dropped: the attempt
        // runs detached, and a lease it wins for a caller gone meanwhile is released after it.
        let attempt = move |gone: CallerGone| async move {
            // A caller gone retries nothing: its attempt must not take the lock long after.
            let res = retry_busy_while(
                || !gone.is_gone(),
                || {
                    sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.acquire.clone()))
                        .bind(name.as_str())
                        .bind(&token)
                        .bind(ttl.as_secs_f64())
                        .bind(&holder)
                        .fetch_optional(&pool)
                },
            )
            .await;
            match res {
                Ok(fence) => Ok(fence.map(|f| lease(f as u64))),
                // Still busy: as good as contention; the poller retries.
                Err(e) if is_busy(&e) => Ok(None),
                Err(e) => Err(map_err(&config, "acquiring a lease", e)),
            }
        };
        let sent_at = Instant::now();
        match acquire_detached(&req.background, attempt).await {
            Some(won) => Ok(won?.map(|l| Acquired::new(l, sent_at))),
            None => Err(Error::unavailable(
                "acquiring a lease",
                "the runtime is shutting down",
            )),
        }
    }

    /// The row, if held: token, seconds left, metadata (when acquired is the holder's clock:
    /// SQLite has no server).
    ///
    /// Cancel safe.
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        let row: Option<(i64, f64, Option<String>)> = retry_busy(|| {
            sqlx::query_as(AssertSqlSafe(self.sql.inspect.clone()))
                .bind(name.as_str())
                .fetch_optional(&self.pool)
        })
        .await
        .map_err(|e| map_err(&self.config, "inspecting a lease", e))?;
        Ok(match row {
            None => LockInfo::free(name.clone(), None),
            Some((fence, left, holder)) => {
                crate::inspect::held(name, Some(fence), Some(left), holder.as_deref(), None)
            }
        })
    }

    pub(crate) async fn revoke(&self, name: &LockName) -> Result<bool> {
        let r = retry_busy(|| {
            sqlx::query(AssertSqlSafe(self.sql.revoke.clone()))
                .bind(name.as_str())
                .execute(&self.pool)
        })
        .await
        .map_err(|e| map_err(&self.config, "revoking a lease", e))?;
        Ok(r.rows_affected() > 0)
    }
}

struct LiteLease {
    pool: SqlitePool,
    config: Parsed,
    sql: Arc<Sql>,
    name: LockName,
    token: OwnerToken,
    fencing: u64,
}

impl fmt::Debug for LiteLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiteLease")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("fencing", &self.fencing)
            .finish()
    }
}

impl LiteLease {
    async fn update(&self, sql: &str, ttl: Option<Duration>, what: &str) -> Result<()> {
        let token = self.token.to_hex();
        let r = retry_busy(|| {
            let q = sqlx::query(AssertSqlSafe(sql.to_owned()))
                .bind(self.name.as_str())
                .bind(&token);
            // SQLite refuses a parameter the statement does not use.
            let q = match ttl {
                Some(ttl) => q.bind(ttl.as_secs_f64()),
                None => q,
            };
            q.execute(&self.pool)
        })
        .await
        .map_err(|e| map_err(&self.config, what, e))?;
        crate::sql_errors::owner_checked(r.rows_affected() as u64)
    }
}

#[lockcore::backend::async_trait]
impl Lease for LiteLease {
    fn fencing_token(&self) -> Option<u64> {
        Some(self.fencing)
    }

    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        self.update(&self.sql.extend, Some(ttl), "extending a lease")
            .await?;
        Ok(ttl)
    }

    async fn release(&self) -> Result<()> {
        self.update(&self.sql.release, None, "releasing a lease")
            .await
    }
}
