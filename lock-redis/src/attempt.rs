//! One acquire attempt of a [`RedisBackend`](crate::RedisBackend): a share, or the exclusive
//! lock (with the waiters' queue on locksmith's layout, the peer's script under `interop=`, or
//! script and `WAIT` pipelined with `min_replicas`).

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{AcquireRequest, Acquired, ReleaseIfCancelled};
use lockcore::{Instant, LockMode, Result};

use crate::client::Inner;
use crate::conn::Conn;
use crate::exclusive::{Asker, GrantAsk, acquire_queued};
use crate::keys::Keys;
use crate::node::{AcquireWith, NodeAttempt, Replicas};
use crate::queue;
use crate::script::under_replicated;
use crate::shares::{self, ShareAttempt};

pub(crate) enum Attempt {
    Won(Acquired),
    Held {
        pttl: Option<Duration>,
        /// This waiter is the head of the name's queue (see [`queue`]).
        head: bool,
        /// When the refused request was sent: a grant made after it counts from here.
        sent_at: Instant,
    },
}

impl Inner {
    /// One acquire script. Dropped while the script is in flight (a cancelled `lock()`), the
    /// script may still win on the server: the token's lock is then released in the background
    /// (compare-and-delete: it frees nothing that is not this attempt's), so nothing is left
    /// held until its TTL.
    /// `waits`: the attempt belongs to a waiting `lock()`, whose writer marks itself as waiting
    /// behind shared holders (see [`shares`]); a `try_lock` marks nothing. `grant`: the
    /// number of this attempt of a waiter that asks to be granted the lock by a release
    /// (`handover=grant`, see [`Inner::grants`]).
    pub(crate) async fn attempt(
        self: &Arc<Self>,
        req: &AcquireRequest,
        keys: &Keys,
        waits: bool,
        grant: Option<u64>,
    ) -> Result<Attempt> {
        let mut behind = self.lease(req, None);
        behind.behind_attempt = true;
        let in_flight = ReleaseIfCancelled::arm(behind, &req.background);
        let outcome = if req.mode != LockMode::Exclusive {
            // WAIT blocks its connection: with min_replicas, shares go through the WAIT one.
            let (mut conn, replicas) = match &self.wait_conn {
                Some((conn, replicas)) => (conn.clone(), Some(*replicas)),
                None => (self.node.conn(), None),
            };
            let sent_at = Instant::now();
            let token = req.token.to_hex();
            let holder = req.holder.encode();
            let ask = shares::ShareAsk {
                ttl: req.ttl,
                mode: req.mode,
                entry: self.queue_entry(waits),
                fencing: true,
            };
            shares::acquire(&mut conn, keys, &token, &holder, ask, replicas)
                .await
                .map(|attempt| match attempt {
                    ShareAttempt::Won { fence } => {
                        Attempt::Won(Acquired::new(self.won_lease(req, Some(fence)), sent_at))
                    }
                    ShareAttempt::Held { wait } => Attempt::Held {
                        pttl: wait,
                        head: false,
                        sent_at,
                    },
                })
        } else if let Some(wait_conn) = &self.wait_conn {
            self.attempt_with_replicas(req, keys, wait_conn, waits)
                .await
        } else {
            let mut conn = self.node.conn();
            let sent_at = Instant::now();
            self.run_acquire(&mut conn, req, keys, waits, grant)
                .await
                .map(|attempt| self.outcome(req, attempt, sent_at))
        };
        in_flight.disarm();
        outcome
    }

    async fn run_acquire(
        &self,
        conn: &mut Conn,
        req: &AcquireRequest,
        keys: &Keys,
        waits: bool,
        grant: Option<u64>,
    ) -> Result<(NodeAttempt, Option<u64>)> {
        match self.interop {
            Some(peer) => Ok((
                peer.acquire(conn, keys, &peer.owner(&req.token), req.ttl)
                    .await?,
                None,
            )),
            None => {
                let (token, holder) = (req.token.to_hex(), req.holder.encode());
                let mut with = self.exclusive_with(req, waits, None);
                with.grant = grant.filter(|_| waits).map(|attempt| GrantAsk {
                    attempt,
                    claim: self.claim(req),
                });
                acquire_queued(conn, keys, asker(req, &token, &holder), with)
                    .await
                    .map(|(attempt, _, position)| (attempt, position))
            }
        }
    }

    /// What an exclusive attempt on locksmith's layout does besides taking the lock: fencing
    /// when a token is wanted (without one the counter is left alone, three calls fewer);
    /// shared holders hold the name too, and a waiting writer marks itself; a waiting
    /// `lock()` queues.
    fn exclusive_with(
        &self,
        req: &AcquireRequest,
        waits: bool,
        replicas: Option<Replicas>,
    ) -> AcquireWith {
        let slack = if waits {
            self.writer_slack()
        } else {
            Duration::ZERO
        };
        AcquireWith {
            fencing: req.fencing.wanted(),
            replicas,
            beside_shares: Some(slack),
            queue: Some(self.queue_entry(waits)),
            grant: None,
        }
    }

    fn outcome(
        self: &Arc<Self>,
        req: &AcquireRequest,
        (attempt, position): (NodeAttempt, Option<u64>),
        sent_at: Instant,
    ) -> Attempt {
        match attempt {
            NodeAttempt::Won { fence } => {
                Attempt::Won(Acquired::new(self.won_lease(req, fence), sent_at))
            }
            NodeAttempt::Held { pttl } => Attempt::Held {
                pttl,
                head: position == Some(0),
                sent_at,
            },
        }
    }

    async fn attempt_with_replicas(
        self: &Arc<Self>,
        req: &AcquireRequest,
        keys: &Keys,
        (conn, replicas): &(Conn, Replicas),
        waits: bool,
    ) -> Result<Attempt> {
        let sent_at = Instant::now();
        let token = req.token.to_hex();
        // Script and WAIT pipelined: one round trip, no client-side serialisation.
        let holder = req.holder.encode();
        let with = self.exclusive_with(req, waits, Some(*replicas));
        let result =
            acquire_queued(&mut conn.clone(), keys, asker(req, &token, &holder), with).await;
        let err = match result {
            Ok((attempt @ NodeAttempt::Held { .. }, _, position)) => {
                return Ok(self.outcome(req, (attempt, position), sent_at));
            }
            Ok((attempt, Some(n), position)) if n >= i64::from(replicas.count) => {
                return Ok(self.outcome(req, (attempt, position), sent_at));
            }
            Ok((_, acked, _)) => under_replicated("the lock", acked, replicas, "; released it"),
            // Whether the script ran is unknown: release in case it did (owner-checked).
            Err(e) => e,
        };
        // Over the WAIT connection first: a script still queued there (its reply timed out)
        // runs before this release, never after it.
        let released = match queue::release(&mut conn.clone(), keys, &token).await {
            Ok(held) => Ok(held),
            Err(_) => queue::release(&mut self.node.conn(), keys, &token).await,
        };
        if let Err(e) = released {
            tracing::warn!(error = %e, "could not release an under-replicated lock; it frees after its ttl");
        }
        Err(err)
    }
}

/// The asker of `req`, with its token and holder metadata in text.
fn asker<'a>(req: &AcquireRequest, token: &'a str, holder: &'a str) -> Asker<'a> {
    Asker {
        token,
        holder,
        ttl: req.ttl,
    }
}
