//! The acquisition recipe: one attempt on every master (undone on failure, and in the
//! background when the call is dropped mid-attempt), and the wait between attempts on release
//! messages, the holder's expiry and split-vote back-off.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures::StreamExt;
use lock_redis::Handover;
use lock_redis::node::{self, ExpiryWatch, GrantAsk, Keys, NodeAttempt};
use lockcore::backend::{
    AcquireRequest, Acquired, Backoff, CancelCleanUp, CleanUpIfCancelled, CleanUpTask,
};
use lockcore::{Error, Instant, LockMode, Result};

use crate::backend::{Inner, RedlockBackend};
use crate::lease::RedlockLease;
use crate::quorum::Undo;
use crate::subscriptions::{NameSubs, SUBSCRIPTION_LINGER, SubsUse, first_of};
use crate::sync::lock_mutex;
use crate::ticket::Ticket;

pub(crate) enum Attempt {
    Won(Acquired),
    Lost {
        /// Some node said "won": a split vote, retried after a random delay.
        split: bool,
        /// When the keys of other holders will have expired on enough nodes for a majority.
        free_in: Option<Duration>,
        /// What a release's grant for this attempt is judged by (a waiting vote that asked
        /// for grants).
        refused: Option<Refused>,
    },
}

/// A waiting vote that lost and asked to be granted the lock (`handover=grant`): what the
/// grants that name it are counted against.
pub(crate) struct Refused {
    /// The vote's number, the same on every master (a grant names it back).
    number: u64,
    /// When the vote was sent: a grant for it was made after this, so the granted key lasts
    /// the claim from here at least (on the master's clock; the drift margin covers the rest).
    sent_at: Instant,
    /// The TTL a release gives the lock it grants for this vote.
    claim: Duration,
    /// By master: the vote was refused there (and so queued this waiter with the grant's
    /// details, and was not undone). Only these masters' grants count: the undo of a vote
    /// whose answer was lost or late may remove a grant that lands before it.
    refused_on: Vec<bool>,
    /// By master: a grant for this vote arrived.
    granted: Vec<bool>,
    /// How long the vote took to be decided: the masters' grants of one release (sent to all
    /// at once) arrive about this far apart at most.
    round_trip: Duration,
    /// When a minority of grants arrived: until when the rest of that release's grants are
    /// waited for before voting.
    grace_until: Option<Instant>,
}

impl Refused {
    fn count(&self) -> usize {
        self.granted.iter().filter(|g| **g).count()
    }
}

impl RedlockBackend {
    /// One attempt, undone with a publishing release when it fails (see `Backend::try_acquire`).
    pub(crate) async fn try_once(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        let keys = Arc::new(Keys::new(&self.inner.cfg.namespace, &req.name));
        let token: Arc<str> = req.token.to_hex().into();
        match self.attempt(req, &keys, &token, None).await? {
            Attempt::Won(a) => Ok(Some(a)),
            Attempt::Lost { .. } => Ok(None),
        }
    }

    /// The lease a majority of grants for the last refused vote `r` gives (`handover=grant`):
    /// each of those masters' releases set this waiter's key after the vote reached it, with
    /// the claim TTL, so the key lasts on a majority until `r.sent_at + claim - drift` on this
    /// client's clock alone. `None` when the lease would not be renewed in the background (its
    /// validity would stay the claim's) or less than a third of the claim is left: the waiter
    /// then votes, which wins on its own keys and extends them to the TTL (one round trip).
    /// The model of `tests/handover_model.rs` checks this rule.
    fn granted(
        &self,
        req: &AcquireRequest,
        keys: &Arc<Keys>,
        token: &Arc<str>,
        r: &Refused,
    ) -> Option<Acquired> {
        if !req.renewed || r.count() < self.inner.quorum {
            return None;
        }
        let inner = &self.inner;
        let valid_until = inner.caps.granted_until(r.sent_at, r.claim)?;
        let lease = RedlockLease {
            inner: inner.clone(),
            keys: keys.clone(),
            token: token.clone(),
            background: req.background.clone(),
            ttl: Mutex::new(r.claim),
            valid_until: Mutex::new(valid_until),
            shared: false,
            holder: req.holder.encode().into(),
            placed: Arc::new(Mutex::new(r.granted.clone())),
            token_bits: req.token.uuid().as_u128(),
        };
        lease.watch_revocations(&req.lost);
        Some(Acquired::new(lease, r.sent_at).with_granted_ttl(r.claim))
    }

    /// The waiting acquisition (see `Backend::acquire` and the crate docs).
    pub(crate) async fn wait_for(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        let keys = Arc::new(Keys::new(&self.inner.cfg.namespace, &req.name));
        let token: Arc<str> = req.token.to_hex().into();
        let mut splits = 0u32;
        let ticket = Arc::new(Ticket::default());
        // handover=grant (exclusive waiters): votes are numbered, the same number on every
        // master, and a release's grant names the vote it came after (see `Refused`). A lease
        // that is not renewed in the background could not hold on a grant (its validity would
        // stay the claim's): it asks for none, and is woken to vote as with handover=wake.
        let asks_grants = self.inner.cfg.handover == Handover::Grant
            && req.mode == LockMode::Exclusive
            && req.renewed;
        let mut votes = 0u64;
        let mut number = move || {
            votes += 1;
            asks_grants.then_some(votes)
        };
        // How many polls' time the entries of the next vote last, and the most the safety vote
        // after it may wait (see `ticket.rs`).
        let mut stretch = 1;
        // Armed before the first attempt, which may queue this waiter on the masters;
        // disarmed when it wins (each winning script took it out of its master's queue; an
        // entry left on a master that voted against it expires by its TTL).
        let in_queue = CleanUpIfCancelled::arm(
            LeaveEverywhere {
                inner: self.inner.clone(),
                keys: keys.clone(),
                token: token.clone(),
                ttl: req.ttl,
            },
            &req.background,
        );
        // A busy name's subscriptions linger from an earlier wait of this client: its first
        // vote can then be the loop's, with this waiter's wake-ups registered before it, and
        // not a vote before subscribing plus one after (the second, by a client that has just
        // released, would be a second chance to barge past the waiter its release woke).
        let lingering = lock_mutex(&self.inner.waits)
            .get(&keys.channel)
            .filter(|e| e.waitings.iter().all(|w| w.get().is_some()))
            .map(|e| e.joined_stretch.load(Ordering::Relaxed));
        // The first vote of a lingering wait (a looping worker's, just after its release)
        // queues at the tail, about where this client's last wait joined: its entries last as
        // many polls as that place called for (see `NameSubs::joined_stretch`), so a waiter
        // far back does not come back for a safety vote after one poll. The vote's answers
        // tell the real place; the safety vote after it comes as soon as either calls for.
        if let Some(s) = lingering {
            stretch = s.clamp(1, crate::ticket::MAX_STRETCH);
        }
        let lingering = lingering.is_some();
        let split = if lingering {
            false
        } else {
            let split = match self
                .attempt(req, &keys, &token, Some((&ticket, stretch, number())))
                .await?
            {
                Attempt::Won(a) => {
                    in_queue.disarm();
                    return Ok(Some(a));
                }
                Attempt::Lost { split, .. } => split,
            };
            stretch = ticket.poll_stretch();
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            split
        };
        let subs = self.subscribe(&keys, req.ttl).await;
        // Where this wait joined the queues, for the next wait of this client (see above).
        let mut joined = false;
        let mut note_join = |stretch: u32| {
            if !joined {
                subs.0.joined_stretch.store(stretch, Ordering::Relaxed);
                joined = true;
            }
        };
        if !lingering {
            note_join(stretch);
        }
        let poll = self.inner.cfg.poll;
        // When to vote again without a release message; `None`: at once. A split vote first
        // waits its random delay; a held lock is re-checked at once, now that the
        // subscriptions see any release.
        let mut next_vote = split.then(|| {
            splits += 1;
            Instant::now() + self.split_delay(splits, req.ttl)
        });
        // Expiry publishes nothing: one waiter per client (the holder of this role, on the
        // first subscribed master's channel) comes back when the holder's keys run out, not
        // all of them. Without any subscription every waiter keeps its own expiry timer.
        let mut expiry = subs
            .0
            .waitings
            .iter()
            .find_map(OnceLock::get)
            .map(|w| ExpiryWatch::new(w.channel()));
        // Armed before every vote: a release published while it is in flight wakes us.
        let reader = req.mode == LockMode::Shared;
        let mut armed = subs.0.arm(reader);
        // A release names the head of each master's queue of waiters: this waiter is woken by
        // a release naming it (kept for it if it comes while a vote is in flight), and by no
        // other, so a release wakes about one waiter of all clients, not one per client.
        let heads: Vec<_> = subs
            .0
            .waitings
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.get().map(|w| (i, w.queued(&token))))
            .collect();
        // The last vote that lost, when it asked for grants (the first vote's grants came
        // before these subscriptions: the loop's first vote finds them, its own keys win).
        let mut refused: Option<Refused> = None;
        // The vote a release message woke, decided on while waiting.
        let mut woken_vote = None;
        loop {
            if let Some(mut at) = next_vote {
                if let Some(d) = deadline {
                    at = at.min(d);
                }
                tokio::select! {
                    i = first_of(&mut armed) => {
                        // Every reader a release woke votes: they can all hold together, so a
                        // vote of another reader of this client covers nothing of theirs.
                        let woken = if reader {
                            Some(subs.0.vote())
                        } else {
                            subs.0.on_wake(armed.channels[i].last_message())
                        };
                        match woken {
                            Some(vote) => woken_vote = Some(vote),
                            None => {
                                // A copy of a release a vote of this client covers: sleep on
                                // towards the same time.
                                armed.rearm(i);
                                continue;
                            }
                        }
                    }
                    // Named as the head of a master's queue: this waiter is the one that
                    // release woke (copies from other masters left as permits make a lost vote
                    // run again, the release may have reached those after it).
                    _ = first_head(&heads) => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
                armed = subs.0.arm(reader);
            }
            // Grants for the last vote that lost: a majority holds, no vote needed. A minority
            // waits a node timeout for the rest of that release's grants, then votes (winning
            // on its granted masters, or giving them back with the vote's undo).
            if let Some(r) = refused.as_mut() {
                for (i, h) in &heads {
                    if let Some(g) = h.take_grant()
                        && g.attempt == r.number
                        && r.refused_on[*i]
                    {
                        r.granted[*i] = true;
                    }
                }
                if let Some(a) = self.granted(req, &keys, &token, r) {
                    in_queue.disarm();
                    if let Some(e) = expiry.as_mut() {
                        e.won();
                    }
                    return Ok(Some(a));
                }
                if r.count() > 0 && r.count() < self.inner.quorum && woken_vote.is_none() {
                    // A release reaches the masters about together: the rest of its grants
                    // come within about a round trip, or not at all (a master's release lost
                    // or another waiter granted there), and meanwhile these grants hold those
                    // masters from everyone else.
                    let now = Instant::now();
                    let grace = (r.round_trip * 2 + Duration::from_millis(2))
                        .min(self.inner.cfg.node_timeout(req.ttl));
                    let until = *r.grace_until.get_or_insert(now + grace);
                    if now < until && deadline.is_none_or(|d| now < d) {
                        next_vote = Some(until);
                        continue;
                    }
                }
            }
            // Dropped untold when the attempt fails or the call is cancelled: a release left to
            // this vote goes to another waiter.
            let vote = woken_vote.take().unwrap_or_else(|| subs.0.vote());
            let (split, free_in, released_meanwhile) = match self
                .attempt(req, &keys, &token, Some((&ticket, stretch, number())))
                .await?
            {
                Attempt::Won(a) => {
                    in_queue.disarm();
                    vote.won();
                    if let Some(e) = expiry.as_mut() {
                        e.won();
                    }
                    return Ok(Some(a));
                }
                Attempt::Lost {
                    split,
                    free_in,
                    refused: r,
                } => {
                    refused = r;
                    note_join(ticket.poll_stretch());
                    (split, free_in, vote.lost())
                }
            };
            // Subscribed and lost a vote: a release from now on wakes this waiter.
            req.waiting.mark();
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            if released_meanwhile && !split {
                // A release landed on some master after this vote reached it: vote again at
                // once (a split vote's retry below comes soon anyway).
                armed = subs.0.arm(reader);
                next_vote = None;
                continue;
            }
            // The entries this vote left last `stretch` polls; the next vote's last as many as
            // the waiters now ahead call for.
            let (left, next_stretch) = (stretch, ticket.poll_stretch());
            stretch = next_stretch;
            next_vote = Some(if split {
                splits += 1;
                now + self.split_delay(splits, req.ttl)
            } else {
                splits = 0;
                let poll = poll * left.min(next_stretch);
                let safety = poll / 2 + poll.mul_f64(fastrand::f64() / 2.0);
                let mut at = now + safety;
                if let Some(p) = free_in
                    && expiry.as_mut().is_none_or(ExpiryWatch::claim)
                {
                    // Come back when the holder's keys run out.
                    at = at.min(now + p + Duration::from_millis(fastrand::u64(1..=5)));
                }
                at
            });
        }
    }

    /// One attempt on every node (see the crate docs), undone when it fails: silently for a
    /// `waiting` one (a `lock()`), with a publishing release otherwise. A `waiting` one joins
    /// the masters' queues: it brings its ticket (its place in every
    /// master's queue, once known) and learns it from the masters' answers, late ones
    /// included, and its entries (and a refused writer's mark) last `stretch` polls and a
    /// margin.
    async fn attempt(
        &self,
        req: &AcquireRequest,
        keys: &Arc<Keys>,
        token: &Arc<str>,
        waiting: Option<(&Arc<Ticket>, u32, Option<u64>)>,
    ) -> Result<Attempt> {
        let inner = &self.inner;
        if let Some(msg) = inner.identity.duplicate.get() {
            return Err(Error::invalid_config(msg.clone()));
        }
        let n = inner.slots.len();
        let ttl = req.ttl;
        // Armed until the attempt is decided: a call dropped with requests in flight releases
        // on every node in the background.
        let shared = req.mode == LockMode::Shared;
        let in_flight = CleanUpIfCancelled::arm(
            UndoEverywhere {
                inner: inner.clone(),
                keys: keys.clone(),
                token: token.clone(),
                ttl,
                shared,
            },
            &req.background,
        );
        let holder: Arc<str> = req.holder.encode().into();
        // A waiting lock() (undone silently) joins each master's queue of waiters when it
        // loses there, so that a release wakes it only when it is next (see `wait_for`); a
        // try_lock joins nothing, and neither takes a master's free lock past its queue.
        // A waiting writer refused by readers marks itself as waiting on that master (readers
        // that come later are refused there), for a little past its next vote.
        // A vote asking for grants leaves its number and the claim TTL (as long as its queue
        // entry: a waiter that crashed once granted holds the name up no longer than a dead
        // entry would, and past its next vote, which finds a grant whose message was lost).
        let vote = match waiting {
            Some((ticket, stretch, number)) => {
                ticket.new_vote();
                let poll = inner.cfg.poll * stretch;
                let entry = node::queue_entry_ttl(poll);
                node::WaitingVote {
                    mark: node::writer_mark_ttl(poll),
                    entry,
                    ticket: ticket.get(),
                    grant: number.filter(|_| !shared).map(|attempt| GrantAsk {
                        attempt,
                        claim: ttl.min(entry),
                    }),
                }
            }
            None => node::WaitingVote::default(),
        };
        let ticket = waiting.map(|(t, _, _)| t);
        let undo = if waiting.is_some() {
            Undo::Silent
        } else {
            Undo::Release
        };
        let sent_at = Instant::now();
        let mut pending = {
            let (keys, token, ticket) = (keys.clone(), token.clone(), ticket.cloned());
            let holder = holder.clone();
            inner.per_node(inner.cfg.node_timeout(ttl), move |i, mut c| {
                let (keys, token, holder) = (keys.clone(), token.clone(), holder.clone());
                let ticket = ticket.clone();
                async move {
                    if shared {
                        return node::acquire_share(
                            &mut c, &keys, &token, &holder, ttl, vote.entry,
                        )
                        .await;
                    }
                    let (attempt, place) =
                        node::acquire_waiting(&mut c, &keys, &token, &holder, ttl, vote).await?;
                    if let (Some(ticket), Some(place)) = (ticket, place) {
                        ticket.offer(i, place);
                    }
                    Ok(attempt)
                }
            })
        };
        let mut others = vec![false; n];
        let mut placed = vec![false; n];
        let (mut won, mut held, mut failed) = (0, 0, 0);
        let mut pttls = Vec::new();
        let mut errors: Vec<(usize, Result<()>)> = Vec::new();
        while let Some((i, r)) = pending.next().await {
            match r {
                Ok(NodeAttempt::Won { .. }) => {
                    placed[i] = true;
                    won += 1;
                }
                Ok(NodeAttempt::Held { pttl }) => {
                    others[i] = true;
                    held += 1;
                    pttls.push(pttl.unwrap_or(ttl));
                }
                Err(e) => {
                    failed += 1;
                    errors.push((i, Err(e)));
                }
            }
            // A lost vote reads every answer (each bounded by the node timeout) rather than
            // stop at the third refusal: a master that refused needs no undo, and the undo of
            // one still answering would have to wait for its answer anyway (same connection),
            // so this is no slower, and it saves two requests a losing vote.
            if won >= inner.quorum {
                break;
            }
        }
        // Late answers of a won vote are still ours to wait for (a late "won" is released
        // with the lease); the caller does not wait for them.
        inner.drain(pending, &req.background);
        // Decided: from here the undo (if any) is this attempt's own, on the targets below.
        in_flight.disarm();
        if won >= inner.quorum && sent_at.elapsed() + inner.caps.drift_margin(ttl) < ttl {
            let lease = RedlockLease {
                inner: inner.clone(),
                keys: keys.clone(),
                token: token.clone(),
                background: req.background.clone(),
                ttl: Mutex::new(ttl),
                valid_until: Mutex::new(sent_at + ttl - inner.caps.drift_margin(ttl)),
                shared,
                holder,
                placed: Arc::new(Mutex::new(placed)),
                token_bits: req.token.uuid().as_u128(),
            };
            lease.watch_revocations(&req.lost);
            return Ok(Attempt::Won(Acquired::new(lease, sent_at)));
        }
        // Undo on every node that may hold our key, including those whose answer was lost,
        // and only then go on: a retry with the same token must not meet a late undo.
        let targets: Vec<usize> = (0..n).filter(|i| !others[*i]).collect();
        if !targets.is_empty() {
            let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
            let task =
                inner
                    .clone()
                    .undo(keys.clone(), token.clone(), targets, (undo, shared), ttl);
            req.background.spawn(async move {
                task.await;
                let _ = done_tx.send(());
            });
            let _ = done_rx.await;
        }
        if n - failed < inner.quorum {
            return Err(inner.no_majority(n - failed, errors.into_iter()));
        }
        // The holder's keys must expire on enough nodes for a majority to be free.
        let need = inner.quorum as isize - (n - held) as isize;
        let free_in = (need > 0).then(|| {
            pttls.sort();
            pttls[(need as usize - 1).min(pttls.len() - 1)]
        });
        let refused = vote.grant.map(|g| Refused {
            number: g.attempt,
            sent_at,
            claim: g.claim,
            granted: vec![false; n],
            round_trip: sent_at.elapsed(),
            refused_on: others,
            grace_until: None,
        });
        Ok(Attempt::Lost {
            split: won > 0,
            free_in,
            refused,
        })
    }

    /// Subscribes to the release channel of `keys` on every connected node, or reuses the
    /// lingering subscriptions of an earlier wait.
    async fn subscribe(&self, keys: &Keys, ttl: Duration) -> SubsUse {
        let inner = &self.inner;
        let entry = {
            let mut waits = lock_mutex(&inner.waits);
            let entry = waits
                .entry(keys.channel.clone())
                .or_insert_with(|| {
                    Arc::new(NameSubs {
                        channel: keys.channel.clone(),
                        waitings: (0..inner.slots.len()).map(|_| OnceLock::new()).collect(),
                        votes: Mutex::default(),
                        joining: (0..inner.slots.len())
                            .map(|_| AtomicBool::new(false))
                            .collect(),
                        joined: tokio::sync::Notify::new(),
                        joined_stretch: AtomicU32::new(1),
                        users: AtomicUsize::new(0),
                        idle_since: Mutex::new(Instant::now()),
                    })
                })
                .clone();
            entry.users.fetch_add(1, Ordering::AcqRel);
            entry
        };
        self.start_sweeper();
        for (i, slot) in inner.slots.iter().enumerate() {
            if entry.waitings[i].get().is_some() || entry.joining[i].swap(true, Ordering::AcqRel) {
                continue;
            }
            let Some(node) = slot.get() else {
                entry.joining[i].store(false, Ordering::Release);
                continue;
            };
            // Joined in a task: a slow node's subscription completes (and is used by the next
            // wait) without holding this waiter up past the node timeout.
            let (entry, timeout) = (entry.clone(), inner.cfg.connect_timeout);
            tokio::spawn(async move {
                let joined =
                    tokio::time::timeout(timeout, node.subscriptions().join(&entry.channel)).await;
                match joined {
                    Ok(Ok(w)) => {
                        let _ = entry.waitings[i].set(w);
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "SUBSCRIBE on a redlock master failed")
                    }
                    Err(_) => tracing::debug!("SUBSCRIBE on a redlock master timed out"),
                }
                entry.joining[i].store(false, Ordering::Release);
                entry.joined.notify_waiters();
            });
        }
        // This waiter's joins, and those another waiter of this client started just before
        // (it skipped them above): a waiter that armed its notifications before they were in
        // would hear no release on those masters and sleep until its safety poll.
        let until = Instant::now() + inner.cfg.node_timeout(ttl);
        loop {
            let joined = entry.joined.notified();
            tokio::pin!(joined);
            joined.as_mut().enable();
            let pending = (0..inner.slots.len()).any(|i| {
                entry.waitings[i].get().is_none() && entry.joining[i].load(Ordering::Acquire)
            });
            if !pending || tokio::time::timeout_at(until, joined).await.is_err() {
                break;
            }
        }
        SubsUse(entry)
    }

    /// Drops subscriptions of names nobody waited for in [`SUBSCRIPTION_LINGER`].
    fn start_sweeper(&self) {
        if self.inner.sweeper.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SUBSCRIPTION_LINGER).await;
                let Some(inner) = weak.upgrade() else { return };
                lock_mutex(&inner.waits).retain(|_, e| {
                    e.users.load(Ordering::Acquire) > 0
                        || lock_mutex(&e.idle_since).elapsed() < SUBSCRIPTION_LINGER
                });
            }
        });
    }

    fn split_delay(&self, splits: u32, ttl: Duration) -> Duration {
        // At least the 1 ms after which silently undone keys are gone.
        let backoff = Backoff {
            initial: Duration::from_millis(2),
            max: Backoff::for_ttl(ttl).max,
        };
        Duration::from_millis(1) + backoff.delay(splits.saturating_sub(1))
    }
}

/// Waits until one of `heads` is woken (forever when empty).
async fn first_head(heads: &[(usize, lock_redis::node::QueuedWake)]) {
    if heads.is_empty() {
        return std::future::pending().await;
    }
    futures::future::select_all(heads.iter().map(|(_, h)| Box::pin(h.notify().notified()))).await;
}

/// Takes a waiter out of every master's queue when its `lock()` ends without the lock
/// (dropped, timed out, failed): armed in a [`CleanUpIfCancelled`] before its first vote.
/// A master where it was the head of a free lock wakes the next waiter.
pub(crate) struct LeaveEverywhere {
    pub(crate) inner: Arc<Inner>,
    pub(crate) keys: Arc<Keys>,
    pub(crate) token: Arc<str>,
    pub(crate) ttl: Duration,
}

impl CancelCleanUp for LeaveEverywhere {
    fn start(self) -> Option<CleanUpTask> {
        let LeaveEverywhere {
            inner,
            keys,
            token,
            ttl,
        } = self;
        let timeout = inner.cfg.node_timeout(ttl) * 4;
        let mut pending = inner.per_node(timeout, move |_, mut c| {
            let (keys, token) = (keys.clone(), token.clone());
            async move { node::leave_queue(&mut c, &keys, &token).await }
        });
        Some(Box::pin(async move {
            while let Some((_, r)) = pending.next().await {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "leaving a master's queue failed; the entry expires by its TTL");
                }
            }
        }))
    }
}

/// Releases on every node when a call is dropped mid-attempt: armed in a
/// [`CleanUpIfCancelled`] until the attempt is decided.
pub(crate) struct UndoEverywhere {
    pub(crate) inner: Arc<Inner>,
    pub(crate) keys: Arc<Keys>,
    pub(crate) token: Arc<str>,
    pub(crate) ttl: Duration,
    /// The attempt asked for a reader's share, not the lock key.
    pub(crate) shared: bool,
}

impl CancelCleanUp for UndoEverywhere {
    fn start(self) -> Option<CleanUpTask> {
        let all = (0..self.inner.slots.len()).collect();
        Some(Box::pin(self.inner.undo(
            self.keys,
            self.token,
            all,
            (Undo::Release, self.shared),
            self.ttl,
        )))
    }
}
