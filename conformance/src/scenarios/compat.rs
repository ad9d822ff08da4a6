//! The compatibility family, generated from each backend's table
//! ([`Capabilities::compatibility_table`](lockcore::Capabilities::compatibility_table)): one
//! scenario per ordered pair of the ways the suite takes through a client (an exclusive lock,
//! a shared lock, a permit, a multi-lock member, a campaign). Each takes a name the first way,
//! asks for it the second way, and checks what the table declares: kept out (contention, or a
//! `Conflict` refusal), held together, or refused with a typed error. Registered only where
//! both ways exist on the backend and its table has the cell; the ways of a backend's other
//! settings and peers are checked by its own crate's tests (the table names them).

use std::time::Duration;

use lockcore::{
    CampaignOptions, ErrorKind, LockName, Locker, Relation, WayKind, compatibility::ways,
};

use super::boxed;
use super::context::{Ctx, Outcome, Scenario};
use crate::harness::Harness;

/// The table's identifier of a client way.
fn id(kind: WayKind) -> &'static str {
    match kind {
        WayKind::Exclusive => ways::EXCLUSIVE,
        WayKind::Shared => ways::SHARED,
        WayKind::Permits => ways::PERMITS,
        WayKind::MultiMember => ways::MULTI,
        WayKind::Campaign => ways::CAMPAIGN,
        _ => "",
    }
}

/// The scenario's name for the cell `first` then `second`.
pub(crate) fn scenario_name(first: &str, second: &str) -> String {
    let slug = |s: &str| s.replace(['-', ' '], "_");
    format!("compat_{}_then_{}", slug(first), slug(second))
}

/// Whether the cell `first` then `second` applies: both ways exist and the table has it.
pub(super) fn applies(
    caps: &lockcore::Capabilities,
    first: WayKind,
    second: WayKind,
) -> Result<(), &'static str> {
    let table = caps.compatibility_table();
    if table.find(id(first)).is_none() || table.find(id(second)).is_none() {
        return Err("the backend does not offer both ways");
    }
    if table.relation(id(first), id(second)).is_none() {
        return Err("the backend's compatibility table has no such cell");
    }
    Ok(())
}

/// The `applies` of a scenario of this family (the harness plays no part).
pub(super) fn applies_with(
    caps: &lockcore::Capabilities,
    _: &dyn Harness,
    first: WayKind,
    second: WayKind,
) -> Result<(), &'static str> {
    applies(caps, first, second)
}

/// A name held one way, released at the end.
enum Held {
    Guard(lockcore::LockGuard),
    Set(lockcore::MultiGuard),
    Leader(lockcore::Leadership),
}

impl Held {
    async fn release(self) -> Result<(), String> {
        match self {
            Held::Guard(g) => g.release().await,
            Held::Set(s) => s.release().await,
            Held::Leader(l) => l.resign().await,
        }
        .map_err(|e| format!("releasing: {e}"))
    }
}

/// Takes `name` the `kind` way, once: `Ok(None)` when kept out (contention; a campaign that
/// was not elected at once). A campaign for a free name (`free`) waits a bound for its
/// election: on a backend whose waiting campaign queues first, a zero wait gives up at once.
async fn take(
    ctx: &Ctx,
    locker: &Locker,
    kind: WayKind,
    name: &LockName,
    free: bool,
) -> lockcore::Result<Option<Held>> {
    let ttl = ctx.ttl(Duration::from_secs(30));
    let opts = ctx.opts(ttl);
    Ok(match kind {
        WayKind::Shared => locker
            .try_lock(name, &opts.shared())
            .await?
            .map(Held::Guard),
        WayKind::Permits => locker
            .try_lock(name, &opts.permits(2))
            .await?
            .map(Held::Guard),
        WayKind::MultiMember => {
            // Short: a name with its suffix stays within GET_LOCK's 64 characters.
            let other = format!("{}o", name.as_str());
            locker
                .try_lock_all([name.as_str(), other.as_str()], &opts)
                .await?
                .map(Held::Set)
        }
        WayKind::Campaign => {
            let wait = if free {
                ctx.bound(Duration::from_secs(10))
            } else {
                Duration::ZERO
            };
            let once = CampaignOptions::new()
                .ttl(ttl)
                .no_auto_renew()
                .wait_timeout(wait);
            match locker.campaign(name, "compat", &once).await {
                Ok(l) => Some(Held::Leader(l)),
                Err(e) if e.kind() == ErrorKind::Timeout => None,
                Err(e) => return Err(e),
            }
        }
        _ => locker.try_lock(name, &opts).await?.map(Held::Guard),
    })
}

/// The cell `first` then `second`: take the name the first way, ask for it the second way, and
/// check what the table declares.
pub(super) async fn cell(ctx: &Ctx, first: WayKind, second: WayKind) -> Outcome {
    let table = ctx.caps.compatibility_table();
    let (f, s) = (id(first), id(second));
    let relation = table
        .relation(f, s)
        .ok_or_else(|| format!("no cell {f} then {s}"))?
        .clone();
    let [a, b] = ctx.clients().await?;
    let name = ctx.name("c");
    let held = take(ctx, &a, first, &name, true)
        .await
        .map_err(|e| format!("taking the free name {f}: {e}"))?
        .ok_or_else(|| format!("the free name was not taken {f}"))?;
    let second_try = take(ctx, &b, second, &name, false).await;
    let verdict = match (&relation, second_try) {
        (Relation::Exclude, Ok(None)) => Ok(()),
        (Relation::Exclude, Err(e)) if e.kind() == ErrorKind::Conflict => {
            ctx.observe(format!("kept out by a refusal: {e}"));
            Ok(())
        }
        (Relation::Share, Ok(Some(h))) => h.release().await,
        (Relation::Refuse(_), Err(e))
            if matches!(e.kind(), ErrorKind::Conflict | ErrorKind::InvalidConfig) =>
        {
            Ok(())
        }
        (_, Ok(Some(h))) => {
            h.release().await?;
            Err(format!(
                "declared {relation}, but {s} was taken while {f} held: two holders"
            ))
        }
        (_, Ok(None)) => Err(format!(
            "declared {relation}, but {s} was merely kept out while {f} held"
        )),
        (_, Err(e)) => Err(format!(
            "declared {relation}, but {s} while {f} held failed: {e}"
        )),
    };
    held.release().await?;
    verdict
}

/// One scenario per ordered pair of client ways: `compat_<first>_then_<second>`.
macro_rules! cells {
    ($(($f:ident, $fs:literal, $s:ident, $ss:literal)),* $(,)?) => {
        vec![$(Scenario {
            name: concat!("compat_", $fs, "_then_", $ss),
            summary: concat!(
                "compatibility table: a name held ", $fs, " asked for ", $ss,
                " excludes, shares or refuses as the backend declares"
            ),
            applies: |caps, h| applies_with(caps, h, WayKind::$f, WayKind::$s),
            run: |ctx| boxed(cell(ctx, WayKind::$f, WayKind::$s)),
        }),*]
    };
}

/// The family, in report order.
pub(super) fn scenarios() -> Vec<Scenario> {
    cells![
        (Exclusive, "exclusive", Exclusive, "exclusive"),
        (Exclusive, "exclusive", Shared, "shared"),
        (Exclusive, "exclusive", Permits, "permits"),
        (Exclusive, "exclusive", MultiMember, "multi_lock_member"),
        (Exclusive, "exclusive", Campaign, "campaign"),
        (Shared, "shared", Exclusive, "exclusive"),
        (Shared, "shared", Shared, "shared"),
        (Shared, "shared", Permits, "permits"),
        (Shared, "shared", MultiMember, "multi_lock_member"),
        (Shared, "shared", Campaign, "campaign"),
        (Permits, "permits", Exclusive, "exclusive"),
        (Permits, "permits", Shared, "shared"),
        (Permits, "permits", Permits, "permits"),
        (Permits, "permits", MultiMember, "multi_lock_member"),
        (Permits, "permits", Campaign, "campaign"),
        (MultiMember, "multi_lock_member", Exclusive, "exclusive"),
        (MultiMember, "multi_lock_member", Shared, "shared"),
        (MultiMember, "multi_lock_member", Permits, "permits"),
        (
            MultiMember,
            "multi_lock_member",
            MultiMember,
            "multi_lock_member"
        ),
        (MultiMember, "multi_lock_member", Campaign, "campaign"),
        (Campaign, "campaign", Exclusive, "exclusive"),
        (Campaign, "campaign", Shared, "shared"),
        (Campaign, "campaign", Permits, "permits"),
        (Campaign, "campaign", MultiMember, "multi_lock_member"),
        (Campaign, "campaign", Campaign, "campaign"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names the report looks cells up by are the names the family registers.
    #[test]
    fn every_client_cell_has_its_scenario() {
        let names: Vec<&str> = scenarios().iter().map(|s| s.name).collect();
        let kinds = [
            WayKind::Exclusive,
            WayKind::Shared,
            WayKind::Permits,
            WayKind::MultiMember,
            WayKind::Campaign,
        ];
        for f in kinds {
            for s in kinds {
                let n = scenario_name(id(f), id(s));
                assert!(names.contains(&n.as_str()), "{n} not registered");
            }
        }
        assert_eq!(names.len(), 25);
    }
}
