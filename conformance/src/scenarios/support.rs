//! Shared pieces of scenario bodies: the `check!` assertion, error wrapping, try_lock
//! expectations, waiting for queued waiters, racing for a lock the moment it frees.

use std::time::Duration;

use lockcore::{ErrorKind, Instant, LockGuard, LockName, LockOptions, Locker};

use super::context::{Ctx, Failure, Outcome};

macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        let holds: bool = $cond;
        if !holds {
            return Err(format!($($fmt)+));
        }
    };
}

pub(super) fn ok_or<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> Result<T, Failure> {
    r.map_err(|e| format!("{what}: {e}"))
}

pub(super) async fn must_try(
    locker: &Locker,
    name: &LockName,
    opts: &LockOptions,
    who: &str,
) -> Result<LockGuard, Failure> {
    match locker.try_lock(name, opts).await {
        Ok(Some(g)) => Ok(g),
        Ok(None) => Err(format!(
            "{who}: try_lock found the lock held, expected it free{}",
            held_by(locker, name).await
        )),
        Err(e) => Err(format!("{who}: try_lock failed: {e}")),
    }
}

/// What the backend says of a lock found held when it should be free (where it can inspect):
/// the TTL left tells a lock just taken from one left behind.
async fn held_by(locker: &Locker, name: &LockName) -> String {
    match locker.backend().inspect(name).await {
        Ok(info) => format!(
            " (held: {}, fencing token {:?}, TTL left {:?}, waiters {:?})",
            info.held, info.fencing_token, info.ttl_left, info.waiters
        ),
        Err(_) => String::new(),
    }
}

pub(super) async fn must_be_held(
    locker: &Locker,
    name: &LockName,
    opts: &LockOptions,
    when: &str,
) -> Outcome {
    match locker.try_lock(name, opts).await {
        Ok(None) => Ok(()),
        Ok(Some(_g)) => Err(format!(
            "{when}: another client took the lock while it should be held"
        )),
        Err(e) => Err(format!("{when}: try_lock failed: {e}")),
    }
}

/// Waits until the backend reports at least `n` waiters queued on `name` in its server-side
/// queue. A backend that does not report its queue fails: the caller needs that queue.
pub(super) async fn settle_queued(
    ctx: &Ctx,
    observer: &Locker,
    name: &LockName,
    n: usize,
) -> Outcome {
    let give_up = Instant::now() + ctx.bound(Duration::from_secs(10));
    loop {
        match observer.backend().queued_waiters(name).await {
            Ok(queued) if queued >= n => return Ok(()),
            Ok(_) => {}
            Err(e) => {
                return Err(format!(
                    "Backend::queued_waiters (needed to see waiters enqueued without sleeping): {e}"
                ));
            }
        }
        if Instant::now() >= give_up {
            return Err(format!("{n} waiters never showed as queued"));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits until every client of `waiters` waits on `name` (one `lock` call each): seen in the
/// backend's queue where it reports one ([`Backend::queued_waiters`], asked through
/// `observer`), else in the waiters' own count of the calls their backend marked as waiting
/// ([`Locker::waiting`]: an attempt found the lock held, and a release would now reach them).
/// Never a sleep: a backend that shows neither fails.
///
/// [`Backend::queued_waiters`]: lockcore::backend::Backend::queued_waiters
pub(super) async fn settle_waiters(
    ctx: &Ctx,
    observer: &Locker,
    name: &LockName,
    waiters: &[&Locker],
) -> Outcome {
    let give_up = ctx.bound(Duration::from_secs(10));
    settle_waiting_calls(observer, name, waiters, waiters.len(), give_up).await
}

/// [`settle_waiters`] while `pending` (the waiters' own calls, not spawned) are polled: one that
/// finishes first, while the lock should still be held, fails (the `i`th of `pending` named
/// "waiter i").
pub(super) async fn settle_pending<F, T>(
    ctx: &Ctx,
    observer: &Locker,
    name: &LockName,
    waiters: &[&Locker],
    pending: &mut [std::pin::Pin<Box<F>>],
) -> Outcome
where
    F: std::future::Future<Output = lockcore::Result<T>>,
{
    tokio::select! {
        (r, i, _) = futures::future::select_all(pending.iter_mut()) => Err(format!(
            "waiter {i} finished while the lock was held ({})",
            match r {
                Ok(_) => "with the lock".to_string(),
                Err(e) => format!("failing: {e}"),
            }
        )),
        settled = settle_waiters(ctx, observer, name, waiters) => settled,
    }
}

/// [`settle_waiters`] for `n` `lock` calls in all among the clients of `waiters` (each client
/// listed once, however many of the calls are its own), failing after `give_up`.
pub(super) async fn settle_waiting_calls(
    observer: &Locker,
    name: &LockName,
    waiters: &[&Locker],
    n: usize,
    give_up: Duration,
) -> Outcome {
    let give_up = Instant::now() + give_up;
    loop {
        let seen = match observer.backend().queued_waiters(name).await {
            Ok(queued) => queued,
            Err(e) if e.kind() == ErrorKind::Unsupported => {
                let mut marked = 0;
                for w in waiters {
                    marked += w
                        .waiting(name)
                        .map_err(|e| format!("Locker::waiting: {e}"))?;
                }
                marked
            }
            Err(e) => {
                return Err(format!(
                    "Backend::queued_waiters (needed to see waiters enqueued without sleeping): {e}"
                ));
            }
        };
        if seen >= n {
            return Ok(());
        }
        if Instant::now() >= give_up {
            return Err(format!(
                "{n} waiters never showed as waiting (in the backend's queue, or marked by the \
                 backend through AcquireRequest::waiting where it keeps no queue)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `waiter.lock(name, opts)` in a task of its own, once it is seen waiting (through
/// `observer`): the task, which returns the guard and when `lock()` returned.
pub(super) async fn spawn_waiter(
    ctx: &Ctx,
    observer: &Locker,
    waiter: &Locker,
    name: &LockName,
    opts: &LockOptions,
) -> Result<tokio::task::JoinHandle<(lockcore::Result<LockGuard>, Instant)>, Failure> {
    let task = {
        let (waiter, name, opts) = (waiter.clone(), name.clone(), opts.clone());
        tokio::spawn(async move {
            let r = waiter.lock(&name, &opts).await;
            (r, Instant::now())
        })
    };
    settle_waiters(ctx, observer, name, &[waiter]).await?;
    check!(
        !task.is_finished(),
        "the waiter returned while what it waits for was taken"
    );
    Ok(task)
}

/// A client racing to take `name` the moment it frees: `try_lock` every millisecond from
/// `from` on, until `give_up`.
pub(super) async fn race_for(
    client: &Locker,
    name: &LockName,
    opts: &LockOptions,
    from: Instant,
    give_up: Instant,
) -> Result<LockGuard, Failure> {
    Ok(race_observing(client, name, opts, from, give_up).await?.0)
}

/// As [`race_for`], also returning when the last refused try_lock was sent: the lock was
/// still held after that moment (the evidence against a lease that outlived its TTL, which a
/// slow racing client cannot fake, unlike a late win).
pub(super) async fn race_observing(
    client: &Locker,
    name: &LockName,
    opts: &LockOptions,
    from: Instant,
    give_up: Instant,
) -> Result<(LockGuard, Option<Instant>), Failure> {
    tokio::time::sleep_until(from).await;
    let mut last_refused = None;
    loop {
        let sent = Instant::now();
        if let Some(g) = ok_or(client.try_lock(name, opts).await, "the racing try_lock")? {
            return Ok((g, last_refused));
        }
        last_refused = Some(sent);
        if Instant::now() >= give_up {
            return Err("the racing client never got the lock".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Drops a guard whose lease was lost (its release runs in the background), waits for that
/// release, checks it did not free the new holder's lock, then releases the new holder.
pub(super) async fn drop_lost_guard_then_release_new(
    ctx: &Ctx,
    old_client: &Locker,
    lost: LockGuard,
    new: LockGuard,
) -> Outcome {
    let name = lost.name().clone();
    drop(lost);
    old_client.flush().await;
    let opts = ctx.opts(new.ttl());
    must_be_held(old_client, &name, &opts, "after the lost guard was dropped").await?;
    ok_or(new.release().await, "release")
}

pub(super) use check;
