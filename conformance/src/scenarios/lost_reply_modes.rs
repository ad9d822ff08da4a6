//! Lost acquire replies in every mode (issue 33): a shared lock, a permit, a multi-lock and a
//! campaign whose acquire the server applied but whose reply was lost. The library's retry
//! (the same owner token) must get its own grant at once, re-check what the first attempt
//! checked (nothing taken twice: no second share or permit of one owner, no member of a set
//! left behind), and leave nothing once released. The mutex's own case is
//! `lost_acquire_reply_is_retried_safely`.

use std::time::Duration;

use lockcore::{CampaignOptions, ErrorKind, Instant, LockName, LockOptions, Locker};

use super::context::{Ctx, Failure, Outcome};
use super::lost_replies::losing_client;
use super::support::{check, ok_or};

/// What the losing client holds after its retried acquire.
enum Held {
    Guard(lockcore::LockGuard),
    Set(lockcore::MultiGuard),
    Leader(lockcore::Leadership),
}

impl Held {
    /// Until when the retried grant is surely held (the earliest of a set's members).
    fn valid_until(&self) -> Instant {
        match self {
            Held::Guard(g) => g.valid_until(),
            Held::Set(s) => s.valid_until(),
            Held::Leader(l) => l.guard().valid_until(),
        }
    }

    async fn release(self) -> Result<(), Failure> {
        match self {
            Held::Guard(g) => ok_or(g.release().await, "the release"),
            Held::Set(s) => ok_or(s.release().await, "the set's release"),
            Held::Leader(l) => ok_or(l.resign().await, "the resignation"),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Shared,
    Permit,
    Multi,
    Campaign,
}

/// The permit limit: two, so that a retry that took a second permit for its owner would keep
/// the other client's one out.
const LIMIT: u32 = 2;

async fn take(
    locker: &Locker,
    way: Way,
    name: &LockName,
    other: &LockName,
    opts: &LockOptions,
    ttl: Duration,
) -> lockcore::Result<Held> {
    Ok(match way {
        Way::Shared => Held::Guard(locker.lock(name, &opts.clone().shared()).await?),
        Way::Permit => Held::Guard(locker.lock(name, &opts.clone().permits(LIMIT)).await?),
        Way::Multi => Held::Set(locker.lock_all([name.clone(), other.clone()], opts).await?),
        Way::Campaign => {
            let c = CampaignOptions::new()
                .ttl(ttl)
                .no_auto_renew()
                .wait_timeout(opts.wait_value().unwrap_or(ttl));
            Held::Leader(locker.campaign(name, "lost-reply", &c).await?)
        }
    })
}

/// While the retried grant holds: what another client may and may not take of the name.
async fn check_beside(
    ctx: &Ctx,
    way: Way,
    b: &Locker,
    c: &Locker,
    name: &LockName,
    valid_until: Instant,
) -> Outcome {
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(4)));
    let kept_out = |r: lockcore::Result<Option<lockcore::LockGuard>>| match r {
        Ok(None) => Ok(true),
        Err(e) if e.kind() == ErrorKind::Conflict => Ok(true),
        Ok(Some(g)) => {
            drop(g);
            Ok(false)
        }
        Err(e) => Err(format!("another client's try_lock: {e}")),
    };
    let kept = kept_out(b.try_lock(name, &opts).await)?;
    // The scenario holds without renewal: a win whose reply came after the retried grant's
    // validity ended may be that lease's legitimate expiry (a process stalled past its TTL),
    // and is said so; only a win before it is a second holder.
    let answered = Instant::now();
    check!(
        kept || answered < valid_until,
        "inconclusive: another client took the name {:?} after the retried grant's validity \
         ended (the process stalled past the TTL: not a double grant, but nothing checked)",
        answered.duration_since(valid_until)
    );
    check!(
        kept,
        "another client took the name exclusively beside the retried grant: two holders"
    );
    match way {
        Way::Shared => {
            let share = ok_or(
                b.try_lock(name, &opts.clone().shared()).await,
                "another reader's try_lock",
            )?;
            check!(
                share.is_some(),
                "another reader was kept out beside one reader"
            );
            if let Some(g) = share {
                ok_or(g.release().await, "the other reader's release")?;
            }
        }
        Way::Permit => {
            // One permit of two is the retried owner's: exactly one is left.
            let one = ok_or(
                b.try_lock(name, &opts.clone().permits(LIMIT)).await,
                "another client's permit",
            )?;
            check!(
                one.is_some(),
                "no permit of {LIMIT} was left beside the retried one: the retry took a second permit for its owner"
            );
            let two = ok_or(
                c.try_lock(name, &opts.clone().permits(LIMIT)).await,
                "a third client's permit",
            )?;
            let too_many = two.is_some();
            for g in [one, two].into_iter().flatten() {
                ok_or(g.release().await, "a permit's release")?;
            }
            check!(
                !too_many,
                "{} permits of {LIMIT} were held at once",
                LIMIT + 1
            );
        }
        Way::Multi | Way::Campaign => {}
    }
    Ok(())
}

async fn lost_reply_in(ctx: &Ctx, way: Way) -> Outcome {
    let (a, loser) = losing_client(ctx).await?;
    let [b, c] = ctx.clients().await?;
    let name = ctx.name("x");
    let other = ctx.name("y");
    let ttl = ctx.ttl(Duration::from_secs(4));
    let slack = ctx.bound(Duration::from_secs(2));
    let opts = ctx.opts(ttl).wait_timeout(ttl + slack);
    loser.lose_next_reply(name.as_str().as_bytes());
    let started = Instant::now();
    let res = tokio::time::timeout(ttl + slack * 2, take(&a, way, &name, &other, &opts, ttl)).await;
    let took = started.elapsed();
    let lost = loser.disarm();
    let held = match res {
        Err(_) => {
            return Err(format!(
                "the acquire had not returned {took:?} after its reply was lost"
            ));
        }
        Ok(Err(e)) => {
            return Err(format!(
                "the acquire failed {took:?} after its reply was lost ({e}; {lost} replies lost)"
            ));
        }
        Ok(Ok(h)) => h,
    };
    check!(
        lost >= 1,
        "no reply was lost: the acquire did not carry the name {name} (the fault was not applied)"
    );
    check!(
        took <= ttl / 2,
        "the acquire took {took:?} after its reply was lost (TTL {ttl:?}): the retry waited for its own lost grant to expire"
    );
    check_beside(ctx, way, &b, &c, &name, held.valid_until()).await?;
    let released = Instant::now();
    held.release().await?;
    // Nothing left behind: a share, permit or member nobody knows of would hold the name
    // until its TTL.
    let g = ok_or(
        b.lock_all(
            [name.clone(), other.clone()],
            &ctx.opts(ttl).wait_timeout(ttl + slack),
        )
        .await,
        "another client's lock after the retried grant was released",
    )?;
    let freed = released.elapsed();
    ok_or(g.release().await, "the other client's release")?;
    let bound = ctx.bound(Duration::from_secs(2));
    check!(
        freed <= bound,
        "another client got the name only {freed:?} after the retried grant was released (bound {bound:?}, TTL {ttl:?}): part of the lost grant was left behind"
    );
    Ok(())
}

pub(super) async fn lost_shared_acquire_reply_is_retried_safely(ctx: &Ctx) -> Outcome {
    lost_reply_in(ctx, Way::Shared).await
}

pub(super) async fn lost_permit_acquire_reply_is_retried_safely(ctx: &Ctx) -> Outcome {
    lost_reply_in(ctx, Way::Permit).await
}

pub(super) async fn lost_multi_lock_reply_is_retried_safely(ctx: &Ctx) -> Outcome {
    lost_reply_in(ctx, Way::Multi).await
}

pub(super) async fn lost_campaign_reply_is_retried_safely(ctx: &Ctx) -> Outcome {
    lost_reply_in(ctx, Way::Campaign).await
}
