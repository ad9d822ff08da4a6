//! How a `lock()` waits on Redis (see the crate docs): subscribed to the name's channel,
//! woken by the release that names this waiter as the queue's head (shares: any release), at
//! the holder's expiry (one waiter per client, or the queue's head) or by the safety-net poll.

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{AcquireRequest, Acquired, Backoff, CleanUpIfCancelled, poll_attempts};
use lockcore::{Instant, LockMode, Result};

use crate::attempt::Attempt;
use crate::client::Inner;
use crate::lease::WaitingWatch;
use crate::node::ExpiryWatch;
use crate::queue;
use crate::subs::Granted;

impl Inner {
    /// The waiting `acquire` of [`RedisBackend`](crate::RedisBackend): see its docs for whom a
    /// release wakes and for cancellation safety (a dropped waiter unregisters, and leaves the
    /// queue in the background on the connection of its attempts).
    pub(crate) async fn wait_for(
        self: &Arc<Self>,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        let keys = self.keys(&req.name);
        let queued = self.queues(req);
        let token = req.token.to_hex();
        // Armed before the first attempt, which may queue this waiter (or count a waiting
        // share); disarmed when it wins (the winning script took it out of the queue).
        let in_queue = self.interop.is_none().then(|| {
            let leave = queue::Leave {
                conn: self.attempt_conn(),
                keys: keys.clone(),
                token: token.clone(),
            };
            CleanUpIfCancelled::arm(leave, &req.background)
        });
        let won = |a,
                   in_queue: Option<CleanUpIfCancelled<queue::Leave>>,
                   revoked: Option<WaitingWatch>| {
            if let Some(q) = in_queue {
                q.disarm();
            }
            if let Some(r) = revoked {
                WaitingWatch::won(r);
            }
            Ok(Some(a))
        };
        // handover=grant: attempts are numbered, and the last refused one (its number, its
        // send) is what a grant is judged by (see `Inner::granted`).
        let grants = queued && self.grants();
        let mut sent = 0_u64;
        let mut number = || {
            sent += 1;
            grants.then_some(sent)
        };
        // A wait of this client on the name that ended a moment ago left its subscription in
        // place (see `linger`): the loop's attempt, subscribed, is then the first.
        let lingering = self.lingering.take(&keys.channel);
        // Else the uncontended fast path: no subscription round trip when the lock is free.
        let (mut pttl, mut refused) = if lingering.is_some() {
            (None, None)
        } else {
            let first = number();
            let seen = match self.attempt(req, &keys, true, first).await? {
                Attempt::Won(a) => return won(a, in_queue, None),
                Attempt::Held { pttl, sent_at, .. } => (pttl, first.map(|n| (n, sent_at))),
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            seen
        };
        // Queued (or waiting): from here a grant, or an attempt's win, may give this token the
        // lock before the lease exists; a revocation of it must not be dropped meanwhile.
        let revoked = self.watch_while_waiting(req);
        let joined = match lingering {
            Some(w) => Ok(w),
            None => self.node.subscriptions().join(&keys.channel).await,
        };
        let waiting = match joined {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "cannot subscribe to release notifications; polling instead");
                // The attempts of a waiting lock(): a writer marks itself behind readers, and
                // each attempt keeps its queue entry alive (the backoff stays below its TTL).
                let backoff = Backoff::for_ttl(req.ttl);
                let got = poll_attempts(req, deadline, &backoff, || async {
                    Ok(match self.attempt(req, &keys, true, None).await? {
                        Attempt::Won(a) => Some(a),
                        Attempt::Held { .. } => None,
                    })
                })
                .await?;
                return match got {
                    Some(a) => won(a, in_queue, revoked),
                    None => Ok(None),
                };
            }
        };
        // Registered before the next attempt: a release naming this waiter as the queue's head
        // while the attempt is in flight is kept for it.
        let head_wake = queued.then(|| waiting.queued(&token));
        let poll = self.node.config().poll;
        let mut expiry = ExpiryWatch::new(waiting.channel());
        loop {
            // A grant that came after the last refused attempt: the lock is this waiter's.
            if let (Some(h), Some(last)) = (&head_wake, refused)
                && let Some(g) = h.take_grant()
                && let Some(a) = self.granted(req, g, last)
            {
                expiry.won();
                self.lingering.keep(waiting.another());
                return won(a, in_queue, revoked);
            }
            // Registered before the attempt: a release published while it is in flight wakes us.
            // Readers on their own notify: a release wakes all of them, not one per client.
            let notified = if req.mode == LockMode::Shared {
                waiting.channel().readers.notified()
            } else {
                waiting.channel().notify.notified()
            };
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Subscribed now: this attempt sees any release that came before the subscription.
            let n = number();
            let head = match self.attempt(req, &keys, true, n).await? {
                Attempt::Won(a) => {
                    expiry.won();
                    self.lingering.keep(waiting.another());
                    return won(a, in_queue, revoked);
                }
                Attempt::Held {
                    pttl: p,
                    head,
                    sent_at,
                } => {
                    pttl = p.or(pttl);
                    refused = n.map(|n| (n, sent_at));
                    head
                }
            };
            // Subscribed and seen held: a release from now on wakes this waiter.
            req.waiting.mark();
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                self.lingering.keep(waiting.another());
                return Ok(None);
            }
            // The safety net: lost messages, a crashed head's entry expired (nothing announces
            // it), and, for a queued waiter, its entry kept alive.
            let safety = poll / 2 + poll.mul_f64(fastrand::f64() / 2.0);
            let mut wake = now + safety;
            // Expiry publishes nothing: one waiter comes back when the holder's lease runs out,
            // not all of them (no herd at expiry): the queue's head, or without a queue one
            // waiter per client.
            let watches_expiry = if queued { head } else { expiry.claim() };
            if let Some(p) = pttl.take()
                && watches_expiry
            {
                wake = wake.min(now + p + Duration::from_millis(fastrand::u64(1..=5)));
            }
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            let woken = async {
                match &head_wake {
                    // Only a release naming this waiter (it is the head): the others sleep on.
                    Some(h) => h.notify().notified().await,
                    None => notified.as_mut().await,
                }
            };
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

impl Inner {
    /// The lease a grant gives (`handover=grant`): the release that granted it ran after the
    /// waiter's last refused attempt `(number, sent)` reached the server (the grant names the
    /// attempt that last queued the waiter; a grant naming an earlier one came before a later
    /// refusal, so its claim is gone: ignored). The claim's validity therefore counts from
    /// that attempt's send, on this client's clock alone. `None` when the grant is stale, or
    /// when it is too old to hold on (less than a third of the claim left) or the lease is not
    /// renewed in the background (its validity would be the claim's): the waiter then
    /// attempts again, which wins on its own token and extends it to the TTL (one round
    /// trip). The model of `tests/handover_model.rs` checks this rule.
    fn granted(
        self: &Arc<Self>,
        req: &AcquireRequest,
        grant: Granted,
        (number, sent): (u64, Instant),
    ) -> Option<Acquired> {
        if grant.attempt != number || !req.renewed {
            return None;
        }
        let claim = self.claim(req);
        self.caps.granted_until(sent, claim)?;
        let fence = req.fencing.wanted().then_some(grant.fence);
        Some(Acquired::new(self.won_lease(req, fence), sent).with_granted_ttl(claim))
    }
}
