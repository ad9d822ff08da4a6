//! The user-facing client: validation, waiting, guards, auto-renewal, the lost signal and
//! release on drop, the same for every backend.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backend::{
    AcquireRequest, Acquired, Backend, Background, BoxLease, LostNotifier, OwnerToken,
};
use crate::lost::Validity;
use crate::{
    AutoRenew, Capabilities, Error, ErrorKind, IntoLockName, LockName, LockOptions, LostReason,
    LostSignal, RenewKind, Result,
};

/// A client of one lock backend. Cheap to clone; clones share the backend connection(s).
///
/// Create it inside a tokio runtime: guards dropped without an explicit release are released by
/// a task spawned on that runtime.
#[derive(Clone)]
pub struct Locker {
    inner: Arc<LockerInner>,
}

struct LockerInner {
    backend: Arc<dyn Backend>,
    runtime: Handle,
    /// Drop-releases and the backends' own cleanup (cancelled waiters, partial acquires).
    background: Background,
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
        Locker {
            inner: Arc::new(LockerInner {
                backend,
                background: Background::on(Handle::current()),
                runtime: Handle::current(),
            }),
        }
    }

    /// The backend's capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        self.inner.backend.capabilities()
    }

    /// The backend, described with secrets redacted.
    pub fn describe(&self) -> String {
        self.inner.backend.describe()
    }

    /// The backend itself.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// One attempt to take the lock: `Ok(None)` if someone else holds it (contention is not an
    /// error). The wait timeout in `options` is ignored.
    ///
    /// Cancel safety: dropping the future before it completes may leave the lock held by nobody
    /// reachable until the TTL runs out (the request may have reached the server); it never leaves
    /// it held longer.
    ///
    /// # Errors
    /// `InvalidName`, `InvalidConfig` or `Unsupported` before any I/O; `Unavailable` or `Backend`
    /// when the backend fails.
    pub async fn try_lock(
        &self,
        name: impl IntoLockName,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        let req = self.request(name, options)?;
        let acquired = self.inner.backend.try_acquire(&req.request).await?;
        Ok(acquired.map(|a| self.guard(req, a, options)))
    }

    /// Takes the lock, waiting until it is acquired, or until the options' wait timeout when
    /// they set one ([`LockOptions::wait_timeout`]; no deadline by default, as tokio's `Mutex`,
    /// Redisson, Curator, `flock` and `etcdctl lock`). Waits by the backend's notification where
    /// it has one, and otherwise polls with exponential backoff and full jitter; fair backends
    /// serve waiters FIFO.
    ///
    /// Cancel safety: dropping the future removes this waiter from any queue; a lock granted in
    /// the instant before the drop is left to expire after its TTL at the latest.
    ///
    /// # Errors
    /// `Timeout` when the deadline passes; otherwise as [`Locker::try_lock`].
    pub async fn lock(&self, name: impl IntoLockName, options: &LockOptions) -> Result<LockGuard> {
        let req = self.request(name, options)?;
        let deadline = options.wait_value().map(|w| Instant::now() + w);
        match self.inner.backend.acquire(&req.request, deadline).await? {
            Some(a) => Ok(self.guard(req, a, options)),
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
    /// The lease is renewed while the work runs: with the options' [`AutoRenew`] if they set
    /// one, otherwise up to [`DEFAULT_MAX_HOLD`](crate::DEFAULT_MAX_HOLD) (one hour;
    /// [`LockOptions::no_auto_renew`] turns it off). If the lease is lost first (a refused
    /// renewal, the validity deadline, the maximum hold time), `work` is dropped at its next
    /// await point, so it stops acting on the lock's behalf, and the call returns `NotHeld`
    /// naming the reason.
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
    /// As [`Locker::lock`]; `NotHeld` when the lease was lost while `work` ran. The release's own
    /// error, if any, is returned after `work` completed.
    pub async fn with_lock<T>(
        &self,
        name: impl IntoLockName,
        options: &LockOptions,
        work: impl AsyncFnOnce(&LockGuard) -> T,
    ) -> Result<T> {
        let options = options.renewing_by_default();
        let guard = self.lock(name, &options).await?;
        let lost = guard.lost();
        let out = tokio::select! {
            out = work(&guard) => out,
            reason = lost.lost() => return Err(Error::not_held(format!(
                "the lease on {:?} was lost while the work ran: {reason}",
                guard.name().as_str()
            ))),
        };
        guard.release().await?;
        Ok(out)
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

    /// How many background releases and cleanups are still running.
    pub fn pending_releases(&self) -> usize {
        self.inner.background.pending()
    }

    fn request(&self, name: impl IntoLockName, options: &LockOptions) -> Result<PendingGuard> {
        let name = name.into_lock_name()?;
        options.validate(self.capabilities())?;
        let (notifier, signal) = LostNotifier::new();
        Ok(PendingGuard {
            request: AcquireRequest::new(name, OwnerToken::random(), options.ttl_value())
                .with_lost(notifier)
                .with_background(self.inner.background.clone()),
            signal,
        })
    }

    fn guard(&self, pending: PendingGuard, acquired: Acquired, options: &LockOptions) -> LockGuard {
        let PendingGuard { request, signal } = pending;
        let ttl = request.ttl;
        let caps = self.capabilities();
        let granted = acquired.granted_ttl.unwrap_or(ttl);
        let validity = Arc::new(Validity::new(
            acquired.sent_at + granted.saturating_sub(caps.drift_margin(granted)),
        ));
        let shared = Arc::new(GuardShared {
            lease: acquired.lease,
            notifier: request.lost,
            validity: validity.clone(),
            release_started: AtomicBool::new(false),
        });
        // The lost signal notices a passed deadline by itself, and a TTL backend's server frees
        // the lock by itself: a watchdog task is needed only to renew, or to release a
        // session-bound lease at its deadline. Not spawning one keeps a worker wake-up off the
        // uncontended path.
        let needs_watchdog = options.auto_renew_value().is_some()
            || !caps.expiry_after_ttl
            || caps.renew == RenewKind::Native;
        let watchdog = needs_watchdog.then(|| {
            self.inner.runtime.spawn(watchdog(
                shared.clone(),
                self.inner.clone(),
                signal.clone(),
                ttl,
                acquired.sent_at,
                options.auto_renew_value().cloned(),
            ))
        });
        let signal = signal.with_validity(validity);
        LockGuard {
            name: request.name,
            token: request.token,
            ttl,
            fencing_token: shared.lease.fencing_token(),
            acquired_at: acquired.sent_at,
            shared,
            signal,
            watchdog,
            locker: self.inner.clone(),
            finished: false,
        }
    }
}

struct PendingGuard {
    request: AcquireRequest,
    signal: LostSignal,
}

struct GuardShared {
    lease: BoxLease,
    notifier: LostNotifier,
    validity: Arc<Validity>,
    release_started: AtomicBool,
}

impl GuardShared {
    fn valid_until(&self) -> Instant {
        self.validity.until()
    }

    fn set_valid_until(&self, at: Instant) {
        self.validity.set_until(at);
    }

    /// True for the one caller that may release the lease. A user's release (or drop, or
    /// abandon) also ends the lease for the lost signal; the watchdog's release at the deadline
    /// does not, since the deadline passing is the loss.
    fn begin_release(&self) -> bool {
        !self.release_started.swap(true, Ordering::AcqRel)
    }

    fn end_by_holder(&self) {
        self.validity.ended.store(true, Ordering::Release);
    }
}

impl LockerInner {
    /// Hands a release to a background task: never blocks, and runs to completion as long as the
    /// runtime does.
    fn release_in_background(self: &Arc<Self>, shared: Arc<GuardShared>) {
        self.background.spawn(async move {
            if let Err(e) = shared.lease.release().await
                && e.kind() != ErrorKind::NotHeld
            {
                tracing::warn!(error = %e, "background release failed; the lock frees after its ttl");
            }
        });
    }

    fn drift_margin(&self, ttl: Duration) -> Duration {
        self.backend.capabilities().drift_margin(ttl)
    }
}

/// Keeps one lease: renews it (when asked) until the maximum hold time, fires the lost signal
/// when the validity deadline passes or a renewal is refused, and releases a lease whose validity
/// ran out (so that session-bound backends honour the TTL too).
async fn watchdog(
    shared: Arc<GuardShared>,
    locker: Arc<LockerInner>,
    signal: LostSignal,
    ttl: Duration,
    acquired_at: Instant,
    renew: Option<AutoRenew>,
) {
    let hold_deadline = renew.as_ref().map(|r| acquired_at + r.max_hold());
    let interval = renew.as_ref().map(|r| ttl.mul_f64(r.fraction()));
    let mut next_renew = interval.map(|i| acquired_at + i);
    loop {
        let valid_until = shared.valid_until();
        tokio::select! {
            _ = tokio::time::sleep_until(valid_until) => {
                // A manual extend may have moved the deadline while we slept.
                if shared.valid_until() > Instant::now() {
                    continue;
                }
                shared.notifier.fire(LostReason::ValidityExpired);
                if shared.begin_release() {
                    locker.release_in_background(shared.clone());
                }
                return;
            }
            _ = signal.reported() => return,
            _ = sleep_until_opt(next_renew) => {
                let (Some(hold_deadline), Some(interval)) = (hold_deadline, interval) else {
                    return;
                };
                let now = Instant::now();
                let remaining_hold = hold_deadline.saturating_duration_since(now);
                if remaining_hold < Duration::from_millis(1) {
                    next_renew = None;
                    continue;
                }
                let new_ttl = ttl.min(remaining_hold);
                match tokio::time::timeout_at(valid_until, shared.lease.extend(new_ttl)).await {
                    Ok(Ok(granted)) => {
                        shared.set_valid_until(now + granted.saturating_sub(locker.drift_margin(granted)));
                        // The last renewal stops at the maximum hold time exactly.
                        next_renew = (new_ttl == ttl).then(|| now + interval);
                    }
                    Ok(Err(e)) if e.kind() == ErrorKind::NotHeld => {
                        shared.notifier.fire(LostReason::RenewalRefused);
                        return;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "lease renewal failed; retrying before the validity deadline");
                        next_renew = Some((Instant::now() + interval / 4).min(valid_until));
                    }
                    Err(_elapsed) => {
                        // Loop again: the validity branch fires the signal and releases.
                        next_renew = None;
                    }
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A held lock. Release it with [`LockGuard::release`] to learn the outcome; dropping it hands
/// the release to a background task of the [`Locker`] (never blocking, and not immediate: the
/// lock is free a round trip later).
///
/// Check [`LockGuard::lost`] (or [`LockGuard::is_valid`]) before acting on the lock's behalf,
/// and pass [`LockGuard::fencing_token`] to the resource you protect where the backend has one.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    name: LockName,
    token: OwnerToken,
    ttl: Duration,
    fencing_token: Option<u64>,
    acquired_at: Instant,
    shared: Arc<GuardShared>,
    signal: LostSignal,
    watchdog: Option<JoinHandle<()>>,
    locker: Arc<LockerInner>,
    finished: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("fencing_token", &self.fencing_token)
            .field("lost", &self.signal.reason())
            .finish()
    }
}

impl LockGuard {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// This acquisition's random owner token.
    pub fn token(&self) -> OwnerToken {
        self.token
    }

    /// The fencing token: strictly increasing across successive holders of this name, on
    /// backends that declare `fencing`.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// When the request that won the lock was sent.
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// The TTL asked for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Until when the lease is surely this holder's, on the monotonic clock: the moment the
    /// winning (or last renewing) request was sent, plus the TTL, minus a drift margin.
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// Whether the lease is still within its validity and not known lost.
    pub fn is_valid(&self) -> bool {
        !self.signal.is_lost() && Instant::now() < self.valid_until()
    }

    /// The lost signal: fires when the lease is known lost.
    pub fn lost(&self) -> LostSignal {
        self.signal.clone()
    }

    /// Extends the lease to `ttl` from now.
    ///
    /// Cancel safety: dropping the future may or may not have extended the lease; the validity
    /// deadline is only moved on success.
    ///
    /// # Errors
    /// `NotHeld` if the lease is no longer this holder's (nothing changes), `InvalidConfig` for a
    /// bad TTL, `Unavailable` or `Backend` on failure.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        LockOptions::new()
            .ttl(ttl)
            .validate(self.locker.backend.capabilities())?;
        if self.shared.release_started.load(Ordering::Acquire) {
            return Err(Error::not_held("the lease has been released"));
        }
        let sent = Instant::now();
        match self.shared.lease.extend(ttl).await {
            Ok(granted) => {
                self.shared.set_valid_until(
                    sent + granted.saturating_sub(self.locker.drift_margin(granted)),
                );
                Ok(())
            }
            Err(e) => {
                if e.kind() == ErrorKind::NotHeld {
                    self.shared.notifier.fire(LostReason::RenewalRefused);
                }
                Err(e)
            }
        }
    }

    /// Releases the lock and reports how it went.
    ///
    /// Cancel safety: if the future is dropped before it completes, the release goes on in the
    /// background as if the guard had been dropped.
    ///
    /// # Errors
    /// `NotHeld` if the lease had already expired or been taken over (nothing was freed);
    /// `Unavailable` or `Backend` on failure (the lock then frees after its TTL).
    pub async fn release(mut self) -> Result<()> {
        self.stop_watchdog();
        self.finished = true;
        if self.signal.is_lost() {
            // Released after the loss: the signal stays fired, and the release is still sent.
        } else {
            self.shared.end_by_holder();
        }
        if !self.shared.begin_release() {
            return Err(Error::not_held(
                "the lease ran past its validity and was already released",
            ));
        }
        let mut on_cancel = ReleaseOnCancel {
            shared: Some(self.shared.clone()),
            locker: self.locker.clone(),
        };
        let result = self.shared.lease.release().await;
        on_cancel.shared = None;
        result
    }

    /// Stops renewal and forgets the lease without releasing it: the lock stays held until its
    /// TTL runs out (or, on session-bound backends, until the session ends). Meant for tests that
    /// play a crashed holder.
    pub fn abandon(mut self) {
        self.stop_watchdog();
        self.finished = true;
        self.shared.end_by_holder();
        self.shared.release_started.store(true, Ordering::Release);
    }

    fn stop_watchdog(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop_watchdog();
        if !self.finished && !self.signal.is_lost() {
            self.shared.end_by_holder();
        }
        if !self.finished && self.shared.begin_release() {
            self.locker.release_in_background(self.shared.clone());
        }
    }
}

struct ReleaseOnCancel {
    shared: Option<Arc<GuardShared>>,
    locker: Arc<LockerInner>,
}

impl Drop for ReleaseOnCancel {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            self.locker.release_in_background(shared);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;

    #[tokio::test]
    async fn with_lock_runs_the_work_and_releases() {
        let locker = Locker::new(MemoryBackend::connect("with_lock_runs"));
        let opts = LockOptions::new();
        let out = locker
            .with_lock("x", &opts, async |_: &LockGuard| {
                // Held while the work runs.
                let other = Locker::new(MemoryBackend::connect("with_lock_runs"));
                other
                    .try_lock("x", &LockOptions::new())
                    .await
                    .map(|g| g.is_none())
            })
            .await
            .unwrap();
        assert_eq!(out.ok(), Some(true));
        assert!(locker.try_lock("x", &opts).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn with_lock_stops_the_work_when_the_lease_is_lost() {
        let locker = Locker::new(MemoryBackend::connect("with_lock_lost"));
        let opts = LockOptions::new()
            .ttl(Duration::from_millis(100))
            .no_auto_renew();
        let started = Instant::now();
        let err = locker
            .with_lock("x", &opts, async |_: &LockGuard| {
                tokio::time::sleep(Duration::from_secs(30)).await
            })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the work was not stopped"
        );
    }
}
