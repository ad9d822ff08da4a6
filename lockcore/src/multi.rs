//! Multi-locks: several names taken all or nothing, in one canonical order, with one deadline,
//! one lost signal and one release. Each member is an ordinary lock with its qualities (TTL,
//! renewal by the one watchdog, lost signal, fencing token).
//!
//! Two ways to take a set:
//!
//! * Atomic, on a backend that declares [`Capabilities::atomic_multi`](crate::Capabilities::atomic_multi)
//!   (exclusive sets only): every member in one request ([`Backend::try_acquire_all`], one
//!   transaction), so that no other client sees part of a set taken. A waiting
//!   [`Locker::lock_all`] whose attempt lost waits for the member found busy with that
//!   member's own wait (the backend's notification or poll, never a spin), keeps it, and
//!   tries the rest in one request again; losing that, it lets the member go and waits for the
//!   next busy one. It never waits while holding a member, so overlapping sets cannot deadlock.
//!   After [`ORDERED_AFTER_LOSSES`] lost attempts (members busy at every try, as under steady
//!   traffic on them) it takes the members one at a time in canonical order instead, as below:
//!   the progress bound (`progress`).
//! * A sequence of the backend's own acquisitions in canonical order elsewhere, which works on
//!   every backend; a set that cannot be completed is released before the call returns.
//!
//! [`Backend::try_acquire_all`]: crate::backend::Backend::try_acquire_all

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use tokio::time::Instant;

use crate::locker::{PendingGuard, RETRY_BACKOFF, SetTry};

mod progress;
use crate::{
    Error, ErrorKind, IntoLockName, LockGuard, LockMode, LockName, LockOptions, Locker, LostReason,
    Result,
};
pub use progress::ORDERED_AFTER_LOSSES;

/// Every lock of a [`Locker::lock_all`] or [`Locker::try_lock_all`], held together.
///
/// Dropped without [`MultiGuard::release`], every lock is released in the background (as a
/// dropped [`LockGuard`] is).
#[must_use = "dropping a MultiGuard releases every lock at once"]
#[derive(Debug)]
pub struct MultiGuard {
    /// In canonical (byte) order of the names.
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The guards, in canonical order of their names.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The names, in canonical order.
    pub fn names(&self) -> Vec<&LockName> {
        self.guards.iter().map(LockGuard::name).collect()
    }

    /// Each lock's fencing token, in canonical order (`None` where the backend gives none).
    pub fn fencing_tokens(&self) -> Vec<Option<u64>> {
        self.guards.iter().map(LockGuard::fencing_token).collect()
    }

    /// Until when every lock is surely held: the earliest validity deadline.
    pub fn valid_until(&self) -> Instant {
        self.guards
            .iter()
            .map(LockGuard::valid_until)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// Whether every lock is still valid and none is known lost.
    pub fn is_valid(&self) -> bool {
        self.guards.iter().all(LockGuard::is_valid)
    }

    /// Resolves when any of the locks is lost: which one and why. The work done under the set
    /// must stop there.
    ///
    /// Cancel safe.
    pub async fn lost(&self) -> (LockName, LostReason) {
        let signals: Vec<_> = self.guards.iter().map(|g| (g.name(), g.lost())).collect();
        let mut waits: Vec<Pin<Box<dyn Future<Output = LostReason> + Send + '_>>> = signals
            .iter()
            .map(|(_, s)| Box::pin(s.lost()) as Pin<Box<dyn Future<Output = _> + Send>>)
            .collect();
        std::future::poll_fn(|cx| {
            for (i, wait) in waits.iter_mut().enumerate() {
                if let Poll::Ready(reason) = wait.as_mut().poll(cx) {
                    return Poll::Ready((signals[i].0.clone(), reason));
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Releases every lock, one after the other in canonical order (so the last name is freed
    /// last: a client holding it sees no other member of the set still held), and reports the
    /// first failure; every release is attempted whatever the others do.
    ///
    /// Cancel safety: the locks not yet released are released in the background.
    ///
    /// # Errors
    /// As [`LockGuard::release`], for the first lock whose release failed.
    pub async fn release(self) -> Result<()> {
        let mut first_err = None;
        for g in self.guards {
            if let Err(e) = g.release().await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// The names, validated, deduplicated and in canonical order: every client takes a set in the
/// same order, so two sets that overlap never wait on each other in a circle.
fn canonical<N: IntoLockName>(names: impl IntoIterator<Item = N>) -> Result<Vec<LockName>> {
    let mut all = names
        .into_iter()
        .map(IntoLockName::into_lock_name)
        .collect::<Result<Vec<_>>>()?;
    all.sort_by(|a, b| a.as_str().as_bytes().cmp(b.as_str().as_bytes()));
    all.dedup();
    if all.is_empty() {
        return Err(Error::invalid_name("a multi-lock needs at least one name"));
    }
    Ok(all)
}

impl Locker {
    /// Takes every lock of `names` or none, in canonical (byte) order of the names, so that
    /// two clients taking overlapping sets never deadlock, all within the one wait deadline of
    /// `options` (each lock with the options' TTL, renewal and mode). If one cannot be taken
    /// in time, or fails, the ones already taken are released before this returns.
    ///
    /// On a backend declaring [`Capabilities::atomic_multi`](crate::Capabilities::atomic_multi)
    /// an exclusive set is taken in one request: a lost attempt waits for the member it found busy (that
    /// member's own wait), keeps it and tries the rest in one request, letting it go before
    /// waiting for another. Elsewhere, one lock at a time.
    ///
    /// Progress bound: a set is never starved by traffic on its members. After
    /// [`ORDERED_AFTER_LOSSES`] (3) lost attempts at the whole set, an atomic backend's set too
    /// is taken one member at a time in canonical order, holding each while waiting for the next
    /// with [`Locker::lock`]'s own wait: the set is had once each member's single wait has come
    /// round in turn (on a [fair](crate::Capabilities::fair) backend, once the waiters queued
    /// on it first have had it), as `lock()` on each name one after the other would.
    ///
    /// Cancel safety: dropping the future releases the locks taken so far in the background
    /// (as dropped guards are) and leaves no lock of an acquisition in flight held beyond its
    /// TTL (as [`Locker::lock`]).
    ///
    /// # Errors
    /// `InvalidName` (also for an empty set), `InvalidConfig` or `Unsupported` before any I/O;
    /// `Timeout` when the set was not complete at the deadline; otherwise as [`Locker::lock`].
    pub async fn lock_all<N: IntoLockName>(
        &self,
        names: impl IntoIterator<Item = N>,
        options: &LockOptions,
    ) -> Result<MultiGuard> {
        let names = canonical(names)?;
        options.validate(self.capabilities())?;
        let deadline = options.wait_value().map(|w| Instant::now() + w);
        if self.atomic_sets(options) {
            return self.lock_all_atomic(&names, options, deadline).await;
        }
        self.take_in_order(&names, options, deadline).await
    }

    /// One attempt at every lock of `names`, in canonical order: `Ok(None)` (with every lock
    /// taken meanwhile released) as soon as one is held by someone else. On a backend
    /// declaring [`Capabilities::atomic_multi`](crate::Capabilities::atomic_multi), an
    /// exclusive set is one request that takes every lock or none.
    ///
    /// Bind the guard for as long as the locks are needed (`let _ = ...` releases them at
    /// once). A result left unused is refused where `unused_must_use` is denied:
    ///
    /// ```compile_fail
    /// #![deny(unused_must_use)]
    /// # async fn f(locker: lockcore::Locker) {
    /// locker.try_lock_all(["a", "b"], &lockcore::LockOptions::new()).await;
    /// # }
    /// ```
    ///
    /// ```
    /// #![deny(unused_must_use)]
    /// # async fn f(locker: lockcore::Locker) -> lockcore::Result<()> {
    /// let Some(_both) = locker.try_lock_all(["a", "b"], &lockcore::LockOptions::new()).await? else {
    ///     return Ok(()); // one of them is held by someone else
    /// };
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Cancel safety: as [`Locker::lock_all`].
    ///
    /// # Errors
    /// As [`Locker::lock_all`], without `Timeout`.
    #[must_use = "the lock is released as soon as its guard is dropped: bind the result (`let guard = ...` or `let _guard = ...`, not `let _ = ...`)"]
    pub async fn try_lock_all<N: IntoLockName>(
        &self,
        names: impl IntoIterator<Item = N>,
        options: &LockOptions,
    ) -> Result<Option<MultiGuard>> {
        let names = canonical(names)?;
        options.validate(self.capabilities())?;
        if self.atomic_sets(options) {
            return Ok(self
                .try_lock_set(&names, options)
                .await?
                .ok()
                .map(|guards| MultiGuard { guards }));
        }
        let mut guards = Vec::with_capacity(names.len());
        for name in names {
            match self.try_lock(name, options).await {
                Ok(Some(g)) => guards.push(g),
                other => {
                    release_all(guards).await;
                    return other.map(|_| None);
                }
            }
        }
        Ok(Some(MultiGuard { guards }))
    }
}

impl Locker {
    /// Whether sets taken with `options` go through [`Backend::try_acquire_all`]: the backend
    /// declares it, and the set is exclusive.
    ///
    /// [`Backend::try_acquire_all`]: crate::backend::Backend::try_acquire_all
    fn atomic_sets(&self, options: &LockOptions) -> bool {
        self.capabilities().atomic_multi.is_yes() && options.mode_value() == LockMode::Exclusive
    }

    /// [`Locker::lock_all`] on a backend that takes a set in one request: the whole set in one
    /// attempt; when it loses, wait for the member found busy ([`Locker::lock`]: the backend's
    /// own wait, with its retries of transient errors), then the rest in one attempt while
    /// holding that member. A lost attempt lets the member go before waiting for the next busy
    /// one: nothing is held while waiting, so overlapping sets never deadlock. After
    /// [`ORDERED_AFTER_LOSSES`] lost attempts it takes the members in canonical order instead
    /// (`progress`), which cannot deadlock either. An `Unavailable`
    /// attempt is re-sent as it is (the same owner tokens, with [`Locker::lock`]'s backoff and
    /// give-up), so that a set the server applied but whose reply was lost is this call's own
    /// at once, not a stranger's grant waited out until its TTL.
    async fn lock_all_atomic(
        &self,
        names: &[LockName],
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<MultiGuard> {
        // The member won by waiting, with its index in `names`.
        let mut held: Option<(usize, LockGuard)> = None;
        // The requests of an attempt that failed `Unavailable`, re-sent as they are (the same
        // owner tokens: the server may have applied the first copy, and takes a same-token
        // re-send as its own), with when that run of failures began and how many there were.
        let mut resend: Option<Vec<PendingGuard>> = None;
        let mut failures: Option<(Instant, u32)> = None;
        // Attempts that found a member busy.
        let mut losses = 0u32;
        loop {
            let rest: Vec<LockName> = names
                .iter()
                .enumerate()
                .filter(|(i, _)| held.as_ref().is_none_or(|(h, _)| h != i))
                .map(|(_, n)| n.clone())
                .collect();
            let attempt = match (rest.is_empty(), resend.take()) {
                (true, _) => SetTry::Won(Vec::new()),
                (false, Some(pending)) => self.try_set(pending, options).await,
                (false, None) => match self.set_requests(&rest, options) {
                    Ok(pending) => self.try_set(pending, options).await,
                    Err(e) => SetTry::Failed(e, Vec::new()),
                },
            };
            let busy = match attempt {
                SetTry::Won(mut guards) => {
                    if let Some((i, g)) = held.take() {
                        guards.insert(i, g);
                    }
                    return Ok(MultiGuard { guards });
                }
                SetTry::Busy(i) => &rest[i],
                SetTry::Failed(e, pending)
                    if e.kind() == ErrorKind::Unavailable && !pending.is_empty() =>
                {
                    let now = Instant::now();
                    let (since, n) = *failures.get_or_insert((now, 0));
                    if deadline.is_some_and(|d| now >= d)
                        || now.duration_since(since) >= options.retry_unavailable_value()
                    {
                        release_all(held.into_iter().map(|(_, g)| g).collect()).await;
                        return Err(e);
                    }
                    let mut wake = now + RETRY_BACKOFF.delay(n);
                    if let Some(d) = deadline {
                        wake = wake.min(d);
                    }
                    tokio::time::sleep_until(wake).await;
                    failures = Some((since, n.saturating_add(1)));
                    resend = Some(pending);
                    continue;
                }
                SetTry::Failed(e, _) => {
                    release_all(held.into_iter().map(|(_, g)| g).collect()).await;
                    return Err(e);
                }
            };
            failures = None;
            losses += 1;
            if losses >= ORDERED_AFTER_LOSSES {
                // Under steady traffic on the members the set may never be free whole at
                // one instant: take it one member at a time (`progress`).
                release_all(held.take().into_iter().map(|(_, g)| g).collect()).await;
                return self.take_in_order(names, options, deadline).await;
            }
            let at = names
                .iter()
                .position(|n| n == busy)
                .expect("a member of the set");
            release_all(held.take().into_iter().map(|(_, g)| g).collect()).await;
            let opts = waiting_until(options, deadline);
            match self.lock(busy.clone(), &opts).await {
                Ok(g) => held = Some((at, g)),
                Err(e) => return Err(set_timeout(e, names, busy, options)),
            }
        }
    }
}

/// A member's `Timeout` as the set's; other errors as they are.
fn set_timeout(e: Error, names: &[LockName], busy: &LockName, options: &LockOptions) -> Error {
    if e.kind() == ErrorKind::Timeout {
        Error::timeout(format!(
            "the set of {} locks was not complete within {:?} ({:?} was busy)",
            names.len(),
            options.wait_value().unwrap_or_default(),
            busy.as_str()
        ))
    } else {
        e
    }
}

/// `options` waiting only for what is left until the set's `deadline` (as they are without one).
fn waiting_until(options: &LockOptions, deadline: Option<Instant>) -> LockOptions {
    match deadline {
        None => options.clone(),
        Some(d) => options
            .clone()
            .wait_timeout(d.saturating_duration_since(Instant::now())),
    }
}

/// Releases a partial set in canonical order; failures are logged (each lock frees at its TTL).
async fn release_all(guards: Vec<LockGuard>) {
    for g in guards {
        let name = g.name().clone();
        if let Err(e) = g.release().await {
            tracing::debug!(lock = name.as_str(), error = %e, "releasing a partial multi-lock failed; it frees at its TTL");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::memory::MemoryBackend;

    fn store() -> String {
        format!("multi-{:016x}", fastrand::u64(..))
    }

    /// The memory backend declares sets atomic: a set of four is one request, taken whole or
    /// not at all.
    #[tokio::test]
    async fn an_atomic_set_is_one_request() {
        let store = store();
        let backend = MemoryBackend::connect(&store);
        let locker = Locker::new(backend.clone());
        let other = Locker::new(MemoryBackend::connect(&store));
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let before = backend.requests();
        let set = locker
            .try_lock_all(["a", "b", "c", "d"], &opts)
            .await
            .unwrap()
            .expect("free");
        assert_eq!(backend.requests() - before, 1, "one request for the set");
        assert_eq!(set.guards().len(), 4);
        let tokens = set.fencing_tokens();
        assert!(tokens.iter().all(Option::is_some), "{tokens:?}");
        set.release().await.unwrap();

        let busy = other.try_lock("c", &opts).await.unwrap().expect("free");
        let before = backend.requests();
        assert!(
            locker
                .try_lock_all(["a", "b", "c", "d"], &opts)
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(backend.requests() - before, 1, "one request, lost");
        for free in ["a", "b", "d"] {
            let g = other.try_lock(free, &opts).await.unwrap();
            assert!(g.is_some(), "{free} was left held by a lost set");
            g.unwrap().release().await.unwrap();
        }
        busy.release().await.unwrap();
    }

    /// A waiting lock_all on an atomic backend holds no member while it waits for a busy one,
    /// and takes the set once that member is released.
    #[tokio::test]
    async fn a_waiting_atomic_set_holds_nothing_while_it_waits() {
        let store = store();
        let locker = Locker::new(MemoryBackend::connect(&store));
        let other = Locker::new(MemoryBackend::connect(&store));
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let busy = other.try_lock("y", &opts).await.unwrap().expect("free");
        let waiter = {
            let (locker, opts) = (locker.clone(), opts.clone());
            tokio::spawn(async move { locker.lock_all(["x", "y", "z"], &opts).await })
        };
        while locker.waiting("y").unwrap() == 0 {
            tokio::task::yield_now().await;
        }
        for free in ["x", "z"] {
            let g = other.try_lock(free, &opts).await.unwrap();
            assert!(g.is_some(), "{free} was held while the set waited");
            g.unwrap().release().await.unwrap();
        }
        busy.release().await.unwrap();
        let set = waiter.await.unwrap().unwrap();
        let names: Vec<_> = set.names().iter().map(|n| n.as_str()).collect();
        assert_eq!(names, ["x", "y", "z"]);
        set.release().await.unwrap();
    }

    /// Shared sets are not atomic (the hook takes exclusive sets): a sequence, still whole.
    #[tokio::test]
    async fn a_shared_set_is_a_sequence() {
        let backend = MemoryBackend::connect(&store());
        let locker = Locker::new(backend.clone());
        let opts = LockOptions::new().mode(crate::LockMode::Shared);
        let before = backend.requests();
        let set = locker
            .try_lock_all(["a", "b", "c"], &opts)
            .await
            .unwrap()
            .expect("free");
        assert_eq!(backend.requests() - before, 3);
        set.release().await.unwrap();
    }

    #[test]
    fn names_are_ordered_deduplicated_and_never_empty() {
        let names = canonical(["b", "a", "b", "C"]).unwrap();
        let names: Vec<_> = names.iter().map(LockName::as_str).collect();
        assert_eq!(names, ["C", "a", "b"]);
        assert_eq!(
            canonical(Vec::<&str>::new()).unwrap_err().kind(),
            ErrorKind::InvalidName
        );
        assert_eq!(
            canonical(["ok", ""]).unwrap_err().kind(),
            ErrorKind::InvalidName
        );
    }
}
