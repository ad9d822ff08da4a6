//! MySQL / MariaDB: row locks (`SELECT ... FOR UPDATE [NOWAIT | WAIT n]`, fencing from a
//! counter row updated in autocommit on another connection) and leases (upsert, then read back).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{AcquireRequest, Acquired, Lease};
use lockcore::{Error, Instant, LockName, OwnerToken, Result};
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlDatabaseError, MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Row};

use crate::config::{Config, Strategy};
use crate::rowlock::{Pending, RowLease, exec};
use crate::{guard_timeout, map_err};

/// ER_LOCK_WAIT_TIMEOUT (also what MariaDB's NOWAIT / WAIT n raise) and MySQL 8's ER_LOCK_NOWAIT.
const LOCK_BUSY: [u16; 2] = [1205, 3572];
/// The longest single server-side wait; a wait without deadline is re-queued after it, so a
/// waiter whose client died (MySQL does not notice during a lock wait) leaves within it.
const WAIT_CHUNK_S: u64 = 5;

struct Sql {
    insert_row: String,
    lock_nowait: String,
    fence: String,
    holder: String,
    lease_upsert: String,
    lease_check: String,
    lease_extend: String,
    lease_release: String,
    revoke_lease: String,
}

pub(crate) struct MyBackend {
    config: Config,
    pool: MySqlPool,
    admin: MySqlPool,
    sql: Arc<Sql>,
}

/// The key of a name's fencing-counter row: a control character never starts a valid lock
/// name, so it cannot collide with a lock row.
fn counter_key(name: &LockName) -> String {
    format!("\u{1}{}", name.as_str())
}

fn error_number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<MySqlDatabaseError>())
        .map(|d| d.number())
}

impl MyBackend {
    pub(crate) async fn connect(config: &Config) -> Result<MyBackend> {
        let opts = MySqlConnectOptions::from_str(&config.sqlx_url)
            .map_err(|e| Error::invalid_config(config.scrub(format!("invalid mysql URL: {e}"))))?;
        let pool = MySqlPoolOptions::new()
            // No ping before every checkout: that would add a round trip to every lock
            // operation. A connection that died idle fails its next statement instead, which
            // surfaces as `Unavailable` (and sqlx drops it from the pool).
            .test_before_acquire(false)
            .max_connections(config.pool_max)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(30))
            .idle_timeout(Some(Duration::from_secs(120)))
            .connect_with(opts.clone())
            .await
            .map_err(|e| map_err(config, "connecting to mysql", e))?;
        let admin = MySqlPoolOptions::new()
            .max_connections(2)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(30))
            .connect_lazy_with(opts);
        let t = &config.table;
        // VARBINARY: names compare byte for byte (no case folding, no PAD SPACE). Expiry is
        // kept in UTC_TIMESTAMP(6), independent of session time zones.
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {t} (name VARBINARY(320) NOT NULL PRIMARY KEY, \
               owner CHAR(32) NULL, fence BIGINT UNSIGNED NOT NULL DEFAULT 0, \
               expires_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:01', \
               holder BIGINT UNSIGNED NULL) ENGINE=InnoDB"
        )))
        .execute(&pool)
        .await
        .map_err(|e| map_err(config, "creating the lock table", e))?;
        let expired = "owner IS NULL OR expires_at <= UTC_TIMESTAMP(6)";
        let sql = Sql {
            insert_row: format!("INSERT IGNORE INTO {t} (name) VALUES (?)"),
            lock_nowait: format!("SELECT 1 FROM {t} WHERE name = ? FOR UPDATE NOWAIT"),
            // LAST_INSERT_ID(expr) hands the new value back in the OK packet: one round trip.
            fence: format!(
                "INSERT INTO {t} (name, fence, holder) VALUES (?, 1, ?) \
                 ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1), holder = VALUES(holder)"
            ),
            holder: format!("SELECT holder FROM {t} WHERE name = ?"),
            // Assignments run left to right and see earlier ones: owner is decided first, and
            // the other columns follow only if it became ours (tokens are random, so the old
            // owner is never equal to ours).
            lease_upsert: format!(
                "INSERT INTO {t} (name, owner, fence, expires_at) \
                 VALUES (?, ?, 1, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                 ON DUPLICATE KEY UPDATE \
                   owner = IF({expired}, VALUES(owner), owner), \
                   fence = IF(owner = VALUES(owner), fence + 1, fence), \
                   expires_at = IF(owner = VALUES(owner), VALUES(expires_at), expires_at)"
            ),
            lease_check: format!("SELECT fence FROM {t} WHERE name = ? AND owner = ?"),
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
        };
        Ok(MyBackend {
            config: config.clone(),
            pool,
            admin,
            sql: Arc::new(sql),
        })
    }

    fn err(&self, what: &str, e: sqlx::Error) -> Error {
        map_err(&self.config, what, e)
    }

    pub(crate) async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(|e| self.err("SELECT 1", e))
    }

    pub(crate) async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        match self.config.strategy {
            Strategy::RowLock => self.row_acquire(req, None, true).await,
            Strategy::Lease => self.lease_attempt(req).await,
        }
    }

    pub(crate) async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        match self.config.strategy {
            Strategy::RowLock => {
                let nowait = deadline.is_some_and(|d| d <= Instant::now());
                self.row_acquire(req, deadline, nowait).await
            }
            // Leases poll: lib.rs drives lockcore's poller for them.
            Strategy::Lease => self.lease_attempt(req).await,
        }
    }

    pub(crate) async fn revoke(&self, name: &LockName) -> Result<bool> {
        match self.config.strategy {
            Strategy::Lease => {
                let r = sqlx::query(AssertSqlSafe(self.sql.revoke_lease.clone()))
                    .bind(name.as_str())
                    .execute(&self.admin)
                    .await
                    .map_err(|e| self.err("revoking a lease", e))?;
                Ok(r.rows_affected() > 0)
            }
            Strategy::RowLock => {
                let holder: Option<Option<u64>> =
                    sqlx::query_scalar(AssertSqlSafe(self.sql.holder.clone()))
                        .bind(counter_key(name))
                        .fetch_optional(&self.admin)
                        .await
                        .map_err(|e| self.err("finding a row lock's holder", e))?;
                let Some(id) = holder.flatten() else {
                    return Ok(false);
                };
                match sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {id}")))
                    .execute(&self.admin)
                    .await
                {
                    Ok(_) => Ok(true),
                    // ER_NO_SUCH_THREAD: the last holder is gone already.
                    Err(e) if error_number(&e) == Some(1094) => Ok(false),
                    Err(e) => Err(self.err("killing a row lock's holder", e)),
                }
            }
        }
    }

    // ---- row-lock ----

    async fn row_acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        nowait: bool,
    ) -> Result<Option<Acquired>> {
        let conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| self.err("taking a connection from the pool", e))?;
        let mut pending = Pending::<MySql>::new(conn);
        let guard_s = guard_timeout(req.ttl).as_secs_f64().ceil() as u64;
        let mut created = 0;
        loop {
            // READ COMMITTED: no gap locks on a missing row. The connection id lets a cancelled
            // waiter be killed (MySQL keeps a dead client's lock wait) and an admin find the holder.
            let rows = sqlx::raw_sql(AssertSqlSafe(format!(
                "SET SESSION idle_transaction_timeout = {guard_s}; \
                 SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION; \
                 SELECT CONNECTION_ID()"
            )))
            .fetch_all(pending.conn())
            .await
            .map_err(|e| self.err("beginning the lock transaction", e))?;
            let conn_id: u64 = rows
                .last()
                .and_then(|r| r.try_get::<u64, _>(0).ok())
                .ok_or_else(|| Error::new(lockcore::ErrorKind::Backend, "no CONNECTION_ID()"))?;
            let admin = self.admin.clone();
            pending.killer = Some(Box::new(move || {
                Box::pin(async move {
                    let _ = sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {conn_id}")))
                        .execute(&admin)
                        .await;
                })
            }));
            let (sql, wait_until) = if nowait {
                (self.sql.lock_nowait.clone(), None)
            } else {
                // WAIT takes whole seconds: round up, and cut the statement off client-side at
                // the deadline (the killer then ends the server-side wait).
                let secs = deadline.map_or(WAIT_CHUNK_S, |d| {
                    let rem = d.saturating_duration_since(Instant::now()).as_secs_f64();
                    (rem.ceil() as u64).clamp(1, WAIT_CHUNK_S)
                });
                (
                    format!(
                        "SELECT 1 FROM {} WHERE name = ? FOR UPDATE WAIT {secs}",
                        self.config.table
                    ),
                    deadline,
                )
            };
            let query = sqlx::query_scalar::<_, i32>(AssertSqlSafe(sql))
                .bind(req.name.as_str())
                .fetch_optional(pending.conn());
            let res = match wait_until {
                Some(d) => match tokio::time::timeout_at(d, query).await {
                    Ok(r) => r,
                    // Deadline: `pending` is dropped, killing the wait and closing the connection.
                    Err(_) => return Ok(None),
                },
                None => query.await,
            };
            match res {
                Ok(Some(_)) => {
                    // Won. Draw the fencing token in autocommit on another connection, so it is
                    // never rolled back with the holding transaction, then check the holding
                    // connection survived the draw: the lock was ours throughout, so the token
                    // is above every earlier holder's.
                    let r = sqlx::query(AssertSqlSafe(self.sql.fence.clone()))
                        .bind(counter_key(&req.name))
                        .bind(conn_id)
                        .execute(&self.admin)
                        .await
                        .map_err(|e| self.err("drawing a fencing token", e))?;
                    let fence = if r.rows_affected() == 1 {
                        1
                    } else {
                        r.last_insert_id()
                    };
                    // The validity counts from this round trip, sent after the grant (the lock
                    // may have been granted long after the request, following a wait).
                    let sent_at = Instant::now();
                    pending
                        .conn()
                        .ping()
                        .await
                        .map_err(|e| self.err("checking the holding connection", e))?;
                    let conn = pending.disarm();
                    let lease = RowLease::start(
                        conn,
                        req.name.clone(),
                        fence,
                        req.ttl,
                        req.lost.clone(),
                        my_guard_sql,
                        "mysql",
                    );
                    return Ok(Some(Acquired::new(lease, sent_at)));
                }
                Ok(None) => {
                    exec::<MySql>(pending.conn(), "ROLLBACK".into())
                        .await
                        .map_err(|e| self.err("rolling back", e))?;
                    created += 1;
                    if created > 3 {
                        return Err(Error::new(
                            lockcore::ErrorKind::Backend,
                            "the lock row disappeared repeatedly while being locked",
                        ));
                    }
                    sqlx::query(AssertSqlSafe(self.sql.insert_row.clone()))
                        .bind(req.name.as_str())
                        .execute(pending.conn())
                        .await
                        .map_err(|e| self.err("creating the lock row", e))?;
                }
                Err(e) if error_number(&e).is_some_and(|n| LOCK_BUSY.contains(&n)) => {
                    exec::<MySql>(pending.conn(), "ROLLBACK".into())
                        .await
                        .map_err(|e| self.err("rolling back", e))?;
                    if nowait || deadline.is_some_and(|d| Instant::now() >= d) {
                        pending.killer = None;
                        let _conn = pending.disarm();
                        return Ok(None);
                    }
                    // A chunk of a longer wait ran out: queue again.
                }
                Err(e) => return Err(self.err("locking the lock row", e)),
            }
        }
    }

    // ---- lease ----

    async fn lease_attempt(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        let token = req.token.to_hex();
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| self.err("taking a connection from the pool", e))?;
        let sent_at = Instant::now();
        sqlx::query(AssertSqlSafe(self.sql.lease_upsert.clone()))
            .bind(req.name.as_str())
            .bind(&token)
            .bind(req.ttl.as_micros() as u64)
            .execute(&mut *conn)
            .await
            .map_err(|e| self.err("acquiring a lease", e))?;
        // Whether the upsert made it ours: the row says so (committed, and nobody can take over
        // a lease of ours before it expires).
        let fence: Option<u64> = sqlx::query_scalar(AssertSqlSafe(self.sql.lease_check.clone()))
            .bind(req.name.as_str())
            .bind(&token)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| self.err("reading a lease", e))?;
        Ok(fence.map(|fencing| {
            Acquired::new(
                MyLease {
                    pool: self.pool.clone(),
                    config: self.config.clone(),
                    sql: self.sql.clone(),
                    name: req.name.clone(),
                    token: req.token,
                    fencing,
                },
                sent_at,
            )
        }))
    }
}

fn my_guard_sql(ttl: Duration) -> String {
    format!(
        "SET SESSION idle_transaction_timeout = {}",
        guard_timeout(ttl).as_secs_f64().ceil() as u64
    )
}

struct MyLease {
    pool: MySqlPool,
    config: Config,
    sql: Arc<Sql>,
    name: LockName,
    token: OwnerToken,
    fencing: u64,
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

#[lockcore::backend::async_trait]
impl Lease for MyLease {
    fn fencing_token(&self) -> Option<u64> {
        Some(self.fencing)
    }

    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        let r = sqlx::query(AssertSqlSafe(self.sql.lease_extend.clone()))
            .bind(ttl.as_micros() as u64)
            .bind(self.name.as_str())
            .bind(self.token.to_hex())
            .execute(&self.pool)
            .await
            .map_err(|e| map_err(&self.config, "extending a lease", e))?;
        // FOUND_ROWS is on: this counts matched rows, so an extend within the same microsecond
        // still reports 1.
        crate::owner_checked(r.rows_affected() as u64)?;
        Ok(ttl)
    }

    async fn release(&self) -> Result<()> {
        let r = sqlx::query(AssertSqlSafe(self.sql.lease_release.clone()))
            .bind(self.name.as_str())
            .bind(self.token.to_hex())
            .execute(&self.pool)
            .await
            .map_err(|e| map_err(&self.config, "releasing a lease", e))?;
        crate::owner_checked(r.rows_affected() as u64)
    }
}
