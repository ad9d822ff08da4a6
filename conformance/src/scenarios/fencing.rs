//! Fencing tokens: strictly increasing across holders, takeovers and idle periods.

use std::time::Duration;

use super::context::{Ctx, Outcome};
use super::support::{check, ok_or};

pub(super) async fn fencing_tokens_increase(ctx: &Ctx) -> Outcome {
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(600));
    let opts = ctx
        .opts(ttl)
        .wait_timeout(ttl * 3 + ctx.bound(Duration::from_secs(5)));
    let mut tokens = Vec::new();
    for round in 0..3 {
        let c = if round == 1 {
            ctx.crashable_client().await?
        } else {
            ctx.client().await?
        };
        let g = ok_or(c.lock(&name, &opts).await, "lock()")?;
        tokens.push(g.fencing_token().ok_or("no fencing token")?);
        if round == 1 {
            // A crashed holder: the next one takes over after expiry.
            ctx.harness.crash(g, c).await;
        } else {
            ok_or(g.release().await, "release")?;
        }
    }
    let c = ctx.client().await?;
    let g = ok_or(c.lock(&name, &opts).await, "lock() after the crash")?;
    tokens.push(g.fencing_token().ok_or("no fencing token")?);
    ok_or(g.release().await, "release")?;
    check!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens are not strictly increasing: {tokens:?}"
    );
    // Idle periods: whatever the backend keeps about a lock may expire while nobody holds it,
    // but the next token must still be higher. Its TTLs are what such state would be timed
    // by, so a fresh name only ever held with a short TTL, idle for up to a hundred of them,
    // shows a counter kept for any few TTLs (the short TTL keeps this cheap).
    let idle_name = ctx.name("idle");
    let short = ctx.bound(Duration::from_millis(10)).max(ctx.caps.min_ttl);
    let short_opts = ctx.opts(short);
    let mut idle_tokens = Vec::new();
    for idle in [
        short * 3,
        (short * 100).min(ctx.bound(Duration::from_millis(1500))),
    ] {
        let g = ok_or(
            c.lock(&idle_name, &short_opts).await,
            "lock() with a short TTL",
        )?;
        idle_tokens.push(g.fencing_token().ok_or("no fencing token")?);
        // The short lease may already have run out: NotHeld is fine, it frees either way.
        let _ = g.release().await;
        tokio::time::sleep(idle).await;
    }
    let g = ok_or(
        c.lock(&idle_name, &short_opts).await,
        "lock() after an idle period",
    )?;
    idle_tokens.push(g.fencing_token().ok_or("no fencing token")?);
    let _ = g.release().await;
    check!(
        idle_tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens are not strictly increasing across idle periods of 3 and up to 100 TTLs of {short:?}: {idle_tokens:?}"
    );
    Ok(())
}
