//! The steady window of `locksmith bench`'s waiters run (the one that counts requests per
//! hand-over): what a hand-over costs once every waiter is in place, apart from what each
//! waiter pays once to get in place and to leave.
//!
//! Start-up and tear-down are real requests, but they are paid once per wait, not per
//! hand-over: each waiter's first attempt (and its subscriptions, queue entry, watches) when
//! it starts waiting, and leaving the queue and unsubscribing when the run cuts its wait off.
//! Counted inside a run of a few seconds they would show as a per-hand-over cost that shrinks
//! the longer the run. So the run is counted in three parts, from samples of the counters taken
//! by the parent process:
//!
//! - `start`: after every worker connected, before `go`;
//! - `from`: once every waiter has been seen waiting (each worker prints [`QUEUED`] once every
//!   one of its clients' `lock()` calls was marked waiting by its backend, see
//!   [`locksmith::Locker::waiting`]: its first attempt was answered "held" and it is
//!   subscribed, queued or watching, ready to be woken);
//! - `to`: `--secs` later, just before the parent tells the workers to [`STOP`] (their waits are
//!   cut off after it: tear-down starts after this sample);
//! - `end`: once every worker exited (its clients flushed and closed).
//!
//! The steady figures are the growth from `from` to `to` over the acquisitions stamped between
//! them; the one-off cost is what the whole run (`start` to `end`) counted beyond the steady
//! rate times all its acquisitions, per waiter.

use std::future::Future;
use std::time::Duration;

use conformance::RequestCount;
use locksmith::{LockName, Locker};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::handover_latency::{self, Stamp};

/// What each waiter of the requests run paid once, beyond the steady window's rate per
/// hand-over: its start-up (first attempt, subscriptions, queue entry) and tear-down (leaving
/// the queue, unsubscribing), in requests per waiter.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OncePerWaiter {
    /// What the waiting clients sent (counted by the proxies), where counted.
    pub sent: Option<f64>,
    /// What the server counted, where it has a counter.
    pub server: Option<f64>,
}

/// The line a worker prints once every one of its clients has been seen waiting.
pub(crate) const QUEUED: &str = "queued";
/// The line that tells a worker to stop contending.
pub(crate) const STOP: &str = "stop";

/// When a worker's loops stop: at its deadline, or when [`STOP`] comes on its stdin.
#[derive(Clone)]
pub(crate) struct Stop(watch::Receiver<bool>);

impl Stop {
    /// Stops at `deadline`, or earlier at a [`STOP`] line of `stdin` when given (the rest of
    /// `stdin` is read and ignored).
    pub(crate) fn new<R>(deadline: tokio::time::Instant, stdin: Option<BufReader<R>>) -> Stop
    where
        R: AsyncRead + Unpin + Send + 'static,
    {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            let told = async {
                let Some(stdin) = stdin else {
                    return std::future::pending().await;
                };
                let mut lines = stdin.lines();
                // The parent's pipe closed (it died) stops the run too.
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.trim() == STOP {
                        return;
                    }
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                () = told => {}
            }
            let _ = tx.send(true);
        });
        Stop(rx)
    }

    /// Whether the run has stopped.
    pub(crate) fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// `fut`'s output, or `None` if the run stops first (`fut` is then dropped).
    pub(crate) async fn until<F: Future>(&self, fut: F) -> Option<F::Output> {
        let mut rx = self.0.clone();
        tokio::select! {
            biased;
            _ = rx.wait_for(|stopped| *stopped) => None,
            out = fut => Some(out),
        }
    }
}

/// Prints [`QUEUED`] once each of `lockers` has been seen with a `lock()` call on `name`
/// waiting, looking every millisecond (a wait lasts about as long as the other waiters' turns,
/// many milliseconds with many waiters); gives up silently when the run stops first. Aborted
/// when the handle is dropped.
pub(crate) fn report_queued(lockers: Vec<Locker>, name: LockName, stop: Stop) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let mut seen = vec![false; lockers.len()];
        let watch = async {
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            while seen.iter().any(|s| !s) {
                tick.tick().await;
                for (s, l) in seen.iter_mut().zip(&lockers) {
                    *s = *s || l.waiting(&name).is_ok_and(|n| n > 0);
                }
            }
        };
        if stop.until(watch).await.is_some() {
            println!("{QUEUED}");
        }
    }))
}

/// A task aborted when this value is dropped.
pub(crate) struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The counters at one moment: the system clock (the one the workers stamp on), what the
/// waiting clients sent so far (where proxies count it), the server's request counter.
pub(crate) struct Sample {
    pub(crate) at_ns: u64,
    pub(crate) sent: Option<u64>,
    pub(crate) server: locksmith::Result<u64>,
}

impl Sample {
    /// Reads the counters now.
    pub(crate) async fn take(server: &Locker, clients: Option<&RequestCount>) -> Sample {
        let at_ns = handover_latency::now_ns();
        let sent = clients.map(RequestCount::get);
        let server = server.backend().server_requests().await;
        Sample {
            at_ns,
            sent,
            server,
        }
    }
}

/// The samples of one waiters run; `from` and `to` are `None` when not every waiter was seen
/// waiting in time (no steady window).
pub(crate) struct Samples {
    pub(crate) start: Sample,
    pub(crate) steady: Option<(Sample, Sample)>,
    pub(crate) end: Sample,
}

/// What one counter (the clients' or the server's) gave over a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Counted {
    /// Growth over the steady window.
    pub(crate) steady: u64,
    /// Growth over the steady window per hand-over in it.
    pub(crate) per_handover: f64,
    /// What the whole run counted beyond `per_handover` times its acquisitions, per waiter:
    /// start-up and tear-down, paid once per wait.
    pub(crate) once_per_waiter: f64,
}

/// The acquisitions stamped in `(from_ns, to_ns]`, every process's stamps together.
pub(crate) fn acquisitions_within(stamps: &[Vec<Stamp>], from_ns: u64, to_ns: u64) -> u64 {
    stamps
        .iter()
        .flatten()
        .filter(|s| matches!(s, Stamp::Acquired(t) if from_ns < *t && *t <= to_ns))
        .count() as u64
}

/// One counter's figures from its readings at `start`, `from`, `to`, `end`, the acquisitions
/// in the window and in the whole run, and the number of waiters. `None` when the window saw
/// no acquisition.
pub(crate) fn counted(
    [start, from, to, end]: [u64; 4],
    window_handovers: u64,
    all_handovers: u64,
    waiters: usize,
) -> Option<Counted> {
    if window_handovers == 0 {
        return None;
    }
    let steady = to.saturating_sub(from);
    let per_handover = steady as f64 / window_handovers as f64;
    let all = end.saturating_sub(start) as f64;
    Some(Counted {
        steady,
        per_handover,
        once_per_waiter: (all - per_handover * all_handovers as f64) / waiters.max(1) as f64,
    })
}

impl Samples {
    /// The steady window's bounds on the system clock.
    pub(crate) fn window_ns(&self) -> Option<(u64, u64)> {
        self.steady.as_ref().map(|(f, t)| (f.at_ns, t.at_ns))
    }

    /// The readings of the clients' count, where counted.
    pub(crate) fn sent(&self) -> Option<[u64; 4]> {
        let (from, to) = self.steady.as_ref()?;
        Some([self.start.sent?, from.sent?, to.sent?, self.end.sent?])
    }

    /// The readings of the server's counter: `Err` with the first failure.
    pub(crate) fn server(&self) -> Option<Result<[u64; 4], &locksmith::Error>> {
        let (from, to) = self.steady.as_ref()?;
        let all = [&self.start, from, to, &self.end].map(|s| s.server.as_ref().copied());
        Some(match all.iter().find_map(|r| r.err()) {
            Some(e) => Err(e),
            None => Ok(all.map(|r| r.unwrap_or(0))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_counts_its_own_acquisitions_and_the_rest_is_once_per_waiter() {
        let stamps = vec![
            vec![Stamp::Acquired(5), Stamp::Released(6), Stamp::Acquired(20)],
            vec![
                Stamp::Acquired(10),
                Stamp::Released(11),
                Stamp::Acquired(30),
            ],
        ];
        // (10, 30]: the acquisitions at 20 and 30; the one at 10 is the window's start.
        assert_eq!(acquisitions_within(&stamps, 10, 30), 2);
        assert_eq!(acquisitions_within(&stamps, 30, 40), 0);
        // 100 requests at start-up, 2 per hand-over over 4 hand-overs in all (8), 40 at
        // tear-down; 2 waiters: 70 each.
        let c = counted([0, 104, 108, 148], 2, 4, 2).expect("hand-overs in the window");
        assert_eq!(c.steady, 4);
        assert_eq!(c.per_handover, 2.0);
        assert_eq!(c.once_per_waiter, 70.0);
        assert_eq!(
            counted([0, 1, 2, 3], 0, 4, 2),
            None,
            "no hand-over in the window"
        );
    }
}
