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
    /// Members of a quorum topology killed: a minority (still locks), then a majority
    /// (`lock()` fails by its deadline, nothing granted), then restarted (locks again).
    QuorumLoss,
    /// One Redlock master restarted empty while a lock is held on exactly a majority.
    NodeRestartEmpty,
    /// A server's clock running fast, simulated by shortening the lock key's TTL (`PEXPIRE`).
    ClockJump,
    /// The acquire's reply lost (applied by the server, the client's connection reset).
    LostAcquireReply,
    /// The release's reply lost.
    LostReleaseReply,
    /// The reply of an extend that shortens the lease lost.
    LostExtendReply,
    /// A cluster member cut off from its peers (its clients still reach it) under a waiter
    /// whose session or watch sits on it.
    CutMemberWaiter,
    /// A cluster member cut off from its peers under a holder whose session or keep-alive
    /// stream sits on it.
    CutMemberHolder,
}

impl Fault {
    /// Every fault, in report order.
    pub const ALL: [Fault; 14] = [
        Fault::HolderKill,
        Fault::HolderPause,
        Fault::ServerRestart,
        Fault::Partition,
        Fault::LeaderLoss,
        Fault::SlowReplies,
        Fault::QuorumLoss,
        Fault::NodeRestartEmpty,
        Fault::ClockJump,
        Fault::LostAcquireReply,
        Fault::LostReleaseReply,
        Fault::LostExtendReply,
        Fault::CutMemberWaiter,
        Fault::CutMemberHolder,
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
            Fault::QuorumLoss => "quorum_loss",
            Fault::NodeRestartEmpty => "node_restart_empty",
            Fault::ClockJump => "clock_jump",
            Fault::LostAcquireReply => "lost_acquire_reply",
            Fault::LostReleaseReply => "lost_release_reply",
            Fault::LostExtendReply => "lost_extend_reply",
            Fault::CutMemberWaiter => "cut_member_waiter",
            Fault::CutMemberHolder => "cut_member_holder",
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
                "reply latency beyond the TTL: a grant arriving after its TTL is no lock, and \
                 try_lock returns within 6 TTL + 2 s; latency of TTL/4: the grant is given and \
                 its validity counts from when the request was sent"
            }
            Fault::QuorumLoss => {
                "members of a quorum topology killed -9: with a minority down the lock still \
                 works and excludes; with a majority down lock() fails by its deadline (no \
                 hang, nothing granted); restarted, the same client locks again"
            }
            Fault::NodeRestartEmpty => {
                "Redlock: a lock held on exactly 3 of 5 masters (2 down at acquire), the 2 come \
                 back and one of the holder's 3 restarts empty: a second client wins while the \
                 holder still believes it holds (double holders counted)"
            }
            Fault::ClockJump => {
                "a server's clock jumping forward, simulated by PEXPIRE of the lock key (Redlock: \
                 on one of exactly 3 masters holding it): another client wins while the holder \
                 believes it holds, until its next renewal (double holders, detection time)"
            }
            Fault::LostAcquireReply => {
                "the acquire applied by the server, its reply lost (connection reset): lock()'s \
                 own retry wins without waiting for its own grant to expire (within half the \
                 TTL), no other client holds meanwhile, and after the release another client \
                 locks within the TTL + slack (no orphan grant)"
            }
            Fault::LostReleaseReply => {
                "the release applied, its reply lost (connection reset): release() returns \
                 (Ok or an error, no hang), another client locks within the TTL + slack, and \
                 keeps its lock once the first client's background work is done (nothing \
                 deleted twice)"
            }
            Fault::LostExtendReply => {
                "an extend shortening the lease (4 TTL to 1.24 TTL) applied, its reply lost: \
                 the guard never reads valid past the lease the server keeps, and the lost \
                 signal fires before another client wins"
            }
            Fault::CutMemberWaiter => {
                "a follower cut off from its peers (its client port reachable) while a waiter's \
                 session/watch sits on it; the holder releases through a healthy member: the \
                 waiter gets the lock within the bound of the backend's design (ZooKeeper: \
                 syncLimit x tick + session timeout; etcd: 3 election timeouts, require-leader) \
                 + slack"
            }
            Fault::CutMemberHolder => {
                "a follower cut off from its peers (its client port reachable) under a renewing \
                 holder whose session/keep-alive stream sits on it (its only endpoint): its lost \
                 signal fires before a client of the healthy majority wins (margin)"
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
            Kind::ZooKeeper | Kind::Etcd => leader_loss(target, &mut cell).await,
            Kind::Redlock => {
                return cell.not_applicable(
                    "independent masters: no leader or primary to lose (masters down: \
                     quorum_loss)",
                );
            }
            _ => {
                return cell.not_applicable("a single server: no leader or primary to lose");
            }
        },
        Fault::QuorumLoss => match target.kind {
            Kind::ZooKeeper | Kind::Etcd | Kind::Redlock => quorum_loss(target, &mut cell).await,
            Kind::Sentinel { .. } => return sentinel_only(cell),
            _ => return cell.not_applicable("a single server: no quorum (server_restart)"),
        },
        Fault::NodeRestartEmpty => match target.kind {
            Kind::Redlock => node_restart_empty(target, &mut cell).await,
            Kind::Redis => {
                return cell.not_applicable(
                    "one node: its empty restart is server_restart (Redis keeps no data there)",
                );
            }
            Kind::Etcd => {
                return cell.not_applicable(
                    "an etcd member cannot rejoin its cluster without its data (it needs a \
                     member remove/add); restarts with data: server_restart",
                );
            }
            Kind::ZooKeeper => {
                return cell.not_applicable(
                    "not run: a ZooKeeper member restarted empty syncs from the leader before \
                     it serves; restarts with data: server_restart",
                );
            }
            Kind::Sentinel { .. } => return sentinel_only(cell),
            _ => {
                return cell.not_applicable(
                    "a single server that keeps its data: restarts are server_restart",
                );
            }
        },
        Fault::ClockJump => match target.kind {
            Kind::Redis | Kind::Redlock => clock_jump(target, &mut cell).await,
            Kind::Sentinel { .. } => return sentinel_only(cell),
            Kind::Sqlite => {
                return cell.not_applicable(
                    "no server clock: the lease deadline is written by the clients (one host)",
                );
            }
            _ => {
                return cell.not_applicable(
                    "not simulated: this server's lease deadline is not a key TTL that can be \
                     shortened, and libfaketime cannot move its clock (Go, JVM)",
                );
            }
        },
        Fault::LostAcquireReply | Fault::LostReleaseReply | Fault::LostExtendReply => {
            match target.kind {
                Kind::Sentinel { .. } => return sentinel_only(cell),
                Kind::Sqlite => {
                    return cell.not_applicable("no network: SQLite is a file on this host");
                }
                _ => match fault {
                    Fault::LostAcquireReply => {
                        crate::lost_replies::lost_acquire_reply(target, &mut cell).await
                    }
                    Fault::LostReleaseReply => {
                        crate::lost_replies::lost_release_reply(target, &mut cell).await
                    }
                    _ => crate::lost_replies::lost_extend_reply(target, &caps, &mut cell).await,
                },
            }
        }
        Fault::CutMemberWaiter | Fault::CutMemberHolder => match target.kind {
            Kind::ZooKeeper | Kind::Etcd if fault == Fault::CutMemberWaiter => {
                crate::cut_member::cut_member_waiter(target, &mut cell).await
            }
            Kind::ZooKeeper | Kind::Etcd => {
                crate::cut_member::cut_member_holder(target, &mut cell).await
            }
            Kind::Redlock => {
                return cell.not_applicable(
                    "independent masters: no peers to be cut off from (a master cut off from \
                     its clients: partition)",
                );
            }
            Kind::Sentinel { .. } => return sentinel_only(cell),
            _ => {
                return cell.not_applicable(
                    "a single server: no peers to be cut off from (partition cuts it off from \
                     its clients)",
                );
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
    "minority_lock_failed",
    "granted_without_quorum",
    "hung_past_deadline",
    "refused_under_moderate_latency",
    "waited_on_own_grant",
    "left_behind",
    "release_hung",
    "deleted_twice",
    "waiter_past_bound",
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

pub(crate) type R = Result<(), String>;

pub(crate) fn scale() -> f64 {
    conformance::time_scale()
}

pub(crate) fn name(fault: &str) -> String {
    format!("fault-{fault}-{:08x}", fastrand::u32(..))
}

pub(crate) fn ms(from_us: u64, to_us: u64) -> f64 {
    (to_us as f64 - from_us as f64) / 1000.0
}

pub(crate) async fn connect_url(url: &str) -> Result<Locker, String> {
    locksmith::connect(url).await.map_err(|e| e.to_string())
}

pub(crate) async fn connect(t: &Target) -> Result<Locker, String> {
    connect_url(&t.url()).await
}

fn renewing(ttl: Duration) -> LockOptions {
    LockOptions::new()
        .ttl(ttl)
        .auto_renew(AutoRenew::until(Duration::from_secs(600)))
}

/// A bound generous enough for session ends, server-side guards (row-lock: TTL + 1 s) and a
/// noisy machine.
pub(crate) fn bound(t: &Target) -> Duration {
    bound_for(t.ttl)
}

fn bound_for(ttl: Duration) -> Duration {
    (ttl * 8 + Duration::from_secs(5)).mul_f64(scale())
}

/// When a lost signal fired (unix µs), awaitable.
pub(crate) struct LostAt(tokio::sync::watch::Receiver<Option<u64>>);

impl LostAt {
    /// When it fired, if it has.
    pub(crate) fn get(&self) -> Option<u64> {
        *self.0.borrow()
    }

    /// Waits up to `d` for it to fire; when it fired, if it has.
    pub(crate) async fn wait(&self, d: Duration) -> Option<u64> {
        let mut rx = self.0.clone();
        let _ = tokio::time::timeout(d, rx.wait_for(|v| v.is_some())).await;
        self.get()
    }
}

/// Records when a lost signal fires.
pub(crate) fn watch_lost(sig: LostSignal) -> LostAt {
    let (tx, rx) = tokio::sync::watch::channel(None);
    tokio::spawn(async move {
        sig.lost().await;
        let _ = tx.send(Some(now()));
    });
    LostAt(rx)
}

/// Awaits a spawned task for at most `d` (aborting it then): a scenario fails rather than
/// hangs.
async fn join<T>(what: &str, d: Duration, task: tokio::task::JoinHandle<T>) -> Result<T, String> {
    let abort = task.abort_handle();
    match tokio::time::timeout(d, task).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => {
            abort.abort();
            Err(format!("{what}: no result in {d:?}"))
        }
    }
}

/// A lock won by a waiting client: when and with which token.
struct Won {
    at: u64,
    fence: Option<u64>,
    guard: LockGuard,
}

/// A client waiting for a lock in a task of its own.
struct Waiter {
    task: tokio::task::JoinHandle<Result<Won, String>>,
    busy: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Waiter {
    /// Returns once the waiter has found the lock busy and started its `lock()` (or has
    /// already won or failed), at most after `d`: the fault that follows hits a waiting client.
    async fn waiting(&mut self, d: Duration) {
        if let Some(rx) = self.busy.take() {
            let _ = tokio::time::timeout(d, rx).await;
        }
    }

    /// Its result, within `d`.
    async fn result(self, d: Duration) -> Result<Result<Won, String>, String> {
        join("waiter", d, self.task).await
    }
}

/// Spawns a client that waits for `name` up to the options' wait timeout: one `try_lock`
/// (which must find it busy: that is the moment [`Waiter::waiting`] returns), then `lock()`.
fn waiter(locker: Locker, name: String, opts: LockOptions) -> Waiter {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let g = match locker.try_lock(name.as_str(), &opts).await {
            Ok(Some(g)) => g,
            _ => {
                let _ = tx.send(());
                locker
                    .lock(name.as_str(), &opts)
                    .await
                    .map_err(|e| format!("waiter: {e}"))?
            }
        };
        let at = now();
        Ok(Won {
            at,
            fence: g.fencing_token(),
            guard: g,
        })
    });
    Waiter {
        task,
        busy: Some(rx),
    }
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

// ------------------------------------------------------------------------------ partition

/// One proxy per endpoint of the target, and the URL through them.
pub(crate) async fn proxies(t: &Target) -> Result<(Vec<Proxy>, String), String> {
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

// ------------------------------------------------------------------------------ leader loss

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
async fn leader_loss(t: &mut Target, cell: &mut FaultCell) -> R {
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

/// Redis primary + replica + 3 sentinels. The replica is cut off from the primary (stopped,
/// and its link dropped by the primary), a client locks (asynchronous replication: only the primary has
/// the key), the primary is stopped, the sentinels promote the replica, and a second client
/// tries the lock. With `min_replicas` the grant needs the replica's acknowledgement, which the
/// cut-off replica cannot give: the grant is refused, so nothing can be lost.
async fn sentinel_failover(t: &mut Target, cell: &mut FaultCell) -> R {
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

// ------------------------------------------------------------------------------ quorum loss

async fn quorum_loss(t: &mut Target, cell: &mut FaultCell) -> R {
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

// ------------------------------------------------------------------------------ redis nodes

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

async fn node_restart_empty(t: &mut Target, cell: &mut FaultCell) -> R {
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

async fn clock_jump(t: &mut Target, cell: &mut FaultCell) -> R {
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
