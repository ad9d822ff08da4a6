//! Revocation notices: `force_release` publishes the owner tokens it took away on the
//! namespace's revocation channel (`<namespace>:revoked`), which every client of the namespace
//! subscribes to once, on its pub/sub connection; a client holding one of those tokens fires
//! that lease's lost signal at once, instead of at its next renewal.
//!
//! Best effort by design: a notice published while the pub/sub connection is down is lost, and
//! the renewal (refused) still finds out. Not on a cluster (a shard channel must live in the
//! lock's slot; the revocations of every name would need one channel per slot).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use lockcore::LostReason;
use lockcore::backend::LostNotifier;

/// The channel revocations are announced on, in `namespace`.
pub fn channel(namespace: &str) -> String {
    format!("{namespace}:revoked")
}

/// The leases of one client that a revocation notice can reach, by owner token (its 128 bits:
/// no allocation per held lease, which the lease's byte budget counts).
#[derive(Debug, Default)]
pub(crate) struct Revocations {
    /// The revocation channel, once this client subscribed to it.
    channel: OnceLock<String>,
    held: Mutex<HashMap<u128, LostNotifier>>,
}

impl Revocations {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u128, LostNotifier>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this client listens for revocations (and should register its leases).
    pub(crate) fn listening(&self) -> bool {
        self.channel.get().is_some()
    }

    pub(crate) fn listen_on(&self, channel: String) {
        let _ = self.channel.set(channel);
    }

    /// Registers a held lease: a notice naming `token` fires `lost`.
    pub(crate) fn watch(&self, token: u128, lost: LostNotifier) {
        if self.listening() {
            self.held().insert(token, lost);
        }
    }

    /// The lease of `token` is gone (released, lost or dropped).
    pub(crate) fn unwatch(&self, token: u128) {
        if self.listening() {
            self.held().remove(&token);
        }
    }

    /// A message on `channel`: returns false when it is not the revocation channel; otherwise
    /// fires the lost signal of every lease of this client that the message names (owner
    /// tokens separated by spaces).
    pub(crate) fn dispatch(&self, channel: &str, message: Option<&str>) -> bool {
        if self.channel.get().is_none_or(|c| c.as_str() != channel) {
            return false;
        }
        let Some(message) = message else {
            return true;
        };
        let held = self.held();
        let tokens = message
            .split(' ')
            .filter_map(|t| u128::from_str_radix(t, 16).ok());
        for token in tokens {
            if let Some(lost) = held.get(&token) {
                // The server took the lease away: what a refused renewal would have said.
                lost.fire(LostReason::RenewalRefused);
            }
        }
        true
    }
}
