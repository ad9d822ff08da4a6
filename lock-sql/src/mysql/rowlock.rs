//! MariaDB row locks: a session `GET_LOCK` on a connection of its own, with the lock row's
//! fencing counter bumped and committed in the same statement when the caller wants a token.

use super::*;

/// The longest single server-side wait; a longer wait is queued again after it, so a waiter
/// whose client died (the server does not notice during a lock wait) leaves within it.
pub(super) const WAIT_CHUNK: Duration = Duration::from_secs(5);

pub(super) fn guard_secs(ttl: Duration) -> u64 {
    guard_timeout(ttl).as_secs_f64().ceil() as u64
}

/// A connection idle with a server-side guard set is closed by the server after it: never
/// reuse it past that.
pub(super) fn idle_until_guard(c: &mut Checked<MySqlConnectOptions, MyMeta>) {
    if c.conn.meta.guard_s > 0 {
        c.conn.idle_until = Some(
            Instant::now() + Duration::from_secs(c.conn.meta.guard_s) - Duration::from_millis(500),
        );
    }
}

/// Kills a session's lock wait if the acquisition is dropped while it waits.
pub(super) struct Killer {
    pub(super) conns: Arc<MyConns>,
    pub(super) id: u64,
    pub(super) background: Background,
    pub(super) armed: bool,
}

impl Killer {
    pub(super) fn disarm(mut self) {
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
pub(super) struct MyHolding {
    pub(super) conn: Option<Checked<MySqlConnectOptions, MyMeta>>,
    pub(super) conns: Arc<MyConns>,
    pub(super) sql: Arc<Sql>,
    pub(super) name: String,
}

impl MyHolding {
    pub(super) fn checked(&mut self) -> &mut Checked<MySqlConnectOptions, MyMeta> {
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
        // Each parameter is the name (`mysql::exclusion::row_unlock`).
        for _ in 0..crate::mysql::exclusion::params(&sql) {
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

impl MyBackend {
    /// One statement per attempt (plus `SET wait_timeout` on a connection whose server-side
    /// guard differs, once per connection and TTL): `GET_LOCK` (tried, or waited for in chunks
    /// of at most [`WAIT_CHUNK`] until the deadline) and the fencing counter bumped and
    /// committed; `GET_LOCK` alone when the holder wants no token (nothing written).
    pub(super) async fn row_acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        nowait: bool,
    ) -> Result<Option<Acquired>> {
        let Some(_turn) = self.queues.turn(req.name.as_str(), deadline, nowait).await else {
            return Ok(None);
        };
        let guard_s = guard_secs(req.ttl);
        let holder = req.holder.encode();
        // A token only where one is handed out: a peer of interop=get_lock bumps no counter.
        let fenced = req.fencing.wanted() && self.config.interop.is_none();
        // Under interop=get_lock the peer's key and the default layout's are taken.
        let interop = self.config.interop.is_some();
        let backoff = lockcore::backend::Backoff::for_ttl(req.ttl);
        let mut leased = 0u32;
        let Some(mut c) = self.conns.get_for_wait(deadline).await? else {
            return Ok(None);
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
                    // The default layout's key too (`mysql::exclusion::interop_acquire`).
                    q = q.bind(name).bind(wait.as_secs_f64()).bind(name);
                }
                let got: bool = q.fetch_one(&mut *conn).await?;
                if !got {
                    return Ok(RowOutcome::Busy);
                }
                // Holding the key: a live lease gives it back (`crate::mysql::exclusion`).
                let check = sql.row_lock_check.clone();
                let mut q = sqlx::query_scalar(AssertSqlSafe(check.clone()));
                for _ in 0..crate::mysql::exclusion::params(&check) {
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

    pub(super) fn put(&self, mut c: Checked<MySqlConnectOptions, MyMeta>) {
        idle_until_guard(&mut c);
        self.conns.put(c);
    }
}
