//! The multi-lock's progress bound: a set taken in one request
//! ([`Capabilities::atomic_multi`](crate::Capabilities::atomic_multi)) can lose every attempt
//! while its members see steady traffic (each attempt needs every member free at the same
//! instant, and under traffic one of them is nearly always held), so after
//! [`ORDERED_AFTER_LOSSES`] lost attempts [`Locker::lock_all`] stops trying the set whole and
//! takes its members one at a time in canonical order, as on every other backend. Each member
//! is then waited for with [`Locker::lock`], the backend's own wait (FIFO on a fair backend),
//! holding the members before it: the set is had once each member's single wait has come round,
//! never later. Every client takes members in the one canonical order, so a client holding some
//! members waits only for a later one, and no circle of waits (a deadlock) can form.

use tokio::time::Instant;

use super::{MultiGuard, release_all, set_timeout, waiting_until};
use crate::{LockName, LockOptions, Locker, Result};

/// How many lost all-or-nothing attempts at a set [`Locker::lock_all`] makes before it takes
/// the members one at a time in canonical order. A set whose members are rarely busy is taken
/// in one request; one whose members are busy at every try stops losing after this many.
pub const ORDERED_AFTER_LOSSES: u32 = 3;

impl Locker {
    /// Takes every lock of `names` (distinct, in canonical order) one at a time with
    /// [`Locker::lock`], each within what is left of `deadline`, holding those taken while
    /// waiting for the next. A member that cannot be taken ends the call, with the ones already
    /// taken released first.
    ///
    /// Cancel safety: as [`Locker::lock_all`] (the members taken so far are released in the
    /// background, as dropped guards are).
    pub(super) async fn take_in_order(
        &self,
        names: &[LockName],
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<MultiGuard> {
        let mut guards = Vec::with_capacity(names.len());
        for name in names {
            let opts = waiting_until(options, deadline);
            match self.lock(name.clone(), &opts).await {
                Ok(g) => guards.push(g),
                Err(e) => {
                    release_all(guards).await;
                    return Err(set_timeout(e, names, name, options));
                }
            }
        }
        Ok(MultiGuard { guards })
    }
}
