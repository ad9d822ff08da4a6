//! Revocation notices, for backends whose `force_release` can tell the holder's client (a
//! Redis revocation channel, a PostgreSQL `NOTIFY`): the leases of one client that a notice
//! can reach, by owner token, so that the one it names fires its lost signal at once instead
//! of at its next renewal. How a notice travels is the backend's; what it names (owner tokens
//! as 32 hex digits, separated by spaces) and what it does are the same everywhere.
//!
//! Best effort by design: a notice sent while the client was not listening is lost, and the
//! lease's next renewal (refused) finds out instead.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::LostReporter;
use crate::LostReason;

/// The held leases of one client that a revocation notice can reach, by owner token (its 128
/// bits, [`OwnerToken::uuid`](super::OwnerToken::uuid): no allocation per held lease).
///
/// Nothing is registered until the client listens ([`Revocations::listen`]): a client that
/// cannot hear notices keeps no entries.
#[derive(Debug, Default)]
pub struct Revocations {
    listening: AtomicBool,
    held: Mutex<HashMap<u128, LostReporter>>,
}

impl Revocations {
    fn held(&self) -> MutexGuard<'_, HashMap<u128, LostReporter>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this client listens for revocations (and registers its leases).
    pub fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    /// Notices reach this client from now on: leases won from now on are registered.
    pub fn listen(&self) {
        self.listening.store(true, Ordering::Release);
    }

    /// Registers a held lease (once listening; a no-op before): a notice naming `token` fires
    /// `lost` (a [`LostNotifier::reporter`](super::LostNotifier::reporter): the registry does
    /// not keep the request alive). Pair it with [`Revocations::unwatch`].
    pub fn watch(&self, token: u128, lost: LostReporter) {
        if self.listening() {
            self.held().insert(token, lost);
        }
    }

    /// [`Revocations::watch`], ended when the returned registration is dropped (`None` when
    /// not listening).
    pub fn watch_until_dropped(
        self: &Arc<Self>,
        token: u128,
        lost: LostReporter,
    ) -> Option<RevocationWatch> {
        if !self.listening() {
            return None;
        }
        self.watch(token, lost);
        Some(RevocationWatch {
            revocations: Some(self.clone()),
            token,
        })
    }

    /// The lease of `token` is gone (released, lost or dropped).
    pub fn unwatch(&self, token: u128) {
        if self.listening() {
            self.held().remove(&token);
        }
    }

    /// A revocation notice: fires the lost signal of every lease of this client that `tokens`
    /// names (owner tokens as hex digits, separated by spaces; anything else is skipped).
    /// Returns how many it fired. Never blocks on more than the registry's lock.
    pub fn revoked(&self, tokens: &str) -> usize {
        // Fired after the registry's lock is let go: firing runs the guard's loss hook, whose
        // temporary strong reference is the guard's last one when the guard was dropped
        // meanwhile; dropping the guard drops its lease, which unregisters here. Under the lock
        // that re-entry would deadlock this thread (seen as a conformance scenario's "blocking
        // task still running" at its runtime's shutdown).
        let named: Vec<LostReporter> = {
            let held = self.held();
            tokens
                .split(' ')
                .filter_map(|t| u128::from_str_radix(t, 16).ok())
                .filter_map(|token| held.get(&token).cloned())
                .collect()
        };
        named
            .iter()
            // The server took the lease away: what a refused renewal would have said.
            .map(|lost| usize::from(lost.fire(LostReason::RenewalRefused)))
            .sum()
    }

    /// How many leases are registered.
    pub fn len(&self) -> usize {
        self.held().len()
    }

    /// Whether no lease is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One lease's registration with [`Revocations`] ([`Revocations::watch_until_dropped`]):
/// dropping it unregisters the lease.
#[derive(Debug)]
pub struct RevocationWatch {
    /// `None` once handed on.
    revocations: Option<Arc<Revocations>>,
    token: u128,
}

impl RevocationWatch {
    /// Ends this registration without unregistering the token: a waiting request's watch
    /// (registered before its lease exists, so that a notice naming a lock granted to it is
    /// not missed) whose lease, now won, registered the same token itself and unregisters it
    /// when dropped.
    pub fn hand_on(mut self) {
        self.revocations = None;
    }
}

impl Drop for RevocationWatch {
    fn drop(&mut self) {
        if let Some(r) = &self.revocations {
            r.unwatch(self.token);
        }
    }
}
