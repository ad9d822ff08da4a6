//! Latency and clocks, through proxies and skewed clients: validity counts from the send, a skewed clock cannot steal a lock.

use std::time::Duration;

use lockcore::Instant;

use super::context::{Ctx, Outcome};
use super::support::{check, drop_lost_guard_then_release_new, must_be_held, must_try, ok_or};

pub(super) async fn validity_counts_from_send(ctx: &Ctx) -> Outcome {
    let delay = Duration::from_millis(250);
    // Whole seconds: a backend whose server grants leases in whole seconds (etcd) grants what
    // was asked, so the bound below is the server's.
    let ttl = ctx.ttl(Duration::from_millis(1200)).max(delay * 4);
    let ttl = Duration::from_secs(ttl.as_secs_f64().ceil() as u64);
    // Where the server frees the lock by its TTL, the validity must count from the send. Where
    // the lock lives with the holder's session (ZooKeeper, SQL row locks), the server never
    // frees it by time while the session lives, and a validity counted from the reply is safe:
    // there only the last check (nobody wins while the holder believes it valid) applies.
    let server_ttl = ctx.caps.renew == lockcore::RenewKind::Emulated;
    let slow = ok_or(
        ctx.harness.client_with_reply_delay(delay).await,
        "a client with delayed replies",
    )?;
    let b = ctx.client().await?;
    let name = ctx.name("x");
    let opts = ctx.opts(ttl);
    let sent = Instant::now();
    let g = must_try(&slow, &name, &opts, "holder with delayed replies").await?;
    check!(
        sent.elapsed() >= delay,
        "the reply was not delayed ({:?})",
        sent.elapsed()
    );
    check!(
        !server_ttl || g.valid_until() <= sent + ttl,
        "validity counted from the reply: valid {:?} after the request was sent, with a TTL of {ttl:?}",
        g.valid_until() - sent
    );
    let sent = Instant::now();
    ok_or(g.extend(ttl).await, "extend")?;
    check!(
        !server_ttl || g.valid_until() <= sent + ttl,
        "extend's validity counted from the reply: valid {:?} after the request was sent, with a TTL of {ttl:?}",
        g.valid_until() - sent
    );
    let lost = g.lost();
    let g2 = ok_or(
        b.lock(
            &name,
            &opts
                .clone()
                .wait_timeout(ttl * 3 + ctx.bound(Duration::from_secs(5))),
        )
        .await,
        "a waiting client",
    )?;
    check!(
        lost.is_lost(),
        "another client won the lock while the delayed holder still believed it valid ({:?} left)",
        g.valid_until().saturating_duration_since(Instant::now())
    );
    drop_lost_guard_then_release_new(ctx, &slow, g, g2).await
}

pub(super) async fn skewed_clock_cannot_steal(ctx: &Ctx) -> Outcome {
    if !ctx.harness.can_skew_clock() {
        return skewed_process_cannot_steal(ctx).await;
    }
    let a = ctx.client().await?;
    let skewed = ok_or(
        ctx.harness
            .client_with_clock_skew(Duration::from_secs(60))
            .await,
        "a client with a skewed clock",
    )?;
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

/// `skewed_clock_cannot_steal` with the skewed client in a process of its own, its wall clock
/// 60 s ahead (libfaketime): it must not get a held lock, and a lock it takes must be held for
/// everyone else.
async fn skewed_process_cannot_steal(ctx: &Ctx) -> Outcome {
    const AHEAD: Duration = Duration::from_secs(60);
    let a = ctx.client().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_secs(10));
    let opts = ctx.opts(ttl);
    let g = must_try(&a, &name, &opts, "holder").await?;
    // It waits a while: a backend that trusts its clock sees the holder's lease long expired.
    let stole = ok_or(
        ctx.harness
            .skewed_holder_process(&name, ttl, AHEAD, ctx.bound(Duration::from_secs(1)))
            .await,
        "a holder process whose clock runs 60 s ahead, on a held lock",
    )?;
    check!(
        stole.is_none(),
        "a process whose clock runs 60 s ahead took a lock held by another client"
    );
    ok_or(g.release().await, "release")?;
    // Generous: the claim is about who holds, not how fast; a new process on a busy machine
    // may take seconds to connect and wait.
    let wait = ctx.bound(Duration::from_secs(10));
    let Some(held) = ok_or(
        ctx.harness
            .skewed_holder_process(&name, ttl, AHEAD, wait)
            .await,
        "a holder process whose clock runs 60 s ahead, on a free lock",
    )?
    else {
        let seen = match a.inspect(&name).await {
            Ok(info) => format!("{info:?}"),
            Err(e) => format!("unknown ({e})"),
        };
        return Err(format!(
            "a process whose clock runs 60 s ahead did not get a free lock in {wait:?} (the \
             lock as inspect sees it: {seen})"
        ));
    };
    must_be_held(
        &a,
        &name,
        &opts,
        "held by the process whose clock runs ahead",
    )
    .await?;
    drop(held);
    Ok(())
}
