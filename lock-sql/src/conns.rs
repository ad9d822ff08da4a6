//! The connections of one client, kept by us instead of sqlx's pool.
//!
//! sqlx's pool pings every connection it gets back (one more round trip per statement), waits
//! up to its own fixed `acquire_timeout` whatever the caller's deadline, and counts connections
//! that hold row locks against the same cap as short statements (so holders past the cap wait
//! and fail, and waiters on one busy name can take every connection). Here:
//!
//! * a connection is taken from the idle list or opened, both by the caller's bound (its
//!   deadline, or the operation timeout);
//! * short statements (leases, revoke, counters) share at most `limit` connections; a
//!   connection that holds a lock is [`Checked::hold`]: it leaves that count, so any number of
//!   locks can be held (up to what the server accepts: a refusal is `Unavailable`);
//! * a connection whose statement failed at the connection level, timed out or was cancelled is
//!   closed, never reused; a statement that failed on a reused idle connection (the server
//!   restarted or closed it while idle) is retried once on a new one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::backend::CallerGone;
use lockcore::{Error, ErrorKind, Instant, Result};
use sqlx::ConnectOptions;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Parsed;

/// A connection plus what this crate remembers about its session.
pub(crate) struct Conn<C, M> {
    pub(crate) raw: C,
    /// What the dialect keeps per session (MariaDB: connection id, idle guard; PostgreSQL:
    /// nothing it reads).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) meta: M,
    /// When the server will close it if it stays idle (a server-side guard set on it), if ever.
    pub(crate) idle_until: Option<Instant>,
}

pub(crate) struct Conns<O: ConnectOptions, M>
where
    O::Connection: Sized,
{
    opts: O,
    config: Parsed,
    idle: Mutex<Vec<Conn<O::Connection, M>>>,
    max_idle: usize,
    limit: Arc<Semaphore>,
    limit_n: usize,
    /// Runs once on every new connection (session setup, reading its id).
    setup: fn(&mut O::Connection) -> futures::future::BoxFuture<'_, sqlx::Result<M>>,
}

/// A connection taken out of [`Conns`]: put it back with [`Checked::put`] after a statement
/// completed; dropped, it is closed.
pub(crate) struct Checked<O: ConnectOptions, M>
where
    O::Connection: Sized,
{
    pub(crate) conn: Conn<O::Connection, M>,
    pub(crate) reused: bool,
    permit: Option<OwnedSemaphorePermit>,
}

impl<O: ConnectOptions, M> Checked<O, M>
where
    O::Connection: Sized,
{
    /// The connection now holds a lock: it no longer counts against the statement limit.
    pub(crate) fn hold(&mut self) {
        self.permit = None;
    }
}

/// Whether an error means the connection is unusable (closed, reset, protocol out of step).
pub(crate) fn is_conn_err(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::PoolClosed
    ) || crate::sql_errors::is_unavailable_code(e)
}

impl<O, M> Conns<O, M>
where
    O: ConnectOptions,
    O::Connection: Sized,
    M: Send + 'static,
{
    pub(crate) fn new(
        opts: O,
        config: &Parsed,
        setup: fn(&mut O::Connection) -> futures::future::BoxFuture<'_, sqlx::Result<M>>,
    ) -> Arc<Self> {
        Arc::new(Conns {
            opts,
            config: config.clone(),
            idle: Mutex::new(Vec::new()),
            max_idle: config.pool_max as usize,
            limit: Arc::new(Semaphore::new(config.pool_max as usize)),
            limit_n: config.pool_max as usize,
            setup,
        })
    }

    /// The bound of an operation without a deadline of its own: now + the operation timeout.
    pub(crate) fn bound(&self) -> Instant {
        Instant::now() + self.config.op_timeout
    }

    /// The earlier of `deadline` and the operation bound.
    pub(crate) fn bound_by(&self, deadline: Option<Instant>) -> Instant {
        let b = self.bound();
        deadline.map_or(b, |d| d.min(b))
    }

    /// A connection by `bound`: idle if one is, else a new one. `counted` ones share the
    /// statement limit (`pool_max`); a waiter for a lock takes one uncounted.
    ///
    /// Cancel safe: nothing is taken until it returns.
    pub(crate) async fn get(&self, bound: Instant, counted: bool) -> Result<Checked<O, M>> {
        let permit = if counted {
            match tokio::time::timeout_at(bound, self.limit.clone().acquire_owned()).await {
                Ok(p) => Some(p.expect("the semaphore is never closed")),
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!(
                            "all {} connections of this client stayed busy until the deadline (pool_max)",
                            self.limit_n
                        ),
                    ));
                }
            }
        } else {
            None
        };
        let now = Instant::now();
        loop {
            let popped = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match popped {
                // The server has closed it by now (its idle guard ran out): drop it.
                Some(c) if c.idle_until.is_some_and(|t| t <= now) => continue,
                Some(conn) => {
                    return Ok(Checked {
                        conn,
                        reused: true,
                        permit,
                    });
                }
                None => break,
            }
        }
        let conn = self.connect(bound).await?;
        Ok(Checked {
            conn,
            reused: false,
            permit,
        })
    }

    /// A connection for a lock wait (uncounted: a holder keeps it), by `deadline` or the
    /// operation bound; `None` when the deadline passed first (a wait that ran out, not an
    /// error).
    ///
    /// Cancel safe, as [`Conns::get`].
    pub(crate) async fn get_for_wait(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Option<Checked<O, M>>> {
        match self.get(self.bound_by(deadline), false).await {
            Ok(c) => Ok(Some(c)),
            Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A new connection, set up, by `bound`.
    pub(crate) async fn connect(&self, bound: Instant) -> Result<Conn<O::Connection, M>> {
        let opened = tokio::time::timeout_at(bound, async {
            let mut raw = self.opts.connect().await?;
            let meta = (self.setup)(&mut raw).await?;
            Ok::<_, sqlx::Error>(Conn {
                raw,
                meta,
                idle_until: None,
            })
        })
        .await;
        match opened {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(crate::sql_errors::map_err(&self.config, "connecting", e)),
            Err(_) => Err(self.timed_out("connecting")),
        }
    }

    /// Keeps a connection whose last statement completed (up to `pool_max` idle ones).
    pub(crate) fn put(&self, checked: Checked<O, M>) {
        self.put_conn(checked.conn);
    }

    pub(crate) fn put_conn(&self, conn: Conn<O::Connection, M>) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
    }

    /// The error of an operation cut off client-side.
    pub(crate) fn timed_out(&self, what: &str) -> Error {
        Error::new(
            ErrorKind::Unavailable,
            format!(
                "{what}: no answer from the database within the operation timeout or deadline ({:?}; op_timeout_ms)",
                self.config.op_timeout
            ),
        )
    }

    /// Runs one statement (`f`) on a connection by `bound`: retried once on a new connection if
    /// a reused one turns out dead; the connection is kept only if the statement completed.
    /// `f` must be idempotent (every caller's statement is).
    ///
    /// Cancel safe: a cancelled statement's connection is closed.
    pub(crate) async fn run<T, F>(&self, bound: Instant, what: &str, f: F) -> Result<T>
    where
        F: for<'c> FnMut(&'c mut O::Connection) -> futures::future::BoxFuture<'c, sqlx::Result<T>>,
    {
        let sent = self.run_unless(None, bound, what, f).await?;
        Ok(sent.expect("sent: nothing stops it"))
    }

    /// [`Conns::run`] for an acquisition attempt run detached: `None`, with nothing sent, when
    /// its caller left before the statement could be sent. Waiting for a connection (all busy,
    /// or a new one's TLS handshake) can outlast the caller by far; an attempt sent after that
    /// would take the lock long after the cancel returned, from clients that saw it free.
    ///
    /// `bound` bounds the wait for a connection; a statement sent is waited for until the
    /// operation timeout from its send at least, also past `bound` (a caller's deadline):
    /// cut off, its connection would close while the server may still run it and win, with
    /// nobody left to release what it won (see `lockcore::backend::acquire_detached`, whose caller stops waiting at
    /// its deadline while this runs on).
    ///
    /// Cancel safe, as [`Conns::run`].
    pub(crate) async fn run_unless_gone<T, F>(
        &self,
        gone: &CallerGone,
        bound: Instant,
        what: &str,
        f: F,
    ) -> Result<Option<T>>
    where
        F: for<'c> FnMut(&'c mut O::Connection) -> futures::future::BoxFuture<'c, sqlx::Result<T>>,
    {
        self.run_unless(Some(gone), bound, what, f).await
    }

    async fn run_unless<T, F>(
        &self,
        gone: Option<&CallerGone>,
        bound: Instant,
        what: &str,
        mut f: F,
    ) -> Result<Option<T>>
    where
        F: for<'c> FnMut(&'c mut O::Connection) -> futures::future::BoxFuture<'c, sqlx::Result<T>>,
    {
        loop {
            let mut c = self.get(bound, true).await?;
            if gone.is_some_and(CallerGone::is_gone) {
                self.put(c);
                return Ok(None);
            }
            let reply_bound = match gone {
                Some(_) => bound.max(Instant::now() + self.config.op_timeout),
                None => bound,
            };
            match tokio::time::timeout_at(reply_bound, f(&mut c.conn.raw)).await {
                Ok(Ok(v)) => {
                    self.put(c);
                    return Ok(Some(v));
                }
                Ok(Err(e)) if is_conn_err(&e) && c.reused => {
                    tracing::debug!(what, "an idle connection was dead; retrying on a new one");
                    continue;
                }
                Ok(Err(e)) => {
                    if !is_conn_err(&e) {
                        self.put(c);
                    }
                    return Err(crate::sql_errors::map_err(&self.config, what, e));
                }
                Err(_) => return Err(self.timed_out(what)),
            }
        }
    }

    /// Closes every idle connection (after a server restart, for example).
    #[allow(dead_code)]
    pub(crate) fn clear(&self) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// How long a statement on a held lock's connection (health ping, extend) may take before the
/// connection is given up: the TTL, within 250 ms..1 s. Giving up closes the connection, and
/// the server frees the lock at once: a tight limit turns a stall of a loaded machine into a
/// lock lost that the holder could have kept (at `ttl/4`, 100 ms, it did). A silent network is
/// still noticed before the server's idle guard (`ttl + 1 s` of silence) frees the lock behind
/// the holder: the ping starts at most `min(ttl/4, 500 ms)` after the last statement.
pub(crate) fn check_timeout(ttl: Duration) -> Duration {
    ttl.clamp(Duration::from_millis(250), Duration::from_secs(1))
}
