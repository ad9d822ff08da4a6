//! Acquisition attempts that cannot be called back once sent, run to completion in the
//! background so that their clean-up follows their outcome ([`acquire_detached`],
//! [`acquire_detached_for`]): a lease won after its caller left is released, and a late win of a
//! request retried with the same owner token is released only once nothing of it holds.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::Result;
use crate::lost::RequestWatch;

use super::cleanup::ReleaseLease;
use super::{AcquireRequest, Background, CancelCleanUp, CleanUpTask, Lease};

/// Runs an acquisition attempt that cannot be called back once sent (a statement sent is run by the
/// server even when its client closed the connection; an embedded database's worker thread runs it
/// even when its caller is gone) to completion in `background`, so that its clean-up follows its
/// outcome: the caller gets the attempt's result; when the caller was dropped first, a lease the
/// attempt won is released there. A [`ReleaseIfCancelled`](super::ReleaseIfCancelled) instead
/// releases at the drop, which can run before the statement does and find nothing to release,
/// leaving the lock held for its TTL. The attempt is given a [`CallerGone`] flag: it should send
/// nothing more (no retry) once the caller is gone, so that a cancelled attempt does not take the
/// lock long after its caller left.
///
/// The caller waits until `caller_bound` (its deadline or operation timeout) at most and then
/// gets [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable); the attempt does not stop
/// there: what it wins after its caller left is released in the background. An attempt
/// abandoned at the caller's deadline instead could still run on the server (a loaded server,
/// a slow network) after the holder's release and leave the lock held by nobody for its whole
/// TTL. Unavailable too when the attempt did not run (the runtime is shutting down).
///
/// Cancel safe: a dropped call leaves the attempt to finish and release what it won.
pub async fn acquire_detached<T, F, Fut>(
    background: &Background,
    caller_bound: Option<crate::Instant>,
    attempt: F,
) -> Result<T>
where
    T: AttemptOutcome,
    F: FnOnce(CallerGone) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
{
    bounded(caller_bound, detach(background, None, attempt)).await
}

/// [`acquire_detached`] for one attempt of `reqs` (one request, or a set's members in order),
/// which the caller may send again with the same owner tokens after this one's bound (a
/// [`Locker::lock`](crate::Locker::lock) retrying an `Unavailable` error, or a set retried the
/// same way). What this attempt wins after its caller left is released in the background only
/// once every one of its requests is over (no attempt of it can be claimed any more, and no
/// guard of it holds) or its guard's lease ended: a retry that took the same rows (same
/// tokens) as its own is never freed under its guards. Within the requests' longest TTL at
/// most: past it, what this attempt won has expired, and a row still held under its token is
/// a guard's. The attempt runs on the first request's [`Background`].
///
/// Cancel safe, as [`acquire_detached`].
///
/// # Panics
/// When `reqs` is empty (a backend always has the request it attempts).
pub async fn acquire_detached_for<T, F, Fut>(
    reqs: &[AcquireRequest],
    caller_bound: Option<crate::Instant>,
    attempt: F,
) -> Result<T>
where
    T: AttemptOutcome,
    F: FnOnce(CallerGone) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
{
    let first = reqs.first().expect("an attempt of no request");
    let request = LateRelease {
        watches: reqs.iter().map(|r| r.lost.watch()).collect(),
        ttl: reqs.iter().map(|r| r.ttl).max().unwrap_or_default(),
    };
    bounded(
        caller_bound,
        detach(&first.background, Some(request), attempt),
    )
    .await
}

/// The outcome of a detached attempt, waited for until `caller_bound` at most.
async fn bounded<T>(
    caller_bound: Option<crate::Instant>,
    detached: impl std::future::Future<Output = Option<Result<T>>>,
) -> Result<T> {
    let outcome = match caller_bound {
        Some(bound) => tokio::time::timeout_at(bound, detached)
            .await
            .map_err(|_| {
                crate::Error::unavailable(
                    "acquiring a lock",
                    "no answer before the deadline or operation timeout; the attempt finishes in \
                 the background and releases what it wins",
                )
            })?,
        None => detached.await,
    };
    outcome.unwrap_or_else(|| {
        Err(crate::Error::unavailable(
            "acquiring a lock",
            "the runtime is shutting down",
        ))
    })
}

/// When the release of a late win of one request, or of a set's requests, may run (see
/// [`acquire_detached_for`]).
struct LateRelease {
    watches: Vec<RequestWatch>,
    ttl: Duration,
}

impl LateRelease {
    /// `release` once every request is over or its guard ended; skipped if the longest TTL
    /// passes first.
    async fn after_the_request(self, release: CleanUpTask) {
        let deadline = Instant::now() + self.ttl;
        for watch in self.watches {
            let left = deadline.saturating_duration_since(Instant::now());
            if !watch.over_within(left).await {
                tracing::debug!(
                    "a late win of a request still holding under its token was not released: \
                     the row is its guard's (or has expired)"
                );
                return;
            }
        }
        release.await;
    }
}

/// The release of a late win: at once, or once its request is over (see [`LateRelease`]).
fn late_release(request: Option<LateRelease>, release: CleanUpTask) -> CleanUpTask {
    match request {
        None => release,
        Some(request) => Box::pin(request.after_the_request(release)),
    }
}

/// [`acquire_detached`] without a bound: `None` when the attempt did not run.
async fn detach<T, F, Fut>(
    background: &Background,
    request: Option<LateRelease>,
    attempt: F,
) -> Option<Result<T>>
where
    T: AttemptOutcome,
    F: FnOnce(CallerGone) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let gone = CallerGone(Arc::new(std::sync::atomic::AtomicBool::new(false)));
    let _mark_gone = MarkGoneOnDrop(gone.clone());
    let flag = gone.clone();
    // Shared by the attempt's task and the caller's unclaimed outcome: whichever finds a lease
    // nobody claims releases it.
    let request = Arc::new(std::sync::Mutex::new(request));
    let late = request.clone();
    background.spawn(async move {
        if flag.is_gone() {
            return;
        }
        let won = attempt(flag).await;
        if let Err(Ok(outcome)) = tx.send(won)
            && let Some(release) = release_all(outcome.into_leases())
        {
            // The caller is gone: nobody else will use or release these leases.
            let request = late.lock().ok().and_then(|mut r| r.take());
            late_release(request, release).await;
        }
    });
    let mut outcome = UnclaimedOutcome {
        rx: Some(rx),
        background: background.clone(),
        request,
    };
    let rx = outcome.rx.as_mut().expect("set above");
    let won = rx.await.ok();
    outcome.rx = None;
    won
}

/// The receiving end of [`acquire_detached`]'s outcome while the caller waits for it. The
/// attempt's send can land after the caller's last poll and before its drop: the send succeeds,
/// and the lease it carries would be dropped with the channel, unreleased, holding the lock for
/// its TTL (a SQLite acquisition polled once and dropped did, under load). Dropped unclaimed, it
/// closes the channel (a send after that fails, and the attempt releases) and releases a lease
/// already sent.
struct UnclaimedOutcome<T: AttemptOutcome> {
    rx: Option<tokio::sync::oneshot::Receiver<Result<T>>>,
    background: Background,
    /// The request of a late win, when the attempt was one of a request's
    /// ([`acquire_detached_for`]).
    request: Arc<std::sync::Mutex<Option<LateRelease>>>,
}

impl<T: AttemptOutcome> Drop for UnclaimedOutcome<T> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        rx.close();
        if let Ok(Ok(outcome)) = rx.try_recv()
            && let Some(release) = release_all(outcome.into_leases())
        {
            let request = self.request.lock().ok().and_then(|mut r| r.take());
            self.background.spawn(late_release(request, release));
        }
    }
}

/// The release of every lease an unclaimed outcome carries, one after the other in their order
/// (a set's canonical order), owner-checked; `None` when it carries none.
fn release_all<L: Lease>(leases: Vec<L>) -> Option<CleanUpTask> {
    leases
        .into_iter()
        .map(ReleaseLease)
        .collect::<Vec<_>>()
        .start()
}

/// What an attempt run by [`acquire_detached`] returns: the lease it may have won (or the leases:
/// every member of a set taken in one transaction, see
/// [`Backend::try_acquire_all`](super::Backend::try_acquire_all)), with whatever else its caller
/// wants to know (how long the holder has left, which member of a set was busy). Leases nobody
/// claims are released, in their order.
pub trait AttemptOutcome: Send + 'static {
    /// A lease won.
    type Lease: Lease;
    /// Every lease won (none, one, or a set's), for release when the caller is gone.
    fn into_leases(self) -> Vec<Self::Lease>;
}

impl<L: Lease> AttemptOutcome for Option<L> {
    type Lease = L;
    fn into_leases(self) -> Vec<L> {
        self.into_iter().collect()
    }
}

impl<L: Lease, X: Send + 'static> AttemptOutcome for (Option<L>, X) {
    type Lease = L;
    fn into_leases(self) -> Vec<L> {
        self.0.into_iter().collect()
    }
}

/// A set's leases, in the order of its requests (empty: none won).
impl<L: Lease> AttemptOutcome for Vec<L> {
    type Lease = L;
    fn into_leases(self) -> Vec<L> {
        self
    }
}

/// A set's leases with what else the attempt found (the member that was busy, say).
impl<L: Lease, X: Send + 'static> AttemptOutcome for (Vec<L>, X) {
    type Lease = L;
    fn into_leases(self) -> Vec<L> {
        self.0
    }
}

/// Whether the caller of [`acquire_detached`] has gone (its future dropped, or it returned).
#[derive(Clone, Debug)]
pub struct CallerGone(Arc<std::sync::atomic::AtomicBool>);

impl CallerGone {
    /// The caller no longer waits for the attempt: send nothing more.
    pub fn is_gone(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

struct MarkGoneOnDrop(CallerGone);

impl Drop for MarkGoneOnDrop {
    fn drop(&mut self) {
        self.0.0.store(true, std::sync::atomic::Ordering::Release);
    }
}
