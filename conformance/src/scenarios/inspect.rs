//! The operators' scenario: `inspect` reports the holder another client wrote, and
//! `force_release` frees the lock and fires the holder's lost signal.

use std::time::{Duration, SystemTime};

use lockcore::{AutoRenew, Holder, LockOptions, Locker};

use super::context::{Ctx, Outcome};
use super::support::ok_or;

fn fail_unless(cond: bool, what: impl FnOnce() -> String) -> Outcome {
    if cond { Ok(()) } else { Err(what()) }
}

pub(super) async fn inspect_reports_holder(ctx: &Ctx) -> Outcome {
    let holder = ctx.client().await?;
    let admin = ctx.client().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_secs(2));

    let free = ok_or(admin.inspect(&name).await, "inspect of a free lock")?;
    fail_unless(!free.held && free.holder.is_none(), || {
        format!("a lock never taken is reported as {free:?}")
    })?;

    let label = format!("conformance {}", name.as_str());
    // The token is checked: asked for (and on PostgreSQL's row lock the metadata is stored
    // with it).
    let opts = LockOptions::new()
        .ttl(ttl)
        .require_fencing(ctx.caps.fencing)
        .auto_renew(AutoRenew::until(ttl * 50))
        .label(label.as_str());
    let before = SystemTime::now();
    let guard = ok_or(holder.try_lock(&name, &opts).await, "try_lock")?
        .ok_or_else(|| "try_lock on a free lock returned None".to_owned())?;
    let after = SystemTime::now();

    let info = ok_or(admin.inspect(&name).await, "inspect of a held lock")?;
    fail_unless(info.held, || {
        format!("a held lock is reported free: {info:?}")
    })?;
    fail_unless(info.name == name, || format!("inspect names {}", info.name))?;
    let h = info
        .holder
        .clone()
        .ok_or_else(|| format!("no holder metadata for a lock this version took: {info:?}"))?;
    let me = Holder::current(None);
    fail_unless(h.host == me.host && h.pid == me.pid, || {
        format!(
            "holder {}:{} reported, {}:{} holds it",
            h.host, h.pid, me.host, me.pid
        )
    })?;
    fail_unless(h.label.as_deref() == Some(label.as_str()), || {
        format!("label {:?} reported, {label:?} set", h.label)
    })?;
    // The server's clock or the holder's: both are this machine's here, give or take a bound.
    let slack = ctx.bound(Duration::from_secs(2));
    fail_unless(
        h.acquired_at + slack >= before && h.acquired_at <= after + slack,
        || {
            format!(
                "acquired at {:?} ({} clock), outside the try_lock call [{before:?}, {after:?}]",
                h.acquired_at,
                h.clock.as_str()
            )
        },
    )?;
    if ctx.caps.fencing {
        fail_unless(info.fencing_token == guard.fencing_token(), || {
            format!(
                "token {:?} reported, the holder has {:?}",
                info.fencing_token,
                guard.fencing_token()
            )
        })?;
    }
    if let Some(left) = info.ttl_left {
        // Servers that grant whole seconds (etcd) round the TTL up, to at least their minimum.
        let most = ttl.max(Duration::from_secs(ttl.as_secs() + 1).max(Duration::from_secs(5)));
        fail_unless(!left.is_zero() && left <= most, || {
            format!("ttl left {left:?} of a lease of {ttl:?}")
        })?;
    }

    // Waiters, where the backend counts them.
    if info.waiters.is_some() {
        let waiter = ctx.client().await?;
        let task = {
            let (waiter, name) = (waiter.clone(), name.clone());
            tokio::spawn(async move { waiter.lock(&name, &LockOptions::new()).await })
        };
        let deadline = tokio::time::Instant::now() + ctx.bound(Duration::from_secs(10));
        loop {
            let seen = ok_or(admin.inspect(&name).await, "inspect with a waiter")?;
            if seen.waiters.is_some_and(|w| w >= 1) {
                break;
            }
            fail_unless(tokio::time::Instant::now() < deadline, || {
                format!("a waiting lock() never showed in inspect: {seen:?}")
            })?;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        task.abort();
        let _ = task.await;
        waiter.flush().await;
    }

    let lost = guard.lost();
    fail_unless(
        ok_or(admin.force_release(&name).await, "force_release")?,
        || "force_release of a held lock said nothing was held".to_owned(),
    )?;
    let by = guard.valid_until() + ctx.bound(Duration::from_secs(1));
    ok_or(
        tokio::time::timeout_at(by, lost.lost()).await,
        "the holder's lost signal did not fire after force_release",
    )?;

    // Freed (a row lock's session ends a moment after it is told to).
    let deadline = tokio::time::Instant::now() + ctx.bound(Duration::from_secs(10));
    loop {
        let seen = ok_or(admin.inspect(&name).await, "inspect after force_release")?;
        if !seen.held {
            break;
        }
        fail_unless(tokio::time::Instant::now() < deadline, || {
            format!("still held after force_release: {seen:?}")
        })?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(guard);
    fail_unless(
        !ok_or(
            admin.force_release(&name).await,
            "force_release of a free lock",
        )?,
        || "force_release of a free lock said something was released".to_owned(),
    )?;
    free_clients([holder, admin]).await;
    Ok(())
}

async fn free_clients<const N: usize>(clients: [Locker; N]) {
    for c in clients {
        c.flush().await;
    }
}
