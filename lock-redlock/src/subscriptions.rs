//! Release subscriptions: one pub/sub subscription per master and lock name, shared by the
//! waiters of this client and lingering a few seconds after the last; the release messages that
//! tell one release's copies (one per master) apart.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lock_redis::node::Waiting;
use lockcore::Instant;

use crate::sync::lock_mutex;

/// How long an idle name's subscriptions linger before they are dropped.
pub(crate) const SUBSCRIPTION_LINGER: Duration = Duration::from_secs(3);

/// The lingering subscriptions of one lock name: at most one [`Waiting`] per node.
pub(crate) struct NameSubs {
    pub(crate) channel: String,
    pub(crate) waitings: Vec<OnceLock<Waiting>>,
    /// This client's votes on the name and the releases they cover (see [`NameSubs::on_wake`]).
    pub(crate) votes: Mutex<Votes>,
    pub(crate) joining: Vec<AtomicBool>,
    /// Woken when a join of [`NameSubs::joining`] ends (subscribed or not).
    pub(crate) joined: tokio::sync::Notify,
    /// How many polls' time the entries of this client's last wait lasted when it joined the
    /// queues (its first refused vote's place, see `ticket.rs`): a new wait of this client
    /// joins at the tail of about as long a queue, and its first vote's entries last as long.
    pub(crate) joined_stretch: AtomicU32,
    pub(crate) users: AtomicUsize,
    pub(crate) idle_since: Mutex<Instant>,
}

/// One waiter's use of a [`NameSubs`]; dropping it marks the entry idle.
pub(crate) struct SubsUse(pub(crate) Arc<NameSubs>);

impl Drop for SubsUse {
    fn drop(&mut self) {
        *lock_mutex(&self.0.idle_since) = Instant::now();
        self.0.users.fetch_sub(1, Ordering::AcqRel);
    }
}

pub(crate) type Notified<'a> = Pin<Box<tokio::sync::futures::Notified<'a>>>;

/// How many recent releases a client remembers, per lock name.
pub(crate) const RELEASE_MEMORY: usize = 16;

/// One client's votes on one lock name: which are in flight, whether a release message arrived
/// while one was, and the releases a won vote made moot.
///
/// One release reaches every master and publishes there, so each of its copies would wake
/// another waiter into a vote. But a copy is not always news: the copies arrive as the release
/// lands on each master, and a vote sent before the release reached some master finds the lock
/// still held there. So a copy is skipped only when a vote of this client covers it: a vote
/// already won after that release (the lock is ours), or a vote in flight, which votes again at
/// once if it loses (a copy that arrived meanwhile may come from a master its vote found held).
#[derive(Debug, Default)]
pub(crate) struct Votes {
    in_flight: usize,
    /// A copy arrived while a vote was in flight and was left to it.
    pending: bool,
    /// Recent named releases, and whether a won vote came after them.
    releases: VecDeque<(Arc<str>, bool)>,
}

/// A waiter's vote in flight (see [`Votes`]): tell it how the vote ended. Dropped untold (the
/// call was cancelled, or the vote failed), it hands a copy left to it to another waiter.
#[must_use]
pub(crate) struct Vote<'a> {
    subs: &'a NameSubs,
    told: bool,
}

impl Vote<'_> {
    /// The vote won: every release seen so far is moot for this client.
    pub(crate) fn won(mut self) {
        self.told = true;
        let mut votes = lock_mutex(&self.subs.votes);
        votes.in_flight -= 1;
        votes.pending = false;
        for (_, moot) in votes.releases.iter_mut() {
            *moot = true;
        }
    }

    /// The vote lost: returns whether a release message arrived meanwhile, in which case the
    /// waiter votes again (its vote may have reached a master before the release did).
    pub(crate) fn lost(mut self) -> bool {
        self.told = true;
        let mut votes = lock_mutex(&self.subs.votes);
        votes.in_flight -= 1;
        std::mem::take(&mut votes.pending)
    }
}

impl Drop for Vote<'_> {
    fn drop(&mut self) {
        if self.told {
            return;
        }
        let mut votes = lock_mutex(&self.subs.votes);
        votes.in_flight -= 1;
        if votes.in_flight == 0 && std::mem::take(&mut votes.pending) {
            drop(votes);
            // Nobody votes on the copy left to this vote: one other waiter does.
            if let Some(w) = self.subs.waitings.iter().find_map(OnceLock::get) {
                w.channel().notify.notify_one();
            }
        }
    }
}

/// The message a Redlock release publishes on every master: the same on all of them, and
/// different for every release (see [`Votes`]).
pub(crate) fn release_message() -> String {
    format!("{RELEASE_PREFIX}{:016x}", fastrand::u64(..))
}

/// What marks a release message as named by [`release_message`].
pub(crate) const RELEASE_PREFIX: &str = "release:";

/// A waiter's armed notifications: one per subscribed master, with that master's channel.
pub(crate) struct Armed<'a> {
    pub(crate) notified: Vec<Notified<'a>>,
    pub(crate) channels: Vec<&'a lock_redis::node::Channel>,
    /// A reader's: armed on the channels' [`readers`](lock_redis::node::Channel::readers), which
    /// a release wakes all at once (a writer's release lets every reader in), not one per
    /// client.
    pub(crate) reader: bool,
}

/// The notify a waiter of `channel` sleeps on: a reader's, or everyone else's.
fn notify_of(channel: &lock_redis::node::Channel, reader: bool) -> &tokio::sync::Notify {
    if reader {
        &channel.readers
    } else {
        &channel.notify
    }
}

impl Armed<'_> {
    /// A new notification for master `i` in place of the one that fired (the others stay
    /// registered, so nothing published meanwhile is missed).
    pub(crate) fn rearm(&mut self, i: usize) {
        let mut n = Box::pin(notify_of(self.channels[i], self.reader).notified());
        n.as_mut().enable();
        self.notified[i] = n;
    }
}

impl NameSubs {
    /// One enabled notification future per subscribed node, after discarding a permit left by a
    /// message that arrived while nobody waited (it would wake this waiter for nothing); a
    /// `reader`'s on the channels' readers' notify (see [`Armed::reader`]).
    pub(crate) fn arm(&self, reader: bool) -> Armed<'_> {
        let channels: Vec<_> = self
            .waitings
            .iter()
            .filter_map(OnceLock::get)
            .map(Waiting::channel)
            .collect();
        let notified = channels
            .iter()
            .map(|c| {
                let notify = notify_of(c, reader);
                let mut n = Box::pin(notify.notified());
                if n.as_mut().enable() {
                    n = Box::pin(notify.notified());
                    n.as_mut().enable();
                }
                n
            })
            .collect();
        Armed {
            notified,
            channels,
            reader,
        }
    }

    /// A vote not caused by a message (the first after subscribing, the holder's expiry, a
    /// split vote's retry, the safety poll).
    pub(crate) fn vote(&self) -> Vote<'_> {
        lock_mutex(&self.votes).in_flight += 1;
        Vote {
            subs: self,
            told: false,
        }
    }

    /// A waiter woken by `message` (a release's text, `None` when unknown): its vote, or `None`
    /// when a vote of this client covers the message (see [`Votes`]). Skipping is safe then: a
    /// vote won after that release, or the vote in flight votes again if it loses.
    pub(crate) fn on_wake(&self, message: Option<Arc<str>>) -> Option<Vote<'_>> {
        let message = message.filter(|m| m.starts_with(RELEASE_PREFIX));
        let mut votes = lock_mutex(&self.votes);
        if let Some(message) = message {
            match votes.releases.iter().find(|(m, _)| *m == message) {
                Some((_, true)) => return None,
                Some((_, false)) => {}
                None => {
                    if votes.releases.len() == RELEASE_MEMORY {
                        votes.releases.pop_front();
                    }
                    votes.releases.push_back((message, false));
                }
            }
        }
        if votes.in_flight > 0 {
            votes.pending = true;
            return None;
        }
        votes.in_flight += 1;
        Some(Vote {
            subs: self,
            told: false,
        })
    }
}

/// Waits for the first of `armed` (forever when empty); returns its index.
pub(crate) async fn first_of(armed: &mut Armed<'_>) -> usize {
    if armed.notified.is_empty() {
        return std::future::pending().await;
    }
    futures::future::select_all(armed.notified.iter_mut())
        .await
        .1
}
