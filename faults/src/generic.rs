//! The fault scenarios every topology runs (where they apply): holder kill and pause, server
//! restart, partition, slow replies, leader loss and quorum loss.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::FaultCell;
use faultkit::{Direction, FencedResource, Holder, now_unix_micros as now};
use locksmith::{Capabilities, LockOptions, LostSignal};

use crate::held::Held;
use crate::service::Service;
use crate::support::{
    R, bound, bound_for, check_token, connect, connect_url, holder_spec, join, ms, name, proxies,
    renewing, scale, waiter, watch_lost,
};
use crate::target::{Target, Topo};

/// The holder process (holding `held`) SIGKILLed under a waiting client.
pub(crate) async fn holder_kill(
    t: &mut Target,
    caps: &Capabilities,
    cell: &mut FaultCell,
    held: Held,
) -> R {
    let name = name("kill");
    let b = bound(t);
    let _other = held.occupy(t, &name).await?;
    let mut spec = holder_spec(t, &name, "a");
    held.apply(&mut spec);
    let mut h = Holder::spawn(&spec).map_err(|e| e.to_string())?;
    let acq = h.wait_for("acquired", b).await.map_err(|e| e.to_string())?;
    let w = connect(t).await?;
    let wait = waiter(
        w,
        name.clone(),
        held.next(LockOptions::new().ttl(t.ttl).wait_timeout(b)),
    );
    h.kill().await.map_err(|e| e.to_string())?;
    let killed = now();
    let won = wait.result(b * 2).await??;
    cell.next_holder_ms = Some(ms(killed, won.at));
    // The holder believed itself valid until acquired + valid_for (renewals could only move
    // that later, and it was killed before its first renewal was due).
    let valid_end = acq.t_us + acq.valid_for_us.unwrap_or(0);
    if caps.expiry_after_ttl {
        cell.margin_ms = Some(ms(valid_end, won.at));
    }
    if caps.expiry_after_ttl && won.at < valid_end {
        cell.count("freed_early", 1);
        cell.note
            .push_str(" freed before the dead holder's validity ended;");
    }
    check_token(cell, acq.fence, won.fence);
    let _ = won.guard.release().await;
    cell.note.push_str(if caps.expiry_after_ttl {
        " lease: freed by its TTL"
    } else {
        " freed when the holder's session/connection ended"
    });
    Ok(())
}

/// The holder process (holding `held`) SIGSTOPped between a check and a fenced write, past its
/// TTL, then resumed.
pub(crate) async fn holder_pause(
    t: &mut Target,
    caps: &Capabilities,
    cell: &mut FaultCell,
    held: Held,
) -> R {
    let name = name("pause");
    let b = bound(t);
    let resource = FencedResource::new();
    let (addr, serve) = resource.serve().await.map_err(|e| e.to_string())?;
    let _other = held.occupy(t, &name).await?;
    let mut spec = holder_spec(t, &name, "a");
    held.apply(&mut spec);
    spec.resource = Some(addr);
    spec.extend = true;
    spec.work = Duration::from_millis(150);
    let mut h = Holder::spawn(&spec).map_err(|e| e.to_string())?;
    let acq = h.wait_for("acquired", b).await.map_err(|e| e.to_string())?;
    resource.set_holder("a");
    // Pause right after a check said valid: the write it guards comes after the resume.
    loop {
        let e = h.wait_for("checked", b).await.map_err(|e| e.to_string())?;
        if e.valid == Some(true) {
            break;
        }
    }
    h.pause().map_err(|e| e.to_string())?;
    let paused = now();
    let w = connect(t).await?;
    let won = waiter(
        w,
        name.clone(),
        held.next(LockOptions::new().ttl(t.ttl).wait_timeout(b)),
    )
    .result(b * 2)
    .await;
    let won = match won.and_then(|w| w) {
        Ok(w) => w,
        Err(e) => {
            h.resume().ok();
            cell.count("no_progress", 1);
            cell.note = format!("no other client got the lock while the holder was paused: {e}");
            serve.abort();
            return Ok(());
        }
    };
    cell.next_holder_ms = Some(ms(paused, won.at));
    check_token(cell, acq.fence, won.fence);
    resource.set_holder("b");
    resource.write("b", won.fence);
    h.resume().map_err(|e| e.to_string())?;
    // The stale write, then the next lock operation (extend).
    let write = h.wait_for("write", b).await.map_err(|e| e.to_string())?;
    let ext = h.wait_for("extend", b).await.map_err(|e| e.to_string())?;
    if ext.ok == Some(true) {
        cell.count("extend_succeeded_after_loss", 1);
    }
    if ext.lost_before != Some(true) {
        cell.count("lost_after_other_won", 1);
        cell.note
            .push_str(" the resumed holder's extend returned before its lost signal;");
    }
    if let Some(lost) = h.seen("lost").cloned() {
        cell.detect_ms = Some(ms(paused, lost.t_us));
    }
    let stats = resource.stats();
    cell.count("stale_accepted", stats.stale_accepted);
    cell.count("stale_rejected", stats.stale_rejected);
    cell.note.push_str(&format!(
        " stale write with token {:?} {};",
        write.fence,
        if write.accepted == Some(true) {
            "ACCEPTED"
        } else {
            "rejected"
        }
    ));
    if !caps.fencing {
        cell.note.push_str(" no fencing declared;");
    }
    h.kill().await.ok();
    let _ = won.guard.release().await;
    serve.abort();
    Ok(())
}

/// Server restart over any [`Service`]: a holder (renewing) and a waiter; every server killed
/// and restarted; the holder's loss detected or the lock kept; the waiter woken with a larger
/// token; the same client locks again.
///
/// Cancel safety: dropping the future may leave the service stopped and locks held until their
/// TTL.
pub async fn server_restart(svc: &mut dyn Service, cell: &mut FaultCell) -> R {
    let name = name("restart");
    let ttl = svc.ttl();
    let b = bound_for(ttl);
    let a = svc.client().await?;
    let caps = a.capabilities().clone();
    let opts = renewing(ttl);
    // A few acquisitions first, so that a counter reset shows as tokens going backwards.
    for _ in 0..3 {
        let g = a
            .lock(name.as_str(), &opts)
            .await
            .map_err(|e| format!("warm-up lock: {e}"))?;
        g.release().await.map_err(|e| e.to_string())?;
    }
    let ga = a
        .lock(name.as_str(), &opts)
        .await
        .map_err(|e| e.to_string())?;
    let fa = ga.fencing_token();
    let lost_at = watch_lost(ga.lost());
    let w = svc.client().await?;
    let mut wait = waiter(
        w,
        name.clone(),
        LockOptions::new().ttl(ttl).wait_timeout(b * 2),
    );
    wait.waiting(b).await;
    let restarted = now();
    svc.restart()
        .await
        .unwrap_or(Ok(()))
        .map_err(|e| format!("restart: {e}"))?;
    // Either the holder learns of a loss, or (data kept) it still holds and releases.
    let lost = lost_at.wait(ttl * 3).await;
    let kept = lost.is_none();
    if kept {
        cell.note
            .push_str(" the lock survived the restart; the holder released it;");
        ga.release()
            .await
            .map_err(|e| format!("release after restart: {e}"))?;
    } else {
        cell.detect_ms = lost.map(|l| ms(restarted, l));
        drop(ga);
    }
    let won = match wait.result(b * 3).await? {
        Ok(w) => w,
        Err(e) => {
            cell.count("waiter_not_woken", 1);
            cell.note.push_str(&format!(" {e};"));
            return Ok(());
        }
    };
    cell.next_holder_ms = Some(ms(restarted, won.at));
    if let Some(l) = lost {
        cell.margin_ms = Some(ms(l, won.at));
        if won.at < l {
            cell.count("double_holders", 1);
        }
    }
    if caps.fencing {
        check_token(cell, fa, won.fence);
    }
    let fw = won.fence;
    won.guard.release().await.ok();
    // The same client, not rebuilt, locks again.
    match tokio::time::timeout(b, a.lock(name.as_str(), &opts)).await {
        Ok(Ok(g)) => {
            if caps.fencing {
                check_token(cell, fw, g.fencing_token());
            }
            g.release().await.ok();
        }
        Ok(Err(e)) => {
            cell.count("relock_failed", 1);
            cell.note
                .push_str(&format!(" the same client could not lock again: {e};"));
        }
        Err(_) => {
            cell.count("relock_failed", 1);
            cell.note
                .push_str(" the same client could not lock again in time;");
        }
    }
    Ok(())
}

/// Partition over any [`Service`]: a holder (renewing) cut off while another client waits; the
/// margin between the holder's lost signal and the other client's win; after healing, the same
/// client locks again.
///
/// Cancel safety: dropping the future may leave the link cut and locks held until their TTL.
pub async fn partition(svc: &mut dyn Service, cell: &mut FaultCell) -> R {
    let name = name("partition");
    let ttl = svc.ttl();
    let b = bound_for(ttl);
    let (a, link) = svc.cuttable_client().await?;
    let opts = renewing(ttl);
    let ga = a
        .lock(name.as_str(), &opts)
        .await
        .map_err(|e| e.to_string())?;
    let lost_at = watch_lost(ga.lost());
    let w = svc.client().await?;
    let mut wait = waiter(w, name.clone(), LockOptions::new().ttl(ttl).wait_timeout(b));
    wait.waiting(b).await;
    link.cut(true);
    let cut = now();
    let won = wait.result(b * 2).await;
    let won = match won.and_then(|w| w) {
        Ok(w) => w,
        Err(e) => {
            link.cut(false);
            cell.count("no_progress", 1);
            cell.note = format!("no other client got the lock while the holder was cut off: {e}");
            return Ok(());
        }
    };
    cell.next_holder_ms = Some(ms(cut, won.at));
    // A late signal still gets its (negative) margin measured.
    match lost_at.wait(ttl * 2 + Duration::from_secs(1)).await {
        Some(l) => {
            cell.detect_ms = Some(ms(cut, l));
            cell.margin_ms = Some(ms(l, won.at));
            if l > won.at {
                cell.count("lost_after_other_won", 1);
                cell.note
                    .push_str(" the holder's lost signal fired after another client won;");
            }
        }
        None => {
            cell.count("lost_after_other_won", 1);
            cell.note.push_str(" the holder's lost signal never fired;");
        }
    }
    won.guard.release().await.ok();
    drop(ga);
    link.cut(false);
    let healed = now();
    match tokio::time::timeout(b, a.lock(name.as_str(), &opts)).await {
        Ok(Ok(g)) => {
            cell.note.push_str(&format!(
                " after healing the same client locked again in {:.0} ms;",
                ms(healed, now())
            ));
            g.release().await.ok();
        }
        Ok(Err(e)) => {
            cell.count("relock_failed", 1);
            cell.note.push_str(&format!(" after healing: {e};"));
        }
        Err(_) => {
            cell.count("relock_failed", 1);
            cell.note
                .push_str(" after healing the same client could not lock in time;");
        }
    }
    Ok(())
}

pub(crate) async fn slow_replies(t: &mut Target, caps: &Capabilities, cell: &mut FaultCell) -> R {
    let name = name("slow");
    let (ps, url) = proxies(t).await?;
    let a = connect_url(&url).await?;
    let opts = LockOptions::new().ttl(t.ttl).no_auto_renew();
    // Warm the client's connections up without latency.
    a.try_lock(name.as_str(), &opts)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("warm-up: lock busy")?
        .release()
        .await
        .map_err(|e| e.to_string())?;

    // A quarter TTL of reply latency: validity must count from the send.
    for p in &ps {
        p.set_latency(Direction::ToClient, t.ttl / 4);
    }
    let sent = locksmith::Instant::now();
    match a.try_lock(name.as_str(), &opts).await {
        Ok(Some(g)) => {
            // Only a server-side TTL makes a validity past `sent + ttl` unsafe; a session-bound
            // lock lives as long as its session, and its TTL is enforced by the client.
            if g.valid_until() > sent + t.ttl {
                if caps.expiry_after_ttl {
                    cell.count("validity_past_ttl", 1);
                    cell.note
                        .push_str(" validity counted from the reply, not the send;");
                } else {
                    cell.note.push_str(
                        " validity counted from a later request than the first (safe here: a \
                         session-bound lock lives as long as its session);",
                    );
                }
            }
            g.release().await.ok();
        }
        Ok(None) => return Err("lock busy under moderate latency".into()),
        Err(e) => {
            // A quarter TTL per reply leaves a grant most of its TTL: refusing it is a backend
            // that cannot work on a slow network, not a safe choice.
            cell.count("refused_under_moderate_latency", 1);
            cell.note
                .push_str(&format!(" under TTL/4 reply latency try_lock failed: {e};"));
        }
    }

    // Reply latency beyond the TTL: the grant arrives after it expired.
    for p in &ps {
        p.set_latency(Direction::ToClient, t.ttl + t.ttl / 2);
    }
    let name2 = format!("{name}-late");
    // One attempt takes a few round trips of 1.5 TTL each; past four of them plus 2 s the
    // caller of try_lock, which promises not to wait, has been left hanging.
    let late_bound = (t.ttl * 6 + Duration::from_secs(2)).mul_f64(scale());
    let res = tokio::time::timeout(late_bound, a.try_lock(name2.as_str(), &opts)).await;
    match res {
        Ok(Ok(Some(g))) => {
            if g.is_valid() && caps.expiry_after_ttl {
                cell.count("late_grant_valid", 1);
                cell.note
                    .push_str(" a grant that arrived after its TTL was handed out as valid;");
            } else if g.is_valid() {
                // No server-side TTL: the server keeps the lock for the session, so nobody else
                // can hold it while this guard says valid.
                cell.note.push_str(
                    " a grant that arrived after its TTL came back valid (safe here: the \
                     session-bound lock is held by the server as long as the session);",
                );
            } else {
                cell.note
                    .push_str(" the late grant came back already lost;");
            }
            g.abandon();
        }
        Ok(Ok(None)) => cell.note.push_str(" late try_lock said busy;"),
        Ok(Err(e)) => cell.note.push_str(&format!(" late try_lock failed: {e};")),
        Err(_) => {
            cell.count("hung_past_deadline", 1);
            cell.note.push_str(&format!(
                " late try_lock still pending after {late_bound:?} (bound: 4 round trips of 1.5 TTL + 2 s);"
            ));
        }
    }
    for p in &ps {
        p.set_latency(Direction::ToClient, Duration::ZERO);
    }
    Ok(())
}

/// Who holds now, as the contending clients see it, and the double holders seen.
#[derive(Default)]
struct Contention {
    current: Option<(usize, LostSignal)>,
    double: u64,
    acquisitions: Vec<u64>,
    /// Set when the scenario has seen enough: the contenders stop.
    stop: bool,
}

async fn contend(
    url: String,
    id: usize,
    name: String,
    ttl: Duration,
    state: Arc<Mutex<Contention>>,
    until: locksmith::Instant,
) {
    let Ok(locker) = locksmith::connect(&url).await else {
        return;
    };
    let opts = renewing(ttl).wait_timeout(ttl * 2);
    while locksmith::Instant::now() < until && !state.lock().unwrap_or_else(|e| e.into_inner()).stop
    {
        let Ok(g) = locker.lock(name.as_str(), &opts).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((other, sig)) = &s.current
                && *other != id
                && !sig.is_lost()
            {
                s.double += 1;
            }
            s.current = Some((id, g.lost()));
            s.acquisitions.push(now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            if s.current.as_ref().is_some_and(|(o, _)| *o == id) {
                s.current = None;
            }
        }
        let _ = g.release().await;
    }
}

/// Waits (bounded by `d`) until the contenders made `n` acquisitions after `since` (unix µs).
async fn acquisitions_after(
    state: &Arc<Mutex<Contention>>,
    since: u64,
    n: usize,
    d: Duration,
) -> R {
    faultkit::wait_until("acquisitions by the contenders", d, || {
        let state = state.clone();
        async move {
            let s = state.lock().unwrap_or_else(|e| e.into_inner());
            Ok(s.acquisitions.iter().filter(|&&a| a > since).count() >= n)
        }
    })
    .await
    .map_err(|e| e.to_string())
}

/// The leader (ZooKeeper, etcd) killed -9 during 3-client contention; restarted afterwards.
pub(crate) async fn leader_loss(t: &mut Target, cell: &mut FaultCell) -> R {
    let name = name("leader");
    let b = bound(t);
    let state = Arc::new(Mutex::new(Contention::default()));
    // The contenders run until progress after the kill was seen (or this hard bound).
    let run_for = b * 3;
    let until = locksmith::Instant::now() + run_for;
    let mut tasks = Vec::new();
    for id in 0..3 {
        tasks.push(tokio::spawn(contend(
            t.url(),
            id,
            name.clone(),
            t.ttl,
            state.clone(),
            until,
        )));
    }
    let stop = |state: &Arc<Mutex<Contention>>| {
        state.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
    };
    if let Err(e) = acquisitions_after(&state, 0, 20, b).await {
        stop(&state);
        return Err(e);
    }
    let leader = match &t.topo {
        Topo::ZooKeeper(z) => z.leader().await.map_err(|e| e.to_string()),
        Topo::Etcd(e) => e.leader().await.map_err(|e| e.to_string()),
        _ => Err("no leader in this topology".into()),
    };
    let leader = match leader {
        Ok(l) => l,
        Err(e) => {
            stop(&state);
            return Err(e);
        }
    };
    t.kill_member(leader);
    let killed = now();
    // Progress: 10 acquisitions after the kill (a missing one is counted below).
    let _ = acquisitions_after(&state, killed, 10, b * 2).await;
    stop(&state);
    for task in tasks {
        join("contender", run_for + b, task).await?;
    }
    let (double, acquisitions) = {
        let s = state.lock().unwrap_or_else(|e| e.into_inner());
        (s.double, s.acquisitions.clone())
    };
    cell.count("double_holders", double);
    cell.count("acquisitions", acquisitions.len() as u64);
    match acquisitions.iter().find(|&&a| a > killed) {
        Some(&first) => cell.next_holder_ms = Some(ms(killed, first)),
        None => cell.count("no_progress", 1),
    }
    cell.note = format!("leader member {leader} killed -9 during 3-client contention;");
    t.restart_members(&[leader])
        .await
        .map_err(|e| e.to_string())
}

pub(crate) async fn quorum_loss(t: &mut Target, cell: &mut FaultCell) -> R {
    let name = name("quorum");
    let b = bound(t);
    let n = t.members();
    let minority = (n - 1) / 2;
    let a = connect(t).await?;
    let c = connect(t).await?;
    let opts = LockOptions::new().ttl(t.ttl).wait_timeout(b);
    // A minority down, one more at a time: lock, exclude, release.
    for k in 0..minority {
        t.kill_member(k);
        match tokio::time::timeout(b * 2, a.lock(name.as_str(), &opts)).await {
            Ok(Ok(g)) => {
                if let Ok(Some(g2)) = c.try_lock(name.as_str(), &opts).await {
                    cell.count("double_holders", 1);
                    g2.abandon();
                }
                g.release().await.ok();
            }
            Ok(Err(e)) => {
                cell.count("minority_lock_failed", 1);
                cell.note
                    .push_str(&format!(" {} of {n} down: lock failed: {e};", k + 1));
            }
            Err(_) => {
                cell.count("minority_lock_failed", 1);
                cell.note
                    .push_str(&format!(" {} of {n} down: lock hung;", k + 1));
            }
        }
    }
    cell.note.push_str(&format!(
        " 1..{minority} of {n} members down: locked and excluded;"
    ));
    // A majority down: lock() must fail by its deadline and grant nothing.
    let down: Vec<usize> = (0..n / 2 + 1).collect();
    for &k in &down[minority..] {
        t.kill_member(k);
    }
    let deadline = Duration::from_secs(2).mul_f64(scale());
    let started = locksmith::Instant::now();
    let res = tokio::time::timeout(
        deadline + b,
        a.lock(name.as_str(), &opts.clone().wait_timeout(deadline)),
    )
    .await;
    let took = started.elapsed();
    match res {
        Ok(Ok(g)) => {
            cell.count("granted_without_quorum", 1);
            cell.note
                .push_str(" a lock was granted with a majority down;");
            g.abandon();
        }
        Ok(Err(e)) => cell.note.push_str(&format!(
            " {} of {n} down: lock() failed after {:.0} ms (deadline {:.0} ms): {};",
            down.len(),
            took.as_secs_f64() * 1000.0,
            deadline.as_secs_f64() * 1000.0,
            e.kind()
        )),
        Err(_) => {
            cell.count("hung_past_deadline", 1);
            cell.note.push_str(&format!(
                " {} of {n} down: lock() had not returned {:.0} ms after its deadline;",
                down.len(),
                b.as_secs_f64() * 1000.0
            ));
        }
    }
    // Back: the same client locks again.
    t.restart_members(&down).await.map_err(|e| e.to_string())?;
    let back = now();
    match tokio::time::timeout(b * 2, a.lock(name.as_str(), &opts)).await {
        Ok(Ok(g)) => {
            cell.next_holder_ms = Some(ms(back, now()));
            g.release().await.ok();
        }
        Ok(Err(e)) => {
            cell.count("relock_failed", 1);
            cell.note.push_str(&format!(" after the restart: {e};"));
        }
        Err(_) => {
            cell.count("relock_failed", 1);
            cell.note.push_str(" after the restart: lock hung;");
        }
    }
    Ok(())
}
