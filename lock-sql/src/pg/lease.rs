//! PostgreSQL leases on the shared lease engine ([`crate::lease`]): an exclusive attempt is
//! one statement (read first, then one conditional upsert, the queue entered or renewed), a
//! share one call of the share function; a set is every member's statement in one
//! transaction. The waits are in `lease_wait`.

use super::*;
use crate::lease::{Found, Held, LeaseStatements, SqlLease};
use crate::sets::SetMember;
use lockcore::backend::Revocations;

/// An exclusive attempt's answer: the won lease's fence, the holder's remaining seconds, whether
/// permits hold the name, whether a queued waiter is ahead, and the `lazy` commit's count.
type AttemptRow = (Option<i64>, Option<f64>, Option<bool>, bool, i64);

/// What an exclusive attempt's row says.
fn found(row: AttemptRow) -> Found<(Option<Duration>, bool)> {
    let (fence, remaining, permits, behind, _lazy) = row;
    if permits == Some(true) {
        return Found::Conflict;
    }
    match fence {
        Some(f) => Found::Won(f as u64),
        // Behind another waiter: the holder's expiry is the head's to act on.
        None => Found::Busy((
            remaining
                .filter(|r| !behind && r.is_finite() && *r > 0.0)
                .map(|r| Duration::from_secs_f64(r.min(1e6))),
            behind,
        )),
    }
}

/// One exclusive attempt's statement (`sql`: `lease_acquire`) for `m`, with the writer's
/// mark (µs from now, 0 for none), whether a loser enters the waiters' queue and, for one that
/// asks a release to grant it the lock (`handover=grant`), this attempt's number and the
/// claim TTL. A row lock or a transaction lock holding the name's key makes it busy.
async fn exclusive_row(
    c: &mut PgConnection,
    sql: String,
    m: SetMember,
    mark_us: f64,
    queue: bool,
    ask: Option<Ask>,
) -> sqlx::Result<AttemptRow> {
    let row = sqlx::query_as(AssertSqlSafe(sql))
        .bind(m.name.as_str())
        .bind(&m.token)
        .bind(m.ttl.as_micros() as f64)
        .bind(&m.holder)
        .bind(mark_us)
        .bind(queue)
        .bind(QUEUE_ENTRY_TTL.as_micros() as f64)
        .bind(ask.map(|a| a.number as i64))
        .bind(ask.map_or(0.0, |a| a.claim.as_micros() as f64))
        .fetch_one(c)
        .await;
    match row {
        Err(e) if super::exclusion::key_busy(&e) => Ok((None, None, None, false, 0)),
        other => other,
    }
}

/// What a queued attempt leaves for a release to grant its waiter the lock
/// (`handover=grant`, see `handover`): its number and the claim TTL.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ask {
    pub(super) number: u64,
    pub(super) claim: Duration,
}

/// A PostgreSQL lease's statements once held (see [`LeaseStatements`]).
pub(super) struct PgHeld {
    pub(super) conns: Arc<PgConns>,
    pub(super) sql: Arc<Sql>,
    pub(super) table: String,
    /// The leases a revocation notice on the table's channel reaches (see
    /// [`PgBackend::revoke`]), fed by the release listener.
    pub(super) revocations: Arc<Revocations>,
}

#[lockcore::backend::async_trait]
impl LeaseStatements for PgHeld {
    async fn extend(&self, held: &Held, ttl: Duration) -> Result<u64> {
        let share = held.share;
        let (what, sql) = if share {
            ("extending a share", self.sql.share_extend.clone())
        } else {
            ("extending a lease", self.sql.lease_extend.clone())
        };
        let (name, token) = (held.name.as_str().to_owned(), held.token.to_hex());
        let us = ttl.as_micros() as f64;
        self.conns
            .run(self.conns.bound(), what, move |c| {
                let q = sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(name.clone())
                    .bind(token.clone())
                    .bind(us);
                // A share's statement counts what it extended (it touches two tables).
                if share {
                    q.fetch_one(c)
                        .map(|r| r.and_then(|row| sqlx::Row::try_get::<i64, _>(&row, 0)))
                        .map(|n| n.map(|n| n.max(0) as u64))
                        .boxed()
                } else {
                    q.execute(c).map(|r| r.map(|r| r.rows_affected())).boxed()
                }
            })
            .await
    }

    async fn release(&self, held: &Held) -> Result<u64> {
        let token = Some(held.token.to_hex());
        if held.share {
            return release_shares(&self.conns, &self.sql, &held.name, token, &self.table).await;
        }
        let sql = &self.sql.lease_release;
        let what = "releasing a lease";
        release_counted(&self.conns, what, sql, &held.name, token, &self.table).await
    }

    fn revocations(&self) -> Option<&Arc<Revocations>> {
        Some(&self.revocations)
    }
}

impl PgBackend {
    /// One attempt: the lease (or share), or the current holder's remaining time if the
    /// database knows it and no queued waiter is ahead of this one, and whether one is. `waits`: the attempt
    /// belongs to a waiting `lock()`, whose writer marks itself as waiting behind shared
    /// holders (a `try_lock` marks nothing); `queue`: an exclusive attempt that loses enters
    /// the waiters' queue (or renews its entry there), asking for a grant with `ask`; `in_flight`,
    /// its wait's lock held until the (detached) attempt is done, so that the wait's clean-up
    /// removes its entry after it.
    ///
    /// Cancel safety: a share or lease won by an attempt whose caller is gone is released in
    /// the background.
    pub(super) async fn lease_attempt(
        &self,
        req: &AcquireRequest,
        bound: Instant,
        waits: bool,
        queue: bool,
        ask: Option<Ask>,
        in_flight: Option<&Arc<tokio::sync::Mutex<()>>>,
    ) -> Result<(Option<Acquired>, Option<Duration>, bool)> {
        if req.mode != LockMode::Exclusive {
            let (won, left) = self.share_attempt(req, bound).await?;
            return Ok((won, left, false));
        }
        let member = SetMember::one(req);
        let sql = self.sql.lease_acquire.clone();
        let mark = if waits {
            crate::shares::WRITER_MARK.as_micros() as f64
        } else {
            0.0
        };
        let conns = self.conns.clone();
        let turn = match in_flight {
            Some(m) => Some(m.clone().lock_owned().await),
            None => None,
        };
        let attempt = move |gone| async move {
            // Held until this attempt is answered: a queue entry it makes is there before the
            // wait's clean-up looks.
            let _turn = turn;
            let reply: Option<AttemptRow> = conns
                .run_unless_gone(&gone, bound, "acquiring a lease", move |c| {
                    exclusive_row(c, sql.clone(), member.clone(), mark, queue, ask).boxed()
                })
                .await?;
            Ok(reply.map(found))
        };
        let lease = SqlLease::of(&self.held, req);
        let (won, (left, behind)) =
            crate::lease::attempt_detached(req, Some(bound), lease, attempt).await?;
        Ok((won, left, behind))
    }

    /// One share attempt: one call of the share function, which locks the name's lease row
    /// and decides under it (see [`crate::shares`] and `ddl::share_functions`).
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
        let conns = self.conns.clone();
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
            Ok(
                reply.map(|(fence, wait, conflict)| match (fence, conflict) {
                    (_, true) => Found::Conflict,
                    (Some(f), false) => Found::Won(f as u64),
                    (None, false) => Found::Busy(wait.and_then(crate::shares::secs)),
                }),
            )
        };
        let lease = SqlLease::of(&self.held, req);
        crate::lease::attempt_detached(req, Some(bound), lease, attempt).await
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
    release_counted(
        conns,
        "releasing shares",
        &sql.share_release,
        name,
        token,
        table,
    )
    .await
}

/// Runs a release statement (`sql`: the lease's or the shares') of `name` for `token` (`None`:
/// every holder), whose notifications go to `table`'s channel: how many it released.
///
/// Cancel safety: dropping the future may or may not have released them.
async fn release_counted(
    conns: &PgConns,
    what: &str,
    sql: &str,
    name: &LockName,
    token: Option<String>,
    table: &str,
) -> Result<u64> {
    let (sql, name, table) = (sql.to_owned(), name.as_str().to_owned(), table.to_owned());
    let n: i64 = conns
        .run(conns.bound(), what, move |c| {
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
        crate::lease::try_set_on(&self.conns, &self.held, reqs, move |c, m| {
            exclusive_row(c, sql.clone(), m.clone(), 0.0, false, None)
                .map(|row| row.map(|row| found(row).without_wait()))
                .boxed()
        })
        .await
    }
}
