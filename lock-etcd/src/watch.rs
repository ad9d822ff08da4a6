//! One long-lived watch per client over the whole lock namespace, which waiters and holders
//! subscribe to.
//!
//! etcd 3.4 sends events at once only to *synced* watchers; a watch created at a past or the
//! current revision is served by a background loop every 100 ms, which is what makes a new watch
//! per wait (Go's `concurrency.Mutex`) hand over at ~40/s. This watch is created once, from the
//! current state, and stays synced; waiting on a key is then a local subscription.
//!
//! A waiter learns its predecessor only from the reply to its own transaction, and the
//! predecessor may be deleted before it subscribes to that key. So a waiter takes a [`Floor`]
//! *before* sending the transaction: while any floor is held, deletions are logged from the
//! oldest floor's revision on, and a subscription first looks in that log.
//!
//! A subscription names the create revision of the key it waits on, and only a deletion at a
//! later revision wakes it: a deletion of an earlier key of the same name (still in the log, or
//! replayed by a watch catching up) says nothing about the key the subscriber knows.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{EventType, WatchClient, WatchOptions, WatchRequestSender, WatchResponseStream};

type Opened = (WatchRequestSender, WatchResponseStream);
use lockcore::Result;
use tokio::sync::oneshot;

/// Why a subscription woke up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The key was deleted (or expired with its lease).
    Deleted,
    /// The watch was re-established and events may have been missed: look at the server.
    Resync,
}

#[derive(Default)]
struct State {
    /// The revision up to which events have been processed.
    revision: i64,
    /// Subscriptions by key: the create revision of the key each waits on, and its sender.
    interests: HashMap<Vec<u8>, Vec<(i64, oneshot::Sender<Wake>)>>,
    /// Deletions (revision, key) since the oldest floor.
    log: VecDeque<(i64, Vec<u8>)>,
    /// Live floors: revision -> count.
    floors: BTreeMap<i64, usize>,
    /// Counts watch (re)establishments; a waiter that saw another value must re-check.
    epoch: u64,
    /// Watch events received (for tests and figures).
    events: u64,
    /// Tests only: drop every event, as a watch on a member cut off from the quorum stays
    /// silent.
    #[cfg(test)]
    muted: bool,
}

/// The shared side of the watch task.
#[derive(Clone)]
pub(crate) struct Dispatch {
    state: Arc<Mutex<State>>,
}

/// Held by a waiter from before its transaction until it stops waiting: deletions after this
/// point are logged so that a late subscription still sees them.
pub(crate) struct Floor {
    state: Arc<Mutex<State>>,
    revision: i64,
    epoch: u64,
}

impl Drop for Floor {
    fn drop(&mut self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = s.floors.get_mut(&self.revision) {
            *n -= 1;
            if *n == 0 {
                s.floors.remove(&self.revision);
            }
        }
        prune(&mut s);
    }
}

fn prune(s: &mut State) {
    match s.floors.keys().next().copied() {
        None => s.log.clear(),
        Some(min) => {
            while s.log.front().is_some_and(|(rev, _)| *rev <= min) {
                s.log.pop_front();
            }
        }
    }
}

impl Dispatch {
    /// Starts watching every key under `prefix` from the current revision. Returns once the
    /// server confirmed the watch, so that the first waiter already has a synced watch.
    pub(crate) async fn start(
        client: WatchClient,
        prefix: Vec<u8>,
        timeout: Duration,
    ) -> Result<Dispatch> {
        let dispatch = Dispatch {
            state: Arc::new(Mutex::new(State::default())),
        };
        let (stream, revision) = open(client.clone(), &prefix, None, timeout)
            .await
            .map_err(|e| crate::errors::map_err("starting the etcd watch", e))?;
        dispatch.lock().revision = revision;
        tokio::spawn(run(
            Arc::downgrade(&dispatch.state),
            client,
            prefix,
            stream,
            timeout,
        ));
        Ok(dispatch)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts logging deletions from now on (see the module docs).
    pub(crate) fn floor(&self) -> Floor {
        let mut s = self.lock();
        let revision = s.revision;
        *s.floors.entry(revision).or_default() += 1;
        Floor {
            state: self.state.clone(),
            revision,
            epoch: s.epoch,
        }
    }

    /// Resolves when `key`, created at revision `created`, is deleted (a deletion at a later
    /// revision than `created`: an earlier key of the same name does not count). `floor` must
    /// have been taken before the request that showed the key existing.
    pub(crate) fn deleted(
        &self,
        key: &[u8],
        created: i64,
        floor: &Floor,
    ) -> oneshot::Receiver<Wake> {
        let (tx, rx) = oneshot::channel();
        let mut s = self.lock();
        if s.epoch != floor.epoch {
            let _ = tx.send(Wake::Resync);
        } else if s.log.iter().any(|(rev, k)| *rev > created && k == key) {
            let _ = tx.send(Wake::Deleted);
        } else {
            s.interests
                .entry(key.to_vec())
                .or_default()
                .push((created, tx));
        }
        rx
    }

    /// Tests only: from now on the watch delivers nothing (see `State::muted`).
    #[cfg(test)]
    pub(crate) fn mute(&self) {
        self.lock().muted = true;
    }

    /// The revision up to which events have been processed.
    #[cfg(test)]
    pub(crate) fn revision(&self) -> i64 {
        self.lock().revision
    }

    /// Watch events received so far.
    pub(crate) fn events(&self) -> u64 {
        self.lock().events
    }

    fn apply(state: &Mutex<State>, resp: &etcd_client::WatchResponse) {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        #[cfg(test)]
        if s.muted {
            return;
        }
        s.events += resp.events().len() as u64;
        for ev in resp.events() {
            if ev.event_type() != EventType::Delete {
                continue;
            }
            let Some(kv) = ev.kv() else { continue };
            let rev = kv.mod_revision();
            if !s.floors.is_empty() {
                s.log.push_back((rev, kv.key().to_vec()));
            }
            if let Some(waiters) = s.interests.remove(kv.key()) {
                // Only subscribers to a key created before this deletion: a later one waits on
                // a newer key of the same name.
                let (woken, later): (Vec<_>, Vec<_>) =
                    waiters.into_iter().partition(|(created, _)| *created < rev);
                for (_, w) in woken {
                    let _ = w.send(Wake::Deleted);
                }
                if !later.is_empty() {
                    s.interests.insert(kv.key().to_vec(), later);
                }
            }
        }
        if let Some(h) = resp.header() {
            s.revision = s.revision.max(h.revision());
        }
        // Drop subscriptions whose waiter went away.
        if s.interests.len() > 64 {
            s.interests.retain(|_, v| {
                v.retain(|(_, w)| !w.is_closed());
                !v.is_empty()
            });
        }
    }

    fn resync(state: &Mutex<State>) {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        s.epoch += 1;
        for (_, waiters) in s.interests.drain() {
            for (_, w) in waiters {
                let _ = w.send(Wake::Resync);
            }
        }
    }
}

/// Opens the watch from `start` (the current revision when `None`) and waits for the server's
/// confirmation; returns the stream and the revision it starts after.
async fn open(
    mut client: WatchClient,
    prefix: &[u8],
    start: Option<i64>,
    timeout: Duration,
) -> std::result::Result<(Opened, i64), etcd_client::Error> {
    let mut options = WatchOptions::new().with_prefix();
    if let Some(rev) = start {
        options = options.with_start_revision(rev);
    }
    let fut = async {
        let stream = client.watch(prefix.to_vec(), Some(options)).await?;
        // The request sender must live as long as the stream: the watch ends when it closes.
        let (sender, mut responses) = stream.split();
        loop {
            match responses.message().await? {
                Some(r) if r.created() => {
                    let rev = r.header().map(|h| h.revision()).unwrap_or(0);
                    return Ok(((sender, responses), rev));
                }
                Some(_) => continue,
                None => {
                    return Err(etcd_client::Error::WatchError(
                        "the watch stream closed before it was created".into(),
                    ));
                }
            }
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(etcd_client::Error::WatchError(format!(
            "no watch confirmation within {timeout:?}"
        ))),
    }
}

async fn run(
    state: std::sync::Weak<Mutex<State>>,
    client: WatchClient,
    prefix: Vec<u8>,
    mut stream: Opened,
    timeout: Duration,
) {
    loop {
        // Read until the stream ends or fails.
        loop {
            let msg = tokio::select! {
                m = stream.1.message() => m,
                // Stop once the backend is gone.
                _ = tokio::time::sleep(Duration::from_secs(1)) => {
                    if state.strong_count() == 0 {
                        return;
                    }
                    continue;
                }
            };
            let Some(state) = state.upgrade() else { return };
            match msg {
                Ok(Some(resp)) => {
                    if resp.canceled() {
                        tracing::debug!(
                            reason = resp.cancel_reason(),
                            compact = resp.compact_revision(),
                            "the etcd watch was cancelled"
                        );
                        if resp.compact_revision() > 0 {
                            // Events before the compaction are gone: go on from there (and
                            // everyone re-checks the server below).
                            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                            s.revision = s.revision.max(resp.compact_revision() - 1);
                        }
                        break;
                    }
                    Dispatch::apply(&state, &resp);
                }
                Ok(None) | Err(_) => break,
            }
        }
        // Re-establish from the next revision (events retained since are replayed); whoever
        // waits re-checks the server in any case.
        let mut pause = Duration::from_millis(20);
        loop {
            let Some(st) = state.upgrade() else { return };
            let next = st.lock().unwrap_or_else(|e| e.into_inner()).revision + 1;
            drop(st);
            match open(client.clone(), &prefix, Some(next), timeout).await {
                Ok((s, _)) => {
                    stream = s;
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "re-establishing the etcd watch failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
        if let Some(st) = state.upgrade() {
            Dispatch::resync(&st);
        }
    }
}
