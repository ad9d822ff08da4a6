//! Latency and clocks, through proxies and skewed clients: validity counts from the send, a skewed clock cannot steal a lock.

use std::time::Duration;

use lockcore::Instant;

use super::context::{Ctx, Outcome};
use super::support::{check, drop_lost_guard_then_release_new, must_try, ok_or};

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
