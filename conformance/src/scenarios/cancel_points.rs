//! An acquisition cancelled at every point of its way, for every primitive: a mutex's `lock()`,
//! a reader's, a permit's, a `lock_all`'s and a `try_lock_all`'s. Uncontended, cancelled on the way to a free lock
//! (before the request, on the wire, while it is written, at the grant); contended, a waiter
//! cancelled just after the holder's release, while it is woken, retrying or granted. Whatever
//! a cancelled acquisition left was asked for by a request sent before the cancellation, for one
//! TTL: a client polling every millisecond finds everything free within that TTL (and a slack)
//! of the cancellation.

use std::time::Duration;

use lockcore::{Instant, LockGuard, LockName, LockOptions, Locker, MultiGuard};

use super::context::{Ctx, Failure, Outcome};
use super::support::{must_try, ok_or, settle_pending};

/// What the cancelled acquisition takes.
#[derive(Clone, Copy, Debug)]
pub(super) enum Take {
    /// The mutex: `lock()`, exclusive.
    Exclusive,
    /// A reader: `lock()` shared, kept waiting by a writer.
    Shared,
    /// The only permit of a semaphore of one: `lock()` with `permits(1)`.
    Permit,
    /// A multi-lock of three names: `lock_all()`, kept waiting by a holder of its last member.
    Set,
    /// A multi-lock of three free names in one attempt: `try_lock_all()` (never contended).
    TrySet,
}

/// What a take that was not cancelled in time holds.
enum Held {
    One(LockGuard),
    All(MultiGuard),
}

impl Held {
    async fn release(self) -> lockcore::Result<()> {
        match self {
            Held::One(g) => g.release().await,
            Held::All(g) => g.release().await,
        }
    }
}

impl Take {
    fn what(self) -> &'static str {
        match self {
            Take::Exclusive => "an acquire",
            Take::Shared => "a reader's acquire",
            Take::Permit => "a permit's acquire",
            Take::Set => "a lock_all",
            Take::TrySet => "a try_lock_all",
        }
    }

    /// The names of case `case`: one, or a set of three.
    fn names(self, ctx: &Ctx, case: &str) -> Vec<LockName> {
        match self {
            Take::Set | Take::TrySet => (1..=3).map(|m| ctx.name(&format!("{case}m{m}"))).collect(),
            _ => vec![ctx.name(case)],
        }
    }

    /// The options of the take with `ttl`.
    fn opts(self, ctx: &Ctx, ttl: Duration) -> LockOptions {
        match self {
            Take::Shared => ctx.opts(ttl).shared(),
            Take::Permit => ctx.opts(ttl).permits(1),
            Take::Exclusive | Take::Set | Take::TrySet => ctx.opts(ttl),
        }
    }

    /// The options that find anything the take left held: a writer beside a reader's share,
    /// the take's own otherwise.
    fn free_opts(self, ctx: &Ctx, ttl: Duration) -> LockOptions {
        match self {
            Take::Shared => ctx.opts(ttl),
            _ => self.opts(ctx, ttl),
        }
    }

    /// The take under test: `lock()`, `lock_all()` or `try_lock_all()` (`None` only from
    /// that one).
    async fn take(
        self,
        client: &Locker,
        names: &[LockName],
        opts: &LockOptions,
    ) -> lockcore::Result<Option<Held>> {
        match self {
            Take::TrySet => self.try_take(client, names, opts).await,
            Take::Set => Ok(Some(Held::All(
                client.lock_all(names.to_vec(), opts).await?,
            ))),
            _ => Ok(Some(Held::One(client.lock(&names[0], opts).await?))),
        }
    }

    /// One attempt at what [`Take::take`] takes, with `opts`.
    async fn try_take(
        self,
        client: &Locker,
        names: &[LockName],
        opts: &LockOptions,
    ) -> lockcore::Result<Option<Held>> {
        match self {
            Take::Set | Take::TrySet => Ok(client
                .try_lock_all(names.to_vec(), opts)
                .await?
                .map(Held::All)),
            _ => Ok(client.try_lock(&names[0], opts).await?.map(Held::One)),
        }
    }

    /// The holder in the take's way (long TTL, released by the scenario): a writer for a
    /// reader, the permit for a permit, the last member for a set.
    async fn block(
        self,
        ctx: &Ctx,
        holder: &Locker,
        names: &[LockName],
    ) -> Result<LockGuard, Failure> {
        let ttl = ctx.ttl(Duration::from_secs(30));
        let opts = match self {
            Take::Permit => ctx.opts(ttl).permits(1),
            _ => ctx.opts(ttl),
        };
        must_try(
            holder,
            self.busy_name(names),
            &opts,
            "the holder in the way",
        )
        .await
    }

    /// The name a contended take waits on.
    fn busy_name(self, names: &[LockName]) -> &LockName {
        names.last().expect("a take has a name")
    }
}

/// `take` cancelled at 0 to 1.5 times its typical latency on a free lock, and 0 to 16 times it
/// after the release of a holder it waits for: everything it asked for is free for another
/// client within the TTL (600 ms, scaled) and 250 ms of the cancellation.
pub(super) async fn cancelled_take_leaves_nothing(ctx: &Ctx, take: Take) -> Outcome {
    let [a, b, h] = ctx.clients().await?;
    let ttl = ctx.ttl(Duration::from_millis(600));
    let (opts, free) = (take.opts(ctx, ttl), take.free_opts(ctx, ttl));
    // The typical latency sets where the cancellation points fall.
    let probe = take.names(ctx, "probe");
    let mut lat = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let held = ok_or(take.try_take(&a, &probe, &opts).await, "the probe")?
            .ok_or("the probe found its names held")?;
        lat.push(start.elapsed());
        ok_or(held.release().await, "the probe's release")?;
    }
    lat.sort();
    let typical = lat[2].max(Duration::from_micros(200));
    // Whatever a cancelled acquire left was asked for by a request sent before it was
    // cancelled, for one TTL: it must be gone a TTL after the cancellation (plus the server's
    // timer and a round trip).
    let slack = ctx.bound(Duration::from_millis(250));
    let uncontended = [0.0, 0.25, 0.5, 0.75, 1.0, 1.5].map(|f| (false, typical.mul_f64(f)));
    let cases: Vec<(bool, Duration)> = match take {
        // One attempt: at a few fixed points up to 40 ms too (a second round trip's).
        Take::TrySet => uncontended
            .into_iter()
            .chain([5, 10, 20, 40].map(|ms| (false, Duration::from_millis(ms))))
            .collect(),
        _ => uncontended
            .into_iter()
            .chain([0.0, 1.0, 2.0, 4.0, 8.0, 16.0].map(|f| (true, typical.mul_f64(f))))
            .collect(),
    };
    for (i, (contended, cut)) in cases.into_iter().enumerate() {
        let names = take.names(ctx, &format!("c{i}"));
        let how = if contended {
            format!(
                "{} waiting, cancelled {cut:?} after the holder's release",
                take.what()
            )
        } else {
            format!("{} of a free lock cancelled after {cut:?}", take.what())
        };
        let mut acquire = [Box::pin(take.take(&a, &names, &opts))];
        if contended {
            // The holder releases by itself: a long lease, so that it cannot run out while
            // the waiter settles on a loaded machine (the waiter would then win, and the case
            // prove nothing).
            let g = take.block(ctx, &h, &names).await?;
            settle_pending(ctx, &h, take.busy_name(&names), &[&a], &mut acquire).await?;
            ok_or(g.release().await, "the holder's release")?;
        }
        let [mut acquire] = acquire;
        let outcome = tokio::time::timeout(cut, &mut acquire).await;
        drop(acquire);
        let cancelled = Instant::now();
        if let Ok(r) = outcome
            && let Some(held) = ok_or(r, "an uncancelled acquire")?
        {
            ok_or(held.release().await, "release")?;
        }
        // Another client takes everything once it is free: polling every millisecond until
        // the TTL and the slack are up.
        // The evidence of a leak is an attempt sent after that and refused: one sent before
        // it and slow to come back (a loaded machine, a set taken member by member) is not.
        let give_up = cancelled + ttl + slack;
        loop {
            let sent = Instant::now();
            if let Some(held) = ok_or(take.try_take(&b, &names, &free).await, "the racing client")?
            {
                ok_or(held.release().await, "release")?;
                break;
            }
            if sent >= give_up {
                return Err(format!(
                    "after {how} (typical take {typical:?}), a client polling every millisecond \
                     was refused by an attempt sent {:?} later (TTL {ttl:?}, allowed {:?})",
                    sent - cancelled,
                    ttl + slack
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    Ok(())
}

pub(super) async fn cancelled_acquire_leaves_nothing(ctx: &Ctx) -> Outcome {
    cancelled_take_leaves_nothing(ctx, Take::Exclusive).await
}

pub(super) async fn cancelled_shared_acquire_leaves_nothing(ctx: &Ctx) -> Outcome {
    cancelled_take_leaves_nothing(ctx, Take::Shared).await
}

pub(super) async fn cancelled_permit_acquire_leaves_nothing(ctx: &Ctx) -> Outcome {
    cancelled_take_leaves_nothing(ctx, Take::Permit).await
}

pub(super) async fn cancelled_lock_all_leaves_nothing(ctx: &Ctx) -> Outcome {
    cancelled_take_leaves_nothing(ctx, Take::Set).await
}

/// A set written without its expiry, and given its TTL a round trip later, stays held for good
/// when cancelled in between.
pub(super) async fn cancelled_set_take_leaves_nothing(ctx: &Ctx) -> Outcome {
    cancelled_take_leaves_nothing(ctx, Take::TrySet).await
}
