//! Expiry and validity: a lease ends at its TTL and not before; a holder whose lease ran out can neither extend nor release the next holder's lock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::backend::{AcquireRequest, BoxLease};
use lockcore::{ErrorKind, Instant, LockGuard, LockName, Locker, OwnerToken};

use super::context::{Ctx, Failure, Outcome};
use super::support::{
    check, drop_lost_guard_then_release_new, must_be_held, must_try, ok_or, race_for,
    race_observing,
};

pub(super) async fn expiry_frees_crashed_holder_after_ttl(ctx: &Ctx) -> Outcome {
    let (a, [b]) = ctx.crashable_and_clients().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(1000));
    let opts = ctx.opts(ttl);
    let g = must_try(&a, &name, &opts, "holder").await?;
    let acquired = g.acquired_at();
    let valid_until = g.valid_until();
    ctx.harness.crash(g, a).await;
    must_be_held(&b, &name, &opts, "right after the crash").await?;
    tokio::time::sleep_until(acquired + ttl / 2).await;
    must_be_held(&b, &name, &opts, "half a TTL after acquiring").await?;
    // A client polling every millisecond from there on wins the moment the lease ends (a
    // waiting lock() may poll with a backoff that sleeps past an early end).
    let g2 = race_for(
        &b,
        &name,
        &opts,
        acquired + ttl / 2,
        acquired + ttl * 2 + ctx.bound(Duration::from_secs(3)),
    )
    .await
    .map_err(|e| format!("after the crash: {e}"))?;
    // The racing try_lock was granted before it returned: a grant before the first holder's
    // validity deadline is two holders at once, however small the margin. (Its send time is no
    // evidence: on a loaded machine a request can reach the server well after it was "sent".)
    let won_by = Instant::now();
    let at = won_by.saturating_duration_since(acquired);
    check!(
        won_by >= valid_until,
        "another client took the lock {:?} before the crashed holder's validity deadline (taken {at:?} after acquiring, TTL {ttl:?}): the lease ended early",
        valid_until - won_by
    );
    let late = ttl + ctx.bound(Duration::from_secs(3));
    check!(
        at <= late,
        "the lock was taken over only {at:?} after acquiring (TTL {ttl:?}, bound {late:?})"
    );
    ok_or(g2.release().await, "release")
}

pub(super) async fn crash_frees_lock(ctx: &Ctx) -> Outcome {
    if ctx.harness.can_kill_holder_process() {
        return killed_holder_process_frees_lock(ctx).await;
    }
    let (a, [b]) = ctx.crashable_and_clients().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(1000));
    let opts = ctx.opts(ttl);
    let g = must_try(&a, &name, &opts, "holder").await?;
    let acquired = g.acquired_at();
    ctx.harness.crash(g, a).await;
    freed_within_ttl(
        ctx,
        &b,
        &name,
        ttl,
        acquired,
        "the crashed holder's lock",
        "acquiring",
    )
    .await
}

/// Takes `name` with client `b` once a crashed holder's lock frees, and checks that it freed
/// within the TTL (plus slack) of `since`.
async fn freed_within_ttl(
    ctx: &Ctx,
    b: &Locker,
    name: &LockName,
    ttl: Duration,
    since: Instant,
    whose: &str,
    since_what: &str,
) -> Outcome {
    let opts = ctx.opts(ttl);
    let g2 = ok_or(
        b.lock(
            name,
            &opts
                .clone()
                .wait_timeout(ttl * 2 + ctx.bound(Duration::from_secs(5))),
        )
        .await,
        &format!("lock() after the crash ({whose})"),
    )?;
    let at = g2.acquired_at().saturating_duration_since(since);
    let late = ttl + ctx.bound(Duration::from_secs(3));
    check!(
        at <= late,
        "{whose} was free only {at:?} after {since_what} (TTL {ttl:?}, allowed {late:?})"
    );
    ok_or(g2.release().await, "release")
}

/// `crash_frees_lock` with a real crash: the holder is a process of its own, killed with
/// SIGKILL while it holds (and renews) the lock (its `acquired` report is the proof). The lock
/// must free within its TTL of the kill (the last renewal was before it), plus slack; at once
/// where the server ends the session with the connection (SQL row locks).
async fn killed_holder_process_frees_lock(ctx: &Ctx) -> Outcome {
    let b = ctx.client().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(1000));
    let killed = ok_or(
        ctx.harness.killed_holder_process(&name, ttl).await,
        "a holder process killed while holding",
    )?;
    freed_within_ttl(
        ctx,
        &b,
        &name,
        ttl,
        killed,
        "the lock of a holder process killed with SIGKILL",
        "the kill",
    )
    .await
}

/// Takes a lease straight from the backend, bypassing the guard's watchdog and bookkeeping, so
/// that the backend's own owner checks are what is tested.
async fn raw_lease(
    locker: &Locker,
    name: &LockName,
    ttl: Duration,
) -> Result<(BoxLease, Instant), Failure> {
    let req = AcquireRequest::new(name.clone(), OwnerToken::random(), ttl);
    match locker.backend().try_acquire(&req).await {
        Ok(Some(a)) => Ok((a.lease, a.sent_at)),
        Ok(None) => Err("raw try_acquire found the lock held, expected it free".into()),
        Err(e) => Err(format!("raw try_acquire failed: {e}")),
    }
}

/// Makes a raw lease stop being its holder's: by waiting out its TTL where leases expire, else
/// by revoking it. The caller then lets another client take the lock.
async fn lose_lease(ctx: &Ctx, name: &LockName) -> Outcome {
    if ctx.caps.expiry_after_ttl {
        return Ok(());
    }
    ok_or(ctx.harness.revoke(name).await, "revoke")
}

pub(super) async fn extend_after_expiry_not_held(ctx: &Ctx) -> Outcome {
    let [a, b, c] = ctx.clients().await?;
    let ttl = ctx.ttl(Duration::from_millis(400));
    let opts = ctx.opts(ttl);
    let takeover = opts
        .clone()
        .ttl(ttl * 20)
        .wait_timeout(ttl * 2 + ctx.bound(Duration::from_secs(5)));
    // The backend's own check: a lease that ran out cannot be extended.
    let name = ctx.name("raw");
    let (lease, _) = raw_lease(&a, &name, ttl).await?;
    lose_lease(ctx, &name).await?;
    let g2 = ok_or(b.lock(&name, &takeover).await, "takeover")?;
    must_refuse(
        "the backend's extend of a lease that ran out and was taken over",
        lease.extend(ttl * 10).await,
    )?;
    must_be_held(&c, &name, &opts, "after the stale extend").await?;
    ok_or(g2.extend(ttl * 20).await, "the new holder's extend")?;
    ok_or(g2.release().await, "release")?;
    // The guard's: once its validity passed, extend is refused.
    let name = ctx.name("guard");
    let g = must_try(&a, &name, &opts, "holder").await?;
    lose_lease(ctx, &name).await?;
    let g2 = ok_or(b.lock(&name, &takeover).await, "takeover")?;
    must_refuse(
        "the guard's extend of a lease that ran out and was taken over",
        g.extend(ttl * 10).await,
    )?;
    check!(!g.is_valid(), "the expired guard still says it is valid");
    must_be_held(&c, &name, &opts, "after the stale guard extend").await?;
    ok_or(g2.release().await, "release")?;
    drop(g);
    Ok(())
}

pub(super) async fn stale_release_keeps_new_holder(ctx: &Ctx) -> Outcome {
    let [a, b, c] = ctx.clients().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(400));
    let opts = ctx.opts(ttl);
    let (stale, _) = raw_lease(&a, &name, ttl).await?;
    lose_lease(ctx, &name).await?;
    let g2 = ok_or(
        b.lock(
            &name,
            &opts
                .clone()
                .ttl(ttl * 20)
                .wait_timeout(ttl * 2 + ctx.bound(Duration::from_secs(5))),
        )
        .await,
        "takeover",
    )?;
    must_refuse("a stale holder's release", stale.release().await)?;
    must_be_held(&c, &name, &opts, "after the stale release").await?;
    ok_or(g2.release().await, "the new holder's release")
}

pub(super) async fn release_racing_expiry_keeps_next_holder(ctx: &Ctx) -> Outcome {
    let [a, b, c] = ctx.clients().await?;
    let ttl = ctx.ttl(Duration::from_millis(300));
    let opts = ctx.opts(ttl);
    // Release at several points around the moment the lease runs out, most within a few
    // milliseconds of it (where a release made of two round trips reads its own value and then
    // deletes the next holder's), the last well after it; a racer is polling before each
    // release, so a next holder is there the moment the lease frees.
    for (i, before_ms) in [6i64, 3, 2, 1, 0, -30].into_iter().enumerate() {
        let name = ctx.name(&format!("r{i}"));
        let (lease, sent) = raw_lease(&a, &name, ttl).await?;
        // A competitor polling hard from before the release (a waiting lock() may poll with a
        // backoff that misses the window).
        let racer = {
            let (b, name, opts) = (b.clone(), name.clone(), opts.clone().ttl(ttl * 20));
            let give_up = sent + ttl * 3 + ctx.bound(Duration::from_secs(5));
            let from = sent + ttl.saturating_sub(Duration::from_millis(20));
            tokio::spawn(async move { race_for(&b, &name, &opts, from, give_up).await })
        };
        let at = if before_ms >= 0 {
            sent + ttl - Duration::from_millis(before_ms as u64)
        } else {
            sent + ttl + Duration::from_millis(before_ms.unsigned_abs())
        };
        tokio::time::sleep_until(at).await;
        let _ = lease.release().await;
        let g2 = ok_or(racer.await, "racing task")??;
        must_be_held(
            &c,
            &name,
            &opts,
            &format!("while the next holder holds it (release sent {before_ms} ms before expiry)"),
        )
        .await?;
        ok_or(g2.release().await, "next holder's release")?;
    }
    Ok(())
}

pub(super) async fn extend_honours_ttl(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(600));
    let opts = ctx.opts(ttl);
    let g = must_try(&a, &name, &opts, "holder").await?;
    // Longer: four TTLs from now.
    let longer = Instant::now();
    ok_or(g.extend(ttl * 4).await, "extend to 4 TTLs")?;
    tokio::time::sleep_until(longer + ttl * 2).await;
    must_be_held(&b, &name, &opts, "two TTLs after extending to four").await?;
    check!(
        g.is_valid(),
        "the guard lost its lease after a longer extend"
    );
    // Shorter: one TTL from now, where the lease had two more to run.
    let shorter = Instant::now();
    ok_or(g.extend(ttl).await, "extend back to 1 TTL")?;
    let valid_until = g.valid_until();
    // A client polling every millisecond from half the TTL on: the moment it wins is when the
    // lease really ended (a waiting lock() could add its own poll interval, and its lateness
    // would be blamed on the backend).
    let late = ttl + ttl / 2;
    let (g2, last_refused) = race_observing(
        &b,
        &name,
        &opts,
        shorter + ttl / 2,
        shorter + late + ctx.bound(Duration::from_secs(3)),
    )
    .await
    .map_err(|e| {
        format!(
            "{e}: every try_lock of a racing client from half the TTL on was refused, until {:?} after the holder extended the lease to {ttl:?}: the lease outlived the shorter TTL",
            shorter.elapsed()
        )
    })?;
    // Granted before the racing try_lock returned (its send time is no evidence of an early
    // grant: on a loaded machine a request can reach the server well after it was "sent").
    let won_by = Instant::now();
    let at = won_by.saturating_duration_since(shorter);
    check!(
        won_by >= valid_until,
        "another client's try_lock returned the lock {:?} before the holder's validity deadline ({at:?} after extending to {ttl:?}): the lease ended early",
        valid_until - won_by
    );
    // Held after `late`: a refused try_lock sent after it (the server still kept the lease).
    // A win after `late` without such a refusal only shows a slow racing client.
    if let Some(refused) = last_refused {
        let held_at = refused.saturating_duration_since(shorter);
        check!(
            held_at <= late,
            "a try_lock sent {held_at:?} after the holder extended the lease to {ttl:?} was refused (bound {late:?}; the lock was won {at:?} after the extend): the lease outlived the shorter TTL"
        );
    }
    check!(
        g.lost().is_lost(),
        "another client holds the lock but the holder's lost signal has not fired"
    );
    drop_lost_guard_then_release_new(ctx, &a, g, g2).await
}

pub(super) async fn no_resurrection(ctx: &Ctx) -> Outcome {
    let [a, b, c] = ctx.clients().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(400));
    let opts = ctx.opts(ttl);
    let takeover = opts
        .clone()
        .ttl(ttl * 20)
        .wait_timeout(ttl * 2 + ctx.bound(Duration::from_secs(5)));
    let (stale, _) = raw_lease(&a, &name, ttl).await?;
    lose_lease(ctx, &name).await?;
    // Absent, after another holder took it and released it.
    let g = ok_or(b.lock(&name, &takeover).await, "takeover")?;
    ok_or(g.release().await, "the other holder's release")?;
    must_refuse(
        "extend of an absent lease",
        stale.extend(ttl * 20).await.map(drop),
    )?;
    must_refuse("release of an absent lease", stale.release().await)?;
    let g = ok_or(
        c.try_lock(&name, &opts).await,
        "try_lock after the stale extend",
    )?
    .ok_or("the stale extend or release re-created the lock")?;
    ok_or(g.release().await, "release")?;
    // Taken over: the new holder's lease is untouched.
    let g2 = ok_or(b.lock(&name, &takeover).await, "second takeover")?;
    must_refuse(
        "extend of a taken-over lease",
        stale.extend(ttl).await.map(drop),
    )?;
    must_refuse("release of a taken-over lease", stale.release().await)?;
    must_be_held(&c, &name, &opts, "after the stale extend and release").await?;
    ok_or(g2.extend(ttl * 20).await, "the new holder's extend")?;
    ok_or(g2.release().await, "the new holder's release")?;
    must_refuse(
        "extend after the new holder released",
        stale.extend(ttl * 20).await.map(drop),
    )?;
    let g = ok_or(c.try_lock(&name, &opts).await, "try_lock at the end")?
        .ok_or("the stale extend re-created the lock")?;
    ok_or(g.release().await, "release")
}

pub(super) async fn mutual_exclusion_across_expiry(ctx: &Ctx) -> Outcome {
    // A holder's window ends at its validity deadline, or earlier when it is told it lost the
    // lock (a holder told so holds nothing: a row lock's server frees the lock as soon as the
    // holder gives its failed connection up). Another client starting before that end is a
    // second holder.
    fn held_until(g: &LockGuard) -> Instant {
        let until = g.valid_until();
        g.lost().lost_at().map_or(until, |l| l.min(until))
    }
    const CLIENTS: usize = 3;
    const ROUNDS: usize = 3;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(300));
    let opts = ctx
        .opts(ttl)
        .wait_timeout(ttl * 20 + ctx.bound(Duration::from_secs(30)));
    // When each holder could act on the lock's behalf: from when lock() returned until it
    // released, or, for one that overran its lease, until its validity deadline.
    let windows = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let c = ctx.client().await?;
        let (name, opts, windows) = (name.clone(), opts.clone(), windows.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let g = c
                    .lock(&name, &opts)
                    .await
                    .map_err(|e| format!("client {client} round {round}: lock(): {e}"))?;
                let start = Instant::now();
                if (client + round) % 2 == 0 {
                    // Overrun: the lease runs out under the holder; the next one takes over.
                    tokio::time::sleep_until(g.valid_until() + ttl / 2).await;
                    let end = held_until(&g);
                    if g.is_valid() {
                        return Err(format!(
                            "client {client}: the guard is valid past its deadline"
                        ));
                    }
                    windows.lock().unwrap().push((start, end, client));
                    drop(g);
                } else {
                    tokio::time::sleep(ttl / 5).await;
                    let end = Instant::now().min(held_until(&g));
                    windows.lock().unwrap().push((start, end, client));
                    g.release()
                        .await
                        .map_err(|e| format!("client {client}: release: {e}"))?;
                }
            }
            c.flush().await;
            Ok::<_, Failure>(())
        }));
    }
    for t in tasks {
        ok_or(t.await, "task")??;
    }
    let mut windows = windows.lock().unwrap().clone();
    windows.sort_by_key(|w| w.0);
    for pair in windows.windows(2) {
        let ((_, end, c1), (start, _, c2)) = (pair[0], pair[1]);
        check!(
            start >= end,
            "client {c2} held the lock {:?} before client {c1}'s lease ended",
            end - start
        );
    }
    check!(
        windows.len() == CLIENTS * ROUNDS,
        "{} holds, expected {}",
        windows.len(),
        CLIENTS * ROUNDS
    );
    Ok(())
}

/// `r` (of `what`, on a lease no longer held) is `NotHeld`: not another error, not a success.
fn must_refuse<T>(what: &str, r: lockcore::Result<T>) -> Outcome {
    match r {
        Err(e) if e.kind() == ErrorKind::NotHeld => Ok(()),
        Err(e) => Err(format!("{what}: expected NotHeld, got {e}")),
        Ok(_) => Err(format!("{what}: reported success")),
    }
}
