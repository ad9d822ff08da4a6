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
    let [a, other, observer] = ctx.clients().await?;
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

/// Two clients take the same two names in opposite orders, and every round completes (a
/// client taking them in the order given would deadlock with the other until a deadline).
///
/// The overlap is forced, not hoped for: in each of 3 gated rounds a third client holds both
/// names until both clients' `lock_all` wait (seen in the backend's queue, or marked waiting),
/// then lets both go at once, so that a backend taking members in the order given hands each
/// client its first name and leaves both waiting for the other's. Then 10 free rounds each,
/// where a client holding the set keeps it until the other waits for it (or has finished).
pub(super) async fn multi_locks_in_opposite_orders_never_deadlock(ctx: &Ctx) -> Outcome {
    const GATED: usize = 3;
    const ROUNDS: usize = 10;
    let (p, q) = (ctx.name("p"), ctx.name("q"));
    let opts = ctx
        .opts(ctx.ttl(Duration::from_secs(30)))
        .wait_timeout(ctx.bound(Duration::from_secs(10)));
    // Clients made one after the other: the gate, then the two takers.
    let gate = ctx.client().await?;
    let [a, b] = ctx.clients().await?;
    let orders = [[p.clone(), q.clone()], [q.clone(), p.clone()]];
    let round_bound = ctx.bound(Duration::from_secs(5));
    for round in 1..=GATED {
        let held = [
            must_try(&gate, &p, &opts, "the gate's first name").await?,
            must_try(&gate, &q, &opts, "the gate's second name").await?,
        ];
        let mut sets = Vec::new();
        for (client, order) in [&a, &b].into_iter().zip(orders.clone()) {
            let (client, opts) = (client.clone(), opts.clone());
            sets.push(tokio::spawn(async move {
                let set = client.lock_all(order, &opts).await?;
                tokio::task::yield_now().await;
                set.release().await
            }));
        }
        settle_on_either(ctx, &gate, [&p, &q], [&a, &b]).await?;
        let released = futures::future::join_all(held.map(|g| g.release())).await;
        for r in released {
            ok_or(r, "the gate's release")?;
        }
        let both = tokio::time::timeout(round_bound, futures::future::join_all(&mut sets)).await;
        let Ok(done) = both else {
            for t in &sets {
                t.abort();
            }
            return Err(format!(
                "gated round {round}: the two sets, let go at once, were not both taken and \
                 released within {round_bound:?}: the clients deadlocked (each holding the \
                 name it took first)"
            ));
        };
        for r in done {
            ok_or(
                ok_or(r, "a client's round")?,
                &format!("gated round {round}'s lock_all or release"),
            )?;
        }
    }
    let finished = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
    let clients = [a, b];
    let mut tasks = Vec::new();
    for (me, order) in orders.into_iter().enumerate() {
        let (client, other) = (clients[me].clone(), clients[1 - me].clone());
        let (opts, finished, names) = (opts.clone(), finished.clone(), [p.clone(), q.clone()]);
        let hold_bound = round_bound;
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let set = client.lock_all(order.clone(), &opts).await?;
                // Held until the other client waits for the set (or is done): the rounds
                // overlap for real, whatever the speed of the backend.
                let give_up = Instant::now() + hold_bound;
                while !finished[1 - me].load(Ordering::SeqCst) && Instant::now() < give_up {
                    let waits = other.waiting(&names[0])? + other.waiting(&names[1])?;
                    if waits > 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                set.release().await?;
            }
            finished[me].store(true, Ordering::SeqCst);
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

/// Waits until each of `clients` waits on one of `names`: the backend's queue holds as many
/// waiters over the names as there are clients, where it reports one; else each client's own
/// count of its calls marked waiting. Never a sleep: a backend that shows neither fails.
async fn settle_on_either(
    ctx: &Ctx,
    observer: &Locker,
    names: [&LockName; 2],
    clients: [&Locker; 2],
) -> Outcome {
    let give_up = Instant::now() + ctx.bound(Duration::from_secs(10));
    loop {
        let mut queued = Some(0);
        for name in names {
            match observer.backend().queued_waiters(name).await {
                Ok(n) => queued = queued.map(|q| q + n),
                Err(e) if e.kind() == ErrorKind::Unsupported => queued = None,
                Err(e) => return Err(format!("Backend::queued_waiters: {e}")),
            }
        }
        let settled = match queued {
            Some(n) => n >= clients.len(),
            None => {
                let mut all = true;
                for c in clients {
                    let marked = ok_or(c.waiting(names[0]), "Locker::waiting")?
                        + ok_or(c.waiting(names[1]), "Locker::waiting")?;
                    all &= marked > 0;
                }
                all
            }
        };
        if settled {
            return Ok(());
        }
        check!(
            Instant::now() < give_up,
            "the two clients' lock_all never both showed as waiting on {:?} or {:?}",
            names[0].as_str(),
            names[1].as_str()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A lock_all dropped while it waits for its second member leaves its first member free: the
/// partial set is released at the drop, not held until its TTL.
pub(super) async fn cancelled_multi_lock_leaves_nothing(ctx: &Ctx) -> Outcome {
    let [a, other, observer] = ctx.clients().await?;
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

/// On a backend that takes a set in one request ([`Capabilities::atomic_multi`]): four
/// clients take and release the set of four names over and over while an observer, holding the
/// set's last name (so that every attempt of theirs must fail whole), looks at the other members
/// one at a time (with `inspect`, which takes nothing: a look that took a member would hold it
/// back from the takers, and close the window it looks for). No client may hold part of a set:
/// while the observer holds the last name every other member is free.
///
/// The window is counted, not hoped for: a look counts only when a taker's attempt was in
/// flight from before the look was sent until after its answer (more attempts started before
/// the look than had ended after it), and the observer keeps looking, yielding between looks so
/// that the takers run, until 100 such looks were made. A set taken one member at a time holds
/// a member for much of each attempt, and four takers keep the first member taken nearly all
/// the time: the project's control is caught in 20 runs of 20.
///
/// [`Capabilities::atomic_multi`]: lockcore::Capabilities::atomic_multi
pub(super) async fn atomic_multi_lock_is_never_seen_partial(ctx: &Ctx) -> Outcome {
    /// Looks made while a taker's attempt was in flight.
    const INSIDE: u64 = 100;
    /// Sets the takers must have taken whole (between the observer's holds).
    const SETS: u64 = 5;
    /// Clients taking the set: while one holds part of it, the others' attempts fail fast, and
    /// the next takes the first member as soon as it is let go.
    const TAKERS: usize = 4;
    let names: Vec<LockName> = (1..=4).map(|i| ctx.name(&format!("m{i}"))).collect();
    let last = names
        .iter()
        .max_by(|a, b| a.as_str().as_bytes().cmp(b.as_str().as_bytes()))
        .expect("four names")
        .clone();
    let others: Vec<LockName> = names.iter().filter(|n| **n != last).cloned().collect();
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(30)));
    let stop = Arc::new(AtomicBool::new(false));
    let attempts = Arc::new(Attempts::default());
    let mut takers = Vec::new();
    for _ in 0..TAKERS {
        let client = ctx.client().await?;
        let (names, opts, stop, attempts) =
            (names.clone(), opts.clone(), stop.clone(), attempts.clone());
        takers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                attempts.started.fetch_add(1, Ordering::SeqCst);
                let set = client.try_lock_all(names.clone(), &opts).await;
                attempts.ended.fetch_add(1, Ordering::SeqCst);
                if let Some(set) = set? {
                    attempts.taken.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    set.release().await?;
                }
                tokio::task::yield_now().await;
            }
            Ok::<_, lockcore::Error>(())
        }));
    }
    let observer = ctx.client().await?;
    let within = ctx.bound(Duration::from_secs(30));
    let give_up = Instant::now() + within;
    let (mut looks, mut inside) = (0u64, 0u64);
    let mut partial = None;
    'holds: while inside < INSIDE || attempts.taken.load(Ordering::SeqCst) < SETS {
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
        // Hold the last name for a few looks inside attempts, then let the takers take sets.
        let until = inside + 8;
        while inside < until && Instant::now() < give_up {
            let name = &others[(looks % others.len() as u64) as usize];
            let started_before = attempts.started.load(Ordering::SeqCst);
            let look = look_at(ctx, &observer, name, &opts).await;
            let ended_after = attempts.ended.load(Ordering::SeqCst);
            looks += 1;
            if started_before > ended_after {
                inside += 1;
            }
            let why = match look {
                Ok(false) => {
                    // The takers run between looks, on a runtime of any size.
                    tokio::task::yield_now().await;
                    continue;
                }
                Ok(true) => format!(
                    "while the observer held the set's last name {:?}, {:?} was held: part of \
                     a set was taken (look {looks}, {inside} inside attempts, {} sets taken \
                     so far)",
                    last.as_str(),
                    name.as_str(),
                    attempts.taken.load(Ordering::SeqCst)
                ),
                Err(e) => e,
            };
            partial = Some(why);
            ok_or(held.release().await, "the observer's release")?;
            break 'holds;
        }
        ok_or(held.release().await, "the observer's release")?;
        // The takers take a set whole before the next hold (or a while passes).
        let taken = attempts.taken.load(Ordering::SeqCst);
        let wait_until = give_up.min(Instant::now() + ctx.bound(Duration::from_secs(1)));
        while attempts.taken.load(Ordering::SeqCst) == taken && Instant::now() < wait_until {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for t in takers {
        ok_or(ok_or(t.await, "a taker's loop")?, "a taker's try_lock_all")?;
    }
    if let Some(why) = partial {
        return Err(why);
    }
    let taken = attempts.taken.load(Ordering::SeqCst);
    check!(
        inside >= INSIDE && taken >= SETS,
        "within {within:?}: {inside} of the observer's {looks} looks fell inside a taker's \
         attempt ({INSIDE} needed to observe anything) and the clients took {taken} sets \
         ({SETS} needed)"
    );
    Ok(())
}

/// Whether `name` is held, seen by `observer`: with [`Locker::inspect`] where the backend
/// declares it (a look that takes nothing, so that it never holds a member back from the
/// takers), else with a `try_lock` released at once.
async fn look_at(
    ctx: &Ctx,
    observer: &Locker,
    name: &LockName,
    opts: &lockcore::LockOptions,
) -> Result<bool, String> {
    if ctx.caps.inspect {
        let info = observer
            .inspect(name)
            .await
            .map_err(|e| format!("the observer's inspect: {e}"))?;
        return Ok(info.held);
    }
    match observer.try_lock(name, opts).await {
        Ok(Some(g)) => g
            .release()
            .await
            .map(|()| false)
            .map_err(|e| format!("the observer's release: {e}")),
        Ok(None) => Ok(true),
        Err(e) => Err(format!("the observer's try_lock: {e}")),
    }
}

/// The takers' attempts at the set in [`atomic_multi_lock_is_never_seen_partial`].
#[derive(Default)]
struct Attempts {
    /// Attempts sent.
    started: AtomicU64,
    /// Attempts answered.
    ended: AtomicU64,
    /// Attempts that took the set.
    taken: AtomicU64,
}
