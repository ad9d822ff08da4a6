//! PostgreSQL row locks: a session advisory lock on a connection of its own (exclusive, or
//! shared for a reader: the same statements with the `_shared` functions, on the same key),
//! with the lock row's fencing counter bumped and committed in the same statement when the
//! caller wants a fencing token (without one, nothing is written).
//!
//! # Row-lock default cost
//!
//! With the default options an acquisition is one request and one writing transaction (the
//! counter's commit), a release one request that writes nothing; `pg_row_lock_default_cost`
//! in `tests/faults.rs` counts both, so neither can grow unnoticed. The bare
//! `pg_advisory_lock` + unlock is two requests as well: what separates the two is the
//! statement's check that no lease holds the name (see `exclusion`, which the mutual exclusion
//! of the strategies needs) and the committed write, whose cost is the server's (a transaction
//! id, the row's new version, the commit record and its WAL flush; the crate docs' *What the
//! token costs* has the figures). That write is the floor for a durable token. Cheaper tokens
//! were weighed and refused: a sequence's `nextval` writes WAL only every 32nd value, and a
//! value covered by a record of a transaction that never committed can be handed out again
//! after a crash (the regression `pg_tokens_and_leases_survive_a_crash_restart` guards
//! against); an epoch of the server's start (`pg_postmaster_start_time`) does not change on the
//! crash recovery that follows one backend's crash (`restart_after_crash`: the same postmaster
//! reinitialises and replays the WAL), so it cannot rule that re-issue out either.

use super::*;

impl PgBackend {
    /// `$1` of the row statements: the name, or under `interop=sqlx` sqlx's key of it.
    pub(super) fn row_param(&self, name: &LockName) -> String {
        match self.config.interop {
            Some(crate::Interop::Sqlx) => crate::interop::sqlx_key(name).to_string(),
            _ => name.as_str().to_owned(),
        }
    }

    /// One statement: the advisory lock in `req.mode` (tried, or waited for until `deadline`
    /// with `lock_timeout`), the server-side guard, and (when `req.fencing` wants a token) the
    /// fencing counter bumped and committed with the holder's metadata.
    ///
    /// Cancel safe: a dropped call's statement, waiting or not, goes with its connection, which
    /// is closed, so the server frees whatever the session held.
    pub(super) async fn row_acquire(
        &self,
        req: &AcquireRequest,
        wait: RowWait,
    ) -> Result<Option<Acquired>> {
        let guard_ms = ms(guard_timeout(req.ttl));
        // The counter's commit (a WAL flush) is most of an acquisition's cost: made only when
        // the caller wants a token. Under interop the statements count nothing anyway.
        let fenced = req.fencing.wanted() && self.config.interop.is_none();
        let row = self.sql.row(req.mode);
        let (try_sql, wait_sql) = if fenced {
            (&row.try_fenced, &row.wait_fenced)
        } else {
            (&row.try_unfenced, &row.wait_unfenced)
        };
        let param = self.row_param(&req.name);
        let interop_name = self
            .config
            .interop
            .is_some()
            .then(|| req.name.as_str().to_owned());
        let holder = req.holder.encode();
        let backoff = lockcore::backend::Backoff::for_ttl(req.ttl);
        let mut leased = 0u32;
        loop {
            // Not counted against pool_max: a holder keeps this connection.
            let Some(mut c) = self.conns.get_for_wait(wait.deadline).await? else {
                return Ok(None);
            };
            let mut q = if wait.nowait {
                sqlx::query_scalar::<_, i64>(AssertSqlSafe(try_sql.clone()))
                    .bind(param.as_str())
                    .bind(&guard_ms)
                    .bind(&holder)
            } else {
                // The blocking statement is on its way: a release from now on reaches it.
                req.waiting.mark();
                let timeout = wait.deadline.map_or("0".to_owned(), |d| {
                    ms(d.saturating_duration_since(Instant::now()))
                });
                sqlx::query_scalar::<_, i64>(AssertSqlSafe(wait_sql.clone()))
                    .bind(param.as_str())
                    .bind(&guard_ms)
                    .bind(timeout)
                    .bind(&holder)
            };
            // Under interop the name comes last: the default layout's key is taken too.
            if let Some(name) = &interop_name {
                q = q.bind(name.as_str());
            }
            // A try is bounded by the operation timeout; a wait by the caller's deadline only
            // (the server's lock_timeout ends it there; this cuts off a database that stopped
            // answering). A cut-off or dropped statement closes the connection with `c`, and
            // the server frees whatever the session held.
            let bound = if wait.nowait {
                Some(self.conns.bound())
            } else {
                wait.deadline
            };
            let res = match bound {
                Some(b) => {
                    match tokio::time::timeout_at(b, q.fetch_optional(&mut c.conn.raw)).await {
                        Ok(r) => r,
                        Err(_) if !wait.nowait => return Ok(None),
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
                        mode: req.mode,
                        name: param.clone(),
                        interop_name: interop_name.clone(),
                    };
                    let lease = RowLease::start(
                        Box::new(holding),
                        req.name.clone(),
                        fenced.then_some(fence as u64),
                        req.ttl,
                        req.lost.clone(),
                        (&self.rows.health, "postgres"),
                    );
                    return Ok(Some(Acquired::new(lease, answered_at)));
                }
                Ok(None) if wait.nowait => {
                    // Tried and busy: nothing held, the session is clean.
                    self.conns.put(c);
                    return Ok(None);
                }
                // A wait answers no row only when, once it held the key, a live lease held the
                // name (the key was given back at once: see `exclusion`): the lease strategy
                // holds it, and its expiry or release notifies nobody here. Look again after a
                // backoff, until the deadline.
                Ok(None) => {
                    self.conns.put(c);
                    let mut wake = Instant::now() + backoff.delay(leased);
                    leased = leased.saturating_add(1);
                    if let Some(d) = wait.deadline {
                        if Instant::now() >= d {
                            return Ok(None);
                        }
                        wake = wake.min(d);
                    }
                    tokio::time::sleep_until(wake).await;
                    continue;
                }
                // Only the advisory lock's wait runs under lock_timeout (the counter's row is
                // waited for without it): timed out there, the session holds nothing.
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
}

/// A connection holding a PostgreSQL row lock (its session advisory lock).
struct PgHolding {
    conn: Option<Checked<PgConnectOptions, ()>>,
    conns: Arc<PgConns>,
    sql: Arc<Sql>,
    /// The mode it holds: the unlock must be of the same kind.
    mode: LockMode,
    name: String,
    /// Under interop, the lock's name (`name` is then sqlx's key): its unlock gives the
    /// default layout's key back too.
    interop_name: Option<String>,
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
        let sql = self.sql.row(self.mode).unlock.clone();
        let name = self.name.clone();
        let mut q = sqlx::query_scalar(AssertSqlSafe(sql)).bind(name);
        if let Some(own) = self.interop_name.clone() {
            q = q.bind(own);
        }
        q.fetch_one(self.raw()).await
    }

    fn recycle(mut self: Box<Self>) {
        if let Some(c) = self.conn.take() {
            self.conns.put(c);
        }
    }
}
