//! The clean-up of an acquisition cancelled in flight: [`CleanUpIfCancelled`] runs a backend's
//! [`CancelCleanUp`] when the caller's future is dropped, [`ReleaseIfCancelled`] releases the
//! lease such an acquisition may still win.

use std::future::Future;
use std::pin::Pin;

use super::{Background, Lease};

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
pub(super) struct ReleaseLease<L: Lease>(pub(super) L);

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
