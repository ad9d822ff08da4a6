//! The fault scenarios, each written once over a [`Target`]'s URL.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::{FaultCell, FaultOutcome};
use faultkit::{
    Direction, FencedResource, Holder, HolderSpec, Proxy, ProxyMode, now_unix_micros as now,
    rewrite_url,
};
use locksmith::{AutoRenew, Capabilities, LockGuard, LockOptions, Locker, LostSignal};

use crate::target::{Kind, Target, Topo};

/// One fault of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The holder process is SIGKILLed.
    HolderKill,
    /// The holder process is SIGSTOPped past its TTL, then resumed.
    HolderPause,
    /// The server (every member) is killed -9 and restarted; Redis comes back empty.
    ServerRestart,
    /// The holder is cut off from the service (proxy blackhole) past its TTL/session.
    Partition,
    /// The leader or primary is lost during contention.
    LeaderLoss,
    /// Replies are delayed: beyond the TTL, and by a quarter of it.
    SlowReplies,
}

impl Fault {
    /// Every fault, in report order.
    pub const ALL: [Fault; 6] = [
        Fault::HolderKill,
        Fault::HolderPause,
        Fault::ServerRestart,
        Fault::Partition,
        Fault::LeaderLoss,
        Fault::SlowReplies,
    ];

    /// Its stable name.
    pub fn name(self) -> &'static str {
        match self {
            Fault::HolderKill => "holder_kill",
            Fault::HolderPause => "holder_pause",
            Fault::ServerRestart => "server_restart",
            Fault::Partition => "partition",
            Fault::LeaderLoss => "leader_loss",
            Fault::SlowReplies => "slow_replies",
        }
    }

    /// What is done and what is checked.
    pub fn summary(self) -> &'static str {
        match self {
            Fault::HolderKill => {
                "holder process SIGKILLed: a waiting client gets the lock after the holder's \
                 validity (lease backends) or when its session/connection ends; its token is larger"
            }
            Fault::HolderPause => {
                "holder process SIGSTOPped between a lease check and a write, past its TTL, then \
                 resumed: another client proceeds; the fenced resource rejects the stale write; \
                 the lost signal has fired when the resumed holder's next extend returns"
            }
            Fault::ServerRestart => {
                "every server killed -9 and restarted (Redis: empty, no persistence) under a \
                 holder and a waiter: no two holders, tokens never go backwards, the waiter is \
                 woken, the same client locks again"
            }
            Fault::Partition => {
                "holder cut off by a proxy blackhole past its TTL/session while another client \
                 waits: the holder's lost signal fires before the other client wins (margin); \
                 after healing the same client locks again"
            }
            Fault::LeaderLoss => {
                "leader/primary killed during contention (ZooKeeper leader, Redis primary with \
                 sentinel failover): double holders counted, progress resumes"
            }
            Fault::SlowReplies => {
                "reply latency beyond the TTL: a grant arriving after its TTL is no lock; \
                 latency of TTL/4: validity counts from when the request was sent"
            }
        }
    }
}

/// Runs `fault` against `target` and returns its cell.
///
/// Cancel safety: dropping the future kills its holder processes; locks expire by their TTL.
pub async fn run_fault(target: &mut Target, fault: Fault) -> FaultCell {
    let mut cell = FaultCell::new(&target.label, fault.name());
    let caps = match connect(target).await {
        Ok(l) => l.capabilities().clone(),
        Err(e) => return error(cell, format!("connect: {e}")),
    };
    let res = match fault {
        Fault::HolderKill if matches!(target.kind, Kind::Sentinel { .. }) => {
            return sentinel_only(cell);
        }
        Fault::HolderKill => holder_kill(target, &caps, &mut cell).await,
        Fault::HolderPause if matches!(target.kind, Kind::Sentinel { .. }) => {
            return sentinel_only(cell);
        }
        Fault::HolderPause => holder_pause(target, &caps, &mut cell).await,
        Fault::ServerRestart => match target.kind {
            Kind::Sentinel { .. } => return sentinel_only(cell),
            Kind::Sqlite => {
                return cell.not_applicable("no server: SQLite is a file on this host");
            }
            _ => server_restart(target, &mut cell).await,
        },
        Fault::Partition => match target.kind {
            Kind::Sentinel { .. } => return sentinel_only(cell),
            Kind::Sqlite => {
                return cell.not_applicable("no network: SQLite is a file on this host");
            }
            _ => partition(target, &mut cell).await,
        },
        Fault::LeaderLoss => match target.kind {
            Kind::Sentinel { .. } => sentinel_failover(target, &mut cell).await,
            Kind::ZooKeeper => zk_leader_loss(target, &mut cell).await,
            _ => {
                return cell.not_applicable("a single server: no leader or primary to lose");
            }
        },
        Fault::SlowReplies => match target.kind {
            Kind::Sentinel { .. } => return sentinel_only(cell),
            Kind::Sqlite => {
                return cell.not_applicable("no network: SQLite is a file on this host");
            }
            _ => slow_replies(target, &caps, &mut cell).await,
        },
    };
    match res {
        Ok(()) => {
            if cell.outcome == FaultOutcome::Holds
                && cell
                    .counts
                    .iter()
                    .any(|(k, v)| *v > 0 && VIOLATIONS.contains(&k.as_str()))
            {
                cell.outcome = FaultOutcome::Violation;
            }
            cell
        }
        Err(e) => error(cell, e),
    }
}

/// Counts that make a cell a violation when non-zero.
const VIOLATIONS: &[&str] = &[
    "double_holders",
    "stale_accepted",
    "token_regressions",
    "freed_early",
    "lost_after_other_won",
    "late_grant_valid",
    "validity_past_ttl",
    "extend_succeeded_after_loss",
    "no_progress",
    "waiter_not_woken",
    "relock_failed",
];

fn sentinel_only(cell: FaultCell) -> FaultCell {
    cell.not_applicable(
        "this column is the failover topology only; the Redis protocol's other faults are in \
         the `redis` column",
    )
}

fn error(mut cell: FaultCell, e: impl std::fmt::Display) -> FaultCell {
    cell.outcome = FaultOutcome::Error;
    cell.note = e.to_string();
    cell
}

type R = Result<(), String>;

fn scale() -> f64 {
    conformance::time_scale()
}

fn name(fault: &str) -> String {
    format!("fault-{fault}-{:08x}", fastrand::u32(..))
}

fn ms(from_us: u64, to_us: u64) -> f64 {
    (to_us as f64 - from_us as f64) / 1000.0
}

async fn connect_url(url: &str) -> Result<Locker, String> {
    locksmith::connect(url).await.map_err(|e| e.to_string())
}

async fn connect(t: &Target) -> Result<Locker, String> {
    connect_url(&t.url()).await
}

fn renewing(ttl: Duration) -> LockOptions {
    LockOptions::new()
        .ttl(ttl)
        .auto_renew(AutoRenew::until(Duration::from_secs(600)))
}

/// A bound generous enough for session ends, server-side guards (row-lock: TTL + 1 s) and a
/// noisy machine.
fn bound(t: &Target) -> Duration {
    bound_for(t.ttl)
}

fn bound_for(ttl: Duration) -> Duration {
    (ttl * 8 + Duration::from_secs(5)).mul_f64(scale())
}

/// Records when a lost signal fires (unix µs).
fn watch_lost(sig: LostSignal) -> Arc<Mutex<Option<u64>>> {
    let at = Arc::new(Mutex::new(None));
    let a = at.clone();
    tokio::spawn(async move {
        sig.lost().await;
        *a.lock().unwrap_or_else(|e| e.into_inner()) = Some(now());
    });
    at
}

fn read(at: &Arc<Mutex<Option<u64>>>) -> Option<u64> {
    *at.lock().unwrap_or_else(|e| e.into_inner())
}

/// A lock won by a waiting client: when and with which token.
struct Won {
    at: u64,
    fence: Option<u64>,
    guard: LockGuard,
}

/// Spawns a client that waits for `name` up to `wait`.
fn waiter(
    locker: Locker,
    name: String,
    opts: LockOptions,
) -> tokio::task::JoinHandle<Result<Won, String>> {
    tokio::spawn(async move {
        let g = locker
            .lock(name.as_str(), &opts)
            .await
            .map_err(|e| format!("waiter: {e}"))?;
        let at = now();
        Ok(Won {
            at,
            fence: g.fencing_token(),
            guard: g,
        })
    })
}

fn check_token(cell: &mut FaultCell, before: Option<u64>, after: Option<u64>) {
    if let (Some(b), Some(a)) = (before, after)
        && a <= b
    {
        cell.count("token_regressions", 1);
        cell.note
            .push_str(&format!(" token {a} after {b} (not larger);"));
    }
}

fn holder_spec(t: &Target, name: &str, id: &str) -> HolderSpec {
    let (program, prefix) = crate::holder_command();
    let mut s = HolderSpec::new(program, &t.url(), name, t.ttl);
    s.prefix = prefix;
    s.renew = true;
    s.id = id.to_string();
    s
}

// ------------------------------------------------------------------------------ services

/// What the server-restart and partition scenarios need from a lock service: clients, a client
/// whose link can be cut, and a restart. The real topologies ([`Target`]) and the negative
/// controls' toy service implement it.
#[async_trait::async_trait]
pub trait Service: Send {
    /// The TTL the scenarios use.
    fn ttl(&self) -> Duration;

    /// A new independent client.
    ///
    /// Cancel safe.
    async fn client(&self) -> Result<Locker, String>;

    /// A new client whose link to the service the returned [`Link`] can cut.
    ///
    /// Cancel safe.
    async fn cuttable_client(&self) -> Result<(Locker, Box<dyn Link>), String>;

    /// Kills every server and starts it again; `None` when there is no server.
    ///
    /// Cancel safety: a dropped restart may leave the service stopped.
    async fn restart(&mut self) -> Option<Result<(), String>>;
}

/// A client's link to the service, which can be cut (requests and replies held, as a
/// blackhole) and healed.
pub trait Link: Send + Sync {
    /// Cuts (`true`) or heals (`false`) the link.
    fn cut(&self, cut: bool);
}

struct Proxies(Vec<Proxy>);

impl Link for Proxies {
    fn cut(&self, cut: bool) {
        for p in &self.0 {
            p.set_mode(if cut {
                ProxyMode::Blackhole
            } else {
                ProxyMode::Pass
            });
        }
    }
}

#[async_trait::async_trait]
impl Service for Target {
    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn client(&self) -> Result<Locker, String> {
        connect(self).await
    }

    async fn cuttable_client(&self) -> Result<(Locker, Box<dyn Link>), String> {
        let (ps, url) = proxies(self).await?;
        Ok((connect_url(&url).await?, Box::new(Proxies(ps))))
    }

    async fn restart(&mut self) -> Option<Result<(), String>> {
        Target::restart(self)
            .await
            .map(|r| r.map_err(|e| e.to_string()))
    }
}

// ------------------------------------------------------------------------------ holder kill

async fn holder_kill(t: &mut Target, caps: &Capabilities, cell: &mut FaultCell) -> R {
    let name = name("kill");
    let b = bound(t);
    let mut h = Holder::spawn(&holder_spec(t, &name, "a")).map_err(|e| e.to_string())?;
    let acq = h.wait_for("acquired", b).await.map_err(|e| e.to_string())?;
    let w = connect(t).await?;
    let wait = waiter(
        w,
        name.clone(),
        LockOptions::new().ttl(t.ttl).wait_timeout(b),
    );
    h.kill().await.map_err(|e| e.to_string())?;
    let killed = now();
    let won = wait.await.map_err(|e| e.to_string())??;
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

// ------------------------------------------------------------------------------ holder pause

async fn holder_pause(t: &mut Target, caps: &Capabilities, cell: &mut FaultCell) -> R {
    let name = name("pause");
    let b = bound(t);
    let resource = FencedResource::new();
    let (addr, serve) = resource.serve().await.map_err(|e| e.to_string())?;
    let mut spec = holder_spec(t, &name, "a");
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
        LockOptions::new().ttl(t.ttl).wait_timeout(b),
    )
    .await
    .map_err(|e| e.to_string())?;
    let won = match won {
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

// ------------------------------------------------------------------------------ server restart

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
    let wait = waiter(
        w,
        name.clone(),
        LockOptions::new().ttl(ttl).wait_timeout(b * 2),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let restarted = now();
    svc.restart()
        .await
        .unwrap_or(Ok(()))
        .map_err(|e| format!("restart: {e}"))?;
    // Either the holder learns of a loss, or (data kept) it still holds and releases.
    let deadline = tokio::time::Instant::now() + ttl * 3;
    while read(&lost_at).is_none() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lost = read(&lost_at);
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
    let won = match wait.await.map_err(|e| e.to_string())? {
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

// ------------------------------------------------------------------------------ partition

/// One proxy per endpoint of the target, and the URL through them.
async fn proxies(t: &Target) -> Result<(Vec<Proxy>, String), String> {
    let mut url = t.url();
    let mut ps = Vec::new();
    for port in t.endpoints() {
        let p = Proxy::start(([127, 0, 0, 1], port).into())
            .await
            .map_err(|e| e.to_string())?;
        url = rewrite_url(&url, port, p.port());
        ps.push(p);
    }
    Ok((ps, url))
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
    let wait = waiter(w, name.clone(), LockOptions::new().ttl(ttl).wait_timeout(b));
    tokio::time::sleep(Duration::from_millis(50)).await;
    link.cut(true);
    let cut = now();
    let won = wait.await.map_err(|e| e.to_string())?;
    let won = match won {
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
    let late = tokio::time::Instant::now() + ttl * 2 + Duration::from_secs(1);
    while read(&lost_at).is_none() && tokio::time::Instant::now() < late {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    match read(&lost_at) {
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

// ------------------------------------------------------------------------------ slow replies

async fn slow_replies(t: &mut Target, caps: &Capabilities, cell: &mut FaultCell) -> R {
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
        Err(e) => cell
            .note
            .push_str(&format!(" under TTL/4 reply latency: {e};")),
    }

    // Reply latency beyond the TTL: the grant arrives after it expired.
    for p in &ps {
        p.set_latency(Direction::ToClient, t.ttl + t.ttl / 2);
    }
    let name2 = format!("{name}-late");
    let res = tokio::time::timeout(bound(t), a.try_lock(name2.as_str(), &opts)).await;
    let returned = now();
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
        Err(_) => cell.note.push_str(" late try_lock hung past the bound;"),
    }
    for p in &ps {
        p.set_latency(Direction::ToClient, Duration::ZERO);
    }
    let _ = returned;
    Ok(())
}

// ------------------------------------------------------------------------------ leader loss

/// Who holds now, as the contending clients see it, and the double holders seen.
#[derive(Default)]
struct Contention {
    current: Option<(usize, LostSignal)>,
    double: u64,
    acquisitions: Vec<u64>,
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
    while locksmith::Instant::now() < until {
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

async fn zk_leader_loss(t: &mut Target, cell: &mut FaultCell) -> R {
    let name = name("leader");
    let state = Arc::new(Mutex::new(Contention::default()));
    let run_for = Duration::from_secs(6).mul_f64(scale());
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
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let Topo::ZooKeeper(z) = &mut t.topo else {
        return Err("not a zookeeper ensemble".into());
    };
    let leader = z.leader().await.map_err(|e| e.to_string())?;
    z.member(leader).kill();
    let killed = now();
    for task in tasks {
        let _ = task.await;
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
    let Topo::ZooKeeper(z) = &mut t.topo else {
        unreachable!()
    };
    z.restart(leader, true).await.map_err(|e| e.to_string())?;
    Ok(())
}

async fn sentinel_failover(t: &mut Target, cell: &mut FaultCell) -> R {
    let name = name("failover");
    let url = t.url();
    let a = connect_url(&url).await?;
    let ttl = Duration::from_secs(5);
    let ga = a
        .lock(name.as_str(), &renewing(ttl))
        .await
        .map_err(|e| e.to_string())?;
    let Topo::Sentinel(s) = &mut t.topo else {
        return Err("not a sentinel topology".into());
    };
    // Stop the primary right after the grant: the write may not have reached the replica.
    let old = s.primary().await.map_err(|e| e.to_string())?;
    s.node(old).pause().map_err(|e| e.to_string())?;
    let stopped = now();
    let lost_at = watch_lost(ga.lost());
    let new = s
        .wait_failover(old, Duration::from_secs(30).mul_f64(scale()))
        .await;
    let new = match new {
        Ok(n) => n,
        Err(e) => {
            s.node(old).resume().ok();
            return Err(e.to_string());
        }
    };
    let failed_over = now();
    let b = connect_url(&url).await?;
    let res = b
        .try_lock(name.as_str(), &LockOptions::new().ttl(ttl))
        .await;
    let Topo::Sentinel(s) = &mut t.topo else {
        unreachable!()
    };
    s.node(old).resume().ok();
    cell.note = format!(
        "primary node {old} SIGSTOPped right after the grant; node {new} promoted after {:.0} ms;",
        ms(stopped, failed_over)
    );
    match res {
        Ok(Some(gb)) => {
            let at = now();
            cell.next_holder_ms = Some(ms(stopped, at));
            match read(&lost_at) {
                Some(l) if l <= at => cell.margin_ms = Some(ms(l, at)),
                _ => {
                    cell.count("double_holders", 1);
                    cell.note.push_str(
                        " the lock key was lost in the failover: another client won it while \
                         the first still held it;",
                    );
                }
            }
            gb.release().await.ok();
        }
        Ok(None) => cell
            .note
            .push_str(" the lock survived the failover (the replica had it): no double holder;"),
        Err(e) => cell.note.push_str(&format!(" second client: {e};")),
    }
    drop(ga);
    Ok(())
}
