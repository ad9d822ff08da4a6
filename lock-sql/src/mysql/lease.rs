//! MariaDB leases on the shared lease engine ([`crate::lease`]): an exclusive attempt is one
//! conditional upsert (its outcome read from the OK packet), a set every member's upsert in
//! one transaction; shares are in `shares.rs`.

use super::*;
use crate::lease::{Found, Held, LeaseStatements, SqlLease};
use crate::sets::SetMember;

/// Whether a row lock holds the key of `name` (asked after an exclusive lease attempt created
/// the name's row: see `crate::mysql::exclusion`).
pub(super) async fn key_used(c: &mut MySqlConnection, sql: &Sql, name: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar(AssertSqlSafe(sql.key_used.clone()))
        .bind(name)
        .fetch_one(c)
        .await
}

/// What an exclusive upsert's `LAST_INSERT_ID` says (see `Sql::lease_acquire`).
fn found(id: u64) -> Found<()> {
    match id {
        HELD_BY_PERMITS => Found::Conflict,
        0 | HELD_BY_READERS => Found::Busy(()),
        fence => Found::Won(fence),
    }
}

/// One exclusive attempt's upsert for `m` on `c` (`mark_us`: a waiting writer's mark, µs, 0
/// for none): its answer, and whether it created the name's row (a won new row was judged
/// before the row existed: a row lock may hold the name's key, see `crate::mysql::exclusion`;
/// the caller asks [`key_used`]).
async fn upsert(
    c: &mut MySqlConnection,
    sql: &Sql,
    m: &SetMember,
    mark_us: u64,
) -> sqlx::Result<(Found<()>, bool)> {
    let ttl_us = m.ttl.as_micros() as u64;
    let (name, token) = (m.name.as_str(), m.token.as_str());
    let r = lease_acquire_query(&sql.lease_acquire, name, token, ttl_us, &m.holder, mark_us)
        .execute(c)
        .await?;
    // A taken row always changes (rows affected 2): 1 is a new row.
    Ok((found(r.last_insert_id()), r.rows_affected() == 1))
}

/// A MariaDB lease's statements once held (see [`LeaseStatements`]).
pub(super) struct MyHeld {
    pub(super) conns: Arc<MyConns>,
    pub(super) sql: Arc<Sql>,
}

impl MyHeld {
    /// Runs `sql` (`ttl` µs first where it takes one, then name and token): the rows it
    /// matched.
    async fn update(
        &self,
        sql: &str,
        held: &Held,
        ttl: Option<Duration>,
        what: &str,
    ) -> Result<u64> {
        let sql = sql.to_owned();
        let name = held.name.as_str().to_owned();
        let token = held.token.to_hex();
        // FOUND_ROWS is on: this counts matched rows, so an extend within the same microsecond
        // still reports 1.
        self.conns
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
            .await
    }
}

#[lockcore::backend::async_trait]
impl LeaseStatements for MyHeld {
    async fn extend(&self, held: &Held, ttl: Duration) -> Result<u64> {
        if held.share {
            return extend_share(&self.conns, &self.sql, held, ttl).await;
        }
        let sql = &self.sql.lease_extend;
        self.update(sql, held, Some(ttl), "extending a lease").await
    }

    async fn release(&self, held: &Held) -> Result<u64> {
        if held.share {
            let token = Some(held.token.to_hex());
            return release_shares(&self.conns, &self.sql, &held.name, token).await;
        }
        let sql = &self.sql.lease_release;
        self.update(sql, held, None, "releasing a lease").await
    }
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
        let member = SetMember::one(req);
        let sql = self.sql.clone();
        let conns = self.conns.clone();
        let mark = if waits {
            crate::shares::WRITER_MARK.as_micros() as u64
        } else {
            0
        };
        let attempt = move |gone| async move {
            conns
                .run_unless_gone(&gone, bound, "acquiring a lease", move |c| {
                    let (sql, m) = (sql.clone(), member.clone());
                    async move {
                        let (found, created) = upsert(c, &sql, &m, mark).await?;
                        let name = m.name.as_str();
                        // Taken on a new row beside a row lock: given back (committed already).
                        if matches!(found, Found::Won(_))
                            && created
                            && key_used(c, &sql, name).await?
                        {
                            sqlx::query(AssertSqlSafe(sql.lease_release.clone()))
                                .bind(name)
                                .bind(&m.token)
                                .execute(&mut *c)
                                .await?;
                            return Ok(Found::Busy(()));
                        }
                        Ok(found)
                    }
                    .boxed()
                })
                .await
        };
        let lease = SqlLease::of(&self.held, req);
        let (won, ()) = crate::lease::attempt_detached(req, Some(bound), lease, attempt).await?;
        Ok(won)
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
        crate::lease::try_set_on(&self.conns, &self.held, reqs, move |c, m| {
            let sql = sql.clone();
            async move { set_member(c, &sql, m).await }.boxed()
        })
        .await
    }
}

/// One member's upsert in a set's transaction. A member that created its row was judged
/// before the row existed: if a row lock holds the key it is busy (see
/// `crate::mysql::exclusion`), and so is every member when InnoDB rolled the set back to break
/// a deadlock (ER_LOCK_DEADLOCK: new names' duplicate-key inserts can make one).
async fn set_member(c: &mut MySqlConnection, sql: &Sql, m: &SetMember) -> sqlx::Result<Found<()>> {
    let reply = match upsert(c, sql, m, 0).await {
        Ok((Found::Won(_), true)) if key_used(c, sql, m.name.as_str()).await? => Found::Busy(()),
        Ok((found, _)) => found,
        Err(e) if error_number(&e) == Some(1213) => Found::Busy(()),
        Err(e) => return Err(e),
    };
    Ok(reply)
}
