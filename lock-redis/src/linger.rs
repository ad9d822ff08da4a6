//! Release subscriptions kept a moment after a wait: a client that waits for the same name
//! again soon (a worker looping `lock` + `release` on a busy name) finds the subscription in
//! place, so it sends no `SUBSCRIBE` / `UNSUBSCRIBE` pair per wait, and its wait starts with
//! the subscribed attempt (no attempt before subscribing). A cancelled wait keeps nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::node::Waiting;

/// How long a name's subscription stays after the last wait of this client on it ended.
pub(crate) const SUBSCRIPTION_LINGER: Duration = Duration::from_secs(1);

/// The registrations kept after a wait, by channel, each with the number of its keep (a
/// later keep of the channel replaces it, and its timer then drops nothing).
#[derive(Default)]
pub(crate) struct Lingering {
    kept: Mutex<HashMap<String, (Waiting, u64)>>,
    keeps: std::sync::atomic::AtomicU64,
}

impl Lingering {
    fn kept(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Waiting, u64)>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The registration kept for `channel`, if a wait on it ended less than
    /// [`SUBSCRIPTION_LINGER`] ago: the subscription is in place.
    pub(crate) fn take(&self, channel: &str) -> Option<Waiting> {
        self.kept().remove(channel).map(|(w, _)| w)
    }

    /// Keeps `waiting` (a registration of its own, see [`Waiting::another`]) for
    /// [`SUBSCRIPTION_LINGER`], then drops it, which unsubscribes when no other waiter of this
    /// client uses the channel. Outside a runtime it is dropped at once.
    pub(crate) fn keep(self: &Arc<Self>, waiting: Waiting) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let number = self
            .keeps
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let channel = waiting.name().to_owned();
        // The one it replaces (if any) is dropped outside the map's lock.
        let replaced = self.kept().insert(channel.clone(), (waiting, number));
        drop(replaced);
        let store: Weak<Self> = Arc::downgrade(self);
        rt.spawn(async move {
            tokio::time::sleep(SUBSCRIPTION_LINGER).await;
            if let Some(store) = store.upgrade() {
                let expired = {
                    let mut kept = store.kept();
                    match kept.get(&channel) {
                        Some((_, n)) if *n == number => kept.remove(&channel),
                        _ => None,
                    }
                };
                drop(expired);
            }
        });
    }

    /// How many channels are kept (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.kept().len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::subs::{PubSubFactory, PubSubLink, Registry, Subscriptions};

    /// A pub/sub connection that only counts what it is asked to send.
    #[derive(Default)]
    struct Counted {
        subscribes: AtomicUsize,
        unsubscribes: AtomicUsize,
    }

    struct Link(Arc<Counted>);

    #[async_trait::async_trait]
    impl PubSubLink for Link {
        async fn subscribe(&self, _: &str) -> redis::RedisResult<()> {
            self.0.subscribes.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        async fn unsubscribe(&self, _: &str) -> redis::RedisResult<()> {
            self.0.unsubscribes.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    struct Factory(Arc<Counted>);

    #[async_trait::async_trait]
    impl PubSubFactory for Factory {
        async fn open(&self, _: Weak<Registry>) -> lockcore::Result<Arc<dyn PubSubLink>> {
            Ok(Arc::new(Link(self.0.clone())))
        }
    }

    /// Two waits in a row on one name (the second within the linger) subscribe once; the
    /// first keep's timer leaves the registration a later wait took alone; the subscription
    /// goes after the last keep's linger. No bound here depends on the machine's speed: the
    /// only waits are "at least a linger" and a generous deadline for the unsubscription, on
    /// the runtime's paused clock: they advance virtual time, no real time passes.
    #[tokio::test(start_paused = true)]
    async fn a_wait_soon_after_another_subscribes_nothing_and_the_subscription_goes_after() {
        let counted = Arc::new(Counted::default());
        let subs = Subscriptions::new(Box::new(Factory(counted.clone())));
        let lingering = Arc::new(Lingering::default());
        let first = subs.join("ch").await.unwrap();
        lingering.keep(first.another());
        drop(first);
        assert_eq!(lingering.len(), 1, "kept after the wait");
        let second = lingering
            .take("ch")
            .expect("the first wait's registration is kept");
        // The first keep's timer fires while the second wait runs: it must leave it alone.
        tokio::time::sleep(SUBSCRIPTION_LINGER * 2).await;
        assert_eq!(subs.tracked(), 1, "the second wait is still subscribed");
        assert_eq!(counted.unsubscribes.load(Ordering::SeqCst), 0);
        assert_eq!(counted.subscribes.load(Ordering::SeqCst), 1);
        lingering.keep(second.another());
        drop(second);
        assert_eq!(lingering.len(), 1, "kept after the second wait");
        let end = tokio::time::Instant::now()
            + SUBSCRIPTION_LINGER
            + Duration::from_secs_f64(10.0 * conformance::time_scale());
        while subs.tracked() > 0 || counted.unsubscribes.load(Ordering::SeqCst) == 0 {
            assert!(tokio::time::Instant::now() < end, "never unsubscribed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(lingering.len(), 0);
        assert_eq!(counted.subscribes.load(Ordering::SeqCst), 1);
        assert_eq!(counted.unsubscribes.load(Ordering::SeqCst), 1);
    }
}
