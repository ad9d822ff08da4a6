//! Client clocks on the primitives: a client whose wall clock runs a minute ahead judges
//! nobody's lease by it. `latency::skewed_clock_cannot_steal` runs such a client's `try_lock`
//! on an exclusive lock; here it asks for a permit of a full semaphore (a client sweeping
//! "expired" permits by its own clock frees live ones) and campaigns against a live leader (a
//! candidate judging the leader's expiry by its own clock deposes it).

use std::time::Duration;

use lockcore::{CampaignOptions, ErrorKind, Locker};

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

/// Semaphore: with 2 of 2 permits held (TTL 10 s), a client whose clock runs a minute ahead
/// is refused a permit by `try_lock` and by a short `lock`, and both holders keep theirs.
pub(super) async fn skewed_client_cannot_sweep_permits(ctx: &Ctx) -> Outcome {
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
