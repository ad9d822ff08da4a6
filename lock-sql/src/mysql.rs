//! MariaDB (and MySQL 5.7+ for leases and `GET_LOCK`): row locks (a session `GET_LOCK` plus the
//! lock row's committed fencing counter, one statement) and leases (one conditional upsert per
//! attempt, the outcome read from the OK packet).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use lockcore::backend::{AcquireRequest, Acquired, Background, Lease};
use lockcore::{Error, Instant, LockInfo, LockMode, LockName, OwnerToken, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlDatabaseError};
use sqlx::{AssertSqlSafe, Connection};

use crate::config::{Parsed, Strategy};
use crate::conns::{Checked, Conns, is_conn_err};
use crate::mysql_exclusion::RowOutcome;
use crate::mysql_procs::ShareCalls;
use crate::rowlock::guard_timeout;
use crate::rowlock::{HealthChecks, Holding, Queues, RowLease};
use crate::shares::Verdict;
use crate::sql_errors::map_err;

/// The longest single server-side wait; a longer wait is queued again after it, so a waiter
/// whose client died (the server does not notice during a lock wait) leaves within it.
const WAIT_CHUNK: Duration = Duration::from_secs(5);

/// What we know of a MariaDB session: its id (to kill its lock wait when a waiter is dropped)
/// and the `wait_timeout` (server-side idle guard, seconds) set on it, 0 for the default.
pub(crate) struct MyMeta {
    id: u64,
    guard_s: u64,
}

type MyConns = Conns<MySqlConnectOptions, MyMeta>;

/// The holder-metadata columns, in `CREATE TABLE` and added to older tables.
const META_COLUMNS: &str =
    "holder_meta TEXT CHARACTER SET utf8mb4 NULL, acquired_at DATETIME(6) NULL";

/// What a failed exclusive lease attempt reports (as its `LAST_INSERT_ID`) when live readers
/// hold the name, or permits (a semaphore is not a mutex: a conflict). Fences never come near
/// these.
const HELD_BY_READERS: u64 = 1 << 62;
const HELD_BY_PERMITS: u64 = (1 << 62) + 1;

/// The shares' columns of the lease row (see [`crate::shares`]).
const SHARE_COLUMNS: &str = "shares_until DATETIME(6) NULL, writer_until DATETIME(6) NULL";

/// Adds columns (`columns`, the first named `first`) to a table created before they existed:
/// the holder's metadata, the shares'. Probed first: an `ALTER TABLE` (even one with nothing
/// to do) waits for the metadata lock that row-lock waiters keep on the table while they wait.
/// Two clients adding them at once: the second finds them there (ER_DUP_FIELDNAME), which is
/// as good.
async fn add_columns(conns: &MyConns, table: &str, first: &str, columns: &str) -> Result<()> {
    let t = table.to_owned();
    let first = first.to_owned();
    let present: i64 = conns
        .run(
            conns.bound(),
            "probing the lock table's columns",
            move |c| {
                sqlx::query_scalar(
                    "SELECT COUNT(*) FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?",
                )
                .bind(t.clone())
                .bind(first.clone())
                .fetch_one(c)
                .boxed()
            },
        )
        .await?;
    if present > 0 {
        return Ok(());
    }
    let alter = format!("ALTER TABLE {table} ADD COLUMN ({columns})");
    conns
        .run(
            conns.bound(),
            "adding columns to the lock table",
            move |c| {
                let alter = alter.clone();
                async move {
                    match sqlx::raw_sql(AssertSqlSafe(alter)).execute(c).await {
                        // ER_DUP_FIELDNAME: added meanwhile by another client.
                        Err(e) if error_number(&e) == Some(1060) => Ok(()),
                        r => r.map(|_| ()),
                    }
                }
                .boxed()
            },
        )
        .await
}

struct Sql {
    row_acquire: String,
    /// `GET_LOCK` alone, 1 when taken: for a holder that wants no token (and under
    /// `interop=get_lock`, which hands none out: the peer's key, then the default layout's):
    /// nothing written, no commit.
    row_acquire_unfenced: String,
    /// After `row_acquire_unfenced` took its keys: a live lease gives them back.
    row_lock_check: String,
    /// Whether a row lock holds the name's key (after an exclusive lease attempt created the
    /// row, see `crate::mysql_exclusion`).
    key_used: String,
    /// Gives back the keys a row lock holds (each parameter the name).
    row_unlock: String,
    holder: String,
    lease_acquire: String,
    share_lock_row: String,
    share_row: String,
    share_expired: String,
    share_live: String,
    share_insert: String,
    share_take: String,
    share_extend: String,
    share_raise: String,
    /// Deletes one share (`?2`), or every share (`?2` NULL: a revoke).
    share_delete: String,
    share_inspect: String,
    /// The share procedures' calls, if they exist (see [`crate::mysql_procs`]); without them
    /// (a user without `CREATE ROUTINE`, none created yet by one who has it) a share takes the
    /// transaction of the statements above.
    share_calls: Option<ShareCalls>,
    lease_extend: String,
    lease_release: String,
    revoke_lease: String,
    /// Held or free, TTL left (lease), token, holder metadata and when acquired, of one name.
    inspect: String,
}

pub(crate) struct MyBackend {
    config: Parsed,
    conns: Arc<MyConns>,
    sql: Arc<Sql>,
    queues: Arc<Queues>,
    /// The health checks of this client's held row locks.
    health: Arc<HealthChecks>,
}

/// Creates the share procedures of lock table `t` (shares table `st`) where missing and says
/// whether both are there to call. A refusal (no `CREATE ROUTINE`; two clients creating
/// one at once) is no error: the probe after it decides, so procedures a privileged user
/// created serve a client that may not create them, and a client that finds none keeps the
/// statements (logged once at connect).
async fn create_share_procedures(conns: &MyConns, t: &str, st: &str) -> Result<Option<ShareCalls>> {
    let mut refused = None;
    for ddl in crate::mysql_procs::ddl(t, st) {
        let outcome = conns
            .run(conns.bound(), "creating the share procedures", move |c| {
                sqlx::raw_sql(AssertSqlSafe(ddl.clone()))
                    .execute(c)
                    .map(|r| match r {
                        Ok(_) => Ok(None),
                        Err(sqlx::Error::Database(e)) => Ok(Some(e.message().to_owned())),
                        Err(e) => Err(e),
                    })
                    .boxed()
            })
            .await?;
        refused = refused.or(outcome);
    }
    let names = crate::mysql_procs::names(t);
    let present: i64 = conns
        .run(conns.bound(), "probing the share procedures", move |c| {
            sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() \
                 AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME IN (?, ?)",
            )
            .bind(names[0].clone())
            .bind(names[1].clone())
            .fetch_one(c)
            .boxed()
        })
        .await?;
    if present == 2 {
        return Ok(Some(ShareCalls::new(t)));
    }
    tracing::warn!(
        table = t,
        refused = refused.as_deref().unwrap_or(""),
        "the share procedures could not be created: shares and permits take a transaction of \
         several statements (about 3x slower); grant CREATE ROUTINE, or let a user who has it \
         connect once"
    );
    Ok(None)
}

/// [`Sql::lease_acquire`] with its parameters: the row's values, the name again (for the
/// shares subquery), the writer's mark (µs, 0 for none) twice.
fn lease_acquire_query(
    sql: &str,
    name: &str,
    token: &str,
    ttl_us: u64,
    holder: &str,
    mark_us: u64,
) -> sqlx::query::Query<'static, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    sqlx::query(AssertSqlSafe(sql.to_owned()))
        .bind(name.to_owned())
        .bind(token.to_owned())
        .bind(ttl_us)
        .bind(holder.to_owned())
        .bind(name.to_owned())
        .bind(mark_us)
        .bind(mark_us)
}

fn error_number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<MySqlDatabaseError>())
        .map(|d| d.number())
}

/// A new session: READ COMMITTED for every transaction on it (each statement of a share's or
/// a set's transaction reads what was committed before it: after the lease row is locked, what
/// the transactions that held it before committed; and no gap locks, so two first attempts on
/// a new name queue instead of deadlocking), set once here rather than per transaction; and its
/// id.
fn setup(conn: &mut MySqlConnection) -> futures::future::BoxFuture<'_, sqlx::Result<MyMeta>> {
    async move {
        sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *conn)
            .await?;
        let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(conn)
            .await?;
        Ok(MyMeta { id, guard_s: 0 })
    }
    .boxed()
}

fn guard_secs(ttl: Duration) -> u64 {
    guard_timeout(ttl).as_secs_f64().ceil() as u64
}

impl MyBackend {
    pub(crate) async fn connect(config: &Parsed) -> Result<MyBackend> {
        let opts = MySqlConnectOptions::from_str(&config.sqlx_url)
            .map_err(|e| Error::invalid_config(config.scrub(format!("invalid mysql URL: {e}"))))?;
        Self::connect_with(config, opts).await
    }

    /// As [`MyBackend::connect`], with connection settings given (an application's pool's).
    pub(crate) async fn connect_with(
        config: &Parsed,
        opts: MySqlConnectOptions,
    ) -> Result<MyBackend> {
        let conns = Conns::new(opts, config, setup);
        let t = &config.table;
        // VARBINARY: names compare byte for byte (no case folding, no PAD SPACE). Expiry is
        // kept in UTC_TIMESTAMP(6), independent of session time zones. The holder's metadata
        // (`lockcore::Holder`, JSON) is `holder_meta` with `acquired_at` on the server's clock
        // (`holder` is an older column, unused).
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {t} (name VARBINARY(320) NOT NULL PRIMARY KEY, \
               owner CHAR(32) NULL, fence BIGINT UNSIGNED NOT NULL DEFAULT 0, \
               expires_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:01', \
               holder BIGINT UNSIGNED NULL, {META_COLUMNS}, {SHARE_COLUMNS}) ENGINE=InnoDB"
        );
        conns
            .run(conns.bound(), "creating the lock table", move |c| {
                sqlx::raw_sql(AssertSqlSafe(ddl.clone()))
                    .execute(c)
                    .map(|r| r.map(|_| ()))
                    .boxed()
            })
            .await?;
        add_columns(&conns, t, "holder_meta", META_COLUMNS).await?;
        // Every strategy's clients add them (to a table of an older release): an ALTER TABLE
        // run later by a lease client would queue behind row-lock holders' metadata locks, and
        // every statement on the table behind it.
        add_columns(&conns, t, "shares_until", SHARE_COLUMNS).await?;
        let st = crate::shares::table(t);
        // Row-lock clients too: their check for a live lease reads it (see
        // `crate::mysql_exclusion`).
        {
            let ddl = format!(
                "CREATE TABLE IF NOT EXISTS {st} (name VARBINARY(320) NOT NULL, \
                   token VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, \
                   mode VARCHAR(32) CHARACTER SET ascii NOT NULL, expires_at DATETIME(6) NOT NULL, \
                   fence BIGINT UNSIGNED NOT NULL, holder TEXT CHARACTER SET utf8mb4 NULL, \
                   PRIMARY KEY (name, token)) ENGINE=InnoDB"
            );
            conns
                .run(conns.bound(), "creating the shares table", move |c| {
                    sqlx::raw_sql(AssertSqlSafe(ddl.clone()))
                        .execute(c)
                        .map(|r| r.map(|_| ()))
                        .boxed()
                })
                .await?;
        }
        let share_calls = if config.strategy == Strategy::Lease {
            create_share_procedures(&conns, t, &st).await?
        } else {
            None
        };
        // The user lock of a name: per database and table, hashed to fit GET_LOCK's 64
        // characters.
        // Under interop=get_lock, the exact name (as the peers call GET_LOCK); the statements
        // are otherwise the same (no token is handed out, a peer bumps nothing: acquisitions
        // take `GET_LOCK` alone).
        let interop = config.interop == Some(crate::Interop::GetLock);
        let key = if interop {
            "?".to_owned()
        } else {
            crate::mysql_exclusion::name_key("?", t)
        };
        // Live shares hold the name as an exclusive holder does (see `crate::shares`):
        // `shares_until` is an upper bound of their expiries (a share release does not lower
        // it), so past it none is live, and before it the shares table says:
        // `@locksmith_shares` is 0 (none live), [`HELD_BY_READERS`] or [`HELD_BY_PERMITS`],
        // set by the first assignment and read by the later ones (one subquery: each copy of
        // it in the statement cost the exclusive path ~8 µs even when not run). The subquery
        // runs after the upsert locked the row (InnoDB opens a statement's read view at its
        // first consistent read), so it sees every share committed by an attempt that held
        // the row before.
        let shares_held = format!(
            "(@locksmith_shares := IF(COALESCE(shares_until > UTC_TIMESTAMP(6), 0), \
               (SELECT IF(COUNT(*) = 0, 0, \
                   IF(MAX(mode <> 'shared'), {HELD_BY_PERMITS}, {HELD_BY_READERS})) \
                 FROM {st} WHERE name = ? AND expires_at > UTC_TIMESTAMP(6)), 0))"
        );
        let now = "UTC_TIMESTAMP(6)";
        // A lease attempt takes the name only while no row lock holds its key, judged on the
        // locked row (see `crate::mysql_exclusion`); leases exist in the default layout only.
        let key_free = crate::mysql_exclusion::key_free("VALUES(name)", t);
        let sql = Sql {
            // GET_LOCK first (a WHERE of the insert's source); holding it, the counter row is
            // bumped and committed with the statement (autocommit), so the token is durable
            // before the caller sees it, unless a live lease holds the name (the key is then
            // given back: see `crate::mysql_exclusion`). LAST_INSERT_ID(expr) hands the
            // outcome back in the OK packet (`RowOutcome::of_fenced`). The holder's metadata
            // rides in the same statement. Never under interop=get_lock (no token).
            row_acquire: crate::mysql_exclusion::row_acquire_fenced(t, &st),
            row_lock_check: crate::mysql_exclusion::row_lock_check(t, &st, interop),
            key_used: crate::mysql_exclusion::key_used(t),
            row_acquire_unfenced: if interop {
                crate::mysql_exclusion::interop_acquire(t)
            } else {
                format!("SELECT COALESCE(GET_LOCK({key}, ?), 0) = 1")
            },
            row_unlock: crate::mysql_exclusion::row_unlock(t, interop),
            holder: format!("SELECT IS_USED_LOCK({key})"),
            // One statement per attempt, idempotent for the same token. Assignments run left
            // to right and see earlier ones: owner is decided first (`@locksmith_took`), the
            // rest follow only if it was taken. A retry with the same token (an attempt whose
            // reply was lost) passes the same checks as a first attempt: its own row is
            // retaken only while no live share holds the name (a reader may have come once its
            // lease ran out; taking the row then would hold beside it and clear
            // `shares_until`, letting the next writer in too). LAST_INSERT_ID reports the outcome in the OK packet: 1 for a new row
            // (from VALUES), the new fence if taken over or retaken, 0 if someone else holds it,
            // [`HELD_BY_READERS`] or [`HELD_BY_PERMITS`] if live shares hold it (the fence
            // column unchanged: LEAST(.., 0) adds nothing). A waiting writer held back by
            // readers marks itself (`writer_until`, µs; 0 from try_lock). A holder clears
            // `shares_until` (no share is live beside it), so that later attempts skip the
            // shares table. A row lock holding the name's key keeps it too (`key_free`; a new
            // row is checked after the statement, see `lease_attempt`). Parameters: see
            // [`lease_acquire_query`] (the name comes again for the subquery: MariaDB takes no
            // VALUES() in one).
            lease_acquire: format!(
                "INSERT INTO {t} (name, owner, fence, expires_at, holder_meta, acquired_at) \
                 VALUES (?, ?, LAST_INSERT_ID(1), {now} + INTERVAL ? MICROSECOND, ?, {now}) \
                 ON DUPLICATE KEY UPDATE \
                   owner = IF(@locksmith_took := ({shares_held} = 0 AND {key_free} \
                       AND (owner IS NULL OR expires_at <= {now} OR owner = VALUES(owner))), \
                     VALUES(owner), owner), \
                   fence = IF(@locksmith_took, LAST_INSERT_ID(fence + 1), \
                     fence + LEAST(0, LAST_INSERT_ID(@locksmith_shares))), \
                   expires_at = IF(@locksmith_took, VALUES(expires_at), expires_at), \
                   holder_meta = IF(@locksmith_took, VALUES(holder_meta), holder_meta), \
                   acquired_at = IF(@locksmith_took, VALUES(acquired_at), acquired_at), \
                   writer_until = IF(@locksmith_took, NULL, \
                     IF(? > 0 AND @locksmith_shares <> 0, {now} + INTERVAL ? MICROSECOND, \
                       writer_until)), \
                   shares_until = IF(@locksmith_took, NULL, shares_until)"
            ),
            // A no-op update: the row locked exclusively at once (a shared lock taken by a
            // duplicate-key insert and upgraded afterwards deadlocks two such transactions).
            share_lock_row: format!(
                "INSERT INTO {t} (name) VALUES (?) ON DUPLICATE KEY UPDATE name = name"
            ),
            share_row: format!(
                "SELECT IF(owner IS NOT NULL AND expires_at > {now}, \
                     TIMESTAMPDIFF(MICROSECOND, {now}, expires_at), NULL), \
                   IF(writer_until > {now}, TIMESTAMPDIFF(MICROSECOND, {now}, writer_until), NULL), \
                   fence FROM {t} WHERE name = ? FOR UPDATE"
            ),
            share_expired: format!("DELETE FROM {st} WHERE name = ? AND expires_at <= {now}"),
            share_live: format!(
                "SELECT token, mode, TIMESTAMPDIFF(MICROSECOND, {now}, expires_at), fence \
                 FROM {st} WHERE name = ?"
            ),
            share_insert: format!(
                "INSERT INTO {st} (name, token, mode, expires_at, fence, holder) \
                 VALUES (?, ?, ?, {now} + INTERVAL ? MICROSECOND, ?, ?)"
            ),
            // One counter across modes: the share's fence is the row's next.
            share_take: format!(
                "UPDATE {t} SET fence = ?, shares_until = GREATEST(COALESCE(shares_until, \
                   '1970-01-01 00:00:01'), (SELECT expires_at FROM {st} WHERE name = ? AND token = ?)) \
                 WHERE name = ?"
            ),
            share_extend: format!(
                "UPDATE {st} SET expires_at = {now} + INTERVAL ? MICROSECOND \
                 WHERE name = ? AND token = ? AND expires_at > {now}"
            ),
            share_raise: format!(
                "UPDATE {t} SET shares_until = GREATEST(COALESCE(shares_until, \
                   '1970-01-01 00:00:01'), (SELECT expires_at FROM {st} WHERE name = ? AND token = ?)) \
                 WHERE name = ?"
            ),
            share_delete: format!(
                "DELETE FROM {st} WHERE name = ? AND (? IS NULL OR token = ?) AND expires_at > {now}"
            ),
            share_inspect: format!(
                "SELECT mode, fence, TIMESTAMPDIFF(MICROSECOND, {now}, expires_at), holder \
                 FROM {st} WHERE name = ? AND expires_at > {now} ORDER BY fence"
            ),
            share_calls,
            lease_extend: format!(
                "UPDATE {t} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                 WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
            lease_release: format!(
                "UPDATE {t} SET owner = NULL, expires_at = '1970-01-01 00:00:01' \
                 WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
            revoke_lease: format!(
                "UPDATE {t} SET owner = NULL, expires_at = '1970-01-01 00:00:01' \
                 WHERE name = ? AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)"
            ),
            // Row lock: held while a session holds the user lock (the row keeps the last
            // holder's token and metadata); lease: while the row has an unexpired owner.
            // Times as microseconds since the epoch by datetime arithmetic (UNIX_TIMESTAMP
            // would read the UTC values in the session's time zone).
            inspect: {
                let (held, remaining) = match config.strategy {
                    Strategy::RowLock => (
                        format!("IS_USED_LOCK({key}) IS NOT NULL"),
                        "CAST(NULL AS SIGNED)",
                    ),
                    Strategy::Lease => (
                        "COALESCE(r.owner IS NOT NULL AND r.expires_at > UTC_TIMESTAMP(6), 0)"
                            .to_owned(),
                        "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), r.expires_at)",
                    ),
                };
                format!(
                    "SELECT ({held}) + 0 AS held, {remaining} AS remaining_us, r.fence, \
                       r.holder_meta, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', r.acquired_at) \
                       AS acquired_us \
                     FROM (SELECT 1) one LEFT JOIN {t} r ON r.name = ?"
                )
            },
        };
        Ok(MyBackend {
            config: config.clone(),
            conns,
            sql: Arc::new(sql),
            queues: Arc::default(),
            health: Arc::default(),
        })
    }

    /// The server's version string, for the report.
    pub(crate) async fn server_version(&self) -> Result<String> {
        self.conns
            .run(self.conns.bound(), "SELECT VERSION()", |c| {
                async move {
                    sqlx::query_scalar::<_, String>("SELECT VERSION()")
                        .fetch_one(c)
                        .await
                }
                .boxed()
            })
            .await
    }

    pub(crate) async fn ping(&self) -> Result<()> {
        self.conns
            .run(self.conns.bound(), "SELECT 1", |c| {
                async move { sqlx::raw_sql("SELECT 1").execute(c).await.map(|_| ()) }.boxed()
            })
            .await
    }

    /// The bare primitive of the strategy: row-lock `GET_LOCK` then `RELEASE_LOCK` on one
    /// connection; lease: an insert and a delete of a row.
    pub(crate) async fn bare_cycle(&self, name: &LockName) -> Result<()> {
        let name = name.as_str().to_owned();
        let t = self.config.table.clone();
        let row_lock = self.config.strategy == Strategy::RowLock;
        self.conns
            .run(self.conns.bound(), "bare cycle", move |c| {
                let name = name.clone();
                let t = t.clone();
                async move {
                    if row_lock {
                        sqlx::query("SELECT GET_LOCK(SHA1(?), 10)")
                            .bind(&name)
                            .execute(&mut *c)
                            .await?;
                        sqlx::query("SELECT RELEASE_LOCK(SHA1(?))")
                            .bind(&name)
                            .execute(&mut *c)
                            .await?;
                    } else {
                        let bare = format!("{name}\u{1}bare");
                        sqlx::query(AssertSqlSafe(format!(
                            "INSERT INTO {t} (name, owner) VALUES (?, 'bare')"
                        )))
                        .bind(&bare)
                        .execute(&mut *c)
                        .await?;
                        sqlx::query(AssertSqlSafe(format!("DELETE FROM {t} WHERE name = ?")))
                            .bind(&bare)
                            .execute(&mut *c)
                            .await?;
                    }
                    Ok(())
                }
                .boxed()
            })
            .await
    }

    /// Statements the server has run for clients (`SHOW GLOBAL STATUS` `Questions`; pings are
    /// not counted).
    pub(crate) async fn server_requests(&self) -> Result<u64> {
        self.conns
            .run(self.conns.bound(), "reading Questions", |c| {
                async move {
                    let (_, v): (String, String) =
                        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
                            .fetch_one(c)
                            .await?;
                    Ok(v.parse::<u64>().unwrap_or(0))
                }
                .boxed()
            })
            .await
    }

    /// Refuses, before any I/O, a name the interop peer would lock differently.
    fn check_name(&self, name: &LockName) -> Result<()> {
        match self.config.interop {
            Some(peer) => peer.check_name(name),
            None => Ok(()),
        }
    }

    pub(crate) async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        self.check_name(&req.name)?;
        match self.config.strategy {
            Strategy::RowLock => self.row_acquire(req, None, true).await,
            Strategy::Lease => self.lease_attempt(req, self.conns.bound(), false).await,
        }
    }

    pub(crate) async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        self.check_name(&req.name)?;
        match self.config.strategy {
            Strategy::RowLock => {
                let nowait = deadline.is_some_and(|d| d <= Instant::now());
                self.row_acquire(req, deadline, nowait).await
            }
            // Leases poll: lib.rs drives lockcore's poller for them.
            Strategy::Lease => match self
                .lease_attempt(req, self.conns.bound_by(deadline), true)
                .await
            {
                Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => Ok(None),
                r => r,
            },
        }
    }

    /// One statement: held or free (row lock: `IS_USED_LOCK`; lease: an unexpired owner), TTL
    /// left (lease), the row's token and holder metadata, when acquired on the server's clock.
    /// Waiters are unknown (a waiter's `GET_LOCK` shows no name on the server).
    ///
    /// Cancel safe.
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        type Row = (i64, Option<i64>, Option<u64>, Option<String>, Option<i64>);
        let (n, sql) = (name.as_str().to_owned(), self.sql.inspect.clone());
        // The row lock's statement names the lock (IS_USED_LOCK) before the row.
        let row_lock = self.config.strategy == Strategy::RowLock;
        let (held, remaining_us, fence, holder, acquired_us): Row = self
            .conns
            .run(self.conns.bound(), "inspecting a lock", move |c| {
                let mut q = sqlx::query_as::<_, Row>(AssertSqlSafe(sql.clone()));
                if row_lock {
                    q = q.bind(n.clone());
                }
                q.bind(n.clone()).fetch_one(c).boxed()
            })
            .await?;
        if held == 0 {
            if !row_lock {
                let (n, sql) = (name.as_str().to_owned(), self.sql.share_inspect.clone());
                let rows: Vec<(String, u64, i64, Option<String>)> = self
                    .conns
                    .run(self.conns.bound(), "inspecting shares", move |c| {
                        sqlx::query_as(AssertSqlSafe(sql.clone()))
                            .bind(n.clone())
                            .fetch_all(c)
                            .boxed()
                    })
                    .await?;
                let rows = rows
                    .into_iter()
                    .map(|(m, f, us, h)| (m, f as i64, us as f64 / 1e6, h))
                    .collect();
                if let Some(info) = crate::shares::info(name, rows) {
                    return Ok(info);
                }
            }
            return Ok(LockInfo::free(name.clone(), None));
        }
        let info = crate::inspect::held(
            name,
            fence.and_then(|f| i64::try_from(f).ok()),
            remaining_us.map(|us| us as f64 / 1e6),
            holder.as_deref(),
            acquired_us.map(|us| us as f64 / 1e3),
        );
        Ok(if row_lock {
            info
        } else {
            info.with_mode(Some(LockMode::Exclusive))
        })
    }

    pub(crate) async fn revoke(&self, name: &LockName) -> Result<bool> {
        self.check_name(name)?;
        let shares = match self.config.strategy {
            Strategy::Lease => release_shares(&self.conns, &self.sql, name, None).await?,
            Strategy::RowLock => 0,
        };
        let name = name.as_str().to_owned();
        match self.config.strategy {
            Strategy::Lease => {
                let sql = self.sql.revoke_lease.clone();
                let n = self
                    .conns
                    .run(self.conns.bound(), "revoking a lease", move |c| {
                        sqlx::query(AssertSqlSafe(sql.clone()))
                            .bind(name.clone())
                            .execute(c)
                            .map(|r| r.map(|r| r.rows_affected()))
                            .boxed()
                    })
                    .await?;
                Ok(n > 0 || shares > 0)
            }
            Strategy::RowLock => {
                // The holder as the server knows it now (not a connection id recorded earlier,
                // which may by then belong to another lock's holder), then killed by that id.
                let sql = self.sql.holder.clone();
                let holder: Option<i64> = self
                    .conns
                    .run(
                        self.conns.bound(),
                        "finding a row lock's holder",
                        move |c| {
                            sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                                .bind(name.clone())
                                .fetch_one(c)
                                .boxed()
                        },
                    )
                    .await?;
                let Some(id) = holder.filter(|id| *id > 0) else {
                    return Ok(false);
                };
                let killed = self
                    .conns
                    .run(
                        self.conns.bound(),
                        "killing a row lock's holder",
                        move |c| {
                            async move {
                                match sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {id}")))
                                    .execute(c)
                                    .await
                                {
                                    Ok(_) => Ok(true),
                                    // ER_NO_SUCH_THREAD: the holder is gone already.
                                    Err(e) if error_number(&e) == Some(1094) => Ok(false),
                                    Err(e) => Err(e),
                                }
                            }
                            .boxed()
                        },
                    )
                    .await?;
                Ok(killed)
            }
        }
    }

    // ---- row-lock ----

    /// One statement per attempt (plus `SET wait_timeout` on a connection whose server-side
    /// guard differs, once per connection and TTL): `GET_LOCK` (tried, or waited for in chunks
    /// of at most [`WAIT_CHUNK`] until the deadline) and the fencing counter bumped and
    /// committed; `GET_LOCK` alone when the holder wants no token (nothing written).
    async fn row_acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        nowait: bool,
    ) -> Result<Option<Acquired>> {
        let _turn = if nowait {
            None
        } else {
            match self.queues.enter(req.name.as_str(), deadline).await {
                Some(t) => Some(t),
                None => return Ok(None),
            }
        };
        let guard_s = guard_secs(req.ttl);
        let holder = req.holder.encode();
        // A token only where one is handed out: a peer of interop=get_lock bumps no counter.
        let fenced = req.fencing.wanted() && self.config.interop.is_none();
        // Under interop=get_lock the peer's key and the default layout's are taken.
        let interop = self.config.interop.is_some();
        let backoff = lockcore::backend::Backoff::for_ttl(req.ttl);
        let mut leased = 0u32;
        let mut c = match self.conns.get(self.conns.bound_by(deadline), false).await {
            Ok(c) => c,
            Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut retried = false;
        loop {
            if c.conn.meta.guard_s != guard_s {
                let set = sqlx::raw_sql(AssertSqlSafe(format!(
                    "SET SESSION wait_timeout = {guard_s}"
                )))
                .execute(&mut c.conn.raw);
                match tokio::time::timeout_at(self.conns.bound_by(deadline), set).await {
                    Ok(Ok(_)) => c.conn.meta.guard_s = guard_s,
                    Ok(Err(e)) if is_conn_err(&e) && c.reused && !retried => {
                        retried = true;
                        c = self.conns.get(self.conns.bound_by(deadline), false).await?;
                        c.reused = false;
                        continue;
                    }
                    Ok(Err(e)) => return Err(map_err(&self.config, "setting the idle guard", e)),
                    Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
                    Err(_) => return Err(self.conns.timed_out("setting the idle guard")),
                }
            }
            let wait = if nowait {
                Duration::ZERO
            } else {
                deadline.map_or(WAIT_CHUNK, |d| {
                    d.saturating_duration_since(Instant::now()).min(WAIT_CHUNK)
                })
            };
            // A dropped call leaves no waiter behind: the server does not notice a closed
            // socket during a lock wait, so the wait is killed from another connection.
            let killer = (!nowait).then(|| Killer {
                conns: self.conns.clone(),
                id: c.conn.meta.id,
                background: req.background.clone(),
                armed: true,
            });
            if !nowait {
                // The blocking GET_LOCK is on its way: a release from now on reaches it (the
                // server shows no waiter to ask).
                req.waiting.mark();
            }
            // A holder that wants no token gets 0, unused (nothing counted).
            let (name, holder, sql) = (req.name.as_str(), holder.as_str(), &self.sql);
            let conn = &mut c.conn.raw;
            let q = async move {
                if fenced {
                    let r = sqlx::query(AssertSqlSafe(sql.row_acquire.clone()))
                        .bind(name)
                        .bind(holder)
                        .bind(name)
                        .bind(wait.as_secs_f64())
                        .bind(name)
                        .execute(&mut *conn)
                        .await?;
                    return Ok(RowOutcome::of_fenced(r.rows_affected(), r.last_insert_id()));
                }
                let mut q = sqlx::query_scalar(AssertSqlSafe(sql.row_acquire_unfenced.clone()))
                    .bind(name)
                    .bind(wait.as_secs_f64());
                if interop {
                    // The default layout's key too (`mysql_exclusion::interop_acquire`).
                    q = q.bind(name).bind(wait.as_secs_f64()).bind(name);
                }
                let got: bool = q.fetch_one(&mut *conn).await?;
                if !got {
                    return Ok(RowOutcome::Busy);
                }
                // Holding the key: a live lease gives it back (`crate::mysql_exclusion`).
                let check = sql.row_lock_check.clone();
                let mut q = sqlx::query_scalar(AssertSqlSafe(check.clone()));
                for _ in 0..crate::mysql_exclusion::params(&check) {
                    q = q.bind(name);
                }
                let leased: Option<bool> = q.fetch_optional(&mut *conn).await?;
                Ok(if leased == Some(true) {
                    RowOutcome::Leased
                } else {
                    RowOutcome::Taken(0)
                })
            };
            // Under interop, two waits (the peer's key, then the default layout's).
            let waits = if interop { 2 } else { 1 };
            let bound = Instant::now() + wait * waits + self.config.op_timeout;
            let res = match tokio::time::timeout_at(bound, q).await {
                Ok(r) => r,
                Err(_) => return Err(self.conns.timed_out("taking a row lock")),
            };
            if let Some(k) = killer {
                k.disarm();
            }
            match res {
                Ok(RowOutcome::Taken(fence)) => {
                    // As for PostgreSQL: the validity counts from the answer, never the send.
                    let answered_at = Instant::now();
                    c.hold();
                    let holding = MyHolding {
                        conn: Some(c),
                        conns: self.conns.clone(),
                        sql: self.sql.clone(),
                        name: req.name.as_str().to_owned(),
                    };
                    let lease = RowLease::start(
                        Box::new(holding),
                        req.name.clone(),
                        fenced.then_some(fence),
                        req.ttl,
                        req.lost.clone(),
                        (&self.health, "mysql"),
                    );
                    return Ok(Some(Acquired::new(lease, answered_at)));
                }
                Ok(RowOutcome::Busy) => {
                    // Busy (GET_LOCK timed out): nothing held.
                    if nowait || deadline.is_some_and(|d| Instant::now() >= d) {
                        self.put(c);
                        return Ok(None);
                    }
                    // A chunk of a longer wait ran out: queue again.
                }
                // A live lease holds the name (the key was given back): its release or expiry
                // notifies nobody here, so a waiting lock() looks again after a backoff.
                Ok(RowOutcome::Leased) => {
                    if nowait || deadline.is_some_and(|d| Instant::now() >= d) {
                        self.put(c);
                        return Ok(None);
                    }
                    let mut wake = Instant::now() + backoff.delay(leased);
                    leased = leased.saturating_add(1);
                    if let Some(d) = deadline {
                        wake = wake.min(d);
                    }
                    tokio::time::sleep_until(wake).await;
                }
                Err(e) if is_conn_err(&e) && c.reused && !retried => {
                    retried = true;
                    c = self.conns.get(self.conns.bound_by(deadline), false).await?;
                    c.reused = false;
                }
                Err(e) => return Err(map_err(&self.config, "taking a row lock", e)),
            }
        }
    }

    fn put(&self, mut c: Checked<MySqlConnectOptions, MyMeta>) {
        idle_until_guard(&mut c);
        self.conns.put(c);
    }

    // ---- lease ----

    /// One attempt. `waits`: it belongs to a waiting `lock()`, whose writer marks itself as
    /// waiting behind shared holders (a `try_lock` marks nothing).
    ///
    /// Cancel safety: a lease or share won by an attempt whose caller is gone is released in
    /// the background.
    async fn lease_attempt(
        &self,
        req: &AcquireRequest,
        bound: Instant,
        waits: bool,
    ) -> Result<Option<Acquired>> {
        if req.mode != LockMode::Exclusive {
            return self.share_attempt(req, bound).await;
        }
        let token = req.token.to_hex();
        let sql = self.sql.lease_acquire.clone();
        let name = req.name.as_str().to_owned();
        let ttl = req.ttl.as_micros() as u64;
        let holder = req.holder.encode();
        let lease = self.lease(req, 0);
        let conns = self.conns.clone();
        let mark = if waits {
            crate::shares::WRITER_MARK.as_micros() as u64
        } else {
            0
        };
        let sent_at = Instant::now();
        // A cancelled caller's statement may still commit, after a release sent on another
        // connection at the drop: it runs detached, and what it won is released after it.
        let all = self.sql.clone();
        let attempt = move |gone| async move {
            let reply = conns
                .run_unless_gone(&gone, bound, "acquiring a lease", move |c| {
                    let (sql, all, name, token, holder) = (
                        sql.clone(),
                        all.clone(),
                        name.clone(),
                        token.clone(),
                        holder.clone(),
                    );
                    async move {
                        let r = lease_acquire_query(&sql, &name, &token, ttl, &holder, mark)
                            .execute(&mut *c)
                            .await?;
                        let id = r.last_insert_id();
                        let won = !matches!(id, 0 | HELD_BY_READERS | HELD_BY_PERMITS);
                        // A taken row always changes (rows affected 2): 1 is a new row, whose
                        // values were judged before it existed (see `crate::mysql_exclusion`).
                        if won && r.rows_affected() == 1 && key_used(c, &all, &name).await? {
                            sqlx::query(AssertSqlSafe(all.lease_release.clone()))
                                .bind(&name)
                                .bind(&token)
                                .execute(&mut *c)
                                .await?;
                            return Ok(0);
                        }
                        Ok(id)
                    }
                    .boxed()
                })
                .await;
            let Some(reply) = reply? else {
                return Ok(None);
            };
            match reply {
                HELD_BY_PERMITS => Err(crate::shares::conflict(LockMode::Exclusive)),
                0 | HELD_BY_READERS => Ok(None),
                id => Ok(Some(lease.with_fencing(id))),
            }
        };
        let won = lockcore::backend::acquire_detached_for(
            std::slice::from_ref(req),
            Some(bound),
            attempt,
        )
        .await?;
        Ok(won.map(|l| Acquired::new(l, sent_at)))
    }

    fn lease(&self, req: &AcquireRequest, fencing: u64) -> MyLease {
        MyLease {
            conns: self.conns.clone(),
            sql: self.sql.clone(),
            name: req.name.clone(),
            token: req.token,
            fencing,
            share: req.mode != LockMode::Exclusive,
        }
    }

    /// One share attempt: a transaction on the name's lease row, locked (see
    /// [`crate::shares`]).
    ///
    /// Cancel safety: a share won by an attempt whose caller is gone is released in the
    /// background.
    async fn share_attempt(
        &self,
        req: &AcquireRequest,
        bound: Instant,
    ) -> Result<Option<Acquired>> {
        let sql = self.sql.clone();
        let name = req.name.as_str().to_owned();
        let token = req.token.to_hex();
        let holder = req.holder.encode();
        let mode = req.mode;
        let ttl = req.ttl.as_micros() as u64;
        let lease = self.lease(req, 0);
        let conns = self.conns.clone();
        let sent_at = Instant::now();
        // Detached, as an exclusive attempt (see `lease_attempt`).
        let attempt = move |gone| async move {
            let reply = conns
                .run_unless_gone(&gone, bound, "acquiring a share", move |c| {
                    let (sql, name, token, holder) =
                        (sql.clone(), name.clone(), token.clone(), holder.clone());
                    async move {
                        if let Some(calls) = &sql.share_calls {
                            let outcome = sqlx::query_as::<_, (i64, i64)>(AssertSqlSafe(
                                calls.acquire.clone(),
                            ))
                            .bind(&name)
                            .bind(&token)
                            .bind(crate::shares::mode_str(mode))
                            .bind(match mode {
                                LockMode::Permit { limit } => i64::from(limit),
                                _ => 0,
                            })
                            .bind(ttl)
                            .bind(&holder)
                            .fetch_one(&mut *c)
                            .await
                            .map(|(verdict, value)| match verdict {
                                1 => Ok(Some(value as u64)),
                                0 => Ok(None),
                                _ => Err(crate::shares::conflict(mode)),
                            });
                            return match outcome {
                                // As below.
                                Err(e) if error_number(&e) == Some(1213) => Ok(Ok(None)),
                                other => other,
                            };
                        }
                        let outcome = in_tx(c, |c| {
                            Box::pin(async move {
                                sqlx::query(AssertSqlSafe(sql.share_lock_row.clone()))
                                    .bind(&name)
                                    .execute(&mut *c)
                                    .await?;
                                let (exclusive_us, writer_us, fence): (
                                    Option<i64>,
                                    Option<i64>,
                                    u64,
                                ) = sqlx::query_as(AssertSqlSafe(sql.share_row.clone()))
                                    .bind(&name)
                                    .fetch_one(&mut *c)
                                    .await?;
                                // The row locked: a row lock holding the name's key keeps it
                                // (see `crate::mysql_exclusion`).
                                if key_used(&mut *c, &sql, &name).await? {
                                    return Ok(Ok(None));
                                }
                                sqlx::query(AssertSqlSafe(sql.share_expired.clone()))
                                    .bind(&name)
                                    .execute(&mut *c)
                                    .await?;
                                let rows: Vec<(String, String, i64, u64)> =
                                    sqlx::query_as(AssertSqlSafe(sql.share_live.clone()))
                                        .bind(&name)
                                        .fetch_all(&mut *c)
                                        .await?;
                                let secs = |us: i64| us as f64 / 1e6;
                                let rows = rows
                                    .into_iter()
                                    .map(|(t, m, us, f)| (t, m, secs(us), f as i64))
                                    .collect();
                                let seen = crate::shares::Seen::from_rows(
                                    exclusive_us.map(secs),
                                    writer_us.map(secs),
                                    &token,
                                    rows,
                                );
                                let fence = match crate::shares::decide(mode, &seen) {
                                    Err(e) => return Ok(Err(e)),
                                    Ok(Verdict::Wait(_)) => return Ok(Ok(None)),
                                    Ok(Verdict::Mine(fence)) => {
                                        sqlx::query(AssertSqlSafe(sql.share_extend.clone()))
                                            .bind(ttl)
                                            .bind(&name)
                                            .bind(&token)
                                            .execute(&mut *c)
                                            .await?;
                                        fence as u64
                                    }
                                    Ok(Verdict::Take) => {
                                        let fence = fence + 1;
                                        sqlx::query(AssertSqlSafe(sql.share_insert.clone()))
                                            .bind(&name)
                                            .bind(&token)
                                            .bind(crate::shares::mode_str(mode))
                                            .bind(ttl)
                                            .bind(fence)
                                            .bind(&holder)
                                            .execute(&mut *c)
                                            .await?;
                                        sqlx::query(AssertSqlSafe(sql.share_take.clone()))
                                            .bind(fence)
                                            .bind(&name)
                                            .bind(&token)
                                            .bind(&name)
                                            .execute(&mut *c)
                                            .await?;
                                        return Ok(Ok(Some(fence)));
                                    }
                                };
                                sqlx::query(AssertSqlSafe(sql.share_raise.clone()))
                                    .bind(&name)
                                    .bind(&token)
                                    .bind(&name)
                                    .execute(&mut *c)
                                    .await?;
                                Ok(Ok(Some(fence)))
                            })
                        })
                        .await;
                        match outcome {
                            // ER_LOCK_DEADLOCK: InnoDB rolled this attempt back to break a cycle
                            // of lock waits (duplicate-key inserts of a new name can make one):
                            // nothing was taken; as good as contention.
                            Err(e) if error_number(&e) == Some(1213) => Ok(Ok(None)),
                            other => other,
                        }
                    }
                    .boxed()
                })
                .await;
            let Some(reply) = reply? else {
                return Ok(None);
            };
            Ok(reply?.map(|f| lease.with_fencing(f)))
        };
        let won = lockcore::backend::acquire_detached_for(
            std::slice::from_ref(req),
            Some(bound),
            attempt,
        )
        .await?;
        Ok(won.map(|l| Acquired::new(l, sent_at)))
    }
}

/// Whether a row lock holds the key of `name` (asked after an exclusive lease attempt created
/// the name's row: see `crate::mysql_exclusion`).
async fn key_used(c: &mut MySqlConnection, sql: &Sql, name: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar(AssertSqlSafe(sql.key_used.clone()))
        .bind(name)
        .fetch_one(c)
        .await
}

/// A connection idle with a server-side guard set is closed by the server after it: never
/// reuse it past that.
fn idle_until_guard(c: &mut Checked<MySqlConnectOptions, MyMeta>) {
    if c.conn.meta.guard_s > 0 {
        c.conn.idle_until = Some(
            Instant::now() + Duration::from_secs(c.conn.meta.guard_s) - Duration::from_millis(500),
        );
    }
}

/// Kills a session's lock wait if the acquisition is dropped while it waits.
struct Killer {
    conns: Arc<MyConns>,
    id: u64,
    background: Background,
    armed: bool,
}

impl Killer {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Killer {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let conns = self.conns.clone();
        let id = self.id;
        self.background.spawn(async move {
            let _ = conns
                .run(conns.bound(), "ending a dropped lock wait", move |c| {
                    sqlx::raw_sql(AssertSqlSafe(format!("KILL QUERY {id}")))
                        .execute(c)
                        .map(|r| r.map(|_| ()))
                        .boxed()
                })
                .await;
        });
    }
}

/// A connection holding a MariaDB row lock (its session's user lock).
struct MyHolding {
    conn: Option<Checked<MySqlConnectOptions, MyMeta>>,
    conns: Arc<MyConns>,
    sql: Arc<Sql>,
    name: String,
}

impl MyHolding {
    fn checked(&mut self) -> &mut Checked<MySqlConnectOptions, MyMeta> {
        self.conn.as_mut().expect("holding connection present")
    }
}

#[lockcore::backend::async_trait]
impl Holding for MyHolding {
    async fn ping(&mut self) -> sqlx::Result<()> {
        self.checked().conn.raw.ping().await
    }

    async fn set_guard(&mut self, ttl: Duration) -> sqlx::Result<()> {
        let s = guard_secs(ttl);
        let c = self.checked();
        sqlx::raw_sql(AssertSqlSafe(format!("SET SESSION wait_timeout = {s}")))
            .execute(&mut c.conn.raw)
            .await?;
        c.conn.meta.guard_s = s;
        Ok(())
    }

    async fn unlock(&mut self) -> sqlx::Result<bool> {
        let sql = self.sql.row_unlock.clone();
        let name = self.name.clone();
        let mut q = sqlx::query_scalar(AssertSqlSafe(sql.clone()));
        // Each parameter is the name (`mysql_exclusion::row_unlock`).
        for _ in 0..crate::mysql_exclusion::params(&sql) {
            q = q.bind(name.clone());
        }
        let r: Option<i64> = q.fetch_one(&mut self.checked().conn.raw).await?;
        Ok(r == Some(1))
    }

    fn recycle(mut self: Box<Self>) {
        if let Some(mut c) = self.conn.take() {
            idle_until_guard(&mut c);
            self.conns.put(c);
        }
    }
}

#[derive(Clone)]
struct MyLease {
    conns: Arc<MyConns>,
    sql: Arc<Sql>,
    name: LockName,
    token: OwnerToken,
    fencing: u64,
    /// A shared holder's or a permit's lease (a row of the shares table), not the lock row.
    share: bool,
}

impl fmt::Debug for MyLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MyLease")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("fencing", &self.fencing)
            .finish()
    }
}

impl MyLease {
    /// This lease with the fencing token it was won with.
    fn with_fencing(self, fencing: u64) -> Self {
        MyLease { fencing, ..self }
    }

    async fn update(&self, sql: &str, ttl: Option<Duration>, what: &str) -> Result<()> {
        let sql = sql.to_owned();
        let name = self.name.as_str().to_owned();
        let token = self.token.to_hex();
        let n = self
            .conns
            .run(self.conns.bound(), what, move |c| {
                let mut q = sqlx::query(AssertSqlSafe(sql.clone()));
                if let Some(ttl) = ttl {
                    q = q.bind(ttl.as_micros() as u64);
                }
                q.bind(name.clone())
                    .bind(token.clone())
                    .execute(c)
                    .map(|r| r.map(|r| r.rows_affected()))
                    .boxed()
            })
            .await?;
        // FOUND_ROWS is on: this counts matched rows, so an extend within the same microsecond
        // still reports 1.
        crate::sql_errors::owner_checked(n)
    }
}

#[lockcore::backend::async_trait]
impl Lease for MyLease {
    fn fencing_token(&self) -> Option<u64> {
        Some(self.fencing)
    }

    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        if self.share {
            let (sql, name, token) = (
                self.sql.clone(),
                self.name.as_str().to_owned(),
                self.token.to_hex(),
            );
            let us = ttl.as_micros() as u64;
            let n = self
                .conns
                .run(self.conns.bound(), "extending a share", move |c| {
                    let (sql, name, token) = (sql.clone(), name.clone(), token.clone());
                    async move {
                        if let Some(calls) = &sql.share_calls {
                            let n: i64 = sqlx::query_scalar(AssertSqlSafe(calls.extend.clone()))
                                .bind(&name)
                                .bind(&token)
                                .bind(us)
                                .fetch_one(&mut *c)
                                .await?;
                            return Ok(n as u64);
                        }
                        in_tx(c, |c| {
                            Box::pin(async move {
                                sqlx::query(AssertSqlSafe(sql.share_lock_row.clone()))
                                    .bind(&name)
                                    .execute(&mut *c)
                                    .await?;
                                let n = sqlx::query(AssertSqlSafe(sql.share_extend.clone()))
                                    .bind(us)
                                    .bind(&name)
                                    .bind(&token)
                                    .execute(&mut *c)
                                    .await?
                                    .rows_affected();
                                if n > 0 {
                                    sqlx::query(AssertSqlSafe(sql.share_raise.clone()))
                                        .bind(&name)
                                        .bind(&token)
                                        .bind(&name)
                                        .execute(&mut *c)
                                        .await?;
                                }
                                Ok(n)
                            })
                        })
                        .await
                    }
                    .boxed()
                })
                .await?;
            crate::sql_errors::owner_checked(n)?;
            return Ok(ttl);
        }
        self.update(&self.sql.lease_extend, Some(ttl), "extending a lease")
            .await?;
        Ok(ttl)
    }

    async fn release(&self) -> Result<()> {
        if self.share {
            let token = Some(self.token.to_hex());
            let n = release_shares(&self.conns, &self.sql, &self.name, token).await?;
            return crate::sql_errors::owner_checked(n);
        }
        self.update(&self.sql.lease_release, None, "releasing a lease")
            .await
    }
}

/// Runs `body` in a transaction, READ COMMITTED as all of the session's (see [`setup`]: each
/// statement reads what was committed before it: after the lease row is locked, what the
/// transactions before committed), committed after
/// `body` (a wait or a refusal too: nothing it did is wrong to keep, and the row lock must not
/// outlive the call), rolled back after an error. Never left to sqlx's rollback on drop, which
/// is only sent with the connection's next statement: an idle connection would keep the row
/// locked until then. A dropped call's connection is closed (see [`Conns::run`]).
async fn in_tx<'c, T>(
    c: &'c mut MySqlConnection,
    body: impl for<'t> FnOnce(
        &'t mut MySqlConnection,
    ) -> futures::future::BoxFuture<'t, sqlx::Result<T>>,
) -> sqlx::Result<T> {
    let mut tx = c.begin().await?;
    match body(&mut tx).await {
        Ok(v) => {
            tx.commit().await?;
            Ok(v)
        }
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// Deletes the share of `token`, or every live share of `name` (`None`: a revoke): one
/// statement, the lease row untouched (its `shares_until` is an upper bound, see
/// `lease_acquire`). Returns how many went.
///
/// Cancel safety: dropping the future may or may not have released them.
async fn release_shares(
    conns: &MyConns,
    sql: &Arc<Sql>,
    name: &LockName,
    token: Option<String>,
) -> Result<u64> {
    let (sql, name) = (sql.share_delete.clone(), name.as_str().to_owned());
    conns
        .run(conns.bound(), "releasing shares", move |c| {
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(name.clone())
                .bind(token.clone())
                .bind(token.clone())
                .execute(c)
                .map(|r| r.map(|r| r.rows_affected()))
                .boxed()
        })
        .await
}

impl MyBackend {
    /// A set of exclusive leases in one READ COMMITTED transaction on one connection (see
    /// [`Backend::try_acquire_all`](lockcore::backend::Backend::try_acquire_all)): each
    /// member's `try_lock` upsert (`lease_acquire`, marking no writer), in the order given;
    /// rolled back at the first member it does not take (a holder, live shares), committed when
    /// it took them all. Each member's fence is the one its upsert reports, as a single
    /// acquisition's. Every member's row stays locked until the transaction ends: a single
    /// attempt on it waits for the set's outcome, and two sets lock their common rows in the
    /// same (canonical) order. A deadlock InnoDB breaks by rolling the set back (new names'
    /// duplicate-key inserts can make one) is a busy member, as for a share.
    ///
    /// Cancel safety: detached as a single attempt; a caller gone before the commit rolls the
    /// set back, and a set committed for a caller gone is released in the background.
    pub(crate) async fn try_set(
        &self,
        reqs: &[AcquireRequest],
    ) -> Result<lockcore::backend::SetAttempt> {
        for r in reqs {
            self.check_name(&r.name)?;
        }
        let sql = self.sql.clone();
        let members = crate::SetMember::of(reqs);
        let leases: Vec<MyLease> = reqs.iter().map(|r| self.lease(r, 0)).collect();
        let conns = self.conns.clone();
        let bound = self.conns.bound();
        let sent_at = Instant::now();
        let attempt = move |gone: lockcore::backend::CallerGone| async move {
            let reply = conns
                .run_unless_gone(&gone, bound, "acquiring a set of leases", |c| {
                    let (sql, members, gone) = (sql.clone(), members.clone(), gone.clone());
                    async move { set_tx(c, &sql, &members, &gone).await }.boxed()
                })
                .await;
            match reply? {
                None => Err(crate::set_abandoned()),
                Some(found) => found?.into_won(leases, MyLease::with_fencing),
            }
        };
        crate::run_set_detached(reqs, sent_at, Some(bound), attempt).await
    }
}

/// The transaction of [`MyBackend::try_set`]: committed only when every member was taken.
async fn set_tx(
    c: &mut MySqlConnection,
    sql: &Sql,
    members: &[crate::SetMember],
    gone: &lockcore::backend::CallerGone,
) -> sqlx::Result<Result<crate::SetFound>> {
    let mut tx = c.begin().await?;
    let mut fences = Vec::with_capacity(members.len());
    for (i, m) in members.iter().enumerate() {
        let ttl_us = m.ttl.as_micros() as u64;
        let name = m.name.as_str();
        let reply = lease_acquire_query(&sql.lease_acquire, name, &m.token, ttl_us, &m.holder, 0)
            .execute(&mut *tx)
            .await;
        let id = match reply {
            // A member that created its row was judged before the row existed: the row lock
            // it may have missed holds the key (see `crate::mysql_exclusion`).
            Ok(r)
                if r.rows_affected() == 1
                    && !matches!(r.last_insert_id(), 0 | HELD_BY_READERS | HELD_BY_PERMITS) =>
            {
                match key_used(&mut tx, sql, name).await {
                    Ok(true) => Ok(0),
                    Ok(false) => Ok(r.last_insert_id()),
                    Err(e) => Err(e),
                }
            }
            r => r.map(|r| r.last_insert_id()),
        };
        let found = match id {
            Ok(HELD_BY_PERMITS) => Err(crate::shares::conflict(LockMode::Exclusive)),
            Ok(0 | HELD_BY_READERS) => Ok(crate::SetFound::Busy(i)),
            // ER_LOCK_DEADLOCK: InnoDB rolled the whole set back.
            Err(e) if error_number(&e) == Some(1213) => Ok(crate::SetFound::Busy(i)),
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e);
            }
            Ok(fence) => {
                fences.push(fence);
                continue;
            }
        };
        tx.rollback().await?;
        return Ok(found);
    }
    if gone.is_gone() {
        tx.rollback().await?;
        return Ok(Ok(crate::SetFound::Abandoned));
    }
    tx.commit().await?;
    Ok(Ok(crate::SetFound::Won(fences)))
}
