//! Cancellation: a wait or acquire dropped at any point (granted at the moment of the drop included) leaves nothing behind.

use std::time::Duration;

use lockcore::{ErrorKind, Instant, LockName, Locker};

use super::context::{Ctx, Failure, Outcome};
use super::support::{check, must_try, ok_or, settle_pending, settle_waiters};

pub(super) async fn cancelled_wait_leaves_nothing(ctx: &Ctx) -> Outcome {
    let [a, b, c, d] = ctx.clients().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_secs(30));
    let opts = ctx.opts(ttl);
    let g = must_try(&a, &name, &opts, "holder").await?;
    // Two waiters give up by being dropped (not by their own deadline), once queued: the
    // second behind the first, which still waits (so the count of two is the second's own
    // entry, never a leftover of the first), then the first at the head. Where the backend
    // reports its queue, each dropped waiter's entry must go, promptly (a server may take a
    // moment to notice a waiter's connection is gone).
    let wait = opts.clone().wait_forever();
    let mut waiting = vec![Box::pin(b.lock(&name, &wait))];
    settle_pending(ctx, &c, &name, &[&b], &mut waiting).await?;
    waiting.push(Box::pin(d.lock(&name, &wait)));
    settle_pending(ctx, &c, &name, &[&b, &d], &mut waiting).await?;
    // The second.
    drop(waiting.pop());
    d.flush().await;
    queue_drains_to(
        ctx,
        &c,
        &name,
        1,
        "the second waiter, dropped behind the first",
    )
    .await?;
    drop(waiting);
    b.flush().await;
    queue_drains_to(ctx, &c, &name, 0, "the first waiter, dropped at the head").await?;
    ok_or(g.release().await, "release")?;
    // A queue entry or lock left by the dropped waiters would make this wait for the TTL (30 s):
    // the wait may last that long, the bound below is far shorter.
    let start = Instant::now();
    let g = ok_or(
        c.lock(
            &name,
            &opts
                .clone()
                .wait_timeout(ttl + ctx.bound(Duration::from_secs(5))),
        )
        .await,
        "a new client after the cancelled waiters",
    )?;
    let took = start.elapsed();
    let bound = ctx.bound(Duration::from_secs(3));
    check!(
        took <= bound,
        "the lock was free only {took:?} after the cancelled waits (bound {bound:?}, TTL {ttl:?})"
    );
    ok_or(g.release().await, "release")
}

/// Two clients give up waiting, one by its wait timeout and one by being dropped, and then shut
/// down as a program ending would ([`Locker::shutdown`]), staying connected (so that no
/// session's end does their clean-up for them): once the holder releases, the next client gets
/// the lock within 1 s.
pub(super) async fn given_up_waiters_leave_nothing(ctx: &Ctx) -> Outcome {
    let [a, b, c, d] = ctx.clients().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_secs(30));
    let opts = ctx.opts(ttl);
    let g = must_try(&a, &name, &opts, "holder").await?;
    match b
        .lock(
            &name,
            &opts
                .clone()
                .wait_timeout(ctx.bound(Duration::from_millis(300))),
        )
        .await
    {
        Err(e) if e.kind() == ErrorKind::Timeout => {}
        other => {
            return Err(format!(
                "a wait on a held lock: expected Timeout, got {:?}",
                other.map(|g| g.name().clone())
            ));
        }
    }
    let forever = opts.clone().wait_forever();
    let mut dropped = [Box::pin(c.lock(&name, &forever))];
    settle_pending(ctx, &d, &name, &[&c], &mut dropped).await?;
    drop(dropped);
    let within = ctx.bound(Duration::from_secs(5));
    ok_or(
        b.shutdown(within).await,
        "shutdown of the client that timed out",
    )?;
    ok_or(
        c.shutdown(within).await,
        "shutdown of the client dropped while waiting",
    )?;
    ok_or(g.release().await, "release")?;
    let start = Instant::now();
    let g = ok_or(
        d.lock(
            &name,
            &opts
                .clone()
                .wait_timeout(ttl + ctx.bound(Duration::from_secs(5))),
        )
        .await,
        "the next client after the waiters gave up",
    )?;
    let took = start.elapsed();
    let bound = ctx.bound(Duration::from_secs(1));
    check!(
        took <= bound,
        "the next holder got the lock only {took:?} after the release (bound {bound:?}, TTL \
         {ttl:?}): a waiter that gave up left something behind"
    );
    ctx.observe(format!("the next holder {took:?} after the release"));
    ok_or(g.release().await, "release")
}

/// Where the backend reports its queue, waits until at most `n` waiters are queued on `name`
/// (a dropped waiter's entry gone), failing after a bound; nothing to wait for where it does
/// not.
async fn queue_drains_to(
    ctx: &Ctx,
    client: &Locker,
    name: &LockName,
    n: usize,
    dropped: &str,
) -> Outcome {
    let bound = ctx.bound(Duration::from_secs(2));
    let give_up = Instant::now() + bound;
    while let Ok(queued) = client.backend().queued_waiters(name).await {
        if queued <= n {
            break;
        }
        check!(
            Instant::now() < give_up,
            "{queued} waiters still queued {bound:?} after {dropped} was dropped (expected {n})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

pub(super) async fn grant_at_drop_leaves_nothing(ctx: &Ctx) -> Outcome {
    // A waiter is dropped at offsets from 4 ms before to 16 ms after the holder's release
    // starts, densest in the first 3 ms (a grant and the round trip that tells the waiter):
    // while it is woken, retrying, or being granted the lock (by the server's queue or its own
    // retry). Whatever it was granted must not stay held: with a 20 s TTL, a lock left to its
    // TTL shows as a new client waiting 20 s.
    const OFFSETS_US: [i64; 15] = [
        -4_000, -2_000, -1_000, -500, 0, 250, 500, 1_000, 1_500, 2_000, 3_000, 5_000, 8_000,
        12_000, 16_000,
    ];
    const LANES: usize = 5;
    const ROUNDS: usize = 3;
    let ttl = ctx.ttl(Duration::from_secs(20));
    let opts = ctx.opts(ttl);
    let bound = ctx.bound(Duration::from_secs(3));
    let mut lanes = Vec::new();
    for lane in 0..LANES {
        let [holder, waiter, next] = ctx.clients().await?;
        let (name, opts) = (ctx.name(&format!("l{lane}")), opts.clone());
        lanes.push(async move {
            for round in 0..ROUNDS {
                let offset_us = OFFSETS_US[lane * ROUNDS + round];
                let g = must_try(&holder, &name, &opts, "holder").await?;
                let task = {
                    let (waiter, name, opts) = (waiter.clone(), name.clone(), opts.clone());
                    tokio::spawn(async move { waiter.lock(&name, &opts.wait_forever()).await })
                };
                settle_waiters(ctx, &holder, &name, &[&waiter]).await?;
                check!(
                    !task.is_finished(),
                    "the waiter returned while the lock was held"
                );
                // A negative offset drops the waiter before the release starts.
                let t0 = Instant::now();
                let offset = Duration::from_micros(offset_us.unsigned_abs());
                let (release_at, cut_at) = if offset_us < 0 {
                    (t0 + offset, t0)
                } else {
                    (t0, t0 + offset)
                };
                let release = async {
                    tokio::time::sleep_until(release_at).await;
                    g.release().await
                };
                let cut = async {
                    tokio::time::sleep_until(cut_at).await;
                    task.abort();
                };
                let (r, ()) = tokio::join!(release, cut);
                ok_or(r, "release")?;
                // A waiter that won before the cut hands its lock back, as its owner would.
                if let Ok(Ok(g)) = task.await {
                    ok_or(g.release().await, "the waiter's release")?;
                }
                let dropped = cut_at;
                queue_drains_to(ctx, &next, &name, 0, "a waiter dropped as it was granted")
                    .await?;
                let wait = opts.clone().wait_timeout(ttl + ctx.bound(Duration::from_secs(5)));
                let g = next.lock(&name, &wait).await.map_err(|e| {
                    format!(
                        "a waiter dropped {:.1} ms after the holder's release started left the lock held: a new client waited {:?} after the drop without getting it (bound {bound:?}, TTL {ttl:?}): {e}",
                        offset_us as f64 / 1000.0,
                        dropped.elapsed()
                    )
                })?;
                let took = dropped.elapsed();
                check!(
                    took <= bound,
                    "a waiter dropped {:.1} ms after the holder's release started left the lock held: a new client got it only {took:?} after the drop (bound {bound:?}, TTL {ttl:?})",
                    offset_us as f64 / 1000.0
                );
                ok_or(g.release().await, "release")?;
                // An attempt the waiter had sent before its drop may still be answered, and
                // what it won is released in the waiter's background: the next round's holder
                // expects the lock free once that is done.
                waiter.flush().await;
            }
            Ok::<_, Failure>(())
        });
    }
    futures::future::try_join_all(lanes).await?;
    Ok(())
}

/// A `lock()` whose own deadline passes while its first attempt, which won the free lock on
/// the server, is still waiting for its reply: it returns at its deadline (or with the lock),
/// and once its client's background work is done ([`Locker::flush`]) the lock is free. An
/// attempt abandoned at the deadline (its connection closed, nothing released) leaves the
/// lock held by nobody for its whole TTL, as a lost reply would.
pub(super) async fn deadline_in_a_winning_attempt_leaves_nothing(ctx: &Ctx) -> Outcome {
    let delay = Duration::from_millis(300);
    let slow = ok_or(
        ctx.harness.client_with_reply_delay(delay).await,
        "a client with delayed replies",
    )?;
    let b = ctx.client().await?;
    let ttl = ctx.ttl(Duration::from_secs(30));
    let opts = ctx.opts(ttl);
    // Connections (and whatever a first wait sets up) made before the measured call.
    let warm = must_try(&slow, &ctx.name("warm"), &opts, "a warm-up acquisition").await?;
    ok_or(warm.release().await, "the warm-up release")?;
    let name = ctx.name("x");
    let wait = delay / 3;
    let started = Instant::now();
    match slow.lock(&name, &opts.clone().wait_timeout(wait)).await {
        // A backend may wait for the reply: it then holds, and releases.
        Ok(g) => ok_or(g.release().await, "the release of a late grant")?,
        Err(e) => {
            check!(
                matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Unavailable),
                "a lock() whose deadline passed during its attempt failed with {e}"
            );
        }
    }
    let took = started.elapsed();
    let allowed = wait + delay * 2 + ctx.bound(Duration::from_secs(2));
    check!(
        took <= allowed,
        "a lock() with a {wait:?} deadline returned after {took:?} (allowed {allowed:?})"
    );
    slow.flush().await;
    let g = must_try(
        &b,
        &name,
        &opts,
        "another client, once the timed-out client's background work is done",
    )
    .await?;
    ok_or(g.release().await, "release")
}
