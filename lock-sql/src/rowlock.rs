//! What the row-lock strategy shares between PostgreSQL and MySQL: the connection of a pending
//! acquisition (closed if the acquisition does not complete), and the held lease (a connection
//! with an open transaction, watched by a health check).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use lockcore::backend::{Lease, LostNotifier};
use lockcore::{Error, LockName, LostReason, Result};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Connection, Database, Executor};
use tokio::sync::Mutex;

/// Run before a pending connection is dropped, to end a lock wait the server would not notice
/// the client has given up (MySQL keeps waiting after the socket closes).
pub(crate) type Killer = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// The connection of an acquisition in progress. If the acquisition does not complete (error,
/// cancellation, a dropped in-flight query), the connection's state is unknown: it is detached
/// from the pool and closed, never returned, so the server rolls back its transaction and drops
/// its place in any lock queue.
pub(crate) struct Pending<DB: Database> {
    conn: Option<PoolConnection<DB>>,
    pub(crate) killer: Option<Killer>,
}

impl<DB: Database> Pending<DB> {
    pub(crate) fn new(conn: PoolConnection<DB>) -> Self {
        Pending {
            conn: Some(conn),
            killer: None,
        }
    }

    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        self.conn.as_mut().expect("pending connection taken")
    }

    /// The acquisition completed: the connection is handed over intact.
    pub(crate) fn disarm(mut self) -> PoolConnection<DB> {
        self.killer = None;
        self.conn.take().expect("pending connection taken")
    }
}

impl<DB: Database> Drop for Pending<DB> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let raw = conn.detach();
        let killer = self.killer.take();
        match (killer, tokio::runtime::Handle::try_current()) {
            (Some(k), Ok(rt)) => {
                rt.spawn(async move {
                    k().await;
                    drop(raw);
                });
            }
            // Dropping the raw connection closes its socket.
            _ => drop(raw),
        }
    }
}

/// Runs `sql` (no parameters) on `conn`.
pub(crate) async fn exec<DB>(conn: &mut DB::Connection, sql: String) -> sqlx::Result<()>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(conn)
        .await
        .map(|_| ())
}

/// The state of a held row lock shared by the lease and its health check.
struct Held<DB: Database> {
    /// The holding connection, with its transaction open; `None` once released or lost.
    conn: Mutex<Option<PoolConnection<DB>>>,
    lost: LostNotifier,
    /// Makes the statement that resets the server-side guard to a new TTL.
    guard_sql: fn(Duration) -> String,
    /// The server-side guard of the current TTL, for the abandoned-lease backstop.
    guard: std::sync::Mutex<Duration>,
    label: &'static str,
}

/// How long one health check or renewal may take before the connection counts as lost.
const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

impl<DB> Held<DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    /// Pings the holding connection; on failure the lock is gone with it.
    async fn check(&self) -> bool {
        let mut slot = self.conn.lock().await;
        let Some(conn) = slot.as_mut() else {
            return false;
        };
        match tokio::time::timeout(CHECK_TIMEOUT, conn.ping()).await {
            Ok(Ok(())) => true,
            outcome => {
                tracing::warn!(
                    backend = self.label,
                    failed = ?outcome.map(|r| r.map_err(|e| e.to_string())),
                    "row-lock holding connection failed its health check; the lock is lost"
                );
                self.lost.fire(LostReason::ConnectionLost);
                if let Some(c) = slot.take() {
                    drop(c.detach());
                }
                false
            }
        }
    }
}

/// A held row lock.
pub(crate) struct RowLease<DB: Database> {
    held: Arc<Held<DB>>,
    name: LockName,
    fencing: u64,
}

impl<DB: Database> fmt::Debug for RowLease<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowLease")
            .field("backend", &self.held.label)
            .field("name", &self.name)
            .field("fencing", &self.fencing)
            .finish()
    }
}

impl<DB> RowLease<DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    /// Wraps the holding connection and starts its health check, which pings it every
    /// `min(ttl/3, 1 s)` until the guard is gone, and fires `ConnectionLost` when it fails.
    pub(crate) fn start(
        conn: PoolConnection<DB>,
        name: LockName,
        fencing: u64,
        ttl: Duration,
        lost: LostNotifier,
        guard_sql: fn(Duration) -> String,
        label: &'static str,
    ) -> Self {
        let held = Arc::new(Held {
            conn: Mutex::new(Some(conn)),
            lost: lost.clone(),
            guard_sql,
            guard: std::sync::Mutex::new(crate::guard_timeout(ttl)),
            label,
        });
        let interval = (ttl / 3).clamp(Duration::from_millis(20), Duration::from_secs(1));
        let watched = held.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = lost.closed() => return,
                    _ = tokio::time::sleep(interval) => {}
                }
                if !watched.check().await {
                    return;
                }
            }
        });
        RowLease {
            held,
            name,
            fencing,
        }
    }
}

#[lockcore::backend::async_trait]
impl<DB> Lease for RowLease<DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    fn fencing_token(&self) -> Option<u64> {
        Some(self.fencing)
    }

    /// The lock lives as long as the connection: extending checks it is alive (a statement on
    /// it) and moves the server-side idle guard to `ttl + 1 s`.
    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        let mut slot = self.held.conn.lock().await;
        let Some(conn) = slot.as_mut() else {
            return Err(Error::not_held(
                "the row lock was released or its connection was lost",
            ));
        };
        let sql = (self.held.guard_sql)(ttl);
        match tokio::time::timeout(CHECK_TIMEOUT, exec::<DB>(conn, sql)).await {
            Ok(Ok(())) => {
                *self.held.guard.lock().unwrap_or_else(|e| e.into_inner()) =
                    crate::guard_timeout(ttl);
                Ok(ttl)
            }
            outcome => {
                self.held.lost.fire(LostReason::ConnectionLost);
                if let Some(c) = slot.take() {
                    drop(c.detach());
                }
                let why = match outcome {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_owned(),
                };
                Err(Error::not_held(format!(
                    "the row lock's connection failed ({why}); the server released the lock"
                )))
            }
        }
    }

    async fn release(&self) -> Result<()> {
        let Some(mut conn) = self.held.conn.lock().await.take() else {
            return Err(Error::not_held(
                "the row lock was released or its connection was lost",
            ));
        };
        // Nothing was written in the holding transaction: rolling back just drops the lock.
        match tokio::time::timeout(CHECK_TIMEOUT, exec::<DB>(&mut conn, "ROLLBACK".into())).await {
            Ok(Ok(())) => Ok(()),
            outcome => {
                drop(conn.detach());
                let why = match outcome {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_owned(),
                };
                Err(Error::not_held(format!(
                    "the row lock's connection failed ({why}); the server released the lock"
                )))
            }
        }
    }
}

impl<DB: Database> Drop for RowLease<DB> {
    /// Dropped without release (an abandoned guard, as a wedged process would leave it): the
    /// connection is kept open but silent, so the server-side guard ends the session after
    /// `ttl + 1 s`. A client-side backstop closes it well after that in any case.
    fn drop(&mut self) {
        let held = self.held.clone();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            let Some(conn) = held.conn.lock().await.take() else {
                return;
            };
            let raw = conn.detach();
            let guard = *held.guard.lock().unwrap_or_else(|e| e.into_inner());
            tokio::time::sleep(guard * 2 + Duration::from_secs(10)).await;
            drop(raw);
        });
    }
}
