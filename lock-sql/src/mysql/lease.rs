//! MariaDB leases: one conditional upsert per exclusive attempt (the outcome read from the OK
//! packet), a share's procedure call or transaction, a set's transaction.

use super::*;

/// Whether a row lock holds the key of `name` (asked after an exclusive lease attempt created
/// the name's row: see `crate::mysql::exclusion`).
pub(super) async fn key_used(c: &mut MySqlConnection, sql: &Sql, name: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar(AssertSqlSafe(sql.key_used.clone()))
        .bind(name)
        .fetch_one(c)
        .await
}

#[derive(Clone)]
pub(super) struct MyLease {
    pub(super) conns: Arc<MyConns>,
    pub(super) sql: Arc<Sql>,
    pub(super) name: LockName,
    pub(super) token: OwnerToken,
    pub(super) fencing: u64,
    /// A shared holder's or a permit's lease (a row of the shares table), not the lock row.
    pub(super) share: bool,
}

impl fmt::Debug for MyLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MyLease")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("fencing", &self.fencing)
            .finish()
    }
}

impl MyLease {
    /// This lease with the fencing token it was won with.
    pub(super) fn with_fencing(self, fencing: u64) -> Self {
        MyLease { fencing, ..self }
    }

    pub(super) async fn update(&self, sql: &str, ttl: Option<Duration>, what: &str) -> Result<()> {
        let sql = sql.to_owned();
        let name = self.name.as_str().to_owned();
        let token = self.token.to_hex();
        let n = self
            .conns
            .run(self.conns.bound(), what, move |c| {
                let mut q = sqlx::query(AssertSqlSafe(sql.clone()));
                if let Some(ttl) = ttl {
                    q = q.bind(ttl.as_micros() as u64);
                }
                q.bind(name.clone())
                    .bind(token.clone())
                    .execute(c)
                    .map(|r| r.map(|r| r.rows_affected()))
                    .boxed()
            })
            .await?;
        // FOUND_ROWS is on: this counts matched rows, so an extend within the same microsecond
        // still reports 1.
        crate::sql_errors::owner_checked(n)
    }
}

#[lockcore::backend::async_trait]
impl Lease for MyLease {
    fn fencing_token(&self) -> Option<u64> {
        Some(self.fencing)
    }

    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        if self.share {
            let (sql, name, token) = (
                self.sql.clone(),
                self.name.as_str().to_owned(),
                self.token.to_hex(),
            );
            let us = ttl.as_micros() as u64;
            let n = self
                .conns
                .run(self.conns.bound(), "extending a share", move |c| {
                    let (sql, name, token) = (sql.clone(), name.clone(), token.clone());
                    async move {
                        if let Some(calls) = &sql.share_calls {
                            let n: i64 = sqlx::query_scalar(AssertSqlSafe(calls.extend.clone()))
                                .bind(&name)
                                .bind(&token)
                                .bind(us)
                                .fetch_one(&mut *c)
                                .await?;
                            return Ok(n as u64);
                        }
                        in_tx(c, |c| {
                            Box::pin(async move {
                                sqlx::query(AssertSqlSafe(sql.share_lock_row.clone()))
                                    .bind(&name)
                                    .execute(&mut *c)
                                    .await?;
                                let n = sqlx::query(AssertSqlSafe(sql.share_extend.clone()))
                                    .bind(us)
                                    .bind(&name)
                                    .bind(&token)
                                    .execute(&mut *c)
                                    .await?
                                    .rows_affected();
                                if n > 0 {
                                    sqlx::query(AssertSqlSafe(sql.share_raise.clone()))
                                        .bind(&name)
                                        .bind(&token)
                                        .bind(&name)
                                        .execute(&mut *c)
                                        .await?;
                                }
                                Ok(n)
                            })
                        })
                        .await
                    }
                    .boxed()
                })
                .await?;
            crate::sql_errors::owner_checked(n)?;
            return Ok(ttl);
        }
        self.update(&self.sql.lease_extend, Some(ttl), "extending a lease")
            .await?;
        Ok(ttl)
    }

    async fn release(&self) -> Result<()> {
        if self.share {
            let token = Some(self.token.to_hex());
            let n = release_shares(&self.conns, &self.sql, &self.name, token).await?;
            return crate::sql_errors::owner_checked(n);
        }
        self.update(&self.sql.lease_release, None, "releasing a lease")
            .await
    }
}

/// Runs `body` in a transaction, READ COMMITTED as all of the session's (see [`setup`]: each
/// statement reads what was committed before it: after the lease row is locked, what the
/// transactions before committed), committed after
/// `body` (a wait or a refusal too: nothing it did is wrong to keep, and the row lock must not
/// outlive the call), rolled back after an error. Never left to sqlx's rollback on drop, which
/// is only sent with the connection's next statement: an idle connection would keep the row
/// locked until then. A dropped call's connection is closed (see [`Conns::run`]).
pub(super) async fn in_tx<'c, T>(
    c: &'c mut MySqlConnection,
    body: impl for<'t> FnOnce(
        &'t mut MySqlConnection,
    ) -> futures::future::BoxFuture<'t, sqlx::Result<T>>,
) -> sqlx::Result<T> {
    let mut tx = c.begin().await?;
    match body(&mut tx).await {
        Ok(v) => {
            tx.commit().await?;
            Ok(v)
        }
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// Deletes the share of `token`, or every live share of `name` (`None`: a revoke): one
/// statement, the lease row untouched (its `shares_until` is an upper bound, see
/// `lease_acquire`). Returns how many went.
///
/// Cancel safety: dropping the future may or may not have released them.
pub(super) async fn release_shares(
    conns: &MyConns,
    sql: &Arc<Sql>,
    name: &LockName,
    token: Option<String>,
) -> Result<u64> {
    let (sql, name) = (sql.share_delete.clone(), name.as_str().to_owned());
    conns
        .run(conns.bound(), "releasing shares", move |c| {
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(name.clone())
                .bind(token.clone())
                .bind(token.clone())
                .execute(c)
                .map(|r| r.map(|r| r.rows_affected()))
                .boxed()
        })
        .await
}

/// The transaction of [`MyBackend::try_set`]: committed only when every member was taken.
pub(super) async fn set_tx(
    c: &mut MySqlConnection,
    sql: &Sql,
    members: &[crate::sets::SetMember],
    gone: &lockcore::backend::CallerGone,
) -> sqlx::Result<Result<crate::sets::SetFound>> {
    let mut tx = c.begin().await?;
    let mut fences = Vec::with_capacity(members.len());
    for (i, m) in members.iter().enumerate() {
        let ttl_us = m.ttl.as_micros() as u64;
        let name = m.name.as_str();
        let reply = lease_acquire_query(&sql.lease_acquire, name, &m.token, ttl_us, &m.holder, 0)
            .execute(&mut *tx)
            .await;
        let id = match reply {
            // A member that created its row was judged before the row existed: the row lock
            // it may have missed holds the key (see `crate::mysql::exclusion`).
            Ok(r)
                if r.rows_affected() == 1
                    && !matches!(r.last_insert_id(), 0 | HELD_BY_READERS | HELD_BY_PERMITS) =>
            {
                match key_used(&mut tx, sql, name).await {
                    Ok(true) => Ok(0),
                    Ok(false) => Ok(r.last_insert_id()),
                    Err(e) => Err(e),
                }
            }
            r => r.map(|r| r.last_insert_id()),
        };
        let found = match id {
            Ok(HELD_BY_PERMITS) => Err(crate::shares::conflict(LockMode::Exclusive)),
            Ok(0 | HELD_BY_READERS) => Ok(crate::sets::SetFound::Busy(i)),
            // ER_LOCK_DEADLOCK: InnoDB rolled the whole set back.
            Err(e) if error_number(&e) == Some(1213) => Ok(crate::sets::SetFound::Busy(i)),
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e);
            }
            Ok(fence) => {
                fences.push(fence);
                continue;
            }
        };
        tx.rollback().await?;
        return Ok(found);
    }
    if gone.is_gone() {
        tx.rollback().await?;
        return Ok(Ok(crate::sets::SetFound::Abandoned));
    }
    tx.commit().await?;
    Ok(Ok(crate::sets::SetFound::Won(fences)))
}

impl MyBackend {
    /// One attempt. `waits`: it belongs to a waiting `lock()`, whose writer marks itself as
    /// waiting behind shared holders (a `try_lock` marks nothing).
    ///
    /// Cancel safety: a lease or share won by an attempt whose caller is gone is released in
    /// the background.
    pub(super) async fn lease_attempt(
        &self,
        req: &AcquireRequest,
        bound: Instant,
        waits: bool,
    ) -> Result<Option<Acquired>> {
        if req.mode != LockMode::Exclusive {
            return self.share_attempt(req, bound).await;
        }
        let token = req.token.to_hex();
        let sql = self.sql.lease_acquire.clone();
        let name = req.name.as_str().to_owned();
        let ttl = req.ttl.as_micros() as u64;
        let holder = req.holder.encode();
        let lease = self.lease(req, 0);
        let conns = self.conns.clone();
        let mark = if waits {
            crate::shares::WRITER_MARK.as_micros() as u64
        } else {
            0
        };
        let sent_at = Instant::now();
        // A cancelled caller's statement may still commit, after a release sent on another
        // connection at the drop: it runs detached, and what it won is released after it.
        let all = self.sql.clone();
        let attempt = move |gone| async move {
            let reply = conns
                .run_unless_gone(&gone, bound, "acquiring a lease", move |c| {
                    let (sql, all, name, token, holder) = (
                        sql.clone(),
                        all.clone(),
                        name.clone(),
                        token.clone(),
                        holder.clone(),
                    );
                    async move {
                        let r = lease_acquire_query(&sql, &name, &token, ttl, &holder, mark)
                            .execute(&mut *c)
                            .await?;
                        let id = r.last_insert_id();
                        let won = !matches!(id, 0 | HELD_BY_READERS | HELD_BY_PERMITS);
                        // A taken row always changes (rows affected 2): 1 is a new row, whose
                        // values were judged before it existed (see `crate::mysql::exclusion`).
                        if won && r.rows_affected() == 1 && key_used(c, &all, &name).await? {
                            sqlx::query(AssertSqlSafe(all.lease_release.clone()))
                                .bind(&name)
                                .bind(&token)
                                .execute(&mut *c)
                                .await?;
                            return Ok(0);
                        }
                        Ok(id)
                    }
                    .boxed()
                })
                .await;
            let Some(reply) = reply? else {
                return Ok(None);
            };
            match reply {
                HELD_BY_PERMITS => Err(crate::shares::conflict(LockMode::Exclusive)),
                0 | HELD_BY_READERS => Ok(None),
                id => Ok(Some(lease.with_fencing(id))),
            }
        };
        let won = lockcore::backend::acquire_detached_for(
            std::slice::from_ref(req),
            Some(bound),
            attempt,
        )
        .await?;
        Ok(won.map(|l| Acquired::new(l, sent_at)))
    }

    pub(super) fn lease(&self, req: &AcquireRequest, fencing: u64) -> MyLease {
        MyLease {
            conns: self.conns.clone(),
            sql: self.sql.clone(),
            name: req.name.clone(),
            token: req.token,
            fencing,
            share: req.mode != LockMode::Exclusive,
        }
    }

    /// One share attempt: a transaction on the name's lease row, locked (see
    /// [`crate::shares`]).
    ///
    /// Cancel safety: a share won by an attempt whose caller is gone is released in the
    /// background.
    pub(super) async fn share_attempt(
        &self,
        req: &AcquireRequest,
        bound: Instant,
    ) -> Result<Option<Acquired>> {
        let sql = self.sql.clone();
        let name = req.name.as_str().to_owned();
        let token = req.token.to_hex();
        let holder = req.holder.encode();
        let mode = req.mode;
        let ttl = req.ttl.as_micros() as u64;
        let lease = self.lease(req, 0);
        let conns = self.conns.clone();
        let sent_at = Instant::now();
        // Detached, as an exclusive attempt (see `lease_attempt`).
        let attempt = move |gone| async move {
            let reply = conns
                .run_unless_gone(&gone, bound, "acquiring a share", move |c| {
                    let (sql, name, token, holder) =
                        (sql.clone(), name.clone(), token.clone(), holder.clone());
                    async move {
                        if let Some(calls) = &sql.share_calls {
                            let outcome = sqlx::query_as::<_, (i64, i64)>(AssertSqlSafe(
                                calls.acquire.clone(),
                            ))
                            .bind(&name)
                            .bind(&token)
                            .bind(crate::shares::mode_str(mode))
                            .bind(match mode {
                                LockMode::Permit { limit } => i64::from(limit),
                                _ => 0,
                            })
                            .bind(ttl)
                            .bind(&holder)
                            .fetch_one(&mut *c)
                            .await
                            .map(|(verdict, value)| match verdict {
                                1 => Ok(Some(value as u64)),
                                0 => Ok(None),
                                _ => Err(crate::shares::conflict(mode)),
                            });
                            return match outcome {
                                // As below.
                                Err(e) if error_number(&e) == Some(1213) => Ok(Ok(None)),
                                other => other,
                            };
                        }
                        let outcome = in_tx(c, |c| {
                            Box::pin(async move {
                                sqlx::query(AssertSqlSafe(sql.share_lock_row.clone()))
                                    .bind(&name)
                                    .execute(&mut *c)
                                    .await?;
                                let (exclusive_us, writer_us, fence): (
                                    Option<i64>,
                                    Option<i64>,
                                    u64,
                                ) = sqlx::query_as(AssertSqlSafe(sql.share_row.clone()))
                                    .bind(&name)
                                    .fetch_one(&mut *c)
                                    .await?;
                                // The row locked: a row lock holding the name's key keeps it
                                // (see `crate::mysql::exclusion`).
                                if key_used(&mut *c, &sql, &name).await? {
                                    return Ok(Ok(None));
                                }
                                sqlx::query(AssertSqlSafe(sql.share_expired.clone()))
                                    .bind(&name)
                                    .execute(&mut *c)
                                    .await?;
                                let rows: Vec<(String, String, i64, u64)> =
                                    sqlx::query_as(AssertSqlSafe(sql.share_live.clone()))
                                        .bind(&name)
                                        .fetch_all(&mut *c)
                                        .await?;
                                let secs = |us: i64| us as f64 / 1e6;
                                let rows = rows
                                    .into_iter()
                                    .map(|(t, m, us, f)| (t, m, secs(us), f as i64))
                                    .collect();
                                let seen = crate::shares::Seen::from_rows(
                                    exclusive_us.map(secs),
                                    writer_us.map(secs),
                                    &token,
                                    rows,
                                );
                                let fence = match crate::shares::decide(mode, &seen) {
                                    Err(e) => return Ok(Err(e)),
                                    Ok(Verdict::Wait(_)) => return Ok(Ok(None)),
                                    Ok(Verdict::Mine(fence)) => {
                                        sqlx::query(AssertSqlSafe(sql.share_extend.clone()))
                                            .bind(ttl)
                                            .bind(&name)
                                            .bind(&token)
                                            .execute(&mut *c)
                                            .await?;
                                        fence as u64
                                    }
                                    Ok(Verdict::Take) => {
                                        let fence = fence + 1;
                                        sqlx::query(AssertSqlSafe(sql.share_insert.clone()))
                                            .bind(&name)
                                            .bind(&token)
                                            .bind(crate::shares::mode_str(mode))
                                            .bind(ttl)
                                            .bind(fence)
                                            .bind(&holder)
                                            .execute(&mut *c)
                                            .await?;
                                        sqlx::query(AssertSqlSafe(sql.share_take.clone()))
                                            .bind(fence)
                                            .bind(&name)
                                            .bind(&token)
                                            .bind(&name)
                                            .execute(&mut *c)
                                            .await?;
                                        return Ok(Ok(Some(fence)));
                                    }
                                };
                                sqlx::query(AssertSqlSafe(sql.share_raise.clone()))
                                    .bind(&name)
                                    .bind(&token)
                                    .bind(&name)
                                    .execute(&mut *c)
                                    .await?;
                                Ok(Ok(Some(fence)))
                            })
                        })
                        .await;
                        match outcome {
                            // ER_LOCK_DEADLOCK: InnoDB rolled this attempt back to break a cycle
                            // of lock waits (duplicate-key inserts of a new name can make one):
                            // nothing was taken; as good as contention.
                            Err(e) if error_number(&e) == Some(1213) => Ok(Ok(None)),
                            other => other,
                        }
                    }
                    .boxed()
                })
                .await;
            let Some(reply) = reply? else {
                return Ok(None);
            };
            Ok(reply?.map(|f| lease.with_fencing(f)))
        };
        let won = lockcore::backend::acquire_detached_for(
            std::slice::from_ref(req),
            Some(bound),
            attempt,
        )
        .await?;
        Ok(won.map(|l| Acquired::new(l, sent_at)))
    }

    /// A set of exclusive leases in one READ COMMITTED transaction on one connection (see
    /// [`Backend::try_acquire_all`](lockcore::backend::Backend::try_acquire_all)): each
    /// member's `try_lock` upsert (`lease_acquire`, marking no writer), in the order given;
    /// rolled back at the first member it does not take (a holder, live shares), committed when
    /// it took them all. Each member's fence is the one its upsert reports, as a single
    /// acquisition's. Every member's row stays locked until the transaction ends: a single
    /// attempt on it waits for the set's outcome, and two sets lock their common rows in the
    /// same (canonical) order. A deadlock InnoDB breaks by rolling the set back (new names'
    /// duplicate-key inserts can make one) is a busy member, as for a share.
    ///
    /// Cancel safety: detached as a single attempt; a caller gone before the commit rolls the
    /// set back, and a set committed for a caller gone is released in the background.
    pub(crate) async fn try_set(
        &self,
        reqs: &[AcquireRequest],
    ) -> Result<lockcore::backend::SetAttempt> {
        for r in reqs {
            self.check_name(&r.name)?;
        }
        let sql = self.sql.clone();
        let members = crate::sets::SetMember::of(reqs);
        let leases: Vec<MyLease> = reqs.iter().map(|r| self.lease(r, 0)).collect();
        let conns = self.conns.clone();
        let bound = self.conns.bound();
        let sent_at = Instant::now();
        let attempt = move |gone: lockcore::backend::CallerGone| async move {
            let reply = conns
                .run_unless_gone(&gone, bound, "acquiring a set of leases", |c| {
                    let (sql, members, gone) = (sql.clone(), members.clone(), gone.clone());
                    async move { set_tx(c, &sql, &members, &gone).await }.boxed()
                })
                .await;
            match reply? {
                None => Err(crate::sets::set_abandoned()),
                Some(found) => found?.into_won(leases, MyLease::with_fencing),
            }
        };
        crate::sets::run_set_detached(reqs, sent_at, Some(bound), attempt).await
    }
}
