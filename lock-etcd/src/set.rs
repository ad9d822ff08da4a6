//! A multi-lock in one transaction: the recipe's uncontended `try_lock` for every member at
//! once. "If every member's directory is empty, put one key in each" (each on a lease of its
//! own), else a keys-only read of the first key of each directory, to name the busy member.
//!
//! The transaction keeps the recipe's layout, so it keeps every invariant of the queue: each
//! member's key is the only key of its directory when it is put, so it has the lowest create
//! revision there (it holds), and a key of any other client already there (a holder, a queued
//! waiter of locksmith, a `concurrency.Mutex` key of `etcdctl lock`, whatever its name) makes
//! the compare fail, so a set never holds beside one and never jumps a queue. A waiter or a
//! Mutex arriving after the set queues behind its key as behind any holder's.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use lockcore::backend::{
    AcquireRequest, Acquired, CancelCleanUp, CleanUpIfCancelled, CleanUpTask, SetAttempt,
};
use lockcore::{Error, ErrorKind, Instant, LockMode, Result};

use crate::backend::{EtcdBackend, ttl_secs};
use crate::errors::lease_not_found;
use crate::keeper::{LeaseCell, Renewal};
use crate::modes::conflict;
use crate::queue::{QueueCleanUp, QueueState, renewed_lately};

impl EtcdBackend {
    /// One transaction for the whole set (see the module docs): every lease, or none and the
    /// index of the first member whose directory has a key.
    pub(crate) async fn try_set(&self, reqs: &[AcquireRequest]) -> Result<SetAttempt> {
        if let Some(r) = reqs.iter().find(|r| r.mode != LockMode::Exclusive) {
            return Err(Error::unsupported(format!(
                "etcd takes exclusive sets in one transaction, not {}",
                r.mode
            )));
        }
        let Some(first) = reqs.first() else {
            return Ok(SetAttempt::All(Vec::new()));
        };
        let dispatch = &self.inner.dispatch;
        let dirs: Vec<String> = reqs.iter().map(|r| self.dir(&r.name)).collect();
        'attempt: loop {
            // A lease per member: released one by one, each goes back to the pool or is
            // extended to another TTL on its own.
            let mut cells: Vec<(Arc<LeaseCell>, bool, u64)> = Vec::with_capacity(reqs.len());
            for req in reqs {
                let secs = ttl_secs(req.ttl);
                let (cell, fresh) = self.lease_for(secs).await?;
                cells.push((cell, fresh, secs));
            }
            let keys: Vec<String> = reqs
                .iter()
                .zip(&dirs)
                .map(|(req, dir)| {
                    let attempt = self.inner.stats.attempts.fetch_add(1, Ordering::Relaxed);
                    format!("{dir}{}-{attempt:x}", req.token.to_hex())
                })
                .collect();
            // From here the puts may land: a drop revokes every lease (removing its key).
            let mut pending = CleanUpIfCancelled::arm(
                SetCleanUp(
                    cells
                        .iter()
                        .zip(&keys)
                        .map(|((cell, _, secs), key)| QueueCleanUp {
                            backend: self.clone(),
                            token: None,
                            key: key.clone(),
                            secs: *secs,
                            state: QueueState::Sending(cell.clone()),
                        })
                        .collect(),
                ),
                &first.background,
            );
            // Taken before the transaction: a deletion racing the holders' subscriptions.
            let floors: Vec<_> = reqs.iter().map(|_| dispatch.floor()).collect();
            let refreshes: Vec<_> = cells
                .iter()
                .map(|(cell, fresh, _)| {
                    let recent = !fresh && renewed_lately(cell);
                    let refresh =
                        (!fresh && !recent).then(|| self.inner.keeper.refresh(cell.clone()));
                    (recent, refresh)
                })
                .collect();
            let sent_at = Instant::now();
            let empty = dirs.iter().map(|dir| {
                Compare::create_revision(dir.as_str(), CompareOp::Equal, 0).with_prefix()
            });
            let puts = reqs
                .iter()
                .zip(&keys)
                .zip(&cells)
                .map(|((req, key), (cell, _, _))| {
                    TxnOp::put(
                        key.as_str(),
                        req.holder.encode(),
                        Some(PutOptions::new().with_lease(cell.id)),
                    )
                });
            let firsts = dirs.iter().map(|dir| {
                TxnOp::get(
                    dir.as_str(),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Create, SortOrder::Ascend)
                            .with_keys_only()
                            .with_limit(1),
                    ),
                )
            });
            let txn = Txn::new()
                .when(empty.collect::<Vec<_>>())
                .and_then(puts.collect::<Vec<_>>())
                .or_else(firsts.collect::<Vec<_>>());
            let resp = match self.txn("acquiring a set of locks", txn).await {
                Ok(r) => r,
                // A pooled lease expired meanwhile: nothing was written.
                Err(e) if lease_not_found(&e) => {
                    pending.disarm();
                    continue 'attempt;
                }
                Err(e) => return Err(e),
            };
            if !resp.succeeded() {
                // Nothing written: the first member with a key is busy.
                pending.disarm();
                let mut busy = None;
                for (i, op) in resp.op_responses().iter().enumerate() {
                    if let TxnOpResponse::Get(get) = op
                        && !get.kvs().is_empty()
                    {
                        if let Some(e) =
                            conflict(&reqs[i].mode, get.kvs().iter().map(|kv| kv.key()))
                        {
                            self.pool_all(cells);
                            return Err(e);
                        }
                        busy.get_or_insert(i);
                    }
                }
                self.pool_all(cells);
                return Ok(SetAttempt::Busy(busy.unwrap_or(0)));
            }
            let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            for c in pending.0.iter_mut() {
                if let QueueState::Sending(cell) = &c.state {
                    c.state = QueueState::Queued(cell.clone(), revision);
                }
            }
            // Each lease's TTL counts from its keep-alive, as the single recipe's.
            let mut granted = Vec::with_capacity(reqs.len());
            let mut gone = false;
            for (i, ((cell, fresh, _), (recent, refresh))) in
                cells.iter().zip(refreshes).enumerate()
            {
                let g = match refresh {
                    None if recent => (sent_at, cell.expires().saturating_duration_since(sent_at)),
                    None => {
                        debug_assert!(*fresh || recent);
                        (cell.expires() - cell.ttl, cell.ttl)
                    }
                    Some(rx) => match rx.await {
                        Ok(Ok(Renewal::Alive { sent, ttl })) => (sent.min(sent_at), ttl),
                        Ok(Ok(Renewal::Gone)) => {
                            // That member's key died with its lease: the set is not whole.
                            pending.0[i].state = QueueState::Idle;
                            gone = true;
                            continue;
                        }
                        Ok(Err(e)) => {
                            return Err(Error::new(
                                ErrorKind::Unavailable,
                                format!("keeping a set member's lease alive: {e}"),
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
                granted.push(g);
            }
            if gone {
                // Delete the other members' keys before trying again (our own keys would
                // make the next attempt lose).
                drop(floors);
                let clean_up = std::mem::take(&mut pending.0);
                pending.disarm();
                for task in clean_up.into_iter().filter_map(CancelCleanUp::start) {
                    task.await;
                }
                continue 'attempt;
            }
            pending.disarm();
            let acquired = reqs
                .iter()
                .zip(cells)
                .zip(keys)
                .zip(floors)
                .zip(granted)
                .map(|((((req, (cell, _, _)), key), floor), (lease_sent, ttl))| {
                    let lease = self.hold(req, cell, key, revision, floor);
                    Acquired::new(lease, lease_sent).with_granted_ttl(ttl)
                })
                .collect();
            return Ok(SetAttempt::All(acquired));
        }
    }

    /// Puts back the leases of a set that wrote nothing.
    fn pool_all(&self, cells: Vec<(Arc<LeaseCell>, bool, u64)>) {
        for (cell, _, secs) in cells {
            self.pool_put(secs, cell);
        }
    }
}

/// The clean-up of a set attempt: each member's, as a single acquisition's (revoke a lease whose
/// put may be in flight, delete a key put).
struct SetCleanUp(Vec<QueueCleanUp>);

impl CancelCleanUp for SetCleanUp {
    fn start(self) -> Option<CleanUpTask> {
        self.0.start()
    }
}
