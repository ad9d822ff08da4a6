//! Lost replies: the server applied a request whose reply the client never heard (its
//! connection was reset after the server answered), the "indeterminate" outcome. An acquire's
//! reply lost must not make the library's own retry wait on its own grant, make a second
//! holder, or leave a grant behind; a release's reply lost must free the lock and delete
//! nothing twice. (An extend's request does not carry the lock's name on every backend: the
//! fault matrix's `lost_extend_reply` cell picks it per backend.)

use std::sync::Arc;
use std::time::Duration;

use lockcore::{Instant, LockGuard, Locker};

use super::context::{Ctx, Failure, Outcome};
use super::support::{check, ok_or};
use crate::harness::ReplyLoser;

/// A client whose replies can be lost, warmed up on another name (connections open, scripts
/// loaded, sessions made), so that the lost reply is the operation's own.
pub(super) async fn losing_client(ctx: &Ctx) -> Result<(Locker, Arc<dyn ReplyLoser>), Failure> {
    let (c, loser) = ok_or(
        ctx.harness.client_losing_replies().await,
        "connecting a client whose replies can be lost",
    )?;
    let warm = ctx.name("warm");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(5)));
    let g = ok_or(c.lock(&warm, &opts).await, "the warm-up lock()")?;
    ok_or(g.release().await, "the warm-up release")?;
    Ok((c, loser))
}

pub(super) async fn lost_acquire_reply_is_retried_safely(ctx: &Ctx) -> Outcome {
    let (a, loser) = losing_client(ctx).await?;
    let b = ctx.client().await?;
    let name = ctx.name("x");
    // Long enough that a retry waiting for its own lost grant to expire misses the bound
    // (half of it) by far.
    let ttl = ctx.ttl(Duration::from_secs(4));
    let slack = ctx.bound(Duration::from_secs(2));
    let opts = ctx.opts(ttl).wait_timeout(ttl + slack);
    loser.lose_next_reply(name.as_str().as_bytes());
    let started = Instant::now();
    let res = tokio::time::timeout(ttl + slack * 2, a.lock(&name, &opts)).await;
    let took = started.elapsed();
    let lost = loser.disarm();
    let g = match res {
        Err(_) => {
            return Err(format!(
                "lock() had not returned {took:?} after its acquire's reply was lost (deadline {:?})",
                ttl + slack
            ));
        }
        Ok(Err(e)) => {
            return Err(format!(
                "lock() failed {took:?} after its acquire's reply was lost ({e}; {lost} replies lost): its retry did not get its own grant"
            ));
        }
        Ok(Ok(g)) => g,
    };
    check!(
        lost >= 1,
        "no reply was lost: the acquire did not carry the name {name} (the fault was not applied)"
    );
    check!(
        took <= ttl / 2,
        "lock() took {took:?} after its acquire's reply was lost (TTL {ttl:?}): the retry waited for its own lost grant to expire"
    );
    no_second_holder(ctx, &b, &g).await?;
    let released = Instant::now();
    ok_or(g.release().await, "the release after the retried acquire")?;
    // Nothing left behind: a grant nobody knows of would hold the lock until its TTL.
    let bound = ctx.bound(Duration::from_secs(2));
    let g2 = ok_or(
        b.lock(&name, &ctx.opts(ttl).wait_timeout(ttl + slack))
            .await,
        "another client's lock() after the retried grant was released",
    )?;
    let freed = released.elapsed();
    ok_or(g2.release().await, "the other client's release")?;
    check!(
        freed <= bound,
        "another client got the lock only {freed:?} after the retried grant was released (bound {bound:?}, TTL {ttl:?}): the lost grant was left behind"
    );
    Ok(())
}

/// While `g` is valid, `other` cannot take its lock.
async fn no_second_holder(ctx: &Ctx, other: &Locker, g: &LockGuard) -> Outcome {
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(4)));
    match ok_or(
        other.try_lock(g.name(), &opts).await,
        "another client's try_lock",
    )? {
        None => Ok(()),
        Some(g2) => {
            let valid = g.is_valid();
            ok_or(g2.release().await, "the second holder's release")?;
            check!(
                !valid,
                "another client won the lock while the retried grant's guard was valid: two holders"
            );
            Ok(())
        }
    }
}

pub(super) async fn lost_release_reply_frees_the_lock(ctx: &Ctx) -> Outcome {
    let (a, loser) = losing_client(ctx).await?;
    let [b, c] = ctx.clients().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_secs(4));
    let slack = ctx.bound(Duration::from_secs(2));
    let g = ok_or(a.lock(&name, &ctx.opts(ttl)).await, "the holder's lock()")?;
    loser.lose_next_reply(name.as_str().as_bytes());
    let released = Instant::now();
    let res = tokio::time::timeout(ctx.bound(Duration::from_secs(10)), g.release()).await;
    check!(
        res.is_ok(),
        "release() had not returned {:?} after its reply was lost",
        released.elapsed()
    );
    let lost = loser.disarm();
    check!(
        lost >= 1,
        "no reply was lost: the release did not carry the name {name} (the fault was not applied)"
    );
    // The server applied the release: the lock is free at once, not after its TTL.
    let g2 = ok_or(
        b.lock(&name, &ctx.opts(ttl).wait_timeout(ttl + slack))
            .await,
        "another client's lock() after the lost release reply",
    )?;
    let freed = released.elapsed();
    let bound = ctx.bound(Duration::from_secs(2));
    check!(
        freed <= bound,
        "the lock was free for another client only {freed:?} after a release whose reply was lost (bound {bound:?}, TTL {ttl:?})"
    );
    // Whatever the first client does about the release it never heard of (a retry, a clean-up
    // in the background) has run now: the second holder must still hold.
    let lost_b = g2.lost();
    ok_or(
        tokio::time::timeout(ctx.bound(Duration::from_secs(10)), a.flush()).await,
        "the first client's background work (flush)",
    )?;
    let third = ok_or(
        c.try_lock(&name, &ctx.opts(ttl)).await,
        "a third client's try_lock",
    )?;
    let stolen = third.is_some();
    if let Some(g3) = third {
        g3.release().await.ok();
    }
    check!(
        !stolen,
        "a third client took the lock from the second holder after the first client's lost release: the release was applied twice"
    );
    ok_or(g2.extend(ttl).await, "the second holder's extend")?;
    check!(
        lost_b.reason().is_none(),
        "the second holder's lost signal fired after the first client's lost release"
    );
    ok_or(g2.release().await, "the second holder's release")
}
