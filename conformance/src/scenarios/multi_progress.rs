//! The multi-lock's progress bound: a [`Locker::lock_all`](lockcore::Locker::lock_all) is
//! never starved by traffic on its members. A set taken in one request needs every member free
//! at the same instant, which steady single-name traffic may never leave; after
//! [`lockcore::ORDERED_AFTER_LOSSES`] lost attempts the set is taken member by member in
//! canonical order, each with the backend's own wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lockcore::{ErrorKind, Instant, LockName};

use super::context::{Ctx, Outcome};
use super::support::ok_or;

/// Four clients take the set's members in a loop, two on each name (single-name traffic,
/// each holding its member for 2 ms, a short critical section, while the other queues for it,
/// so that each member is nearly always held or handed over), and a fifth client's `lock_all`
/// of both must get the set within 5 s (scaled), in each of 3 rounds. Before each round the
/// traffic has made acquisitions since the last (it runs for real), and it goes on through the
/// round. A set that waits for both members to be free at one instant loses every attempt here
/// and times out (the memory backend without the bound: 2,701 single acquisitions in the 5 s).
///
/// Only on a [fair](lockcore::Capabilities::fair) backend: the set is had once each member's
/// single wait has come round, and without FIFO order a single waiter has no bound either
/// (the traffic's next `lock()` of a name just released may win it again and again).
pub(super) async fn multi_lock_progresses_under_member_traffic(ctx: &Ctx) -> Outcome {
    const TRAFFIC: usize = 4;
    const ROUNDS: usize = 3;
    const HOLD: Duration = Duration::from_millis(2);
    let (a, b) = (ctx.name("a"), ctx.name("b"));
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(30)));
    let stop = Arc::new(AtomicBool::new(false));
    // The count of single acquisitions, watched: a round waits for it to move, not polls.
    let (singles, _) = tokio::sync::watch::channel(0u64);
    let singles = Arc::new(singles);
    let mut traffic = Vec::new();
    for i in 0..TRAFFIC {
        let client = ctx.client().await?;
        let name = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (opts, stop, singles) = (opts.clone(), stop.clone(), singles.clone());
        traffic.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let g = client.lock(name.clone(), &opts).await?;
                singles.send_modify(|n| *n += 1);
                // A short critical section: the others queue on the name meanwhile.
                tokio::time::sleep(HOLD).await;
                g.release().await?;
            }
            Ok::<_, lockcore::Error>(())
        }));
    }
    let outcome = rounds(ctx, &[a, b], &opts, &singles, ROUNDS).await;
    stop.store(true, Ordering::SeqCst);
    for t in traffic {
        ok_or(
            ok_or(t.await, "a traffic client's loop")?,
            "a traffic client's lock or release",
        )?;
    }
    outcome
}

/// The rounds of [`multi_lock_progresses_under_member_traffic`]: each waits for fresh traffic,
/// then times one `lock_all` of `names`.
async fn rounds(
    ctx: &Ctx,
    names: &[LockName],
    opts: &lockcore::LockOptions,
    singles: &tokio::sync::watch::Sender<u64>,
    rounds: usize,
) -> Outcome {
    let set_client = ctx.client().await?;
    let bound = ctx.bound(Duration::from_secs(5));
    let set_opts = opts.clone().wait_timeout(bound);
    let mut slowest = Duration::ZERO;
    for round in 1..=rounds {
        let seen = *singles.borrow();
        let wait = ctx.bound(Duration::from_secs(10));
        let mut moved = singles.subscribe();
        if tokio::time::timeout(wait, moved.wait_for(|n| *n >= seen + 8))
            .await
            .is_err()
        {
            return Err(format!(
                "round {round}: the traffic on the members made {} acquisitions in {wait:?} \
                 (8 needed before the round)",
                *singles.borrow() - seen
            ));
        }
        let before = *singles.borrow();
        let started = Instant::now();
        let set = match set_client.lock_all(names.to_vec(), &set_opts).await {
            Ok(set) => set,
            Err(e) if e.kind() == ErrorKind::Timeout => {
                return Err(format!(
                    "round {round}: lock_all did not get its set of {} within {bound:?} while \
                     other clients made {} single acquisitions of its members: the set starved",
                    names.len(),
                    *singles.borrow() - before
                ));
            }
            Err(e) => return Err(format!("round {round}: lock_all: {e}")),
        };
        slowest = slowest.max(started.elapsed());
        ok_or(set.release().await, "releasing the set")?;
    }
    ctx.observe(format!(
        "slowest lock_all under member traffic: {} ms",
        slowest.as_millis()
    ));
    Ok(())
}
