//! Lost replies (issue 19): the server applies a request, the client never hears back (the
//! proxy drops the reply and resets the connection). Acquire, release and extend, each on a
//! client whose every connection goes through [`faultkit::Proxy`]s; the other clients connect
//! directly.
//!
//! The request is picked by a byte pattern: the lock's name, which every backend's acquire and
//! release carry in clear (a Redis key, a bound SQL parameter, a ZooKeeper path, an etcd key in
//! a protobuf message); for extend, where a backend's request does not carry the name, a
//! pattern of that request (see [`extend_pick`]). The proxied client does nothing else with
//! that name meanwhile (no renewal, no waiter), so the next match is the operation under test.

use std::time::Duration;

use conformance::FaultCell;
use faultkit::{Pick, Proxy, ReplyLoss, now_unix_micros as now};
use locksmith::{Capabilities, Instant, LockGuard, LockOptions, Locker};

use crate::support::{R, bound, connect, connect_url, ms, name, proxies, scale, watch_lost};
use crate::target::{Kind, Target};

/// Arms every proxy (one per endpoint: the request goes to whichever serves the client).
fn arm(ps: &[Proxy], pick: &Pick) {
    for p in ps {
        p.lose_reply(pick.clone(), ReplyLoss::Reset);
    }
}

/// Disarms every proxy; how many replies were lost.
fn disarm(ps: &[Proxy]) -> usize {
    ps.iter()
        .map(|p| {
            p.disarm();
            p.replies_lost()
        })
        .sum()
}

/// A no-renewal lease of `ttl`.
fn plain(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).no_auto_renew()
}

/// Slack for a noisy machine on top of a TTL.
fn slack() -> Duration {
    Duration::from_secs(2).mul_f64(scale())
}

/// The proxied client, its proxies, warmed up (connections open, scripts loaded) on another
/// name, so that the picked request is the operation itself.
async fn proxied(t: &Target) -> Result<(Locker, Vec<Proxy>), String> {
    let (ps, url) = proxies(t).await?;
    let a = connect_url(&url).await?;
    let warm = format!("warm-{:08x}", fastrand::u32(..));
    let g = a
        .lock(warm.as_str(), &plain(t.ttl).wait_timeout(bound(t)))
        .await
        .map_err(|e| format!("warm-up lock: {e}"))?;
    g.release()
        .await
        .map_err(|e| format!("warm-up release: {e}"))?;
    Ok((a, ps))
}

/// Waits for `name` with `c` up to `wait`: when it won (monotonic and unix µs) and the guard.
async fn wait_win(
    c: &Locker,
    name: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<(Instant, u64, LockGuard), String> {
    let g = tokio::time::timeout(wait + slack(), c.lock(name, &plain(ttl).wait_timeout(wait)))
        .await
        .map_err(|_| format!("lock() had not returned {wait:?} after its deadline"))?
        .map_err(|e| e.to_string())?;
    Ok((Instant::now(), now(), g))
}

/// a. The acquire's reply lost; the library's own retry (`lock()` retries `Unavailable`) must
/// not wait on its own grant, must not make a second holder, and must leave nothing behind.
pub(crate) async fn lost_acquire_reply(t: &mut Target, cell: &mut FaultCell) -> R {
    let name = name("lost-acquire");
    // A TTL long enough that a retry waiting for its own grant to expire misses the bound
    // (half of it) by far.
    let ttl = (t.ttl * 4).mul_f64(scale());
    let (a, ps) = proxied(t).await?;
    let b = connect(t).await?;
    arm(&ps, &Pick::Matching(name.as_bytes().to_vec()));
    let started = Instant::now();
    let res = tokio::time::timeout(
        ttl + slack() * 2,
        a.lock(name.as_str(), &plain(ttl).wait_timeout(ttl + slack())),
    )
    .await;
    let took = started.elapsed();
    let lost = disarm(&ps);
    if lost == 0 {
        return Err(format!(
            "no reply was lost (the acquire carried no {name:?}?): the fault was not applied"
        ));
    }
    let gave_up = match res {
        Ok(Ok(ga)) => {
            cell.note = format!(
                "acquire reply lost (reset): lock() retried and won after {:.0} ms (TTL {:.0} ms);",
                took.as_secs_f64() * 1000.0,
                ttl.as_secs_f64() * 1000.0
            );
            if took > ttl / 2 {
                cell.count("waited_on_own_grant", 1);
                cell.note
                    .push_str(" the retry waited for its own lost grant to expire;");
            }
            // Exclusion: nobody else gets it while the retried grant is valid.
            match b.try_lock(name.as_str(), &plain(t.ttl)).await {
                Ok(Some(g)) => {
                    if ga.is_valid() {
                        cell.count("double_holders", 1);
                        cell.note
                            .push_str(" another client won while the retry's guard was valid;");
                    }
                    g.release().await.ok();
                }
                Ok(None) => {}
                Err(e) => cell
                    .note
                    .push_str(&format!(" second client's try_lock: {e};")),
            }
            if let Err(e) = ga.release().await {
                cell.note.push_str(&format!(" release: {e};"));
            }
            now()
        }
        Ok(Err(e)) => {
            cell.note = format!(
                "acquire reply lost (reset): lock() gave up after {:.0} ms: {e};",
                took.as_secs_f64() * 1000.0
            );
            cell.count("waited_on_own_grant", 1);
            now()
        }
        Err(_) => {
            cell.count("waited_on_own_grant", 1);
            cell.note = "acquire reply lost (reset): lock() hung past its deadline;".into();
            now()
        }
    };
    // Nothing left behind: another client gets the lock within the TTL (a grant nobody knows
    // of expires by then) plus slack, counted from when the first client gave up or released.
    let wait = ttl + slack();
    match wait_win(&b, &name, t.ttl, wait).await {
        Ok((_, at, g)) => {
            cell.next_holder_ms = Some(ms(gave_up, at));
            g.release().await.ok();
        }
        Err(e) => {
            cell.count("left_behind", 1);
            cell.note.push_str(&format!(
                " another client could not lock within TTL + {:.0} ms of the first client's \
                 end: {e};",
                slack().as_secs_f64() * 1000.0
            ));
        }
    }
    Ok(())
}

/// b. The release's reply lost: the lock is free for others within TTL + slack, the client
/// reports it as any release (no panic), and nothing is deleted twice.
pub(crate) async fn lost_release_reply(t: &mut Target, cell: &mut FaultCell) -> R {
    let name = name("lost-release");
    let ttl = t.ttl;
    let (a, ps) = proxied(t).await?;
    let b = connect(t).await?;
    let c = connect(t).await?;
    let ga = a
        .lock(name.as_str(), &plain(ttl).wait_timeout(bound(t)))
        .await
        .map_err(|e| e.to_string())?;
    arm(&ps, &Pick::Matching(name.as_bytes().to_vec()));
    let released = now();
    let res = tokio::time::timeout(bound(t), ga.release()).await;
    cell.note = match &res {
        Ok(Ok(())) => "release reply lost (reset): release() returned Ok;".into(),
        Ok(Err(e)) => format!(
            "release reply lost (reset): release() returned {:?};",
            e.kind()
        ),
        Err(_) => {
            cell.count("release_hung", 1);
            "release reply lost (reset): release() hung past the bound;".into()
        }
    };
    if disarm(&ps) == 0 {
        return Err("no reply was lost: the fault was not applied".into());
    }
    // Free for others within the TTL plus slack.
    let (_, at, gb) = match wait_win(&b, &name, ttl, ttl + slack()).await {
        Ok(w) => w,
        Err(e) => {
            cell.count("left_behind", 1);
            cell.note.push_str(&format!(
                " another client could not lock in TTL + slack: {e};"
            ));
            return Ok(());
        }
    };
    cell.next_holder_ms = Some(ms(released, at));
    // The first client's background work (a retried or re-sent release) has run: the second
    // holder must still hold.
    if tokio::time::timeout(bound(t), a.flush()).await.is_err() {
        cell.note
            .push_str(" the first client's background releases did not finish;");
    }
    let lost_b = watch_lost(gb.lost());
    let stolen = matches!(c.try_lock(name.as_str(), &plain(ttl)).await, Ok(Some(_)));
    let extended = gb.extend(ttl).await;
    if stolen || extended.is_err() || lost_b.get().is_some() {
        cell.count("deleted_twice", 1);
        cell.note.push_str(&format!(
            " the second holder lost its lock after the first client's release (third client \
             won: {stolen}; its extend: {extended:?});"
        ));
    }
    gb.release().await.ok();
    Ok(())
}

/// What picks the extend's request on this backend: the name where the request carries it,
/// else a pattern of the request itself. `ext` is the TTL the extend asks for.
fn extend_pick(kind: Kind, name: &str, ext: Duration) -> Pick {
    match kind {
        // Row-lock extend sets the server-side idle guard on the holding connection, a
        // statement without the name: its bound parameter is `<ttl + 1 s>ms`.
        Kind::Postgres { row_lock: true } => {
            Pick::Matching(format!("{}ms", (ext + Duration::from_secs(1)).as_millis()).into_bytes())
        }
        // MariaDB row-lock: `SET SESSION wait_timeout = <s>`, in clear.
        Kind::MariaDb { row_lock: true } => Pick::Matching(b"wait_timeout".to_vec()),
        _ => Pick::Matching(name.as_bytes().to_vec()),
    }
}

/// c. The extend's reply lost, an extend that *shortens* the lease (the server applied the
/// shorter lease; the client never heard): the holder must never believe in a validity the
/// server does not grant, and must know it lost before another client wins.
pub(crate) async fn lost_extend_reply(
    t: &mut Target,
    caps: &Capabilities,
    cell: &mut FaultCell,
) -> R {
    let name = name("lost-extend");
    // Held for 4 TTLs, then shortened to one: only a client that believes the lost extend was
    // not applied keeps the 4.
    let long = t.ttl * 4;
    // An odd extension (1.237 TTL) so that a pattern of the extend's own parameter is unique.
    let short = t.ttl + t.ttl * 237 / 1000;
    let (a, ps) = proxied(t).await?;
    let b = connect(t).await?;
    let ga = a
        .lock(name.as_str(), &plain(long).wait_timeout(bound(t)))
        .await
        .map_err(|e| e.to_string())?;
    let lost = watch_lost(ga.lost());
    arm(&ps, &extend_pick(t.kind, &name, short));
    let sent = Instant::now();
    let from = now();
    let res = tokio::time::timeout(bound(t), ga.extend(short)).await;
    let lost_replies = disarm(&ps);
    cell.note = match &res {
        Ok(Ok(())) => "shortening extend, reply lost (reset): extend() returned Ok;".into(),
        Ok(Err(e)) => format!(
            "shortening extend, reply lost (reset): extend() returned {:?};",
            e.kind()
        ),
        Err(_) => "shortening extend, reply lost (reset): extend() hung past the bound;".into(),
    };
    if lost_replies == 0 {
        ga.abandon();
        return Err("no reply was lost: the fault was not applied".into());
    }
    // What the guard believes against the lease asked for (applied, if the picked request was
    // the one setting it): a diagnostic count; the violation is judged by what the server
    // really keeps, which the second client's win shows (`double_holders` below).
    let server_end = sent + short;
    if caps.expiry_after_ttl && ga.valid_until() > server_end && lost.get().is_none() {
        cell.count("validity_past_requested", 1);
        cell.note.push_str(&format!(
            " the guard stays valid {:.0} ms past the shortened lease;",
            (ga.valid_until() - server_end).as_secs_f64() * 1000.0
        ));
    }
    // Another client waits; whoever the lock goes to next, the holder must know it lost by
    // then. A session-bound lock is kept by the server until the holder gives it up: the holder
    // releases once its guard reads invalid (or is lost), whichever comes first.
    let wait = long + slack();
    let (name2, ttl2) = (name.clone(), t.ttl);
    let bt = tokio::spawn(async move { wait_win(&b, &name2, ttl2, wait).await });
    let invalid = async {
        let until = ga.valid_until();
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {}
            _ = lost.wait(wait) => {}
        }
    };
    let abort = bt.abort_handle();
    tokio::pin!(bt);
    let won = tokio::select! {
        r = &mut bt => Some(r),
        _ = invalid => None,
    };
    // The validity the guard ended with, read before it is given up (a failed extend never
    // moves it).
    let valid_until = ga.valid_until();
    let (won, released_at) = match won {
        Some(r) => {
            ga.abandon();
            (r, None)
        }
        None => {
            let holder_end = now();
            // No winner while the holder believed it held: give it up, and the other wins.
            let _ = tokio::time::timeout(bound(t), ga.release()).await;
            let released_at = now();
            cell.note.push_str(&format!(
                " the holder's guard ended {:.0} ms after the extend;",
                ms(from, holder_end)
            ));
            let r = tokio::time::timeout(wait + slack() * 2, &mut bt).await;
            abort.abort();
            match r {
                Ok(r) => (r, Some(released_at)),
                Err(_) => return Err("the second client hung".into()),
            }
        }
    };
    let (won_at, won_unix, gb) = match won.map_err(|e| e.to_string())? {
        Ok(w) => w,
        Err(e) => {
            cell.count("no_progress", 1);
            cell.note
                .push_str(&format!(" no other client got the lock: {e};"));
            return Ok(());
        }
    };
    cell.next_holder_ms = Some(ms(from, won_unix));
    if let Some(l) = lost.get() {
        cell.detect_ms = Some(ms(from, l));
        cell.margin_ms = Some(ms(l, won_unix));
    }
    // Won before the holder let go (the server freed it behind the holder): the holder must
    // have known it lost by then.
    let knew = lost.get().is_some_and(|l| l <= won_unix);
    let before_release = released_at.is_none_or(|r| won_unix < r);
    if before_release && !knew && valid_until > won_at {
        cell.count("double_holders", 1);
        cell.note.push_str(
            " another client won while the holder's guard still read valid (lost signal not \
             fired);",
        );
    }
    gb.release().await.ok();
    Ok(())
}
