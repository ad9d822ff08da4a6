//! What only backend authors need: the small [`Backend`] and [`Lease`] traits a backend
//! implements, the [`AcquireRequest`] it is handed and the [`Acquired`] it returns, the
//! [`LostNotifier`] it fires, the [`Background`] it runs cleanup on, the guard that cleans up an
//! acquisition cancelled in flight ([`CleanUpIfCancelled`]), and the polling helpers
//! ([`Backoff`], [`poll_acquire`]).
//!
//! Users never need this module: they call [`Locker`](crate::Locker), which adds validation,
//! waiting (with retries of transient errors), auto-renewal, the lost signal and release on
//! drop, the same for every backend.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Capabilities, Fencing, Holder, LockInfo, LockMode, LockName, Result, WaitMark};

/// The attribute backends implement [`Backend`] and [`Lease`] with (re-exported so that every
/// backend names the same version).
pub use async_trait::async_trait;

pub use crate::lost::LostNotifier;

/// The random owner token of one acquisition (a UUID v4). Release and extend only ever touch the
/// lease that carries it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(uuid::Uuid);

impl OwnerToken {
    /// A new random token.
    pub fn random() -> Self {
        OwnerToken(uuid::Uuid::new_v4())
    }

    /// The token as a UUID.
    pub fn uuid(&self) -> uuid::Uuid {
        self.0
    }

    /// The token as 32 lowercase hex digits, the form backends store.
    pub fn to_hex(&self) -> String {
        self.0.simple().to_string()
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({})", self.0.simple())
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.simple())
    }
}

/// One acquisition as the backend sees it.
///
/// `#[non_exhaustive]`: fields may be added without breaking backends; build one with
/// [`AcquireRequest::new`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The validated lock name.
    pub name: LockName,
    /// This acquisition's owner token; store it with the lock.
    pub token: OwnerToken,
    /// The lease TTL asked for (already validated against the backend's range).
    pub ttl: Duration,
    /// Fire it when the backend learns the lease is lost (session expired, connection dropped).
    pub lost: LostNotifier,
    /// Where the backend runs cleanup that must outlive a cancelled call (deleting a dropped
    /// waiter's queue entry, undoing a partial quorum acquire); [`Locker::flush`](crate::Locker::flush)
    /// waits for it.
    pub background: Background,
    /// Who is acquiring (host, process id, wall-clock time, the options' label): backends that
    /// declare [`Capabilities::inspect`] store [`Holder::encode`] with the lock, in the request
    /// that takes it.
    pub holder: Holder,
    /// Mark it once the request waits (see [`WaitMark::mark`]): the caller's
    /// [`Locker::waiting`](crate::Locker::waiting) counts it, which is how tests and operators
    /// see a waiter in place where the backend keeps no queue to ask.
    pub waiting: WaitMark,
    /// What is asked for: the lock alone, a share, or one of N permits. A backend only sees
    /// a mode its [`Capabilities`] declare ([`Capabilities::shared`],
    /// [`Capabilities::permits`]): [`Locker`](crate::Locker) refuses the others before any I/O,
    /// so a backend that knows nothing of modes is only ever asked for exclusive locks.
    pub mode: LockMode,
    /// Whether the caller wants a fencing token ([`LockOptions::fencing`](crate::LockOptions::fencing)).
    /// A backend declaring [`Capabilities::fencing`] gives one unless this is
    /// [`Fencing::NotWanted`]; then it may skip whatever only the token costs (and return
    /// `None` from [`Lease::fencing_token`]), but never the lock's exclusion, and a later
    /// acquisition's token must still be above every token given before.
    pub fencing: Fencing,
    /// Whether this acquisition is a campaign ([`Locker::campaign`](crate::Locker::campaign)):
    /// the holder's label is then the candidate's value. A backend whose server has an election
    /// recipe of its own, whose clients read the leader's value from where the lock's metadata
    /// goes (etcd's `concurrency.Election`: the leader key's value), may store the label alone
    /// there in place of [`Holder::encode`], so that those clients see the value; its
    /// [`Backend::inspect`] then reports such a bare value as [`LockInfo::value`]. Other
    /// backends ignore it.
    pub campaign: bool,
}

impl AcquireRequest {
    /// A request with its own [`LostNotifier`] (whose signal is dropped) and a [`Background`]
    /// on the current runtime. [`Locker`](crate::Locker) builds its requests itself; this is
    /// for tests and tools that drive a backend directly.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn new(name: LockName, token: OwnerToken, ttl: Duration) -> Self {
        AcquireRequest {
            name,
            token,
            ttl,
            lost: LostNotifier::new().0,
            background: Background::new(),
            holder: Holder::current(None),
            waiting: WaitMark::default(),
            mode: LockMode::Exclusive,
            fencing: Fencing::IfAvailable,
            campaign: false,
        }
    }

    /// The same request, a campaign or not (see [`AcquireRequest::campaign`]).
    pub fn with_campaign(mut self, campaign: bool) -> Self {
        self.campaign = campaign;
        self
    }

    /// The same request asking for a fencing token as `fencing` says.
    pub fn with_fencing(mut self, fencing: Fencing) -> Self {
        self.fencing = fencing;
        self
    }

    /// The same request asking for `mode`.
    pub fn with_mode(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// The same request with `holder` as its metadata.
    pub fn with_holder(mut self, holder: Holder) -> Self {
        self.holder = holder;
        self
    }

    /// The same request reporting loss to `lost`.
    pub fn with_lost(mut self, lost: LostNotifier) -> Self {
        self.lost = lost;
        self
    }

    /// The same request counting its wait with `waiting`.
    pub fn with_waiting(mut self, waiting: WaitMark) -> Self {
        self.waiting = waiting;
        self
    }

    /// The same request running its cleanup on `background`.
    pub fn with_background(mut self, background: Background) -> Self {
        self.background = background;
        self
    }
}

/// Background work that must finish even when the caller's future is dropped, counted so that
/// [`Locker::flush`](crate::Locker::flush) can wait for it.
///
/// Each task is counted from [`Background::spawn`] until it completes *or is dropped* (a runtime
/// that shuts down drops its tasks): the count never stays up for work that will never run.
#[derive(Clone)]
pub struct Background {
    inner: Arc<BackgroundInner>,
}

struct BackgroundInner {
    runtime: tokio::runtime::Handle,
    pending: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

impl fmt::Debug for Background {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Background")
            .field("pending", &self.pending())
            .finish()
    }
}

impl Default for Background {
    fn default() -> Self {
        Self::new()
    }
}

/// Counts one task down when dropped, whether the task ran to its end or was dropped unrun.
struct PendingTask(Arc<BackgroundInner>);

impl Drop for PendingTask {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        if self.0.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Background {
    /// Tasks on the current runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn new() -> Self {
        Self::on(tokio::runtime::Handle::current())
    }

    /// Tasks on the runtime of `handle`.
    pub fn on(handle: tokio::runtime::Handle) -> Self {
        Background {
            inner: Arc::new(BackgroundInner {
                runtime: handle,
                pending: std::sync::atomic::AtomicUsize::new(0),
                idle: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Runs `task` to completion in the background; never blocks. If the runtime has shut
    /// down, the task is dropped unrun (and uncounted): a lock it would have freed then frees
    /// by its TTL, or with the session it belongs to.
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        use std::sync::atomic::Ordering;
        self.inner.pending.fetch_add(1, Ordering::AcqRel);
        let counted = PendingTask(self.inner.clone());
        let task = async move {
            let _counted = counted;
            task.await;
        };
        // After a shutdown `spawn` hands back a handle to a task that is dropped at once, which
        // drops `counted` with it.
        drop(self.inner.runtime.spawn(task));
    }

    /// How many tasks are pending.
    pub fn pending(&self) -> usize {
        self.inner
            .pending
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits until no task is pending.
    ///
    /// Cancel safe.
    pub async fn idle(&self) {
        loop {
            let done = self.inner.idle.notified();
            if self.pending() == 0 {
                return;
            }
            done.await;
        }
    }
}

/// A held lease, as returned by a backend.
///
/// `extend` and `release` must be owner-checked and atomic (compare-and-extend,
/// compare-and-delete): on a lease that is no longer this token's they change nothing and return
/// [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld).
#[async_trait]
pub trait Lease: Send + Sync + fmt::Debug + 'static {
    /// The fencing token, if the backend gives them.
    fn fencing_token(&self) -> Option<u64>;

    /// Resets the lease's TTL to `ttl` from now, if it is still this owner's, and returns the
    /// TTL the server granted, counted from when the request was sent (servers that grant
    /// leases themselves, like etcd, may grant another than asked; most return `ttl`).
    ///
    /// Never re-creates a lease: on a lease that was released, expired or taken over it creates
    /// nothing and returns `NotHeld`.
    ///
    /// Cancel safety: dropping the future may or may not have extended the lease; either way the
    /// lease stays owner-checked.
    async fn extend(&self, ttl: Duration) -> Result<Duration>;

    /// Releases the lease, if it is still this owner's. Called once (again only after a call was
    /// cancelled).
    ///
    /// Cancel safety: dropping the future may leave the lock held until its TTL runs out.
    async fn release(&self) -> Result<()>;
}

/// A held lease, boxed.
pub type BoxLease = Box<dyn Lease>;

/// A clean-up task handed to [`Background`]: what [`CancelCleanUp::start`] leaves to run.
pub type CleanUpTask = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The protocol-specific half of [`CleanUpIfCancelled`]: what an acquisition has to undo when
/// its caller goes away while it is in flight (delete a queued node or key, undo a partial
/// quorum, release a lease the server may still grant).
pub trait CancelCleanUp: Send + 'static {
    /// Called once, from the guard's `drop`, in the task that drops it; must not block. What
    /// has to happen at once happens here (a request sent now goes out in call order, ahead of
    /// the caller's next one); the returned task, if any, then runs to completion on the
    /// guard's [`Background`]. `None`: nothing (left) to undo.
    fn start(self) -> Option<CleanUpTask>;
}

/// Several clean-ups as one: each started in order (what each does at once goes out in that
/// order), then their background parts awaited one after another.
impl<C: CancelCleanUp> CancelCleanUp for Vec<C> {
    fn start(self) -> Option<CleanUpTask> {
        let tasks: Vec<CleanUpTask> = self.into_iter().filter_map(C::start).collect();
        (!tasks.is_empty()).then(|| {
            Box::pin(async move {
                for task in tasks {
                    task.await;
                }
            }) as CleanUpTask
        })
    }
}

/// Runs a [`CancelCleanUp`] when dropped unless [disarmed](CleanUpIfCancelled::disarm) first:
/// the one mechanism by which an acquisition cancelled in flight (a dropped `lock()`, a timed-out
/// wait) leaves nothing behind. Arm it before the first request that may write, keep its state
/// up to date through [`DerefMut`](std::ops::DerefMut) as the acquisition goes on, and disarm it
/// when the lock is won (or nothing is left to undo). The background part runs on the request's
/// [`Background`], which [`Locker::flush`](crate::Locker::flush) waits for.
#[must_use = "dropping it at once runs the clean-up"]
pub struct CleanUpIfCancelled<C: CancelCleanUp> {
    clean_up: Option<C>,
    background: Background,
}

impl<C: CancelCleanUp> CleanUpIfCancelled<C> {
    /// Armed with `clean_up`, whose background part runs on `background`.
    pub fn arm(clean_up: C, background: &Background) -> Self {
        CleanUpIfCancelled {
            clean_up: Some(clean_up),
            background: background.clone(),
        }
    }

    /// The attempt is decided: nothing to clean up.
    pub fn disarm(mut self) {
        self.clean_up = None;
    }
}

impl<C: CancelCleanUp> std::ops::Deref for CleanUpIfCancelled<C> {
    type Target = C;

    fn deref(&self) -> &C {
        self.clean_up
            .as_ref()
            .expect("armed until disarmed (which consumes the guard)")
    }
}

impl<C: CancelCleanUp> std::ops::DerefMut for CleanUpIfCancelled<C> {
    fn deref_mut(&mut self) -> &mut C {
        self.clean_up
            .as_mut()
            .expect("armed until disarmed (which consumes the guard)")
    }
}

impl<C: CancelCleanUp> Drop for CleanUpIfCancelled<C> {
    fn drop(&mut self) {
        if let Some(task) = self.clean_up.take().and_then(CancelCleanUp::start) {
            self.background.spawn(task);
        }
    }
}

/// Releases a lease in the background unless [disarmed](ReleaseIfCancelled::disarm) first: the
/// clean-up of an acquire request whose caller went away while it was in flight, which the
/// server may still grant (a cancelled `lock()`). Arm it with the lease the request would create
/// (its release must be owner-checked, so it frees nothing that is not this attempt's) right
/// before sending, disarm it when the reply is in. A [`CleanUpIfCancelled`] whose clean-up is
/// the lease's release.
#[must_use = "dropping it at once releases the lease"]
pub struct ReleaseIfCancelled<L: Lease> {
    guard: CleanUpIfCancelled<ReleaseLease<L>>,
}

impl<L: Lease> ReleaseIfCancelled<L> {
    /// Armed with the lease an attempt in flight may win.
    pub fn arm(lease: L, background: &Background) -> Self {
        ReleaseIfCancelled {
            guard: CleanUpIfCancelled::arm(ReleaseLease(lease), background),
        }
    }

    /// The attempt's reply is in: nothing to clean up.
    pub fn disarm(self) {
        self.guard.disarm();
    }
}

/// The clean-up of [`ReleaseIfCancelled`]: release the lease, owner-checked.
struct ReleaseLease<L: Lease>(L);

impl<L: Lease> CancelCleanUp for ReleaseLease<L> {
    fn start(self) -> Option<CleanUpTask> {
        let lease = self.0;
        Some(Box::pin(async move {
            match lease.release().await {
                Ok(()) => {}
                Err(e) if e.kind() == crate::ErrorKind::NotHeld => {}
                Err(e) => tracing::debug!(
                    error = %e,
                    "releasing the lock of a cancelled attempt failed; it frees by its TTL"
                ),
            }
        }))
    }
}

/// Runs an acquisition attempt that cannot be called back once sent (a statement sent is run
/// by the server even when its client closed the connection; an embedded database's worker
/// thread runs it even when its caller is gone) to completion in `background`, so that its
/// clean-up follows its outcome: the caller gets the attempt's result; when the caller was
/// dropped first, a lease the attempt won is released there. A [`ReleaseIfCancelled`] instead
/// releases at the drop, which can run before the statement does and find nothing to release,
/// leaving the lock held for its TTL. The attempt is given a [`CallerGone`] flag: it should
/// send nothing more (no retry) once the caller is gone, so that a cancelled attempt does not
/// take the lock long after its caller left.
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
    watches: Vec<crate::lost::RequestWatch>,
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

/// What an attempt run by [`acquire_detached`] returns: the lease it may have won (or the
/// leases: every member of a set taken in one transaction, see
/// [`Backend::try_acquire_all`]), with whatever else its caller wants to know (how long the
/// holder has left, which member of a set was busy). Leases nobody claims are released, in
/// their order.
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

/// A successful acquisition: the lease, the moment the request that won it was sent and the TTL
/// granted, from which the contract computes the validity deadline
/// (`sent_at + granted_ttl - drift margin`).
///
/// `#[non_exhaustive]`: build one with [`Acquired::new`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Acquired {
    /// The lease.
    pub lease: BoxLease,
    /// When the winning request was sent (taken just before sending it, on the monotonic clock).
    pub sent_at: Instant,
    /// The TTL the server granted, when it differs from the one asked for.
    pub granted_ttl: Option<Duration>,
}

impl Acquired {
    /// Wraps a lease won by a request sent at `sent_at`, granted the TTL asked for.
    pub fn new(lease: impl Lease, sent_at: Instant) -> Self {
        Acquired {
            lease: Box::new(lease),
            sent_at,
            granted_ttl: None,
        }
    }

    /// The server granted `ttl` (counted from `sent_at`) instead of the TTL asked for.
    pub fn with_granted_ttl(mut self, ttl: Duration) -> Self {
        self.granted_ttl = Some(ttl);
        self
    }
}

/// What [`Backend::try_acquire_all`] did: every lock of the set, or none.
#[derive(Debug)]
#[non_exhaustive]
pub enum SetAttempt {
    /// Every lock, one [`Acquired`] per request, in the order of the requests.
    All(Vec<Acquired>),
    /// None was taken: the request at this index (the first found) is held by someone else,
    /// or has waiters queued ahead of it.
    Busy(usize),
}

/// A lock backend: one client (connection pool, session) to one lock service.
///
/// Two `Backend` values created separately must behave as independent clients: they never share
/// a session or a held connection, so that locks exclude each other between them.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// What this instance can do.
    fn capabilities(&self) -> &Capabilities;

    /// One attempt: the lease, or `Ok(None)` if someone else holds the lock.
    ///
    /// Cancel safety: a dropped attempt must leave no lock behind beyond `req.ttl`.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>>;

    /// Waits for the lock until `deadline` (`None`: no deadline); `Ok(None)` when the deadline
    /// passed. The default polls [`Backend::try_acquire`] with [`Backoff`]; backends that can be
    /// notified override it and declare [`WaitKind::Notify`](crate::WaitKind::Notify).
    ///
    /// Cancel safety: a dropped wait must leave no lock and no queue entry behind beyond
    /// `req.ttl`.
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        poll_acquire(self, req, deadline, &Backoff::for_ttl(req.ttl)).await
    }

    /// One attempt at every request of `reqs` in one request to the server (one transaction):
    /// every lease, or none ([`SetAttempt::Busy`] with the first member found held). Backends
    /// that can do it declare [`Capabilities::atomic_multi`]; the requests are then exclusive,
    /// for distinct names in canonical (byte) order, with one TTL and one fencing choice.
    /// [`Locker::try_lock_all`](crate::Locker::try_lock_all) and
    /// [`Locker::lock_all`](crate::Locker::lock_all) use it instead of a sequence of
    /// [`Backend::try_acquire`]. A member is busy wherever a [`Backend::try_acquire`] of it
    /// would not have taken it (a holder, or waiters a `try_lock` would not jump).
    ///
    /// Cancel safety: a dropped attempt must leave no lock of the set behind beyond `ttl` (a
    /// set the server grants after the drop is released, as a dropped `try_acquire`'s lock).
    async fn try_acquire_all(&self, reqs: &[AcquireRequest]) -> Result<SetAttempt> {
        let _ = reqs;
        Err(crate::Error::unsupported(
            "this backend cannot take several locks in one request",
        ))
    }

    /// Frees `name` whoever holds it, as an operator would (Redisson's `forceUnlock`); the
    /// holder's lease is then refused at its next renewal or check, and its lost signal fires
    /// (at once where the backend declares [`Capabilities::revoke_detection`]). Returns whether
    /// something was released. Backends that can do it declare
    /// [`Capabilities::force_release`]; users call
    /// [`Locker::force_release`](crate::Locker::force_release).
    ///
    /// Cancel safety: dropping the future may or may not have freed the lock.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let _ = name;
        Err(crate::Error::unsupported(
            "this backend cannot force-release locks",
        ))
    }

    /// What the server has for `name`: held or free, the fencing token, the TTL left, the
    /// holder's metadata, the queued waiters (see [`LockInfo`]). One read, no lock taken.
    /// Backends that can do it declare [`Capabilities::inspect`]; users call
    /// [`Locker::inspect`](crate::Locker::inspect).
    ///
    /// Cancel safe.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        let _ = name;
        Err(crate::Error::unsupported(
            "this backend cannot inspect locks",
        ))
    }

    /// One cheap round trip to the server (`PING`, `SELECT 1`, `exists`): the floor that the
    /// benchmark compares acquire + release with. Unsupported by default (and for `memory://`,
    /// which has no server).
    ///
    /// Cancel safe.
    async fn round_trip(&self) -> Result<()> {
        Err(crate::Error::unsupported(
            "this backend has no round trip to measure",
        ))
    }

    /// The backend's bare lock primitive without the library around it: one acquire and one
    /// release of `name` in the fewest server requests the mechanism allows (for example
    /// `SET NX PX` then the compare-and-delete script; `BEGIN; SELECT ... FOR UPDATE; COMMIT`;
    /// an etcd put-if-absent with a lease, then a delete). The benchmark measures it interleaved
    /// with [`Locker::try_lock`](crate::Locker::try_lock) + release, by the same client, and
    /// reports the ratio. Unsupported by default.
    ///
    /// Cancel safety: dropping the future may leave `name` held until the TTL of its bare
    /// acquisition runs out; use a name nobody else locks.
    async fn bare_cycle(&self, name: &LockName) -> Result<()> {
        let _ = name;
        Err(crate::Error::unsupported(
            "this backend has no bare primitive to measure",
        ))
    }

    /// Whether [`bare_cycle`](Self::bare_cycle) waits while `name` is held (a blocking
    /// primitive such as `pg_advisory_lock` or `GET_LOCK`), so that processes looping it hand
    /// the lock over to each other: the benchmark's bare hand-over rate, the floor the
    /// library's own hand-over rate is judged against. False by default (a bare `SET NX` or an
    /// insert fails on a held name instead of waiting).
    fn bare_cycle_waits(&self) -> bool {
        false
    }

    /// The number of requests the server has handled so far, from its own statistics (Redis
    /// `INFO commandstats`, ZooKeeper `mntr`, etcd's metrics, PostgreSQL's `pg_stat_database`):
    /// the benchmark divides its growth by the hand-overs to show server requests per
    /// hand-over (a herd shows as growth with the number of waiters). Unsupported by default.
    ///
    /// Cancel safe.
    async fn server_requests(&self) -> Result<u64> {
        Err(crate::Error::unsupported(
            "this backend does not report server request counts",
        ))
    }

    /// The server's name and version as it reports it (`redis 7.0.15` from `INFO server`,
    /// PostgreSQL's `version()`, ...), for the report's provenance. `None` by default and when
    /// the server cannot say.
    ///
    /// Cancel safe.
    async fn server_version(&self) -> Option<String> {
        None
    }

    /// How many `acquire` calls are queued waiting for `name` right now, as the server sees
    /// them (queue entries, sequential nodes, blocked lock requests). The suite uses it to know
    /// that a waiter is enqueued instead of sleeping and hoping. Unsupported by default; fair
    /// backends implement it.
    ///
    /// Cancel safe.
    async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        let _ = name;
        Err(crate::Error::unsupported(
            "this backend does not report its queued waiters",
        ))
    }

    /// A description for logs and reports, with any secret (password) redacted.
    fn describe(&self) -> String;
}

#[async_trait]
impl<B: Backend + ?Sized> Backend for Arc<B> {
    fn capabilities(&self) -> &Capabilities {
        (**self).capabilities()
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        (**self).try_acquire(req).await
    }
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        (**self).acquire(req, deadline).await
    }
    async fn try_acquire_all(&self, reqs: &[AcquireRequest]) -> Result<SetAttempt> {
        (**self).try_acquire_all(reqs).await
    }
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        (**self).force_release(name).await
    }
    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        (**self).inspect(name).await
    }
    async fn round_trip(&self) -> Result<()> {
        (**self).round_trip().await
    }
    async fn bare_cycle(&self, name: &LockName) -> Result<()> {
        (**self).bare_cycle(name).await
    }
    fn bare_cycle_waits(&self) -> bool {
        (**self).bare_cycle_waits()
    }
    async fn server_requests(&self) -> Result<u64> {
        (**self).server_requests().await
    }
    async fn server_version(&self) -> Option<String> {
        (**self).server_version().await
    }
    async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        (**self).queued_waiters(name).await
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
}

/// Exponential backoff with full jitter, capped: the poll schedule for backends that cannot be
/// notified, and the safety-net poll for those that can.
#[derive(Clone, Debug, PartialEq)]
pub struct Backoff {
    /// The first delay's upper bound.
    pub initial: Duration,
    /// The cap on any delay.
    pub max: Duration,
}

impl Backoff {
    /// 5 ms doubling up to a quarter of the TTL, capped at 1 s and at least 10 ms.
    pub fn for_ttl(ttl: Duration) -> Self {
        Backoff {
            initial: Duration::from_millis(5),
            max: (ttl / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)),
        }
    }

    /// The delay before poll number `attempt` (0-based): uniform in `[0, min(max, initial * 2^attempt)]`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self
            .initial
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max);
        let nanos = ceiling.as_nanos().min(u64::MAX as u128) as u64;
        Duration::from_nanos(fastrand::u64(0..=nanos))
    }
}

/// Polls [`Backend::try_acquire`] until it succeeds or `deadline` passes, sleeping per `backoff`
/// between attempts (never past the deadline). The default [`Backend::acquire`].
///
/// Cancel safe as far as `try_acquire` is.
pub async fn poll_acquire<B: Backend + ?Sized>(
    backend: &B,
    req: &AcquireRequest,
    deadline: Option<Instant>,
    backoff: &Backoff,
) -> Result<Option<Acquired>> {
    poll_attempts(req, deadline, backoff, || backend.try_acquire(req)).await
}

/// [`poll_acquire`] with an attempt of the backend's choosing: the attempt of a waiting
/// `lock()` may differ from a `try_lock`'s (a writer marks itself as waiting behind shared
/// holders, which a `try_lock` must not). Marks `req` waiting after each attempt that lost.
///
/// Cancel safe as far as `attempt` is.
pub async fn poll_attempts<F, Fut>(
    req: &AcquireRequest,
    deadline: Option<Instant>,
    backoff: &Backoff,
    mut try_once: F,
) -> Result<Option<Acquired>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<Acquired>>>,
{
    let mut attempt = 0u32;
    loop {
        if let Some(lease) = try_once().await? {
            return Ok(Some(lease));
        }
        req.waiting.mark();
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(None);
        }
        let mut wake = now + backoff.delay(attempt);
        if let Some(d) = deadline {
            wake = wake.min(d);
        }
        tokio::time::sleep_until(wake).await;
        attempt = attempt.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what a clean-up did: its synchronous start, then its background task.
    struct Recorded(Arc<std::sync::Mutex<Vec<&'static str>>>);

    impl CancelCleanUp for Recorded {
        fn start(self) -> Option<CleanUpTask> {
            self.0.lock().unwrap().push("started");
            let log = self.0;
            Some(Box::pin(async move {
                tokio::task::yield_now().await;
                log.lock().unwrap().push("ran");
            }))
        }
    }

    #[tokio::test]
    async fn a_dropped_guard_starts_its_clean_up_at_once_and_runs_the_rest_in_the_background() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let background = Background::new();
        let guard = CleanUpIfCancelled::arm(Recorded(log.clone()), &background);
        assert!(log.lock().unwrap().is_empty(), "armed, nothing runs");
        drop(guard);
        assert_eq!(*log.lock().unwrap(), ["started"], "started from drop");
        background.idle().await;
        assert_eq!(*log.lock().unwrap(), ["started", "ran"]);
    }

    #[tokio::test]
    async fn a_disarmed_guard_cleans_up_nothing() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let background = Background::new();
        let guard = CleanUpIfCancelled::arm(Recorded(log.clone()), &background);
        guard.disarm();
        assert_eq!(background.pending(), 0);
        assert!(log.lock().unwrap().is_empty());
    }

    /// A lease that counts its releases.
    #[derive(Debug)]
    struct CountedLease(Arc<std::sync::atomic::AtomicUsize>);

    #[async_trait]
    impl Lease for CountedLease {
        fn fencing_token(&self) -> Option<u64> {
            None
        }
        async fn extend(&self, ttl: Duration) -> Result<Duration> {
            Ok(ttl)
        }
        async fn release(&self) -> Result<()> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }

    /// The window between the caller's last poll and its drop: the attempt wins and hands its
    /// lease over (the send succeeds, the caller is still there), then the caller is dropped
    /// without having looked. The lease must be released, not dropped with the channel.
    #[tokio::test]
    async fn a_lease_sent_to_a_caller_dropped_before_it_looked_is_released() {
        use std::future::Future;
        let released = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let background = Background::new();
        let lease = CountedLease(released.clone());
        let mut caller = Box::pin(acquire_detached(
            &background,
            None,
            move |_gone| async move { Ok(Some(lease)) },
        ));
        let waker = std::task::Waker::noop();
        let polled = caller
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker));
        assert!(polled.is_pending(), "the attempt runs in the background");
        // The attempt's task runs to its end: its send succeeded, the caller has not looked.
        background.idle().await;
        assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 0);
        drop(caller);
        background.idle().await;
        assert_eq!(
            released.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the lease sent to a caller that was dropped without looking was left held"
        );
    }

    /// The other order: the caller is dropped first, the attempt's send fails, and the attempt
    /// releases what it won, once.
    #[tokio::test]
    async fn a_lease_won_after_its_caller_left_is_released_once() {
        assert_eq!(
            releases_of_an_outcome_won_after_its_caller_left(Some).await,
            1
        );
    }

    /// An outcome carrying more than the lease (a SQL attempt's "holder has this long left")
    /// is released the same way when its caller is gone.
    #[tokio::test]
    async fn a_lease_with_a_hint_won_after_its_caller_left_is_released() {
        let with_hint = |lease| (Some(lease), Some(Duration::from_secs(1)));
        assert_eq!(
            releases_of_an_outcome_won_after_its_caller_left(with_hint).await,
            1
        );
    }

    /// A set taken in one transaction (the leases of every member) whose caller left before
    /// the reply: every member is released, each once.
    #[tokio::test]
    async fn a_set_won_after_its_caller_left_releases_every_member() {
        let set = |lease: CountedLease| {
            let mut set: Vec<_> = (0..2).map(|_| CountedLease(lease.0.clone())).collect();
            set.insert(0, lease);
            (set, None::<usize>)
        };
        assert_eq!(
            releases_of_an_outcome_won_after_its_caller_left(set).await,
            3
        );
    }

    /// A set sent to a caller dropped before it looked (the window of
    /// `a_lease_sent_to_a_caller_dropped_before_it_looked_is_released`): every member is
    /// released.
    #[tokio::test]
    async fn a_set_sent_to_a_caller_dropped_before_it_looked_is_released() {
        use std::future::Future;
        let released = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let background = Background::new();
        let leases: Vec<_> = (0..4).map(|_| CountedLease(released.clone())).collect();
        let mut caller = Box::pin(acquire_detached(
            &background,
            None,
            move |_gone| async move { Ok(leases) },
        ));
        let waker = std::task::Waker::noop();
        assert!(
            caller
                .as_mut()
                .poll(&mut std::task::Context::from_waker(waker))
                .is_pending()
        );
        background.idle().await;
        assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 0);
        drop(caller);
        background.idle().await;
        assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 4);
    }

    /// The caller's bound passes while the attempt is in flight: the caller gets Unavailable
    /// at once, the attempt runs on, and the lease it wins afterwards is released, once.
    #[tokio::test]
    async fn a_caller_past_its_bound_returns_and_the_late_win_is_released() {
        let released = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let background = Background::new();
        let lease = CountedLease(released.clone());
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let bound = crate::Instant::now() + Duration::from_millis(20);
        let outcome = acquire_detached(&background, Some(bound), move |_gone| async move {
            let _ = wait.await;
            Ok(Some(lease))
        })
        .await;
        let Err(err) = outcome else {
            panic!("the caller returns at its bound")
        };
        assert_eq!(err.kind(), crate::ErrorKind::Unavailable);
        assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 0);
        go.send(()).unwrap();
        background.idle().await;
        assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// Runs an attempt that returns `outcome(lease)` once its caller is gone (the attempt is
    /// on its way, a statement sent, then the caller drops); the releases of the lease.
    async fn releases_of_an_outcome_won_after_its_caller_left<T: AttemptOutcome>(
        outcome: impl FnOnce(CountedLease) -> T + Send + 'static,
    ) -> usize {
        use std::future::Future;
        let released = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let background = Background::new();
        let lease = CountedLease(released.clone());
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let (sent, started) = tokio::sync::oneshot::channel::<()>();
        let mut caller = Box::pin(acquire_detached(
            &background,
            None,
            move |_gone| async move {
                let _ = sent.send(());
                let _ = wait.await;
                Ok(outcome(lease))
            },
        ));
        let waker = std::task::Waker::noop();
        assert!(
            caller
                .as_mut()
                .poll(&mut std::task::Context::from_waker(waker))
                .is_pending()
        );
        started.await.unwrap();
        drop(caller);
        go.send(()).unwrap();
        background.idle().await;
        released.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn backoff_is_full_jitter_and_capped() {
        let b = Backoff::for_ttl(Duration::from_secs(2));
        assert_eq!(b.max, Duration::from_millis(500));
        for attempt in 0..40 {
            let ceiling = (b.initial * 2u32.pow(attempt.min(20))).min(b.max);
            for _ in 0..50 {
                assert!(b.delay(attempt) <= ceiling);
            }
        }
        // Full jitter: delays spread over the whole range, not around the ceiling.
        let small = (0..200).filter(|_| b.delay(30) < b.max / 4).count();
        assert!(
            small > 10,
            "{small} of 200 delays fell in the lowest quarter"
        );
        assert_eq!(
            Backoff::for_ttl(Duration::from_millis(1)).max,
            Duration::from_millis(10)
        );
    }

    /// A first attempt of `reqs` answered after its caller's bound: returns its (failed) outcome
    /// and the sender that lets it answer a win, a lease counted in `released` when released;
    /// `answered` fires once that win has been handed back.
    async fn late_attempt(
        reqs: &[AcquireRequest],
        released: &Arc<std::sync::atomic::AtomicUsize>,
    ) -> (
        tokio::sync::oneshot::Sender<()>,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        let (answer, answered) = tokio::sync::oneshot::channel::<()>();
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let late = CountedLease(released.clone());
        let first = acquire_detached_for(
            reqs,
            Some(Instant::now() + Duration::from_millis(20)),
            move |_gone| async move {
                let _ = answered.await;
                let _ = done.send(());
                Ok(Some(late))
            },
        )
        .await;
        assert_eq!(
            first.unwrap_err().kind(),
            crate::ErrorKind::Unavailable,
            "no answer within the caller's bound"
        );
        (answer, finished)
    }

    fn request(name: &str) -> AcquireRequest {
        AcquireRequest::new(
            LockName::new(name).unwrap(),
            OwnerToken::random(),
            Duration::from_secs(60),
        )
    }

    /// A late win of one request is never released under the guard of its retry: the first
    /// attempt is answered (a win) after its caller's bound, while the caller's retry with the
    /// same owner token has won and is held. Its background release (by token: the same row
    /// as the retry's) waits until the guard ends, then runs; a request over without a guard
    /// has it released at once. Regression: it was released at once, freeing the row the
    /// retry's guard held (SQL leases: the caller held a guard on nothing).
    #[tokio::test]
    async fn a_late_win_is_not_released_under_the_retry_that_holds_its_row() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let released = Arc::new(AtomicUsize::new(0));
        let req = request("late-win");
        let (answer, finished) = late_attempt(std::slice::from_ref(&req), &released).await;
        // The retry, same request and token, wins and is claimed: its guard keeps the
        // request's lost notifier (as a LockGuard does).
        let retry = CountedLease(released.clone());
        let won = acquire_detached_for(std::slice::from_ref(&req), None, move |_gone| async move {
            Ok(Some(retry))
        })
        .await
        .unwrap();
        assert!(won.is_some());
        let guard = req.lost.clone();
        let background = req.background.clone();
        drop(req);
        // The first attempt's late answer: a win.
        answer.send(()).unwrap();
        finished.await.unwrap();
        let idle = tokio::time::timeout(Duration::from_millis(300), background.idle()).await;
        assert!(idle.is_err(), "the late win's release waits for the guard");
        assert_eq!(
            released.load(Ordering::SeqCst),
            0,
            "a late win was released while its request's guard held the same row"
        );
        // The guard ends: the late win is released then.
        drop(guard);
        background.idle().await;
        assert_eq!(released.load(Ordering::SeqCst), 1);
    }

    /// A set's late win waits for every member's request: released only once the last
    /// member's guard of the set's retry ended. Regression: sets went through the plain
    /// `acquire_detached`, which released a late win at once under the retry's guards.
    #[tokio::test]
    async fn a_late_set_win_waits_for_every_member_of_the_retry() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let released = Arc::new(AtomicUsize::new(0));
        let reqs = [request("late-set-a"), request("late-set-b")];
        let (answer, finished) = late_attempt(&reqs, &released).await;
        // The retry's guards: one per member, keeping each request's notifier.
        let (a, b) = (reqs[0].lost.clone(), reqs[1].lost.clone());
        let background = reqs[0].background.clone();
        drop(reqs);
        answer.send(()).unwrap();
        finished.await.unwrap();
        drop(a);
        let idle = tokio::time::timeout(Duration::from_millis(300), background.idle()).await;
        assert!(idle.is_err(), "released while member b's guard still held");
        assert_eq!(released.load(Ordering::SeqCst), 0);
        drop(b);
        background.idle().await;
        assert_eq!(released.load(Ordering::SeqCst), 1);
    }

    /// A late win of a request over without a guard (the caller gave up) is released at once.
    #[tokio::test]
    async fn a_late_win_of_a_request_given_up_is_released() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let released = Arc::new(AtomicUsize::new(0));
        let req = request("late-win-given-up");
        let (answer, finished) = late_attempt(std::slice::from_ref(&req), &released).await;
        let background = req.background.clone();
        drop(req);
        answer.send(()).unwrap();
        finished.await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), background.idle())
            .await
            .expect("released at once");
        assert_eq!(released.load(Ordering::SeqCst), 1);
    }
}
