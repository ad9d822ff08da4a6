//! A lock client that exits while it waits, as a process does: for the interop tests where a
//! real peer (Curator, `etcdctl lock`) must find nothing left ahead of it.

use std::future::Future;
use std::time::Duration;

use lockcore::{ErrorKind, LockOptions, Locker};

/// A waiter on `name` in a client of its own (made by `connect`) on a runtime of its own, on
/// its own thread: it queues behind the holder and stops waiting at `wait` (its wait timeout,
/// which must end the call with `Timeout`, or with `dropped` its `lock()` future dropped then),
/// calls [`Locker::shutdown`] (10 s, scaled) and drops its runtime, as a process exits. The
/// handle's `join` fails when any step did, or when the whole had not ended 40 s (scaled)
/// after its wait.
pub fn exiting_waiter<F, Fut>(
    connect: F,
    name: String,
    options: LockOptions,
    wait: Duration,
    dropped: bool,
) -> std::thread::JoinHandle<()>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = lockcore::Result<Locker>>,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        // Bounded as a whole (connect, wait, shutdown, with slack), so that the thread ends and
        // a test joining it (often from a blocking task, which its runtime's drop waits for)
        // is not held up forever by a call that never returns.
        let within = Duration::from_secs(10).mul_f64(crate::time_scale());
        let bound = wait + within * 4;
        let run = async {
            let locker = connect().await.expect("connect");
            if dropped {
                assert!(
                    tokio::time::timeout(wait, locker.lock(name.as_str(), &options))
                        .await
                        .is_err(),
                    "the waiter took a held lock"
                );
            } else {
                let err = locker
                    .lock(name.as_str(), &options.clone().wait_timeout(wait))
                    .await
                    .expect_err("the waiter took a held lock");
                assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
            }
            locker.shutdown(within).await.expect("Locker::shutdown");
        };
        rt.block_on(async {
            tokio::time::timeout(bound, run)
                .await
                .unwrap_or_else(|_| panic!("the exiting waiter had not ended after {bound:?}"));
        });
        rt.shutdown_timeout(Duration::from_secs(1));
    })
}
