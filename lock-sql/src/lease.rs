//! The lease engine every dialect shares (PostgreSQL, MariaDB, SQLite): how an attempt runs
//! (detached, what it wins for a caller gone released after it), what its answer means (won
//! with a fence, busy, or a conflict of modes), the lease a holder keeps (its renewal and
//! release judged by the rows the dialect's statement matched), and an exclusive set taken in
//! one transaction. A dialect gives only its statements: [`LeaseStatements`] for a held lease,
//! a closure running one attempt's statement, one member's statement in a set's transaction.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use lockcore::backend::{
    AcquireRequest, Acquired, CallerGone, Lease, LostReporter, RevocationWatch, Revocations,
};
use lockcore::{Instant, LockName, OwnerToken, Result};

use crate::sets::{SetFound, SetMember};

/// What one attempt's statement found.
pub(crate) enum Found<X> {
    /// Taken, with this fencing token.
    Won(u64),
    /// Not taken: held, or not this attempt's turn; `X` is what the dialect learnt of the
    /// wait (the holder's time left, a queue position), `Default` when nothing.
    Busy(X),
    /// Held in a mode this request cannot share (a semaphore is not a mutex).
    Conflict,
}

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
impl<X> Found<X> {
    /// This answer without what a busy attempt learnt of the wait (a set member's).
    pub(crate) fn without_wait(self) -> Found<()> {
        match self {
            Found::Won(fence) => Found::Won(fence),
            Found::Busy(_) => Found::Busy(()),
            Found::Conflict => Found::Conflict,
        }
    }
}

/// Which lease a statement is about: the name, the holder's owner token, and whether it is a
/// share (a shared holder's or a permit's row of the shares table) or the lock row.
#[derive(Clone)]
pub(crate) struct Held {
    pub(crate) name: LockName,
    pub(crate) token: OwnerToken,
    pub(crate) share: bool,
}

/// The statements of a held lease or share, in one dialect: all a dialect gives
/// [`SqlLease`].
#[lockcore::backend::async_trait]
pub(crate) trait LeaseStatements: Send + Sync + 'static {
    /// Extends `held` to `ttl` from now on the database clock, if it is still held: the rows
    /// it matched (0: no longer held).
    ///
    /// Cancel safety: dropping the future may or may not have extended it.
    async fn extend(&self, held: &Held, ttl: Duration) -> Result<u64>;

    /// Releases `held` if it is still held, waking the waiters as the dialect does: the rows
    /// it freed (0: no longer held).
    ///
    /// Cancel safety: dropping the future may or may not have released it.
    async fn release(&self, held: &Held) -> Result<u64>;

    /// Where this client hears revocation notices (PostgreSQL's `NOTIFY`), if the dialect has
    /// them: a won lease is registered there until it is dropped.
    fn revocations(&self) -> Option<&Arc<Revocations>> {
        None
    }
}

/// A lease (or a share: a row of the shares table) held through a dialect's statements.
pub(crate) struct SqlLease<S> {
    statements: Arc<S>,
    held: Held,
    fencing: u64,
    revocation: Revocation,
}

/// A lease's place in its client's revocation notices (see [`LeaseStatements::revocations`]).
#[derive(Clone)]
enum Revocation {
    /// The dialect has none, or the client does not listen.
    Unheard,
    /// Not won yet: the lost signal a notice will fire once it is (a reporter: a lease must not
    /// keep its request alive, or the late win of a cancelled attempt is not released).
    Pending(LostReporter),
    /// Won: registered (shared by the lease's clones; the last one dropped unregisters it).
    Watched { _registration: Arc<RevocationWatch> },
}

impl<S> Clone for SqlLease<S> {
    fn clone(&self) -> Self {
        SqlLease {
            statements: self.statements.clone(),
            held: self.held.clone(),
            fencing: self.fencing,
            revocation: self.revocation.clone(),
        }
    }
}

impl<S> fmt::Debug for SqlLease<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlLease")
            .field("name", &self.held.name)
            .field("token", &self.held.token)
            .field("fencing", &self.fencing)
            .finish()
    }
}

impl<S: LeaseStatements> SqlLease<S> {
    /// The lease `req` asks for, not won yet (its fence comes with the win).
    pub(crate) fn of(statements: &Arc<S>, req: &AcquireRequest) -> Self {
        let held = Held {
            name: req.name.clone(),
            token: req.token,
            share: req.mode != lockcore::LockMode::Exclusive,
        };
        let revocation = match statements.revocations() {
            Some(r) if r.listening() => Revocation::Pending(req.lost.reporter()),
            _ => Revocation::Unheard,
        };
        SqlLease {
            statements: statements.clone(),
            held,
            fencing: 0,
            revocation,
        }
    }

    /// This lease, won with this fencing token: from now on a revocation notice naming it
    /// fires its lost signal. Registered at the win, not before: an attempt that loses
    /// registers nothing (a lost attempt of a retried request, still running detached, must
    /// not unregister the retry's win when it ends).
    pub(crate) fn with_fencing(self, fencing: u64) -> Self {
        let revocation = match (self.revocation, self.statements.revocations()) {
            (Revocation::Pending(lost), Some(r)) => r
                .watch_until_dropped(self.held.token.uuid().as_u128(), lost)
                .map_or(Revocation::Unheard, |w| Revocation::Watched {
                    _registration: Arc::new(w),
                }),
            (other, _) => other,
        };
        SqlLease {
            fencing,
            revocation,
            ..self
        }
    }
}

#[lockcore::backend::async_trait]
impl<S: LeaseStatements> Lease for SqlLease<S> {
    fn fencing_token(&self) -> Option<u64> {
        Some(self.fencing)
    }

    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        let n = self.statements.extend(&self.held, ttl).await?;
        crate::sql_errors::owner_checked(n)?;
        Ok(ttl)
    }

    async fn release(&self) -> Result<()> {
        let n = self.statements.release(&self.held).await?;
        crate::sql_errors::owner_checked(n)
    }
}

/// One attempt for `req`, run detached by `run` (given whether its caller is gone; `None`
/// when it sent nothing because the caller left first): a cancelled caller's statement may
/// still commit, after a release sent on another connection at the drop, so what it wins is
/// released after it ([`lockcore::backend::acquire_detached_for`]). The caller waits until
/// `bound` at most. Returns the acquisition, sent now, and what a busy attempt learnt.
///
/// Cancel safe: what a dropped call's attempt wins is released in the background.
pub(crate) async fn attempt_detached<S, X, F, Fut>(
    req: &AcquireRequest,
    bound: Option<Instant>,
    lease: SqlLease<S>,
    run: F,
) -> Result<(Option<Acquired>, X)>
where
    S: LeaseStatements,
    X: Default + Send + 'static,
    F: FnOnce(CallerGone) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Option<Found<X>>>> + Send + 'static,
{
    let mode = req.mode;
    let sent_at = Instant::now();
    let attempt = move |gone| async move {
        Ok(match run(gone).await? {
            None => (None, X::default()),
            Some(Found::Won(fence)) => (Some(lease.with_fencing(fence)), X::default()),
            Some(Found::Busy(x)) => (None, x),
            Some(Found::Conflict) => return Err(crate::shares::conflict(mode)),
        })
    };
    let (won, x) =
        lockcore::backend::acquire_detached_for(std::slice::from_ref(req), bound, attempt).await?;
    Ok((won.map(|l| Acquired::new(l, sent_at)), x))
}

/// The body of a set's transaction, begun by the dialect as it must be (`tx`): every member's
/// own exclusive attempt (`member`, on the transaction's connection) in the order given, rolled
/// back at the first member not taken (busy; a conflict is an error), and committed when all
/// were, unless the caller left meanwhile (rolled back: abandoned).
pub(crate) async fn take_members<DB, F>(
    mut tx: sqlx::Transaction<'_, DB>,
    members: &[SetMember],
    gone: &CallerGone,
    mut member: F,
) -> sqlx::Result<Result<SetFound>>
where
    DB: sqlx::Database,
    F: for<'t> FnMut(
        &'t mut DB::Connection,
        &'t SetMember,
    ) -> BoxFuture<'t, sqlx::Result<Found<()>>>,
{
    let mut fences = Vec::with_capacity(members.len());
    for (i, m) in members.iter().enumerate() {
        let found = match member(&mut tx, m).await {
            Ok(Found::Won(fence)) => {
                fences.push(fence);
                continue;
            }
            Ok(Found::Busy(())) => Ok(SetFound::Busy(i)),
            Ok(Found::Conflict) => Err(crate::shares::conflict(lockcore::LockMode::Exclusive)),
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e);
            }
        };
        tx.rollback().await?;
        return Ok(found);
    }
    if gone.is_gone() {
        tx.rollback().await?;
        return Ok(Ok(SetFound::Abandoned));
    }
    tx.commit().await?;
    Ok(Ok(SetFound::Won(fences)))
}

/// An exclusive set (see
/// [`Backend::try_acquire_all`](lockcore::backend::Backend::try_acquire_all)) on a dialect
/// whose connections are [`Conns`](crate::conns::Conns): one transaction on one connection,
/// every member's statement (`member`) by [`take_members`], run detached by
/// [`run_set_detached`](crate::sets::run_set_detached) with the operation bound; the leases of
/// a committed set are `held`'s.
///
/// Cancel safety: a caller gone before the commit rolls the set back, and a set committed for
/// a caller gone is released in the background.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn try_set_on<O, M, DB, S, F>(
    conns: &Arc<crate::conns::Conns<O, M>>,
    held: &Arc<S>,
    reqs: &[AcquireRequest],
    member: F,
) -> Result<lockcore::backend::SetAttempt>
where
    O: sqlx::ConnectOptions + 'static,
    O::Connection: sqlx::Connection<Database = DB> + Sized,
    DB: sqlx::Database<Connection = O::Connection>,
    M: Send + 'static,
    S: LeaseStatements,
    F: for<'t> Fn(&'t mut O::Connection, &'t SetMember) -> BoxFuture<'t, sqlx::Result<Found<()>>>
        + Clone
        + Send
        + Sync
        + 'static,
{
    use futures::FutureExt;
    let members = SetMember::of(reqs);
    let leases: Vec<SqlLease<S>> = reqs.iter().map(|r| SqlLease::of(held, r)).collect();
    let conns = conns.clone();
    let bound = conns.bound();
    let sent_at = Instant::now();
    let attempt = move |gone: CallerGone| async move {
        let reply = conns
            .run_unless_gone(&gone, bound, "acquiring a set of leases", |c| {
                let (members, gone, member) = (members.clone(), gone.clone(), member.clone());
                async move {
                    let tx = sqlx::Connection::begin(c).await?;
                    take_members(tx, &members, &gone, member).await
                }
                .boxed()
            })
            .await;
        match reply? {
            None => Err(crate::sets::set_abandoned()),
            Some(found) => found?.into_won(leases, SqlLease::with_fencing),
        }
    };
    crate::sets::run_set_detached(reqs, sent_at, Some(bound), attempt).await
}
