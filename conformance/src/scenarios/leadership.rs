//! A leader that keeps renewing is deposed by its key's deletion (an operator's revocation, a
//! failover that lost it): it must notice at its next renewal, not go on saying it leads beside
//! the leader elected after it. `election::old_leader_lost_before_new_leader` deposes a leader
//! by stopping its renewals, which lockcore's own validity check catches whatever the backend
//! does; here only the backend's renewal (or its own notice) can tell.

use std::time::Duration;

use lockcore::{AutoRenew, CampaignOptions, Instant, LostReason};

use super::context::{Ctx, Outcome};
use super::support::{check, ok_or};

/// A renewing leader whose key is deleted behind it: a new candidate is elected, and the old
/// leader's lost signal fires within a TTL of the deletion (its next renewal comes a third of
/// a TTL in, and must find the key gone), not by its validity running out.
pub(super) async fn revoked_leader_notices_while_renewing(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
    let name = ctx.name("leader");
    let ttl = ctx.ttl(Duration::from_millis(900));
    let renewing = CampaignOptions::new()
        .ttl(ttl)
        .wait_timeout(ctx.bound(Duration::from_secs(30)))
        .auto_renew(AutoRenew::until(ttl * 50));
    let old = ok_or(
        a.campaign(&name, "old", &renewing).await,
        "the first campaign",
    )?;
    let lost = old.lost();
    ok_or(ctx.harness.revoke(&name).await, "revoking the leader's key")?;
    let revoked = Instant::now();
    let opts = CampaignOptions::new()
        .ttl(ctx.ttl(Duration::from_secs(30)))
        .no_auto_renew()
        .wait_timeout(ctx.bound(Duration::from_secs(10)));
    let new = ok_or(
        b.campaign(&name, "new", &opts).await,
        "the campaign after the revocation",
    )?;
    let bound = ttl + ctx.bound(Duration::from_millis(500));
    let reason = tokio::time::timeout_at(revoked + bound, lost.lost())
        .await
        .map_err(|_| {
            format!(
                "the old leader, renewing, still said it led {bound:?} after its key was \
                 deleted (TTL {ttl:?}), beside the leader elected after it: its renewals \
                 never noticed"
            )
        })?;
    check!(
        reason != LostReason::ValidityExpired,
        "the old leader learned of its loss only because its validity ran out ({reason}): its renewals kept succeeding"
    );
    check!(
        !old.is_leader(),
        "the old leader says it leads after its lost signal fired"
    );
    check!(
        new.is_leader(),
        "the new leader lost its leadership ({:?})",
        new.lost().reason()
    );
    drop(old);
    a.flush().await;
    ok_or(new.resign().await, "the new leader's resignation")
}
