//! What a [`Locker`](crate::Locker)'s clones and its guards share: the backend, the runtime,
//! the background tasks and the telemetry.

use std::sync::Arc;

use tokio::runtime::Handle;

use crate::backend::{Backend, Background};
use crate::telemetry::Telemetry;
use crate::waiting::WaitBoard;

use super::lease::GuardShared;
use super::liveness::Liveness;
use super::watchdog::Watchdog;

pub(super) struct LockerInner {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) runtime: Handle,
    /// Drop-releases and the backends' own cleanup (cancelled waiters, partial acquires).
    pub(super) background: Background,
    /// Metric handles and the backend label of spans.
    pub(super) telemetry: Arc<Telemetry>,
    /// The waiting `lock` calls per name (see `Locker::waiting`).
    pub(super) waiting: Arc<WaitBoard>,
    /// Renews this client's leases and watches their deadlines: one task for all of them.
    pub(super) watchdog: Watchdog,
    /// Whether `runtime` still runs.
    pub(super) liveness: Liveness,
}

impl LockerInner {
    /// Hands a release to a background task: never blocks, and runs to completion as long as the
    /// runtime does.
    pub(super) fn release_in_background(self: &Arc<Self>, shared: Arc<GuardShared>) {
        shared.release_in_background(&self.background);
    }
}
