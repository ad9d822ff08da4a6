//! A member of a ZooKeeper ensemble or an etcd cluster cut off from its peers while its clients
//! still reach it (issue 19; faultkit's peer links): a client's session, watch or keep-alive
//! stream sits on a member that has lost the quorum. The cut member is a follower; the healthy
//! majority goes on.
//!
//! Each cell states a bound from the backend's design and counts a miss:
//! * ZooKeeper: a follower that hears nothing from its leader for `syncLimit` ticks (5 x 200 ms)
//!   gives up and closes its clients' connections; a client then moves to another member, where
//!   its session is still alive unless the leader expired it (no touch for the session timeout,
//!   1 s here): then lock-zk opens a new session and queues again. Bound: sync limit + session
//!   timeout, plus slack.
//! * etcd: a follower cut off has no leader once its randomised election timeout runs out
//!   (1 to 2 election timeouts of 500 ms here). It refuses new requests that carry
//!   require-leader (lock-etcd's do) from then on, but cancels the streams open with it (the
//!   waiter's watch) only when its leader check, every election timeout, found no leader 3 times
//!   in a row (`maxNoLeaderCnt` in etcd's `v3rpc/interceptor.go`: reconnecting streams costs
//!   more than refusing requests): up to 5 election timeouts in all, then the client moves to
//!   another member and the watch replays what it missed. Bound: 5 election timeouts, plus
//!   slack, well below the waiter's re-check period (its lease TTL, at most 10 s: the waiter
//!   here leases 30 s), which would otherwise end the wait. (The bound was 3 election timeouts
//!   until a full run measured 4.4 s; 1.9 to 2.6 s is usual.)
//!
//! Each member is healed and back in the quorum before the cell ends (the matrix goes on with
//! the same topology).

use std::time::Duration;

use conformance::FaultCell;
use faultkit::{Proxy, ProxyMode, now_unix_micros as now};
use locksmith::{Instant, LockName, LockOptions, Locker};

use crate::support::{R, bound, connect_url, ms, name, scale, watch_lost};
use crate::target::{Kind, Target};

/// Slack for a noisy machine on top of a bound.
fn slack() -> Duration {
    Duration::from_secs(2).mul_f64(scale())
}

/// How long after the holder's release a waiter watching through the cut member may take,
/// from the backend's design (see the module docs).
fn waiter_bound(t: &Target) -> Duration {
    match t.kind {
        // syncLimit x tickTime, then the session timeout.
        Kind::ZooKeeper => Duration::from_millis(5 * 200) + t.ttl,
        // Up to two election timeouts to lose the leader, three leader checks to cancel.
        _ => Duration::from_millis(5 * 500),
    }
}

/// The cut member (a follower), and the healthy ones.
async fn pick(t: &Target) -> Result<(usize, Vec<usize>), String> {
    let leader = t.leader().await.map_err(|e| e.to_string())?;
    let cut = (leader + 1) % t.members();
    Ok((cut, (0..t.members()).filter(|&i| i != cut).collect()))
}

fn ports(t: &Target, members: &[usize]) -> Vec<u16> {
    let all = t.endpoints();
    members.iter().map(|&i| all[i]).collect()
}

async fn proxy_to(port: u16) -> Result<Proxy, String> {
    Proxy::start(([127, 0, 0, 1], port).into())
        .await
        .map_err(|e| e.to_string())
}

/// Waits until `admin` sees a waiter queued for `name`.
async fn until_queued(admin: &Locker, name: &str, d: Duration) -> R {
    let lock_name = LockName::new(name).map_err(|e| e.to_string())?;
    let end = Instant::now() + d;
    loop {
        if admin
            .backend()
            .queued_waiters(&lock_name)
            .await
            .is_ok_and(|n| n >= 1)
        {
            return Ok(());
        }
        if Instant::now() >= end {
            return Err(format!("the waiter did not queue within {d:?}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Heals member `cut` and waits until it is back in the quorum.
async fn heal(t: &Target, cut: usize) -> R {
    t.set_member_cut(cut, false).map_err(|e| e.to_string())?;
    let end = Instant::now() + bound(t) * 2;
    while !t.member_in_quorum(cut).await {
        if Instant::now() >= end {
            return Err(format!(
                "member {cut} did not rejoin the quorum after the heal"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// a. A waiter whose session (ZooKeeper) or watch (etcd) sits on the cut member gets the lock
/// within the bound after the holder releases through a healthy member.
pub(crate) async fn cut_member_waiter(t: &mut Target, cell: &mut FaultCell) -> R {
    let name = name("cut-waiter");
    let (cut, healthy) = pick(t).await?;
    let healthy_ports = ports(t, &healthy);
    let url = |ports: &[u16]| t.url_via(ports).ok_or("no peer links in this topology");
    let holder = connect_url(&url(&healthy_ports)?).await?;
    // The waiter knows two endpoints: the cut member, and a healthy one that refuses
    // connections while the waiter connects and queues, so that its session, channel and
    // watch are on the cut member; it is reachable again once the member is cut.
    let to_cut = proxy_to(ports(t, &[cut])[0]).await?;
    let fallback = proxy_to(healthy_ports[0]).await?;
    fallback.set_mode(ProxyMode::Reset);
    // A connection that first picks the refusing endpoint may fail: connect again (bounded).
    let waiter_url = url(&[to_cut.port(), fallback.port()])?;
    let end = Instant::now() + bound(t);
    let waiter = loop {
        match connect_url(&waiter_url).await {
            Ok(w) => break w,
            Err(e) if Instant::now() >= end => return Err(format!("waiter's connect: {e}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let g = holder
        .lock(
            name.as_str(),
            &LockOptions::new()
                .ttl(Duration::from_secs(60))
                .wait_timeout(bound(t)),
        )
        .await
        .map_err(|e| format!("holder: {e}"))?;
    let stated = waiter_bound(t);
    // A lease long enough that etcd's re-check timer (min(TTL, 10 s)) is not what ends the wait.
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_timeout(stated * 4 + slack() * 4);
    let waiting = {
        let (waiter, name, opts) = (waiter.clone(), name.clone(), opts.clone());
        tokio::spawn(async move { waiter.lock(name.as_str(), &opts).await })
    };
    if let Err(e) = until_queued(&holder, &name, bound(t)).await {
        waiting.abort();
        return Err(e);
    }
    let cut_at = now();
    t.set_member_cut(cut, true).map_err(|e| e.to_string())?;
    fallback.set_mode(ProxyMode::Pass);
    g.release().await.map_err(|e| format!("release: {e}"))?;
    let released = now();
    let released_mono = Instant::now();
    let abort = waiting.abort_handle();
    let outcome = tokio::time::timeout(stated * 4 + slack() * 4, waiting).await;
    let won = match outcome {
        Ok(Ok(Ok(g2))) => {
            let took = released_mono.elapsed();
            let at = now();
            g2.release().await.ok();
            Some((took, at))
        }
        Ok(Ok(Err(e))) => {
            cell.note = format!("the waiter failed: {e}; ");
            None
        }
        Ok(Err(e)) => return Err(format!("waiter task: {e}")),
        Err(_) => {
            abort.abort();
            None
        }
    };
    let allowed = stated + slack();
    cell.note.push_str(&format!(
        "member {cut} (a follower) cut off from its peers {:.0} ms before the holder released \
         through a healthy member; the waiter's session/watch was on it; bound {:.0} ms ({}) \
         + {:.0} ms slack: ",
        ms(cut_at, released),
        stated.as_secs_f64() * 1000.0,
        match t.kind {
            Kind::ZooKeeper => "syncLimit x tick + session timeout",
            _ => "5 election timeouts (require-leader streams)",
        },
        slack().as_secs_f64() * 1000.0
    ));
    match won {
        Some((took, at)) => {
            cell.next_holder_ms = Some(ms(released, at));
            cell.note.push_str(&format!(
                "the waiter got the lock {:.0} ms after the release;",
                took.as_secs_f64() * 1000.0
            ));
            if took > allowed {
                cell.count("waiter_past_bound", 1);
            }
        }
        None => {
            cell.count("waiter_past_bound", 1);
            cell.note.push_str("the waiter did not get the lock;");
        }
    }
    heal(t, cut).await
}

/// b. A holder whose session (ZooKeeper) or keep-alive stream (etcd) sits on the cut member,
/// renewing, knows it lost the lock before a client of the healthy majority wins it.
pub(crate) async fn cut_member_holder(t: &mut Target, cell: &mut FaultCell) -> R {
    let name = name("cut-holder");
    let (cut, healthy) = pick(t).await?;
    let url = |ports: &[u16]| t.url_via(ports).ok_or("no peer links in this topology");
    // The holder knows only the member that will be cut: it cannot move elsewhere.
    let holder = connect_url(&url(&ports(t, &[cut]))?).await?;
    let other = connect_url(&url(&ports(t, &healthy))?).await?;
    let ttl = t.ttl;
    let g = holder
        .lock(
            name.as_str(),
            &LockOptions::new()
                .ttl(ttl)
                .auto_renew(locksmith::AutoRenew::until(Duration::from_secs(600)))
                .wait_timeout(bound(t)),
        )
        .await
        .map_err(|e| format!("holder: {e}"))?;
    let lost = watch_lost(g.lost());
    let wait = bound(t) * 2;
    let waiting = {
        let (other, name) = (other.clone(), name.clone());
        let opts = LockOptions::new().ttl(ttl).wait_timeout(wait);
        tokio::spawn(async move {
            let g = other.lock(name.as_str(), &opts).await;
            (now(), g)
        })
    };
    if let Err(e) = until_queued(&other, &name, bound(t)).await {
        waiting.abort();
        g.abandon();
        return Err(e);
    }
    let cut_at = now();
    t.set_member_cut(cut, true).map_err(|e| e.to_string())?;
    let abort = waiting.abort_handle();
    let outcome = tokio::time::timeout(wait + slack(), waiting).await;
    cell.note = format!(
        "member {cut} (a follower) cut off from its peers under a renewing holder whose \
         session/stream was on it (TTL {:.0} ms); a client of the healthy majority waits: ",
        ttl.as_secs_f64() * 1000.0
    );
    match outcome {
        Ok(Ok((won_at, Ok(g2)))) => {
            cell.next_holder_ms = Some(ms(cut_at, won_at));
            match lost.get() {
                Some(l) => {
                    cell.detect_ms = Some(ms(cut_at, l));
                    cell.margin_ms = Some(ms(l, won_at));
                    cell.note.push_str(&format!(
                        "the holder's lost signal after {:.0} ms, the other client won after \
                         {:.0} ms;",
                        ms(cut_at, l),
                        ms(cut_at, won_at)
                    ));
                    if l > won_at {
                        cell.count("lost_after_other_won", 1);
                    }
                }
                None => {
                    cell.count("lost_after_other_won", 1);
                    cell.note.push_str(&format!(
                        "the other client won after {:.0} ms, the holder's lost signal never \
                         fired;",
                        ms(cut_at, won_at)
                    ));
                }
            }
            g2.release().await.ok();
        }
        Ok(Ok((_, Err(e)))) => {
            cell.count("no_progress", 1);
            cell.note
                .push_str(&format!("the other client failed: {e};"));
        }
        Ok(Err(e)) => return Err(format!("waiter task: {e}")),
        Err(_) => {
            abort.abort();
            cell.count("no_progress", 1);
            cell.note
                .push_str("the other client hung past its deadline;");
        }
    }
    g.abandon();
    heal(t, cut).await
}
