//! Negative controls of the primitives: the memory reference backend behind a wrapper that
//! makes one classic semaphore or read-write lock mistake. Each must fail the primitive
//! scenarios named in `main.rs`; the wrapper without a flaw passes them all.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use conformance::Harness;
use lockcore::backend::{
    AcquireRequest, Acquired, Backend, Backoff, BoxLease, Lease, LostNotifier, SetAttempt,
    poll_acquire,
};
use lockcore::memory::MemoryBackend;
use lockcore::{
    Capabilities, Ended, ErrorKind, Instant, LockInfo, LockMode, LockName, Locker, Result,
};

/// The mistake a wrapped backend makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PrimitiveFlaw {
    /// None: the memory backend's primitives as they are.
    None,
    /// Counts one permit too many (an off-by-one in the limit check).
    LimitPlusOne,
    /// Keeps each limit's holders apart (a key per limit): clients that disagree about N share
    /// nothing, and up to the sum of their limits hold at once.
    LimitSplitPerClient,
    /// Takes writers as readers: a writer holds beside readers and other writers.
    WritersShare,
    /// Permits without a TTL that ends with the holder (Redisson's plain `RSemaphore`): a
    /// crashed holder's permit is gone for a long time.
    PermitOutlivesCrash,
    /// Writers poll instead of queueing (reader preference): readers arriving after a waiting
    /// writer join the readers holding, and a stream of them starves the writer.
    WritersDoNotQueue,
    /// Exclusive leases end on the server at half their TTL: a leader whose renewals stopped is
    /// replaced before its own validity deadline, so before its lost signal (two leaders).
    LeaseEndsEarly,
    /// Declares multi-locks atomic but takes a set one member at a time (a sequence of single
    /// acquisitions with a round trip between them): another client sees part of a set held.
    MultiIsASequence,
    /// Takes a set one member at a time in the order its client was given (every other client
    /// the reverse of the canonical order), waiting for a busy member while holding the ones
    /// taken: two clients taking the same names in opposite orders deadlock.
    MultiInClientOrder,
    /// A writer's renewal rewrites its entry as a share: a renewed writer lets readers in.
    WriterRenewedAsShare,
    /// A permit's renewal writes its expiry in the wrong unit (the TTL's milliseconds taken as
    /// microseconds): a renewed permit runs out at once, a permit too many.
    PermitRenewalShortens,
    /// A permit's renewal writes its expiry in the wrong unit the other way (a minute per
    /// second): a renewed permit whose holder crashes comes back a minute late.
    PermitRenewalLengthens,
    /// A permit granted from the queue (to a waiter) is written without the waiter's TTL (a
    /// minute per second): a holder that crashes after winning by waiting leaks it.
    QueuedPermitLeaks,
    /// A share granted to a reader that waited (behind a writer) is written without the
    /// reader's TTL (a minute per second): a reader that crashes after winning by waiting
    /// leaks its share.
    QueuedReaderLeaks,
    /// A writer granted the lock from behind readers (it waited for them to leave) is written
    /// without its TTL (a minute per second): a writer that crashes after winning by waiting
    /// leaks the lock.
    QueuedWriterLeaks,
    /// A renewal that finds the lock gone (revoked behind the holder) reports success, and the
    /// server's revocation notice is not listened to: a deposed leader keeps saying it leads.
    RenewalBlindToRevocation,
    /// A waiting writer's hold on new readers lapses after 2 s of waiting (its mark expires
    /// and is not refreshed): the writer then polls, and later readers join the one holding.
    WriterMarkLapses,
    /// A permit given back wakes no waiter: the waiter gets it at a later look, [`LATE`] late.
    PermitWakeLate,
    /// The last reader leaving wakes no waiting writer: it gets the lock [`LATE`] late.
    LastReaderWakeLate,
    /// A lease running out wakes no waiter: it gets the lock [`LATE`] late.
    ExpiryWakeLate,
    /// A force release wakes no waiter: it gets the lock [`LATE`] late.
    RevokeWakeLate,
    /// A set is written without its expiry (a day) and given its TTL a round trip later: a
    /// `try_lock_all` cancelled in between leaves the set held for a day.
    SetTtlSetLater,
    /// A client sweeps the permits it judges expired by its own clock before asking for one:
    /// one whose clock runs ahead frees live holders' permits.
    PermitSweepByClientClock,
    /// A candidate judges the leader's expiry by its own clock and deletes a lease it finds
    /// expired: one whose clock runs ahead deposes a live leader.
    LeaderJudgedByClientClock,
    /// Declares the memory backend's prompt loss detection (pushed at once) but reports a
    /// lease lost behind its holder [`LOSS_LATE`] late (a notification handled by a slow
    /// loop): a revoked holder acts on a lock it no longer has for that long.
    LossReportedLate,
    /// A reader's share is written without its expiry (a day) and given its TTL a round trip
    /// later: a reader's acquire cancelled in between (on the wire, or granted as it waited)
    /// leaves the share, and writers out, for a day.
    ShareTtlSetLater,
    /// [`PrimitiveFlaw::ShareTtlSetLater`] for a permit: a permit's acquire cancelled in the
    /// round trip leaves the permit taken for a day.
    PermitTtlSetLater,
}

/// The round trip between a `*TtlSetLater` share or permit and its TTL.
const TTL_LATER: Duration = Duration::from_millis(20);

/// How late [`PrimitiveFlaw::LossReportedLate`] reports a loss (the example).
const LOSS_LATE: Duration = Duration::from_millis(300);

/// How late a waiter gets the lock on the path whose wake-up a `*WakeLate` flaw loses (a
/// safety poll's interval).
const LATE: Duration = Duration::from_millis(2000);

/// How long a writer's mark lasts under [`PrimitiveFlaw::WriterMarkLapses`].
const WRITER_MARK: Duration = Duration::from_secs(2);

/// How long [`PrimitiveFlaw::MultiInClientOrder`] waits for a busy member while holding the
/// members taken before it.
const IN_ORDER_WAIT: Duration = Duration::from_secs(60);

pub(super) struct WrappedHarness {
    store: String,
    flaw: PrimitiveFlaw,
    /// Clients made so far: [`PrimitiveFlaw::MultiInClientOrder`] reverses every other one's
    /// order.
    clients: AtomicU64,
    /// Force releases so far ([`PrimitiveFlaw::RevokeWakeLate`] tells a wait they ended).
    revokes: Arc<AtomicU64>,
}

impl WrappedHarness {
    pub(super) fn new(flaw: PrimitiveFlaw) -> Self {
        WrappedHarness {
            store: format!("primitive-control-{:016x}", fastrand::u64(..)),
            flaw,
            clients: AtomicU64::new(0),
            revokes: Arc::default(),
        }
    }
}

#[async_trait]
impl Harness for WrappedHarness {
    fn label(&self) -> String {
        format!("{:?}", self.flaw)
    }

    async fn client(&self) -> Result<Locker> {
        Ok(Locker::new(Wrapped {
            inner: MemoryBackend::connect(&self.store),
            flaw: self.flaw,
            reversed: self.clients.fetch_add(1, Ordering::SeqCst) % 2 == 1,
            revokes: self.revokes.clone(),
            clock_ahead: Duration::ZERO,
        }))
    }

    fn can_skew_clock(&self) -> bool {
        true
    }

    async fn client_with_clock_skew(&self, ahead: Duration) -> Result<Locker> {
        Ok(Locker::new(Wrapped {
            inner: MemoryBackend::connect(&self.store),
            flaw: self.flaw,
            reversed: self.clients.fetch_add(1, Ordering::SeqCst) % 2 == 1,
            revokes: self.revokes.clone(),
            clock_ahead: ahead,
        }))
    }

    fn can_revoke(&self) -> bool {
        true
    }

    async fn revoke(&self, name: &LockName) -> Result<()> {
        self.revokes.fetch_add(1, Ordering::SeqCst);
        MemoryBackend::connect(&self.store).force_release_now(name);
        Ok(())
    }
}

struct Wrapped {
    inner: MemoryBackend,
    flaw: PrimitiveFlaw,
    /// This client takes sets in reverse ([`PrimitiveFlaw::MultiInClientOrder`]).
    reversed: bool,
    /// The harness's count of force releases.
    revokes: Arc<AtomicU64>,
    /// How far this client's clock runs ahead.
    clock_ahead: Duration,
}

impl fmt::Debug for Wrapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Wrapped({:?})", self.flaw)
    }
}

impl Wrapped {
    /// The request the flawed backend sends instead of `req`.
    fn flawed(&self, req: &AcquireRequest) -> Result<AcquireRequest> {
        let mut out = req.clone();
        match (self.flaw, req.mode) {
            (PrimitiveFlaw::LimitPlusOne, LockMode::Permit { limit }) => {
                out.mode = LockMode::Permit { limit: limit + 1 };
            }
            (PrimitiveFlaw::LimitSplitPerClient, LockMode::Permit { limit }) => {
                out.name = LockName::new(format!("{}#{limit}", req.name.as_str()))?;
            }
            (PrimitiveFlaw::WritersShare, LockMode::Exclusive) => out.mode = LockMode::Shared,
            (PrimitiveFlaw::PermitOutlivesCrash, LockMode::Permit { .. }) => {
                out.ttl = req.ttl * 60;
            }
            (PrimitiveFlaw::LeaseEndsEarly, LockMode::Exclusive) => out.ttl = req.ttl / 2,
            (PrimitiveFlaw::RenewalBlindToRevocation, _) => out.lost = LostNotifier::new().0,
            (PrimitiveFlaw::LossReportedLate, _) => out.lost = reported_late(&req.lost),
            _ => {}
        }
        Ok(out)
    }

    /// `acquired` with its lease wrapped, renewing as the flaw says.
    fn wrap(&self, req: &AcquireRequest, acquired: Acquired) -> Acquired {
        let Acquired {
            lease,
            sent_at,
            granted_ttl,
            ..
        } = acquired;
        let wrapped = WrappedLease {
            inner: tokio::sync::Mutex::new(lease),
            backend: self.inner.clone(),
            req: req.clone(),
            flaw: self.flaw,
        };
        let out = Acquired::new(wrapped, sent_at);
        match granted_ttl {
            Some(ttl) => out.with_granted_ttl(ttl),
            None => out,
        }
    }

    fn wrap_all(&self, reqs: &[AcquireRequest], attempt: SetAttempt) -> SetAttempt {
        match attempt {
            SetAttempt::All(won) => SetAttempt::All(
                won.into_iter()
                    .zip(reqs)
                    .map(|(a, req)| self.wrap(req, a))
                    .collect(),
            ),
            other => other,
        }
    }

    /// [`PrimitiveFlaw::ShareTtlSetLater`], [`PrimitiveFlaw::PermitTtlSetLater`]: a share or
    /// a permit without expiry, its TTL set a round trip later; `None` for other flaws and
    /// modes.
    async fn share_ttl_later(
        &self,
        req: &AcquireRequest,
        deadline: Option<Option<Instant>>,
    ) -> Option<Result<Option<Acquired>>> {
        let on_path = match self.flaw {
            PrimitiveFlaw::ShareTtlSetLater => req.mode == LockMode::Shared,
            PrimitiveFlaw::PermitTtlSetLater => matches!(req.mode, LockMode::Permit { .. }),
            _ => false,
        };
        if !on_path {
            return None;
        }
        let mut unbounded = req.clone();
        unbounded.ttl = Duration::from_secs(24 * 3600);
        let won = match deadline {
            None => self.inner.try_acquire(&unbounded).await,
            Some(deadline) => self.inner.acquire(&unbounded, deadline).await,
        };
        Some(match won {
            Ok(Some(a)) => {
                tokio::time::sleep(TTL_LATER).await;
                match a.lease.extend(req.ttl).await {
                    Ok(_) => Ok(Some(self.wrap(req, a))),
                    Err(e) => Err(e),
                }
            }
            other => other,
        })
    }

    /// The `*ByClientClock` flaws: before asking, delete the holders of `req`'s lock whose
    /// lease this client's clock says has run out (the server's TTL left, judged against how
    /// far this clock runs ahead).
    async fn sweep_by_own_clock(&self, req: &AcquireRequest) -> Result<()> {
        let on_path = match self.flaw {
            PrimitiveFlaw::PermitSweepByClientClock => matches!(req.mode, LockMode::Permit { .. }),
            PrimitiveFlaw::LeaderJudgedByClientClock => req.campaign,
            _ => false,
        };
        if !on_path || self.clock_ahead.is_zero() {
            return Ok(());
        }
        let info = self.inner.inspect(&req.name).await?;
        let left = info
            .shares
            .iter()
            .filter_map(|s| s.ttl_left)
            .chain(info.ttl_left)
            .min();
        if left.is_some_and(|left| left < self.clock_ahead) {
            self.inner.force_release_now(&req.name);
        }
        Ok(())
    }

    /// The `*WakeLate` flaws: a wait on the flaw's path ends [`LATE`] after the lock freed;
    /// `None` for other flaws and paths.
    async fn late_wake(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Option<Result<Option<Acquired>>> {
        let exclusive = req.mode == LockMode::Exclusive;
        let on_path = match self.flaw {
            PrimitiveFlaw::PermitWakeLate => matches!(req.mode, LockMode::Permit { .. }),
            PrimitiveFlaw::LastReaderWakeLate
            | PrimitiveFlaw::ExpiryWakeLate
            | PrimitiveFlaw::RevokeWakeLate => exclusive,
            _ => false,
        };
        if !on_path {
            return None;
        }
        Some(self.wait_late(req, deadline).await)
    }

    async fn wait_late(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        if let Some(a) = self.inner.try_acquire(req).await? {
            return Ok(Some(self.wrap(req, a)));
        }
        // What the lock looked like when the wait began, to tell the path that freed it.
        let before = self.inner.inspect(&req.name).await?;
        let (began, revokes) = (Instant::now(), self.revokes.load(Ordering::SeqCst));
        let Some(a) = self.inner.acquire(req, deadline).await? else {
            return Ok(None);
        };
        let late = match self.flaw {
            PrimitiveFlaw::PermitWakeLate => true,
            PrimitiveFlaw::LastReaderWakeLate => {
                before.mode == Some(LockMode::Shared) || !before.shares.is_empty()
            }
            PrimitiveFlaw::ExpiryWakeLate => before
                .ttl_left
                .is_some_and(|left| Instant::now() + Duration::from_millis(5) >= began + left),
            PrimitiveFlaw::RevokeWakeLate => self.revokes.load(Ordering::SeqCst) != revokes,
            _ => false,
        };
        if late {
            tokio::time::sleep(LATE).await;
        }
        Ok(Some(self.wrap(req, a)))
    }

    /// The `Queued*Leaks` flaws: whether a grant of `req` to a waiter is written without its
    /// TTL (a writer's only behind readers: the read-write path's own grant).
    async fn grants_waiters_without_ttl(&self, req: &AcquireRequest) -> Result<bool> {
        Ok(match (self.flaw, req.mode) {
            (PrimitiveFlaw::QueuedPermitLeaks, LockMode::Permit { .. }) => true,
            (PrimitiveFlaw::QueuedReaderLeaks, LockMode::Shared) => true,
            (PrimitiveFlaw::QueuedWriterLeaks, LockMode::Exclusive) => {
                let info = self.inner.inspect(&req.name).await?;
                info.mode == Some(LockMode::Shared) || !info.shares.is_empty()
            }
            _ => false,
        })
    }

    /// [`PrimitiveFlaw::MultiInClientOrder`]: each member in this client's order, waiting for a
    /// busy one while holding those taken.
    async fn set_in_client_order(&self, reqs: &[AcquireRequest]) -> Result<SetAttempt> {
        let mut order: Vec<usize> = (0..reqs.len()).collect();
        if self.reversed {
            order.reverse();
        }
        let mut won: Vec<(usize, Acquired)> = Vec::with_capacity(reqs.len());
        for i in order {
            let deadline = Instant::now() + IN_ORDER_WAIT;
            match self.inner.acquire(&reqs[i], Some(deadline)).await {
                Ok(Some(a)) => won.push((i, a)),
                other => {
                    for (_, a) in won {
                        let _ = a.lease.release().await;
                    }
                    return other.map(|_| SetAttempt::Busy(i));
                }
            }
        }
        won.sort_by_key(|(i, _)| *i);
        Ok(SetAttempt::All(won.into_iter().map(|(_, a)| a).collect()))
    }
}

/// A notifier for the backend that passes a loss on to `lost` [`LOSS_LATE`] after it is
/// reported ([`PrimitiveFlaw::LossReportedLate`]).
fn reported_late(lost: &LostNotifier) -> LostNotifier {
    let (notifier, signal) = LostNotifier::new();
    let lost = lost.clone();
    tokio::spawn(async move {
        if let Ended::Lost(reason) = signal.ended().await {
            tokio::time::sleep(LOSS_LATE).await;
            lost.fire(reason);
        }
    });
    notifier
}

/// A lease of the memory backend, renewed with the flaw.
struct WrappedLease {
    /// Replaced when a renewal takes the lock again in another mode.
    inner: tokio::sync::Mutex<BoxLease>,
    backend: MemoryBackend,
    req: AcquireRequest,
    flaw: PrimitiveFlaw,
}

impl fmt::Debug for WrappedLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WrappedLease({:?})", self.flaw)
    }
}

#[async_trait]
impl Lease for WrappedLease {
    fn fencing_token(&self) -> Option<u64> {
        self.inner.try_lock().ok().and_then(|l| l.fencing_token())
    }

    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        let mut inner = self.inner.lock().await;
        match (self.flaw, self.req.mode) {
            (PrimitiveFlaw::WriterRenewedAsShare, LockMode::Exclusive) => {
                inner.extend(ttl).await?;
                // The entry rewritten as a share of the same owner.
                inner.release().await?;
                let mut share = self.req.clone().with_mode(LockMode::Shared);
                share.ttl = ttl;
                match self.backend.try_acquire(&share).await? {
                    Some(a) => *inner = a.lease,
                    None => return Err(lockcore::Error::not_held("rewritten as a share")),
                }
                Ok(ttl)
            }
            (PrimitiveFlaw::PermitRenewalShortens, LockMode::Permit { .. }) => {
                inner.extend(ttl / 1000).await?;
                Ok(ttl)
            }
            (PrimitiveFlaw::PermitRenewalLengthens, LockMode::Permit { .. }) => {
                inner.extend(ttl * 60).await?;
                Ok(ttl)
            }
            (PrimitiveFlaw::RenewalBlindToRevocation, _) => match inner.extend(ttl).await {
                Err(e) if e.kind() == ErrorKind::NotHeld => Ok(ttl),
                other => other,
            },
            _ => inner.extend(ttl).await,
        }
    }

    async fn release(&self) -> Result<()> {
        self.inner.lock().await.release().await
    }
}

#[async_trait]
impl Backend for Wrapped {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        self.sweep_by_own_clock(req).await?;
        if let Some(won) = self.share_ttl_later(req, None).await {
            return won;
        }
        let req = self.flawed(req)?;
        let won = self.inner.try_acquire(&req).await?;
        Ok(won.map(|a| self.wrap(&req, a)))
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        self.sweep_by_own_clock(req).await?;
        if self.flaw == PrimitiveFlaw::WritersDoNotQueue && req.mode == LockMode::Exclusive {
            let backoff = Backoff::for_ttl(req.ttl.min(Duration::from_millis(400)));
            return poll_acquire(self, req, deadline, &backoff).await;
        }
        if self.flaw == PrimitiveFlaw::WriterMarkLapses && req.mode == LockMode::Exclusive {
            let marked = Instant::now() + WRITER_MARK;
            let queued_until = deadline.map_or(marked, |d| d.min(marked));
            if let Some(a) = self.inner.acquire(req, Some(queued_until)).await? {
                return Ok(Some(self.wrap(req, a)));
            }
            let backoff = Backoff::for_ttl(req.ttl.min(Duration::from_millis(400)));
            return poll_acquire(self, req, deadline, &backoff).await;
        }
        if let Some(late) = self.late_wake(req, deadline).await {
            return late;
        }
        if let Some(won) = self.share_ttl_later(req, Some(deadline)).await {
            return won;
        }
        let mut req = self.flawed(req)?;
        if self.grants_waiters_without_ttl(&req).await? {
            if let Some(a) = self.inner.try_acquire(&req).await? {
                return Ok(Some(self.wrap(&req, a)));
            }
            // Granted from the queue: without the waiter's TTL.
            req.ttl *= 60;
        }
        let won = self.inner.acquire(&req, deadline).await?;
        Ok(won.map(|a| self.wrap(&req, a)))
    }

    async fn try_acquire_all(&self, reqs: &[AcquireRequest]) -> Result<SetAttempt> {
        if self.flaw == PrimitiveFlaw::MultiInClientOrder {
            return self.set_in_client_order(reqs).await;
        }
        if self.flaw == PrimitiveFlaw::SetTtlSetLater {
            let unbounded: Vec<AcquireRequest> = reqs
                .iter()
                .map(|r| {
                    let mut r = r.clone();
                    r.ttl = Duration::from_secs(24 * 3600);
                    r
                })
                .collect();
            let attempt = self.inner.try_acquire_all(&unbounded).await?;
            if let SetAttempt::All(won) = &attempt {
                // The second round trip sets the TTLs.
                tokio::time::sleep(Duration::from_millis(20)).await;
                for (a, r) in won.iter().zip(reqs) {
                    a.lease.extend(r.ttl).await?;
                }
            }
            return Ok(self.wrap_all(reqs, attempt));
        }
        if self.flaw != PrimitiveFlaw::MultiIsASequence {
            let reqs = reqs
                .iter()
                .map(|r| self.flawed(r))
                .collect::<Result<Vec<_>>>()?;
            let attempt = self.inner.try_acquire_all(&reqs).await?;
            return Ok(self.wrap_all(&reqs, attempt));
        }
        let mut won = Vec::with_capacity(reqs.len());
        for (i, req) in reqs.iter().enumerate() {
            // The round trip between two members' requests.
            tokio::task::yield_now().await;
            match self.inner.try_acquire(req).await {
                Ok(Some(a)) => won.push(a),
                other => {
                    for a in won {
                        let _ = a.lease.release().await;
                    }
                    return other.map(|_| SetAttempt::Busy(i));
                }
            }
        }
        Ok(SetAttempt::All(won))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        self.inner.force_release(name).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        self.inner.inspect(name).await
    }

    fn describe(&self) -> String {
        format!("{:?} over {}", self.flaw, self.inner.describe())
    }
}

/// The primitive scenarios, by name (the rest of the suite is the toy store's to check).
pub(super) fn is_primitive_scenario(name: &str) -> bool {
    [
        "permits_never_exceed_the_limit",
        "permit_limit_disagreement_is_refused",
        "crashed_permit_returns_after_its_ttl",
        "readers_share_and_writers_exclude",
        "waiting_writer_is_not_starved",
        "writer_that_gave_up_frees_readers",
        "fencing_increases_across_modes",
        "multi_lock_is_all_or_nothing",
        "multi_locks_in_opposite_orders_never_deadlock",
        "cancelled_multi_lock_leaves_nothing",
        "atomic_multi_lock_is_never_seen_partial",
        "multi_lock_lost_when_any_member_is_lost",
        "one_leader_at_a_time",
        "old_leader_lost_before_new_leader",
        "revoked_leader_notices_while_renewing",
        "renewed_writer_still_excludes_readers",
        "renewed_permit_counts_and_expires_on_time",
        "permit_won_by_waiting_returns_after_crash",
        "reader_won_by_waiting_returns_after_crash",
        "writer_won_by_waiting_returns_after_crash",
        "writer_waiting_past_its_marks_holds_readers_back",
        "freed_permit_hands_over_promptly",
        "last_reader_leaving_hands_over_promptly",
        "expired_lease_hands_over_promptly",
        "revoked_lock_hands_over_promptly",
        "cancelled_set_take_leaves_nothing",
        "cancelled_shared_acquire_leaves_nothing",
        "cancelled_permit_acquire_leaves_nothing",
        "cancelled_lock_all_leaves_nothing",
        "skewed_client_cannot_sweep_permits",
        "skewed_candidate_cannot_depose_leader",
        // The loss detection scenarios: the memory backend declares a bound, the toy store none.
        "lost_detection_as_declared",
        "revocation_noticed",
    ]
    .contains(&name)
}

pub(super) fn shared(harness: WrappedHarness) -> Arc<dyn Harness> {
    Arc::new(harness)
}
