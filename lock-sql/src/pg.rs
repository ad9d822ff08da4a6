//! PostgreSQL: row locks (a session advisory lock plus the lock row's committed fencing counter,
//! one statement) and leases (read first, then one conditional upsert; LISTEN/NOTIFY wake-ups).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use lockcore::backend::{AcquireRequest, Acquired, Lease, ReleaseIfCancelled};
use lockcore::{Error, Instant, LockInfo, LockName, OwnerToken, Result};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::{OnceCell, broadcast, oneshot};

use crate::config::{Parsed, Strategy};
use crate::conns::{Checked, Conns, is_conn_err};
use crate::rowlock::guard_timeout;
use crate::rowlock::{Holding, Queues, RowLease};
use crate::sql_errors::{db_code, map_err};

/// SQLSTATE lock_not_available: lock_timeout ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The longest a lease waiter sleeps without a notification (the safety net for a lost NOTIFY).
const SAFETY_POLL: Duration = Duration::from_millis(500);

/// How far ahead a lease waiter announces itself (it announces again when that passes).
const WAIT_MARK: Duration = Duration::from_secs(30);

type PgConns = Conns<PgConnectOptions, ()>;

struct Sql {
    row_try: String,
    row_wait: String,
    row_unlock: String,
    row_guard: String,
    revoke_row: String,
    queued_row: String,
    lease_acquire: String,
    lease_extend: String,
    lease_release: String,
    lease_wait_mark: String,
    revoke_lease: String,
    /// Held or free, token, TTL left, metadata and waiters of one name (per strategy).
    inspect: String,
}

pub(crate) struct PgBackend {
    config: Parsed,
    conns: Arc<PgConns>,
    sql: Arc<Sql>,
    queues: Arc<Queues>,
    listen_opts: PgConnectOptions,
    wakeups: OnceCell<Arc<Wakeups>>,
}

/// Release notifications of this client's table, fanned out to its waiters. `None` means
/// "maybe anything" (the listener reconnected and may have missed some).
struct Wakeups {
    tx: broadcast::Sender<Option<Arc<str>>>,
    _stop: oneshot::Sender<()>,
}

/// A stable 64-bit FNV-1a of the table name: the seed of the advisory-lock keys, so two lock
/// tables in one database never share a key.
pub(crate) fn table_seed(table: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in table.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

/// Every new connection: commits wait for the WAL flush (fencing tokens and leases must survive
/// a crash whatever the server's default), and (PostgreSQL 14+) a waiter whose client is gone
/// leaves the lock queue within 250 ms.
fn setup(conn: &mut PgConnection) -> futures::future::BoxFuture<'_, sqlx::Result<()>> {
    async move {
        let mut sql = String::from("SET synchronous_commit = on");
        if conn.server_version_num().unwrap_or(0) >= 140000 {
            sql.push_str("; SET client_connection_check_interval = '250ms'");
        }
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn).await?;
        Ok(())
    }
    .boxed()
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

impl PgBackend {
    pub(crate) async fn connect(config: &Parsed) -> Result<PgBackend> {
        let opts = PgConnectOptions::from_str(&config.sqlx_url).map_err(|e| {
            Error::invalid_config(config.scrub(format!("invalid postgres URL: {e}")))
        })?;
        Self::connect_with(config, opts).await
    }

    /// With connection settings the application already has (its pool's).
    pub(crate) async fn connect_with(config: &Parsed, opts: PgConnectOptions) -> Result<PgBackend> {
        let conns = Conns::new(opts.clone(), config, setup);
        let t = &config.table;
        let old_seq = format!("{}_fseq", &t[..t.len().min(57)]);
        // One implicit transaction; the advisory lock serialises concurrent first connects
        // (CREATE ... IF NOT EXISTS can still collide on the catalog otherwise). Nothing takes a
        // table lock when the table is already as it should be: row-lock waiters keep a ROW
        // EXCLUSIVE lock on it while they wait, which an ALTER TABLE would queue behind. Row-lock
        // tokens used to come from a sequence: fold it into the rows' counters once, so they
        // only grow.
        let ddl = format!(
            "SELECT pg_advisory_xact_lock(hashtext('locksmith ddl')); \
             CREATE TABLE IF NOT EXISTS {t} (name TEXT PRIMARY KEY, owner TEXT, \
               fence BIGINT NOT NULL DEFAULT 0, expires_at TIMESTAMPTZ NOT NULL DEFAULT 'epoch'); \
             DO $$ BEGIN \
               IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{t}'::regclass \
                   AND attname = 'wait_until' AND NOT attisdropped) THEN \
                 ALTER TABLE {t} ADD COLUMN wait_until TIMESTAMPTZ NOT NULL DEFAULT 'epoch'; \
               END IF; \
               IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{t}'::regclass \
                   AND attname = 'holder' AND NOT attisdropped) THEN \
                 ALTER TABLE {t} ADD COLUMN holder TEXT, ADD COLUMN acquired_at TIMESTAMPTZ; \
               END IF; \
               IF to_regclass('{old_seq}') IS NOT NULL THEN \
               UPDATE {t} SET fence = (SELECT last_value FROM {old_seq}) \
                 WHERE fence < (SELECT last_value FROM {old_seq}); \
               DROP SEQUENCE {old_seq}; END IF; END $$"
        );
        let bound = conns.bound();
        let version: i32 = conns
            .run(bound, "creating the lock table", move |c| {
                let ddl = ddl.clone();
                async move {
                    sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut *c).await?;
                    Ok(c.server_version_num().unwrap_or(0) as i32)
                }
                .boxed()
            })
            .await?;
        if config.strategy == Strategy::RowLock && version < 110000 {
            return Err(Error::unsupported(
                "strategy=row-lock needs PostgreSQL 11 or later (hashtextextended)",
            ));
        }
        // The server-side guard of a holder that stops talking (a wedged process):
        // idle_session_timeout, PostgreSQL 14+.
        let guard = version >= 140000;
        let seed = table_seed(t);
        // Under interop=sqlx, $1 of the row statements is sqlx's key as decimal text instead of
        // the name (see `row_param`).
        let interop = config.interop == Some(crate::Interop::Sqlx);
        let key = if interop {
            "($1::text)::int8".to_owned()
        } else {
            format!("hashtextextended($1, {seed})")
        };
        let set_guard = |p: &str| {
            if guard {
                format!("set_config('idle_session_timeout', {p}, false)")
            } else {
                format!("set_config('locksmith.ttl', {p}, false)")
            }
        };
        // The advisory lock is taken first (materialized CTE); then, holding it, the lock row's
        // counter is bumped and committed with the statement: the token is durable before the
        // caller sees it, and every later holder's is larger, across crashes too.
        // The holder's metadata rides in the same statement (`holder`: the parameter holding it).
        let fence_upsert = |from: &str, cond: &str, holder: &str| {
            format!(
                "INSERT INTO {t} AS r (name, fence, holder, acquired_at) \
                 SELECT $1, 1, {holder}::text, clock_timestamp() FROM {from} WHERE {cond} \
                 ON CONFLICT (name) DO UPDATE SET fence = r.fence + 1, holder = EXCLUDED.holder, \
                   acquired_at = EXCLUDED.acquired_at RETURNING r.fence"
            )
        };
        // Row lock: held while a session holds the advisory lock (the row keeps the last
        // holder's token and metadata); lease: while the row has an unexpired owner.
        let pg_lock_of = |granted: &str| {
            format!(
                "SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND {granted} \
                 AND l.objsubid = 1 \
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND ((l.classid::int8 << 32) | l.objid::int8) = {key}"
            )
        };
        let inspect = match config.strategy {
            Strategy::RowLock => format!(
                "SELECT EXISTS ({}) AS held, NULL::float8 AS remaining, \
                   (SELECT count(*) FROM ({}) w) AS waiting, r.fence, r.holder, \
                   (EXTRACT(EPOCH FROM r.acquired_at) * 1000)::float8 AS acquired_ms \
                 FROM (SELECT 1) one LEFT JOIN {t} r ON r.name = $1",
                pg_lock_of("l.granted"),
                pg_lock_of("NOT l.granted")
            ),
            Strategy::Lease => format!(
                "SELECT COALESCE(r.owner IS NOT NULL AND r.expires_at > clock_timestamp(), false) AS held, \
                   EXTRACT(EPOCH FROM (r.expires_at - clock_timestamp()))::float8 AS remaining, \
                   NULL::int8 AS waiting, r.fence, r.holder, \
                   (EXTRACT(EPOCH FROM r.acquired_at) * 1000)::float8 AS acquired_ms \
                 FROM (SELECT 1) one LEFT JOIN {t} r ON r.name = $1"
            ),
        };
        // Under interop=sqlx nothing is counted (a sqlx holder bumps no counter): the statement
        // answers 0 when the lock was taken, no row when it was not.
        let taken = |from: &str, cond: &str, holder: &str| {
            if interop {
                // The holder parameter is bound on every statement; nothing stores it here.
                format!(
                    "SELECT 0::int8 FROM {from} WHERE {cond} AND ({holder}::text IS NULL OR true)"
                )
            } else {
                fence_upsert(from, cond, holder)
            }
        };
        let sql = Sql {
            row_try: format!(
                "WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock({key}) AS got) {}",
                taken(
                    "l",
                    &format!("CASE WHEN got THEN {} IS NOT NULL END", set_guard("$2")),
                    "$3"
                )
            ),
            row_wait: format!(
                "WITH s AS MATERIALIZED (SELECT set_config('lock_timeout', $3, true) AS t), \
                 l AS MATERIALIZED (SELECT pg_advisory_lock({key}) IS NULL AS x FROM s) {}",
                taken("l", &format!("{} IS NOT NULL", set_guard("$2")), "$4")
            ),
            row_unlock: format!(
                "SELECT pg_advisory_unlock({key}) FROM (SELECT {}) g",
                set_guard("'0'")
            ),
            row_guard: format!("SELECT {}", set_guard("$1")),
            // The session holding the advisory lock of this name (a bigint key shows as
            // classid = high half, objid = low half, objsubid = 1).
            revoke_row: format!(
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks l \
                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                   AND ((l.classid::int8 << 32) | l.objid::int8) = {key} \
                   AND l.pid <> pg_backend_pid()"
            ),
            // Sessions waiting for the advisory lock of this name (each client's own waiters
            // queue in the client first: one per client shows here).
            queued_row: format!(
                "SELECT count(*) FROM pg_locks l \
                 WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1 \
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                   AND ((l.classid::int8 << 32) | l.objid::int8) = {key}"
            ),
            // Read first: the upsert runs only when the row is free (or already ours: a retry of
            // an attempt whose answer was lost), so a failed attempt writes and locks nothing.
            // The second column is the current holder's remaining time, for the waiter's sleep.
            lease_acquire: format!(
                "WITH cur AS MATERIALIZED (\
                   SELECT owner, EXTRACT(EPOCH FROM (expires_at - clock_timestamp()))::float8 AS remaining \
                   FROM {t} WHERE name = $1), \
                 busy AS MATERIALIZED (SELECT remaining FROM cur \
                   WHERE owner IS NOT NULL AND owner <> $2 AND remaining > 0), \
                 won AS (\
                   INSERT INTO {t} AS l (name, owner, fence, expires_at, holder, acquired_at) \
                   SELECT $1, $2, 1, clock_timestamp() + $3::float8 * interval '1 microsecond', \
                     $4::text, clock_timestamp() \
                   WHERE NOT EXISTS (SELECT 1 FROM busy) \
                   ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, fence = l.fence + 1, \
                     expires_at = EXCLUDED.expires_at, holder = EXCLUDED.holder, \
                     acquired_at = EXCLUDED.acquired_at \
                   WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp() OR l.owner = EXCLUDED.owner \
                   RETURNING l.fence) \
                 SELECT (SELECT fence FROM won) AS fence, (SELECT remaining FROM busy) AS remaining"
            ),
            lease_extend: format!(
                "UPDATE {t} SET expires_at = clock_timestamp() + $3::float8 * interval '1 microsecond' \
                 WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp()"
            ),
            // The row (and its fencing counter) stays; a notification goes out on commit only
            // if a waiter announced itself (NOTIFY serialises commits on a global queue lock).
            lease_release: format!(
                "WITH r AS (UPDATE {t} SET owner = NULL, expires_at = 'epoch' \
                   WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp() \
                   RETURNING name, wait_until), \
                 n AS (SELECT pg_notify($3, name) FROM r WHERE wait_until > clock_timestamp()) \
                 SELECT (SELECT count(*) FROM r) + 0 * (SELECT count(*) FROM n)"
            ),
            lease_wait_mark: format!(
                "UPDATE {t} SET wait_until = greatest(wait_until, \
                   clock_timestamp() + $2::float8 * interval '1 microsecond') WHERE name = $1"
            ),
            inspect,
            revoke_lease: format!(
                "WITH r AS (UPDATE {t} SET owner = NULL, expires_at = 'epoch' \
                   WHERE name = $1 AND owner IS NOT NULL AND expires_at > clock_timestamp() \
                   RETURNING name, wait_until), \
                 n AS (SELECT pg_notify($2, name) FROM r WHERE wait_until > clock_timestamp()) \
                 SELECT (SELECT count(*) FROM r) + 0 * (SELECT count(*) FROM n)"
            ),
        };
        Ok(PgBackend {
            config: config.clone(),
            conns,
            sql: Arc::new(sql),
            queues: Arc::default(),
            listen_opts: opts,
            wakeups: OnceCell::new(),
        })
    }

    /// The server's version string, for the report.
    pub(crate) async fn server_version(&self) -> Result<String> {
        self.conns
            .run(self.conns.bound(), "SHOW server_version", |c| {
                async move {
                    sqlx::query_scalar::<_, String>("SHOW server_version")
                        .fetch_one(c)
                        .await
                }
                .boxed()
            })
            .await
            .map(|v| format!("PostgreSQL {v}"))
    }

    pub(crate) async fn ping(&self) -> Result<()> {
        self.conns
            .run(self.conns.bound(), "SELECT 1", |c| {
                async move { sqlx::raw_sql("SELECT 1").execute(c).await.map(|_| ()) }.boxed()
            })
            .await
    }

    /// The bare primitive of the strategy: row-lock `pg_advisory_lock` then `pg_advisory_unlock`
    /// on one connection; lease: an insert and a delete of a row.
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
                        sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
                            .bind(&name)
                            .execute(&mut *c)
                            .await?;
                        sqlx::query("SELECT pg_advisory_unlock(hashtext($1))")
                            .bind(&name)
                            .execute(&mut *c)
                            .await?;
                    } else {
                        let bare = format!("{name}\u{1}bare");
                        sqlx::query(AssertSqlSafe(format!(
                            "INSERT INTO {t} (name, owner) VALUES ($1, 'bare')"
                        )))
                        .bind(&bare)
                        .execute(&mut *c)
                        .await?;
                        sqlx::query(AssertSqlSafe(format!("DELETE FROM {t} WHERE name = $1")))
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

    /// Transactions the server has finished (committed + rolled back), from
    /// `pg_stat_database`: every statement of this crate is one. Sessions publish their counts
    /// at most once a second, so read it a second after the load stops.
    pub(crate) async fn server_requests(&self) -> Result<u64> {
        self.conns
            .run(self.conns.bound(), "reading pg_stat_database", |c| {
                async move {
                    let n: i64 = sqlx::query_scalar(
                        "SELECT (sum(xact_commit) + sum(xact_rollback))::int8 FROM pg_stat_database",
                    )
                    .fetch_one(c)
                    .await?;
                    Ok(n as u64)
                }
                .boxed()
            })
            .await
    }

    pub(crate) async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        match self.config.strategy {
            Strategy::RowLock => self.row_acquire(req, None, true).await,
            Strategy::Lease => Ok(self.lease_attempt(req, self.conns.bound()).await?.0),
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

    /// Row-lock waiters queued in the server for `name`.
    ///
    /// Cancel safe.
    pub(crate) async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        if self.config.strategy != Strategy::RowLock {
            return Err(Error::unsupported(
                "lease waiters poll (woken by NOTIFY); they are not queued in the server",
            ));
        }
        let (name, sql) = (self.row_param(name), self.sql.queued_row.clone());
        let n: i64 = self
            .conns
            .run(self.conns.bound(), "counting queued waiters", move |c| {
                sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                    .bind(name.clone())
                    .fetch_one(c)
                    .boxed()
            })
            .await?;
        Ok(n.max(0) as usize)
    }

    /// One statement: held or free, TTL left (lease), waiters (row lock), the row's token
    /// and holder metadata, when acquired on the server's clock.
    ///
    /// Cancel safe.
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        type Row = (
            bool,
            Option<f64>,
            Option<i64>,
            Option<i64>,
            Option<String>,
            Option<f64>,
        );
        let (n, sql) = (name.as_str().to_owned(), self.sql.inspect.clone());
        let (held, remaining, waiting, fence, holder, acquired_ms): Row = self
            .conns
            .run(self.conns.bound(), "inspecting a lock", move |c| {
                sqlx::query_as(AssertSqlSafe(sql.clone()))
                    .bind(n.clone())
                    .fetch_one(c)
                    .boxed()
            })
            .await?;
        let waiters = waiting.map(|w| w.max(0) as usize);
        if !held {
            return Ok(LockInfo::free(name.clone(), waiters));
        }
        Ok(
            crate::inspect::held(name, fence, remaining, holder.as_deref(), acquired_ms)
                .with_waiters(waiters),
        )
    }

    pub(crate) async fn revoke(&self, name: &LockName) -> Result<bool> {
        let param = self.row_param(name);
        let name = name.as_str().to_owned();
        let table = self.config.table.clone();
        match self.config.strategy {
            Strategy::Lease => {
                let sql = self.sql.revoke_lease.clone();
                let n: i64 = self
                    .conns
                    .run(self.conns.bound(), "revoking a lease", move |c| {
                        sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                            .bind(name.clone())
                            .bind(table.clone())
                            .fetch_one(c)
                            .boxed()
                    })
                    .await?;
                Ok(n > 0)
            }
            Strategy::RowLock => {
                let name = param;
                let sql = self.sql.revoke_row.clone();
                let killed: Vec<bool> = self
                    .conns
                    .run(
                        self.conns.bound(),
                        "terminating a row lock's holder",
                        move |c| {
                            sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                                .bind(name.clone())
                                .fetch_all(c)
                                .boxed()
                        },
                    )
                    .await?;
                Ok(killed.into_iter().any(|k| k))
            }
        }
    }

    // ---- row-lock ----

    /// `$1` of the row statements: the name, or under `interop=sqlx` sqlx's key of it.
    fn row_param(&self, name: &LockName) -> String {
        match self.config.interop {
            Some(crate::Interop::Sqlx) => crate::interop::sqlx_key(name).to_string(),
            _ => name.as_str().to_owned(),
        }
    }

    /// One statement: the advisory lock (tried, or waited for until `deadline` with
    /// `lock_timeout`), the server-side guard, and the fencing counter bumped and committed.
    async fn row_acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        nowait: bool,
    ) -> Result<Option<Acquired>> {
        // This client's other waiters for the name queue here, not on the server.
        let _turn = if nowait {
            None
        } else {
            match self.queues.enter(req.name.as_str(), deadline).await {
                Some(t) => Some(t),
                None => return Ok(None),
            }
        };
        let guard_ms = ms(guard_timeout(req.ttl));
        let param = self.row_param(&req.name);
        let holder = req.holder.encode();
        loop {
            // Not counted against pool_max: a holder keeps this connection.
            let mut c = match self.conns.get(self.conns.bound_by(deadline), false).await {
                Ok(c) => c,
                Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
                Err(e) => return Err(e),
            };
            let q = if nowait {
                sqlx::query_scalar::<_, i64>(AssertSqlSafe(self.sql.row_try.clone()))
                    .bind(param.as_str())
                    .bind(&guard_ms)
                    .bind(&holder)
            } else {
                let timeout = deadline.map_or("0".to_owned(), |d| {
                    ms(d.saturating_duration_since(Instant::now()))
                });
                sqlx::query_scalar::<_, i64>(AssertSqlSafe(self.sql.row_wait.clone()))
                    .bind(param.as_str())
                    .bind(&guard_ms)
                    .bind(timeout)
                    .bind(&holder)
            };
            // A try is bounded by the operation timeout; a wait by the caller's deadline only
            // (the server's lock_timeout ends it there; this cuts off a database that stopped
            // answering). A cut-off or dropped statement closes the connection with `c`, and
            // the server frees whatever the session held.
            let bound = if nowait {
                Some(self.conns.bound())
            } else {
                deadline
            };
            let res = match bound {
                Some(b) => {
                    match tokio::time::timeout_at(b, q.fetch_optional(&mut c.conn.raw)).await {
                        Ok(r) => r,
                        Err(_) if !nowait => return Ok(None),
                        Err(_) => return Err(self.conns.timed_out("trying a row lock")),
                    }
                }
                None => q.fetch_optional(&mut c.conn.raw).await,
            };
            match res {
                Ok(Some(fence)) => {
                    // The validity counts from the answer, never the send: a grant comes after
                    // the previous holder's release (which its watchdog makes at its validity
                    // deadline), and a send (of a wait, or even of a try that crossed the
                    // release) can come before it. Safe without another round trip: the lock
                    // lives as long as the session, and the server's idle guard (ttl + 1 s)
                    // starts at the statement's end, before the answer arrives.
                    let answered_at = Instant::now();
                    c.hold();
                    let holding = PgHolding {
                        conn: Some(c),
                        conns: self.conns.clone(),
                        sql: self.sql.clone(),
                        name: param.clone(),
                    };
                    let lease = RowLease::start(
                        Box::new(holding),
                        req.name.clone(),
                        self.config.interop.is_none().then_some(fence as u64),
                        req.ttl,
                        req.lost.clone(),
                        "postgres",
                    );
                    return Ok(Some(Acquired::new(lease, answered_at)));
                }
                Ok(None) => {
                    // Tried and busy: nothing held, the session is clean.
                    self.conns.put(c);
                    return Ok(None);
                }
                Err(e) if db_code(&e).as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                    self.conns.put(c);
                    return Ok(None);
                }
                // A reused idle connection was dead (server restarted): once more, new.
                Err(e) if is_conn_err(&e) && c.reused => continue,
                Err(e) => return Err(map_err(&self.config, "taking a row lock", e)),
            }
        }
    }

    // ---- lease ----

    /// One attempt: the lease, or the current holder's remaining time if the database knows it.
    async fn lease_attempt(
        &self,
        req: &AcquireRequest,
        bound: Instant,
    ) -> Result<(Option<Acquired>, Option<Duration>)> {
        let token = req.token.to_hex();
        let holder = req.holder.encode();
        let sql = self.sql.lease_acquire.clone();
        let name = req.name.as_str().to_owned();
        let ttl = req.ttl.as_micros() as f64;
        let lease = |fencing| PgLease {
            conns: self.conns.clone(),
            sql: self.sql.clone(),
            table: self.config.table.clone(),
            name: req.name.clone(),
            token: req.token,
            fencing,
        };
        // A cancelled caller's attempt may still commit: released in the background then.
        let in_flight = ReleaseIfCancelled::arm(lease(0), &req.background);
        let sent_at = Instant::now();
        let reply: Result<(Option<i64>, Option<f64>)> = self
            .conns
            .run(bound, "acquiring a lease", move |c| {
                sqlx::query_as(AssertSqlSafe(sql.clone()))
                    .bind(name.clone())
                    .bind(token.clone())
                    .bind(ttl)
                    .bind(holder.clone())
                    .fetch_one(c)
                    .boxed()
            })
            .await;
        in_flight.disarm();
        let (fence, remaining) = reply?;
        match fence {
            Some(f) => Ok((Some(Acquired::new(lease(f as u64), sent_at)), None)),
            None => Ok((
                None,
                remaining
                    .filter(|r| r.is_finite() && *r > 0.0)
                    .map(|r| Duration::from_secs_f64(r.min(1e6))),
            )),
        }
    }

    /// The release notifications, started on first use; while LISTEN fails (the database is
    /// unreachable), waiters poll and the next wait tries again.
    async fn wakeups(&self, bound: Instant) -> Option<Arc<Wakeups>> {
        let started = self
            .wakeups
            .get_or_try_init(|| async {
                match tokio::time::timeout_at(bound, self.start_listener()).await {
                    Ok(Ok(w)) => Ok(Arc::new(w)),
                    Ok(Err(e)) => Err(self.config.scrub(e.to_string())),
                    Err(_) => Err("timed out".to_owned()),
                }
            })
            .await;
        match started {
            Ok(w) => Some(w.clone()),
            Err(e) => {
                tracing::warn!(error = %e, "LISTEN failed; lease waiters poll for now");
                None
            }
        }
    }

    async fn start_listener(&self) -> sqlx::Result<Wakeups> {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(self.config.op_timeout)
            .connect_lazy_with(self.listen_opts.clone());
        let mut listener = PgListener::connect_with(&pool).await?;
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

    /// Announces a waiter on `name` until `until` (releases then notify).
    async fn mark_waiting(
        &self,
        req: &AcquireRequest,
        until: Duration,
        bound: Instant,
    ) -> Result<()> {
        let sql = self.sql.lease_wait_mark.clone();
        let name = req.name.as_str().to_owned();
        let us = until.as_micros() as f64;
        self.conns
            .run(bound, "announcing a lease waiter", move |c| {
                sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(name.clone())
                    .bind(us)
                    .execute(c)
                    .map(|r| r.map(|_| ()))
                    .boxed()
            })
            .await
    }

    /// Waits for a lease: tries, then sleeps until a release NOTIFY for this name, the holder's
    /// expiry (as the database computed it), a capped safety poll, or the deadline. Every
    /// statement is bounded by the deadline and the operation timeout.
    async fn lease_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        let wakeups = self.wakeups(self.conns.bound_by(deadline)).await;
        // Subscribed before the first attempt, so a release between an attempt and the sleep
        // is not missed.
        let mut rx = wakeups.as_ref().map(|w| w.tx.subscribe());
        let backoff = lockcore::backend::Backoff::for_ttl(req.ttl);
        let mut attempt = 0u32;
        let mut marked_until: Option<Instant> = None;
        loop {
            let bound = self.conns.bound_by(deadline);
            let (acquired, remaining) = match self.lease_attempt(req, bound).await {
                Ok(r) => r,
                Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
                Err(e) => return Err(e),
            };
            if acquired.is_some() {
                return Ok(acquired);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            if rx.is_some() && marked_until.is_none_or(|m| m <= now + SAFETY_POLL) {
                let horizon = deadline.map_or(WAIT_MARK, |d| (d - now).min(WAIT_MARK))
                    + Duration::from_secs(1);
                match self
                    .mark_waiting(req, horizon, self.conns.bound_by(deadline))
                    .await
                {
                    Ok(()) => marked_until = Some(now + horizon),
                    Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
                    Err(e) => return Err(e),
                }
                // A release between the attempt and the mark sent no notification.
                continue;
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

/// A connection holding a PostgreSQL row lock (its session advisory lock).
struct PgHolding {
    conn: Option<Checked<PgConnectOptions, ()>>,
    conns: Arc<PgConns>,
    sql: Arc<Sql>,
    name: String,
}

impl PgHolding {
    fn raw(&mut self) -> &mut PgConnection {
        &mut self
            .conn
            .as_mut()
            .expect("holding connection present")
            .conn
            .raw
    }
}

#[lockcore::backend::async_trait]
impl Holding for PgHolding {
    async fn ping(&mut self) -> sqlx::Result<()> {
        self.raw().ping().await
    }

    async fn set_guard(&mut self, ttl: Duration) -> sqlx::Result<()> {
        let sql = self.sql.row_guard.clone();
        sqlx::query(AssertSqlSafe(sql))
            .bind(ms(guard_timeout(ttl)))
            .execute(self.raw())
            .await
            .map(|_| ())
    }

    async fn unlock(&mut self) -> sqlx::Result<bool> {
        let sql = self.sql.row_unlock.clone();
        let name = self.name.clone();
        sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(name)
            .fetch_one(self.raw())
            .await
    }

    fn recycle(mut self: Box<Self>) {
        if let Some(c) = self.conn.take() {
            self.conns.put(c);
        }
    }
}

struct PgLease {
    conns: Arc<PgConns>,
    sql: Arc<Sql>,
    table: String,
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
        let sql = self.sql.lease_extend.clone();
        let name = self.name.as_str().to_owned();
        let token = self.token.to_hex();
        let us = ttl.as_micros() as f64;
        let n = self
            .conns
            .run(self.conns.bound(), "extending a lease", move |c| {
                sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(name.clone())
                    .bind(token.clone())
                    .bind(us)
                    .execute(c)
                    .map(|r| r.map(|r| r.rows_affected()))
                    .boxed()
            })
            .await?;
        crate::sql_errors::owner_checked(n)?;
        Ok(ttl)
    }

    async fn release(&self) -> Result<()> {
        let sql = self.sql.lease_release.clone();
        let name = self.name.as_str().to_owned();
        let token = self.token.to_hex();
        let table = self.table.clone();
        let n: i64 = self
            .conns
            .run(self.conns.bound(), "releasing a lease", move |c| {
                sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                    .bind(name.clone())
                    .bind(token.clone())
                    .bind(table.clone())
                    .fetch_one(c)
                    .boxed()
            })
            .await?;
        crate::sql_errors::owner_checked(n as u64)
    }
}
