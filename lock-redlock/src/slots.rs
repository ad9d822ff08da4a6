//! The masters: one slot per node of the URL, its connection (re-made in the background) and
//! the identity check that keeps one Redis server from voting twice.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use lock_redis::node::{self, Node};
use lockcore::Instant;

use crate::sync::lock_mutex;

/// The least time between two background reconnection attempts of one node.
pub(crate) const RECONNECT_EVERY: Duration = Duration::from_millis(250);

/// One master: its configuration and, once connected, its client.
pub(crate) struct Slot {
    /// Its place in the URL (0-based), for messages.
    pub(crate) index: usize,
    pub(crate) cfg: node::Config,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) node: Mutex<Option<Arc<Node>>>,
    pub(crate) reconnecting: AtomicBool,
    pub(crate) last_try: Mutex<Option<Instant>>,
    /// What all slots of one client share to tell their servers apart.
    pub(crate) identity: Arc<Identity>,
    /// The node's subscription to its revocation notices (see [`listen`]), kept while the
    /// node is this slot's.
    pub(crate) revocations: Mutex<Option<node::Waiting>>,
}

/// Subscribes `node` to its revocation notices (a `force_release` names the owner tokens it
/// took away; the leases watching them fire their lost signal), within `timeout`; `None`
/// (logged) when it cannot: those leases learn of a revocation at their next renewal.
pub(crate) async fn listen(node: &Node, timeout: Duration) -> Option<node::Waiting> {
    match tokio::time::timeout(timeout, node.listen_for_revocations()).await {
        Ok(Ok(w)) => w,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "cannot subscribe to a redlock master's revocation notices");
            None
        }
        Err(_) => {
            tracing::debug!("subscribing to a redlock master's revocation notices timed out");
            None
        }
    }
}

/// The masters' identities, shared by the slots of one client: a vote counts once per
/// redis-server process, so two entries of the URL that reach one server (`localhost` and
/// `127.0.0.1`, two DNS names) must not both vote.
pub(crate) struct Identity {
    /// Every slot, to compare a node connected late with the others.
    pub(crate) slots: OnceLock<Vec<Weak<Slot>>>,
    /// Held while a late node is identified and installed: two slots reaching one server at
    /// once must not both pass the check before either is installed.
    pub(crate) checking: tokio::sync::Mutex<()>,
    /// Why attempts are refused: set when a node connected late is the server of another slot.
    pub(crate) duplicate: OnceLock<String>,
}

/// The message of a master listed twice.
pub(crate) fn same_server<'a>(mut a: &'a Slot, mut b: &'a Slot, run_id: &str) -> String {
    if b.index < a.index {
        std::mem::swap(&mut a, &mut b);
    }
    format!(
        "nodes {} ({}) and {} ({}) are the same Redis server (run_id {run_id}): each master must \
         be listed once, or it votes twice and a majority of the list is not a majority of the \
         servers",
        a.index + 1,
        a.cfg.redacted(),
        b.index + 1,
        b.cfg.redacted(),
    )
}

/// The `run_id` of `node`'s server, or `None` (with a warning) when it would not say: a user
/// without the right to run `INFO` cannot be told apart, and is not refused for it.
pub(crate) async fn run_id_of(slot: &Slot, node: &Node) -> Option<String> {
    let mut conn = node.conn();
    let asked = node::server_run_id(&mut conn);
    match tokio::time::timeout(slot.response_timeout, asked).await {
        Ok(Ok(id)) => Some(id),
        Ok(Err(e)) => {
            tracing::warn!(node = %slot.cfg.redacted(), error = %e, "cannot tell which Redis server this master is (INFO server); it is not checked against the others");
            None
        }
        Err(_) => {
            tracing::warn!(node = %slot.cfg.redacted(), "INFO server timed out; this master is not checked against the others");
            None
        }
    }
}

impl Slot {
    /// The connected node, or `None` (and a background reconnection is started, unless this
    /// slot turned out to be another slot's server).
    pub(crate) fn get(self: &Arc<Self>) -> Option<Arc<Node>> {
        if let Some(n) = lock_mutex(&self.node).as_ref() {
            return Some(n.clone());
        }
        if self.identity.duplicate.get().is_none() {
            self.reconnect();
        }
        None
    }

    pub(crate) fn reconnect(self: &Arc<Self>) {
        {
            let mut last = lock_mutex(&self.last_try);
            if last.is_some_and(|t| t.elapsed() < RECONNECT_EVERY) {
                return;
            }
            if self.reconnecting.swap(true, Ordering::AcqRel) {
                return;
            }
            *last = Some(Instant::now());
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.reconnecting.store(false, Ordering::Release);
            return;
        };
        let slot = self.clone();
        rt.spawn(async move {
            if let Ok(Ok(n)) =
                tokio::time::timeout(slot.connect_timeout, Node::connect(&slot.cfg)).await
            {
                let revocations = listen(&n, slot.connect_timeout).await;
                *lock_mutex(&slot.revocations) = revocations;
                slot.install(Arc::new(n)).await;
            }
            slot.reconnecting.store(false, Ordering::Release);
        });
    }

    /// Installs a node connected after `connect` returned, unless its server is the one of
    /// another connected slot: then it never votes, and every attempt of this client fails
    /// with `InvalidConfig` (the configuration is wrong; held locks still renew and release).
    pub(crate) async fn install(self: &Arc<Self>, node: Arc<Node>) {
        let _checking = self.identity.checking.lock().await;
        if let Some(id) = run_id_of(self, &node).await {
            let others: Vec<(Arc<Slot>, Arc<Node>)> = self
                .identity
                .slots
                .get()
                .into_iter()
                .flatten()
                .filter_map(Weak::upgrade)
                .filter(|s| s.index != self.index)
                .filter_map(|s| {
                    let n = lock_mutex(&s.node).clone()?;
                    Some((s, n))
                })
                .collect();
            // Asked now, not remembered from connect: a server restarted since has a new one.
            let ids = futures::future::join_all(others.iter().map(|(s, n)| run_id_of(s, n))).await;
            if let Some((other, _)) = others
                .iter()
                .zip(&ids)
                .find(|(_, other_id)| other_id.as_deref() == Some(id.as_str()))
                .map(|(o, _)| o)
            {
                let msg = same_server(other, self, &id);
                tracing::error!("{msg}; this Redlock client refuses every lock from now on");
                let _ = self.identity.duplicate.set(msg);
                return;
            }
        }
        *lock_mutex(&self.node) = Some(node);
    }
}
