//! Tracing spans and metrics of every [`Locker`](crate::Locker), whatever the backend.
//!
//! # Spans (the [`tracing`] crate)
//!
//! | span | when | fields |
//! |---|---|---|
//! | `lock.acquire` | each `try_lock` / `lock` | `lock` (name), `backend` (URL scheme), `mode` (`try` or `wait`), `outcome` (`acquired`, `busy`, `timeout`, `error`), `waited_ms` |
//! | `lock.wait` | inside `lock.acquire` of `lock()`: the backend's wait | `lock`, `backend` |
//! | `lock.release` | an explicit release and a dropped guard's background release | `lock`, `backend`, `outcome` (`released`, `not_held`, `error`), `held_ms` |
//! | `lock.renew` | each extend, automatic or by [`LockGuard::extend`](crate::LockGuard::extend) | `lock`, `backend`, `auto`, `outcome` (`renewed`, `refused`, `error`) |
//! | `lock.lost` | once, when the lease is known lost | `lock`, `backend`, `reason` (`renewal_refused`, `validity_expired`, `max_hold_reached`, `session_expired`, `connection_lost`), `held_ms`; a `WARN` event inside |
//!
//! # Metrics (the [`metrics`] facade)
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | `locksmith_acquire_seconds` | histogram | `backend`, `mode`, `outcome` | time from the call to its result |
//! | `locksmith_wait_seconds` | histogram | `backend` | for `lock()` calls that acquired: time from the call to the grant |
//! | `locksmith_handovers_total` | counter | `backend` | `lock()` acquisitions that waited for a holder: the winning request was sent 1 ms or more after the call began (retrying and notified backends; where a server queue grants the first request, as row-lock, ZooKeeper and etcd may, read the wait histogram instead) |
//! | `locksmith_renewals_total` | counter | `backend`, `outcome` | extends, as in `lock.renew` |
//! | `locksmith_lost_total` | counter | `backend`, `reason` | leases known lost |
//! | `locksmith_leases_held` | gauge | `backend` | guards alive (acquired, not yet released or dropped) |
//!
//! Handles are registered when the [`Locker`](crate::Locker) is made: install the recorder
//! before creating lockers. With no recorder and no subscriber installed, the cost is a few
//! relaxed atomic loads and one small allocation per acquisition (the lost-signal hook): nothing
//! next to a network round trip.

use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};

use crate::LostReason;

/// The handles and labels of one locker.
pub(crate) struct Telemetry {
    /// The backend's URL scheme (`redis`, `postgres`, ...).
    pub(crate) backend: Arc<str>,
    acquire: [[Histogram; 4]; 2],
    wait: Histogram,
    handovers: Counter,
    /// `locksmith_renewals_total` by outcome ([`RENEW_OUTCOMES`]): registered once, as a
    /// counter registered per renewal built its key (a label list) each time (issue 24).
    renewals: [Counter; 3],
    pub(crate) held: Gauge,
}

/// The outcomes of `locksmith_renewals_total`, in the order of [`Telemetry::renewals`].
const RENEW_OUTCOMES: [&str; 3] = ["renewed", "refused", "error"];

/// How an acquisition ended.
#[derive(Clone, Copy)]
pub(crate) enum Outcome {
    Acquired = 0,
    Busy = 1,
    Timeout = 2,
    Error = 3,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        ["acquired", "busy", "timeout", "error"][self as usize]
    }
}

const MODES: [&str; 2] = ["try", "wait"];

impl Telemetry {
    pub(crate) fn new(describe: &str) -> Telemetry {
        let backend: Arc<str> = Arc::from(
            describe
                .split_once("://")
                .map_or(describe, |(scheme, _)| scheme),
        );
        let b = || metrics::SharedString::from(backend.clone());
        let acquire = MODES.map(|mode| {
            [
                Outcome::Acquired,
                Outcome::Busy,
                Outcome::Timeout,
                Outcome::Error,
            ]
            .map(|o| {
                metrics::histogram!("locksmith_acquire_seconds", "backend" => b(), "mode" => mode, "outcome" => o.as_str())
            })
        });
        Telemetry {
            acquire,
            wait: metrics::histogram!("locksmith_wait_seconds", "backend" => b()),
            handovers: metrics::counter!("locksmith_handovers_total", "backend" => b()),
            renewals: RENEW_OUTCOMES.map(|outcome| {
                metrics::counter!("locksmith_renewals_total", "backend" => b(), "outcome" => outcome)
            }),
            held: metrics::gauge!("locksmith_leases_held", "backend" => b()),
            backend,
        }
    }

    /// Records an acquisition's end.
    pub(crate) fn acquired(&self, wait: bool, outcome: Outcome, took: Duration) {
        self.acquire[usize::from(wait)][outcome as usize].record(took.as_secs_f64());
    }

    /// Records a `lock()` that got the lock after `waited`; `handed_over` when it waited for a
    /// holder.
    pub(crate) fn waited(&self, waited: Duration, handed_over: bool) {
        self.wait.record(waited.as_secs_f64());
        if handed_over {
            self.handovers.increment(1);
        }
    }

    /// Records an extend's outcome.
    pub(crate) fn renewed(&self, outcome: &'static str) {
        match RENEW_OUTCOMES.iter().position(|o| *o == outcome) {
            Some(i) => self.renewals[i].increment(1),
            None => metrics::counter!("locksmith_renewals_total", "backend" => metrics::SharedString::from(self.backend.clone()), "outcome" => outcome)
                .increment(1),
        }
    }

    /// Records a lost lease (once per lease).
    pub(crate) fn lost(&self, name: &str, reason: LostReason, held: Duration) {
        let reason = lost_label(reason);
        metrics::counter!("locksmith_lost_total", "backend" => metrics::SharedString::from(self.backend.clone()), "reason" => reason)
            .increment(1);
        let span = tracing::info_span!(
            "lock.lost",
            lock = name,
            backend = &*self.backend,
            reason,
            held_ms = held.as_millis() as u64
        );
        span.in_scope(|| tracing::warn!(lock = name, reason, "lease lost"));
    }
}

/// The label of a lost reason (its serde name).
fn lost_label(reason: LostReason) -> &'static str {
    match reason {
        LostReason::RenewalRefused => "renewal_refused",
        LostReason::ValidityExpired => "validity_expired",
        LostReason::MaxHoldReached => "max_hold_reached",
        LostReason::SessionExpired => "session_expired",
        LostReason::ConnectionLost => "connection_lost",
    }
}
