//! MariaDB shares (shared holders and permits, see [`crate::shares`]): an attempt or an extend
//! is one call of a share procedure where it exists, else a transaction of statements on the
//! name's locked lease row; a release is one statement.

use super::*;
use crate::lease::{Found, Held, SqlLease};

impl MyBackend {
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
        let conns = self.conns.clone();
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
            Ok(match reply? {
                None => None,
                Some(outcome) => Some(match outcome? {
                    Some(fence) => Found::Won(fence),
                    None => Found::Busy(()),
                }),
            })
        };
        let lease = SqlLease::of(&self.held, req);
        let (won, ()) = crate::lease::attempt_detached(req, Some(bound), lease, attempt).await?;
        Ok(won)
    }
}

/// Extends a share (`held`) to `ttl` from now, with the lease row locked: the share
/// procedure's call where it exists, else a transaction of the statements. The rows matched.
///
/// Cancel safety: dropping the future may or may not have extended it.
pub(super) async fn extend_share(
    conns: &MyConns,
    sql: &Arc<Sql>,
    held: &Held,
    ttl: Duration,
) -> Result<u64> {
    let (sql, name, token) = (
        sql.clone(),
        held.name.as_str().to_owned(),
        held.token.to_hex(),
    );
    let us = ttl.as_micros() as u64;
    conns
        .run(conns.bound(), "extending a share", move |c| {
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
        .await
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
