//! PostgreSQL: row locks (a session advisory lock plus the lock row's committed fencing counter,
//! one statement) and leases (read first, then one conditional upsert; LISTEN/NOTIFY wake-ups).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use lockcore::backend::{
    AcquireRequest, Acquired, CancelCleanUp, CleanUpIfCancelled, CleanUpTask, Revocations,
};
use lockcore::{Error, Instant, LockInfo, LockMode, LockName, Result, Share};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::{OnceCell, broadcast, oneshot};

use crate::config::{Parsed, Strategy};
use crate::conns::{Checked, Conns, is_conn_err};
use crate::rowlock::guard_timeout;
use crate::rowlock::{Holding, RowLease, RowLockClient, RowWait};
use crate::sql_errors::{db_code, map_err};

mod ddl;
pub(crate) mod exclusion;
mod handover;
mod lease;
mod lease_wait;
mod names;
mod revocation;
mod rowlock;
mod statements;

/// SQLSTATE lock_not_available: lock_timeout ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The longest a lease waiter sleeps without a notification (the safety net for a lost NOTIFY).
const SAFETY_POLL: Duration = Duration::from_millis(500);

/// How far ahead a lease waiter announces itself (it announces again when that passes).
const WAIT_MARK: Duration = Duration::from_secs(30);

/// The longest a queued exclusive lease waiter sleeps without a notification: a release names
/// only the queue's head, so the others' polls are a safety net (a lost NOTIFY, a head that
/// died), each a request; every poll also renews the waiter's queue entry.
const QUEUE_POLL: Duration = Duration::from_secs(2);

/// How long a queue entry lives past its waiter's last attempt (judged on the server's clock):
/// long enough for the polls in between on a loaded machine, and the longest a crashed
/// waiter at the head of the queue keeps a freed lock from the next (a cancelled one removes
/// its entry at once).
const QUEUE_ENTRY_TTL: Duration = Duration::from_secs(6);

/// A NOTIFY payload naming one queued waiter (its owner token after this byte), not a lock
/// name: no lock name starts with it (names have no control characters).
const WAITER_PREFIX: char = '\u{1}';

type PgConns = Conns<PgConnectOptions, ()>;
pub(crate) use names::{queue_table, share_function};
use statements::Sql;

pub(crate) struct PgBackend {
    config: Parsed,
    conns: Arc<PgConns>,
    sql: Arc<Sql>,
    /// The statements of the leases this client holds.
    held: Arc<lease::PgHeld>,
    /// This client's row-lock waiters' queues and holders' health checks.
    rows: RowLockClient,
    listen_opts: PgConnectOptions,
    wakeups: OnceCell<Arc<Wakeups>>,
}

/// Release notifications of this client's table, fanned out to its waiters (revocation
/// notices go to the held leases instead, see `revocation`). `None` means "maybe anything"
/// (the listener reconnected and may have missed some).
struct Wakeups {
    tx: broadcast::Sender<Option<Arc<str>>>,
    _stop: oneshot::Sender<()>,
}

/// Every new connection: commits wait for the WAL flush (fencing tokens and leases must survive
/// a crash whatever the server's default), (PostgreSQL 14+) a waiter whose client is gone
/// leaves the lock queue within 250 ms, and (PostgreSQL 12+) the prepared statements run on
/// their generic plan, planned once per connection. Left to choose (`plan_cache_mode = auto`),
/// the server planned the lease statements (CTEs over the lock row and the queue, every one a
/// lookup by primary key, which a generic plan does as well) anew at every execution:
/// measured through sqlx on PostgreSQL 15, a lease `try_lock` took 520 µs and its release
/// 210 µs, 177 µs and 123 µs on the generic plan (most of the difference is planning).
fn setup(conn: &mut PgConnection) -> futures::future::BoxFuture<'_, sqlx::Result<()>> {
    async move {
        let mut sql = String::from("SET synchronous_commit = on");
        let version = conn.server_version_num().unwrap_or(0);
        if version >= 140000 {
            sql.push_str("; SET client_connection_check_interval = '250ms'");
        }
        if version >= 120000 {
            sql.push_str("; SET plan_cache_mode = force_generic_plan");
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
        let ddl = ddl::tables(t);
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
        // The share functions (see `ddl::share_functions`): an attempt and a release each one
        // round trip.
        let q = queue_table(t);
        let functions = ddl::share_functions(
            t,
            &share_function(t, "sacq"),
            &share_function(t, "srel"),
            &|chan, cond, but| handover::notify_head(&q, chan, cond, but),
        );
        conns
            .run(conns.bound(), "creating the share functions", move |c| {
                let functions = functions.clone();
                async move {
                    sqlx::raw_sql(AssertSqlSafe(functions))
                        .execute(&mut *c)
                        .await
                        .map(|_| ())
                }
                .boxed()
            })
            .await?;
        let sql = Arc::new(Sql::new(config, version));
        let held = Arc::new(lease::PgHeld {
            conns: conns.clone(),
            sql: sql.clone(),
            table: t.clone(),
            revocations: Arc::new(Revocations::default()),
        });

        let backend = PgBackend {
            config: config.clone(),
            conns,
            sql,
            held,
            rows: RowLockClient::default(),
            listen_opts: opts,
            wakeups: OnceCell::new(),
        };
        // Leases: the listener from the start, so that a revocation of a lease this client
        // holds finds it listening (see `revocation`). If it cannot start now, the first wait
        // tries again; until then a revoked lease is noticed at its next renewal.
        if config.strategy == Strategy::Lease {
            backend.wakeups(backend.conns.bound()).await;
        }
        Ok(backend)
    }

    /// This client's connections (for [`crate::probes`]).
    pub(crate) fn conns(&self) -> &PgConns {
        &self.conns
    }

    pub(crate) async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        match self.config.strategy {
            Strategy::RowLock => {
                let wait = RowWait::try_now();
                let attempt = self.row_acquire(req, wait);
                self.rows.in_turn(&req.name, wait, attempt).await
            }
            Strategy::Lease => Ok(self
                .lease_attempt(req, self.conns.bound(), false, false, None, None)
                .await?
                .0),
        }
    }

    pub(crate) async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        match self.config.strategy {
            Strategy::RowLock => {
                let wait = RowWait::until(deadline);
                let attempt = self.row_acquire(req, wait);
                self.rows.in_turn(&req.name, wait, attempt).await
            }
            Strategy::Lease => self.lease_wait(req, deadline).await,
        }
    }

    /// Waiters queued in the server for `name`: row-lock sessions waiting for the advisory
    /// lock, or exclusive lease waiters' queue entries.
    ///
    /// Cancel safe.
    pub(crate) async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        let (name, sql) = match self.config.strategy {
            Strategy::RowLock => (self.row_param(name), self.sql.queued_row.clone()),
            // Exclusive waiters' live queue entries.
            Strategy::Lease => (name.as_str().to_owned(), self.sql.queued_lease.clone()),
        };
        let what = "counting queued waiters";
        let (n,): (i64,) = self.conns.row_of(what, &sql, &name).await?;
        Ok(n.max(0) as usize)
    }

    /// One statement: held or free, TTL left (lease), waiters (the row lock's server queue, the
    /// lease's queue entries), the row's token
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
            Option<i64>,
        );
        let (n, sql) = (name.as_str().to_owned(), self.sql.inspect.clone());
        let (held, remaining, waiting, fence, holder, acquired_ms, readers): Row = self
            .conns
            .run(self.conns.bound(), "inspecting a lock", move |c| {
                sqlx::query_as(AssertSqlSafe(sql.clone()))
                    .bind(n.clone())
                    .fetch_one(c)
                    .boxed()
            })
            .await?;
        let waiters = waiting.map(|w| w.max(0) as usize);
        let lease = self.config.strategy == Strategy::Lease;
        if !held {
            if lease && let Some(info) = self.inspect_shares(name).await? {
                return Ok(info);
            }
            return Ok(LockInfo::free(name.clone(), waiters));
        }
        // Row-lock readers: the server knows their sessions, not which acquisition the row's
        // token and metadata are from (the last one that took a token, maybe gone): each is
        // listed without them.
        if let Some(readers) = readers.filter(|&r| r > 0) {
            let shares = vec![Share::new(None, None, None); readers as usize];
            return Ok(LockInfo::held(name.clone())
                .with_shares(shares)
                .with_mode(Some(LockMode::Shared))
                .with_waiters(waiters));
        }
        Ok(
            crate::inspect::held(name, fence, remaining, holder.as_deref(), acquired_ms)
                .with_waiters(waiters)
                .with_mode(Some(LockMode::Exclusive)),
        )
    }

    /// The live shares of a name (lease strategy), if any.
    ///
    /// Cancel safe.
    async fn inspect_shares(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let (what, sql) = ("inspecting shares", &self.sql.share_inspect);
        let rows: Vec<(String, i64, f64, Option<String>)> =
            self.conns.rows_of(what, sql, name.as_str()).await?;
        Ok(crate::shares::info(name, rows))
    }

    pub(crate) async fn revoke(&self, name: &LockName) -> Result<bool> {
        match self.config.strategy {
            Strategy::Lease => self.revoke_lease(name).await,
            Strategy::RowLock => {
                let param = self.row_param(name);
                let (what, sql) = ("terminating a row lock's holder", &self.sql.revoke_row);
                let killed: Vec<(bool,)> = self.conns.rows_of(what, sql, &param).await?;
                Ok(killed.into_iter().any(|(k,)| k))
            }
        }
    }
}
