//! Primitives beyond the mutex: semaphore permits ([`LockMode::Permit`]) and read-write locks
//! ([`LockMode::Shared`] beside [`LockMode::Exclusive`]). Each checks what users of Redisson's
//! `RPermitExpirableSemaphore`, Curator's `InterProcessSemaphoreV2` and read-write locks, and
//! DistributedLock's semaphores rely on: never more holders than the limit, in any
//! interleaving; a crashed holder's permit back after its TTL, never sooner, never later; a
//! disagreement about the limit refused; readers together, never beside a writer; a waiting
//! writer not starved by later readers; fencing tokens increasing across modes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockcore::{ErrorKind, Instant, LockGuard, LockName, LockOptions, Locker};

use super::context::{Ctx, Outcome};
use super::support::{
    check, must_be_held, must_try, ok_or, race_for, settle_waiters, settle_waiting_calls,
};

const LIMIT: u32 = 3;

/// Permits: the limit holds at once and no more (try_lock), then in a free-running loop of 6
/// clients taking and releasing permits, never more than the limit at a time.
pub(super) async fn permits_never_exceed_the_limit(ctx: &Ctx) -> Outcome {
    let name = ctx.name("sem");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(30))).permits(LIMIT);
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(ctx.client().await?);
    }
    // The limit, exactly: LIMIT holders at once, the next refused, one more after a release.
    let mut held = Vec::new();
    let mut last_token = None;
    for (i, c) in clients.iter().take(LIMIT as usize).enumerate() {
        let g = must_try(c, &name, &opts, &format!("permit holder {}", i + 1)).await?;
        if let (Some(prev), Some(t)) = (last_token, g.fencing_token()) {
            check!(
                t > prev,
                "permit {} got fencing token {t} after {prev}: tokens must increase across permits",
                i + 1
            );
        }
        last_token = g.fencing_token().or(last_token);
        held.push(g);
    }
    let extra = &clients[LIMIT as usize];
    must_be_held(
        extra,
        &name,
        &opts,
        &format!("with {LIMIT} of {LIMIT} permits held"),
    )
    .await?;
    ok_or(held.remove(0).release().await, "releasing a permit")?;
    let g = must_try(extra, &name, &opts, "a client after one permit came back").await?;
    held.push(g);
    must_be_held(
        &clients[LIMIT as usize + 1],
        &name,
        &opts,
        "with the permits full again",
    )
    .await?;
    for g in held {
        ok_or(g.release().await, "releasing a permit")?;
    }

    // Free running: every client loops lock / hold a moment / release; the count of holders
    // is taken inside the guards' lifetimes, so more than LIMIT at once is two too many.
    let active = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let rounds = 8;
    let mut tasks = Vec::new();
    for c in clients {
        let (name, opts, active, most) = (name.clone(), opts.clone(), active.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let g = c.lock(&name, &opts).await?;
                let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                // Work of varying length, so that the holders' overlaps vary.
                for _ in 0..fastrand::usize(0..8) {
                    tokio::task::yield_now().await;
                }
                active.fetch_sub(1, Ordering::SeqCst);
                g.release().await?;
            }
            Ok::<_, lockcore::Error>(())
        }));
    }
    for t in tasks {
        ok_or(
            ok_or(t.await, "a permit loop")?,
            "a permit loop's lock or release",
        )?;
    }
    let most = most.load(Ordering::SeqCst);
    check!(
        most <= LIMIT as usize,
        "{most} clients held one of {LIMIT} permits at once"
    );
    Ok(())
}

/// Permits: a client asking with another limit than the holders' is refused with
/// `ErrorKind::Conflict` (from try_lock and from a waiting lock, which must not wait); once
/// nobody holds the name, a new limit is accepted.
pub(super) async fn permit_limit_disagreement_is_refused(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
    let name = ctx.name("sem");
    let ttl = ctx.ttl(Duration::from_secs(30));
    let three = ctx.opts(ttl).permits(3);
    let five = ctx
        .opts(ttl)
        .permits(5)
        .wait_timeout(ctx.bound(Duration::from_secs(2)));
    let g = must_try(&a, &name, &three, "a holder of one of 3 permits").await?;
    match b.try_lock(&name, &five).await {
        Err(e) if e.kind() == ErrorKind::Conflict => {}
        Ok(Some(_)) => {
            return Err(
                "a client asking for one of 5 permits got one beside a holder of one of 3: the clients' limits were silently split".into(),
            );
        }
        Ok(None) => {
            return Err(
                "try_lock with limit 5 beside a holder with limit 3 found the name merely busy: a disagreement about the limit must be refused (ErrorKind::Conflict)".into(),
            );
        }
        Err(e) => {
            return Err(format!(
                "try_lock with another limit: expected a conflict, got {e}"
            ));
        }
    }
    let started = Instant::now();
    match b.lock(&name, &five).await {
        Err(e) if e.kind() == ErrorKind::Conflict => {}
        Ok(_) => {
            return Err("lock() with limit 5 got a permit beside a holder with limit 3".into());
        }
        Err(e) => {
            return Err(format!(
                "lock() with another limit: expected a conflict at once, got {e} after {:?}",
                started.elapsed()
            ));
        }
    }
    ok_or(g.release().await, "releasing the permit")?;
    // Free again: the limit is the holders' to set.
    let g = must_try(
        &b,
        &name,
        &five,
        "one of 5 permits once nobody holds the name",
    )
    .await?;
    ok_or(g.release().await, "release")
}

/// Permits: a holder that crashes keeps its permit until its lease's TTL runs out, never
/// sooner (a second holder too many) and never later (Redisson's plain semaphore leaks it
/// forever).
pub(super) async fn crashed_permit_returns_after_its_ttl(ctx: &Ctx) -> Outcome {
    let (a, [b, c]) = ctx.crashable_and_clients().await?;
    let name = ctx.name("sem");
    let ttl = ctx.ttl(Duration::from_millis(1000));
    let opts = ctx.opts(ttl).permits(2);
    let crashed = must_try(&a, &name, &opts, "the permit holder that will crash").await?;
    let acquired = crashed.acquired_at();
    let valid_until = crashed.valid_until();
    // The other permit is held for the whole scenario: only the crashed one can come back.
    let long = ctx.opts(ctx.ttl(Duration::from_secs(30))).permits(2);
    let other = must_try(&b, &name, &long, "the second permit holder").await?;
    ctx.harness.crash(crashed, a).await;
    must_be_held(
        &c,
        &name,
        &opts,
        "right after the crash, both permits taken",
    )
    .await?;
    tokio::time::sleep_until(acquired + ttl / 2).await;
    must_be_held(
        &c,
        &name,
        &opts,
        "half a TTL after the crashed holder's grant",
    )
    .await?;
    let late = ttl + ctx.bound(Duration::from_secs(3));
    let g = race_for(&c, &name, &opts, acquired + ttl / 2, acquired + late)
        .await
        .map_err(|e| format!("the crashed holder's permit never came back: {e}"))?;
    let won_by = Instant::now();
    let at = won_by.saturating_duration_since(acquired);
    check!(
        won_by >= valid_until,
        "the crashed holder's permit was handed out {:?} before its validity deadline (taken {at:?} after its grant, TTL {ttl:?}): a permit too many",
        valid_until - won_by
    );
    ok_or(g.release().await, "release")?;
    ok_or(other.release().await, "release")
}

/// Read-write: readers hold together; a writer is refused beside them and holds alone; a
/// reader is refused beside the writer.
pub(super) async fn readers_share_and_writers_exclude(ctx: &Ctx) -> Outcome {
    let [r1, r2, w] = ctx.clients().await?;
    let name = ctx.name("rw");
    let ttl = ctx.ttl(Duration::from_secs(30));
    let (read, write) = (ctx.fenced_opts(ttl).shared(), ctx.fenced_opts(ttl));
    let g1 = must_try(&r1, &name, &read, "the first reader").await?;
    let g2 = must_try(&r2, &name, &read, "a second reader beside the first").await?;
    must_be_held(&w, &name, &write, "a writer with two readers holding").await?;
    ok_or(g1.release().await, "a reader's release")?;
    must_be_held(&w, &name, &write, "a writer with one reader still holding").await?;
    ok_or(g2.release().await, "a reader's release")?;
    let gw = must_try(&w, &name, &write, "the writer once the readers left").await?;
    must_be_held(&r1, &name, &read, "a reader while the writer holds").await?;
    must_be_held(&r2, &name, &write, "a second writer while the writer holds").await?;
    ok_or(gw.release().await, "the writer's release")?;
    let g = must_try(&r1, &name, &read, "a reader after the writer left").await?;
    ok_or(g.release().await, "release")
}

/// Read-write: a writer waiting behind a reader is not starved: a reader that comes after the
/// writer waits too, the writer gets the lock when the first reader leaves, and the later
/// reader after the writer.
pub(super) async fn waiting_writer_is_not_starved(ctx: &Ctx) -> Outcome {
    let [r1, r2, w] = ctx.clients().await?;
    let name = ctx.name("rw");
    let ttl = ctx.ttl(Duration::from_secs(30));
    let (read, write) = (ctx.opts(ttl).shared(), ctx.opts(ttl));
    let g1 = must_try(&r1, &name, &read, "the first reader").await?;
    let (writer, mut writes) = spawn_lock(&w, &name, &write);
    settle_waiters(ctx, &r1, &name, &[&w]).await?;
    // A reader arriving now must not join the first: that is how a stream of readers starves
    // a writer.
    must_be_held(
        &r2,
        &name,
        &read,
        "a reader arriving behind a waiting writer",
    )
    .await?;
    let (reader, mut reads) = spawn_lock(&r2, &name, &read);
    settle_waiters(ctx, &r1, &name, &[&w, &r2]).await?;
    ok_or(g1.release().await, "the first reader's release")?;
    let bound = ctx.bound(Duration::from_secs(10));
    let first = tokio::time::timeout(bound, async {
        tokio::select! {
            g = writes.recv() => Ok(g),
            _ = reads.recv() => Err(()),
        }
    })
    .await
    .map_err(|_| {
        format!("the waiting writer did not get the lock within {bound:?} of the reader's release")
    })?;
    let gw = first
        .map_err(|()| "the reader that came after the waiting writer got the lock first: readers starve writers")?
        .ok_or("the writer's lock() ended without the lock")?;
    must_be_held(&r1, &name, &read, "a reader while the writer holds").await?;
    ok_or(gw.release().await, "the writer's release")?;
    let gr = tokio::time::timeout(bound, reads.recv())
        .await
        .map_err(|_| {
            format!(
                "the waiting reader did not get the lock within {bound:?} of the writer's release"
            )
        })?
        .ok_or("the reader's lock() ended without the lock")?;
    ok_or(gr.release().await, "the reader's release")?;
    ok_or(ok_or(writer.await, "writer task")?, "the writer's lock()")?;
    ok_or(ok_or(reader.await, "reader task")?, "the reader's lock()")
}

/// Readers waiting behind a writer in each of the clients of [`every_reader_woken_by_one_release`].
const READERS_PER_CLIENT: usize = 3;

/// Read-write: one writer's release lets every reader waiting behind it in, at once, in every
/// client: 3 readers in each of 2 clients whose safety-net poll is long (10 s where the backend
/// has one), so that a reader its release did not wake shows as seconds late.
pub(super) async fn every_reader_woken_by_one_release(ctx: &Ctx) -> Outcome {
    let long_poll = || async {
        ok_or(
            ctx.harness.client_with_long_poll().await,
            "connecting a client with a long safety-net poll",
        )
    };
    let (w, r1, r2) = (ctx.client().await?, long_poll().await?, long_poll().await?);
    let name = ctx.name("rw");
    let ttl = ctx.ttl(Duration::from_secs(30));
    let (read, write) = (ctx.opts(ttl).shared(), ctx.opts(ttl));
    let gw = must_try(&w, &name, &write, "the writer").await?;
    let (granted, mut grants) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for (client, reader) in [&r1, &r2]
        .into_iter()
        .flat_map(|c| (0..READERS_PER_CLIENT).map(move |i| (c, i)))
    {
        let (client, name, read, granted) =
            (client.clone(), name.clone(), read.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            let g = client.lock(&name, &read).await?;
            let _ = granted.send((reader, Instant::now(), g));
            Ok::<_, lockcore::Error>(())
        }));
    }
    let readers = 2 * READERS_PER_CLIENT;
    // Every reader waiting where the backend shows it (its queue, or its calls marked
    // waiting). A backend that queues a client's own waiters for a name inside the client (the
    // PostgreSQL row lock) shows one per client: then those two wait on the server, the others
    // behind them in their clients, and all must be let in as promptly.
    let clients = [&r1, &r2];
    let some = ctx.bound(Duration::from_secs(2));
    if settle_waiting_calls(&w, &name, &clients, readers, some)
        .await
        .is_err()
    {
        let rest = ctx.bound(Duration::from_secs(10));
        settle_waiting_calls(&w, &name, &clients, clients.len(), rest).await?;
    }
    let released = Instant::now();
    ok_or(gw.release().await, "the writer's release")?;
    // Every grant is awaited (for the report, up to 20 s: a reader left to its poll comes
    // 5 to 10 s late), then the latest is held to the bound.
    let give_up = released + ctx.bound(Duration::from_secs(20));
    let mut late = Vec::new();
    let mut guards = Vec::new();
    while guards.len() < readers {
        match tokio::time::timeout_at(give_up, grants.recv()).await {
            Ok(Some((_, at, g))) => {
                late.push(at.saturating_duration_since(released));
                guards.push(g);
            }
            Ok(None) => break,
            Err(_) => break,
        }
    }
    late.sort();
    let bound = ctx.bound(Duration::from_secs(1));
    check!(
        guards.len() == readers && late.last().is_some_and(|l| *l <= bound),
        "{} of {readers} waiting readers (in 2 clients) held the lock after one writer's release; \
         grants came {late:?} after it (bound {bound:?}): a release left readers to their poll",
        guards.len()
    );
    for g in guards {
        ok_or(g.release().await, "a reader's release")?;
    }
    for t in tasks {
        ok_or(ok_or(t.await, "reader task")?, "a reader's lock()")?;
    }
    ctx.observe(format!(
        "{readers} readers in 2 clients held {:?} after the writer's release",
        late.last().copied().unwrap_or_default()
    ));
    Ok(())
}

/// Read-write with fencing: tokens increase across modes (reader, writer, reader), so that a
/// store can refuse a stale writer after a reader, and each reader gets its own token.
pub(super) async fn fencing_increases_across_modes(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
    let name = ctx.name("rw");
    let ttl = ctx.ttl(Duration::from_secs(30));
    let (read, write) = (ctx.opts(ttl).shared(), ctx.opts(ttl));
    let token = |g: &LockGuard, who: &str| {
        g.fencing_token()
            .ok_or_else(|| format!("{who} has no fencing token on a backend that declares them"))
    };
    let r1 = must_try(&a, &name, &read, "a reader").await?;
    let r2 = must_try(&b, &name, &read, "a second reader").await?;
    let (t1, t2) = (token(&r1, "a reader")?, token(&r2, "a second reader")?);
    check!(
        t2 > t1,
        "the second reader's token {t2} is not above the first's {t1}"
    );
    ok_or(r1.release().await, "release")?;
    ok_or(r2.release().await, "release")?;
    let w = must_try(&a, &name, &write, "a writer after the readers").await?;
    let tw = token(&w, "the writer")?;
    check!(
        tw > t2,
        "the writer's token {tw} is not above the readers' ({t1}, {t2})"
    );
    ok_or(w.release().await, "release")?;
    let r3 = must_try(&b, &name, &read, "a reader after the writer").await?;
    let t3 = token(&r3, "the reader after the writer")?;
    check!(
        t3 > tw,
        "the reader's token {t3} is not above the writer's {tw} before it"
    );
    ok_or(r3.release().await, "release")
}

/// Read-write: a writer that gives up waiting behind a reader (its wait timed out) holds later
/// readers back for a short while at most (a writer's mark lasts a few seconds past its last
/// attempt: 2 s on Redis, 3 s on the SQL leases; 6 s allowed), never for the readers' TTL.
pub(super) async fn writer_that_gave_up_frees_readers(ctx: &Ctx) -> Outcome {
    let [r1, r2, w] = ctx.clients().await?;
    let name = ctx.name("rw");
    let ttl = ctx.ttl(Duration::from_secs(30));
    let read = ctx.opts(ttl).shared();
    let g1 = must_try(&r1, &name, &read, "the first reader").await?;
    let write = ctx
        .opts(ttl)
        .wait_timeout(ctx.bound(Duration::from_millis(300)));
    match w.lock(&name, &write).await {
        Err(e) if e.kind() == ErrorKind::Timeout => {}
        Ok(_) => return Err("a writer got the lock beside a reader".into()),
        Err(e) => return Err(format!("the writer's lock(): expected Timeout, got {e}")),
    }
    w.flush().await;
    let gave_up = Instant::now();
    let bound = ctx.bound(Duration::from_secs(6));
    let g2 = race_for(&r2, &name, &read, gave_up, gave_up + bound)
        .await
        .map_err(|e| {
            format!("a reader after the writer gave up (TTL {ttl:?}, bound {bound:?}): {e}")
        })?;
    ok_or(g2.release().await, "release")?;
    ok_or(g1.release().await, "release")
}

/// `client.lock(name, opts)` in a task of its own: the task, and where its guard arrives.
fn spawn_lock(
    client: &Locker,
    name: &LockName,
    opts: &LockOptions,
) -> (
    tokio::task::JoinHandle<lockcore::Result<()>>,
    tokio::sync::mpsc::UnboundedReceiver<LockGuard>,
) {
    let (granted, grants) = tokio::sync::mpsc::unbounded_channel();
    let (client, name, opts) = (client.clone(), name.clone(), opts.clone());
    let task = tokio::spawn(async move {
        let g = client.lock(&name, &opts).await?;
        let _ = granted.send(g);
        Ok(())
    });
    (task, grants)
}
