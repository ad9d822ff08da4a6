//! Client clocks: a client whose wall clock runs a minute ahead judges nobody's lease by it.
//! It cannot take a held lock, nor a permit of a full semaphore (a client sweeping "expired"
//! permits by its own clock frees live ones), nor depose a live leader (a candidate judging the
//! leader's expiry by its own clock deposes it).
//!
//! Where the harness can skew an in-process client's clock (`memory://`, the negative
//! controls) the skewed client is one; where it runs holder processes under libfaketime
//! (`locksmith report` on real servers) the mutex and the semaphore cases run the skewed client
//! as such a process. The election case needs a skewed in-process client: a holder process
//! takes a lock or a permit, it does not campaign, and the backends' own test harnesses cannot
//! skew an in-process client (their clients read the host's clock through the OS, and their
//! servers judge expiry: nothing in process to skew), so it is unsupported there.

use std::time::Duration;

use lockcore::{CampaignOptions, ErrorKind, LockGuard, Locker};

use crate::harness::SkewedHolder;

use super::context::{Ctx, Failure, Outcome};
use super::support::{check, must_be_held, must_try, ok_or};

/// How far the skewed client's clock runs ahead.
const AHEAD: Duration = Duration::from_secs(60);

async fn skewed_client(ctx: &Ctx) -> Result<Locker, Failure> {
    ctx.harness
        .client_with_clock_skew(AHEAD)
        .await
        .map_err(|e| format!("connecting a client whose clock runs ahead: {e}"))
}

/// A client whose clock runs a minute ahead cannot take a held lock (TTL 10 s), and a lock it
/// takes is held for everyone else.
pub(super) async fn skewed_clock_cannot_steal(ctx: &Ctx) -> Outcome {
    if !ctx.harness.can_skew_clock() {
        return skewed_process_cannot_take(ctx, None).await;
    }
    let a = ctx.client().await?;
    let skewed = skewed_client(ctx).await?;
    let name = ctx.name("x");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(10)));
    let g = must_try(&a, &name, &opts, "holder").await?;
    must_be_held(
        &skewed,
        &name,
        &opts,
        "a client whose clock runs 60 s ahead",
    )
    .await?;
    ok_or(g.release().await, "release")?;
    let g = must_try(&skewed, &name, &opts, "the skewed client on a free lock").await?;
    must_be_held(&a, &name, &opts, "held by the skewed client").await?;
    ok_or(g.release().await, "the skewed client's release")
}

/// The skewed client as a process of its own, its wall clock 60 s ahead (libfaketime), asking
/// for the lock (`permits` `None`) or a permit of `permits`: with everything held by
/// in-process clients (TTL 10 s) it gets nothing in a second of waiting and the holders keep
/// theirs; once one leaves it gets what was freed (it works), and holds it for everyone else.
async fn skewed_process_cannot_take(ctx: &Ctx, permits: Option<u32>) -> Outcome {
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_secs(10));
    let opts = match permits {
        Some(n) => ctx.opts(ttl).permits(n),
        None => ctx.opts(ttl),
    };
    let (what, all) = match permits {
        Some(n) => ("a permit of a full semaphore", n as usize),
        None => ("a held lock", 1),
    };
    let mut holders: Vec<(Locker, LockGuard)> = Vec::with_capacity(all);
    for _ in 0..all {
        let c = ctx.client().await?;
        let g = must_try(&c, &name, &opts, "a holder").await?;
        holders.push((c, g));
    }
    // It waits a while: a backend that trusts its clock sees the holders' leases long expired.
    let mut holder = SkewedHolder {
        name: &name,
        ttl,
        ahead: AHEAD,
        wait: ctx.bound(Duration::from_secs(1)),
        permits,
    };
    let stole = ok_or(
        ctx.harness.skewed_holder_process(&holder).await,
        &format!("a holder process whose clock runs 60 s ahead, on {what}"),
    )?;
    check!(
        stole.is_none(),
        "a process whose clock runs 60 s ahead took {what}: it judged the holders' leases \
         expired by its own clock"
    );
    for (_, g) in &holders {
        check!(
            g.is_valid(),
            "a holder lost its lease to a process whose clock runs ahead ({:?})",
            g.lost().reason()
        );
    }
    let (observer, leaving) = holders.pop().expect("at least one holder");
    ok_or(leaving.release().await, "release")?;
    // Generous: the claim is about who holds, not how fast; a new process on a busy machine
    // may take seconds to connect and wait.
    holder.wait = ctx.bound(Duration::from_secs(10));
    let Some(held) = ok_or(
        ctx.harness.skewed_holder_process(&holder).await,
        "a holder process whose clock runs 60 s ahead, on what was freed",
    )?
    else {
        let seen = match observer.inspect(&name).await {
            Ok(info) => format!("{info:?}"),
            Err(e) => format!("unknown ({e})"),
        };
        return Err(format!(
            "a process whose clock runs 60 s ahead did not get what was freed in {:?} (the \
             lock as inspect sees it: {seen})",
            holder.wait
        ));
    };
    must_be_held(
        &observer,
        &name,
        &opts,
        "everything held, one by the process whose clock runs ahead",
    )
    .await?;
    drop(held);
    for (_, g) in holders {
        ok_or(g.release().await, "release")?;
    }
    Ok(())
}

/// Semaphore: with 2 of 2 permits held (TTL 10 s), a client whose clock runs a minute ahead
/// is refused a permit by `try_lock` and by a short `lock`, and both holders keep theirs.
pub(super) async fn skewed_client_cannot_sweep_permits(ctx: &Ctx) -> Outcome {
    if !ctx.harness.can_skew_clock() {
        return skewed_process_cannot_take(ctx, Some(2)).await;
    }
    let [a, b] = ctx.clients().await?;
    let skewed = skewed_client(ctx).await?;
    let name = ctx.name("sem");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(10))).permits(2);
    let ga = must_try(&a, &name, &opts, "the first permit holder").await?;
    let gb = must_try(&b, &name, &opts, "the second permit holder").await?;
    must_be_held(
        &skewed,
        &name,
        &opts,
        "a client whose clock runs a minute ahead, both permits held",
    )
    .await?;
    let short = opts
        .clone()
        .wait_timeout(ctx.bound(Duration::from_millis(500)));
    match skewed.lock(&name, &short).await {
        Err(e) if e.kind() == ErrorKind::Timeout => {}
        Ok(_) => {
            return Err(
                "a client whose clock runs a minute ahead got a third permit of two: it judged \
                 the holders' permits expired by its own clock"
                    .into(),
            );
        }
        Err(e) => {
            return Err(format!(
                "the skewed client's lock(): expected Timeout, got {e}"
            ));
        }
    }
    check!(
        ga.is_valid() && gb.is_valid(),
        "a permit holder lost its permit to a client whose clock runs ahead ({:?}, {:?})",
        ga.lost().reason(),
        gb.lost().reason()
    );
    ok_or(ga.release().await, "release")?;
    ok_or(gb.release().await, "release")
}

/// Election: a candidate whose clock runs a minute ahead, campaigning for 500 ms against a
/// leader with a 10 s lease, is not elected, and the leader still leads.
pub(super) async fn skewed_candidate_cannot_depose_leader(ctx: &Ctx) -> Outcome {
    let a = ctx.client().await?;
    let skewed = skewed_client(ctx).await?;
    let name = ctx.name("leader");
    let opts = CampaignOptions::new()
        .ttl(ctx.ttl(Duration::from_secs(10)))
        .no_auto_renew()
        .wait_timeout(ctx.bound(Duration::from_secs(30)));
    let leader = ok_or(a.campaign(&name, "leader", &opts).await, "the campaign")?;
    let short = opts
        .clone()
        .wait_timeout(ctx.bound(Duration::from_millis(500)));
    match skewed.campaign(&name, "skewed", &short).await {
        Err(e) if e.kind() == ErrorKind::Timeout => {}
        Ok(_) => {
            return Err(
                "a candidate whose clock runs a minute ahead was elected beside a live leader: \
                 it judged the leader's lease expired by its own clock"
                    .into(),
            );
        }
        Err(e) => {
            return Err(format!(
                "the skewed candidate's campaign: expected Timeout, got {e}"
            ));
        }
    }
    check!(
        leader.is_leader(),
        "the leader lost its leadership to a candidate whose clock runs ahead ({:?})",
        leader.lost().reason()
    );
    ok_or(leader.resign().await, "resign")
}
