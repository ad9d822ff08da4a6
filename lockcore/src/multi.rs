//! Multi-locks: several names taken all or nothing, in one canonical order, with one deadline,
//! one lost signal and one release. A sequence of the backend's own acquisitions, so it works
//! on every backend and keeps each lock's qualities (TTL, renewal, fencing).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use tokio::time::Instant;

use crate::{
    Error, ErrorKind, IntoLockName, LockGuard, LockName, LockOptions, Locker, LostReason, Result,
};

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

    /// Releases every lock (in reverse order) and reports the first failure; every release is
    /// attempted whatever the others do.
    ///
    /// Cancel safety: the locks not yet released are released in the background.
    ///
    /// # Errors
    /// As [`LockGuard::release`], for the first lock whose release failed.
    pub async fn release(mut self) -> Result<()> {
        let mut first_err = None;
        while let Some(g) = self.guards.pop() {
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
    /// Takes every lock of `names` or none: one at a time in canonical (byte) order of the
    /// names, so that two clients taking overlapping sets never deadlock, all within the one
    /// wait deadline of `options` (each lock with the options' TTL, renewal and mode). If one
    /// cannot be taken in time, or fails, the ones already taken are released before this
    /// returns.
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
        let mut guards = Vec::with_capacity(names.len());
        for name in &names {
            let opts = match deadline {
                None => options.clone(),
                Some(d) => options
                    .clone()
                    .wait_timeout(d.saturating_duration_since(Instant::now())),
            };
            match self.lock(name.clone(), &opts).await {
                Ok(g) => guards.push(g),
                Err(e) => {
                    release_all(guards).await;
                    return Err(if e.kind() == ErrorKind::Timeout {
                        Error::timeout(format!(
                            "the set of {} locks was not complete within {:?} ({:?} was busy)",
                            names.len(),
                            options.wait_value().unwrap_or_default(),
                            name.as_str()
                        ))
                    } else {
                        e
                    });
                }
            }
        }
        Ok(MultiGuard { guards })
    }

    /// One attempt at every lock of `names`, in canonical order: `Ok(None)` (with every lock
    /// taken meanwhile released) as soon as one is held by someone else.
    ///
    /// Cancel safety: as [`Locker::lock_all`].
    ///
    /// # Errors
    /// As [`Locker::lock_all`], without `Timeout`.
    pub async fn try_lock_all<N: IntoLockName>(
        &self,
        names: impl IntoIterator<Item = N>,
        options: &LockOptions,
    ) -> Result<Option<MultiGuard>> {
        let names = canonical(names)?;
        options.validate(self.capabilities())?;
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

/// Releases a partial set, newest first; failures are logged (each lock frees at its TTL).
async fn release_all(mut guards: Vec<LockGuard>) {
    while let Some(g) = guards.pop() {
        let name = g.name().clone();
        if let Err(e) = g.release().await {
            tracing::debug!(lock = name.as_str(), error = %e, "releasing a partial multi-lock failed; it frees at its TTL");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
