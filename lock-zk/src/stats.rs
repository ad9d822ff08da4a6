//! The backend's counters ([`ZkStats`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of what the backend did, for tests and monitoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkStats {
    /// Predecessor watches that fired and woke a waiter (one per hand-over with no herd).
    pub watch_wakeups: u64,
    /// Contender nodes created.
    pub nodes_created: u64,
    /// Creates whose reply was lost and whose node was found again by its owner token.
    pub creates_recovered: u64,
    /// Extra nodes of one contender (a retried create whose first attempt was applied) deleted.
    pub duplicates_removed: u64,
    /// Forged contender nodes (not ephemeral) found and ignored.
    pub foreign_ignored: u64,
    /// Lost signals fired by this backend (not by lockcore's watchdog).
    pub lost_fired: u64,
    /// Contenders waiting right now on a predecessor watch that the server has set.
    pub waiting: u64,
    /// Sessions opened (1 + the sessions opened after an expiry).
    pub sessions: u64,
    /// Leases held right now in the current session.
    pub held: u64,
    /// Watches on held leases' own nodes alive right now: one per lease from its grant until
    /// the server reports its node gone (its release, a force release) or the session ends.
    /// Zero once every released lease's watch has had its answer: the watch requests a lease
    /// sends after its grant are all sent.
    pub node_watches: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) watch_wakeups: AtomicU64,
    pub(crate) nodes_created: AtomicU64,
    pub(crate) creates_recovered: AtomicU64,
    pub(crate) duplicates_removed: AtomicU64,
    pub(crate) foreign_ignored: AtomicU64,
    pub(crate) lost_fired: AtomicU64,
    pub(crate) waiting: AtomicU64,
    pub(crate) sessions: AtomicU64,
    pub(crate) node_watches: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Counts one unit of a gauge ([`ZkStats::waiting`], [`ZkStats::node_watches`]) while alive,
/// cancellation included.
pub(crate) struct GaugeUnit<'a>(&'a AtomicU64);

impl<'a> GaugeUnit<'a> {
    pub(crate) fn new(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        GaugeUnit(gauge)
    }

    /// Takes over a unit counted earlier with [`bump`] (before a task that holds it started).
    pub(crate) fn adopt(gauge: &'a AtomicU64) -> Self {
        GaugeUnit(gauge)
    }
}

impl Drop for GaugeUnit<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
