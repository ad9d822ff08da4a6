//! Exclusive sets taken in one transaction (see
//! [`Backend::try_acquire_all`](lockcore::backend::Backend::try_acquire_all)): what the
//! dialects' set transactions share.

use std::time::Duration;

use lockcore::backend::{AcquireRequest, Acquired};
use lockcore::{Error, LockName, Result};

/// One member of a set attempt, as the dialects' set transactions bind it (each in its own
/// units: the TTL as µs or seconds).
#[derive(Clone)]
pub(crate) struct SetMember {
    pub(crate) name: LockName,
    /// The owner token, as hex.
    pub(crate) token: String,
    pub(crate) ttl: Duration,
    /// The holder's metadata, encoded.
    pub(crate) holder: String,
}

impl SetMember {
    /// The parameters of a single attempt.
    pub(crate) fn one(r: &AcquireRequest) -> SetMember {
        SetMember {
            name: r.name.clone(),
            token: r.token.to_hex(),
            ttl: r.ttl,
            holder: r.holder.encode(),
        }
    }

    /// The members of a set, in the order of its requests.
    pub(crate) fn of(reqs: &[AcquireRequest]) -> Vec<SetMember> {
        reqs.iter().map(SetMember::one).collect()
    }
}

/// What a set attempt run by [`run_set_detached`] found: every member's lease in order, or
/// none and the index of the first member not won.
pub(crate) type SetWon<L> = (Vec<L>, Option<usize>);

/// [`lockcore::backend::acquire_detached_for`] for a set taken in one transaction (see
/// [`Backend::try_acquire_all`](lockcore::backend::Backend::try_acquire_all)): the attempt's leases become the set's acquisitions, all sent
/// at `sent_at`. The caller waits until `caller_bound` at most. A set won for a caller gone is
/// released member by member, in order, in the background, once the members' requests are
/// over (a retry of the set with the same tokens holds the same rows: never freed under it).
///
/// Cancel safe: what a dropped call's attempt wins is released.
pub(crate) async fn run_set_detached<L, F, Fut>(
    reqs: &[lockcore::backend::AcquireRequest],
    sent_at: lockcore::Instant,
    caller_bound: Option<lockcore::Instant>,
    attempt: F,
) -> Result<lockcore::backend::SetAttempt>
where
    L: lockcore::backend::Lease,
    F: FnOnce(lockcore::backend::CallerGone) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<SetWon<L>>> + Send + 'static,
{
    use lockcore::backend::SetAttempt;
    match lockcore::backend::acquire_detached_for(reqs, caller_bound, attempt).await? {
        (_, Some(busy)) => Ok(SetAttempt::Busy(busy)),
        (won, None) => Ok(SetAttempt::All(
            won.into_iter().map(|l| Acquired::new(l, sent_at)).collect(),
        )),
    }
}

/// What a set's transaction found (see [`Backend::try_acquire_all`](lockcore::backend::Backend::try_acquire_all)).
pub(crate) enum SetFound {
    /// Committed: every member's fence, in order.
    Won(Vec<u64>),
    /// Rolled back at this member, not taken.
    Busy(usize),
    /// Rolled back: the caller left before the commit.
    Abandoned,
}

impl SetFound {
    /// The leases of a committed set (each `leases[i]` given its fence by `fenced`), or the
    /// busy member.
    pub(crate) fn into_won<L>(
        self,
        leases: Vec<L>,
        fenced: impl Fn(L, u64) -> L,
    ) -> Result<SetWon<L>> {
        match self {
            SetFound::Won(fences) => {
                debug_assert_eq!(fences.len(), leases.len());
                Ok((
                    leases
                        .into_iter()
                        .zip(fences)
                        .map(|(l, f)| fenced(l, f))
                        .collect(),
                    None,
                ))
            }
            SetFound::Busy(i) => Ok((Vec::new(), Some(i))),
            SetFound::Abandoned => Err(set_abandoned()),
        }
    }
}

/// The error of a set attempt whose caller left before its commit: rolled back, nothing taken
/// (nobody reads it).
pub(crate) fn set_abandoned() -> Error {
    Error::unavailable(
        "acquiring a set of locks",
        "the caller left before the commit: rolled back",
    )
}
