//! Multi-locks ([`Locker::lock_all`](lockcore::Locker::lock_all)): all or nothing, in one
//! canonical order (two clients taking the same names in opposite orders never deadlock),
//! nothing left held after a failure or a cancellation, one lost signal for the set.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lockcore::{ErrorKind, Instant, LockName, Locker};

use super::context::{Ctx, Outcome};
use super::support::{check, must_be_held, must_try, ok_or, race_for, settle_waiters};

/// Each of `names` is free: another client takes and gives it back.
async fn all_free(client: &Locker, names: &[&LockName], ctx: &Ctx, when: &str) -> Outcome {
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(30)));
    for name in names {
        let g = must_try(client, name, &opts, &format!("{when}: {}", name.as_str())).await?;
        ok_or(g.release().await, "release")?;
    }
    Ok(())
}

/// A set with one busy member: try_lock_all returns `None` and lock_all times out, each
/// leaving the free members free; once the member is free the set is taken whole, and its
/// release frees every member.
pub(super) async fn multi_lock_is_all_or_nothing(ctx: &Ctx) -> Outcome {
    let (a, other, observer) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let (x, y, z) = (ctx.name("x"), ctx.name("y"), ctx.name("z"));
    let opts = ctx.fenced_opts(ctx.ttl(Duration::from_secs(30)));
    let busy = must_try(&other, &y, &opts, "the holder of the middle name").await?;
    let set = [z.clone(), y.clone(), x.clone()];
    match a.try_lock_all(set.clone(), &opts).await {
        Ok(None) => {}
        Ok(Some(_)) => {
            return Err("try_lock_all took a set with a member held by another client".into());
        }
        Err(e) => {
            return Err(format!(
                "try_lock_all on a busy set: expected Ok(None), got {e}"
            ));
        }
    }
    all_free(
        &observer,
        &[&x, &z],
        ctx,
        "after try_lock_all found a member busy",
    )
    .await?;
    let short = opts
        .clone()
        .wait_timeout(ctx.bound(Duration::from_millis(300)));
    match a.lock_all(set.clone(), &short).await {
        Err(e) if e.kind() == ErrorKind::Timeout => {}
        Ok(_) => return Err("lock_all took a set with a member held by another client".into()),
        Err(e) => return Err(format!("lock_all on a busy set: expected Timeout, got {e}")),
    }
    all_free(&observer, &[&x, &z], ctx, "after lock_all timed out").await?;
    ok_or(busy.release().await, "the holder's release")?;
    let all = ok_or(a.lock_all(set, &opts).await, "lock_all on a free set")?;
    for name in [&x, &y, &z] {
        must_be_held(&observer, name, &opts, "a member while the set is held").await?;
    }
    if ctx.caps.fencing {
        check!(
            all.fencing_tokens().iter().all(Option::is_some),
            "a member of the set has no fencing token: {:?}",
            all.fencing_tokens()
        );
    }
    ok_or(all.release().await, "releasing the set")?;
    all_free(&observer, &[&x, &y, &z], ctx, "after the set's release").await
}

/// Two clients take the same two names in opposite orders, over and over, at once: every
/// round completes (a client taking them in the order given would deadlock with the other
/// until a deadline).
pub(super) async fn multi_locks_in_opposite_orders_never_deadlock(ctx: &Ctx) -> Outcome {
    let (p, q) = (ctx.name("p"), ctx.name("q"));
    let opts = ctx
        .opts(ctx.ttl(Duration::from_secs(30)))
        .wait_timeout(ctx.bound(Duration::from_secs(10)));
    let mut tasks = Vec::new();
    for order in [[p.clone(), q.clone()], [q.clone(), p.clone()]] {
        let client = ctx.client().await?;
        let opts = opts.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let set = client.lock_all(order.clone(), &opts).await?;
                tokio::task::yield_now().await;
                set.release().await?;
            }
            Ok::<_, lockcore::Error>(())
        }));
    }
    for t in tasks {
        ok_or(
            ok_or(t.await, "a client's loop")?,
            "a multi-lock round (a deadlock shows as a timeout)",
        )?;
    }
    Ok(())
}

/// A lock_all dropped while it waits for its second member leaves its first member free: the
/// partial set is released at the drop, not held until its TTL.
pub(super) async fn cancelled_multi_lock_leaves_nothing(ctx: &Ctx) -> Outcome {
    let (a, other, observer) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let (x, y) = (ctx.name("x"), ctx.name("y"));
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(30))).wait_forever();
    let busy = must_try(&other, &y, &opts, "the holder of the second name").await?;
    let waiter = {
        let (a, opts, set) = (a.clone(), opts.clone(), [x.clone(), y.clone()]);
        tokio::spawn(async move { a.lock_all(set, &opts).await.map(drop) })
    };
    settle_waiters(ctx, &observer, &y, &[&a]).await?;
    if ctx.caps.atomic_multi.is_yes() {
        // A set taken in one request holds nothing while it waits for a busy member.
        let g = must_try(
            &observer,
            &x,
            &opts,
            "the first name while an atomic set waits for the second",
        )
        .await?;
        ok_or(g.release().await, "release")?;
    } else {
        // A sequence waiting on the second name has taken the first.
        must_be_held(&observer, &x, &opts, "the first name while the set waits").await?;
    }
    waiter.abort();
    let _ = waiter.await;
    a.flush().await;
    let bound = ctx.bound(Duration::from_secs(3));
    let cancelled = Instant::now();
    let g = race_for(&observer, &x, &opts, cancelled, cancelled + bound)
        .await
        .map_err(|e| {
            format!(
                "the first name of a cancelled lock_all was still held {bound:?} after the cancel (TTL 30 s): a partial set left behind: {e}"
            )
        })?;
    ok_or(g.release().await, "release")?;
    ok_or(busy.release().await, "release")
}

/// One member of a held set taken away behind its holder (an operator's force release): the
/// set's one lost signal fires, naming that member, within a TTL.
pub(super) async fn multi_lock_lost_when_any_member_is_lost(ctx: &Ctx) -> Outcome {
    let a = ctx.client().await?;
    let (x, y) = (ctx.name("x"), ctx.name("y"));
    let ttl = ctx.ttl(Duration::from_secs(3));
    let opts = ctx
        .opts(ttl)
        .auto_renew(lockcore::AutoRenew::until(Duration::from_secs(600)));
    let set = ok_or(a.lock_all([x.clone(), y.clone()], &opts).await, "lock_all")?;
    ok_or(ctx.harness.revoke(&y).await, "revoking one member")?;
    let bound = ttl + ctx.bound(Duration::from_secs(2));
    let (which, _) = tokio::time::timeout(bound, set.lost()).await.map_err(|_| {
        format!("the set's lost signal did not fire within {bound:?} of one member's revocation")
    })?;
    check!(
        which == y,
        "the set's lost signal named {:?}, not the revoked {:?}",
        which.as_str(),
        y.as_str()
    );
    let _ = set.release().await;
    Ok(())
}

/// On a backend that takes a set in one request ([`Capabilities::atomic_multi`]): two clients
/// take and release the set of four names over and over while an observer takes the set's
/// last name whenever it can and, holding it, tries each other member. No client may hold part
/// of a set: while the observer holds the last name no set is held (a set is taken whole, and
/// released in canonical order, the last name last), so every other member is free. A set
/// taken one member at a time shows as a member held there.
///
/// [`Capabilities::atomic_multi`]: lockcore::Capabilities::atomic_multi
pub(super) async fn atomic_multi_lock_is_never_seen_partial(ctx: &Ctx) -> Outcome {
    const LOOKS: u64 = 30;
    let names: Vec<LockName> = (1..=4).map(|i| ctx.name(&format!("m{i}"))).collect();
    let last = names
        .iter()
        .max_by(|a, b| a.as_str().as_bytes().cmp(b.as_str().as_bytes()))
        .expect("four names")
        .clone();
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(30)));
    let stop = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(AtomicU64::new(0));
    let mut takers = Vec::new();
    for _ in 0..2 {
        let client = ctx.client().await?;
        let (names, opts, stop, taken) = (names.clone(), opts.clone(), stop.clone(), taken.clone());
        takers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Some(set) = client.try_lock_all(names.clone(), &opts).await? {
                    taken.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                    set.release().await?;
                }
                tokio::task::yield_now().await;
            }
            Ok::<_, lockcore::Error>(())
        }));
    }
    let observer = ctx.client().await?;
    let give_up = Instant::now() + ctx.bound(Duration::from_secs(30));
    let mut looks = 0u64;
    let mut partial = None;
    while partial.is_none() && (looks < LOOKS || taken.load(Ordering::Relaxed) < LOOKS) {
        if Instant::now() >= give_up {
            break;
        }
        let held = match observer.try_lock(&last, &opts).await {
            Ok(Some(g)) => g,
            Ok(None) => {
                tokio::task::yield_now().await;
                continue;
            }
            Err(e) => {
                partial = Some(format!("the observer's try_lock of the last name: {e}"));
                break;
            }
        };
        for name in names.iter().filter(|n| **n != last) {
            match observer.try_lock(name, &opts).await {
                Ok(Some(g)) => ok_or(g.release().await, "the observer's release")?,
                Ok(None) => {
                    partial = Some(format!(
                        "while the observer held the set's last name {:?}, {:?} was held: \
                         part of a set was taken (look {looks}, {} sets taken so far)",
                        last.as_str(),
                        name.as_str(),
                        taken.load(Ordering::Relaxed)
                    ));
                    break;
                }
                Err(e) => {
                    partial = Some(format!("the observer's try_lock: {e}"));
                    break;
                }
            }
        }
        ok_or(held.release().await, "the observer's release")?;
        looks += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for t in takers {
        ok_or(ok_or(t.await, "a taker's loop")?, "a taker's try_lock_all")?;
    }
    if let Some(why) = partial {
        return Err(why);
    }
    let taken = taken.load(Ordering::Relaxed);
    check!(
        looks >= LOOKS && taken >= LOOKS,
        "within {:?}: the observer looked {looks} times and the clients took {taken} sets, \
         {LOOKS} of each needed to observe anything",
        ctx.bound(Duration::from_secs(30))
    );
    Ok(())
}
