//! Who holds a lock: the random [`OwnerToken`] of one acquisition, and the [`AcquireRequest`]
//! a backend is handed for it.

use std::fmt;
use std::time::Duration;

use crate::{Fencing, Holder, LockMode, LockName, WaitMark};

use super::{Background, LostNotifier};

/// The random owner token of one acquisition (a UUID v4). Release and extend only ever touch the
/// lease that carries it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(uuid::Uuid);

impl OwnerToken {
    /// A new random token.
    pub fn random() -> Self {
        OwnerToken(uuid::Uuid::new_v4())
    }

    /// The token as a UUID.
    pub fn uuid(&self) -> uuid::Uuid {
        self.0
    }

    /// The token as 32 lowercase hex digits, the form backends store.
    pub fn to_hex(&self) -> String {
        self.0.simple().to_string()
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({})", self.0.simple())
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.simple())
    }
}

/// One acquisition as the backend sees it.
///
/// `#[non_exhaustive]`: fields may be added without breaking backends; build one with
/// [`AcquireRequest::new`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The validated lock name.
    pub name: LockName,
    /// This acquisition's owner token; store it with the lock.
    pub token: OwnerToken,
    /// The lease TTL asked for (already validated against the backend's range).
    pub ttl: Duration,
    /// Fire it when the backend learns the lease is lost (session expired, connection dropped).
    pub lost: LostNotifier,
    /// Where the backend runs cleanup that must outlive a cancelled call (deleting a dropped
    /// waiter's queue entry, undoing a partial quorum acquire);
    /// [`Locker::flush`](crate::Locker::flush) waits for it.
    pub background: Background,
    /// Who is acquiring (host, process id, wall-clock time, the options' label): backends that
    /// declare [`Capabilities::inspect`](crate::Capabilities::inspect) store [`Holder::encode`]
    /// with the lock, in the request that takes it.
    pub holder: Holder,
    /// Mark it once the request waits (see [`WaitMark::mark`]): the caller's
    /// [`Locker::waiting`](crate::Locker::waiting) counts it, which is how tests and operators
    /// see a waiter in place where the backend keeps no queue to ask.
    pub waiting: WaitMark,
    /// What is asked for: the lock alone, a share, or one of N permits. A backend only sees a mode
    /// its [`Capabilities`](crate::Capabilities) declare
    /// ([`Capabilities::shared`](crate::Capabilities::shared),
    /// [`Capabilities::permits`](crate::Capabilities::permits)): [`Locker`](crate::Locker) refuses
    /// the others before any I/O, so a backend that knows nothing of modes is only ever asked for
    /// exclusive locks.
    pub mode: LockMode,
    /// Whether the caller wants a fencing token
    /// ([`LockOptions::fencing`](crate::LockOptions::fencing)). A backend declaring
    /// [`Capabilities::fencing`](crate::Capabilities::fencing) gives one unless this is
    /// [`Fencing::NotWanted`]; then it may skip whatever only the token costs (and return `None`
    /// from [`Lease::fencing_token`](super::Lease::fencing_token)), but never the lock's exclusion,
    /// and a later acquisition's token must still be above every token given before.
    pub fencing: Fencing,
    /// Whether this acquisition is a campaign ([`Locker::campaign`](crate::Locker::campaign)): the
    /// holder's label is then the candidate's value. A backend whose server has an election recipe
    /// of its own, whose clients read the leader's value from where the lock's metadata goes
    /// (etcd's `concurrency.Election`: the leader key's value), may store the label alone there in
    /// place of [`Holder::encode`], so that those clients see the value; its
    /// [`Backend::inspect`](super::Backend::inspect) then reports such a bare value as
    /// [`LockInfo::value`](crate::LockInfo::value). Other backends ignore it.
    pub campaign: bool,
    /// Whether the lease will be renewed in the background (the options'
    /// [`auto_renew`](crate::LockOptions::auto_renew)): a backend may then report a first
    /// validity shorter than the TTL ([`Acquired::with_granted_ttl`](super::Acquired::with_granted_ttl)),
    /// which the first renewal, due within that validity, extends to the TTL (a lock handed
    /// over with a short claim, say). Without renewal it must give the TTL asked for.
    pub renewed: bool,
}

impl AcquireRequest {
    /// A request with its own [`LostNotifier`] (whose signal is dropped) and a [`Background`]
    /// on the current runtime. [`Locker`](crate::Locker) builds its requests itself; this is
    /// for tests and tools that drive a backend directly.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn new(name: LockName, token: OwnerToken, ttl: Duration) -> Self {
        AcquireRequest {
            name,
            token,
            ttl,
            lost: LostNotifier::new().0,
            background: Background::new(),
            holder: Holder::current(None),
            waiting: WaitMark::default(),
            mode: LockMode::Exclusive,
            fencing: Fencing::IfAvailable,
            campaign: false,
            renewed: false,
        }
    }
}

/// The `with_*` builders of [`AcquireRequest`], one a field: each returns the same request with
/// that field replaced.
macro_rules! with_fields {
    ($($(#[$doc:meta])* $method:ident($field:ident: $ty:ty);)*) => {
        impl AcquireRequest {
            $(
                $(#[$doc])*
                pub fn $method(mut self, $field: $ty) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}

with_fields! {
    /// The same request, a campaign or not (see [`AcquireRequest::campaign`]).
    with_campaign(campaign: bool);
    /// The same request asking for a fencing token as `fencing` says.
    with_fencing(fencing: Fencing);
    /// The same request asking for `mode`.
    with_mode(mode: LockMode);
    /// The same request with `holder` as its metadata.
    with_holder(holder: Holder);
    /// The same request reporting loss to `lost`.
    with_lost(lost: LostNotifier);
    /// The same request counting its wait with `waiting`.
    with_waiting(waiting: WaitMark);
    /// The same request running its cleanup on `background`.
    with_background(background: Background);
    /// The same request, renewed in the background or not (see [`AcquireRequest::renewed`]).
    with_renewed(renewed: bool);
}
