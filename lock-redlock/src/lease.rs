//! A held Redlock lease: extend and release on every master, granted by a majority.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_redis::node::{self, Keys};
use lockcore::backend::{Background, Lease, async_trait};
use lockcore::{Error, ErrorKind, Instant, Result};

use crate::backend::Inner;
use crate::quorum::{Undo, majority, unconfirmed};
use crate::subscriptions::release_message;
use crate::sync::lock_mutex;

/// A lock (a writer's, or a reader's share) held on a majority of the masters.
pub(crate) struct RedlockLease {
    pub(crate) inner: Arc<Inner>,
    pub(crate) keys: Arc<Keys>,
    pub(crate) token: Arc<str>,
    pub(crate) background: Background,
    /// The TTL last granted (acquire or extend).
    pub(crate) ttl: Mutex<Duration>,
    /// The validity deadline: sent time of the last granted acquire or extend + its TTL - drift.
    pub(crate) valid_until: Mutex<Instant>,
    /// A reader's share on each master (`LockMode::Shared`), not the lock key.
    pub(crate) shared: bool,
    /// The holder metadata the acquire wrote beside the key (written again by a repair).
    pub(crate) holder: Arc<str>,
    /// By master: whether this lease's key was placed there (won by the acquire, or by a
    /// renewal's repair since). A renewal repairs the hold on the others (see
    /// [`Lease::extend`]); one of these found without the key lost it (revoked, expired early,
    /// restarted empty) and is never taken again.
    pub(crate) placed: Arc<Mutex<Vec<bool>>>,
    /// The owner token's 128 bits, as the masters' revocation notices name it (see
    /// [`RedlockLease::watch_revocations`]).
    pub(crate) token_bits: u128,
}

impl RedlockLease {
    /// Lets every connected master's revocation notice fire `lost` (a `force_release` publishes
    /// on every master; one notice is enough). Undone on drop.
    pub(crate) fn watch_revocations(&self, lost: &lockcore::backend::LostNotifier) {
        for slot in &self.inner.slots {
            if let Some(node) = lock_mutex(&slot.node).as_ref() {
                node.watch_revoked(self.token_bits, lost.clone());
            }
        }
    }
}

impl Drop for RedlockLease {
    fn drop(&mut self) {
        for slot in &self.inner.slots {
            if let Some(node) = lock_mutex(&slot.node).as_ref() {
                node.unwatch_revoked(self.token_bits);
            }
        }
    }
}

impl RedlockLease {
    /// How long a release waits for a majority of confirmations: what is left of the validity
    /// (after it, the keys run out on the masters anyway), at least the per-node timeout of the
    /// lease's TTL. Not the acquire's per-node timeout alone: a release that reached every
    /// master must not be reported failed because one of the three masters holding the lock
    /// answered a few milliseconds late on a busy machine. Each request is also bounded by the
    /// connections' own response timeout.
    pub(crate) fn release_budget(&self) -> Duration {
        let ttl = *lock_mutex(&self.ttl);
        let remaining = lock_mutex(&self.valid_until).saturating_duration_since(Instant::now());
        remaining.max(self.inner.cfg.node_timeout(ttl))
    }
}

impl fmt::Debug for RedlockLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockLease")
            .field("key", &self.keys.lock)
            .field("token", &self.token)
            .finish()
    }
}

pub(crate) fn not_held(confirmed: usize, inner: &Inner) -> Error {
    Error::not_held(format!(
        "only {confirmed} of {} Redis masters still hold this lease, a majority ({}) is needed",
        inner.slots.len(),
        inner.quorum
    ))
}

#[async_trait]
impl Lease for RedlockLease {
    fn fencing_token(&self) -> Option<u64> {
        None
    }

    /// Compare-and-`PEXPIRE` (a reader: compare-and-extend of its share) on every master at
    /// once; granted when a majority confirmed within the validity recomputed from when it was
    /// sent (awaited that long), exactly as for a writer.
    ///
    /// Repair: on a master where the acquire did not place the key (its vote there lost a
    /// split, or the answer came too late) and the renewal finds none, the key is taken there
    /// now if that master has the name free (`SET NX`; the waiters' queue is not consulted:
    /// the lock is this holder's on a majority already), and counts as a confirmation.
    /// So a lock that stood on exactly a majority spreads to every master that answers, and
    /// losing one master later does not end it. A master where the key was placed and is now
    /// missing is never taken again: the key was revoked or lost there, and taking it back
    /// could undo a `force_release`. The masters never placed are a minority, so a repair
    /// alone never makes a majority. A renewal that fails undoes the repairs of its round
    /// (an owner-checked delete, announced to the waiters there), also those that land after
    /// the failure is known: a renewal in flight at a `force_release` must not leave the lost
    /// lease's key on masters that never had it, holding the name there until its TTL.
    ///
    /// Cancel safety: dropping the future may have extended the lease on some masters; it stays
    /// owner-checked.
    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        let inner = &self.inner;
        let sent_at = Instant::now();
        let drift = inner.caps.drift_margin(ttl);
        // A confirmation counts until the new validity ends (it is computed from the send
        // time), not only within the acquire's per-node timeout: one master answering late on
        // a busy machine must not fail a renewal the others confirmed.
        let budget = ttl.saturating_sub(drift).max(inner.cfg.node_timeout(ttl));
        let round = Arc::new(Mutex::new(RepairRound::default()));
        let pending = {
            let (keys, token, shared) = (self.keys.clone(), self.token.clone(), self.shared);
            let (holder, placed) = (self.holder.clone(), self.placed.clone());
            let was_placed = lock_mutex(&self.placed).clone();
            let (inner, round) = (self.inner.clone(), round.clone());
            self.inner.per_node(budget, move |i, mut c| {
                let (keys, token, holder) = (keys.clone(), token.clone(), holder.clone());
                let (placed, repairs) = (placed.clone(), !was_placed[i]);
                let (inner, round) = (inner.clone(), round.clone());
                async move {
                    let extended = if shared {
                        node::extend_share(&mut c, &keys, &token, ttl).await?
                    } else {
                        node::extend(&mut c, &keys, &token, ttl).await?
                    };
                    if extended {
                        // Its key is there (a late vote of the acquire's, say): from now on,
                        // missing there means lost there.
                        if repairs {
                            lock_mutex(&placed)[i] = true;
                        }
                        return Ok(true);
                    }
                    if !repairs {
                        return Ok(false);
                    }
                    let repaired = repair(&mut c, &keys, &token, &holder, ttl, shared).await?;
                    if !repaired {
                        return Ok(false);
                    }
                    let failed = {
                        let mut round = lock_mutex(&round);
                        if !round.failed {
                            round.repaired.push(i);
                            lock_mutex(&placed)[i] = true;
                        }
                        round.failed
                    };
                    if failed {
                        // The round failed before this repair landed: undo it here.
                        inner
                            .undo(keys, token, vec![i], (Undo::Release, shared), ttl)
                            .await;
                    }
                    Ok(!failed)
                }
            })
        };
        let result = match majority(inner, pending, &self.background).await {
            Ok(()) if sent_at.elapsed() + drift < ttl => {
                *lock_mutex(&self.ttl) = ttl;
                *lock_mutex(&self.valid_until) = sent_at + ttl - drift;
                return Ok(ttl);
            }
            Ok(()) => Err(Error::new(
                ErrorKind::Unavailable,
                "the renewal reached a majority only after its validity had passed",
            )),
            Err((yes, no, errors)) => {
                if inner.slots.len() - no < inner.quorum {
                    Err(not_held(yes, inner))
                } else {
                    Err(unconfirmed(inner, yes, no, errors))
                }
            }
        };
        self.undo_repairs(&round, ttl);
        result
    }

    /// Compare-and-delete (a reader: compare-and-remove of its share), publishing to the
    /// waiters (with `handover=grant`, a writer's release on each master grants the lock to
    /// that master's queue head when its vote asked for it), on every master at once; released when a majority confirmed (the others finish in the background), awaited until the lease's
    /// validity ends (at least one node timeout), see [`RedlockLease::release_budget`].
    ///
    /// Cancel safety: dropping the future may leave the lock held on some masters until its TTL
    /// runs out.
    async fn release(&self) -> Result<()> {
        let inner = &self.inner;
        let pending = {
            let (keys, token, shared) = (self.keys.clone(), self.token.clone(), self.shared);
            let message: Arc<str> = release_message().into();
            let grant = inner.cfg.handover == lock_redis::Handover::Grant;
            inner.per_node(self.release_budget(), move |_, mut c| {
                let (keys, token, message) = (keys.clone(), token.clone(), message.clone());
                async move {
                    if shared {
                        node::release_share_announced(&mut c, &keys, &token, &message).await
                    } else {
                        node::release_announced_granting(&mut c, &keys, &token, &message, grant)
                            .await
                    }
                }
            })
        };
        match majority(inner, pending, &self.background).await {
            Ok(()) => Ok(()),
            Err((yes, no, errors)) => {
                if inner.slots.len() - no < inner.quorum {
                    Err(not_held(yes, inner))
                } else {
                    Err(unconfirmed(inner, yes, no, errors))
                }
            }
        }
    }
}

/// The repairs of one renewal ([`Lease::extend`]): undone when it fails.
#[derive(Default)]
struct RepairRound {
    /// The renewal failed: a repair landing from now on undoes itself.
    failed: bool,
    /// The masters repaired before it was known to fail.
    repaired: Vec<usize>,
}

impl RedlockLease {
    /// A renewal failed: its round's repairs are undone in the background (and marked never
    /// placed again), and a repair still in flight undoes itself when it lands.
    fn undo_repairs(&self, round: &Mutex<RepairRound>, ttl: Duration) {
        let targets = {
            let mut round = lock_mutex(round);
            round.failed = true;
            std::mem::take(&mut round.repaired)
        };
        if targets.is_empty() {
            return;
        }
        {
            let mut placed = lock_mutex(&self.placed);
            for &i in &targets {
                placed[i] = false;
            }
        }
        let undo = self.inner.clone().undo(
            self.keys.clone(),
            self.token.clone(),
            targets,
            (Undo::Release, self.shared),
            ttl,
        );
        self.background.spawn(undo);
    }
}

/// Takes the key (a reader: its share) of a held lease on one master that does not have it,
/// if the name is free there: see [`Lease::extend`]. Returns whether it took it.
async fn repair(
    c: &mut node::Conn,
    keys: &Keys,
    token: &str,
    holder: &str,
    ttl: Duration,
    shared: bool,
) -> Result<bool> {
    let attempt = if shared {
        node::acquire_share(c, keys, token, holder, ttl, Duration::ZERO).await?
    } else {
        // The bare script: no fencing counter (the masters keep none), no queue, no readers'
        // check (readers cannot hold a majority beside this writer's: a share found there is
        // a losing vote's, about to be undone).
        node::acquire(c, keys, token, holder, ttl, false).await?
    };
    Ok(matches!(attempt, node::NodeAttempt::Won { .. }))
}
