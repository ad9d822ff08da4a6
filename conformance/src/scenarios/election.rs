//! Leader election ([`Locker::campaign`](lockcore::Locker::campaign)): one leader at a time,
//! terms increasing, every client seeing the leader's value and term, and a deposed leader's
//! lost signal before a new leader is elected (Curator's `LeaderLatch` and etcd's `Election`
//! have both had two leaders after a session loss).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use lockcore::{CampaignOptions, Instant};

use super::context::{Ctx, Failure, Outcome};
use super::support::{check, ok_or};

/// Three candidates campaign in turns for 4 rounds each: never two leaders at once, each term
/// above the last, and an observer reading the leader sees the elected one's value and term;
/// a watch sees the leadership change hands.
pub(super) async fn one_leader_at_a_time(ctx: &Ctx) -> Outcome {
    let name = ctx.name("leader");
    let opts = CampaignOptions::new()
        .ttl(ctx.ttl(Duration::from_secs(30)))
        .no_auto_renew()
        .wait_timeout(ctx.bound(Duration::from_secs(20)));
    let observer = ctx.client().await?;
    let leaders = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // The candidates campaign together from their first round: started one by one, a fast
    // backend's first candidate could finish its rounds before the next one starts, and a
    // second leader at once would never be tried for.
    let start = Arc::new(tokio::sync::Barrier::new(3));
    for i in 0..3 {
        let c = ctx.client().await?;
        let start = start.clone();
        let (name, opts, observer, leaders, terms, fencing) = (
            name.clone(),
            opts.clone(),
            observer.clone(),
            leaders.clone(),
            terms.clone(),
            ctx.caps.fencing,
        );
        tasks.push(tokio::spawn(async move {
            let value = format!("candidate-{i}");
            start.wait().await;
            for _ in 0..4 {
                let l = c
                    .campaign(&name, &value, &opts)
                    .await
                    .map_err(|e| format!("{value}'s campaign: {e}"))?;
                let now = leaders.fetch_add(1, Ordering::SeqCst) + 1;
                if now > 1 {
                    return Err(format!("{now} leaders at once"));
                }
                terms.lock().unwrap().push(l.term());
                let seen = observer
                    .leader(&name)
                    .await
                    .map_err(|e| format!("reading the leader: {e}"))?
                    .ok_or("an observer saw no leader while one was elected")?;
                if seen.value.as_deref() != Some(value.as_str())
                    || (fencing && seen.term != l.term())
                {
                    return Err(format!(
                        "the observer saw {:?} (term {:?}) while {value} (term {:?}) led",
                        seen.value,
                        seen.term,
                        l.term()
                    ));
                }
                tokio::task::yield_now().await;
                leaders.fetch_sub(1, Ordering::SeqCst);
                l.resign()
                    .await
                    .map_err(|e| format!("{value}'s resignation: {e}"))?;
            }
            Ok::<_, String>(())
        }));
    }
    for t in tasks {
        ok_or(t.await, "a candidate")??;
    }
    if ctx.caps.fencing {
        let terms = terms.lock().unwrap().clone();
        check!(
            terms.windows(2).all(|w| w[0] < w[1]),
            "terms did not increase from one leader to the next: {terms:?}"
        );
    }
    // A watch sees the leadership change hands, through its `Stream` (issue 37: the stream
    // observes changes on every backend, not only the in-memory one).
    let watch = ok_or(
        observer.watch_leader(&name, Duration::from_millis(20)),
        "watch_leader",
    )?;
    let mut changes = std::pin::pin!(watch.into_stream());
    let [a, b] = ctx.clients().await?;
    let bound = ctx.bound(Duration::from_secs(5));
    // The first item is the state when the stream starts: no leader yet.
    let first = ok_or(
        tokio::time::timeout(bound, changes.next()).await,
        "the watch's first item",
    )?;
    check!(
        matches!(first, Some(Ok(None))),
        "the watch's first item was {first:?}, not \"no leader\""
    );
    let la = ok_or(a.campaign(&name, "first", &opts).await, "a campaign")?;
    let seen = next_leader(&mut changes, bound).await?;
    check!(
        seen.as_ref().and_then(|l| l.value.as_deref()) == Some("first"),
        "the watch showed {seen:?}, not the elected \"first\""
    );
    ok_or(la.resign().await, "resign")?;
    let lb = ok_or(b.campaign(&name, "second", &opts).await, "a campaign")?;
    let give_up = Instant::now() + bound;
    loop {
        let left = give_up.saturating_duration_since(Instant::now());
        let seen = next_leader(&mut changes, left).await?;
        if seen.as_ref().and_then(|l| l.value.as_deref()) == Some("second") {
            break;
        }
    }
    ok_or(lb.resign().await, "resign")
}

/// The next item of a leader watch's stream within `within`: a failure when none comes, the
/// stream ends, or its item is an error.
async fn next_leader(
    changes: &mut (impl futures::Stream<Item = lockcore::Result<Option<lockcore::Leader>>> + Unpin),
    within: Duration,
) -> Result<Option<lockcore::Leader>, Failure> {
    let item = ok_or(
        tokio::time::timeout(within, changes.next()).await,
        "the watch never showed the change",
    )?;
    let item = item.ok_or("the watch's stream ended")?;
    ok_or(item, "reading the leader")
}

/// A leader whose renewals stop (a paused process) is deposed when its lease runs out: its
/// lost signal fires before the next candidate is elected, never after (two leaders).
pub(super) async fn old_leader_lost_before_new_leader(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
    let name = ctx.name("leader");
    let ttl = ctx.ttl(Duration::from_millis(1000));
    let old = ok_or(
        a.campaign(&name, "old", &campaign_opts(ctx, ttl)).await,
        "the first campaign",
    )?;
    let lost = old.lost();
    let opts = campaign_opts(ctx, ctx.ttl(Duration::from_secs(30)))
        .wait_timeout(ttl * 3 + ctx.bound(Duration::from_secs(5)));
    let new = ok_or(b.campaign(&name, "new", &opts).await, "the second campaign")?;
    let elected = Instant::now();
    match lost.lost_at() {
        Some(at) => {
            check!(
                at <= elected,
                "the old leader learned of its loss {:?} after the new leader was elected",
                at - elected
            );
        }
        None => {
            return Err("a new leader was elected while the old leader's lost signal had not fired: two leaders".into());
        }
    }
    drop(old);
    ok_or(new.resign().await, "resign")
}

/// A campaign as [`Ctx::opts`] takes a lock: `ttl`, the suite's wait bound, no renewal.
fn campaign_opts(ctx: &Ctx, ttl: Duration) -> CampaignOptions {
    CampaignOptions::new()
        .ttl(ttl)
        .wait_timeout(ctx.bound(Duration::from_secs(30)))
        .no_auto_renew()
}
