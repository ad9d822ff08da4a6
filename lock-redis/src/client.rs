//! The state a [`RedisBackend`](crate::RedisBackend) and its leases share: the node, the
//! `WAIT` connection, the renewal batch, the peer layout, and the small rules every attempt
//! reads (which keys, which connection, how long a mark or a queue entry lasts).

use std::time::Duration;

use lockcore::backend::AcquireRequest;
use lockcore::{Capabilities, LockMode, LockName};

use crate::batch::Renewals;
use crate::config::Handover;
use crate::conn::Conn;
use crate::interop::Interop;
use crate::keys::Keys;
use crate::linger::Lingering;
use crate::node::{self, Node, Replicas};

pub(crate) struct Inner {
    pub(crate) node: Node,
    /// Only with `min_replicas`: `WAIT` blocks the connection it runs on, so the script + `WAIT`
    /// pipelines of acquisitions and extensions go through this one, never through the node's
    /// command connection (other commands never queue behind a `WAIT`).
    pub(crate) wait_conn: Option<(Conn, Replicas)>,
    /// Single node without `min_replicas`: extends batched into one script call (see
    /// [`batch`]).
    pub(crate) renewals: Option<Renewals>,
    /// The peer whose layout and protocol this client follows (`interop=`), if any.
    pub(crate) interop: Option<Interop>,
    pub(crate) caps: Capabilities,
    pub(crate) describe: String,
    /// The namespace's revocation channel, subscribed (see [`revoked`]): `None` on a cluster,
    /// under `interop=`, or when the subscription failed at connect.
    pub(crate) revocations: Option<node::Waiting>,
    /// Release subscriptions kept a moment after a wait (see [`crate::linger`]).
    pub(crate) lingering: std::sync::Arc<Lingering>,
}

impl Inner {
    /// The keys and channel of `name`: locksmith's own layout, or the peer's under `interop=`.
    pub(crate) fn keys(&self, name: &LockName) -> Keys {
        match self.interop {
            Some(peer) => peer.keys(&self.node.config().namespace, name),
            None => self.node.keys(name),
        }
    }

    /// How long a writer's mark (see `shares`) lasts: past the writer's next attempt, which
    /// comes at a release, at the earliest shared holder's expiry, or at the safety poll (at
    /// most `poll_ms` away), whichever is first.
    pub(crate) fn writer_slack(&self) -> Duration {
        node::writer_mark_ttl(self.node.config().poll)
    }

    /// The TTL of a queue entry for an attempt (see `queue`): a waiting `lock()` joins the
    /// queue, a `try_lock` (zero) does not.
    pub(crate) fn queue_entry(&self, waits: bool) -> Duration {
        if waits {
            node::queue_entry_ttl(self.node.config().poll)
        } else {
            Duration::ZERO
        }
    }

    /// Whether `req` waits in the name's server-side queue: exclusive requests on locksmith's
    /// own layout (a peer's layout under `interop=` has no queue; shares are counted as queued
    /// waiters but take no place in the order).
    pub(crate) fn queues(&self, req: &AcquireRequest) -> bool {
        self.interop.is_none() && req.mode == LockMode::Exclusive
    }

    /// Whether a release of this client grants the lock to the queue's head, and its waiters
    /// ask to be granted it (`handover=grant`; locksmith's own layout without `min_replicas`,
    /// whose grants would not be `WAIT`ed for).
    pub(crate) fn grants(&self) -> bool {
        self.interop.is_none()
            && self.wait_conn.is_none()
            && self.node.config().handover == Handover::Grant
    }

    /// The TTL a release gives the lock it grants to `req`'s waiter: short, so that a waiter
    /// that crashed while queued or once granted holds the name up for this long at most (as
    /// long as a dead queue entry, `queue_entry_ttl`), and longer than the safety poll, which
    /// finds a grant whose message was lost (the waiter's own token holds: a win).
    pub(crate) fn claim(&self, req: &AcquireRequest) -> Duration {
        req.ttl.min(node::queue_entry_ttl(self.node.config().poll))
    }

    /// The connection the exclusive attempts of this client go through (the `WAIT` one with
    /// `min_replicas`): a waiter leaves the queue on it, behind its last attempt.
    pub(crate) fn attempt_conn(&self) -> Conn {
        match &self.wait_conn {
            Some((conn, _)) => conn.clone(),
            None => self.node.conn(),
        }
    }
}
