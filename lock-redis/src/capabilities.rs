//! What a Redis backend declares of the contract ([`Capabilities`]), by its configuration.

use std::time::Duration;

use lockcore::{Capabilities, WaitKind};

use crate::config::Config;
use crate::interop;

/// What every backend built on this crate's scripts declares alike (a single node, Sentinel,
/// Cluster, and Redlock over several masters): waiters woken by release messages, a key that
/// expires after its TTL, `force_release` and `inspect`, no reentrancy, no loss seen before the
/// next renewal, except a revocation where `revocation_pushed` (force_release publishes the
/// revoked tokens on a channel the holder's client listens to): then within a second.
pub fn script_family(revocation_pushed: bool) -> Capabilities {
    let mut c = Capabilities::default();
    c.wait = WaitKind::Notify;
    c.lost_detection = false;
    c.revoke_detection = revocation_pushed;
    // Elsewhere the next renewal finds the key gone (the default).
    if revocation_pushed {
        c.loss_detection = lockcore::LossDetection::Pushed {
            within: Duration::from_secs(1),
        };
    }
    c.reentrant = false;
    c.expiry_after_ttl = true;
    c.force_release = true;
    c.inspect = true;
    c
}

pub(crate) fn for_config(cfg: &Config) -> Capabilities {
    // force_release tells the holder's client on the namespace's revocation channel (a
    // single node's own layout; see `revoked`).
    let mut c = script_family(!cfg.cluster && cfg.interop.is_none());
    c.fencing = true;
    // Exclusive waiters queue on the server (see `queue`); under interop= the peer's
    // layout has no queue, and the interop capabilities say not fair.
    c.fair = true;
    c.min_ttl = Duration::from_millis(1);
    // With min_replicas, shares are acknowledged by replicas as exclusive locks are.
    c.shared = lockcore::Support::Yes;
    c.permits = lockcore::Support::Yes;
    c.notes = vec![
        "fencing tokens are max(last + 1, server TIME in microseconds): they keep increasing \
             across a restart without persistence and across a failover to a replica that missed \
             increments, as long as the servers' clocks do not step back by more than the time \
             between the last grant and the restart (keep them NTP-synced, slewing); a clock set \
             back further can repeat tokens"
            .into(),
        "asynchronous replication: a failover right after an acquire can lose the lock \
             (min_replicas narrows this window with WAIT but does not close it)"
            .into(),
        "a restart without persistence loses every lock: another client can win as soon \
             as the server answers again, while the holder learns of the loss only at its next \
             renewal (within ttl/3 by default, plus a round trip) or when its validity ends \
             (two holders in that window; fencing tokens keep increasing)"
            .into(),
        "fair among exclusive waiters: a server-side queue per name (two sorted sets beside \
             the lock key, entries expiring on the server's clock poll_ms + 2 s after their \
             waiter's last attempt); a free lock goes to the queue's head only, a release names \
             the head and wakes no one else (a hand-over costs the release and one attempt), a \
             try_lock is refused while waiters queue; readers and permits do not queue (a \
             waiting writer's mark keeps readers from starving it); a crashed head holds a free \
             lock up until its entry expires and the next waiter's safety poll; a failover to a \
             replica that missed queue writes may reorder waiters (each re-joins at its next \
             attempt)"
            .into(),
        "lease expiry publishes nothing: the queue's head (shares: one waiter per client) \
             also wakes at the holder's PTTL, and every waiter polls every poll_ms as a safety \
             net for lost messages (the poll also keeps its queue entry alive)"
            .into(),
        "lost leases are detected by the contract (renewal refused, validity deadline), not \
             by the backend; a force_release publishes the owner tokens it took away on the \
             namespace's revocation channel (<namespace>:revoked, subscribed by every client at \
             connect), and their holders' lost signals fire at once (single node only; a notice \
             sent while a client's pub/sub connection is down is lost: its next renewal finds \
             out)"
            .into(),
    ];
    if cfg.cluster {
        c.notes.push(
            "cluster: release notifications use sharded pub/sub (SPUBLISH/SSUBSCRIBE, Redis \
                 7) on the lock's slot, not a broadcast to every node"
                .into(),
        );
    }
    if !cfg.cluster {
        c.compatibility = interop::compatibility();
    }
    match cfg.interop {
        Some(peer) => peer.capabilities(c),
        None => c,
    }
}
