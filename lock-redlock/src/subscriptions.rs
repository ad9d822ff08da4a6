//! Release subscriptions: one pub/sub subscription per master and lock name, shared by the
//! waiters of this client and lingering a few seconds after the last; the release messages that
//! tell one release's copies (one per master) apart.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    /// The releases (their messages) a waiter of this client has already acted on: one
    /// release reaches every master, and each copy would wake another waiter into a vote.
    pub(crate) acted_on: Mutex<VecDeque<Arc<str>>>,
    pub(crate) joining: Vec<AtomicBool>,
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

/// How many recent releases a client remembers having acted on, per lock name.
pub(crate) const ACTED_ON_MEMORY: usize = 16;

/// The message a Redlock release publishes on every master: the same on all of them, and
/// different for every release (see [`NameSubs::first_to_act`]).
pub(crate) fn release_message() -> String {
    format!("{RELEASE_PREFIX}{:016x}", fastrand::u64(..))
}

/// What marks a release message as named by [`release_message`].
pub(crate) const RELEASE_PREFIX: &str = "release:";

/// A waiter's armed notifications: one per subscribed master, with that master's channel.
pub(crate) struct Armed<'a> {
    pub(crate) notified: Vec<Notified<'a>>,
    pub(crate) channels: Vec<&'a lock_redis::node::Channel>,
}

impl Armed<'_> {
    /// A new notification for master `i` in place of the one that fired (the others stay
    /// registered, so nothing published meanwhile is missed).
    pub(crate) fn rearm(&mut self, i: usize) {
        let mut n = Box::pin(self.channels[i].notify.notified());
        n.as_mut().enable();
        self.notified[i] = n;
    }
}

impl NameSubs {
    /// One enabled notification future per subscribed node, after discarding a permit left by a
    /// message that arrived while nobody waited (it would wake this waiter for nothing).
    pub(crate) fn arm(&self) -> Armed<'_> {
        let channels: Vec<_> = self
            .waitings
            .iter()
            .filter_map(OnceLock::get)
            .map(Waiting::channel)
            .collect();
        let notified = channels
            .iter()
            .map(|c| {
                let mut n = Box::pin(c.notify.notified());
                if n.as_mut().enable() {
                    n = Box::pin(c.notify.notified());
                    n.as_mut().enable();
                }
                n
            })
            .collect();
        Armed { notified, channels }
    }

    /// Whether the waiter woken by `message` should vote: not when a waiter of this client
    /// already acted on the same release (a copy from another master). A message this client
    /// cannot attribute (unnamed, or unknown after a reconnection) always counts: skipping a
    /// release could leave every waiter asleep until its poll. Safe to skip a copy: the waiter
    /// that acted on it read the message before voting, so its vote came after that release.
    pub(crate) fn first_to_act(&self, message: Option<Arc<str>>) -> bool {
        let Some(message) = message.filter(|m| m.starts_with(RELEASE_PREFIX)) else {
            return true;
        };
        let mut acted_on = lock_mutex(&self.acted_on);
        if acted_on.contains(&message) {
            return false;
        }
        if acted_on.len() == ACTED_ON_MEMORY {
            acted_on.pop_front();
        }
        acted_on.push_back(message);
        true
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
