//! A held etcd lock: its key and lease, kept alive by the contract's renewals, moved to a new
//! lease when extended to another TTL, watched for deletion behind the holder.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use lockcore::backend::{AcquireRequest, Background, Lease, LostNotifier, async_trait};
use lockcore::{Error, ErrorKind, Instant, LostReason, Result};
use tokio::sync::watch as tokio_watch;

use crate::backend::{EtcdBackend, ttl_secs};
use crate::keeper::{LeaseCell, Renewal};
use crate::queue::renewed_within;
use crate::watch::{Floor, Wake};

impl EtcdBackend {
    /// Makes the lease of a won lock: kept alive until released or dropped, watched for
    /// deletion behind the holder.
    pub(crate) fn hold(
        &self,
        req: &AcquireRequest,
        cell: Arc<LeaseCell>,
        key: String,
        revision: i64,
        floor: Floor,
    ) -> EtcdLease {
        // The floor, taken before the winning transaction, covers a deletion racing this point.
        let deleted = self
            .inner
            .dispatch
            .deleted(key.as_bytes(), revision, &floor);
        drop(floor);
        self.hold_watching(req, cell, key, revision, deleted)
    }

    /// [`EtcdBackend::hold`] with the subscription to the key's deletion already made (by a
    /// waiter, since it queued: a deletion at any point after the key's creation fires it).
    pub(crate) fn hold_watching(
        &self,
        req: &AcquireRequest,
        cell: Arc<LeaseCell>,
        key: String,
        revision: i64,
        deleted: tokio::sync::oneshot::Receiver<Wake>,
    ) -> EtcdLease {
        let secs = ttl_secs(req.ttl);
        let (stop, stop_rx) = tokio_watch::channel(false);
        self.inner.keeper.release_cell(&cell);
        let shared = Arc::new(LeaseShared {
            backend: self.clone(),
            key,
            revision,
            lease: Mutex::new(Leases {
                current: (cell, secs),
                pending: None,
            }),
            lost: req.lost.clone(),
            background: req.background.clone(),
            moved: tokio::sync::Notify::new(),
            stop,
        });
        // The lease lives its TTL from the last keep-alive: the contract's watchdog extends it.
        tokio::spawn(watch_held(
            shared.clone(),
            req.lost.clone(),
            stop_rx,
            deleted,
        ));
        EtcdLease { shared }
    }
}

pub(crate) struct LeaseShared {
    pub(crate) backend: EtcdBackend,
    pub(crate) key: String,
    pub(crate) revision: i64,
    /// The lease the key is attached to, and the one an unfinished move may have put it on.
    pub(crate) lease: Mutex<Leases>,
    /// The holder's lost signal (fired by the keeper for a pending lease, see `Leases`).
    pub(crate) lost: LostNotifier,
    /// Where the revocation of a lease the key moved away from runs (`Locker::flush` waits).
    pub(crate) background: Background,
    /// Notified when the key moved to a new lease (the watcher re-arms its expiry timer).
    pub(crate) moved: tokio::sync::Notify,
    /// Set before the release deletes the key, so that the watcher does not report our own
    /// delete as a loss; also stops the watcher.
    pub(crate) stop: tokio_watch::Sender<bool>,
}

/// A lease with the TTL it was asked for in whole seconds (the pool's key).
pub(crate) type TtlLease = (Arc<LeaseCell>, u64);

pub(crate) struct Leases {
    /// The lease the key is known to be attached to. An extend to another TTL moves the key to
    /// a new lease.
    pub(crate) current: TtlLease,
    /// A lease the key may have moved to: a move whose transaction was sent but whose answer
    /// was not seen (an ambiguous failure, or the extend dropped meanwhile). Until the next
    /// extend or release reads the key and settles which lease carries it, the keeper keeps
    /// this one alive too (with the holder's lost signal: `ConnectionLost` if no keep-alive is
    /// acknowledged before it may expire), so that the key lives whichever lease it is on.
    pub(crate) pending: Option<TtlLease>,
}

impl LeaseShared {
    /// The lease the key is attached to now, and the TTL it was asked for (whole seconds).
    pub(crate) fn lease(&self) -> TtlLease {
        self.leases().current.clone()
    }

    pub(crate) fn pending(&self) -> Option<TtlLease> {
        self.leases().pending.clone()
    }

    pub(crate) fn leases(&self) -> std::sync::MutexGuard<'_, Leases> {
        self.lease.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the current lease alive once (a keep-alive on the client's stream, sent alongside
    /// a read of the key for ownership by create revision and lease): the lease's own TTL,
    /// counted from the keep-alive.
    pub(crate) async fn keep_alive(&self, cell: Arc<LeaseCell>) -> Result<Duration> {
        let refresh = self.backend.inner.keeper.refresh(cell.clone());
        let on = self.key_lease().await?;
        let renewal = match refresh.await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("renewing the etcd lease: {e}"),
                ));
            }
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    "the lease keeper stopped",
                ));
            }
        };
        match (renewal, on) {
            (Renewal::Gone, _) => Err(not_held("its lease expired or was revoked")),
            (Renewal::Alive { .. }, None) => Err(not_held("its key was deleted")),
            // Renewing a lease that does not carry the key would grant nothing.
            (Renewal::Alive { .. }, Some(lease)) if lease != cell.id => {
                Err(not_held("its key is on a lease this holder does not renew"))
            }
            (Renewal::Alive { ttl, .. }, Some(_)) => Ok(ttl),
        }
    }

    /// Settles an unfinished move (see `Leases::pending`): reads which lease carries the key
    /// and makes that one current, revoking the other. Nothing to do (no request) without one.
    pub(crate) async fn settle(&self) -> Result<()> {
        let Some((pending, secs)) = self.pending() else {
            return Ok(());
        };
        let on = self.key_lease().await?;
        let mut leases = self.leases();
        let current = leases.current.0.clone();
        // Another call settled it meanwhile.
        if leases
            .pending
            .as_ref()
            .is_none_or(|(p, _)| p.id != pending.id)
        {
            return Ok(());
        }
        match on {
            Some(lease) if lease == pending.id => {
                leases.current = (pending, secs);
                leases.pending = None;
                drop(leases);
                self.adopted(current.id);
                Ok(())
            }
            Some(lease) if lease == current.id => {
                leases.pending = None;
                drop(leases);
                self.revoke_in_background(pending.id);
                Ok(())
            }
            // Deleted, or on a lease we never asked for: not ours to renew. The watcher fires
            // the lost signal for a deletion; the pending lease is left to expire (it may
            // carry the key if the read was stale, and revoking it would free the lock sooner).
            _ => Err(not_held(
                "its key was deleted or is on a lease this holder does not renew",
            )),
        }
    }

    /// The key moved to the pending lease, now current: the holder renews it by `extend`
    /// from here on, not the keeper; the old lease carries no key any more.
    pub(crate) fn adopted(&self, old: i64) {
        let new = self.lease().0.id;
        self.backend.inner.keeper.release(new);
        self.moved.notify_one();
        self.revoke_in_background(old);
    }

    /// Moves the key to a new lease granted `secs` (etcd cannot change a lease's TTL): a grant,
    /// then one transaction that re-puts the key with the new lease only if its create revision
    /// is still ours (a put on an existing key keeps its create revision, so the fencing token
    /// and the queue position stay), then the old lease is revoked in the background. Returns
    /// the TTL granted, counted from the grant's send (after the caller's send time).
    ///
    /// From the transaction's send until its answer is seen, the new lease is pending (see
    /// `Leases::pending`): kept alive, never revoked while the key may be on it.
    pub(crate) async fn move_lease(&self, secs: u64) -> Result<Duration> {
        let backend = &self.backend;
        let new = backend.grant(secs).await?;
        backend
            .inner
            .keeper
            .keep(new.clone(), Some(self.lost.clone()));
        self.leases().pending = Some((new.clone(), secs));
        let put = TxnOp::put(
            self.key.as_str(),
            "",
            Some(PutOptions::new().with_lease(new.id).with_ignore_value()),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                self.revision,
            )])
            .and_then([put]);
        // On an error the put may or may not have landed: the new lease stays pending (kept
        // alive), and the next extend or release settles it. Revoking it here would delete the
        // key if the put landed, freeing the lock while the holder's validity runs on.
        let resp = backend
            .txn("moving the lock key to a new lease", txn)
            .await?;
        let mut leases = self.leases();
        if leases.pending.as_ref().is_none_or(|(p, _)| p.id != new.id) {
            // Settled by a concurrent call meanwhile.
            drop(leases);
            return if resp.succeeded() {
                Ok(new.ttl)
            } else {
                Err(not_held(
                    "its key was deleted (expired, revoked or released)",
                ))
            };
        }
        leases.pending = None;
        if !resp.succeeded() {
            drop(leases);
            self.revoke_in_background(new.id);
            return Err(not_held(
                "its key was deleted (expired, revoked or released)",
            ));
        }
        let granted = new.ttl;
        let (old, _) = std::mem::replace(&mut leases.current, (new, secs));
        drop(leases);
        self.adopted(old.id);
        Ok(granted)
    }

    /// Revokes a lease on the lock's background (covered by `Locker::flush`), best effort.
    pub(crate) fn revoke_in_background(&self, id: i64) {
        let backend = self.backend.clone();
        backend.inner.keeper.release(id);
        self.background.spawn(async move {
            if let Err(e) = backend
                .call_idempotent("revoking a lease", |mut c| async move {
                    c.lease_revoke(id).await
                })
                .await
            {
                tracing::debug!(error = %e, lease = id, "revoking a lease failed; it expires by its TTL");
            }
        });
    }

    /// The lease carrying our key (by create revision); `None` if the key is not ours any more.
    pub(crate) async fn key_lease(&self) -> Result<Option<i64>> {
        let resp = self
            .backend
            .call_idempotent("reading the lock key", |mut c| {
                let key = self.key.clone();
                async move { c.get(key, Some(GetOptions::new().with_keys_only())).await }
            })
            .await?
            .value;
        Ok(resp
            .kvs()
            .first()
            .filter(|kv| kv.create_revision() == self.revision)
            .map(|kv| kv.lease()))
    }
}

/// A held etcd lock: its key (the lowest create revision under the lock's prefix) and lease.
pub(crate) struct EtcdLease {
    pub(crate) shared: Arc<LeaseShared>,
}

impl fmt::Debug for EtcdLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLease")
            .field("key", &self.shared.key)
            .field("create_revision", &self.shared.revision)
            .field("lease", &format_args!("{:x}", self.shared.lease().0.id))
            .field(
                "pending_lease",
                &self.shared.pending().map(|(p, _)| format!("{:x}", p.id)),
            )
            .finish()
    }
}

pub(crate) fn not_held(why: &str) -> Error {
    Error::not_held(format!("the etcd lock is no longer held: {why}"))
}

#[async_trait]
impl Lease for EtcdLease {
    fn fencing_token(&self) -> Option<u64> {
        u64::try_from(self.shared.revision).ok()
    }

    /// The TTL the lease was asked with: one keep-alive of the lease, sent alongside a read of
    /// the key (ownership by create revision), granting the lease's TTL counted from the
    /// keep-alive. Another TTL: the key moves to a new lease granted that TTL (a grant and one
    /// owner-checked transaction; the old lease is revoked in the background), since etcd cannot
    /// change a lease's TTL.
    ///
    /// Cancel safety: dropping the future may or may not have renewed the lease or moved the
    /// key to the new one; the key keeps its create revision and owner either way. A lease the
    /// key may have moved to is kept alive until the next `extend` or `release` reads which
    /// lease carries the key (the other is then revoked), so the key never sits on a lease
    /// nobody renews; an unsent new lease expires by its TTL.
    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        let shared = &self.shared;
        let secs = ttl_secs(ttl);
        shared.settle().await?;
        let (cell, current) = shared.lease();
        if secs == current {
            shared.keep_alive(cell).await
        } else {
            shared.move_lease(secs).await
        }
    }

    /// Deletes the key if its create revision is still ours (the next waiter's watch fires).
    ///
    /// Cancel safety: dropping the future may leave the key until its lease expires (the
    /// delete may already have been applied, in which case the lock is free).
    async fn release(&self) -> Result<()> {
        let shared = &self.shared;
        shared.stop.send_replace(true);
        let inner = &shared.backend.inner;
        inner.keeper.release_cell(&shared.lease().0);
        let pending = shared.pending();
        if let Some((p, _)) = &pending {
            inner.keeper.release(p.id);
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                shared.key.as_str(),
                CompareOp::Equal,
                shared.revision,
            )])
            .and_then([TxnOp::delete(shared.key.as_str(), None)]);
        // Sent again if its connection breaks: deleting by create revision cannot remove
        // anyone else's key, and a release given up on there left the lock held for the
        // lease's whole TTL.
        let answer = shared
            .backend
            .txn_idempotent("releasing the lock", txn)
            .await?;
        let deleted = answer.value.succeeded();
        // The key gone when the delete was sent again: the copy whose connection broke
        // deleted it, as far as can be told (it may also have expired meanwhile, so its lease
        // is not reused).
        let deleted_before = !deleted && answer.maybe_applied_before;
        // Read after the transaction: an extend that moved the key to a new lease has swapped it.
        let (cell, secs) = shared.lease();
        if let Some((p, _)) = pending {
            // The key was on one of the two, and is deleted (or gone) now: neither is reused.
            shared.backend.revoke_later(p.id);
            shared.backend.revoke_later(cell.id);
            return if deleted || deleted_before {
                Ok(())
            } else {
                Err(not_held(
                    "its key was deleted (expired, revoked or released)",
                ))
            };
        }
        if deleted {
            // Renewed now, off the next acquisition's path: that one then needs no keep-alive.
            // Not again if it was renewed within the last half percent of its TTL (as a lock
            // released soon after it was taken, or a lease released again and again in a loop):
            // the next acquisition within another half percent still finds it renewed lately,
            // and a release costs its one request, as etcd's `concurrency.Mutex`'s `Unlock`.
            if !renewed_within(&cell, cell.ttl / 200) {
                drop(inner.keeper.refresh(cell.clone()));
            }
            shared.backend.pool_put(secs, cell);
            Ok(())
        } else {
            shared.backend.revoke_later(cell.id);
            if deleted_before {
                Ok(())
            } else {
                Err(not_held(
                    "its key was deleted (expired, revoked or released)",
                ))
            }
        }
    }
}

/// Fires the lost signal when the held key is deleted by someone else; frees the lock when its
/// lease runs out unrenewed while the guard lives; stops keeping the lease alive once nobody
/// holds the guard any more.
pub(crate) async fn watch_held(
    shared: Arc<LeaseShared>,
    lost: LostNotifier,
    mut stop: tokio_watch::Receiver<bool>,
    mut deleted: tokio::sync::oneshot::Receiver<Wake>,
) {
    let backend = &shared.backend;
    loop {
        let stopped = stop.clone();
        // Taken before reading the lease: a move after this point wakes the loop to re-arm.
        let moved = shared.moved.notified();
        let expires = shared.lease().0.expires();
        tokio::select! {
            _ = async { drop(stop.wait_for(|s| *s).await) } => return,
            _ = moved => {}
            _ = tokio::time::sleep_until(expires) => {
                // A renewal (or a move to a new lease) answered meanwhile pushed the end back.
                if shared.lease().0.expires() > Instant::now() || *stopped.borrow() {
                    continue;
                }
                // The lease ran out without a renewal; the holder's validity ended earlier (it
                // is this end minus the drift margin). Free the lock now, as the server would
                // at its next expiry sweep (every 500 ms), so that a lease ends at its TTL.
                let cell = shared.lease().0;
                backend.inner.keeper.release(cell.id);
                lost.fire(LostReason::ValidityExpired);
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        shared.key.as_str(),
                        CompareOp::Equal,
                        shared.revision,
                    )])
                    .and_then([TxnOp::delete(shared.key.as_str(), None)]);
                if let Err(e) = backend
                    .txn_idempotent("deleting an expired lock key", txn)
                    .await {
                    tracing::debug!(error = %e, "deleting an expired lock key failed; it expires with its lease");
                }
                return;
            }
            _ = lost.closed() => {
                // The guard is gone without a release (abandoned): the lock frees by its TTL
                // (that of the lease an unfinished move may have put the key on, too).
                backend.inner.keeper.release(shared.lease().0.id);
                if let Some((p, _)) = shared.pending() {
                    backend.inner.keeper.release(p.id);
                }
                return;
            }
            w = &mut deleted => {
                // After a resync, look (with a new subscription taken first).
                let floor = backend.inner.dispatch.floor();
                let gone = match w {
                    Ok(Wake::Deleted) => true,
                    _ => shared.key_lease().await.map(|l| l.is_none()).unwrap_or(false),
                };
                if *stopped.borrow() {
                    return;
                }
                if gone {
                    backend.inner.keeper.release(shared.lease().0.id);
                    if let Some((p, _)) = shared.pending() {
                        backend.inner.keeper.release(p.id);
                    }
                    if lost.fire(LostReason::RenewalRefused) {
                        backend.inner.stats.deleted_behind.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(key = %shared.key, "etcd lock key deleted behind its holder");
                    }
                    return;
                }
                deleted = backend
                    .inner
                    .dispatch
                    .deleted(shared.key.as_bytes(), shared.revision, &floor);
            }
        }
    }
}
