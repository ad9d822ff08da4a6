//! A multi-lock cancelled while its set is being taken: at every point of the take (before the
//! request, on the wire, while the set is written, at the grant), nothing of the set stays
//! held past the TTL asked for. `multi::cancelled_multi_lock_leaves_nothing` cancels a
//! `lock_all` while it waits on a busy member; here the cancellation falls inside the take.

use std::time::Duration;

use lockcore::{Instant, LockName};

use super::context::{Ctx, Outcome};
use super::support::ok_or;

/// A `try_lock_all` of three free names cancelled after 0 to 1.5 times its typical latency
/// (and at a few fixed points up to 40 ms): every member is free for another client within the
/// TTL (600 ms, scaled) and 250 ms of the cancellation. A set written without its expiry, and
/// given its TTL a round trip later, stays held for good when cancelled in between.
pub(super) async fn cancelled_set_take_leaves_nothing(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
    let ttl = ctx.ttl(Duration::from_millis(600));
    let opts = ctx.opts(ttl);
    let set =
        |i: usize| -> Vec<LockName> { (1..=3).map(|m| ctx.name(&format!("s{i}m{m}"))).collect() };
    // The typical take of a set sets where the cancellation points fall.
    let probe = set(0);
    let mut lat = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let all = ok_or(
            a.try_lock_all(probe.clone(), &opts).await,
            "the probe's set",
        )?
        .ok_or("the probe's set was busy")?;
        lat.push(start.elapsed());
        ok_or(all.release().await, "the probe's release")?;
    }
    lat.sort();
    let typical = lat[2].max(Duration::from_micros(200));
    let slack = ctx.bound(Duration::from_millis(250));
    let cuts = [0.0, 0.25, 0.5, 0.75, 1.0, 1.5]
        .map(|f| typical.mul_f64(f))
        .into_iter()
        .chain([5, 10, 20, 40].map(Duration::from_millis));
    for (i, cut) in cuts.enumerate() {
        let names = set(i + 1);
        let outcome = tokio::time::timeout(cut, a.try_lock_all(names.clone(), &opts)).await;
        let cancelled = Instant::now();
        if let Ok(r) = outcome
            && let Some(all) = ok_or(r, "an uncancelled try_lock_all")?
        {
            ok_or(all.release().await, "release")?;
        }
        // Another client takes the whole set once every member is free: polling every
        // millisecond until the TTL and the slack are up.
        let give_up = cancelled + ttl + slack;
        loop {
            if let Some(all) = ok_or(
                b.try_lock_all(names.clone(), &opts).await,
                "the racing try_lock_all",
            )? {
                ok_or(all.release().await, "release")?;
                break;
            }
            if Instant::now() >= give_up {
                return Err(format!(
                    "a try_lock_all cancelled after {cut:?} (typical take {typical:?}) left part \
                     of its set held {:?} after the cancellation (TTL {ttl:?}, allowed {:?})",
                    cancelled.elapsed(),
                    ttl + slack
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    Ok(())
}
