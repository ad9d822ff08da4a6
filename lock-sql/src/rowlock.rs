//! What the row-lock strategy shares between PostgreSQL and MySQL: the held lease (a connection
//! holding a session lock, watched by a health check) and the per-name queue that keeps this
//! client's waiters for one name to a single server-side waiter.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{Lease, LostNotifier};
use lockcore::{Error, Instant, LockName, LostReason, Result};
use tokio::sync::Mutex;

/// The connection that holds a lock, as the lease drives it.
#[lockcore::backend::async_trait]
pub(crate) trait Holding: Send + 'static {
    /// A round trip on the holding connection.
    async fn ping(&mut self) -> sqlx::Result<()>;
    /// Moves the server-side idle guard to `ttl + 1 s` (also proves the connection alive).
    async fn set_guard(&mut self, ttl: Duration) -> sqlx::Result<()>;
    /// Releases the lock; `Ok(false)` if the session did not hold it.
    async fn unlock(&mut self) -> sqlx::Result<bool>;
    /// The lock is released and the session clean: keep the connection for reuse.
    fn recycle(self: Box<Self>);
}

/// How long the server-side guard of a row-lock holder waits: the TTL plus one second.
pub(crate) fn guard_timeout(ttl: Duration) -> Duration {
    ttl + Duration::from_secs(1)
}

/// The state of a held row lock shared by the lease and its health check.
struct Held {
    /// The holding connection; `None` once released or lost.
    conn: Mutex<Option<Box<dyn Holding>>>,
    lost: LostNotifier,
    /// The TTL in force (the server-side guard is this + 1 s).
    ttl: std::sync::Mutex<Duration>,
    label: &'static str,
}

/// How often the health check pings a holding connection: the longest a holder takes to learn
/// that the server ended its session (an administrator's kill, a restart). A silent network
/// adds [`check_timeout`](crate::conns::check_timeout).
pub(crate) fn check_interval(ttl: Duration) -> Duration {
    (ttl / 4).clamp(Duration::from_millis(20), Duration::from_millis(500))
}

impl Held {
    fn ttl(&self) -> Duration {
        *self.ttl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pings the holding connection; on failure the lock is gone with it.
    async fn check(&self) -> bool {
        let mut slot = self.conn.lock().await;
        let Some(conn) = slot.as_mut() else {
            return false;
        };
        let limit = crate::conns::check_timeout(self.ttl());
        match tokio::time::timeout(limit, conn.ping()).await {
            Ok(Ok(())) => true,
            outcome => {
                tracing::warn!(
                    backend = self.label,
                    failed = ?outcome.map(|r| r.map_err(|e| e.to_string())),
                    "row-lock holding connection failed its health check; the lock is lost"
                );
                self.lost.fire(LostReason::ConnectionLost);
                // Dropped: the connection closes.
                slot.take();
                false
            }
        }
    }
}

/// A held row lock.
pub(crate) struct RowLease {
    held: Arc<Held>,
    name: LockName,
    /// `None` under `interop=` (the peer keeps no counter).
    fencing: Option<u64>,
}

impl fmt::Debug for RowLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowLease")
            .field("backend", &self.held.label)
            .field("name", &self.name)
            .field("fencing", &self.fencing)
            .finish()
    }
}

impl RowLease {
    /// Wraps the holding connection and starts its health check, which pings it every
    /// [`check_interval`] until the guard is gone, and fires `ConnectionLost` when it fails.
    pub(crate) fn start(
        conn: Box<dyn Holding>,
        name: LockName,
        fencing: Option<u64>,
        ttl: Duration,
        lost: LostNotifier,
        label: &'static str,
    ) -> Self {
        let held = Arc::new(Held {
            conn: Mutex::new(Some(conn)),
            lost: lost.clone(),
            ttl: std::sync::Mutex::new(ttl),
            label,
        });
        let watched = held.clone();
        tokio::spawn(async move {
            loop {
                let interval = check_interval(watched.ttl());
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

    fn failed(&self, why: String) -> Error {
        Error::not_held(format!(
            "the row lock's connection failed ({why}); the server released the lock"
        ))
    }
}

#[lockcore::backend::async_trait]
impl Lease for RowLease {
    fn fencing_token(&self) -> Option<u64> {
        self.fencing
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
        let limit = crate::conns::check_timeout(ttl.max(self.held.ttl()));
        match tokio::time::timeout(limit, conn.set_guard(ttl)).await {
            Ok(Ok(())) => {
                *self.held.ttl.lock().unwrap_or_else(|e| e.into_inner()) = ttl;
                Ok(ttl)
            }
            outcome => {
                self.held.lost.fire(LostReason::ConnectionLost);
                slot.take();
                Err(self.failed(match outcome {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_owned(),
                }))
            }
        }
    }

    async fn release(&self) -> Result<()> {
        let Some(mut conn) = self.held.conn.lock().await.take() else {
            return Err(Error::not_held(
                "the row lock was released or its connection was lost",
            ));
        };
        let limit = crate::conns::check_timeout(self.held.ttl()) * 3;
        match tokio::time::timeout(limit, conn.unlock()).await {
            Ok(Ok(true)) => {
                conn.recycle();
                Ok(())
            }
            // Not ours on this session (cannot happen while the session lives): close it.
            Ok(Ok(false)) => Err(Error::not_held(
                "the session no longer held the lock; the server released it",
            )),
            outcome => Err(self.failed(match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => "timed out".to_owned(),
            })),
        }
    }
}

impl Drop for RowLease {
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
            let guard = guard_timeout(held.ttl());
            tokio::time::sleep(guard * 2 + Duration::from_secs(10)).await;
            drop(conn);
        });
    }
}

/// This client's waiters per name: only the first waits in the server's queue (on a connection
/// of its own), the others wait here in arrival order. So many waiters on one busy name take
/// one connection, not one each, and cannot use up the server's connections for other names.
#[derive(Default)]
pub(crate) struct Queues {
    names: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

/// The turn of the waiter at the head of its name's queue.
pub(crate) struct Turn {
    queues: Arc<Queues>,
    name: String,
    slot: Arc<Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Queues {
    /// Waits for this caller's turn on `name` until `deadline`; `None` when it ran out.
    ///
    /// Cancel safe: a dropped wait leaves the queue.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        name: &str,
        deadline: Option<Instant>,
    ) -> Option<Turn> {
        let slot = self
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_owned())
            .or_default()
            .clone();
        let mut turn = Turn {
            queues: self.clone(),
            name: name.to_owned(),
            slot: slot.clone(),
            guard: None,
        };
        let lock = slot.lock_owned();
        let guard = match deadline {
            Some(d) => tokio::time::timeout_at(d, lock).await.ok()?,
            None => lock.await,
        };
        turn.guard = Some(guard);
        Some(turn)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.guard.take();
        let mut names = self.queues.names.lock().unwrap_or_else(|e| e.into_inner());
        // Ours and the map's: nobody else waits or holds the turn.
        if Arc::strong_count(&self.slot) == 2 {
            names.remove(&self.name);
        }
    }
}
