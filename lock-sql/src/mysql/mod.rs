//! MariaDB (and MySQL 5.7+ for leases and `GET_LOCK`): row locks (a session `GET_LOCK` plus the
//! lock row's committed fencing counter, one statement) and leases (one conditional upsert per
//! attempt, the outcome read from the OK packet).

use crate::config::{Parsed, Strategy};
use crate::conns::{Checked, Conns, is_conn_err};
use crate::mysql::exclusion::RowOutcome;
use crate::mysql::procs::ShareCalls;
use crate::rowlock::guard_timeout;
use crate::rowlock::{HealthChecks, Holding, Queues, RowLease};
use crate::shares::Verdict;
use crate::sql_errors::map_err;
use futures::FutureExt;
use lockcore::backend::{AcquireRequest, Acquired, Background};
use lockcore::{Error, Instant, LockInfo, LockMode, LockName, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlDatabaseError};
use sqlx::{AssertSqlSafe, Connection};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

mod ddl;
mod exclusion;
mod lease;
mod procs;
mod rowlock;
mod shares;
mod statements;

use self::{lease::*, shares::*, statements::*};

/// What we know of a MariaDB session: its id (to kill its lock wait when a waiter is dropped)
/// and the `wait_timeout` (server-side idle guard, seconds) set on it, 0 for the default.
pub(crate) struct MyMeta {
    id: u64,
    guard_s: u64,
}

type MyConns = Conns<MySqlConnectOptions, MyMeta>;

pub(crate) struct MyBackend {
    config: Parsed,
    conns: Arc<MyConns>,
    sql: Arc<Sql>,
    /// The statements of the leases this client holds.
    held: Arc<MyHeld>,
    queues: Arc<Queues>,
    /// The health checks of this client's held row locks.
    health: Arc<HealthChecks>,
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
        let share_calls = ddl::create_schema(&conns, config).await?;
        let sql = Sql::new(config, share_calls);
        let sql = Arc::new(sql);
        let held = Arc::new(MyHeld {
            conns: conns.clone(),
            sql: sql.clone(),
        });
        Ok(MyBackend {
            config: config.clone(),
            conns,
            sql,
            held,
            queues: Arc::default(),
            health: Arc::default(),
        })
    }

    /// This client's connections (for [`crate::probes`]).
    pub(crate) fn conns(&self) -> &MyConns {
        &self.conns
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
                let (what, sql) = ("inspecting shares", &self.sql.share_inspect);
                let rows: Vec<(String, u64, i64, Option<String>)> =
                    self.conns.rows_of(what, sql, name.as_str()).await?;
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
                let (what, sql) = ("finding a row lock's holder", &self.sql.holder);
                let (holder,): (Option<i64>,) = self.conns.row_of(what, sql, &name).await?;
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
}
