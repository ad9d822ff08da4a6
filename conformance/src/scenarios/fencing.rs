//! Fencing tokens: strictly increasing across holders, takeovers and idle periods; holders
//! that ask for none still exclude each other.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::context::{Ctx, Outcome};
use super::support::{check, ok_or};

pub(super) async fn fencing_tokens_increase(ctx: &Ctx) -> Outcome {
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(600));
    let opts = ctx
        .fenced_opts(ttl)
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
    let short_opts = ctx.fenced_opts(short);
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

/// Holders that ask for no fencing token (`LockOptions::no_fencing`, which lets a backend skip
/// the token's cost) still exclude each other, and a token asked for after them is above every
/// token given before them.
pub(super) async fn no_fencing_still_excludes(ctx: &Ctx) -> Outcome {
    const CLIENTS: usize = 2;
    const TASKS: usize = 3;
    const ROUNDS: usize = 4;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_secs(20));
    let fenced = ctx.fenced_opts(ttl);
    let unfenced = ctx
        .opts(ttl)
        .no_fencing()
        .wait_timeout(ctx.bound(Duration::from_secs(60)));
    let c = ctx.client().await?;
    let g = ok_or(c.lock(&name, &fenced).await, "lock() asking for a token")?;
    let before = g.fencing_token();
    ok_or(g.release().await, "release")?;
    let detector = super::basics::contend(ctx, &name, &unfenced, CLIENTS, TASKS, ROUNDS).await?;
    let overlaps = detector.violations.load(Ordering::SeqCst);
    check!(
        overlaps == 0,
        "{overlaps} times two holders without fencing tokens were inside the critical section at once"
    );
    let g = ok_or(
        c.lock(&name, &fenced).await,
        "lock() asking for a token again",
    )?;
    let after = g.fencing_token();
    ok_or(g.release().await, "release")?;
    if ctx.caps.fencing {
        let (b, a) = (
            before.ok_or("no fencing token")?,
            after.ok_or("no fencing token")?,
        );
        check!(
            a > b,
            "the token asked for after holders without tokens ({a}) is not above the one before them ({b})"
        );
    }
    Ok(())
}
