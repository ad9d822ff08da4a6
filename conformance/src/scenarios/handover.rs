//! Prompt hand-over on every path that frees capacity, not only an exclusive holder's release
//! (`waiting::notify_hands_over_promptly`): a permit given back, the last reader leaving, a
//! crashed holder's lease running out, a lock force-released behind its holder. Each waiter is
//! seen waiting before the capacity frees; a wake-up lost on one path (the waiter then gets the
//! lock at a safety poll, a second or more late) fails that path's scenario.

use std::time::Duration;

use lockcore::{Instant, LockGuard};

use super::context::{Ctx, Failure, Outcome};
use super::support::{check, must_be_held, must_try, ok_or, spawn_waiter};

/// How soon after the capacity frees a notified waiter must hold the lock (scaled).
const PROMPT: Duration = Duration::from_millis(400);

/// The waiter's guard and how long after `freed` it returned with it, failing past `bound`.
async fn granted_within(
    task: tokio::task::JoinHandle<(lockcore::Result<LockGuard>, Instant)>,
    freed: Instant,
    bound: Duration,
    path: &str,
) -> Result<(LockGuard, Instant), Failure> {
    let give_up = freed + bound + Duration::from_secs(10);
    let (r, got) = tokio::time::timeout_at(give_up, task)
        .await
        .map_err(|_| format!("{path}: the waiter had not got the lock 10 s past its bound"))?
        .map_err(|e| format!("{path}: the waiter's task: {e}"))?;
    let g = ok_or(r, &format!("{path}: the waiter's lock()"))?;
    let took = got.saturating_duration_since(freed);
    check!(
        took <= bound,
        "{path}: the waiter got the lock {took:?} after it freed (bound {bound:?}): its wake-up \
         on this path was lost, and a later poll found the lock free"
    );
    Ok((g, got))
}

/// Semaphore with notification: a waiter for one of 2 permits, both held, gets the one given
/// back within 400 ms (scaled) of its release.
pub(super) async fn freed_permit_hands_over_promptly(ctx: &Ctx) -> Outcome {
    let [a, b, w] = ctx.clients().await?;
    let name = ctx.name("sem");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(30))).permits(2);
    let ga = must_try(&a, &name, &opts, "the first permit holder").await?;
    let gb = must_try(&b, &name, &opts, "the second permit holder").await?;
    let task = spawn_waiter(ctx, &a, &w, &name, &opts.clone().wait_forever()).await?;
    let freed = Instant::now();
    ok_or(ga.release().await, "a permit's release")?;
    let (g, _) = granted_within(task, freed, ctx.bound(PROMPT), "a permit given back").await?;
    ok_or(g.release().await, "release")?;
    ok_or(gb.release().await, "release")
}

/// Read-write with notification: a writer waiting behind two readers gets the lock within
/// 400 ms (scaled) of the last reader leaving.
pub(super) async fn last_reader_leaving_hands_over_promptly(ctx: &Ctx) -> Outcome {
    let [r1, r2, w] = ctx.clients().await?;
    let name = ctx.name("rw");
    let ttl = ctx.ttl(Duration::from_secs(30));
    let read = ctx.opts(ttl).shared();
    let g1 = must_try(&r1, &name, &read, "the first reader").await?;
    let g2 = must_try(&r2, &name, &read, "the second reader").await?;
    let task = spawn_waiter(ctx, &r1, &w, &name, &ctx.opts(ttl).wait_forever()).await?;
    ok_or(g1.release().await, "the first reader's release")?;
    check!(
        !task.is_finished(),
        "the writer returned while a reader still held the lock"
    );
    let freed = Instant::now();
    ok_or(g2.release().await, "the last reader's release")?;
    let (g, _) = granted_within(task, freed, ctx.bound(PROMPT), "the last reader leaving").await?;
    ok_or(g.release().await, "release")
}

/// A crashed holder's lease runs out while a client waits: the waiter gets the lock after the
/// holder's validity deadline, and within a quarter of the TTL (a poller's backoff cap) and
/// 500 ms (scaled) of the lease's end, not seconds later.
pub(super) async fn expired_lease_hands_over_promptly(ctx: &Ctx) -> Outcome {
    let (h, [w]) = ctx.crashable_and_clients().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(1000));
    let opts = ctx.opts(ttl);
    let g = must_try(&h, &name, &opts, "the holder that will crash").await?;
    let (acquired, valid_until) = (g.acquired_at(), g.valid_until());
    ctx.harness.crash(g, h).await;
    let wait = opts
        .clone()
        .wait_timeout(ttl * 3 + ctx.bound(Duration::from_secs(10)));
    let task = spawn_waiter(ctx, &w, &w, &name, &wait).await?;
    let ends = acquired + ttl;
    let bound = ttl / 4 + ctx.bound(Duration::from_millis(500));
    let (g, got) = granted_within(task, ends, bound, "the holder's lease running out").await?;
    check!(
        got >= valid_until,
        "the waiter got the lock {:?} before the crashed holder's validity deadline",
        valid_until - got
    );
    ok_or(g.release().await, "release")
}

/// With notification: a lock force-released behind its holder while a client waits is the
/// waiter's within 400 ms (scaled) of the revocation.
pub(super) async fn revoked_lock_hands_over_promptly(ctx: &Ctx) -> Outcome {
    let [h, w] = ctx.clients().await?;
    let name = ctx.name("x");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(30)));
    let g = must_try(&h, &name, &opts, "the holder").await?;
    let task = spawn_waiter(ctx, &h, &w, &name, &opts.clone().wait_forever()).await?;
    let freed = Instant::now();
    ok_or(ctx.harness.revoke(&name).await, "revoking the lock")?;
    let (g2, _) = granted_within(task, freed, ctx.bound(PROMPT), "a force release").await?;
    // The revoked holder's guard, dropped, releases in the background: owner-checked, it must
    // leave the waiter's lock alone.
    drop(g);
    h.flush().await;
    must_be_held(
        &h,
        &name,
        &opts,
        "after the revoked holder's guard was dropped, with the waiter holding",
    )
    .await?;
    ok_or(g2.release().await, "the waiter's release")
}
