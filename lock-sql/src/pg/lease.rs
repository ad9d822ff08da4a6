//! PostgreSQL leases: read first, then one conditional upsert; waiters woken by LISTEN/NOTIFY
//! with a safety poll.

use super::*;

/// An exclusive attempt's answer: the won lease's fence, the holder's remaining seconds, whether
/// permits hold the name, whether a queued waiter is ahead, and the `lazy` commit's count.
type AttemptRow = (Option<i64>, Option<f64>, Option<bool>, bool, i64);

impl PgBackend {
    /// One attempt: the lease (or share), or the current holder's remaining time if the
    /// database knows it and no queued waiter is ahead of this one, and whether one is. `waits`: the attempt
    /// belongs to a waiting `lock()`, whose writer marks itself as waiting behind shared
    /// holders (a `try_lock` marks nothing); `queue`: an exclusive attempt that loses enters
    /// the waiters' queue (or renews its entry there); `in_flight`, its wait's lock held until
    /// the (detached) attempt is done, so that the wait's clean-up removes its entry after it.
    ///
    /// Cancel safety: a share or lease won by an attempt whose caller is gone is released in
    /// the background.
    pub(super) async fn lease_attempt(
        &self,
        req: &AcquireRequest,
        bound: Instant,
        waits: bool,
        queue: bool,
        in_flight: Option<&Arc<tokio::sync::Mutex<()>>>,
    ) -> Result<(Option<Acquired>, Option<Duration>, bool)> {
        if req.mode != LockMode::Exclusive {
            let (won, left) = self.share_attempt(req, bound).await?;
            return Ok((won, left, false));
        }
        let token = req.token.to_hex();
        let holder = req.holder.encode();
        let sql = self.sql.lease_acquire.clone();
        let name = req.name.as_str().to_owned();
        let ttl = req.ttl.as_micros() as f64;
        let mark = if waits {
            crate::shares::WRITER_MARK.as_micros() as f64
        } else {
            0.0
        };
        let entry_ttl = QUEUE_ENTRY_TTL.as_micros() as f64;
        let lease = self.lease(req, 0);
        let conns = self.conns.clone();
        let mode = req.mode;
        let sent_at = Instant::now();
        let turn = match in_flight {
            Some(m) => Some(m.clone().lock_owned().await),
            None => None,
        };
        // A cancelled caller's statement may still commit, after a release sent on another
        // connection at the drop: it runs detached, and what it won is released after it.
        let attempt = move |gone| async move {
            // Held until this attempt is answered: a queue entry it makes is there before the
            // wait's clean-up looks.
            let _turn = turn;
            let reply: Result<Option<AttemptRow>> = conns
                .run_unless_gone(&gone, bound, "acquiring a lease", move |c| {
                    sqlx::query_as(AssertSqlSafe(sql.clone()))
                        .bind(name.clone())
                        .bind(token.clone())
                        .bind(ttl)
                        .bind(holder.clone())
                        .bind(mark)
                        .bind(queue)
                        .bind(entry_ttl)
                        .fetch_one(c)
                        .map(|r| match r {
                            // A row lock or a transaction lock holds the name's key: busy.
                            Err(e) if super::exclusion::key_busy(&e) => {
                                Ok((None, None, None, false, 0))
                            }
                            other => other,
                        })
                        .boxed()
                })
                .await;
            let Some((fence, remaining, permits, behind, _lazy)) = reply? else {
                return Ok((None, (None, false)));
            };
            if permits == Some(true) {
                return Err(crate::shares::conflict(mode));
            }
            Ok(match fence {
                Some(f) => (Some(lease.with_fencing(f as u64)), (None, false)),
                // Behind another waiter: the holder's expiry is the head's to act on.
                None => (
                    None,
                    (
                        remaining
                            .filter(|r| !behind && r.is_finite() && *r > 0.0)
                            .map(|r| Duration::from_secs_f64(r.min(1e6))),
                        behind,
                    ),
                ),
            })
        };
        let (won, (left, behind)) = lockcore::backend::acquire_detached_for(
            std::slice::from_ref(req),
            Some(bound),
            attempt,
        )
        .await?;
        Ok((won.map(|l| Acquired::new(l, sent_at)), left, behind))
    }

    fn lease(&self, req: &AcquireRequest, fencing: u64) -> PgLease {
        PgLease {
            conns: self.conns.clone(),
            sql: self.sql.clone(),
            table: self.config.table.clone(),
            name: req.name.clone(),
            token: req.token,
            fencing,
            share: req.mode != LockMode::Exclusive,
        }
    }

    /// One share attempt: one call of the share function, which locks the name's lease row
    /// and decides under it (see [`crate::shares`] and `share_functions_ddl`).
    ///
    /// Cancel safety: a share won by an attempt whose caller is gone is released in the
    /// background.
    async fn share_attempt(
        &self,
        req: &AcquireRequest,
        bound: Instant,
    ) -> Result<(Option<Acquired>, Option<Duration>)> {
        let sql = self.sql.share_acquire.clone();
        let name = req.name.as_str().to_owned();
        let token = req.token.to_hex();
        let holder = req.holder.encode();
        let mode = req.mode;
        let limit = match mode {
            LockMode::Permit { limit } => Some(i64::from(limit)),
            _ => None,
        };
        let ttl = req.ttl.as_micros() as f64;
        let lease = self.lease(req, 0);
        let conns = self.conns.clone();
        let sent_at = Instant::now();
        // Detached, as an exclusive attempt (see `lease_attempt`).
        let attempt = move |gone| async move {
            let reply: Option<(Option<i64>, Option<f64>, bool)> = conns
                .run_unless_gone(&gone, bound, "acquiring a share", move |c| {
                    sqlx::query_as(AssertSqlSafe(sql.clone()))
                        .bind(name.clone())
                        .bind(token.clone())
                        .bind(ttl)
                        .bind(crate::shares::mode_str(mode))
                        .bind(limit)
                        .bind(holder.clone())
                        .fetch_one(c)
                        .map(|r| match r {
                            // A row lock or a transaction lock holds the name's key: busy.
                            Err(e) if super::exclusion::key_busy(&e) => Ok((None, None, false)),
                            other => other,
                        })
                        .boxed()
                })
                .await?;
            let Some((fence, wait, conflict)) = reply else {
                return Ok((None, None));
            };
            if conflict {
                return Err(crate::shares::conflict(mode));
            }
            Ok(match fence {
                Some(f) => (Some(lease.with_fencing(f as u64)), None),
                None => (None, wait.and_then(crate::shares::secs)),
            })
        };
        let (won, wait) = lockcore::backend::acquire_detached_for(
            std::slice::from_ref(req),
            Some(bound),
            attempt,
        )
        .await?;
        Ok((won.map(|l| Acquired::new(l, sent_at)), wait))
    }

    /// The release notifications, started on first use; while LISTEN fails (the database is
    /// unreachable), waiters poll and the next wait tries again.
    pub(super) async fn wakeups(&self, bound: Instant) -> Option<Arc<Wakeups>> {
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

    pub(super) async fn start_listener(&self) -> sqlx::Result<Wakeups> {
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

    /// Announces a shared or permit waiter on `name` until `until` (releases then notify the
    /// name), with a queue entry as long (counted by `queued_waiters`).
    pub(super) async fn mark_waiting(
        &self,
        req: &AcquireRequest,
        until: Duration,
        bound: Instant,
    ) -> Result<()> {
        let sql = self.sql.lease_wait_mark.clone();
        let name = req.name.as_str().to_owned();
        let token = req.token.to_hex();
        let us = until.as_micros() as f64;
        self.conns
            .run(bound, "announcing a lease waiter", move |c| {
                sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(name.clone())
                    .bind(us)
                    .bind(token.clone())
                    .execute(c)
                    .map(|r| r.map(|_| ()))
                    .boxed()
            })
            .await
    }

    /// Waits for a lease: tries, then sleeps until a release NOTIFY for this name, the holder's
    /// expiry (as the database computed it), a capped safety poll, or the deadline. Every
    /// statement is bounded by the deadline and the operation timeout.
    pub(super) async fn lease_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        // Uncontended fast path: a free lock is taken before the listener is set up (its own
        // connection and LISTEN cost round trips, and on a busy machine a first wait's whole
        // deadline: a report's process client once timed out on a free lock).
        // Only while the listener is not up: once it is, the attempt after subscribing is the
        // first and only one (no extra round trip for a contended wait).
        if self.wakeups.get().is_none() {
            match self
                .lease_attempt(req, self.conns.bound_by(deadline), true, false, None)
                .await
            {
                Ok((Some(acquired), _, _)) => return Ok(Some(acquired)),
                Ok((None, _, _)) => {}
                Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        let wakeups = self.wakeups(self.conns.bound_by(deadline)).await;
        // Subscribed before the first attempt, so a release between an attempt and the sleep
        // is not missed.
        let mut rx = wakeups.as_ref().map(|w| w.tx.subscribe());
        // Exclusive waiters queue on the server (FIFO): a release notifies the head alone, by
        // its token. The entry is removed when this wait ends without the lock (a deadline, an
        // error, a dropped future), in the background; an exclusive attempt that wins removes
        // it itself. A shared or permit waiter's entry (made with its mark) goes in the
        // background whichever way its wait ends.
        let queued = req.mode == LockMode::Exclusive;
        let in_flight = Arc::new(tokio::sync::Mutex::new(()));
        let dequeue = CleanUpIfCancelled::arm(
            Dequeue {
                in_flight: in_flight.clone(),
                conns: self.conns.clone(),
                sql: self.sql.clone(),
                table: self.config.table.clone(),
                name: req.name.as_str().to_owned(),
                token: req.token.to_hex(),
            },
            &req.background,
        );
        let called = format!("{WAITER_PREFIX}{}", req.token.to_hex());
        let backoff = lockcore::backend::Backoff::for_ttl(req.ttl);
        let mut attempt = 0u32;
        let mut marked_until: Option<Instant> = None;
        let mut entered = false;
        loop {
            let bound = self.conns.bound_by(deadline);
            let (acquired, remaining, behind) = match self
                .lease_attempt(req, bound, true, queued, Some(&in_flight))
                .await
            {
                Ok(r) => r,
                Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
                Err(e) => return Err(e),
            };
            if acquired.is_some() {
                if queued {
                    dequeue.disarm();
                }
                return Ok(acquired);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            // An attempt that entered the queue counted every entry as ahead of it; waiters
            // entering at once would each wait for the others, and a release that came before
            // the entry named nobody: look again, now in the queue (the head then takes a
            // free lock).
            if queued && !entered {
                entered = true;
                continue;
            }
            // Shared and permit waiters announce themselves (releases then notify the name);
            // an exclusive waiter's queue entry is its announcement.
            if !queued && rx.is_some() && marked_until.is_none_or(|m| m <= now + SAFETY_POLL) {
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
            // Seen held after subscribing and marking: a release from now on wakes this waiter.
            req.waiting.mark();
            // Behind another waiter: only a safety net (the head is told); the head itself
            // polls as before, since a release racing its entry may have named nobody.
            let cap = if rx.is_some() && queued && behind {
                QUEUE_POLL
            } else if rx.is_some() {
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
                            Ok(Some(n)) if &*n == req.name.as_str() || *n == *called => break,
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

/// The clean-up of a queued exclusive lease waiter whose wait ended without the lock: its
/// queue entry removed, and the next waiter named if the lock is free (this one may have been
/// woken as the head and gone).
struct Dequeue {
    /// Locked by each attempt until it is answered: a cancelled wait's attempt runs on
    /// detached and may still enter the queue, so the removal waits for it.
    in_flight: Arc<tokio::sync::Mutex<()>>,
    conns: Arc<PgConns>,
    sql: Arc<Sql>,
    table: String,
    name: String,
    token: String,
}

impl CancelCleanUp for Dequeue {
    fn start(self) -> Option<CleanUpTask> {
        Some(Box::pin(async move {
            let Dequeue {
                in_flight,
                conns,
                sql,
                table,
                name,
                token,
            } = self;
            let _after = in_flight.lock_owned().await;
            let stmt = sql.lease_dequeue.clone();
            let done: Result<i64> = conns
                .run(conns.bound(), "leaving the lease queue", move |c| {
                    sqlx::query_scalar(AssertSqlSafe(stmt.clone()))
                        .bind(name.clone())
                        .bind(token.clone())
                        .bind(table.clone())
                        .fetch_one(c)
                        .boxed()
                })
                .await;
            if let Err(e) = done {
                tracing::debug!(error = %e, "removing a lease waiter's queue entry failed; it expires on its own");
            }
        }))
    }
}

#[derive(Clone)]
struct PgLease {
    conns: Arc<PgConns>,
    sql: Arc<Sql>,
    table: String,
    name: LockName,
    token: OwnerToken,
    fencing: u64,
    /// A shared holder's or a permit's lease (a row of the shares table), not the lock row.
    share: bool,
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

impl PgLease {
    /// This lease with the fencing token it was won with.
    fn with_fencing(self, fencing: u64) -> Self {
        PgLease { fencing, ..self }
    }
}

#[lockcore::backend::async_trait]
impl Lease for PgLease {
    fn fencing_token(&self) -> Option<u64> {
        Some(self.fencing)
    }

    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        if self.share {
            let sql = self.sql.share_extend.clone();
            let name = self.name.as_str().to_owned();
            let token = self.token.to_hex();
            let us = ttl.as_micros() as f64;
            let n: i64 = self
                .conns
                .run(self.conns.bound(), "extending a share", move |c| {
                    sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                        .bind(name.clone())
                        .bind(token.clone())
                        .bind(us)
                        .fetch_one(c)
                        .boxed()
                })
                .await?;
            crate::sql_errors::owner_checked(n as u64)?;
            return Ok(ttl);
        }
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
        if self.share {
            let token = Some(self.token.to_hex());
            let n = release_shares(&self.conns, &self.sql, &self.name, token, &self.table).await?;
            return crate::sql_errors::owner_checked(n);
        }
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

/// Deletes the share of `token`, or every live share of `name` (`None`: a revoke), with the
/// lease row locked (one call of the release function), and wakes the waiters. Returns how
/// many went.
///
/// Cancel safety: dropping the future may or may not have released them.
pub(super) async fn release_shares(
    conns: &PgConns,
    sql: &Arc<Sql>,
    name: &LockName,
    token: Option<String>,
    table: &str,
) -> Result<u64> {
    let (sql, name, table) = (
        sql.share_release.clone(),
        name.as_str().to_owned(),
        table.to_owned(),
    );
    let n: i64 = conns
        .run(conns.bound(), "releasing shares", move |c| {
            sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                .bind(name.clone())
                .bind(token.clone())
                .bind(table.clone())
                .fetch_one(c)
                .boxed()
        })
        .await?;
    Ok(n.max(0) as u64)
}

impl PgBackend {
    /// A set of exclusive leases in one transaction on one connection (see
    /// [`Backend::try_acquire_all`](lockcore::backend::Backend::try_acquire_all)): each
    /// member's `try_lock` statement (`lease_acquire`, marking no writer and entering no
    /// queue), in the order given; rolled back at the first member it does not take (a holder,
    /// live shares, or a live waiter queued on the name: the statement's own rules, so a set
    /// jumps no queue), committed when it took them all. Each member's fence is the one its
    /// statement returns, as a single acquisition's. The row of every member taken stays locked
    /// until the commit: a single attempt on it waits for the set's outcome, and two sets lock
    /// their common rows in the same (canonical) order.
    ///
    /// Cancel safety: detached as a single attempt; a caller gone before the commit rolls the
    /// set back, and a set committed for a caller gone is released in the background.
    pub(crate) async fn try_set(
        &self,
        reqs: &[AcquireRequest],
    ) -> Result<lockcore::backend::SetAttempt> {
        let sql = self.sql.lease_acquire.clone();
        let members = crate::sets::SetMember::of(reqs);
        let leases: Vec<PgLease> = reqs.iter().map(|r| self.lease(r, 0)).collect();
        let entry_ttl = QUEUE_ENTRY_TTL.as_micros() as f64;
        let conns = self.conns.clone();
        let bound = self.conns.bound();
        let sent_at = Instant::now();
        let attempt = move |gone: lockcore::backend::CallerGone| async move {
            let reply = conns
                .run_unless_gone(&gone, bound, "acquiring a set of leases", |c| {
                    let (sql, members, gone) = (sql.clone(), members.clone(), gone.clone());
                    async move {
                        let mut tx = c.begin().await?;
                        let mut fences = Vec::with_capacity(members.len());
                        for (i, m) in members.iter().enumerate() {
                            let row: sqlx::Result<AttemptRow> =
                                sqlx::query_as(AssertSqlSafe(sql.clone()))
                                    .bind(m.name.as_str())
                                    .bind(&m.token)
                                    .bind(m.ttl.as_micros() as f64)
                                    .bind(&m.holder)
                                    .bind(0.0f64)
                                    .bind(false)
                                    .bind(entry_ttl)
                                    .fetch_one(&mut *tx)
                                    .await;
                            let (fence, _, permits, _, _) = match row {
                                Ok(r) => r,
                                // A row lock or a transaction lock holds this member's key.
                                Err(e) if super::exclusion::key_busy(&e) => {
                                    tx.rollback().await?;
                                    return Ok(Ok(crate::sets::SetFound::Busy(i)));
                                }
                                Err(e) => {
                                    let _ = tx.rollback().await;
                                    return Err(e);
                                }
                            };
                            if permits == Some(true) {
                                tx.rollback().await?;
                                return Ok(Err(crate::shares::conflict(LockMode::Exclusive)));
                            }
                            match fence {
                                Some(f) => fences.push(f as u64),
                                None => {
                                    tx.rollback().await?;
                                    return Ok(Ok(crate::sets::SetFound::Busy(i)));
                                }
                            }
                        }
                        if gone.is_gone() {
                            tx.rollback().await?;
                            return Ok(Ok(crate::sets::SetFound::Abandoned));
                        }
                        tx.commit().await?;
                        Ok(Ok(crate::sets::SetFound::Won(fences)))
                    }
                    .boxed()
                })
                .await;
            match reply? {
                None => Err(crate::sets::set_abandoned()),
                Some(found) => found?.into_won(leases, PgLease::with_fencing),
            }
        };
        crate::sets::run_set_detached(reqs, sent_at, Some(bound), attempt).await
    }
}
