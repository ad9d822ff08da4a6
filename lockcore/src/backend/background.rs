//! [`Background`]: the counted tasks that must outlive a cancelled call, which
//! [`Locker::flush`](crate::Locker::flush) waits for.

use std::fmt;
use std::sync::Arc;

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
