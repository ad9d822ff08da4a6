//! [`Liveness`]: whether the runtime a [`Locker`](crate::Locker) was made on still runs. Its
//! connections' tasks, the watchdog that renews its leases and its background releases run
//! there; once that runtime has shut down, a call from another runtime would get a broken
//! connection, a guard that is never renewed, or a wait that never ends (issue 35). The
//! locker refuses at once instead, with [`ErrorKind::RuntimeGone`].

use std::sync::{Arc, Weak};

use tokio::runtime::Handle;

use crate::{Error, ErrorKind, Result};

pub(super) struct Liveness(Weak<()>);

impl Liveness {
    /// Watches the runtime of `runtime`: a task that never ends holds what this watches, and a
    /// runtime that shuts down drops its tasks (one spawned after the shutdown is dropped at
    /// once).
    pub(super) fn on(runtime: &Handle) -> Self {
        let alive = Arc::new(());
        let watched = Arc::downgrade(&alive);
        drop(runtime.spawn(async move {
            let _alive = alive;
            std::future::pending::<()>().await
        }));
        Liveness(watched)
    }

    /// `RuntimeGone` once the runtime has shut down.
    pub(super) fn check(&self) -> Result<()> {
        if self.0.strong_count() > 0 {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::RuntimeGone,
            "the tokio runtime this Locker was made on has shut down (its connections, renewals \
             and background releases ran there); make a Locker on the runtime that uses it, \
             not a static one shared across runtimes",
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::memory::MemoryBackend;
    use crate::{ErrorKind, LockOptions, Locker};

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_locker_outliving_its_runtime_refuses_at_once() {
        let first = current_thread();
        let locker = first.block_on(async { Locker::new(MemoryBackend::connect("liveness")) });
        first.block_on(async {
            let g = locker.try_lock("n", &LockOptions::new()).await.unwrap();
            g.unwrap().release().await.unwrap();
        });
        drop(first);
        current_thread().block_on(async {
            let refused = locker.try_lock("n", &LockOptions::new()).await;
            assert_eq!(
                refused.err().map(|e| e.kind()),
                Some(ErrorKind::RuntimeGone)
            );
        });
    }
}
