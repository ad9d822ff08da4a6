//! Herds: a backend that declares a server-side queue (`fair`) hands a lock over with a bounded
//! number of requests however many clients wait, instead of waking every waiter to try again.
//! Every other backend whose requests can be counted runs the same hand-overs and reports its
//! requests per hand-over beside its status, so that a herd shows as a figure in the report.

use std::time::Duration;

use lockcore::{Instant, LockGuard, Locker};

use super::context::{Ctx, Failure, Outcome};
use super::support::{settle_queued, settle_waiters};
use crate::harness::RequestCount;

/// Clients waiting while the hand-overs are measured.
const WAITERS: usize = 16;
/// Hand-overs measured, while 16 down to 11 clients wait. Without a queue the waiters left
/// after these are cancelled: a polling waiter's backoff may be long, and the remaining
/// hand-overs would measure nothing more.
const MEASURED: usize = 6;
/// Requests of all clients together per hand-over: the release, the next waiter's wake-up and
/// grant, and room for round trips more (a queue read, a watch set on the new predecessor; a
/// proxy counts gRPC's HTTP/2 frames as several: etcd measures 3.5 to 6.3 here under load). A
/// herd costs at least one request per waiting client, 11 and more here, plus the release and
/// the grant.
const REQUESTS_PER_HAND_OVER: u64 = 10;

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> Result<T, Failure> {
    r.map_err(|e| format!("{what}: {e}"))
}

async fn counted_client(ctx: &Ctx) -> Result<(Locker, RequestCount), Failure> {
    ok(
        ctx.harness.client_counting_requests().await,
        "connecting a client whose requests are counted",
    )
}

/// Requests per second of all clients together while nothing changes hands: a window of a
/// second (scaled) after every waiter is queued. The window is a measurement, not a wait for an
/// event.
async fn background_rate(ctx: &Ctx, counts: &[RequestCount]) -> f64 {
    let total = || counts.iter().map(RequestCount::get).sum::<u64>();
    let window = ctx.bound(Duration::from_secs(1));
    let (from, started) = (total(), Instant::now());
    tokio::time::sleep(window).await;
    (total() - from) as f64 / started.elapsed().as_secs_f64()
}

/// The clients' requests together, read once no new request has come for 50 ms (or after
/// 400 ms, on a backend whose clients never fall silent).
async fn quiescent_total(ctx: &Ctx, counts: &[RequestCount]) -> u64 {
    let total = || counts.iter().map(RequestCount::get).sum::<u64>();
    // Short: a client's keepalives (ZooKeeper pings every third of the session timeout, from
    // 17 clients) keep the count moving, and must not be counted as hand-over work.
    let quiet = ctx.bound(Duration::from_millis(50));
    let give_up = Instant::now() + ctx.bound(Duration::from_millis(400));
    let (mut last, mut since) = (total(), Instant::now());
    while since.elapsed() < quiet && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = total();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}

pub(super) async fn hand_over_without_herd(ctx: &Ctx) -> Outcome {
    let name = ctx.name("x");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(30))).wait_forever();
    let (holder, holder_count) = counted_client(ctx).await?;
    let mut counts = vec![holder_count];
    let g = ok(holder.try_lock(&name, &opts).await, "the holder's try_lock")?
        .ok_or("the holder's try_lock found the fresh lock held")?;
    // Each waiter takes the lock once and hands its guard to the scenario, which releases it:
    // the hand-overs happen one at a time, while the others keep waiting.
    let (granted, mut grants) = tokio::sync::mpsc::unbounded_channel::<(usize, LockGuard)>();
    let mut tasks = Vec::new();
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let (c, count) = counted_client(ctx).await?;
        counts.push(count);
        waiters.push(c.clone());
        let (name, opts, granted) = (name.clone(), opts.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            let g = c.lock(&name, &opts).await?;
            let _ = granted.send((i, g));
            Ok::<_, lockcore::Error>(c)
        }));
    }
    let queued = ctx.caps.fair;
    if queued {
        settle_queued(ctx, &holder, &name, WAITERS).await?;
    } else {
        let waiters: Vec<&Locker> = waiters.iter().collect();
        settle_waiters(ctx, &holder, &name, &waiters).await?;
    }
    let total = |counts: &[RequestCount]| counts.iter().map(RequestCount::get).sum::<u64>();
    // What the clients send with nobody handing over (safety polls of the queued waiters,
    // keepalives): counted over a window, and deducted at that rate from the hand-overs' count,
    // so that a busy machine (slower hand-overs, so more polls between them) is not read as a
    // herd. A herd is work caused by a release: one request per waiting client, or more.
    let background = background_rate(ctx, &counts).await;
    let before = total(&counts);
    let started = Instant::now();
    ok(g.release().await, "the holder's release")?;
    let bound = ctx.bound(Duration::from_secs(10));
    let mut order = Vec::new();
    let mut last = None;
    let hand_overs = if queued { WAITERS } else { MEASURED };
    for n in 0..hand_overs {
        let (i, g) = ok(
            tokio::time::timeout(bound, grants.recv()).await,
            &format!(
                "hand-over {} of {WAITERS} did not come within {bound:?}",
                n + 1
            ),
        )?
        .ok_or("a waiter ended without the lock")?;
        order.push(i);
        if n < MEASURED {
            // Each measured hand-over alone: the next release waits until the count has been
            // still for a while, so that waiters woken for nothing by this one (which may run
            // late on a busy machine) are counted, and not merged into the next wake-up.
            let requests = quiescent_total(ctx, &counts).await - before;
            if n + 1 == MEASURED {
                last = Some((requests, started.elapsed()));
            }
        }
        ok(g.release().await, "a waiter's release")?;
    }
    if !queued {
        // The waiters not served: cancelled (their clean-up runs in their clients' background).
        for t in &tasks {
            t.abort();
        }
    }
    for t in tasks {
        match t.await {
            Ok(served) => ok(served, "a waiter's lock()")?.flush().await,
            Err(e) if e.is_cancelled() && !queued => {}
            Err(e) => return Err(format!("waiter task: {e}")),
        }
    }
    for w in &waiters {
        w.flush().await;
    }
    let (counted, took) = last.expect("MEASURED <= WAITERS");
    let idle = (background * took.as_secs_f64()).floor() as u64;
    let requests = counted.saturating_sub(idle);
    let per_hand_over = requests as f64 / MEASURED as f64;
    ctx.observe(format!(
        "{per_hand_over:.1} requests of all clients per hand-over with {WAITERS} down to {} \
         clients waiting ({} queue declared; {counted} counted in {took:?}, less {idle} sent \
         at the idle rate of {background:.1}/s)",
        WAITERS - MEASURED + 1,
        if queued { "a" } else { "no" }
    ));
    if queued && requests > REQUESTS_PER_HAND_OVER * MEASURED as u64 {
        return Err(format!(
            "a queue is declared (fair), but the first {MEASURED} hand-overs with {WAITERS} clients waiting cost {requests} requests of all clients ({per_hand_over:.1} per hand-over, bound {REQUESTS_PER_HAND_OVER}; {counted} counted in {took:?}, less {idle} at the idle rate of {background:.1}/s): waiters woken for nothing (a herd); grant order {order:?}"
        ));
    }
    Ok(())
}
