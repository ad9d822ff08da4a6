//! The user-facing client: validation, waiting, guards, auto-renewal, the lost signal and
//! release on drop, the same for every backend.
//!
//! This file is the [`Locker`]; its pieces live apart and never use it: `inner` (what a
//! locker's clones and its guards share), `lease` (a held lease's state: validity, extend,
//! release), `turn` (its extends one at a time), `watch` (a lease's link to the watchdog),
//! `watchdog` (renewal and the deadline: one task per locker for all its leases), `guard`
//! ([`LockGuard`]). The primitives built on its locks (multi-locks, elections) use it from
//! outside.
mod guard;
mod inner;
mod lease;
mod liveness;
#[cfg(test)]
mod tests;
mod turn;
mod watch;
mod watchdog;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{
    AcquireRequest, Acquired, Backend, Background, Backoff, LostNotifier, OwnerToken, SetAttempt,
};
use crate::telemetry::{Outcome, Telemetry};
use crate::{
    Capabilities, Error, ErrorKind, Holder, IntoLockName, LockInfo, LockName, LockOptions,
    LostSignal, Result, WaitMark, WithLockError,
};

pub use self::guard::LockGuard;
use self::inner::LockerInner;

/// How `lock()` spaces its retries of `Unavailable` errors.
pub(crate) const RETRY_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(10),
    max: Duration::from_secs(1),
};

/// How far past its wait deadline `lock()` may return: an attempt still in flight then (a
/// server that answers nothing) is cut off this long after the deadline, and its clean-up
/// handed to the background ([`Locker::flush`]).
pub const WAIT_DEADLINE_SLACK: Duration = Duration::from_millis(250);

/// The error of a wait cut off while its attempt had heard nothing from the server: the last
/// `Unavailable` error of the run, or a new one when the first attempt is the silent one.
fn no_answer(last: Option<Error>, when: &str) -> Error {
    let silent = Error::unavailable(
        format!("no answer from the lock service {when}"),
        "the attempt in flight was cut off; its clean-up runs in the background",
    );
    match last {
        Some(last) => Error::new(
            ErrorKind::Unavailable,
            format!("no answer from the lock service {when}; the last failure: {last:#}"),
        )
        .with_source(silent),
        None => silent,
    }
}

/// A client of one lock backend. Cheap to clone; clones share the backend connection(s).
///
/// Create it inside a tokio runtime: guards dropped without an explicit release are released by
/// a task spawned on that runtime, and its leases are renewed there. It may be called from
/// another runtime while that one runs; once it has shut down (a `static` locker shared by
/// `#[tokio::test]`s, each with its own runtime), every call that would take, inspect or free
/// a lock fails at once with [`ErrorKind::RuntimeGone`], before any I/O.
#[derive(Clone)]
pub struct Locker {
    inner: Arc<LockerInner>,
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &self.inner.backend.describe())
            .finish()
    }
}

impl Locker {
    /// Wraps a backend.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn new(backend: impl Backend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// Wraps a shared backend.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn from_arc(backend: Arc<dyn Backend>) -> Self {
        let telemetry = Arc::new(Telemetry::new(&backend.describe()));
        Locker {
            inner: Arc::new(LockerInner {
                telemetry,
                backend,
                background: Background::on(Handle::current()),
                runtime: Handle::current(),
                waiting: Arc::default(),
                watchdog: Default::default(),
                liveness: liveness::Liveness::on(&Handle::current()),
            }),
        }
    }

    /// The backend's capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        self.inner.backend.capabilities()
    }

    /// The backend's compatibility table: for every pair of ways to take one name, whether
    /// they exclude, share or refuse (see [`compatibility`](crate::compatibility)).
    pub fn compatibility(&self) -> crate::Compatibility {
        self.capabilities().compatibility_table()
    }

    /// The backend, described with secrets redacted.
    pub fn describe(&self) -> String {
        self.inner.backend.describe()
    }

    /// The backend itself.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Who holds `name`, as the server sees it now: held or free, the fencing token, the TTL
    /// left, the holder's metadata (host, process id, when acquired, the
    /// [label](LockOptions::label)), the queued waiters where the backend knows them. Reads
    /// only; works from any client, not only the holder's.
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// `InvalidName`, or `Unsupported` where the backend does not declare
    /// [`Capabilities::inspect`], before any I/O; `Unavailable` or `Backend` when the backend
    /// fails.
    pub async fn inspect(&self, name: impl IntoLockName) -> Result<LockInfo> {
        let caps = self.capabilities();
        let name = self.operator_request(name, caps.inspect, "inspect locks")?;
        self.inner.backend.inspect(&name).await
    }

    /// Frees `name` whoever holds it, as an operator would (Redisson's `forceUnlock`, `locksmith
    /// unlock --force`). Returns whether something was released. The holder's lease is refused
    /// at its next renewal, and its [lost signal](LockGuard::lost) fires (at once on backends
    /// with [`Capabilities::revoke_detection`], else at that renewal or at the lease's validity
    /// deadline); its work must stop there.
    ///
    /// Cancel safety: dropping the future may or may not have freed the lock.
    ///
    /// # Errors
    /// `InvalidName`, or `Unsupported` where the backend does not declare
    /// [`Capabilities::force_release`], before any I/O; `Unavailable` or `Backend` when the
    /// backend fails.
    pub async fn force_release(&self, name: impl IntoLockName) -> Result<bool> {
        let caps = self.capabilities();
        let name = self.operator_request(name, caps.force_release, "force-release locks")?;
        self.inner.backend.force_release(&name).await
    }

    /// The checks of an operator's request before any I/O: a live runtime, a valid name, and
    /// the backend declaring the capability (`declared`) to do `what`.
    fn operator_request(
        &self,
        name: impl IntoLockName,
        declared: bool,
        what: &str,
    ) -> Result<LockName> {
        self.inner.liveness.check()?;
        let name = name.into_lock_name()?;
        if !declared {
            return Err(Error::unsupported(format!(
                "{} cannot {what}",
                self.describe()
            )));
        }
        Ok(name)
    }

    /// One attempt to take the lock: `Ok(None)` if someone else holds it (contention is not an
    /// error). The wait timeout in `options` is ignored.
    ///
    /// The guard must be bound for as long as the lock is needed: `let _guard = ...` holds it
    /// to the end of the scope, while `let _ = ...` (rustc's suggestion for an unused result)
    /// drops it, and so releases the lock, at once. A result left unused is refused where
    /// `unused_must_use` is denied:
    ///
    /// ```compile_fail
    /// #![deny(unused_must_use)]
    /// # async fn f(locker: lockcore::Locker) {
    /// locker.try_lock("job", &lockcore::LockOptions::new()).await;
    /// # }
    /// ```
    ///
    /// ```
    /// #![deny(unused_must_use)]
    /// # async fn f(locker: lockcore::Locker) -> lockcore::Result<()> {
    /// if let Some(_guard) = locker.try_lock("job", &lockcore::LockOptions::new()).await? {
    ///     // ... the critical section: the lock is held until `_guard` goes out of scope ...
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Cancel safety: dropping the future before it completes may leave the lock held by nobody
    /// reachable until the TTL runs out (the request may have reached the server); it never leaves
    /// it held longer.
    ///
    /// # Errors
    /// `InvalidName`, `InvalidConfig`, `Unsupported` or `RuntimeGone` (the locker's runtime has
    /// shut down) before any I/O; `Unavailable` or `Backend` when the backend fails.
    #[must_use = "the lock is released as soon as its guard is dropped: bind the result (`let guard = ...` or `let _guard = ...`, not `let _ = ...`)"]
    pub async fn try_lock(
        &self,
        name: impl IntoLockName,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        let req = self.request(name, options)?;
        let span = self.acquire_span(&req.request.name, "try");
        let started = Instant::now();
        let result = self
            .inner
            .backend
            .try_acquire(&req.request)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(Some(_)) => Outcome::Acquired,
            Ok(None) => Outcome::Busy,
            Err(_) => Outcome::Error,
        };
        self.record_acquire(&span, false, outcome, started);
        Ok(result?.map(|a| self.guard(req, a, options)))
    }

    /// The `lock.acquire` span (see [`telemetry`](crate::telemetry)).
    fn acquire_span(&self, name: &LockName, mode: &'static str) -> tracing::Span {
        tracing::info_span!(
            "lock.acquire",
            lock = name.as_str(),
            backend = &*self.inner.telemetry.backend,
            mode,
            outcome = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
        )
    }

    fn record_acquire(&self, span: &tracing::Span, wait: bool, outcome: Outcome, started: Instant) {
        let took = started.elapsed();
        self.inner.telemetry.acquired(wait, outcome, took);
        span.record("outcome", outcome.as_str());
        span.record("waited_ms", took.as_millis() as u64);
    }

    /// Takes the lock, waiting until it is acquired, or until the options' wait timeout when
    /// they set one ([`LockOptions::wait_timeout`]; no deadline by default, as tokio's `Mutex`,
    /// Redisson, Curator, `flock` and `etcdctl lock`). Waits by the backend's notification where
    /// it has one, and otherwise polls with exponential backoff and full jitter; fair backends
    /// serve waiters FIFO.
    ///
    /// Transient errors do not end the wait: an `Unavailable` error (a dropped connection, a
    /// server restarting, no answer within the backend's response timeout) is retried with
    /// exponential backoff and full jitter (10 ms doubling up to 1 s, never past the deadline).
    /// The wait ends with `Unavailable` once no attempt has heard from the server for
    /// [`LockOptions::retry_unavailable_for`] (30 s by default), whether the server refuses at
    /// once or answers nothing at all; an attempt that found the lock held heard it. Other errors
    /// end the wait at once.
    ///
    /// With a wait timeout, the call returns by the deadline plus [`WAIT_DEADLINE_SLACK`]
    /// (250 ms) whatever the server does: `Timeout` when the lock stayed held, `Unavailable` when
    /// the server could not be reached or did not answer. An attempt still in flight then is
    /// cut off, and what it may have left on the server is cleaned up in the background
    /// ([`Locker::flush`], [`Locker::shutdown`]).
    ///
    /// Cancel safety: dropping the future removes this waiter from any queue (in the background:
    /// [`Locker::shutdown`] waits for it); a lock granted in the instant before the drop is
    /// released in the background too, or left to expire after its TTL at the latest.
    ///
    /// # Errors
    /// `Timeout` when the deadline passes; `Unavailable` as above; otherwise as
    /// [`Locker::try_lock`].
    pub async fn lock(&self, name: impl IntoLockName, options: &LockOptions) -> Result<LockGuard> {
        self.wait_for(self.request(name, options)?, options).await
    }

    /// [`Locker::lock`] with its request built: waits for it.
    ///
    /// Cancel safety: as [`Locker::lock`].
    pub(crate) async fn wait_for(
        &self,
        req: PendingGuard,
        options: &LockOptions,
    ) -> Result<LockGuard> {
        let started = Instant::now();
        let deadline = options.wait_value().map(|w| started + w);
        let span = self.acquire_span(&req.request.name, "wait");
        let wait_span = tracing::info_span!(
            parent: &span,
            "lock.wait",
            lock = req.request.name.as_str(),
            backend = &*self.inner.telemetry.backend,
        );
        let result = self
            .acquire_retrying(&req.request, deadline, options.retry_unavailable_value())
            .instrument(wait_span)
            .await;
        // Dropped with the request when the call is cancelled.
        req.request.waiting.clear();
        let outcome = match &result {
            Ok(Some(_)) => Outcome::Acquired,
            Ok(None) => Outcome::Timeout,
            Err(_) => Outcome::Error,
        };
        self.record_acquire(&span, true, outcome, started);
        match result? {
            Some(a) => {
                let handed_over =
                    a.sent_at.saturating_duration_since(started) >= Duration::from_millis(1);
                self.inner.telemetry.waited(started.elapsed(), handed_over);
                Ok(self.guard(req, a, options))
            }
            None => Err(Error::timeout(format!(
                "lock {:?} was not acquired within {:?}",
                req.request.name.as_str(),
                options.wait_value().unwrap_or_default()
            ))),
        }
    }

    /// Takes the lock (waiting as [`Locker::lock`] does), runs `work` with the guard while
    /// holding it, and releases it. The work gets the [`LockGuard`] so it can hand the
    /// [fencing token](LockGuard::fencing_token) to the storage it writes.
    ///
    /// The lease is renewed while the work runs, as every guard is (see the [crate
    /// docs](crate#one-rule-for-every-guard-renewed-while-it-exists)). If the lease is lost first (a refused
    /// renewal, the validity deadline, the maximum hold time), `work` is dropped at its next
    /// await point, so it stops acting on the lock's behalf.
    ///
    /// The three ways it can fail are distinct ([`WithLockError`]): the lock was not acquired
    /// (the work did not run), the lease was lost while the work ran (the work was stopped), or
    /// the work finished and only the release failed (its output is kept in
    /// [`WithLockError::ReleaseFailed`]). A work that finishes in the same instant the loss is
    /// noticed counts as finished. `?` converts the error into [`Error`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockcore::Result<()> {
    /// use lockcore::{LockGuard, LockOptions, Locker, memory::MemoryBackend};
    /// let locker = Locker::new(MemoryBackend::connect("with_lock"));
    /// let token = locker
    ///     .with_lock("jobs/nightly", &LockOptions::new(), async |guard: &LockGuard| {
    ///         // write to storage with guard.fencing_token() ...
    ///         guard.fencing_token()
    ///     })
    ///     .await?;
    /// assert!(token.is_some());
    /// # Ok(()) }
    /// ```
    ///
    /// Cancel safety: dropping the future drops `work` and releases the lock in the background.
    ///
    /// # Errors
    /// [`WithLockError::NotAcquired`] with the errors of [`Locker::lock`];
    /// [`WithLockError::Lost`] when the lease was lost while `work` ran;
    /// [`WithLockError::ReleaseFailed`] with the work's output when only the release failed.
    pub async fn with_lock<T>(
        &self,
        name: impl IntoLockName,
        options: &LockOptions,
        work: impl AsyncFnOnce(&LockGuard) -> T,
    ) -> Result<T, WithLockError<T>> {
        let guard = self
            .lock(name, options)
            .await
            .map_err(WithLockError::NotAcquired)?;
        let lost = guard.lost();
        let out = tokio::select! {
            // Work first: a work that finished keeps its output even if the loss is noticed in
            // the same poll (the release then reports it).
            biased;
            out = work(&guard) => out,
            reason = lost.lost() => return Err(WithLockError::Lost {
                reason,
                error: Error::not_held(format!(
                    "the lease on {:?} was lost while the work ran, which was stopped: {reason}",
                    guard.name().as_str()
                )),
            }),
        };
        match guard.release().await {
            Ok(()) => Ok(out),
            Err(error) => Err(WithLockError::ReleaseFailed { output: out, error }),
        }
    }

    /// Waits until every release handed to the background by dropped guards, and every cleanup
    /// a backend started for a cancelled call (a dropped waiter's queue entry, a partial
    /// acquire), has finished. Call it before shutting a runtime down, so that no lock is left
    /// to expire by its TTL.
    ///
    /// A guard dropped after its runtime shut down cannot release: its lock frees by its TTL (or
    /// with its session), and `flush` does not wait for it.
    ///
    /// Cancel safe.
    pub async fn flush(&self) {
        self.inner.background.idle().await
    }

    /// The last call before a program ends (or its runtime shuts down): waits, for `within` at
    /// most, until the background work of this client and its clones has finished, as
    /// [`Locker::flush`] does: the releases of dropped guards, the removal of the queue entry of
    /// every `lock()` that gave up or was dropped while waiting (a ZooKeeper node, an etcd key,
    /// which would otherwise stay until the session ends or the lease runs out, and hold off
    /// everyone queued behind it), the undoing of partial acquisitions. A runtime that shuts
    /// down drops this work unfinished, so a process that exits without it can leave its locks
    /// and queue entries to expire.
    ///
    /// Guards still held are not touched: release them first (or drop them; their release is
    /// then part of what this waits for). The client stays usable; work started after this call
    /// is not waited for.
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// `Timeout` when work is still running after `within` (a lock service that does not
    /// answer): what that work would have freed frees with its TTL or session instead.
    pub async fn shutdown(&self, within: Duration) -> Result<()> {
        if tokio::time::timeout(within, self.flush()).await.is_ok() {
            return Ok(());
        }
        Err(Error::timeout(format!(
            "{} background clean-up(s) of {} still running after {within:?}; what they would \
             free frees with its TTL or session",
            self.pending_releases(),
            self.describe()
        )))
    }

    /// How many of this client's [`Locker::lock`] calls on `name` wait now: their backend said
    /// so ([`AcquireRequest::waiting`]) once an attempt found the lock held and a release or
    /// expiry would reach them, and they have not returned. For dashboards, and for tests that
    /// must know a waiter is in place where the backend keeps no queue to ask
    /// ([`Backend::queued_waiters`]).
    pub fn waiting(&self, name: impl IntoLockName) -> Result<usize> {
        Ok(self.inner.waiting.count(&name.into_lock_name()?))
    }

    /// How many background releases and cleanups are still running.
    pub fn pending_releases(&self) -> usize {
        self.inner.background.pending()
    }

    /// The backend's wait, retrying `Unavailable` errors as [`Locker::lock`] documents: an
    /// attempt still in flight is cut off at the deadline plus [`WAIT_DEADLINE_SLACK`], and at
    /// the end of `retry_limit` without a word from the server (dropping it starts the backend's
    /// cancel clean-up).
    async fn acquire_retrying(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        retry_limit: Duration,
    ) -> Result<Option<Acquired>> {
        // Since when no attempt has heard from the server (each failed `Unavailable` without
        // finding the lock held), and the last of those failures.
        let mut unheard: Option<(Instant, Error)> = None;
        let mut attempt = 0u32;
        loop {
            let started = Instant::now();
            let marks = req.waiting.marks();
            let heard = || req.waiting.marks() != marks;
            let run = self.inner.backend.acquire(req, deadline);
            tokio::pin!(run);
            // The first attempt of a run is bounded too: one the server never answers may
            // have no response timeout of its own to end it.
            let mut give_up_at = unheard
                .as_ref()
                .map_or(started, |(since, _)| *since)
                .checked_add(retry_limit);
            let cut_at = deadline.map(|d| d + WAIT_DEADLINE_SLACK);
            let result = loop {
                let Some(at) = cut_at.into_iter().chain(give_up_at).min() else {
                    break run.as_mut().await;
                };
                tokio::select! {
                    biased;
                    r = run.as_mut() => break r,
                    () = tokio::time::sleep_until(at) => {}
                }
                if cut_at.is_some_and(|c| Instant::now() >= c) {
                    // Past the deadline: whether the lock stayed held or the server is silent.
                    return if heard() {
                        Ok(None)
                    } else {
                        Err(no_answer(
                            unheard.map(|(_, e)| e),
                            "before the wait's deadline",
                        ))
                    };
                }
                if heard() {
                    // The server answers (the lock is held): no longer a failure run.
                    unheard = None;
                    give_up_at = None;
                } else {
                    return Err(no_answer(
                        unheard.map(|(_, e)| e),
                        &format!("for {retry_limit:?} (LockOptions::retry_unavailable_for)"),
                    ));
                }
            };
            let err = match result {
                Err(e) if e.kind() == ErrorKind::Unavailable => e,
                other => return other,
            };
            let now = Instant::now();
            if heard() {
                // That attempt reached the server and waited before failing: a new failure run.
                unheard = None;
                attempt = 0;
            }
            let since = unheard.as_ref().map_or(started, |(since, _)| *since);
            let give_up = since.checked_add(retry_limit);
            if deadline.is_some_and(|d| now >= d) || give_up.is_some_and(|g| now >= g) {
                return Err(err);
            }
            let mut wake = now + RETRY_BACKOFF.delay(attempt);
            for bound in deadline.into_iter().chain(give_up) {
                wake = wake.min(bound);
            }
            tracing::debug!(error = %format!("{err:#}"), lock = req.name.as_str(), attempt, "lock wait: transient error, retrying");
            tokio::time::sleep_until(wake).await;
            if give_up.is_some_and(|g| Instant::now() >= g) {
                return Err(err);
            }
            unheard = Some((since, err));
            attempt = attempt.saturating_add(1);
        }
    }

    /// One all-or-nothing attempt at `names` (distinct, canonical order) in one request to the
    /// backend ([`Backend::try_acquire_all`]): a guard per name, in order, or the index of the
    /// first member found busy. For the multi-locks, which validated `options` and checked that
    /// the backend declares [`Capabilities::atomic_multi`].
    ///
    /// Cancel safety: as the backend's `try_acquire_all` (a dropped attempt leaves no lock of
    /// the set beyond its TTL); once its reply is in, the guards are made without an await.
    pub(crate) async fn try_lock_set(
        &self,
        names: &[LockName],
        options: &LockOptions,
    ) -> Result<std::result::Result<Vec<LockGuard>, usize>> {
        let pending = self.set_requests(names, options)?;
        match self.try_set(pending, options).await {
            SetTry::Won(guards) => Ok(Ok(guards)),
            SetTry::Busy(i) => Ok(Err(i)),
            SetTry::Failed(e, _) => Err(e),
        }
    }

    /// The requests of one attempt at the set `names` (an owner token each).
    pub(crate) fn set_requests(
        &self,
        names: &[LockName],
        options: &LockOptions,
    ) -> Result<Vec<PendingGuard>> {
        names
            .iter()
            .map(|name| self.request(name.clone(), options))
            .collect()
    }

    /// One attempt at a set with the requests `pending` (from [`Locker::set_requests`]); a
    /// failed attempt gives them back, so that a retry re-sends the very same requests (their
    /// owner tokens), as [`Locker::lock`] retries an `Unavailable` attempt: the first copy may
    /// have been applied, and the backend takes a same-token re-send as its own.
    ///
    /// Cancel safety: as [`Locker::try_lock_set`].
    pub(crate) async fn try_set(
        &self,
        pending: Vec<PendingGuard>,
        options: &LockOptions,
    ) -> SetTry {
        let reqs: Vec<AcquireRequest> = pending.iter().map(|p| p.request.clone()).collect();
        let span = self.acquire_span(&reqs[0].name, "try_all");
        let started = Instant::now();
        let result = self
            .inner
            .backend
            .try_acquire_all(&reqs)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(SetAttempt::All(_)) => Outcome::Acquired,
            Ok(SetAttempt::Busy(_)) => Outcome::Busy,
            Err(_) => Outcome::Error,
        };
        self.record_acquire(&span, false, outcome, started);
        let attempt = match result {
            Ok(a) => a,
            Err(e) => return SetTry::Failed(e, pending),
        };
        match attempt {
            SetAttempt::All(acquired) if acquired.len() == pending.len() => SetTry::Won(
                pending
                    .into_iter()
                    .zip(acquired)
                    .map(|(p, a)| self.guard(p, a, options))
                    .collect(),
            ),
            SetAttempt::All(acquired) => {
                let n = acquired.len();
                // Release what came back (owner-checked) before reporting the broken backend.
                for a in acquired {
                    let lease = a.lease;
                    self.inner.background.spawn(async move {
                        let _ = lease.release().await;
                    });
                }
                let e = Error::new(
                    ErrorKind::Backend,
                    format!(
                        "{} returned {n} leases for a set of {}",
                        self.describe(),
                        pending.len()
                    ),
                );
                SetTry::Failed(e, pending)
            }
            SetAttempt::Busy(i) if i < pending.len() => SetTry::Busy(i),
            SetAttempt::Busy(i) => {
                let e = Error::new(
                    ErrorKind::Backend,
                    format!(
                        "{} reported member {i} of a set of {} busy",
                        self.describe(),
                        pending.len()
                    ),
                );
                SetTry::Failed(e, pending)
            }
        }
    }

    pub(crate) fn request(
        &self,
        name: impl IntoLockName,
        options: &LockOptions,
    ) -> Result<PendingGuard> {
        self.inner.liveness.check()?;
        let name = name.into_lock_name()?;
        options.validate(self.capabilities())?;
        let (notifier, signal) = LostNotifier::new();
        Ok(PendingGuard {
            request: AcquireRequest::new(name.clone(), OwnerToken::random(), options.ttl_value())
                .with_holder(Holder::current(options.label_value().map(str::to_owned)))
                .with_waiting(WaitMark::on(self.inner.waiting.clone(), name))
                .with_mode(options.mode_value())
                .with_fencing(options.fencing_value())
                .with_renewed(options.auto_renew_value().is_some())
                .with_lost(notifier)
                .with_background(self.inner.background.clone()),
            signal,
        })
    }
    fn guard(&self, pending: PendingGuard, acquired: Acquired, options: &LockOptions) -> LockGuard {
        let PendingGuard { request, signal } = pending;
        LockGuard::start(&self.inner, request, signal, acquired, options)
    }
}

/// How one attempt at a set ended ([`Locker::try_set`]).
pub(crate) enum SetTry {
    /// Every member, in order.
    Won(Vec<LockGuard>),
    /// The index of the first member found busy.
    Busy(usize),
    /// The attempt failed; its requests, to re-send as they are.
    Failed(Error, Vec<PendingGuard>),
}

pub(crate) struct PendingGuard {
    pub(crate) request: AcquireRequest,
    signal: LostSignal,
}
