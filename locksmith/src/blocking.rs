//! Locks for synchronous programs (feature `blocking`), as tokio's `Mutex::blocking_lock` or
//! DistributedLock's synchronous methods.
//!
//! [`connect`] starts a small runtime of its own (one worker thread, named
//! `locksmith-blocking`) that runs everything a lock needs in the background: renewal, the
//! lost signal, releases of dropped guards, a backend's session or keep-alive. The calling
//! thread blocks in each method until the request is done.
//!
//! **The runtime outlives every guard it hands out.** Guards and the [`Locker`] share it; it
//! shuts down when the last of them is dropped, after the releases started by dropped guards
//! have finished (bounded by [`SHUTDOWN_GRACE`]), so a guard dropped after its `Locker` is
//! released exactly as an async guard is, never left to expire by its TTL.
//!
//! The rules of the async API hold unchanged ([`crate::Locker`]): guards are renewed while they
//! live (up to the maximum hold time), `try_lock` returns `Ok(None)` on contention, and the
//! [`LostSignal`] of a guard tells when its lease is lost. Synchronous work cannot be
//! interrupted at an await point, so a holder doing long work checks
//! [`LockGuard::is_valid`] (or [`LostSignal::is_lost`]) before each step that needs the lock,
//! and passes [`LockGuard::fencing_token`] to the storage it writes.
//!
//! ```
//! use std::time::Duration;
//! use locksmith::LockOptions;
//!
//! // A synchronous `main`: no tokio in sight.
//! let locker = locksmith::blocking::connect("memory://jobs")?;
//! let opts = LockOptions::new().ttl(Duration::from_secs(10));
//! let guard = locker.lock("reports/daily", &opts)?;
//! assert!(locker.try_lock("reports/daily", &opts)?.is_none()); // contention is Ok(None)
//! // ... the critical section, writing with guard.fencing_token() ...
//! guard.release()?;
//! # Ok::<(), locksmith::Error>(())
//! ```
//!
//! # Panics
//! Every blocking method panics when called from inside an async runtime (as tokio's
//! `blocking_lock` does): an async program uses [`crate::Locker`]. Dropping a guard or a
//! `Locker` there does not panic and does not block (the release and the runtime's shutdown
//! go on in the background).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{
    CampaignOptions, Capabilities, Error, Instant, IntoLockName, Leader, LockInfo, LockName,
    LockOptions, LostReason, LostSignal, OwnerToken, Result, WithLockError,
};

/// How long the last `Locker` or guard to be dropped waits for pending background releases
/// before the runtime stops (a release still running then is abandoned and its lock frees by
/// its TTL, or with its session).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Connects to the lock service named by `url` (see [`crate::connect`]) and starts the
/// runtime that serves it.
///
/// # Errors
/// As [`crate::connect`], and [`ErrorKind::Backend`](crate::ErrorKind::Backend) when the runtime's
/// thread cannot be started.
///
/// # Panics
/// Inside an async runtime.
pub fn connect(url: &str) -> Result<Locker> {
    let runtime = Runtime::start()?;
    let locker = runtime.block_on(crate::connect(url))?;
    Ok(Locker::new(locker, runtime))
}

/// Builds a locker from a [`Config`](crate::Config) (see [`crate::connect_config`]) and starts
/// the runtime that serves it.
///
/// # Errors
/// As [`crate::connect_config`], and `Backend` when the runtime cannot be started.
///
/// # Panics
/// Inside an async runtime.
pub fn connect_config(config: crate::Config) -> Result<Locker> {
    let runtime = Runtime::start()?;
    let locker = runtime.block_on(crate::connect_config(config))?;
    Ok(Locker::new(locker, runtime))
}

/// The runtime shared by a blocking [`Locker`] and its guards; stops when the last is dropped.
struct Runtime {
    runtime: Option<tokio::runtime::Runtime>,
    /// The locker whose background releases the shutdown waits for (set once connected).
    locker: std::sync::OnceLock<crate::Locker>,
}

impl Runtime {
    fn start() -> Result<Arc<Self>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("locksmith-blocking")
            .enable_all()
            .build()
            .map_err(|e| Error::backend("cannot start the blocking runtime", e))?;
        Ok(Arc::new(Runtime {
            runtime: Some(runtime),
            locker: std::sync::OnceLock::new(),
        }))
    }

    fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime
            .as_ref()
            .expect("the runtime lives until drop")
            .block_on(future)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let locker = self.locker.take();
        let stop = move || {
            // The last clone of the async locker is dropped inside the runtime, where the
            // backend's own clean-up (closing a session, stopping a keeper) can still spawn.
            runtime.block_on(async move {
                if let Some(locker) = locker {
                    let _ = tokio::time::timeout(SHUTDOWN_GRACE, locker.flush()).await;
                }
            });
            runtime.shutdown_timeout(Duration::from_secs(1));
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Dropped inside an async context, where this thread must not block: the same
            // shutdown on a thread of its own.
            let _ = std::thread::Builder::new()
                .name("locksmith-blocking-stop".into())
                .spawn(stop);
        } else {
            stop();
        }
    }
}

/// A synchronous [`crate::Locker`]: the same backends and contract, blocking calls.
///
/// Cheap to clone (clones share the client and the runtime).
#[derive(Clone)]
pub struct Locker {
    locker: crate::Locker,
    runtime: Arc<Runtime>,
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("blocking::Locker")
            .field("backend", &self.locker.describe())
            .finish()
    }
}

impl Locker {
    fn new(locker: crate::Locker, runtime: Arc<Runtime>) -> Self {
        let _ = runtime.locker.set(locker.clone());
        Locker { locker, runtime }
    }

    /// The backend's capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        self.locker.capabilities()
    }

    /// The backend, described with secrets redacted.
    pub fn describe(&self) -> String {
        self.locker.describe()
    }

    /// The async locker this one drives (for code that has both worlds). Its futures must be
    /// run on this locker's runtime, which only [`Locker::block_on`] gives.
    pub fn as_async(&self) -> &crate::Locker {
        &self.locker
    }

    /// Runs `future` to completion on this locker's runtime, blocking the calling thread: for
    /// calls of the async API that have no blocking twin.
    ///
    /// # Panics
    /// Inside an async runtime.
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// One attempt to take the lock, as [`crate::Locker::try_lock`]: `Ok(None)` if someone else
    /// holds it.
    ///
    /// Bind the guard for as long as the lock is needed (`let _ = ...` releases it at once). A
    /// result left unused is refused where `unused_must_use` is denied:
    ///
    /// ```compile_fail
    /// #![deny(unused_must_use)]
    /// # fn f(locker: locksmith::blocking::Locker) {
    /// locker.try_lock("job", &locksmith::LockOptions::new());
    /// # }
    /// ```
    ///
    /// ```
    /// #![deny(unused_must_use)]
    /// # fn f(locker: locksmith::blocking::Locker) -> locksmith::Result<()> {
    /// let Some(_guard) = locker.try_lock("job", &locksmith::LockOptions::new())? else {
    ///     return Ok(()); // held by someone else
    /// };
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`crate::Locker::try_lock`].
    ///
    /// # Panics
    /// Inside an async runtime.
    #[must_use = "the lock is released as soon as its guard is dropped: bind the result (`let guard = ...` or `let _guard = ...`, not `let _ = ...`)"]
    pub fn try_lock(
        &self,
        name: impl IntoLockName,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        let guard = self.block_on(self.locker.try_lock(name, options))?;
        Ok(guard.map(|g| self.wrap(g)))
    }

    /// Takes the lock, waiting up to the options' wait timeout, as [`crate::Locker::lock`].
    ///
    /// # Errors
    /// As [`crate::Locker::lock`] (`Timeout` when the wait deadline passed).
    ///
    /// # Panics
    /// Inside an async runtime.
    pub fn lock(&self, name: impl IntoLockName, options: &LockOptions) -> Result<LockGuard> {
        let guard = self.block_on(self.locker.lock(name, options))?;
        Ok(self.wrap(guard))
    }

    /// Takes the lock, runs `work` and releases the lock.
    ///
    /// Synchronous work cannot be stopped when the lease is lost: it runs to its end, and the
    /// loss is reported afterwards as [`WithLockError::ReleaseFailed`] (with the work's output
    /// and a `NotHeld` error), so the caller knows its side effects may have happened without
    /// the lock. Work that must stop checks [`LockGuard::is_valid`] between its steps.
    ///
    /// # Errors
    /// [`WithLockError::NotAcquired`] with the errors of [`Locker::lock`];
    /// [`WithLockError::ReleaseFailed`] with the work's output when the release failed or the
    /// lease was lost while the work ran.
    ///
    /// # Panics
    /// Inside an async runtime.
    pub fn with_lock<T>(
        &self,
        name: impl IntoLockName,
        options: &LockOptions,
        work: impl FnOnce(&LockGuard) -> T,
    ) -> Result<T, WithLockError<T>> {
        let guard = self
            .lock(name, options)
            .map_err(WithLockError::NotAcquired)?;
        let output = work(&guard);
        match guard.release() {
            Ok(()) => Ok(output),
            Err(error) => Err(WithLockError::ReleaseFailed { output, error }),
        }
    }

    /// Every lock of `names`, waiting up to the options' wait timeout, as
    /// [`crate::Locker::lock_all`].
    ///
    /// # Errors
    /// As [`crate::Locker::lock_all`].
    ///
    /// # Panics
    /// Inside an async runtime.
    pub fn lock_all<N: IntoLockName>(
        &self,
        names: impl IntoIterator<Item = N>,
        options: &LockOptions,
    ) -> Result<MultiGuard> {
        let set = self.block_on(self.locker.lock_all(names, options))?;
        Ok(MultiGuard {
            set: Some(set),
            runtime: self.runtime.clone(),
        })
    }

    /// One attempt at every lock of `names`, as [`crate::Locker::try_lock_all`]: `Ok(None)`
    /// (nothing held) when one of them is held by someone else.
    ///
    /// A result left unused is refused where `unused_must_use` is denied:
    ///
    /// ```compile_fail
    /// #![deny(unused_must_use)]
    /// # fn f(locker: locksmith::blocking::Locker) {
    /// locker.try_lock_all(["a", "b"], &locksmith::LockOptions::new());
    /// # }
    /// ```
    ///
    /// ```
    /// #![deny(unused_must_use)]
    /// # fn f(locker: locksmith::blocking::Locker) -> locksmith::Result<()> {
    /// let Some(_both) = locker.try_lock_all(["a", "b"], &locksmith::LockOptions::new())? else {
    ///     return Ok(()); // one of them is held by someone else
    /// };
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`crate::Locker::try_lock_all`].
    ///
    /// # Panics
    /// Inside an async runtime.
    #[must_use = "the locks are released as soon as their guard is dropped: bind the result (`let guard = ...` or `let _guard = ...`, not `let _ = ...`)"]
    pub fn try_lock_all<N: IntoLockName>(
        &self,
        names: impl IntoIterator<Item = N>,
        options: &LockOptions,
    ) -> Result<Option<MultiGuard>> {
        let set = self.block_on(self.locker.try_lock_all(names, options))?;
        Ok(set.map(|set| MultiGuard {
            set: Some(set),
            runtime: self.runtime.clone(),
        }))
    }

    /// Who holds `name`, as [`crate::Locker::inspect`]. Reads only.
    ///
    /// # Errors
    /// As [`crate::Locker::inspect`].
    ///
    /// # Panics
    /// Inside an async runtime.
    pub fn inspect(&self, name: impl IntoLockName) -> Result<LockInfo> {
        self.block_on(self.locker.inspect(name))
    }

    /// Frees `name` whoever holds it, as [`crate::Locker::force_release`]: whether something
    /// was released.
    ///
    /// # Errors
    /// As [`crate::Locker::force_release`].
    ///
    /// # Panics
    /// Inside an async runtime.
    pub fn force_release(&self, name: impl IntoLockName) -> Result<bool> {
        self.block_on(self.locker.force_release(name))
    }

    /// Campaigns for the leadership of `name` with `value` and returns once elected, as
    /// [`crate::Locker::campaign`].
    ///
    /// # Errors
    /// As [`crate::Locker::campaign`].
    ///
    /// # Panics
    /// Inside an async runtime.
    pub fn campaign(
        &self,
        name: impl IntoLockName,
        value: &str,
        options: &CampaignOptions,
    ) -> Result<Leadership> {
        let leadership = self.block_on(self.locker.campaign(name, value, options))?;
        Ok(Leadership {
            leadership: Some(leadership),
            runtime: self.runtime.clone(),
        })
    }

    /// The current leader of `name` (`None` when there is none), as
    /// [`crate::Locker::leader`]. Reads only.
    ///
    /// # Errors
    /// As [`crate::Locker::leader`].
    ///
    /// # Panics
    /// Inside an async runtime.
    pub fn leader(&self, name: impl IntoLockName) -> Result<Option<Leader>> {
        self.block_on(self.locker.leader(name))
    }

    /// Waits until every background release of dropped guards has finished (see
    /// [`crate::Locker::flush`]).
    ///
    /// # Panics
    /// Inside an async runtime.
    pub fn flush(&self) {
        self.block_on(self.locker.flush())
    }

    fn wrap(&self, guard: crate::LockGuard) -> LockGuard {
        LockGuard {
            guard: Some(guard),
            runtime: self.runtime.clone(),
        }
    }
}

/// A held lock of a blocking [`Locker`]; released when dropped (in the background, on the
/// locker's runtime, which lives until the release is done).
#[must_use = "the lock is released as soon as the guard is dropped: bind it (`let guard = ...` or `let _guard = ...`; `let _ = ...` releases at once)"]
pub struct LockGuard {
    /// Always `Some` until `release` or drop; dropped before `runtime`.
    guard: Option<crate::LockGuard>,
    runtime: Arc<Runtime>,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::LockGuard")
            .field(self.inner())
            .finish()
    }
}

impl LockGuard {
    fn inner(&self) -> &crate::LockGuard {
        self.guard.as_ref().expect("present until release or drop")
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        self.inner().name()
    }

    /// This acquisition's random owner token.
    pub fn token(&self) -> OwnerToken {
        self.inner().token()
    }

    /// The fencing token (see [`crate::LockGuard::fencing_token`]).
    pub fn fencing_token(&self) -> Option<u64> {
        self.inner().fencing_token()
    }

    /// Until when the lease is surely this holder's (see [`crate::LockGuard::valid_until`]).
    pub fn valid_until(&self) -> Instant {
        self.inner().valid_until()
    }

    /// Whether the lease is still within its validity and not known lost: check it before each
    /// step that needs the lock.
    pub fn is_valid(&self) -> bool {
        self.inner().is_valid()
    }

    /// The lost signal (its `is_lost`, `reason` and `at_risk` answer at once; its async
    /// methods can be awaited on the locker's runtime with [`Locker::block_on`]).
    pub fn lost(&self) -> LostSignal {
        self.inner().lost()
    }

    /// Extends the lease to `ttl` from now, as [`crate::LockGuard::extend`].
    ///
    /// # Errors
    /// As [`crate::LockGuard::extend`].
    ///
    /// # Panics
    /// Inside an async runtime.
    pub fn extend(&self, ttl: Duration) -> Result<()> {
        self.runtime.block_on(self.inner().extend(ttl))
    }

    /// Releases the lock and reports how it went, as [`crate::LockGuard::release`].
    ///
    /// # Errors
    /// As [`crate::LockGuard::release`].
    ///
    /// # Panics
    /// Inside an async runtime.
    pub fn release(mut self) -> Result<()> {
        let guard = self.guard.take().expect("present until release or drop");
        self.runtime.block_on(guard.release())
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // The async guard hands its release to the locker's runtime; `runtime` (dropped after
        // this) keeps that runtime alive until the release is done.
        drop(self.guard.take());
    }
}

/// Every lock of a blocking [`Locker::lock_all`] or [`Locker::try_lock_all`], held together;
/// released when dropped (in the background, as a [`LockGuard`] is).
#[must_use = "dropping a MultiGuard releases every lock at once"]
pub struct MultiGuard {
    /// Always `Some` until `release` or drop; dropped before `runtime`.
    set: Option<crate::MultiGuard>,
    runtime: Arc<Runtime>,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::MultiGuard")
            .field(self.inner())
            .finish()
    }
}

impl MultiGuard {
    fn inner(&self) -> &crate::MultiGuard {
        self.set.as_ref().expect("present until release or drop")
    }

    /// The names, in canonical order.
    pub fn names(&self) -> Vec<&LockName> {
        self.inner().names()
    }

    /// Each lock's fencing token, in canonical order (`None` where the backend gives none).
    pub fn fencing_tokens(&self) -> Vec<Option<u64>> {
        self.inner().fencing_tokens()
    }

    /// Until when every lock is surely held: the earliest validity deadline.
    pub fn valid_until(&self) -> Instant {
        self.inner().valid_until()
    }

    /// Whether every lock is still valid and none is known lost: check it before each step
    /// that needs the locks.
    pub fn is_valid(&self) -> bool {
        self.inner().is_valid()
    }

    /// The first lock known lost and why, or `None` while none is.
    pub fn lost(&self) -> Option<(LockName, LostReason)> {
        self.inner().guards().iter().find_map(|g| {
            let lost = g.lost();
            lost.reason().map(|why| (g.name().clone(), why))
        })
    }

    /// Releases every lock, as [`crate::MultiGuard::release`].
    ///
    /// # Errors
    /// As [`crate::MultiGuard::release`].
    ///
    /// # Panics
    /// Inside an async runtime.
    pub fn release(mut self) -> Result<()> {
        let set = self.set.take().expect("present until release or drop");
        self.runtime.block_on(set.release())
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        // As LockGuard's drop: the releases run on the runtime `runtime` keeps alive.
        drop(self.set.take());
    }
}

/// This client's leadership of a name, from a blocking [`Locker::campaign`]. Dropped without
/// [`Leadership::resign`], it resigns in the background.
#[must_use = "dropping a Leadership resigns at once"]
pub struct Leadership {
    /// Always `Some` until `resign` or drop; dropped before `runtime`.
    leadership: Option<crate::Leadership>,
    runtime: Arc<Runtime>,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::Leadership")
            .field(self.inner())
            .finish()
    }
}

impl Leadership {
    fn inner(&self) -> &crate::Leadership {
        self.leadership
            .as_ref()
            .expect("present until resign or drop")
    }

    /// The term (see [`crate::Leadership::term`]).
    pub fn term(&self) -> Option<u64> {
        self.inner().term()
    }

    /// The value this leader campaigned with.
    pub fn value(&self) -> &str {
        self.inner().value()
    }

    /// The lost signal: its `is_lost` answers at once; stop acting as leader once it says so.
    pub fn lost(&self) -> LostSignal {
        self.inner().lost()
    }

    /// Whether this client is surely still the leader: check it before each step that needs
    /// the leadership.
    pub fn is_leader(&self) -> bool {
        self.inner().is_leader()
    }

    /// Steps down, as [`crate::Leadership::resign`].
    ///
    /// # Errors
    /// As [`crate::Leadership::resign`].
    ///
    /// # Panics
    /// Inside an async runtime.
    pub fn resign(mut self) -> Result<()> {
        let leadership = self
            .leadership
            .take()
            .expect("present until resign or drop");
        self.runtime.block_on(leadership.resign())
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        // As LockGuard's drop: the resignation runs on the runtime `runtime` keeps alive.
        drop(self.leadership.take());
    }
}
