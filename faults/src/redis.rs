//! The faults only Redis topologies have: a Sentinel failover losing an unreplicated key, a
//! Redlock master restarted empty or paused, a server clock jumping forward (a key's TTL
//! shortened).

use std::time::Duration;

use conformance::FaultCell;
use faultkit::now_unix_micros as now;
use locksmith::{LockGuard, LockOptions};

use crate::support::{
    LostAt, R, bound, connect, connect_url, ms, name, renewing, scale, watch_lost,
};
use crate::target::{Kind, Target, Topo};

/// Redis primary + replica + 3 sentinels. The replica is cut off from the primary (stopped,
/// and its link dropped by the primary), a client locks (asynchronous replication: only the primary has
/// the key), the primary is stopped, the sentinels promote the replica, and a second client
/// tries the lock. With `min_replicas` the grant needs the replica's acknowledgement, which the
/// cut-off replica cannot give: the grant is refused, so nothing can be lost.
pub(crate) async fn sentinel_failover(t: &mut Target, cell: &mut FaultCell) -> R {
    let name = name("failover");
    let url = t.url();
    let b = bound(t);
    let a = connect_url(&url).await?;
    let ttl = Duration::from_secs(5).mul_f64(scale());
    let opts = renewing(ttl).wait_timeout(b);
    // Warm the client up (connections, scripts): the grant below is one round trip.
    a.lock(format!("{name}-warm").as_str(), &opts)
        .await
        .map_err(|e| format!("warm-up lock: {e}"))?
        .release()
        .await
        .map_err(|e| e.to_string())?;
    let Topo::Sentinel(s) = &mut t.topo else {
        return Err("not a sentinel topology".into());
    };
    let old = s.primary().await.map_err(|e| e.to_string())?;
    // The replica stopped, then its link dropped by the primary: the grant below goes to the
    // primary alone (the replica reads the link's end when it resumes, and cannot reconnect to
    // the stopped primary).
    let replica = 1 - old;
    s.node(replica).pause().map_err(|e| e.to_string())?;
    if let Err(e) = s.cli(old, &["CLIENT", "KILL", "TYPE", "replica"]).await {
        s.node(replica).resume().ok();
        return Err(e.to_string());
    }
    let wait = Duration::from_secs(3).mul_f64(scale());
    let ga = match a
        .lock(name.as_str(), &opts.clone().wait_timeout(wait))
        .await
    {
        Ok(g) => g,
        Err(e) => {
            s.node(replica).resume().ok();
            cell.count("double_holders", 0);
            cell.count("grants_refused", 1);
            cell.note = format!(
                "replica cut off from the primary: the grant was refused ({}), so a failover \
                 has no lock to lose;",
                e.kind()
            );
            return Ok(());
        }
    };
    // Stop the primary right after the grant; the replica resumes and finds its link gone.
    if let Err(e) = s.node(old).pause() {
        s.node(replica).resume().ok();
        return Err(e.to_string());
    }
    let stopped = now();
    s.node(replica).resume().map_err(|e| e.to_string())?;
    let lost_at = watch_lost(ga.lost());
    let new = match s
        .wait_failover(old, Duration::from_secs(30).mul_f64(scale()))
        .await
    {
        Ok(n) => n,
        Err(e) => {
            s.node(old).resume().ok();
            return Err(e.to_string());
        }
    };
    let failed_over = now();
    // The second client: one answer from the new primary (errors while it settles are
    // retried, paced, up to the bound).
    let res = async {
        let bc = connect_url(&url).await?;
        let deadline = tokio::time::Instant::now() + b;
        loop {
            match bc
                .try_lock(name.as_str(), &LockOptions::new().ttl(ttl))
                .await
            {
                Ok(r) => return Ok(r),
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(format!("second client: {e}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    .await;
    cell.note = format!(
        "replica cut off from the primary, lock granted, primary node {old} SIGSTOPped; node \
         {new} promoted after {:.0} ms;",
        ms(stopped, failed_over)
    );
    // The old primary stays stopped while the holder's loss is awaited (resumed, it still
    // calls itself primary for a while and would accept the holder's renewals).
    let resume = |t: &mut Target| {
        if let Topo::Sentinel(s) = &mut t.topo {
            s.node(old).resume().ok();
        }
    };
    let res = match res {
        Ok(r) => r,
        Err(e) => {
            resume(t);
            return Err(e);
        }
    };
    match res {
        Some(gb) => {
            let at = now();
            cell.next_holder_ms = Some(ms(stopped, at));
            match lost_at.get() {
                Some(l) if l <= at => {
                    cell.count("double_holders", 0);
                    cell.margin_ms = Some(ms(l, at));
                }
                _ => {
                    cell.count("double_holders", 1);
                    cell.note.push_str(
                        " the lock key was lost in the failover: another client won it while \
                         the first still held it;",
                    );
                    if let Some(l) = lost_at.wait(ttl).await {
                        cell.detect_ms = Some(ms(stopped, l));
                        cell.margin_ms = Some(ms(l, at));
                    }
                }
            }
            gb.release().await.ok();
        }
        None => {
            cell.count("double_holders", 0);
            cell.note
                .push_str(" the lock survived the failover (the replica had it);");
        }
    }
    resume(t);
    drop(ga);
    Ok(())
}

/// The lock key of `name` on a Redis node (found by pattern: the key layout is the backend's).
async fn lock_key(node: &faultkit::RedisServer, name: &str) -> Result<String, String> {
    let out = node
        .cli(&["KEYS", &format!("*{name}*:lock")])
        .await
        .map_err(|e| e.to_string())?;
    out.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
        .ok_or_else(|| format!("no lock key for {name} on :{}", node.port()))
}

/// Waits (bounded) until `key` is gone from `node`.
async fn gone(node: &faultkit::RedisServer, key: &str, d: Duration) -> R {
    faultkit::wait_until("lock key gone from the node", d, || async move {
        Ok(node.cli(&["EXISTS", key]).await?.trim() == "0")
    })
    .await
    .map_err(|e| e.to_string())
}

/// A second client waits for the lock held by `ga`: whether it won while `ga` still believed
/// it held (a double holder), and the times.
async fn second_holder(
    t: &Target,
    name: &str,
    ga: &LockGuard,
    lost: &LostAt,
    from: u64,
    cell: &mut FaultCell,
) -> R {
    let b = bound(t);
    let c = connect(t).await?;
    let opts = LockOptions::new().ttl(t.ttl).wait_timeout(b);
    let g = match tokio::time::timeout(b * 2, c.lock(name, &opts)).await {
        Ok(Ok(g)) => g,
        Ok(Err(e)) => return Err(format!("second client: {e}")),
        Err(_) => return Err("second client: lock hung".into()),
    };
    let at = now();
    let believed = ga.is_valid();
    cell.next_holder_ms = Some(ms(from, at));
    cell.count("double_holders", u64::from(believed));
    match lost.get() {
        Some(l) => {
            cell.detect_ms = Some(ms(from, l));
            cell.margin_ms = Some(ms(l, at));
        }
        None if believed => cell.note.push_str(
            " a second client won while the holder still believed it held (without renewal it \
             learns of the loss only when its validity ends);",
        ),
        None => {}
    }
    g.release().await.ok();
    Ok(())
}

/// A holder of `name` on a Redis topology, without renewal and with a long TTL: it believes it
/// holds until its validity ends. On Redlock it holds on exactly masters 0-2: masters 3 and 4
/// are killed for the acquire, then restarted (empty).
async fn long_holder(t: &mut Target, name: &str) -> Result<LockGuard, String> {
    let redlock = t.kind == Kind::Redlock;
    if redlock {
        t.kill_member(3);
        t.kill_member(4);
    }
    let a = connect(t).await?;
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(20).mul_f64(scale()))
        .no_auto_renew()
        .wait_timeout(bound(t));
    let g = a.lock(name, &opts).await.map_err(|e| e.to_string())?;
    if redlock {
        t.restart_members(&[3, 4])
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(g)
}

pub(crate) async fn node_restart_empty(t: &mut Target, cell: &mut FaultCell) -> R {
    let name = name("empty");
    let ga = long_holder(t, &name).await?;
    let lost = watch_lost(ga.lost());
    let restarted = now();
    t.restart_members(&[0]).await.map_err(|e| e.to_string())?;
    cell.note = "held on masters 0-2 (3, 4 down at acquire, then back empty); master 0 \
                 restarted empty;"
        .into();
    second_holder(t, &name, &ga, &lost, restarted, cell).await?;
    ga.abandon();
    Ok(())
}

pub(crate) async fn clock_jump(t: &mut Target, cell: &mut FaultCell) -> R {
    let name = name("clock");
    cell.note = if t.kind == Kind::Redlock {
        "held on masters 0-2 (3, 4 down at acquire, then back empty); the key expired early \
         on master 0;"
    } else {
        "the key expired early on the server;"
    }
    .into();
    let ga = long_holder(t, &name).await?;
    let lost = watch_lost(ga.lost());
    let d = bound(t);
    let jumped = now();
    {
        let server = match &t.topo {
            Topo::Redis(r) => r,
            Topo::Redlock(ms) => &ms[0],
            _ => return Err("not a Redis topology".into()),
        };
        let key = lock_key(server, &name).await?;
        server
            .cli(&["PEXPIRE", &key, "1"])
            .await
            .map_err(|e| e.to_string())?;
        gone(server, &key, d).await?;
    }
    second_holder(t, &name, &ga, &lost, jumped, cell).await?;
    ga.abandon();
    Ok(())
}

/// A renewing holder on Redlock whose lock stands on exactly masters 0-2 (3 and 4 down at the
/// acquire, then back empty, as a split vote under contention leaves a lock): its renewals
/// extend it onto 3 and 4 (`not_repaired` when they do not within the bound), then master 0 is
/// SIGSTOPped for 3 TTLs, during which the holder must keep the lock (no lost signal:
/// `lost_with_a_minority_paused`) and another client never wins it (`double_holders`). Master 0
/// is resumed whatever happens.
pub(crate) async fn master_paused_on_three(t: &mut Target, cell: &mut FaultCell) -> R {
    let name = name("paused3");
    let (ttl, d) = (t.ttl, bound(t));
    t.kill_member(3);
    t.kill_member(4);
    let (a, b) = (connect(t).await?, connect(t).await?);
    let g = a
        .lock(&name, &renewing(ttl).wait_timeout(d))
        .await
        .map_err(|e| format!("lock on masters 0-2: {e}"))?;
    let lost = watch_lost(g.lost());
    t.restart_members(&[3, 4])
        .await
        .map_err(|e| e.to_string())?;
    let Topo::Redlock(masters) = &mut t.topo else {
        return Err("not a Redlock topology".into());
    };
    let key = lock_key(&masters[0], &name).await?;
    let restarted = now();
    for (i, m) in masters.iter().enumerate().skip(3) {
        let key = key.as_str();
        let repaired = faultkit::wait_until(
            "the holder's key repaired onto a master",
            d,
            || async move { Ok(m.cli(&["EXISTS", key]).await?.trim() == "1") },
        )
        .await;
        if repaired.is_err() {
            cell.count("not_repaired", 1);
            cell.note
                .push_str(&format!(" the renewals never put the key on master {i};"));
        }
    }
    cell.next_holder_ms = None;
    cell.note.push_str(&format!(
        " held on masters 0-2 (3, 4 down at acquire, then back empty), repaired onto 3, 4 \
         within {:.0} ms; master 0 paused for 3 TTLs;",
        ms(restarted, now())
    ));
    masters[0].process().pause().map_err(|e| e.to_string())?;
    let paused = std::time::Instant::now();
    let short = LockOptions::new().ttl(ttl).no_auto_renew();
    let mut outcome = Ok(());
    let (mut tries, mut won) = (0u64, 0u64);
    while paused.elapsed() < ttl * 3 {
        match b.try_lock(&name, &short).await {
            Ok(Some(other)) => {
                won += 1;
                other.release().await.ok();
            }
            Ok(None) => {}
            // A try whose votes did not add up (the paused master's is missing) is no win.
            Err(e) if e.kind() == locksmith::ErrorKind::Unavailable => {}
            Err(e) => {
                outcome = Err(format!("another client's try_lock: {e}"));
                break;
            }
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(200).mul_f64(scale())).await;
    }
    let kept = lost.get().is_none() && g.is_valid();
    masters[0].process().resume().map_err(|e| e.to_string())?;
    outcome?;
    cell.count("double_holders", won);
    cell.count("lost_with_a_minority_paused", u64::from(!kept));
    cell.note.push_str(&format!(
        " {tries} tries by another client while paused, {won} won; the holder {};",
        if kept {
            "kept the lock"
        } else {
            "lost the lock"
        }
    ));
    let released = g.release().await;
    if kept {
        released.map_err(|e| format!("release: {e}"))?;
    }
    Ok(())
}
