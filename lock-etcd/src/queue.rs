//! The acquisition recipe: one key per attempt under the lock's prefix, on a lease; the lowest
//! create revision holds; a waiter waits for its predecessor's deletion on the client's watch
//! and re-checks the queue on a timer; an acquisition that ends without the lock deletes its key
//! (in the background when the call is dropped).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use lockcore::backend::{
    AcquireRequest, Acquired, CancelCleanUp, CleanUpIfCancelled, CleanUpTask, OwnerToken,
};
use lockcore::{Error, ErrorKind, Instant, LockMode, Result};

use crate::backend::{EtcdBackend, ttl_secs};
use crate::errors::lease_not_found;
use crate::keeper::{LeaseCell, Renewal};
use crate::modes::{Next, conflict, deleted_down_to, deletions, key_suffix, next};
use crate::watch::{Dispatch, Floor, Wake};

/// How long a waiter waits on its watch before it re-checks the queue anyway, at most: a watch
/// can be silent (a member cut off from the quorum, before require-leader cancels it), and the
/// wait must still end once the lock is free. One keys-only read per waiter per period; the
/// waiter's lease TTL within these bounds (see `recheck_every`).
pub(crate) const RECHECK_MIN: Duration = Duration::from_secs(1);
pub(crate) const RECHECK_MAX: Duration = Duration::from_secs(10);

impl EtcdBackend {
    /// The recipe. `wait == false`: one transaction that puts the key only if the lock's
    /// directory is empty (a shared or permit try that finds holders it may join puts its key
    /// in a second one, only if no key came since it looked). Otherwise queue and wait without
    /// deadline (the caller bounds it by dropping the future; the queue clean-up then deletes
    /// the key in the background).
    pub(crate) async fn run(&self, req: &AcquireRequest, wait: bool) -> Result<Option<Acquired>> {
        let secs = ttl_secs(req.ttl);
        let dir = self.dir(&req.name);
        let mut queued = CleanUpIfCancelled::arm(
            QueueCleanUp {
                backend: self.clone(),
                token: Some(req.token),
                key: String::new(),
                secs,
                state: QueueState::Idle,
            },
            &req.background,
        );
        let dispatch = &self.inner.dispatch;
        let exclusive = req.mode == LockMode::Exclusive;
        let suffix = key_suffix(&req.mode);
        'enqueue: loop {
            // Each attempt puts a key named by its lease's id in hex, then the mode's suffix
            // (none for an exclusive one): etcd's `concurrency.Mutex` names its key so. A lease
            // comes back to the pool only once its key is deleted, so a name is reused only when
            // no key of that name exists: the clean-up of an abandoned attempt, still running,
            // can never meet the key of a later attempt (a re-put of an existing key would keep
            // its old create revision), and a name used lock after lock by one client leaves one
            // deleted key behind in etcd's index, not one per acquisition (every prefix read of
            // the queue walks the deleted keys not yet compacted: 5000 of them made the
            // acquiring transaction 4.5 times slower, 1,750 against 392 µs, on the test server
            // with `examples/etcd_dead_keys.rs`).
            self.inner.stats.attempts.fetch_add(1, Ordering::Relaxed);
            let (cell, fresh) = self.lease_for(secs).await?;
            let key = format!("{dir}{:x}{suffix}", cell.id);
            queued.key = key.clone();
            queued.state = QueueState::Sending(cell.clone());
            // Taken before the transaction: a deletion that races our subscriptions is logged.
            let floor = dispatch.floor();
            // A pooled lease is renewed when its lock is released: if that renewal is recent
            // (within 1 % of the TTL), its TTL counts from it and no keep-alive is needed here.
            let recent = !fresh && renewed_lately(&cell);
            let refresh = (!fresh && !recent).then(|| self.inner.keeper.refresh(cell.clone()));
            let sent_at = Instant::now();
            // The value is the holder's metadata (the owner token is in the key's name); a
            // campaign's is its value alone, as etcd's `concurrency.Election` writes it.
            let put = TxnOp::put(
                key.as_str(),
                key_value(req),
                Some(PutOptions::new().with_lease(cell.id)),
            );
            let empty = Compare::create_revision(dir.as_str(), CompareOp::Equal, 0).with_prefix();
            let queue = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_keys_only();
            let txn = if wait {
                Txn::new()
                    .when([empty])
                    .and_then([put.clone()])
                    .or_else([put.clone(), TxnOp::get(dir.as_str(), Some(queue))])
            } else {
                // An exclusive try needs the first key only (its mode tells a conflict); a
                // shared or permit try looks at every key it would queue behind.
                let queue = if exclusive {
                    queue.with_limit(1)
                } else {
                    queue
                };
                Txn::new()
                    .when([empty])
                    .and_then([put.clone()])
                    .or_else([TxnOp::get(dir.as_str(), Some(queue))])
            };
            let resp = match self.txn("acquiring the lock", txn).await {
                Ok(r) => r,
                // The pooled lease expired meanwhile: nothing was written.
                Err(e) if lease_not_found(&e) => {
                    queued.state = QueueState::Idle;
                    continue 'enqueue;
                }
                Err(e) => return Err(e),
            };
            // Our key's create revision: the transaction's own (the key name is new), as the
            // queue listing sent behind the put also shows.
            let listed_at = resp.header().map(|h| h.revision()).unwrap_or(0);
            let mut revision = listed_at;
            let mut listing = Vec::new();
            for op in resp.op_responses() {
                if let TxnOpResponse::Get(get) = op {
                    for kv in get.kvs() {
                        if kv.key() == key.as_bytes() {
                            revision = kv.create_revision();
                        } else {
                            listing.push((kv.key().to_vec(), kv.create_revision()));
                        }
                    }
                }
            }
            if resp.succeeded() || wait {
                queued.state = QueueState::Queued(cell.clone(), revision);
            } else {
                queued.state = QueueState::Idle;
            }
            // The keys ahead of ours (of a try, which put none: every key listed).
            let ahead: Vec<(&[u8], i64)> = listing
                .iter()
                .filter(|(_, created)| !wait || *created < revision)
                .map(|(k, created)| (k.as_slice(), *created))
                .collect();
            if let Some(e) = conflict(&req.mode, ahead.iter().map(|(k, _)| *k)) {
                if wait {
                    // Refused: take our key out at once, so that it is not in the way of the
                    // name's users (a failed delete is left to the clean-up and the lease).
                    let txn = Txn::new()
                        .when([Compare::create_revision(
                            key.as_str(),
                            CompareOp::Equal,
                            revision,
                        )])
                        .and_then([TxnOp::delete(key.as_str(), None)]);
                    if self.txn("withdrawing a refused key", txn).await.is_ok() {
                        queued.state = QueueState::Idle;
                        self.pool_put(secs, cell);
                    }
                } else {
                    self.pool_put(secs, cell);
                }
                return Err(e);
            }
            let step = if resp.succeeded() {
                Next::Hold
            } else {
                next(&req.mode, &ahead)
            };
            // The lease's TTL counts from the keep-alive sent with the transaction, or for a
            // new lease from its grant's send (the lease expires one TTL after the grant, not
            // after this transaction: counting from here would overstate the validity by the
            // grant's round trip).
            let (lease_sent, granted) = match refresh {
                None if recent => (sent_at, cell.expires().saturating_duration_since(sent_at)),
                None => (cell.expires() - cell.ttl, cell.ttl),
                Some(rx) => match rx.await {
                    Ok(Ok(Renewal::Alive { sent, ttl })) => (sent.min(sent_at), ttl),
                    Ok(Ok(Renewal::Gone)) => {
                        // The key (if put) died with the lease: start over with a new one.
                        queued.state = QueueState::Idle;
                        continue 'enqueue;
                    }
                    Ok(Err(e)) => {
                        return Err(Error::new(
                            ErrorKind::Unavailable,
                            format!("keeping the lock's lease alive: {e}"),
                        ));
                    }
                    Err(_) => {
                        return Err(Error::new(
                            ErrorKind::Unavailable,
                            "the lease keeper stopped",
                        ));
                    }
                },
            };
            let (keys, needed) = match step {
                Next::Hold if resp.succeeded() || wait => {
                    queued.disarm();
                    let lease = self.hold(req, cell, key, revision, floor);
                    return Ok(Some(
                        Acquired::new(lease, lease_sent).with_granted_ttl(granted),
                    ));
                }
                Next::Hold => {
                    // A shared or permit try that may join the holders it saw: put the key if
                    // no key was created since (one may only have left), else look again.
                    queued.state = QueueState::Sending(cell.clone());
                    let unchanged =
                        Compare::create_revision(dir.as_str(), CompareOp::Less, listed_at + 1)
                            .with_prefix();
                    let txn = Txn::new().when([unchanged]).and_then([put]);
                    let resp = match self.txn("joining the lock's holders", txn).await {
                        Ok(r) => r,
                        Err(e) if lease_not_found(&e) => {
                            queued.state = QueueState::Idle;
                            continue 'enqueue;
                        }
                        Err(e) => return Err(e),
                    };
                    if !resp.succeeded() {
                        queued.state = QueueState::Idle;
                        drop(floor);
                        self.pool_put(secs, cell);
                        continue 'enqueue;
                    }
                    let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
                    queued.disarm();
                    let lease = self.hold(req, cell, key, revision, floor);
                    return Ok(Some(
                        Acquired::new(lease, lease_sent).with_granted_ttl(granted),
                    ));
                }
                Next::Wait { .. } if !wait => {
                    drop(floor);
                    self.pool_put(secs, cell);
                    return Ok(None);
                }
                Next::Wait { keys, needed } => (keys, needed),
            };
            // Queued: keep the queue key alive while waiting.
            self.inner.keeper.keep(cell.clone(), None);
            let mut own = Some(dispatch.deleted(key.as_bytes(), revision, &floor));
            // An exclusive waiter waits for the keys ahead it knows (every one, when the queue
            // listed is short; see `exclusive_wait`); the others for what `next` says.
            let (mut keys, mut needed, mut complete) = (keys, needed, false);
            if exclusive {
                (keys, complete) = exclusive_wait(&ahead);
                needed = keys.len();
            }
            // An earlier attempt of ours ahead: the re-check deletes it (see there).
            let mut gone = (!keys.iter().any(|(k, _)| self.is_abandoned(&req.token, k)))
                .then(|| subscribe(dispatch, &keys, needed, &floor));
            drop(floor);
            let recheck = recheck_every(cell.ttl);
            // A keep-alive sent when one key was left ahead (see `wait_ahead`).
            let mut renewing = None;
            loop {
                if let Some((subs, needed)) = gone.take() {
                    // Queued and watching: the deletions ahead that let us in wake this waiter.
                    req.waiting.mark();
                    let all_gone = if exclusive {
                        self.wait_ahead(subs, complete, &cell, &mut renewing, &mut own, recheck)
                            .await
                    } else {
                        tokio::select! {
                            w = deletions(subs, needed) => {
                                if w == Wake::Deleted {
                                    self.inner.stats.wakeups.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            _ = wait_opt(&mut own) => {
                                // Our key was deleted (revoked, its lease expired), or the
                                // watch resynced. The re-check below tells: it compares our
                                // key's create revision, and queues again if the key is gone.
                                own = None;
                            }
                            // The watch may be silent (its member cut off from the quorum,
                            // before require-leader cancels it; an application's client
                            // without it): look anyway, so that a free lock is noticed within
                            // this period.
                            _ = tokio::time::sleep(recheck) => {}
                        }
                        false
                    };
                    // Every key that was ahead of ours is deleted, as the client's watch saw
                    // (no key can ever come ahead of ours: create revisions only grow), and
                    // our own key's deletion did not come first (its subscription is older
                    // than the deletions seen, and events are applied in revision order): the
                    // lock is ours without a look at the server (etcd's `concurrency.Mutex`
                    // reads the queue again here; the watch's events already tell).
                    let own_fired = all_gone
                        && own.as_mut().is_none_or(|o| {
                            o.try_recv() != Err(tokio::sync::oneshot::error::TryRecvError::Empty)
                        });
                    if own_fired {
                        // Deleted, or the watch resynced: the re-check below tells.
                        own = None;
                    } else if all_gone {
                        let Some((lease_sent, granted)) =
                            self.fresh_lease(&cell, renewing.take()).await?
                        else {
                            // The lease is gone, and our key with it: queue again.
                            self.inner.keeper.release(cell.id);
                            queued.state = QueueState::Idle;
                            continue 'enqueue;
                        };
                        queued.disarm();
                        let deleted = own.take().expect("checked above");
                        let lease = self.hold_watching(req, cell, key, revision, deleted);
                        return Ok(Some(
                            Acquired::new(lease, lease_sent).with_granted_ttl(granted),
                        ));
                    }
                }
                // Who is ahead of us now? Sent with a keep-alive so that the lease's TTL counts
                // from here if we hold the lock, unless the lease was renewed lately (within 1 %
                // of its TTL, as when this process released it just before queueing again).
                self.inner.stats.rechecks.fetch_add(1, Ordering::Relaxed);
                let floor = dispatch.floor();
                let refresh =
                    (!renewed_lately(&cell)).then(|| self.inner.keeper.refresh(cell.clone()));
                let sent_at = Instant::now();
                let ahead = GetOptions::new()
                    .with_prefix()
                    .with_max_create_revision(revision - 1)
                    .with_keys_only();
                // An exclusive waiter needs its predecessor only; a shared or permit one every
                // key ahead (the writers among them, or how many).
                let ahead = if exclusive {
                    ahead
                        .with_sort(SortTarget::Create, SortOrder::Descend)
                        .with_limit(WAIT_AHEAD as i64 + 1)
                } else {
                    ahead.with_sort(SortTarget::Create, SortOrder::Ascend)
                };
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        revision,
                    )])
                    .and_then([TxnOp::get(dir.as_str(), Some(ahead))]);
                let resp = self.txn("checking the lock queue", txn).await?;
                let renewal = match refresh {
                    Some(rx) => rx.await,
                    None => Ok(Ok(Renewal::Alive {
                        sent: sent_at,
                        ttl: cell.expires().saturating_duration_since(sent_at),
                    })),
                };
                if !resp.succeeded() || matches!(renewal, Ok(Ok(Renewal::Gone))) {
                    // Our key is gone: queue again.
                    self.inner.keeper.release(cell.id);
                    queued.state = QueueState::Idle;
                    continue 'enqueue;
                }
                if own.is_none() {
                    // The subscription fired (a resync): subscribe again.
                    own = Some(dispatch.deleted(key.as_bytes(), revision, &floor));
                }
                let mut listing = Vec::new();
                for op in resp.op_responses() {
                    if let TxnOpResponse::Get(get) = op {
                        listing.extend(
                            get.kvs()
                                .iter()
                                .map(|kv| (kv.key().to_vec(), kv.create_revision())),
                        );
                    }
                }
                if exclusive {
                    // Listed nearest first: in queue order, as `next` reads it.
                    listing.reverse();
                }
                let ahead: Vec<(&[u8], i64)> =
                    listing.iter().map(|(k, c)| (k.as_slice(), *c)).collect();
                match next(&req.mode, &ahead) {
                    Next::Wait { keys, needed } => {
                        let (keys, needed) = if exclusive {
                            // At most WAIT_AHEAD + 1 keys listed: every one ahead if fewer.
                            let (keys, all) = exclusive_wait(&ahead);
                            complete = all;
                            let n = keys.len();
                            (keys, n)
                        } else {
                            (keys, needed)
                        };
                        let mine: Vec<_> = keys
                            .iter()
                            .filter(|(k, _)| self.is_abandoned(&req.token, k))
                            .collect();
                        if mine.is_empty() {
                            gone = Some(subscribe(dispatch, &keys, needed, &floor));
                            drop(floor);
                            continue;
                        }
                        drop(floor);
                        // An earlier attempt of this same acquisition (the contract retries an
                        // attempt that failed `Unavailable` with the same token), whose
                        // clean-up failed or has not run yet: ours to delete, not to wait for
                        // until its lease expires. Then look again at once.
                        for (pred, created) in mine {
                            let txn = Txn::new()
                                .when([Compare::create_revision(*pred, CompareOp::Equal, *created)])
                                .and_then([TxnOp::delete(*pred, None)]);
                            self.txn_idempotent("deleting an abandoned attempt's key", txn)
                                .await?;
                        }
                    }
                    Next::Hold => {
                        let (lease_sent, granted) = match renewal {
                            Ok(Ok(Renewal::Alive { sent, ttl })) => (sent.min(sent_at), ttl),
                            // No answer to the keep-alive: count from the last one answered.
                            _ => (cell.expires() - cell.ttl, cell.ttl),
                        };
                        queued.disarm();
                        let lease = self.hold(req, cell, key, revision, floor);
                        return Ok(Some(
                            Acquired::new(lease, lease_sent).with_granted_ttl(granted),
                        ));
                    }
                }
            }
        }
    }
}

/// At most this many keys ahead are waited on at once by an exclusive waiter (each one is a
/// subscription on the client's watch, no request): with no more than this ahead, the waiter
/// knows every key that can keep it out, and takes the lock once they are gone, without a look
/// at the server.
pub(crate) const WAIT_AHEAD: usize = 32;

/// The keys ahead (in queue order) an exclusive waiter waits on: the [`WAIT_AHEAD`] nearest,
/// and whether they are every key ahead (then their deletions let it in; else it looks at the
/// queue again once they are gone). The list is every key ahead when it was read with the
/// waiter's key or after it: no key can come ahead of an existing one (create revisions only
/// grow), so the keys ahead only ever go.
fn exclusive_wait<'a>(ahead: &[(&'a [u8], i64)]) -> (Vec<(&'a [u8], i64)>, bool) {
    let from = ahead.len().saturating_sub(WAIT_AHEAD);
    (ahead[from..].to_vec(), from == 0)
}

impl EtcdBackend {
    /// An exclusive waiter's wait for the keys ahead of it (`subs`, their deletions on the
    /// client's watch). Returns whether every one was deleted; `false` when the waiter must look
    /// at the server: the list was not every key ahead (`complete` false), the watch resynced,
    /// our own key's subscription fired (then `own` is taken), or the re-check period passed
    /// (the watch may be silent: a member cut off from the quorum, before require-leader
    /// cancels it, or an application's client without it).
    ///
    /// When one key is left ahead (the holder, or the one about to hold) and the waiter's lease
    /// was not renewed lately, one keep-alive goes out (`renewing`), so that the lease is fresh
    /// when the lock comes: the hand-over then waits for no request. One waiter does this per
    /// hand-over (the one that is now second in line): no herd.
    async fn wait_ahead(
        &self,
        mut subs: Vec<tokio::sync::oneshot::Receiver<Wake>>,
        complete: bool,
        cell: &Arc<LeaseCell>,
        renewing: &mut Option<tokio::sync::oneshot::Receiver<KeepAliveAnswer>>,
        own: &mut Option<tokio::sync::oneshot::Receiver<Wake>>,
        recheck: Duration,
    ) -> bool {
        let timer = tokio::time::sleep(recheck);
        tokio::pin!(timer);
        loop {
            let renew_first = complete && renewing.is_none() && !renewed_lately(cell);
            let left = usize::from(renew_first);
            tokio::select! {
                w = deleted_down_to(&mut subs, left) => {
                    if w == Wake::Resync {
                        return false;
                    }
                    if subs.is_empty() {
                        self.inner.stats.wakeups.fetch_add(1, Ordering::Relaxed);
                        return complete;
                    }
                    *renewing = Some(self.inner.keeper.refresh(cell.clone()));
                }
                _ = wait_opt(own) => {
                    // Our key was deleted (revoked, its lease expired), or the watch resynced.
                    // The re-check tells: it compares our key's create revision, and queues
                    // again if the key is gone.
                    *own = None;
                    return false;
                }
                _ = &mut timer => return false,
            }
        }
    }

    /// The lease of a waiter that takes the lock with no request: its keep-alive sent when one
    /// key was left ahead (`renewing`), if that one still leaves the lease renewed lately (within
    /// 1 % of its TTL, as a pooled lease counts at acquisition); else one keep-alive now.
    /// Returns when the lease's TTL counts from and the TTL, or `None` if the lease is gone.
    async fn fresh_lease(
        &self,
        cell: &Arc<LeaseCell>,
        renewing: Option<tokio::sync::oneshot::Receiver<KeepAliveAnswer>>,
    ) -> Result<Option<(Instant, Duration)>> {
        if let Some(rx) = renewing
            && let Ok(Ok(Renewal::Gone)) = rx.await
        {
            return Ok(None);
        }
        let now = Instant::now();
        if renewed_lately(cell) {
            return Ok(Some((now, cell.expires().saturating_duration_since(now))));
        }
        match self.inner.keeper.refresh(cell.clone()).await {
            Ok(Ok(Renewal::Alive { sent, ttl })) => Ok(Some((sent, ttl))),
            Ok(Ok(Renewal::Gone)) => Ok(None),
            // No answer to the keep-alive: count from the last one answered.
            _ => Ok(Some((cell.expires() - cell.ttl, cell.ttl))),
        }
    }
}

/// What the keeper answers to one keep-alive.
type KeepAliveAnswer = std::result::Result<Renewal, String>;

/// What an acquisition's key holds: the holder's metadata ([`lockcore::Holder::encode`]), or
/// for a campaign the candidate's value alone (the holder's label), where etcd's
/// `concurrency.Election` (`etcdctl elect -l`, `Election::Leader`) reads a leader's proposal.
/// `inspect` tells the two apart (see `inspect::value_of`).
pub(crate) fn key_value(req: &AcquireRequest) -> String {
    if req.campaign {
        req.holder.label.clone().unwrap_or_default()
    } else {
        req.holder.encode()
    }
}

/// Subscribes to the deletion of each of `keys` (key, create revision) on the client's watch:
/// what [`deletions`] waits on for `needed` of them.
fn subscribe(
    dispatch: &Dispatch,
    keys: &[(&[u8], i64)],
    needed: usize,
    floor: &Floor,
) -> (Vec<tokio::sync::oneshot::Receiver<Wake>>, usize) {
    let subs = keys
        .iter()
        .map(|(k, created)| dispatch.deleted(k, *created, floor))
        .collect();
    (subs, needed)
}

/// Where an acquisition stands, for the clean-up when it ends without the lock.
pub(crate) enum QueueState {
    /// Nothing written.
    Idle,
    /// A transaction that may put the key is in flight.
    Sending(Arc<LeaseCell>),
    /// The key is in the queue with this create revision.
    Queued(Arc<LeaseCell>, i64),
}

/// Deletes this acquisition's queue key when it ends without the lock (cancelled, timed out,
/// failed): armed in a [`CleanUpIfCancelled`], disarmed when the lock is won; the delete runs
/// on the request's [`Background`] so that [`lockcore::Locker::flush`] waits for it. At worst
/// the key dies with its lease, which is no longer kept alive.
pub(crate) struct QueueCleanUp {
    pub(crate) backend: EtcdBackend,
    /// The acquisition's owner token, under which the key is remembered until it is deleted,
    /// for a retry of the acquisition (see `Inner::abandoned`); `None` for a multi-lock's keys,
    /// whose names carry the token.
    pub(crate) token: Option<OwnerToken>,
    pub(crate) key: String,
    pub(crate) secs: u64,
    pub(crate) state: QueueState,
}

impl CancelCleanUp for QueueCleanUp {
    fn start(self) -> Option<CleanUpTask> {
        let QueueCleanUp {
            backend,
            token,
            key,
            secs,
            state,
        } = self;
        let (cell, revision) = match state {
            QueueState::Idle => return None,
            QueueState::Sending(cell) => (cell, None),
            QueueState::Queued(cell, rev) => (cell, Some(rev)),
        };
        backend.inner.keeper.release(cell.id);
        if let Some(token) = token {
            backend.abandon(token, &key);
        }
        Some(Box::pin(async move {
            // Without a known revision the put may still be in flight: revoking the lease
            // removes the key whenever it lands (the lease is this acquisition's alone).
            let Some(rev) = revision else {
                let id = cell.id;
                let revoked = backend
                    .call_idempotent("revoking a lease", |mut c| async move {
                        c.lease_revoke(id).await
                    })
                    .await;
                if let (Ok(_), Some(token)) = (revoked, token) {
                    backend.forget_abandoned(token, &key);
                }
                return;
            };
            // The key name is this attempt's alone; the create revision and the lease make sure
            // anyway that only the key this attempt put is deleted.
            let txn = Txn::new()
                .when([
                    Compare::create_revision(key.as_str(), CompareOp::Equal, rev),
                    Compare::lease(key.as_str(), CompareOp::Equal, cell.id),
                ])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            match backend.txn_idempotent("deleting a queue key", txn).await {
                Ok(_) => {
                    if let Some(token) = token {
                        backend.forget_abandoned(token, &key);
                    }
                    backend.pool_put(secs, cell)
                }
                Err(e) => {
                    tracing::debug!(error = %e, "deleting a cancelled waiter's key failed; it dies with its lease");
                }
            }
        }))
    }
}

/// How long a waiter waits on its watch before it re-checks the queue: its lease's TTL (a
/// crashed predecessor's key lives about that long anyway), within [`RECHECK_MIN`] and
/// [`RECHECK_MAX`].
pub(crate) fn recheck_every(ttl: Duration) -> Duration {
    ttl.clamp(RECHECK_MIN, RECHECK_MAX)
}

/// Whether `cell`'s lease has at least 99 % of its TTL left (a keep-alive answered within the
/// last 1 % of the TTL): a lock taken with it counts that much as granted, without a keep-alive.
pub(crate) fn renewed_lately(cell: &LeaseCell) -> bool {
    renewed_within(cell, cell.ttl / 100)
}

/// Whether `cell`'s lease was renewed (a keep-alive or its grant answered) at most `ago` before
/// now: its TTL less `ago` is left at least.
pub(crate) fn renewed_within(cell: &LeaseCell, ago: Duration) -> bool {
    cell.expires() >= Instant::now() + cell.ttl.saturating_sub(ago)
}

pub(crate) async fn wait_opt(
    rx: &mut Option<tokio::sync::oneshot::Receiver<Wake>>,
) -> std::result::Result<Wake, tokio::sync::oneshot::error::RecvError> {
    match rx {
        Some(rx) => rx.await,
        None => std::future::pending().await,
    }
}

/// Tests that need the crate's insides (the client's watch), on the real server
/// (`LOCK_TEST_ETCD_URL`).
#[cfg(test)]
mod tests {
    use lockcore::LockName;
    use lockcore::backend::Backend;

    use super::*;

    fn scaled(d: Duration) -> Duration {
        d.mul_f64(conformance::time_scale())
    }

    /// Polls `cond` until it holds, failing after `within` (scaled).
    async fn eventually(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
        let end = Instant::now() + scaled(within);
        while !cond() {
            assert!(Instant::now() < end, "{what}: not within {within:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A deletion of an earlier key of the same name (still in the deletion log because an
    /// older floor is held, as by a waiter in the middle of its transaction) does not wake a
    /// subscriber to the newer key; the newer key's own deletion does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_earlier_deletion_of_the_same_name_does_not_wake_the_newer_key() {
        let Some(url) = conformance::require_env("LOCK_TEST_ETCD_URL") else {
            return;
        };
        let backend = EtcdBackend::connect(&url).await.unwrap();
        let dispatch = &backend.inner.dispatch;
        let key = format!(
            "{}k",
            backend
                .lock_prefix(format!("replay-{:08x}", fastrand::u32(..)))
                .unwrap()
        );
        let mut kv = backend.client().kv_client();
        let rev = |h: Option<&etcd_client::ResponseHeader>| h.unwrap().revision();
        let older = dispatch.floor();
        kv.put(key.as_str(), "", None).await.unwrap();
        let deleted = rev(kv.delete(key.as_str(), None).await.unwrap().header());
        eventually("the first deletion seen", Duration::from_secs(5), || {
            dispatch.revision() >= deleted
        })
        .await;
        let floor = dispatch.floor();
        let created = rev(kv.put(key.as_str(), "", None).await.unwrap().header());
        let mut rx = dispatch.deleted(key.as_bytes(), created, &floor);
        drop(floor);
        eventually("the re-put seen", Duration::from_secs(5), || {
            dispatch.revision() >= created
        })
        .await;
        assert_eq!(
            rx.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty),
            "the deletion of the earlier key woke the subscriber to the newer one"
        );
        kv.delete(key.as_str(), None).await.unwrap();
        let woke = tokio::time::timeout(scaled(Duration::from_secs(5)), rx)
            .await
            .expect("the newer key's deletion wakes");
        assert_eq!(woke, Ok(Wake::Deleted));
        drop(older);
    }

    /// A waiter whose watch is silent (muted here, as a watch on a member cut off from the
    /// quorum stays silent) still notices that the lock is free: it re-checks the queue within
    /// one re-check period (its lease TTL, at least 1 s) after the release.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_with_a_silent_watch_rechecks_within_the_bound() {
        let Some(url) = conformance::require_env("LOCK_TEST_ETCD_URL") else {
            return;
        };
        let holder = lockcore::Locker::new(EtcdBackend::connect(&url).await.unwrap());
        let backend = EtcdBackend::connect(&url).await.unwrap();
        backend.inner.dispatch.mute();
        let waiter = lockcore::Locker::new(backend.clone());
        let name = format!("silent-{:08x}", fastrand::u32(..));
        let ttl = Duration::from_secs(1);
        let opts = lockcore::LockOptions::new()
            .ttl(ttl)
            .auto_renew(lockcore::AutoRenew::until(Duration::from_secs(600)))
            .wait_timeout(scaled(Duration::from_secs(30)));
        let g = holder.try_lock(&name, &opts).await.unwrap().expect("free");
        let waiting = {
            let (waiter, name, opts) = (waiter.clone(), name.clone(), opts.clone());
            tokio::spawn(async move { waiter.lock(&name, &opts).await })
        };
        let lock_name = LockName::new(name.clone()).unwrap();
        let end = Instant::now() + scaled(Duration::from_secs(10));
        while backend.queued_waiters(&lock_name).await.unwrap() < 1 {
            assert!(Instant::now() < end, "the waiter did not queue");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Held (and renewed) past a few re-check periods: the re-checks see the holder.
        let rechecks = backend.stats().rechecks;
        let end = Instant::now() + scaled(Duration::from_secs(10));
        while backend.stats().rechecks < rechecks + 2 {
            assert!(
                Instant::now() < end,
                "the waiter did not re-check on its timer"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!waiting.is_finished(), "the waiter got a held lock");
        let released = Instant::now();
        g.release().await.unwrap();
        let g2 = tokio::time::timeout(recheck_every(ttl) + scaled(Duration::from_secs(2)), waiting)
            .await
            .expect("the waiter noticed the free lock within its re-check period")
            .unwrap()
            .unwrap();
        eprintln!("taken {:?} after the release", released.elapsed());
        assert_eq!(backend.stats().wakeups, 0, "the watch was not silent");
        g2.release().await.unwrap();
    }
}
