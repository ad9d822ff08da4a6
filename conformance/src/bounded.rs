//! Work on a thread and a runtime of its own, waited for with a bound: a scenario that hangs
//! where no timer can end it (a blocking call on a runtime thread, a `Drop` that blocks, a
//! blocking task that never returns, which a runtime's drop waits for) fails, named, instead of
//! holding up the whole test binary (and CI) until something kills it.

use std::future::Future;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long finished work's runtime may take to stop its blocking tasks.
pub(crate) const SHUTDOWN: Duration = Duration::from_secs(10);

/// A multi-threaded runtime with two workers, as a small service has.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// How bounded work ended, when it did not simply return.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hung {
    /// The thread did not come back within the bound (it is left behind: the process ends it).
    Thread(Duration),
    /// The work returned, but a blocking task it started still ran `shutdown` later.
    BlockingTask(Duration),
    /// The thread could not be started.
    NoThread(String),
}

impl std::fmt::Display for Hung {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hung::Thread(bound) => write!(
                f,
                "hung for {bound:?} where its own timeout could not end it (a blocking call on \
                 a runtime thread, a Drop that blocks, or a panic in its thread)"
            ),
            Hung::BlockingTask(after) => write!(
                f,
                "a blocking task it started was still running {after:?} after it ended: \
                 something it called never returns"
            ),
            Hung::NoThread(e) => write!(f, "could not start a thread for it: {e}"),
        }
    }
}

/// Runs `work` on a new thread named `name`, on a runtime of its own, and waits at most `bound`
/// for it; then gives the runtime `shutdown` to stop its blocking tasks. `Ok` with the work's
/// output when both ended in time; `Err` with the output, when there is one, otherwise.
pub(crate) fn on_own_thread<T, F, Fut>(
    name: String,
    bound: Duration,
    shutdown: Duration,
    work: F,
) -> Result<T, (Hung, Option<T>)>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
{
    let (done, result) = mpsc::channel();
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let rt = runtime();
        let output = rt.block_on(work());
        let stopping = Instant::now();
        rt.shutdown_timeout(shutdown);
        let lingered = stopping.elapsed() >= shutdown;
        // The receiver may have given up on us; nothing to do then.
        let _ = done.send((output, lingered));
    });
    if let Err(e) = spawned {
        return Err((Hung::NoThread(e.to_string()), None));
    }
    match result.recv_timeout(bound) {
        Ok((output, false)) => Ok(output),
        Ok((output, true)) => Err((Hung::BlockingTask(shutdown), Some(output))),
        Err(_) => Err((Hung::Thread(bound), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_blocking_every_runtime_thread_is_given_up_at_the_bound() {
        // Both workers blocked: no timer of the runtime can fire, only the thread's bound.
        let start = Instant::now();
        let r = on_own_thread(
            "blocks".into(),
            Duration::from_millis(300),
            SHUTDOWN,
            || async {
                let other = tokio::spawn(async { std::thread::sleep(Duration::from_secs(3)) });
                std::thread::sleep(Duration::from_secs(3));
                let _ = other.await;
            },
        );
        assert_eq!(r, Err((Hung::Thread(Duration::from_millis(300)), None)));
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "waited for the blocked work"
        );
    }

    #[test]
    fn a_blocking_task_left_running_is_reported() {
        let r = on_own_thread(
            "leaves".into(),
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                drop(tokio::task::spawn_blocking(|| {
                    std::thread::sleep(Duration::from_secs(3))
                }));
                7
            },
        );
        assert_eq!(
            r,
            Err((Hung::BlockingTask(Duration::from_millis(200)), Some(7)))
        );
    }

    #[test]
    fn work_that_ends_returns_its_output() {
        let r = on_own_thread("ends".into(), Duration::from_secs(60), SHUTDOWN, || async {
            tokio::task::spawn_blocking(|| 5).await.unwrap()
        });
        assert_eq!(r, Ok(5));
    }
}
