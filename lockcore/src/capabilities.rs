//! What a backend instance can do, declared by the backend and checked by the suite.

use std::time::Duration;

use serde::Serialize;

use crate::{Compatibility, Instant, Support};

/// The longest TTL accepted by the contract; a backend may declare a smaller range
/// ([`Capabilities::max_ttl`]).
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// How a waiting `lock()` learns that the lock became free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WaitKind {
    /// The backend notifies waiters (pub/sub, watches, a server-side queue).
    Notify,
    /// Waiters poll with exponential backoff and full jitter, capped.
    Poll,
}

/// How leases are kept alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RenewKind {
    /// The lease lives as long as a session or connection; the backend keeps it alive itself and
    /// `extend` only checks the session.
    Native,
    /// The lease has a TTL and the contract's watchdog extends it.
    Emulated,
}

/// How soon a backend itself reports a lease lost behind its holder (an operator's
/// [`force_release`](crate::Locker::force_release), a session or connection gone), without
/// waiting for the contract's renewal. The conformance suite holds a backend to the bound it
/// declares here (`lost_detection_as_declared`, `revocation_noticed`), plus a scaled slack for
/// scheduling and a round trip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LossDetection {
    /// Only the contract's renewal finds out (every third of the TTL under auto-renewal), or
    /// the lease's validity deadline passing.
    AtRenewal,
    /// The server tells the holder (a watch on its own node or key, a revoke message, a
    /// callback in process): reported within `within` of the loss.
    Pushed {
        /// The longest from the loss to the lost signal.
        #[serde(serialize_with = "ser_duration")]
        within: Duration,
    },
    /// The backend looks at the lease itself (a check of its session or connection) at least
    /// every `every`: reported within that and a round trip.
    Checked {
        /// The longest between two checks.
        #[serde(serialize_with = "ser_duration")]
        every: Duration,
    },
}

impl LossDetection {
    /// The longest a loss goes unreported by the backend itself (a round trip aside): `None`
    /// when only a renewal or the validity deadline finds it.
    pub fn bound(&self) -> Option<Duration> {
        match *self {
            LossDetection::AtRenewal => None,
            LossDetection::Pushed { within } => Some(within),
            LossDetection::Checked { every } => Some(every),
        }
    }
}

/// The capabilities of one backend instance (not of a backend type: the same crate may declare
/// different ones per URL or server).
///
/// Backends start from [`Capabilities::default`] (nothing optional) and set what they have.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// Guards carry a fencing token, strictly increasing across holders of one name.
    pub fencing: bool,
    /// Waiters are served first come, first served.
    pub fair: bool,
    /// How `lock()` waits.
    pub wait: WaitKind,
    /// How leases are kept alive under auto-renewal.
    pub renew: RenewKind,
    /// The backend itself reports a lost lease (session expiry, dropped connection) besides the
    /// contract's renewal and validity checks.
    pub lost_detection: bool,
    /// The backend notices by itself, within a second, a lock deleted behind its holder (an
    /// operator's [`force_release`](crate::Locker::force_release): a watch on the holder's own
    /// node or key, a revoke message, a release notification), not only at the next renewal.
    /// A backend may declare it without `lost_detection` (which also covers a session or
    /// connection lost). [`Capabilities::loss_detection`] says how, and how soon.
    pub revoke_detection: bool,
    /// How, and how soon, the backend itself reports a lease lost behind its holder: the
    /// bound the suite checks `lost_detection` and `revoke_detection` against.
    /// [`LossDetection::AtRenewal`] (the default) where neither is declared.
    pub loss_detection: LossDetection,
    /// `extend(ttl)` sets the lease to the TTL asked for, longer or shorter. Backends whose
    /// server fixes a lease's TTL at grant time (etcd) keep the granted one and report it.
    pub extend_sets_ttl: bool,
    /// The same holder may acquire a lock it already holds. No backend here is: a lock held by
    /// this process is contention for it too (`try_lock` gives `Ok(None)`; the conformance
    /// suite's `reentrancy_as_declared` checks it). There is no option asking for reentrancy:
    /// count nested holds in the application if it needs them.
    pub reentrant: bool,
    /// A crashed holder's lock is held until its TTL runs out, and not freed before. Backends
    /// whose locks die with the holder's connection free them at once instead.
    pub expiry_after_ttl: bool,
    /// Expiry is judged on the wall clock of the host the clients run on (an embedded database
    /// has no server of its own: SQLite's `now` is the calling process's clock). A client
    /// whose clock runs ahead, or the host's clock stepped forward, frees a live holder's lock
    /// early: a documented violation, which `skewed_clock_cannot_steal` does not count as a
    /// pass.
    pub expiry_on_client_clock: bool,
    /// [`Backend::force_release`](crate::backend::Backend::force_release) works.
    pub force_release: bool,
    /// [`Backend::inspect`](crate::backend::Backend::inspect) works: the backend reports whether a lock
    /// is held, by whom (the [`Holder`](crate::Holder) metadata it stores at acquire) and for
    /// how long.
    pub inspect: bool,
    /// The smallest TTL accepted.
    #[serde(serialize_with = "ser_duration")]
    pub min_ttl: Duration,
    /// The largest TTL accepted.
    #[serde(serialize_with = "ser_duration")]
    pub max_ttl: Duration,
    /// The drift margin taken off every lease's validity, as a rate of the TTL in parts per
    /// million (10,000 = 1 %): clock rate differences between client and server.
    pub drift_ppm: u32,
    /// The fixed part of the drift margin.
    #[serde(serialize_with = "ser_duration")]
    pub drift_fixed: Duration,
    /// Shared acquisitions ([`LockMode::Shared`](crate::LockMode::Shared)): a read-write
    /// lock's readers together, never beside an exclusive holder, writers not starved.
    pub shared: Support,
    /// Semaphore permits ([`LockMode::Permit`](crate::LockMode::Permit)): at most N holders,
    /// a crashed holder's permit back after its TTL, a disagreement about N refused.
    pub permits: Support,
    /// [`Backend::try_acquire_all`](crate::backend::Backend::try_acquire_all) works: a multi-lock
    /// ([`Locker::try_lock_all`](crate::Locker::try_lock_all),
    /// [`Locker::lock_all`](crate::Locker::lock_all)) of exclusive locks is taken all or
    /// nothing in one request (one transaction), so that no other client ever sees part of a
    /// set taken. Without it a set is a sequence of single acquisitions (still all or nothing
    /// in its outcome).
    pub atomic_multi: Support,
    /// Free text for the report: caveats of this backend's guarantees.
    pub notes: Vec<String>,
    /// The backend's own ways to take a name beyond the contract's (its other settings, the
    /// peers it follows) and their cells, or cells of the contract's ways it declares
    /// otherwise; [`Capabilities::compatibility_table`] is the whole table.
    pub compatibility: Compatibility,
}

impl Capabilities {
    /// The whole compatibility table: the contract's ways these capabilities allow
    /// ([`Compatibility::core`]) with the backend's own ([`Capabilities::compatibility`]).
    pub fn compatibility_table(&self) -> Compatibility {
        Compatibility::core(self).merged(&self.compatibility)
    }

    /// The margin taken off a lease of `ttl`: `ttl * drift_ppm / 1e6 + drift_fixed`.
    pub fn drift_margin(&self, ttl: Duration) -> Duration {
        let rate = ttl.as_nanos().saturating_mul(u128::from(self.drift_ppm)) / 1_000_000;
        Duration::from_nanos(rate.min(u128::from(u64::MAX)) as u64).saturating_add(self.drift_fixed)
    }

    /// Until when a lock a release granted with a claim of `claim` is held, counted from
    /// `sent`, the send of the waiter's last refused attempt (the grant answers it, so the
    /// release ran after it reached the server), less the drift margin. `None` when less than
    /// a third of the claim is left now: too little to hold on until the first renewal
    /// extends it, so the waiter attempts again (and wins the lock if it is still its own).
    /// The rule every server-side hand-over shares (Redis, Redlock, PostgreSQL leases).
    pub fn granted_until(&self, sent: Instant, claim: Duration) -> Option<Instant> {
        let valid_until = sent + claim.saturating_sub(self.drift_margin(claim));
        (valid_until.saturating_duration_since(Instant::now()) >= claim / 3).then_some(valid_until)
    }
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            fencing: false,
            fair: false,
            wait: WaitKind::Poll,
            renew: RenewKind::Emulated,
            lost_detection: false,
            revoke_detection: false,
            loss_detection: LossDetection::AtRenewal,
            extend_sets_ttl: true,
            reentrant: false,
            expiry_after_ttl: true,
            expiry_on_client_clock: false,
            force_release: false,
            inspect: false,
            min_ttl: Duration::from_millis(1),
            max_ttl: MAX_TTL,
            drift_ppm: 10_000,
            drift_fixed: Duration::from_millis(2),
            shared: Support::no("not declared by this backend"),
            permits: Support::no("not declared by this backend"),
            atomic_multi: Support::no("not declared by this backend"),
            notes: Vec::new(),
            compatibility: Compatibility::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Capabilities;
    use crate::Instant;

    #[test]
    fn a_grant_holds_from_the_refused_attempts_send_while_a_third_of_its_claim_is_left() {
        let caps = Capabilities {
            drift_ppm: 10_000,
            drift_fixed: Duration::from_millis(2),
            ..Capabilities::default()
        };
        let claim = Duration::from_secs(6);
        let margin = Duration::from_millis(60 + 2);
        let sent = Instant::now();
        assert_eq!(caps.granted_until(sent, claim), Some(sent + claim - margin));
        // Sent so long ago that less than a third of the claim is left: attempt again.
        let old = Instant::now() - (claim - claim / 4);
        assert_eq!(caps.granted_until(old, claim), None);
    }
}
