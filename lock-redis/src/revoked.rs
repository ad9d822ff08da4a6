//! Revocation notices: `force_release` publishes the owner tokens it took away on the
//! namespace's revocation channel (`<namespace>:revoked`), which every client of the namespace
//! subscribes to once, on its pub/sub connection; a client holding one of those tokens fires
//! that lease's lost signal at once, instead of at its next renewal.
//!
//! Best effort by design: a notice published while the pub/sub connection is down is lost, and
//! the renewal (refused) still finds out. Not on a cluster (a shard channel must live in the
//! lock's slot; the revocations of every name would need one channel per slot).

use std::sync::OnceLock;

use lockcore::backend::{LostNotifier, Revocations};

/// The channel revocations are announced on, in `namespace`.
pub fn channel(namespace: &str) -> String {
    format!("{namespace}:revoked")
}

/// The leases of one client that a revocation notice can reach (lockcore's registry, see
/// [`Revocations`]), and the channel their notices come on.
#[derive(Debug, Default)]
pub(crate) struct RevocationNotices {
    /// The revocation channel, once this client subscribed to it.
    channel: OnceLock<String>,
    leases: Revocations,
}

impl RevocationNotices {
    pub(crate) fn listen_on(&self, channel: String) {
        let _ = self.channel.set(channel);
        self.leases.listen();
    }

    /// Registers a held lease: a notice naming `token` fires `lost`.
    pub(crate) fn watch(&self, token: u128, lost: LostNotifier) {
        self.leases.watch(token, lost.reporter());
    }

    /// The lease of `token` is gone (released, lost or dropped).
    pub(crate) fn unwatch(&self, token: u128) {
        self.leases.unwatch(token);
    }

    /// A message on `channel`: returns false when it is not the revocation channel; otherwise
    /// fires the lost signal of every lease of this client that the message names (owner
    /// tokens separated by spaces).
    pub(crate) fn dispatch(&self, channel: &str, message: Option<&str>) -> bool {
        if self.channel.get().is_none_or(|c| c.as_str() != channel) {
            return false;
        }
        if let Some(message) = message {
            self.leases.revoked(message);
        }
        true
    }
}
