//! The faults of the matrix (names and what each checks) and [`run_fault`], which picks the
//! scenario a fault runs on a topology, or why it does not apply there.

use conformance::{FaultCell, FaultOutcome};

use crate::generic::{
    holder_kill, holder_pause, leader_loss, partition, quorum_loss, server_restart, slow_replies,
};
use crate::held::Held;
use crate::redis::{clock_jump, master_paused_on_three, node_restart_empty, sentinel_failover};
use crate::support::connect;
use crate::target::{Kind, Target};
use crate::{cut_member, lost_replies};

/// One fault of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The holder process is SIGKILLed.
    HolderKill,
    /// The holder process is SIGSTOPped past its TTL, then resumed.
    HolderPause,
    /// [`Fault::HolderKill`] of a reader (a shared hold); a writer waits.
    ReaderKill,
    /// [`Fault::HolderPause`] of a reader; a writer takes over.
    ReaderPause,
    /// [`Fault::HolderKill`] of one of two permits, the other held by a live client; a third
    /// client waits for a permit.
    PermitKill,
    /// [`Fault::HolderPause`] of one of two permits, the other held by a live client.
    PermitPause,
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
    /// One Redlock master paused while a renewing lock stands on exactly three of five: its
    /// renewals have repaired it onto the other two, so the pause changes nothing.
    MasterPausedOnThree,
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
    pub const ALL: [Fault; 19] = [
        Fault::HolderKill,
        Fault::HolderPause,
        Fault::ReaderKill,
        Fault::ReaderPause,
        Fault::PermitKill,
        Fault::PermitPause,
        Fault::ServerRestart,
        Fault::Partition,
        Fault::LeaderLoss,
        Fault::SlowReplies,
        Fault::QuorumLoss,
        Fault::NodeRestartEmpty,
        Fault::MasterPausedOnThree,
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
            Fault::ReaderKill => "reader_kill",
            Fault::ReaderPause => "reader_pause",
            Fault::PermitKill => "permit_kill",
            Fault::PermitPause => "permit_pause",
            Fault::ServerRestart => "server_restart",
            Fault::Partition => "partition",
            Fault::LeaderLoss => "leader_loss",
            Fault::SlowReplies => "slow_replies",
            Fault::QuorumLoss => "quorum_loss",
            Fault::NodeRestartEmpty => "node_restart_empty",
            Fault::MasterPausedOnThree => "master_paused_on_three",
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
            Fault::ReaderKill => {
                "holder_kill of a reader (a shared hold): a waiting writer gets the lock only \
                 after the dead reader's validity (lease backends) or its session's end; its \
                 token is larger"
            }
            Fault::ReaderPause => {
                "holder_pause of a reader: a writer proceeds after the reader's TTL; the fenced \
                 resource rejects the resumed reader's stale access; its lost signal has fired \
                 when its next extend returns"
            }
            Fault::PermitKill => {
                "holder_kill of one of 2 permits, the other held live: a third client gets a \
                 permit only after the dead holder's validity (never sooner: never 3 holders), \
                 or its session's end"
            }
            Fault::PermitPause => {
                "holder_pause of one of 2 permits, the other held live: a third client gets the \
                 stopped holder's permit after its TTL; the resumed holder's stale write is \
                 rejected by token; its lost signal has fired when its next extend returns"
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
            Fault::MasterPausedOnThree => {
                "Redlock: a renewing lock standing on exactly 3 of 5 masters (2 down at \
                 acquire, then back empty) is repaired onto the 2 by its renewals; one of its 3 \
                 is then SIGSTOPped for 3 TTLs: the holder keeps the lock (no lost signal, still \
                 valid) and no other client wins"
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
                 syncLimit x tick + session timeout; etcd: 5 election timeouts, require-leader streams) \
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
        Fault::HolderKill => holder_kill(target, &caps, &mut cell, Held::Exclusive).await,
        Fault::HolderPause if matches!(target.kind, Kind::Sentinel { .. }) => {
            return sentinel_only(cell);
        }
        Fault::HolderPause => holder_pause(target, &caps, &mut cell, Held::Exclusive).await,
        Fault::ReaderKill | Fault::ReaderPause | Fault::PermitKill | Fault::PermitPause => {
            if matches!(target.kind, Kind::Sentinel { .. }) {
                return sentinel_only(cell);
            }
            let held = match fault {
                Fault::ReaderKill | Fault::ReaderPause => Held::Reader,
                _ => Held::Permit,
            };
            if let Some(why) = held.support(&caps).why_not() {
                return cell.not_applicable(format!("not declared by this backend: {why}"));
            }
            if matches!(fault, Fault::ReaderKill | Fault::PermitKill) {
                holder_kill(target, &caps, &mut cell, held).await
            } else {
                holder_pause(target, &caps, &mut cell, held).await
            }
        }
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
        Fault::MasterPausedOnThree => match target.kind {
            Kind::Redlock => master_paused_on_three(target, &mut cell).await,
            Kind::Sentinel { .. } => return sentinel_only(cell),
            _ => {
                return cell.not_applicable(
                    "Redlock only: a lock standing on a bare majority of independent masters \
                     (one member paused elsewhere: quorum_loss, leader_loss)",
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
                        lost_replies::lost_acquire_reply(target, &mut cell).await
                    }
                    Fault::LostReleaseReply => {
                        lost_replies::lost_release_reply(target, &mut cell).await
                    }
                    _ => lost_replies::lost_extend_reply(target, &caps, &mut cell).await,
                },
            }
        }
        Fault::CutMemberWaiter | Fault::CutMemberHolder => match target.kind {
            Kind::ZooKeeper | Kind::Etcd if fault == Fault::CutMemberWaiter => {
                cut_member::cut_member_waiter(target, &mut cell).await
            }
            Kind::ZooKeeper | Kind::Etcd => cut_member::cut_member_holder(target, &mut cell).await,
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
    "not_repaired",
    "lost_with_a_minority_paused",
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
