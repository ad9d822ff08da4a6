//! The lease of a primitive's holder across its life: renewed, then checked (a renewed writer
//! still excludes readers, a renewed permit still counts); crashed after renewals, or after
//! winning by waiting in the queue, its permit back on time: not before its validity deadline,
//! not long after its lease's end. The mutex has these checks in `renewal` and `expiry`; a
//! backend writes a share's, a permit's and a queued grant's entry by other paths.

use std::time::Duration;

use lockcore::{AutoRenew, Instant, LockGuard, LockName, LockOptions, Locker};

use super::context::{Ctx, Failure, Outcome};
use super::support::{
    check, must_be_held, must_try, ok_or, race_for, settle_waiters, spawn_waiter,
};

/// How many renewals a renewed holder goes through before each check (renewals come every
/// third of a TTL).
const RENEWALS: u32 = 6;

/// Checks `held` (with `what` it is) at the middle of each of the next [`RENEWALS`] renewal
/// periods of `guard` (every third of its TTL), with `check`; fails as soon as one does.
async fn after_each_renewal<F, Fut>(guard: &LockGuard, what: &str, mut check: F) -> Outcome
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let (start, ttl) = (guard.acquired_at(), guard.ttl());
    for k in 1..=RENEWALS {
        let at = ttl / 3 * k + ttl / 6;
        tokio::time::sleep_until(start + at).await;
        check(format!("{at:?} into {what} renewed every {:?}", ttl / 3)).await?;
        check!(
            guard.is_valid(),
            "{what} lost its lease while renewing ({:?})",
            guard.lost().reason()
        );
    }
    Ok(())
}

/// Read-write: a writer renewed several times still excludes readers and other writers (a
/// renewal that rewrites its entry as a share lets readers in).
pub(super) async fn renewed_writer_still_excludes_readers(ctx: &Ctx) -> Outcome {
    let [w, r] = ctx.clients().await?;
    let name = ctx.name("rw");
    let ttl = ctx.ttl(Duration::from_millis(600));
    let write = ctx.opts(ttl).auto_renew(AutoRenew::until(ttl * 20));
    let (read, other_write) = (ctx.opts(ttl).shared(), ctx.opts(ttl));
    let g = must_try(&w, &name, &write, "the writer").await?;
    after_each_renewal(&g, "a writer's lease", |when| {
        let (r, name, read, other_write) = (&r, &name, &read, &other_write);
        async move {
            must_be_held(r, name, read, &format!("a reader {when}")).await?;
            must_be_held(r, name, other_write, &format!("a second writer {when}")).await
        }
    })
    .await?;
    ok_or(g.release().await, "the writer's release")?;
    let g = must_try(&r, &name, &read, "a reader after the writer left").await?;
    ok_or(g.release().await, "release")
}

/// Permits: two holders of 2 permits renewed several times still fill the semaphore (a
/// renewal that writes the expiry in the wrong unit frees a permit too many); where leases end
/// by their TTL, one of them that then crashes gets its permit back after its last renewal's
/// lease, not before its validity deadline and not long after it (a renewal in the other wrong
/// unit leaks it).
pub(super) async fn renewed_permit_counts_and_expires_on_time(ctx: &Ctx) -> Outcome {
    let (a, [b, c]) = ctx.crashable_and_clients().await?;
    let name = ctx.name("sem");
    let ttl = ctx.ttl(Duration::from_millis(600));
    let renewed = ctx
        .opts(ttl)
        .permits(2)
        .auto_renew(AutoRenew::until(ttl * 20));
    let plain = ctx.opts(ttl).permits(2);
    let ga = must_try(&a, &name, &renewed, "the first permit holder").await?;
    let gb = must_try(&b, &name, &renewed, "the second permit holder").await?;
    after_each_renewal(&ga, "a permit's lease", |when| {
        let (c, name, plain) = (&c, &name, &plain);
        async move {
            must_be_held(
                c,
                name,
                plain,
                &format!("a third client with both permits renewed, {when}"),
            )
            .await
        }
    })
    .await?;
    check!(
        gb.is_valid(),
        "the second permit holder lost its lease while renewing ({:?})",
        gb.lost().reason()
    );
    if ctx.caps.expiry_after_ttl {
        lease_back_on_time(ctx, &c, &name, &plain, ga, a, "a permit renewed").await?;
    } else {
        ok_or(ga.release().await, "release")?;
    }
    ok_or(gb.release().await, "release")
}

/// Permits: a holder that won its permit by waiting in the queue (granted when another holder
/// left) and then crashes gets it back after its TTL: a permit granted from the queue is
/// written with the waiter's TTL too.
pub(super) async fn permit_won_by_waiting_returns_after_crash(ctx: &Ctx) -> Outcome {
    let (a, [b, h, c]) = ctx.crashable_and_clients().await?;
    let name = ctx.name("sem");
    let ttl = ctx.ttl(Duration::from_millis(1000));
    let long = ctx.opts(ctx.ttl(Duration::from_secs(30))).permits(2);
    let plain = ctx.opts(ttl).permits(2);
    // Both permits held (one for the whole scenario): the waiter queues.
    let other = must_try(&b, &name, &long, "the holder of the other permit").await?;
    let leaving = must_try(&h, &name, &long, "the holder that will leave").await?;
    let won = win_by_waiting(ctx, &a, &c, &name, &plain, leaving).await?;
    lease_back_on_time(ctx, &c, &name, &plain, won, a, "a permit won by waiting").await?;
    ok_or(other.release().await, "release")
}

/// Read-write: a reader that won its share by waiting behind a writer (granted when the
/// writer left) and then crashes gives it back after its TTL: a share granted to a waiter is
/// written with the waiter's TTL too. A writer finds the lock held until then.
pub(super) async fn reader_won_by_waiting_returns_after_crash(ctx: &Ctx) -> Outcome {
    let (a, [h, c]) = ctx.crashable_and_clients().await?;
    let name = ctx.name("rw");
    let ttl = ctx.ttl(Duration::from_millis(1000));
    let writer = must_try(
        &h,
        &name,
        &ctx.opts(ctx.ttl(Duration::from_secs(30))),
        "the writer",
    )
    .await?;
    let won = win_by_waiting(ctx, &a, &c, &name, &ctx.opts(ttl).shared(), writer).await?;
    lease_back_on_time(
        ctx,
        &c,
        &name,
        &ctx.opts(ttl),
        won,
        a,
        "a share won by waiting",
    )
    .await
}

/// Read-write: a writer that won the lock by waiting behind a reader (granted when the reader
/// left) and then crashes gives it back after its TTL: a writer granted from behind readers
/// is written with its own TTL too. A reader finds the lock held until then.
pub(super) async fn writer_won_by_waiting_returns_after_crash(ctx: &Ctx) -> Outcome {
    let (a, [h, c]) = ctx.crashable_and_clients().await?;
    let name = ctx.name("rw");
    let ttl = ctx.ttl(Duration::from_millis(1000));
    let long_read = ctx.opts(ctx.ttl(Duration::from_secs(30))).shared();
    let reader = must_try(&h, &name, &long_read, "the reader").await?;
    let won = win_by_waiting(ctx, &a, &c, &name, &ctx.opts(ttl), reader).await?;
    let read = ctx.opts(ttl).shared();
    lease_back_on_time(ctx, &c, &name, &read, won, a, "a write lock won by waiting").await
}

/// `waiter` waits for `name` with `opts` until `leaving` (the holder in its way) releases,
/// seen waiting first by `observer`; the guard it wins.
async fn win_by_waiting(
    ctx: &Ctx,
    waiter: &Locker,
    observer: &Locker,
    name: &LockName,
    opts: &LockOptions,
    leaving: LockGuard,
) -> Result<LockGuard, Failure> {
    let task = spawn_waiter(ctx, observer, waiter, name, opts).await?;
    ok_or(leaving.release().await, "the leaving holder's release")?;
    let bound = ctx.bound(Duration::from_secs(10));
    let won = tokio::time::timeout(bound, task)
        .await
        .map_err(|_| format!("the waiter did not get what was freed within {bound:?}"))?;
    ok_or(ok_or(won, "the waiter's task")?.0, "the waiter's lock()")
}

/// Crashes the holder of `guard` (`how` it got it) and checks that what it held comes back to
/// `racer` asking with `opts` (which finds it held meanwhile) after its validity deadline, and
/// by the end of its lease (its last renewal's, which may have been on the way at the crash: a
/// third of a TTL later) plus half a TTL and a bound.
async fn lease_back_on_time(
    ctx: &Ctx,
    racer: &Locker,
    name: &LockName,
    opts: &LockOptions,
    guard: LockGuard,
    client: Locker,
    how: &str,
) -> Outcome {
    let (valid_until, ttl) = (guard.valid_until(), guard.ttl());
    ctx.harness.crash(guard, client).await;
    must_be_held(
        racer,
        name,
        opts,
        &format!("right after the crash of the holder of {how}"),
    )
    .await?;
    let late = valid_until + ttl / 3 + ttl / 2 + ctx.bound(Duration::from_millis(500));
    let g = race_for(racer, name, opts, Instant::now(), late)
        .await
        .map_err(|e| {
            format!(
                "what the crashed holder held ({how}) was not back {:?} after its validity \
                 deadline (TTL {ttl:?}): a leak: {e}",
                late - valid_until
            )
        })?;
    let won_by = Instant::now();
    check!(
        won_by >= valid_until,
        "what the crashed holder held ({how}) was handed out {:?} before its validity \
         deadline: a holder too many",
        valid_until - won_by
    );
    ok_or(g.release().await, "release")
}

/// Read-write: a writer that has waited behind a reader for longer than any of a backend's
/// own timers (a writer's mark lasts 2 s on Redis and 3 s on the SQL leases past the writer's
/// last attempt; queue entries and sessions have theirs) still holds later readers back: a
/// reader tried after 1, 2, ... 6 s of the writer's wait is refused each time, and the writer
/// gets the lock when the first reader leaves.
pub(super) async fn writer_waiting_past_its_marks_holds_readers_back(ctx: &Ctx) -> Outcome {
    const LOOKS: u32 = 6;
    let [r1, r2, w] = ctx.clients().await?;
    let name = ctx.name("rw");
    let ttl = ctx.ttl(Duration::from_secs(30));
    let read = ctx.opts(ttl).shared();
    let g1 = must_try(&r1, &name, &read, "the first reader").await?;
    let writer = {
        let (w, name, opts) = (w.clone(), name.clone(), ctx.opts(ttl).wait_forever());
        tokio::spawn(async move { w.lock(&name, &opts).await })
    };
    settle_waiters(ctx, &r1, &name, &[&w]).await?;
    let queued = Instant::now();
    let step = ctx.bound(Duration::from_secs(1));
    for k in 1..=LOOKS {
        tokio::time::sleep_until(queued + step * k).await;
        check!(
            !writer.is_finished(),
            "the writer returned while the first reader held the lock"
        );
        must_be_held(
            &r2,
            &name,
            &read,
            &format!(
                "a reader {:?} after a writer queued behind a reader",
                step * k
            ),
        )
        .await?;
    }
    ok_or(g1.release().await, "the first reader's release")?;
    let bound = ctx.bound(Duration::from_secs(10));
    let gw = tokio::time::timeout(bound, writer).await.map_err(|_| {
        format!("the writer did not get the lock within {bound:?} of the reader's release")
    })?;
    let gw = ok_or(ok_or(gw, "the writer's task")?, "the writer's lock()")?;
    ok_or(gw.release().await, "the writer's release")
}
