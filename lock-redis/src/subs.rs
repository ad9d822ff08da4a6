//! Release notifications: one RESP3 pub/sub connection per client, shared by every waiter of that
//! client, with one server subscription per lock name however many local tasks wait for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use redis::{PushInfo, PushKind, Value};
use tokio::sync::{Notify, OnceCell};

use crate::error::map_err;

/// The message a release publishes on its channel when it names no release of its own (the
/// plain release of the `queue` module).
pub const RELEASED: &str = "released";

/// What a message naming the queue's head starts with (`q:<owner token>`; see the `queue`
/// module, whose scripts publish it).
pub(crate) const HEAD_PREFIX: &str = "q:";

/// What a grant starts with (`g:<owner token> <attempt> <fence>`; see the `queue` module's
/// release script): the lock is the named waiter's already.
pub(crate) const GRANT_PREFIX: &str = "g:";

/// A grant received for a queued waiter (see [`QueuedWake::take_grant`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Granted {
    /// The number of the waiter's attempt the grant came after (the last one that queued it).
    pub attempt: u64,
    /// The fencing counter's value the release moved to (0 when no token was asked for).
    pub fence: u64,
}

/// A queued waiter's wake-up, and the grant that came with it.
#[derive(Debug, Default)]
struct QueuedSlot {
    notify: Notify,
    grant: Mutex<Option<Granted>>,
}

/// The waiters of one channel in this client.
#[derive(Debug, Default)]
pub struct Channel {
    /// Woken one waiter at a time on a release message (no thundering herd among local waiters),
    /// and all at once after a resubscription (messages may have been lost while disconnected).
    pub notify: Notify,
    /// The waiters of this client that ask for a shared (read) hold: all woken at once by a
    /// release message that names no queue head, and after a resubscription. A writer's
    /// release lets every reader in, so waking one per client (as [`Channel::notify`] does)
    /// would leave the others to their safety-net poll.
    pub readers: Notify,
    /// Whether the server subscription exists. The async mutex also orders the SUBSCRIBE and
    /// UNSUBSCRIBE of one channel, so a waiter arriving while the last one leaves cannot end up
    /// unsubscribed.
    subscribed: tokio::sync::Mutex<bool>,
    /// Whether one waiter of this client sleeps until the holder's TTL runs out (expiry
    /// publishes nothing). Only that one does, so that an expiry wakes one waiter per client, not
    /// all of them.
    expiry_watched: std::sync::atomic::AtomicBool,
    /// The text of the last release message that names its release, set before its waiter is
    /// woken; `None` after an unnamed message or a resubscription (what was published meanwhile
    /// is unknown).
    last_message: Mutex<Option<Arc<str>>>,
    /// The waiters of this client that are in the name's server-side queue, by owner token
    /// (see the `queue` module): a release names the queue's head (`q:<token>`), and only that
    /// waiter is woken, not one per client.
    queued: Mutex<HashMap<String, Arc<QueuedSlot>>>,
}

impl Channel {
    fn register_queued(self: &Arc<Self>, token: &str) -> QueuedWake {
        let slot = Arc::new(QueuedSlot::default());
        self.queued
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.to_owned(), slot.clone());
        QueuedWake {
            channel: self.clone(),
            token: token.to_owned(),
            slot,
        }
    }

    /// Wakes the queued waiter `token` if it is this client's, handing it `grant` if the
    /// message was one.
    fn wake_queued(&self, token: &str, grant: Option<Granted>) {
        if let Some(slot) = self
            .queued
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
        {
            if grant.is_some() {
                *slot.grant.lock().unwrap_or_else(|e| e.into_inner()) = grant;
            }
            slot.notify.notify_one();
        }
    }

    /// Wakes every queued waiter of this client (messages may have been lost).
    fn wake_all_queued(&self) {
        for n in self
            .queued
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            n.notify.notify_one();
        }
    }

    /// The text of the last named release message on this channel (see
    /// `node::release_announced`), or `None` when unknown (nothing received yet, an
    /// unnamed message, or messages may have been lost to a reconnection). A waiter woken by a message reads it to
    /// tell copies of one release apart; a newer message may have replaced it meanwhile.
    pub fn last_message(&self) -> Option<Arc<str>> {
        self.last_message
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_last_message(&self, message: Option<Arc<str>>) {
        *self.last_message.lock().unwrap_or_else(|e| e.into_inner()) = message;
    }
}

/// The role of the one waiter per client and channel that wakes at the holder's TTL (see
/// [`Channel`]). Dropping it gives the role up; unless its waiter won the lock (whose next
/// release wakes a waiter anyway), another waiter is woken to take it over.
pub struct ExpiryWatch<'a> {
    channel: &'a Channel,
    held: bool,
    won: bool,
}

impl<'a> ExpiryWatch<'a> {
    /// Not holding the role yet.
    pub fn new(channel: &'a Channel) -> Self {
        ExpiryWatch {
            channel,
            held: false,
            won: false,
        }
    }

    /// Takes the role if nobody in this client has it; returns whether this waiter has it.
    pub fn claim(&mut self) -> bool {
        use std::sync::atomic::Ordering;
        if !self.held {
            self.held = self
                .channel
                .expiry_watched
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        }
        self.held
    }

    /// This waiter won the lock: give the role up without waking anyone.
    pub fn won(&mut self) {
        self.won = true;
    }
}

impl Drop for ExpiryWatch<'_> {
    fn drop(&mut self) {
        if self.held {
            self.channel
                .expiry_watched
                .store(false, std::sync::atomic::Ordering::Release);
            if !self.won {
                // Not a release: a waiter that tells releases apart by their message must not
                // take this wake for a copy of one it already acted on.
                self.channel.set_last_message(None);
                self.channel.notify.notify_one();
                // The role's holder may have been a reader; the readers re-check, and one of
                // them takes the role over.
                self.channel.readers.notify_waiters();
            }
        }
    }
}

/// A queued waiter's registration on its [`Channel`] (see `Channel::queued`).
pub struct QueuedWake {
    channel: Arc<Channel>,
    token: String,
    slot: Arc<QueuedSlot>,
}

impl QueuedWake {
    /// Woken when a message names this waiter as the queue's head, or after a resubscription.
    pub fn notify(&self) -> &Notify {
        &self.slot.notify
    }

    /// The last grant received for this waiter since the last call (`handover=grant`), if
    /// any. A grant may be stale (it came before a later refused attempt): the waiter compares
    /// [`Granted::attempt`] with its attempts.
    pub fn take_grant(&self) -> Option<Granted> {
        self.slot
            .grant
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

impl Drop for QueuedWake {
    fn drop(&mut self) {
        let mut queued = self
            .channel
            .queued
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if queued
            .get(&self.token)
            .is_some_and(|n| Arc::ptr_eq(n, &self.slot))
        {
            queued.remove(&self.token);
        }
    }
}

#[derive(Debug)]
struct Entry {
    channel: Arc<Channel>,
    waiters: usize,
}

#[derive(Debug, Default)]
pub(crate) struct Registry {
    channels: Mutex<HashMap<String, Entry>>,
    /// The held leases a revocation notice reaches (see [`crate::revoked`]).
    pub(crate) revocations: crate::revoked::RevocationNotices,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The channels some waiter waits on (to subscribe again on a new connection).
    pub(crate) fn channel_names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Wakes every waiter of every channel (after a reconnection: releases published while the
    /// connection was down were lost).
    pub(crate) fn wake_all(&self) {
        for entry in self.lock().values() {
            entry.channel.set_last_message(None);
            entry.channel.notify.notify_waiters();
            entry.channel.readers.notify_waiters();
            entry.channel.wake_all_queued();
        }
    }

    /// Called by the connection for every push message; must not block.
    pub(crate) fn dispatch(&self, push: PushInfo) {
        let wake_all = match push.kind {
            PushKind::Message | PushKind::SMessage => false,
            // Sent again by the automatic resubscription after a reconnect: releases published
            // meanwhile were lost, so every waiter re-checks.
            PushKind::Subscribe | PushKind::SSubscribe => true,
            _ => return,
        };
        let Some(name) = push.data.first().and_then(|v| match v {
            Value::BulkString(b) => std::str::from_utf8(b).ok(),
            Value::SimpleString(s) => Some(s.as_str()),
            _ => None,
        }) else {
            return;
        };
        let raw: Option<&str> = if wake_all {
            None
        } else {
            push.data.get(1).and_then(|v| match v {
                Value::BulkString(b) => std::str::from_utf8(b).ok(),
                Value::SimpleString(s) => Some(s.as_str()),
                _ => None,
            })
        };
        // A release that names the queue's head: `q:<token>` (a single node), or
        // `<release> q:<token>` (a Redlock master, whose release names itself too); or one
        // that granted the lock to it, `g:<token> <attempt> <fence>` (a Redlock master's:
        // `<release> g:...`).
        let mut grant = None;
        let (release, head) = match raw {
            Some(m) if m.starts_with(GRANT_PREFIX) => match parse_grant(&m[GRANT_PREFIX.len()..]) {
                Some((head, g)) => {
                    grant = Some(g);
                    (None, Some(head))
                }
                None => (None, None),
            },
            Some(m) => match m.strip_prefix(HEAD_PREFIX) {
                Some(head) => (None, Some(head)),
                None => match m.split_once(" q:") {
                    Some((release, head)) => (Some(release), Some(head)),
                    // A Redlock master's release that granted the lock to its queue's head:
                    // `<release> g:<token> <attempt> <fence>`.
                    None => match m.split_once(" g:") {
                        Some((release, rest)) => match parse_grant(rest) {
                            Some((head, g)) => {
                                grant = Some(g);
                                (Some(release), Some(head))
                            }
                            None => (Some(release), None),
                        },
                        None => (Some(m), None),
                    },
                },
            },
            None => (None, None),
        };
        // Kept only when it names its release: the plain `released` of a single-node release
        // tells nothing apart, and costs no allocation on that path.
        if self.revocations.dispatch(name, raw) {
            return;
        }
        let message = release.filter(|m| *m != RELEASED).map(Arc::from);
        let channels = self.lock();
        if let Some(entry) = channels.get(name) {
            entry.channel.set_last_message(message);
            if let Some(head) = head {
                // Only the queue's head acts on it (no herd): every other waiter, here and in
                // every other client, sleeps on.
                entry.channel.wake_queued(head, grant);
            } else if wake_all {
                entry.channel.notify.notify_waiters();
                entry.channel.readers.notify_waiters();
                entry.channel.wake_all_queued();
            } else {
                entry.channel.notify.notify_one();
                // Every reader can go (a share freed by a reader wakes them for nothing, but
                // readers wait only behind a writer or a writer's mark: rare).
                entry.channel.readers.notify_waiters();
            }
        }
    }
}

/// `<token> <attempt> <fence>`, the rest of a grant message.
fn parse_grant(rest: &str) -> Option<(&str, Granted)> {
    let mut parts = rest.split(' ');
    let (head, attempt, fence) = (parts.next()?, parts.next()?, parts.next()?);
    let granted = Granted {
        attempt: attempt.parse().ok()?,
        fence: fence.parse().ok()?,
    };
    Some((head, granted))
}

/// The pub/sub side of one client: one RESP3 pub/sub connection (opened on the first
/// [`Subscriptions::join`], resubscribing after reconnects) shared by all its waiters.
pub struct Subscriptions {
    pub(crate) registry: Arc<Registry>,
    conn: OnceCell<Arc<dyn PubSubLink>>,
    factory: Box<dyn PubSubFactory>,
}

impl std::fmt::Debug for Subscriptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriptions")
            .field("connected", &self.conn.initialized())
            .field("channels", &self.registry.lock().len())
            .finish()
    }
}

/// Opens the pub/sub connection on first use, with a push sender that dispatches into the
/// registry.
#[async_trait::async_trait]
pub(crate) trait PubSubFactory: Send + Sync + 'static {
    async fn open(&self, registry: Weak<Registry>) -> lockcore::Result<Arc<dyn PubSubLink>>;
}

/// The connection that carries the subscriptions (its pushes reach the [`Registry`] the
/// factory was given).
#[async_trait::async_trait]
pub(crate) trait PubSubLink: Send + Sync + 'static {
    async fn subscribe(&self, channel: &str) -> redis::RedisResult<()>;
    async fn unsubscribe(&self, channel: &str) -> redis::RedisResult<()>;
}

impl Subscriptions {
    pub(crate) fn new(factory: Box<dyn PubSubFactory>) -> Arc<Self> {
        Arc::new(Subscriptions {
            registry: Arc::default(),
            conn: OnceCell::new(),
            factory,
        })
    }

    async fn conn(&self) -> lockcore::Result<Arc<dyn PubSubLink>> {
        self.conn
            .get_or_try_init(|| self.factory.open(Arc::downgrade(&self.registry)))
            .await
            .cloned()
    }

    /// Registers a waiter for `channel` and makes sure the server subscription exists before it
    /// returns, so that a release published after this returns is seen.
    ///
    /// Cancel safety: the returned (or, when cancelled, the internal) [`Waiting`] unregisters on
    /// drop and unsubscribes when it was the channel's last waiter.
    ///
    /// # Errors
    /// `Unavailable` or `Backend` when the pub/sub connection or the `SUBSCRIBE` fails.
    pub async fn join(self: &Arc<Self>, channel: &str) -> lockcore::Result<Waiting> {
        let chan = {
            let mut channels = self.registry.lock();
            let entry = channels.entry(channel.to_owned()).or_insert_with(|| Entry {
                channel: Arc::default(),
                waiters: 0,
            });
            entry.waiters += 1;
            entry.channel.clone()
        };
        let waiting = Waiting {
            subs: self.clone(),
            name: channel.to_owned(),
            channel: chan,
        };
        {
            let mut subscribed = waiting.channel.subscribed.lock().await;
            if !*subscribed {
                let conn = self.conn().await?;
                conn.subscribe(channel)
                    .await
                    .map_err(|e| map_err("SUBSCRIBE failed", e))?;
                *subscribed = true;
            }
        }
        Ok(waiting)
    }

    /// Unsubscribes `channel` if nobody waits for it any more, and forgets it.
    ///
    /// Only while `channel` is still the name's entry: a name's entry is forgotten by the leave
    /// that unsubscribed it, and a waiter arriving after that makes a new entry (a new
    /// [`Channel`], with its own lock and subscription). A leave of the forgotten one still
    /// pending (the last waiter left twice before either leave ran) has nothing left to do, and
    /// must not unsubscribe: it does not hold the new entry's lock, so its `UNSUBSCRIBE` could
    /// land after the new entry's `SUBSCRIBE` and cancel it while the new entry says
    /// "subscribed" (its waiters would sleep until the safety-net poll; issue 19).
    async fn leave(self: Arc<Self>, name: String, channel: Arc<Channel>) {
        let idle_entry = |channels: &HashMap<String, Entry>| {
            channels
                .get(&name)
                .is_some_and(|e| Arc::ptr_eq(&e.channel, &channel) && e.waiters == 0)
        };
        let mut subscribed = channel.subscribed.lock().await;
        if !idle_entry(&self.registry.lock()) {
            // A new waiter arrived meanwhile and uses the subscription, or this entry was
            // already unsubscribed and forgotten (by another leave).
            return;
        }
        // Unsubscribe even when the flag says we never subscribed: a SUBSCRIBE whose caller was
        // cancelled may still have been sent; this UNSUBSCRIBE follows it on the same connection.
        if let Some(conn) = self.conn.get()
            && let Err(e) = conn.unsubscribe(&name).await
        {
            tracing::debug!(error = %e, "UNSUBSCRIBE failed; the subscription lives until the pub/sub connection closes");
        }
        *subscribed = false;
        let mut channels = self.registry.lock();
        if idle_entry(&channels) {
            channels.remove(&name);
        }
    }

    /// How many channels this client tracks (for tests: no leak after waits end).
    pub fn tracked(&self) -> usize {
        self.registry.lock().len()
    }
}

/// One waiter's registration. Dropping it unregisters; the last waiter of a channel
/// unsubscribes (in a spawned task, since drop cannot wait).
pub struct Waiting {
    subs: Arc<Subscriptions>,
    name: String,
    channel: Arc<Channel>,
}

impl Waiting {
    /// The channel's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// A second registration for this channel: no request, the subscription stays while
    /// either registration lives (see `linger`).
    pub(crate) fn another(&self) -> Waiting {
        if let Some(entry) = self.subs.registry.lock().get_mut(&self.name)
            && Arc::ptr_eq(&entry.channel, &self.channel)
        {
            entry.waiters += 1;
        }
        Waiting {
            subs: self.subs.clone(),
            name: self.name.clone(),
            channel: self.channel.clone(),
        }
    }

    /// The channel's waiters, whose [`Channel::notify`] a release message wakes.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Registers this waiter as queued with `token` in the name's server-side queue (see
    /// the `queue` module): a message naming it as the queue's head wakes the returned
    /// [`QueuedWake`] (a wake-up that comes before the waiter waits is kept for it), and no
    /// other. Dropping it unregisters.
    pub fn queued(&self, token: &str) -> QueuedWake {
        self.channel.register_queued(token)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let last = {
            let mut channels = self.subs.registry.lock();
            match channels.get_mut(&self.name) {
                // The entry lives as long as it has waiters, so it is this waiter's own; checked
                // anyway, so that a mistake cannot take a newer entry's waiter count down.
                Some(entry) if Arc::ptr_eq(&entry.channel, &self.channel) => {
                    entry.waiters -= 1;
                    entry.waiters == 0
                }
                _ => false,
            }
        };
        if last {
            let leave = self
                .subs
                .clone()
                .leave(std::mem::take(&mut self.name), self.channel.clone());
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(leave);
                }
                Err(_) => {
                    // No runtime: the pub/sub connection goes down with it. Forget the entry.
                    tracing::debug!("waiter dropped outside a runtime; not unsubscribing");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::Poll;
    use std::time::Duration;

    use lockcore::LockName;

    use crate::node::{self, Config, Node, NodeAttempt};

    async fn numsub(raw: &mut redis::aio::MultiplexedConnection, channel: &str) -> i64 {
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(raw)
            .await
            .unwrap();
        n
    }

    /// Issue 19: when the last waiter of a name leaves twice before either unsubscribe task runs,
    /// the first task unsubscribes and forgets the channel, and the late one used to unsubscribe
    /// again, cancelling the subscription of a waiter that had arrived meanwhile (the new entry
    /// then said "subscribed", so nothing subscribed it again and its waiters slept until the
    /// safety-net poll). On a multi-threaded runtime the late task runs whenever its worker gets
    /// to it; here it runs by hand at the worst moment: after the newer waiters' last one left
    /// (its own unsubscribe task spawned, not yet run) and just before another waiter joins. The
    /// waiter must stay subscribed on the server, and a release must wake it by its message (the
    /// node API has no poll: any wake-up is the notification). Subscribe, drop, re-subscribe,
    /// three rounds.
    #[tokio::test(flavor = "current_thread")]
    async fn a_late_unsubscribe_leaves_a_newer_subscription_alone() {
        let Some(url) = conformance::require_env("LOCK_TEST_REDIS_URL") else {
            return;
        };
        let scale = conformance::time_scale();
        let node = Node::connect(&Config::parse(&url).unwrap()).await.unwrap();
        let keys =
            node.keys(&LockName::new(format!("late-leave-{:016x}", fastrand::u64(..))).unwrap());
        let channel = keys.channel.clone();
        let subs = node.subscriptions().clone();
        let mut conn = node.conn();
        let mut raw = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        for round in 0..3 {
            let first = subs.join(&channel).await.unwrap();
            assert_eq!(numsub(&mut raw, &channel).await, 1, "round {round}");
            let forgotten = first.channel.clone();
            // Its unsubscribe task runs to the end: the channel is unsubscribed and forgotten.
            drop(first);
            let end = lockcore::Instant::now() + Duration::from_secs_f64(10.0 * scale);
            while subs.tracked() > 0 {
                assert!(
                    lockcore::Instant::now() < end,
                    "round {round}: never forgotten"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // A newer waiter subscribes again and leaves; its unsubscribe task is spawned but
            // does not run before this task awaits something that is not ready.
            drop(subs.join(&channel).await.unwrap());
            // The late unsubscribe task of the forgotten channel runs now, as far as it can.
            let late = subs.clone().leave(channel.clone(), forgotten);
            tokio::pin!(late);
            let late_done = matches!(futures::poll!(late.as_mut()), Poll::Ready(()));
            // A waiter arrives: the newer entry is still subscribed, nothing to send.
            let waiter = subs.join(&channel).await.unwrap();
            if !late_done {
                late.await;
            }
            assert_eq!(
                numsub(&mut raw, &channel).await,
                1,
                "round {round}: a waiter waits but its subscription was cancelled"
            );
            let notified = waiter.channel().notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let ttl = Duration::from_secs(30);
            let won = node::acquire(&mut conn, &keys, "holder", "", ttl, false)
                .await
                .unwrap();
            assert!(matches!(won, NodeAttempt::Won { .. }), "{won:?}");
            assert!(node::release(&mut conn, &keys, "holder").await.unwrap());
            tokio::time::timeout(Duration::from_secs_f64(5.0 * scale), notified)
                .await
                .unwrap_or_else(|_| panic!("round {round}: the release did not wake the waiter"));
        }
    }
}
