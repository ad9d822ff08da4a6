//! PostgreSQL: row locks (`SELECT ... FOR UPDATE`, sequence fencing) and leases (one upsert,
//! LISTEN/NOTIFY wake-ups).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{AcquireRequest, Acquired, Lease};
use lockcore::{Error, Instant, LockName, OwnerToken, Result};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Postgres};
use tokio::sync::{OnceCell, broadcast, oneshot};

use crate::config::{Config, Strategy};
use crate::rowlock::{Pending, RowLease, exec};
use crate::{db_code, guard_timeout, map_err};

/// SQLSTATE lock_not_available: NOWAIT refused or lock_timeout ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The longest a lease waiter sleeps without a notification (the safety net for a lost NOTIFY).
const SAFETY_POLL: Duration = Duration::from_millis(500);

struct Sql {
    insert_row: String,
    lock_nowait: String,
    lock_wait: String,
    lease_acquire: String,
    lease_extend: String,
    lease_release: String,
    revoke_lease: String,
    revoke_row: String,
}

pub(crate) struct PgBackend {
    config: Config,
    pool: PgPool,
    admin: PgPool,
    sql: Arc<Sql>,
    /// Server has `client_connection_check_interval` (14+): a waiter whose client is gone
    /// leaves the lock queue within 250 ms.
    check_interval: bool,
    wakeups: OnceCell<Option<Arc<Wakeups>>>,
}

/// Release notifications of this client's table, fanned out to its waiters. `None` means
/// "maybe anything" (the listener reconnected and may have missed some).
struct Wakeups {
    tx: broadcast::Sender<Option<Arc<str>>>,
    _stop: oneshot::Sender<()>,
}

impl PgBackend {
    pub(crate) async fn connect(config: &Config) -> Result<PgBackend> {
        let opts = PgConnectOptions::from_str(&config.sqlx_url).map_err(|e| {
            Error::invalid_config(config.scrub(format!("invalid postgres URL: {e}")))
        })?;
        let pool = PgPoolOptions::new()
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
            .map_err(|e| map_err(config, "connecting to postgres", e))?;
        let admin = PgPoolOptions::new()
            .max_connections(2)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(30))
            .connect_lazy_with(opts);
        let t = &config.table;
        let seq = format!("{}_fseq", &t[..t.len().min(57)]);
        // One implicit transaction; the advisory lock serialises concurrent first connects
        // (CREATE ... IF NOT EXISTS can still collide on the catalog otherwise).
        let ddl = format!(
            "SELECT pg_advisory_xact_lock(hashtext('locksmith ddl')); \
             CREATE TABLE IF NOT EXISTS {t} (name TEXT PRIMARY KEY, owner TEXT, \
               fence BIGINT NOT NULL DEFAULT 0, expires_at TIMESTAMPTZ NOT NULL DEFAULT 'epoch'); \
             CREATE SEQUENCE IF NOT EXISTS {seq}"
        );
        sqlx::raw_sql(AssertSqlSafe(ddl))
            .execute(&pool)
            .await
            .map_err(|e| map_err(config, "creating the lock table", e))?;
        let version: String = sqlx::query_scalar("SELECT current_setting('server_version_num')")
            .fetch_one(&pool)
            .await
            .map_err(|e| map_err(config, "reading the server version", e))?;
        let check_interval = version.parse::<u32>().unwrap_or(0) >= 140000;
        // The subquery takes the row lock first; nextval runs on the locked row only, so each
        // holder's token is drawn after it won (sequences are never rolled back, so a holder whose
        // transaction died still consumed its number).
        let lock = |suffix: &str| {
            format!(
                "SELECT nextval('{seq}') FROM (SELECT name FROM {t} WHERE name = $1 FOR UPDATE{suffix}) s"
            )
        };
        let sql = Sql {
            insert_row: format!("INSERT INTO {t} (name) VALUES ($1) ON CONFLICT (name) DO NOTHING"),
            lock_nowait: lock(" NOWAIT"),
            lock_wait: lock(""),
            // One statement: insert, or take over an expired (or released) row, bumping the
            // fencing counter. The second column is the current holder's remaining time, from
            // the statement's snapshot, for the waiter's wake-up.
            lease_acquire: format!(
                "WITH won AS (\
                   INSERT INTO {t} AS l (name, owner, fence, expires_at) \
                   VALUES ($1, $2, 1, clock_timestamp() + $3::float8 * interval '1 microsecond') \
                   ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, fence = l.fence + 1, \
                     expires_at = EXCLUDED.expires_at \
                   WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp() \
                   RETURNING l.fence) \
                 SELECT (SELECT fence FROM won) AS fence, \
                   (SELECT EXTRACT(EPOCH FROM (expires_at - clock_timestamp()))::float8 \
                      FROM {t} WHERE name = $1 AND owner IS NOT NULL) AS remaining"
            ),
            lease_extend: format!(
                "UPDATE {t} SET expires_at = clock_timestamp() + $3::float8 * interval '1 microsecond' \
                 WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp()"
            ),
            // The row (and its fencing counter) stays; the notification goes out on commit.
            lease_release: format!(
                "WITH r AS (UPDATE {t} SET owner = NULL, expires_at = 'epoch' \
                   WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp() RETURNING name), \
                 n AS (SELECT pg_notify($3, name) FROM r) \
                 SELECT (SELECT count(*) FROM r) + 0 * (SELECT count(*) FROM n)"
            ),
            revoke_lease: format!(
                "WITH r AS (UPDATE {t} SET owner = NULL, expires_at = 'epoch' \
                   WHERE name = $1 AND owner IS NOT NULL AND expires_at > clock_timestamp() RETURNING name), \
                 n AS (SELECT pg_notify($2, name) FROM r) \
                 SELECT (SELECT count(*) FROM r) + 0 * (SELECT count(*) FROM n)"
            ),
            // A FOR UPDATE locker stamps its transaction id into the row's xmax and holds an
            // exclusive lock on that id: that finds the holding backend.
            revoke_row: format!(
                "SELECT pg_terminate_backend(l.pid) FROM {t} t JOIN pg_locks l \
                   ON l.locktype = 'transactionid' AND l.transactionid = t.xmax \
                   AND l.mode = 'ExclusiveLock' AND l.granted \
                 WHERE t.name = $1 AND l.pid <> pg_backend_pid()"
            ),
        };
        Ok(PgBackend {
            config: config.clone(),
            pool,
            admin,
            sql: Arc::new(sql),
            check_interval,
            wakeups: OnceCell::new(),
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
            Strategy::Lease => Ok(self.lease_attempt(req).await?.0),
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
            Strategy::Lease => self.lease_wait(req, deadline).await,
        }
    }

    pub(crate) async fn revoke(&self, name: &LockName) -> Result<bool> {
        match self.config.strategy {
            Strategy::Lease => {
                let n: i64 = sqlx::query_scalar(AssertSqlSafe(self.sql.revoke_lease.clone()))
                    .bind(name.as_str())
                    .bind(&self.config.table)
                    .fetch_one(&self.admin)
                    .await
                    .map_err(|e| self.err("revoking a lease", e))?;
                Ok(n > 0)
            }
            Strategy::RowLock => {
                let killed: Vec<bool> =
                    sqlx::query_scalar(AssertSqlSafe(self.sql.revoke_row.clone()))
                        .bind(name.as_str())
                        .fetch_all(&self.admin)
                        .await
                        .map_err(|e| self.err("terminating a row lock's holder", e))?;
                Ok(killed.into_iter().any(|k| k))
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
        // From here on, an error or a cancellation closes the connection (and so its
        // transaction and its place in the lock queue) instead of returning it to the pool.
        let mut pending = Pending::<Postgres>::new(conn);
        let guard_ms = guard_timeout(req.ttl).as_millis();
        for _ in 0..3 {
            let mut begin =
                format!("BEGIN; SET LOCAL idle_in_transaction_session_timeout = '{guard_ms}ms'");
            if !nowait {
                // 0 = no timeout. The waiter sleeps in the server's queue; lock_timeout ends it at
                // the deadline.
                let ms = deadline.map_or(0, |d| {
                    d.saturating_duration_since(Instant::now())
                        .as_millis()
                        .max(1)
                });
                begin.push_str(&format!("; SET LOCAL lock_timeout = '{ms}ms'"));
            }
            if self.check_interval {
                begin.push_str("; SET LOCAL client_connection_check_interval = '250ms'");
            }
            exec::<Postgres>(pending.conn(), begin)
                .await
                .map_err(|e| self.err("beginning the lock transaction", e))?;
            let sql = if nowait {
                &self.sql.lock_nowait
            } else {
                &self.sql.lock_wait
            };
            let sent_at = Instant::now();
            let res: sqlx::Result<Option<i64>> = sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                .bind(req.name.as_str())
                .fetch_optional(pending.conn())
                .await;
            match res {
                Ok(Some(fence)) => {
                    // After a wait in the server's queue the grant came long after the request:
                    // the validity is counted from a round trip sent after the grant instead
                    // (the lock, and the server's idle guard, hold from then on).
                    let sent_at = if sent_at.elapsed() > Duration::from_millis(20) {
                        let at = Instant::now();
                        sqlx::Connection::ping(pending.conn())
                            .await
                            .map_err(|e| self.err("checking the holding connection", e))?;
                        at
                    } else {
                        sent_at
                    };
                    let conn = pending.disarm();
                    let lease = RowLease::start(
                        conn,
                        req.name.clone(),
                        fence as u64,
                        req.ttl,
                        req.lost.clone(),
                        pg_guard_sql,
                        "postgres",
                    );
                    return Ok(Some(Acquired::new(lease, sent_at)));
                }
                Ok(None) => {
                    // No row yet: create it outside the holding transaction, then lock it.
                    exec::<Postgres>(pending.conn(), "ROLLBACK".into())
                        .await
                        .map_err(|e| self.err("rolling back", e))?;
                    sqlx::query(AssertSqlSafe(self.sql.insert_row.clone()))
                        .bind(req.name.as_str())
                        .execute(pending.conn())
                        .await
                        .map_err(|e| self.err("creating the lock row", e))?;
                }
                Err(e) if db_code(&e).as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                    exec::<Postgres>(pending.conn(), "ROLLBACK".into())
                        .await
                        .map_err(|e| self.err("rolling back", e))?;
                    let _conn = pending.disarm();
                    return Ok(None);
                }
                Err(e) => return Err(self.err("locking the lock row", e)),
            }
        }
        Err(Error::new(
            lockcore::ErrorKind::Backend,
            "the lock row disappeared repeatedly while being locked",
        ))
    }

    // ---- lease ----

    /// One attempt: the lease, or the current holder's remaining time if the database knows it.
    async fn lease_attempt(
        &self,
        req: &AcquireRequest,
    ) -> Result<(Option<Acquired>, Option<Duration>)> {
        let token = req.token.to_hex();
        let sent_at = Instant::now();
        let (fence, remaining): (Option<i64>, Option<f64>) =
            sqlx::query_as(AssertSqlSafe(self.sql.lease_acquire.clone()))
                .bind(req.name.as_str())
                .bind(&token)
                .bind(req.ttl.as_micros() as f64)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.err("acquiring a lease", e))?;
        match fence {
            Some(f) => Ok((
                Some(Acquired::new(
                    PgLease {
                        pool: self.pool.clone(),
                        config: self.config.clone(),
                        sql: self.sql.clone(),
                        name: req.name.clone(),
                        token: req.token,
                        fencing: f as u64,
                    },
                    sent_at,
                )),
                None,
            )),
            None => Ok((
                None,
                remaining
                    .filter(|r| r.is_finite() && *r > 0.0)
                    .map(|r| Duration::from_secs_f64(r.min(1e6))),
            )),
        }
    }

    async fn wakeups(&self) -> Option<Arc<Wakeups>> {
        self.wakeups
            .get_or_init(|| async {
                match self.start_listener().await {
                    Ok(w) => Some(Arc::new(w)),
                    Err(e) => {
                        tracing::warn!(error = %self.config.scrub(e.to_string()), "LISTEN failed; lease waiters will poll");
                        None
                    }
                }
            })
            .await
            .clone()
    }

    async fn start_listener(&self) -> sqlx::Result<Wakeups> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(&self.config.table).await?;
        let (tx, _) = broadcast::channel(256);
        let (stop, mut stopped) = oneshot::channel::<()>();
        let fanout = tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    r = listener.try_recv() => match r {
                        Ok(Some(n)) => { let _ = fanout.send(Some(Arc::from(n.payload()))); }
                        // Reconnected: notifications may have been missed.
                        Ok(None) => { let _ = fanout.send(None); }
                        Err(_) => {
                            let _ = fanout.send(None);
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                }
            }
        });
        Ok(Wakeups { tx, _stop: stop })
    }

    /// Waits for a lease: tries, then sleeps until a release NOTIFY for this name, the holder's
    /// expiry (as the database computed it), a capped safety poll, or the deadline.
    async fn lease_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        let wakeups = self.wakeups().await;
        // Subscribed before the first attempt, so a release between an attempt and the sleep
        // is not missed.
        let mut rx = wakeups.as_ref().map(|w| w.tx.subscribe());
        let backoff = lockcore::backend::Backoff::for_ttl(req.ttl);
        let mut attempt = 0u32;
        loop {
            let (acquired, remaining) = self.lease_attempt(req).await?;
            if acquired.is_some() {
                return Ok(acquired);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let cap = if rx.is_some() {
                SAFETY_POLL
            } else {
                backoff.delay(attempt)
            };
            let mut wake = now + remaining.map_or(cap, |r| (r + Duration::from_millis(1)).min(cap));
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            attempt = attempt.saturating_add(1);
            match rx.as_mut() {
                None => tokio::time::sleep_until(wake).await,
                Some(rx) => loop {
                    tokio::select! {
                        m = rx.recv() => match m {
                            Ok(Some(n)) if &*n == req.name.as_str() => break,
                            Ok(Some(_)) => continue,
                            Ok(None) | Err(broadcast::error::RecvError::Lagged(_)) => break,
                            Err(broadcast::error::RecvError::Closed) => {
                                tokio::time::sleep_until(wake).await;
                                break;
                            }
                        },
                        _ = tokio::time::sleep_until(wake) => break,
                    }
                },
            }
        }
    }
}

/// Resets the server-side guard: a holder silent for `ttl + 1 s` has its session ended.
fn pg_guard_sql(ttl: Duration) -> String {
    format!(
        "SET LOCAL idle_in_transaction_session_timeout = '{}ms'",
        guard_timeout(ttl).as_millis()
    )
}

struct PgLease {
    pool: PgPool,
    config: Config,
    sql: Arc<Sql>,
    name: LockName,
    token: OwnerToken,
    fencing: u64,
}

impl fmt::Debug for PgLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLease")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("fencing", &self.fencing)
            .finish()
    }
}

#[lockcore::backend::async_trait]
impl Lease for PgLease {
    fn fencing_token(&self) -> Option<u64> {
        Some(self.fencing)
    }

    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        let r = sqlx::query(AssertSqlSafe(self.sql.lease_extend.clone()))
            .bind(self.name.as_str())
            .bind(self.token.to_hex())
            .bind(ttl.as_micros() as f64)
            .execute(&self.pool)
            .await
            .map_err(|e| map_err(&self.config, "extending a lease", e))?;
        crate::owner_checked(r.rows_affected() as u64)?;
        Ok(ttl)
    }

    async fn release(&self) -> Result<()> {
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(self.sql.lease_release.clone()))
            .bind(self.name.as_str())
            .bind(self.token.to_hex())
            .bind(&self.config.table)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| map_err(&self.config, "releasing a lease", e))?;
        crate::owner_checked(n as u64)
    }
}
