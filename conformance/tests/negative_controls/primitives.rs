//! Negative controls of the primitives: the memory reference backend behind a wrapper that
//! makes one classic semaphore or read-write lock mistake. Each must fail the primitive
//! scenarios named in `main.rs`; the wrapper without a flaw passes them all.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::Harness;
use lockcore::backend::{AcquireRequest, Acquired, Backend, Backoff, SetAttempt, poll_acquire};
use lockcore::memory::MemoryBackend;
use lockcore::{Capabilities, Instant, LockInfo, LockMode, LockName, Locker, Result};

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
}

pub(super) struct WrappedHarness {
    store: String,
    flaw: PrimitiveFlaw,
}

impl WrappedHarness {
    pub(super) fn new(flaw: PrimitiveFlaw) -> Self {
        WrappedHarness {
            store: format!("primitive-control-{:016x}", fastrand::u64(..)),
            flaw,
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
        }))
    }

    fn can_revoke(&self) -> bool {
        true
    }

    async fn revoke(&self, name: &LockName) -> Result<()> {
        MemoryBackend::connect(&self.store).force_release_now(name);
        Ok(())
    }
}

struct Wrapped {
    inner: MemoryBackend,
    flaw: PrimitiveFlaw,
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
            _ => {}
        }
        Ok(out)
    }
}

#[async_trait]
impl Backend for Wrapped {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        self.inner.try_acquire(&self.flawed(req)?).await
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        if self.flaw == PrimitiveFlaw::WritersDoNotQueue && req.mode == LockMode::Exclusive {
            let backoff = Backoff::for_ttl(req.ttl.min(Duration::from_millis(400)));
            return poll_acquire(self, req, deadline, &backoff).await;
        }
        self.inner.acquire(&self.flawed(req)?, deadline).await
    }

    async fn try_acquire_all(&self, reqs: &[AcquireRequest]) -> Result<SetAttempt> {
        if self.flaw != PrimitiveFlaw::MultiIsASequence {
            let reqs = reqs
                .iter()
                .map(|r| self.flawed(r))
                .collect::<Result<Vec<_>>>()?;
            return self.inner.try_acquire_all(&reqs).await;
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
    ]
    .contains(&name)
}

pub(super) fn shared(harness: WrappedHarness) -> Arc<dyn Harness> {
    Arc::new(harness)
}
