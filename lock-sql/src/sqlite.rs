//! SQLite: leases only, in a file shared by the processes of one host (WAL mode, busy timeout).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use lockcore::backend::{AcquireRequest, Acquired, CallerGone};
use lockcore::{Error, Instant, LockInfo, LockMode, LockName, Result};
use sqlx::AssertSqlSafe;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::config::Parsed;
use crate::lease::{Found, Held, LeaseStatements, SqlLease};
use crate::sql_errors::map_err;

/// Unix time in seconds (millisecond resolution) on the database's clock.
const NOW: &str = "((julianday('now') - 2440587.5) * 86400.0)";

struct Sql {
    acquire: String,
    /// After a failed exclusive attempt: whether live shares hold the name (a row) and are
    /// permits; then `mark_writer` marks a waiting writer held back by readers (see
    /// [`crate::shares`]).
    probe_shares: String,
    mark_writer: String,
    extend: String,
    release: String,
    revoke: String,
    inspect: String,
    /// A share attempt: one statement (see [`share_attempt`]).
    share_attempt: String,
    /// The verdict alone, for an attempt that took nothing: held, or a conflict.
    share_verdict: String,
    share_extend: String,
    /// Deletes one share (`?2`), or every share (`?2` NULL: a revoke): one statement.
    share_release: String,
    share_inspect: String,
}

pub(crate) struct LiteBackend {
    config: Parsed,
    pool: SqlitePool,
    sql: Arc<Sql>,
    /// The statements of the leases this client holds.
    held: Arc<LiteHeld>,
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

/// Adds column `column` (declared `decl`) to a table created before it existed: the holder's
/// metadata, the shares' columns. Two clients may race to add it: the loser's "duplicate
/// column" is the outcome it wanted.
async fn add_column(config: &Parsed, pool: &SqlitePool, column: &str, decl: &str) -> Result<()> {
    let t = &config.table;
    let probe = format!("SELECT count(*) FROM pragma_table_info('{t}') WHERE name = '{column}'");
    let present: i64 =
        retry_busy(|| sqlx::query_scalar(AssertSqlSafe(probe.clone())).fetch_one(pool))
            .await
            .map_err(|e| map_err(config, "reading the lock table's columns", e))?;
    if present > 0 {
        return Ok(());
    }
    let alter = format!("ALTER TABLE {t} ADD COLUMN {column} {decl}");
    match retry_busy(|| sqlx::raw_sql(AssertSqlSafe(alter.clone())).execute(pool)).await {
        Ok(_) => Ok(()),
        Err(e) if e.to_string().contains("duplicate column") => Ok(()),
        Err(e) => Err(map_err(config, &format!("adding the {column} column"), e)),
    }
}

/// The triggers that keep lease table `t`'s row in step with its shares in `st`: a share
/// inserted or given a new expiry or fence (an attempt, a retried one, an extend) raises the
/// row's fence counter (one counter across modes) and `shares_until` to it, creating the row
/// if missing; an insert also clears the name's expired shares. A share attempt and an extend
/// are then one statement each, and a release one `DELETE` (`shares_until` stays an upper
/// bound: the exclusive upsert reads the shares table while it has not passed). Older clients
/// that do the same in statements of their own write the same values again. Versioned names:
/// a change of what one does is a new trigger, never a replacement.
fn share_triggers(t: &str, st: &str) -> [String; 2] {
    let stem = st.strip_suffix("_shares").unwrap_or(st);
    let raise = format!(
        "UPDATE {t} SET fence = max(fence, NEW.fence), \
           shares_until = max(coalesce(shares_until, 0), NEW.expires_at) WHERE name = NEW.name;"
    );
    [
        format!(
            "CREATE TRIGGER IF NOT EXISTS {stem}_sins1 AFTER INSERT ON {st} BEGIN \
               INSERT OR IGNORE INTO {t} (name) VALUES (NEW.name); \
               {raise} \
               DELETE FROM {st} WHERE name = NEW.name AND expires_at <= {NOW}; \
             END"
        ),
        format!(
            "CREATE TRIGGER IF NOT EXISTS {stem}_supd1 AFTER UPDATE OF expires_at, fence ON {st} \
             BEGIN {raise} END"
        ),
    ]
}

/// The shares table `st`, `WITHOUT ROWID`: the rows live in the `(name, token)` key's b-tree,
/// so a share written or deleted changes one b-tree where a rowid table changes two (the
/// table and its key's index): measured 57 -> 44 µs per share acquire+release by hand (Python's
/// sqlite3, WAL, synchronous NORMAL), the exclusive lease's 32 µs unchanged.
fn shares_ddl(st: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {st} (name TEXT NOT NULL, token TEXT NOT NULL, \
           mode TEXT NOT NULL, expires_at REAL NOT NULL, fence INTEGER NOT NULL, \
           holder TEXT, PRIMARY KEY (name, token)) WITHOUT ROWID"
    )
}

/// Whether shares table `st` is a rowid table (one created before [`shares_ddl`] said
/// `WITHOUT ROWID`): its key then has an index of its own, `sqlite_autoindex_<st>_1`.
async fn shares_have_rowid<'e>(db: impl sqlx::SqliteExecutor<'e>, st: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' AND tbl_name = ?1 \
           AND name = 'sqlite_autoindex_' || ?1 || '_1')",
    )
    .bind(st)
    .fetch_one(db)
    .await
}

/// Rebuilds a rowid shares table `st` (beside lease table `t`) as [`shares_ddl`]'s, rows and
/// triggers kept, in one `BEGIN IMMEDIATE` transaction: the same name and columns, so clients
/// of every version go on using it (SQLite re-prepares their statements on the schema
/// change), and no share is written between the old table's drop (which drops its triggers)
/// and the new triggers. Checked again under the write lock: two clients may race to do it.
async fn shares_without_rowid(pool: &SqlitePool, t: &str, st: &str) -> sqlx::Result<()> {
    if !shares_have_rowid(pool, st).await? {
        return Ok(());
    }
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    if !shares_have_rowid(&mut *tx, st).await? {
        return tx.rollback().await;
    }
    let new = format!("{st}_rebuild");
    let rebuild = format!(
        "DROP TABLE IF EXISTS {new}; {ddl}; \
         INSERT INTO {new} (name, token, mode, expires_at, fence, holder) \
           SELECT name, token, mode, expires_at, fence, holder FROM {st}; \
         DROP TABLE {st}; ALTER TABLE {new} RENAME TO {st};",
        ddl = shares_ddl(&new),
    );
    sqlx::raw_sql(AssertSqlSafe(rebuild))
        .execute(&mut *tx)
        .await?;
    for trigger in share_triggers(t, st) {
        sqlx::raw_sql(AssertSqlSafe(trigger))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await
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
        add_column(config, &pool, "holder", "TEXT").await?;
        add_column(config, &pool, "shares_until", "REAL").await?;
        add_column(config, &pool, "writer_until", "REAL").await?;
        let st = crate::shares::table(t);
        let ddl = shares_ddl(&st);
        retry_busy(|| sqlx::raw_sql(AssertSqlSafe(ddl.clone())).execute(&pool))
            .await
            .map_err(|e| map_err(config, "creating the shares table", e))?;
        retry_busy(|| shares_without_rowid(&pool, t, &st))
            .await
            .map_err(|e| map_err(config, "rebuilding the shares table without rowid", e))?;
        for trigger in share_triggers(t, &st) {
            retry_busy(|| sqlx::raw_sql(AssertSqlSafe(trigger.clone())).execute(&pool))
                .await
                .map_err(|e| map_err(config, "creating the share triggers", e))?;
        }
        // A share attempt's verdict from the live rows (parameters: ?1 name, ?2 token, ?3 mode
        // column, ?6 1 for a permit, ?7 its limit).
        let verdict = crate::shares::verdict_sql(&crate::shares::SeenSql {
            exclusive: &format!(
                "coalesce((SELECT owner IS NOT NULL AND expires_at > {NOW} \
                   FROM {t} WHERE name = ?1), 0)"
            ),
            writer: &format!("coalesce((SELECT writer_until > {NOW} FROM {t} WHERE name = ?1), 0)"),
            live: &format!("(SELECT count(*) FROM {st} WHERE name = ?1 AND expires_at > {NOW})"),
            other_modes: &format!(
                "(SELECT count(*) FROM {st} WHERE name = ?1 AND mode <> ?3 AND expires_at > {NOW})"
            ),
            mine: &format!(
                "(SELECT fence FROM {st} WHERE name = ?1 AND token = ?2 AND expires_at > {NOW})"
            ),
            permit: "?6",
            limit: "?7",
        });
        let sql = Sql {
            acquire: format!(
                "INSERT INTO {t} (name, owner, fence, expires_at, holder) \
                 VALUES (?1, ?2, 1, {NOW} + ?3, ?4) \
                 ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, fence = fence + 1, \
                   expires_at = excluded.expires_at, holder = excluded.holder, writer_until = NULL, \
                   shares_until = NULL \
                 WHERE (owner IS NULL OR expires_at <= {NOW}) \
                   AND (shares_until IS NULL OR shares_until <= {NOW} \
                     OR NOT EXISTS (SELECT 1 FROM {st} WHERE name = ?1 AND expires_at > {NOW})) \
                 RETURNING fence"
            ),
            probe_shares: format!(
                "SELECT EXISTS (SELECT 1 FROM {st} WHERE name = ?1 AND mode <> 'shared' \
                   AND expires_at > {NOW}) FROM {t} WHERE name = ?1 AND shares_until > {NOW}"
            ),
            mark_writer: format!(
                "UPDATE {t} SET writer_until = {NOW} + ?2 WHERE name = ?1 AND shares_until > {NOW} \
                   AND EXISTS (SELECT 1 FROM {st} WHERE name = ?1 AND expires_at > {NOW})"
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
            share_attempt: format!(
                // The share's fence is the row's next; an own row left expired is taken
                // over with it, an own live one (a retried attempt whose first try committed)
                // keeps its fence and gets the new expiry. The triggers (see `share_triggers`)
                // carry the fence and the expiry to the lease row.
                "INSERT INTO {st} (name, token, mode, expires_at, fence, holder) \
                   SELECT ?1, ?2, ?3, {NOW} + ?4, \
                     coalesce((SELECT fence FROM {t} WHERE name = ?1), 0) + 1, ?5 \
                   WHERE {verdict} IN ({take}, {mine}) \
                 ON CONFLICT (name, token) DO UPDATE SET \
                   fence = CASE WHEN expires_at > {NOW} THEN fence ELSE excluded.fence END, \
                   mode = excluded.mode, holder = excluded.holder, \
                   expires_at = excluded.expires_at \
                 RETURNING fence",
                take = crate::shares::SQL_TAKE,
                mine = crate::shares::SQL_MINE,
            ),
            share_verdict: format!("SELECT {verdict}"),
            share_extend: format!(
                "UPDATE {st} SET expires_at = {NOW} + ?3 \
                 WHERE name = ?1 AND token = ?2 AND expires_at > {NOW}"
            ),
            share_release: format!(
                "DELETE FROM {st} WHERE name = ?1 AND (?2 IS NULL OR token = ?2) \
                   AND expires_at > {NOW}"
            ),
            share_inspect: format!(
                "SELECT mode, fence, expires_at - {NOW}, holder FROM {st} \
                 WHERE name = ?1 AND expires_at > {NOW} ORDER BY fence"
            ),
        };
        let sql = Arc::new(sql);
        let held = Arc::new(LiteHeld {
            pool: pool.clone(),
            config: config.clone(),
            sql: sql.clone(),
        });
        Ok(LiteBackend {
            config: config.clone(),
            pool,
            sql,
            held,
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

    /// A `try_lock`'s attempt (see [`LiteBackend::attempt`]).
    ///
    /// Cancel safety: as [`LiteBackend::attempt`].
    pub(crate) async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        self.attempt(req, false).await
    }

    /// One attempt. `waits`: it belongs to a waiting `lock()`, whose writer marks itself as
    /// waiting behind shared holders (a `try_lock` marks nothing).
    ///
    /// Cancel safety: the attempt runs detached; a lease or share it wins for a caller gone
    /// meanwhile is released after it.
    pub(crate) async fn attempt(
        &self,
        req: &AcquireRequest,
        waits: bool,
    ) -> Result<Option<Acquired>> {
        let token = req.token.to_hex();
        let holder = req.holder.encode();
        let share = req.mode != LockMode::Exclusive;
        let (pool, config, sql) = (self.pool.clone(), self.config.clone(), self.sql.clone());
        let (name, ttl, mode) = (req.name.clone(), req.ttl, req.mode);
        // SQLite's worker thread runs a statement even after its caller is dropped: the attempt
        // runs detached, and a lease it wins for a caller gone meanwhile is released after it.
        let attempt = move |gone: CallerGone| async move {
            // A caller gone retries nothing: its attempt must not take the lock long after.
            let res = if share {
                retry_busy_while(
                    || !gone.is_gone(),
                    || share_attempt(&pool, &sql, &name, &token, &holder, ttl, mode),
                )
                .await
            } else {
                retry_busy_while(
                    || !gone.is_gone(),
                    || exclusive_attempt(&pool, &sql, &name, &token, &holder, ttl, waits),
                )
                .await
            };
            match res {
                Ok(Ok(Some(fence))) => Ok(Some(Found::Won(fence as u64))),
                Ok(Ok(None)) => Ok(Some(Found::Busy(()))),
                Ok(Err(e)) => Err(e),
                // Still busy: as good as contention; the poller retries.
                Err(e) if is_busy(&e) => Ok(Some(Found::Busy(()))),
                Err(e) => Err(map_err(&config, "acquiring a lease", e)),
            }
        };
        let lease = SqlLease::of(&self.held, req);
        let (won, ()) = crate::lease::attempt_detached(req, None, lease, attempt).await?;
        Ok(won)
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
        if let Some((fence, left, holder)) = row {
            return Ok(crate::inspect::held(
                name,
                Some(fence),
                Some(left),
                holder.as_deref(),
                None,
            )
            .with_mode(Some(LockMode::Exclusive)));
        }
        let shares: Vec<(String, i64, f64, Option<String>)> = retry_busy(|| {
            sqlx::query_as(AssertSqlSafe(self.sql.share_inspect.clone()))
                .bind(name.as_str())
                .fetch_all(&self.pool)
        })
        .await
        .map_err(|e| map_err(&self.config, "inspecting shares", e))?;
        Ok(crate::shares::info(name, shares).unwrap_or_else(|| LockInfo::free(name.clone(), None)))
    }

    pub(crate) async fn revoke(&self, name: &LockName) -> Result<bool> {
        let r = retry_busy(|| {
            sqlx::query(AssertSqlSafe(self.sql.revoke.clone()))
                .bind(name.as_str())
                .execute(&self.pool)
        })
        .await
        .map_err(|e| map_err(&self.config, "revoking a lease", e))?;
        let shares = release_shares(&self.pool, &self.sql, name, None)
            .await
            .map_err(|e| map_err(&self.config, "revoking shares", e))?;
        Ok(r.rows_affected() > 0 || shares > 0)
    }
}

/// An SQLite lease's statements once held (see [`LeaseStatements`]).
struct LiteHeld {
    pool: SqlitePool,
    config: Parsed,
    sql: Arc<Sql>,
}

impl LiteHeld {
    /// Runs `sql` on `held`'s row (and `ttl`, where the statement takes it): the rows it
    /// matched.
    async fn update(
        &self,
        sql: &str,
        held: &Held,
        ttl: Option<Duration>,
        what: &str,
    ) -> Result<u64> {
        let token = held.token.to_hex();
        let r = retry_busy(|| {
            let q = sqlx::query(AssertSqlSafe(sql.to_owned()))
                .bind(held.name.as_str())
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
        Ok(r.rows_affected())
    }
}

#[lockcore::backend::async_trait]
impl LeaseStatements for LiteHeld {
    async fn extend(&self, held: &Held, ttl: Duration) -> Result<u64> {
        // A share's trigger raises `shares_until` with it.
        let (sql, what) = if held.share {
            (&self.sql.share_extend, "extending a share")
        } else {
            (&self.sql.extend, "extending a lease")
        };
        self.update(sql, held, Some(ttl), what).await
    }

    async fn release(&self, held: &Held) -> Result<u64> {
        if held.share {
            return release_shares(&self.pool, &self.sql, &held.name, Some(held.token.to_hex()))
                .await
                .map_err(|e| map_err(&self.config, "releasing a share", e));
        }
        let sql = &self.sql.release;
        self.update(sql, held, None, "releasing a lease").await
    }
}

/// One exclusive attempt: the lease's fence if taken. When not: whether live shares hold the
/// name, and a conflict if they are permits (a semaphore is not a mutex); a waiting writer
/// they hold back marks itself (see [`crate::shares`]).
///
/// Cancel safety: run detached (see [`LiteBackend::attempt`]); dropped, it may have taken the
/// lease.
async fn exclusive_attempt(
    pool: &SqlitePool,
    sql: &Sql,
    name: &LockName,
    token: &str,
    holder: &str,
    ttl: Duration,
    waits: bool,
) -> sqlx::Result<Result<Option<i64>>> {
    let fence: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql.acquire.clone()))
        .bind(name.as_str())
        .bind(token)
        .bind(ttl.as_secs_f64())
        .bind(holder)
        .fetch_optional(pool)
        .await?;
    if fence.is_some() {
        return Ok(Ok(fence));
    }
    let permits: Option<bool> = sqlx::query_scalar(AssertSqlSafe(sql.probe_shares.clone()))
        .bind(name.as_str())
        .fetch_optional(pool)
        .await?;
    match permits {
        Some(true) => Ok(Err(crate::shares::conflict(LockMode::Exclusive))),
        Some(false) if waits => {
            sqlx::query(AssertSqlSafe(sql.mark_writer.clone()))
                .bind(name.as_str())
                .bind(crate::shares::WRITER_MARK.as_secs_f64())
                .execute(pool)
                .await?;
            Ok(Ok(None))
        }
        _ => Ok(Ok(None)),
    }
}

/// One share attempt: one statement (`Sql::share_attempt`, autocommit under SQLite's write
/// lock), the verdict worked out by SQLite ([`crate::shares::verdict_sql`]); the share's fence
/// if taken. When it took nothing, the verdict alone says whether the name is held or used in
/// another way (a second read: a state changed in between is as good as held).
///
/// Cancel safety: run detached (see [`LiteBackend::attempt`]); dropped, it may have taken the
/// share.
async fn share_attempt(
    pool: &SqlitePool,
    sql: &Sql,
    name: &LockName,
    token: &str,
    holder: &str,
    ttl: Duration,
    mode: LockMode,
) -> sqlx::Result<Result<Option<i64>>> {
    let (permit, limit) = match mode {
        LockMode::Permit { limit } => (1, i64::from(limit)),
        _ => (0, 0),
    };
    let mode_column = crate::shares::mode_str(mode);
    let ttl = ttl.as_secs_f64();
    // Both statements take the same parameters (the verdict alone uses some of them).
    let with_params = |statement: &str| {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(statement.to_owned()))
            .bind(name.as_str())
            .bind(token)
            .bind(mode_column.clone())
            .bind(ttl)
            .bind(holder)
            .bind(permit)
            .bind(limit)
    };
    let fence = with_params(&sql.share_attempt).fetch_optional(pool).await?;
    if fence.is_some() {
        return Ok(Ok(fence));
    }
    let verdict = with_params(&sql.share_verdict).fetch_one(pool).await?;
    Ok(match verdict {
        crate::shares::SQL_CONFLICT => Err(crate::shares::conflict(mode)),
        _ => Ok(None),
    })
}

/// Deletes the share of `token`, or every live share of `name` (`None`: a revoke): one
/// statement (`shares_until` is left as an upper bound, see `share_triggers`). Returns how
/// many went.
///
/// Cancel safety: dropping the future may or may not have released them.
async fn release_shares(
    pool: &SqlitePool,
    sql: &Arc<Sql>,
    name: &LockName,
    token: Option<String>,
) -> sqlx::Result<u64> {
    retry_busy(|| {
        sqlx::query(AssertSqlSafe(sql.share_release.clone()))
            .bind(name.as_str())
            .bind(token.as_deref())
            .execute(pool)
    })
    .await
    .map(|r| r.rows_affected())
}

impl LiteBackend {
    /// A set of exclusive leases in one `BEGIN IMMEDIATE` transaction (see
    /// [`Backend::try_acquire_all`](lockcore::backend::Backend::try_acquire_all)): each
    /// member's `try_lock` upsert (`acquire`), in the order given, with the database's write
    /// lock held throughout; rolled back at the first member it does not take (a holder, live
    /// shares: permits are a conflict, as for a single attempt), committed when it took them
    /// all. Each member's fence is the one its upsert returns, as a single acquisition's. A
    /// database still busy after the retries is as good as contention: the first member is
    /// reported busy.
    ///
    /// Cancel safety: detached as a single attempt (SQLite's worker runs a statement even
    /// when its caller is gone); a caller gone retries nothing and rolls back before the
    /// commit, and a set committed for a caller gone is released in the background.
    pub(crate) async fn try_set(
        &self,
        reqs: &[AcquireRequest],
    ) -> Result<lockcore::backend::SetAttempt> {
        let members = crate::sets::SetMember::of(reqs);
        let leases: Vec<SqlLease<LiteHeld>> =
            reqs.iter().map(|r| SqlLease::of(&self.held, r)).collect();
        let (pool, config, sql) = (self.pool.clone(), self.config.clone(), self.sql.clone());
        let sent_at = Instant::now();
        let attempt = move |gone: CallerGone| async move {
            let res =
                retry_busy_while(|| !gone.is_gone(), || set_tx(&pool, &sql, &members, &gone)).await;
            let found = match res {
                Ok(found) => found?,
                Err(e) if is_busy(&e) => crate::sets::SetFound::Busy(0),
                Err(e) => return Err(map_err(&config, "acquiring a set of leases", e)),
            };
            found.into_won(leases, SqlLease::with_fencing)
        };
        crate::sets::run_set_detached(reqs, sent_at, None, attempt).await
    }
}

/// The transaction of [`LiteBackend::try_set`]: committed only when every member was taken.
async fn set_tx(
    pool: &SqlitePool,
    sql: &Sql,
    members: &[crate::sets::SetMember],
    gone: &CallerGone,
) -> sqlx::Result<Result<crate::sets::SetFound>> {
    let tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    crate::lease::take_members(tx, members, gone, |c, m| {
        let (acquire, probe) = (sql.acquire.clone(), sql.probe_shares.clone());
        async move {
            let fence: Option<i64> = sqlx::query_scalar(AssertSqlSafe(acquire))
                .bind(m.name.as_str())
                .bind(&m.token)
                .bind(m.ttl.as_secs_f64())
                .bind(&m.holder)
                .fetch_optional(&mut *c)
                .await?;
            if let Some(f) = fence {
                return Ok(Found::Won(f as u64));
            }
            let permits: Option<bool> = sqlx::query_scalar(AssertSqlSafe(probe))
                .bind(m.name.as_str())
                .fetch_optional(&mut *c)
                .await?;
            Ok(match permits {
                Some(true) => Found::Conflict,
                _ => Found::Busy(()),
            })
        }
        .boxed()
    })
    .await
}
