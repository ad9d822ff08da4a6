//! Renewal and the lost signal: auto-renewal and its limit, the lost signal on expiry and on revocation, native (session-bound) leases.

use std::time::Duration;

use lockcore::{AutoRenew, Instant, LockGuard, LossDetection, LostReason};

use super::context::{Ctx, Failure, Outcome};
use super::support::{
    check, drop_lost_guard_then_release_new, must_be_held, must_try, ok_or, race_for,
};

pub(super) async fn auto_renew_keeps_lock(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(500));
    let opts = ctx.opts(ttl).auto_renew(AutoRenew::until(ttl * 20));
    let g = must_try(&a, &name, &opts, "holder").await?;
    let start = g.acquired_at();
    for k in 1..=7u32 {
        tokio::time::sleep_until(start + ttl / 2 * k).await;
        must_be_held(
            &b,
            &name,
            &ctx.opts(ttl),
            &format!("{:?} into a {ttl:?} lease with auto-renew", ttl / 2 * k),
        )
        .await?;
    }
    check!(
        g.is_valid(),
        "the renewed guard is not valid: lost = {:?}",
        g.lost().reason()
    );
    ok_or(g.release().await, "release")
}

pub(super) async fn auto_renew_stops_at_max_hold(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(400));
    let max_hold = ttl * 3;
    let opts = ctx.opts(ttl).auto_renew(AutoRenew::until(max_hold));
    let g = must_try(&a, &name, &opts, "holder").await?;
    let start = g.acquired_at();
    let lost = g.lost();
    tokio::time::sleep_until(start + max_hold / 2).await;
    must_be_held(
        &b,
        &name,
        &ctx.opts(ttl),
        "half way to the maximum hold time",
    )
    .await?;
    // A competitor polling hard from just before the maximum hold time, so that a release
    // racing the lease's end meets a next holder.
    let g2 = race_for(
        &b,
        &name,
        &ctx.opts(ttl),
        start + max_hold.saturating_sub(Duration::from_millis(20)),
        start + max_hold + ttl * 2 + ctx.bound(Duration::from_secs(5)),
    )
    .await?;
    // The winning try_lock was granted before it returned: a grant before the first holder's
    // validity deadline is two holders at once. (Its send time is no evidence here: the
    // watchdog releases the lock at that deadline, and a try_lock sent just before it may
    // arrive just after the release.)
    let won_by = Instant::now();
    let valid_until = g.valid_until();
    check!(
        won_by >= valid_until,
        "another client held the lock {:?} before the first holder's validity deadline (max hold {max_hold:?}): the last renewal's lease ended early",
        valid_until - won_by
    );
    let at = g2.acquired_at().saturating_duration_since(start);
    check!(
        at <= max_hold + ttl + ctx.bound(Duration::from_secs(3)),
        "renewal ran on: taken over only {at:?} after acquiring (max hold {max_hold:?}, TTL {ttl:?})"
    );
    check!(
        lost.is_lost(),
        "the first holder's lost signal did not fire although another client holds the lock"
    );
    drop_lost_guard_then_release_new(ctx, &a, g, g2).await
}

pub(super) async fn lost_signal_on_expiry(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(500));
    let g = must_try(&a, &name, &ctx.opts(ttl), "holder").await?;
    let lost = g.lost();
    check!(!lost.is_lost(), "the lost signal fired at once");
    // A waiter is already racing for the lock when the lease runs out.
    let waiter = {
        let (b, name, opts) = (
            b.clone(),
            name.clone(),
            ctx.opts(ttl)
                .wait_timeout(ttl * 3 + ctx.bound(Duration::from_secs(5))),
        );
        tokio::spawn(async move { b.lock(&name, &opts).await })
    };
    let g2 = ok_or(ok_or(waiter.await, "waiter task")?, "the waiter's lock()")?;
    // Granted before lock() returned (its send time is no evidence of an early grant).
    let won_by = Instant::now();
    check!(
        lost.is_lost(),
        "another client won the lock while the holder's lost signal had not fired"
    );
    check!(
        won_by >= g.valid_until(),
        "another client won the lock {:?} before the holder's validity deadline",
        g.valid_until() - won_by
    );
    check!(
        !g.is_valid(),
        "the guard says valid after its lease was lost"
    );
    drop_lost_guard_then_release_new(ctx, &a, g, g2).await
}

pub(super) async fn lost_signal_on_revoke(ctx: &Ctx) -> Outcome {
    let a = ctx.client().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(900));
    let g = must_try(
        &a,
        &name,
        &ctx.opts(ttl).auto_renew(AutoRenew::until(ttl * 50)),
        "holder",
    )
    .await?;
    let lost = g.lost();
    ok_or(ctx.harness.revoke(&name).await, "revoke")?;
    // The next renewal (a third of the TTL in) must find out; the validity deadline passing
    // would fire the signal anyway, so it must fire before.
    let deadline = g.valid_until();
    let reason = ok_or(
        tokio::time::timeout_at(deadline, lost.lost()).await,
        "the lost signal did not fire before the validity deadline after the lock was revoked",
    )?;
    check!(
        reason != LostReason::ValidityExpired,
        "the lost signal fired only because the validity ran out ({reason})"
    );
    check!(
        !g.is_valid(),
        "the guard says valid after its lock was revoked"
    );
    Ok(())
}

/// The slack over a declared loss detection bound: scheduling and a round trip. Small enough
/// that a report 300 ms late is caught where the backend declares it prompt.
const DETECTION_SLACK: Duration = Duration::from_millis(150);

/// How long after a loss the backend's own detection must have fired the lost signal: its
/// declared [`loss_detection`](lockcore::Capabilities::loss_detection) bound plus
/// [`DETECTION_SLACK`], scaled; `None` where only a renewal finds out. A check's own round
/// trip is allowed half its interval more (a ping of a loaded server: row locks, measured
/// 390 to 460 ms against a 500 ms interval under a load of 14 on 2 cores).
fn declared_detection_bound(ctx: &Ctx) -> Option<Duration> {
    let declared = ctx.caps.loss_detection.bound()?;
    let round_trip = match ctx.caps.loss_detection {
        LossDetection::Checked { every } => every / 2,
        _ => Duration::ZERO,
    };
    Some(ctx.bound(declared + round_trip + DETECTION_SLACK))
}

/// A lock deleted behind a holder that does not renew (TTL 30 s): the backend's own detection
/// fires the lost signal within the bound it declares
/// ([`LossDetection`]: pushed within X, checked every X and half that for the check's round
/// trip) plus a scaled slack of 150 ms. Nothing else could fire it in time.
pub(super) async fn lost_detection_as_declared(ctx: &Ctx) -> Outcome {
    let Some(bound) = declared_detection_bound(ctx) else {
        return Err("loss_detection declares no bound (the scenario should not apply)".into());
    };
    let a = ctx.client().await?;
    let name = ctx.name("x");
    // No renewal and a long TTL: only the backend's own detection can fire the signal in time.
    let ttl = ctx.ttl(Duration::from_secs(30));
    let g = must_try(&a, &name, &ctx.opts(ttl), "holder").await?;
    let why = format!("loss_detection is declared {:?}", ctx.caps.loss_detection);
    let (took, _) = revoke_and_await_loss(ctx, &g, bound, &why).await?;
    ctx.observe(format!(
        "loss reported {took:?} after the revocation (declared {:?}, bound {bound:?})",
        ctx.caps.loss_detection
    ));
    Ok(())
}

/// `force_release` from another client, behind a renewing holder: the holder's lost signal
/// fires, and its guard says invalid, within its declared
/// [`loss_detection`](lockcore::Capabilities::loss_detection) bound (plus a scaled 150 ms)
/// where it declares one (it learns of the revocation itself: a watch, a message, a check of
/// its session), with a TTL of 30 s so that no renewal (every 10 s) can explain it; otherwise
/// by its next renewal (TTL 3 s: a third of it, plus 3 s), never only at the validity
/// deadline.
pub(super) async fn revocation_noticed(ctx: &Ctx) -> Outcome {
    let a = ctx.client().await?;
    let name = ctx.name("x");
    let declared = declared_detection_bound(ctx);
    let ttl = ctx.ttl(Duration::from_secs(if declared.is_some() { 30 } else { 3 }));
    let opts = ctx.opts(ttl).auto_renew(AutoRenew::until(ttl * 10));
    let g = must_try(&a, &name, &opts, "holder").await?;
    let (bound, why) = match declared {
        Some(bound) => (bound, "loss_detection declares a bound"),
        None => (
            ttl / 3 + ctx.bound(Duration::from_secs(3)),
            "loss_detection is at renewal: the next renewal must find out",
        ),
    };
    let (took, reason) = revoke_and_await_loss(ctx, &g, bound, why).await?;
    ctx.observe(format!(
        "revocation noticed {took:?} after force_release ({reason}; loss_detection {:?})",
        ctx.caps.loss_detection
    ));
    Ok(())
}

/// Revokes the lock of `g` behind it (`force_release` through the harness) and waits for its
/// lost signal: it must fire within `bound` of the revocation (`why` that bound), for another
/// reason than its validity running out, and leave the guard invalid. How long it took (from
/// when the revocation was done: the harness's own round trips aside), and the reason.
async fn revoke_and_await_loss(
    ctx: &Ctx,
    g: &LockGuard,
    bound: Duration,
    why: &str,
) -> Result<(Duration, LostReason), Failure> {
    let lost = g.lost();
    ok_or(ctx.harness.revoke(g.name()).await, "force_release")?;
    let revoked = Instant::now();
    let reason = ok_or(
        tokio::time::timeout_at(revoked + bound, lost.lost()).await,
        &format!(
            "{why}, but the holder's lost signal did not fire within {bound:?} of the lock being \
             taken away (TTL {:?})",
            g.ttl()
        ),
    )?;
    let took = revoked.elapsed();
    check!(
        reason != LostReason::ValidityExpired,
        "odd lost reason {reason}"
    );
    check!(
        !g.is_valid(),
        "the guard says valid after its lock was revoked and its lost signal fired"
    );
    Ok((took, reason))
}

pub(super) async fn native_lease_ends_with_session(ctx: &Ctx) -> Outcome {
    let (a, [b]) = ctx.crashable_and_clients().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_secs(30));
    let opts = ctx.opts(ttl).auto_renew(AutoRenew::until(ttl * 10));
    let g = must_try(&a, &name, &opts, "holder").await?;
    let crashed = Instant::now();
    ctx.harness.crash(g, a).await;
    let g2 = ok_or(
        b.lock(
            &name,
            &ctx.opts(ttl)
                .wait_timeout(ttl + ctx.bound(Duration::from_secs(5))),
        )
        .await,
        "lock() after the crash",
    )?;
    let took = crashed.elapsed();
    let bound = ctx.bound(Duration::from_secs(5));
    check!(
        took <= bound,
        "native renewal is declared, but a crashed holder's lock was free only {took:?} later (bound {bound:?}, TTL {ttl:?})"
    );
    ok_or(g2.release().await, "release")
}
