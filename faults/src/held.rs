//! What a faulted holder process holds: the exclusive lock, a shared hold (a reader) or one
//! semaphore permit. The holder faults (kill, pause) run once per primitive, because what frees
//! a crashed or stopped holder differs: a dead reader must still keep a writer out until its
//! lease ends, a dead permit holder's permit must come back after its TTL, never sooner.

use faultkit::HolderSpec;
use locksmith::{Capabilities, LockGuard, LockOptions, Locker, Support};

use crate::support::renewing;
use crate::target::Target;

/// The permits of the permit faults: one held by a live client throughout, one by the faulted
/// process, so the client that takes over can only have the dead holder's.
pub(crate) const PERMITS: u32 = 2;

/// What the faulted holder holds, and what the client that takes over asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// The exclusive lock; the next client asks for it too.
    Exclusive,
    /// A shared hold (a reader); the next client is a writer.
    Reader,
    /// One of [`PERMITS`] permits, the other held by a live client; the next client asks for a
    /// permit.
    Permit,
}

impl Held {
    /// Whether the backend gives this primitive (`Support::Yes` for the exclusive lock).
    pub(crate) fn support(self, caps: &Capabilities) -> Support {
        match self {
            Held::Exclusive => Support::Yes,
            Held::Reader => caps.shared.clone(),
            Held::Permit => caps.permits.clone(),
        }
    }

    /// The holder process's spec, asking for this primitive.
    pub(crate) fn apply(self, spec: &mut HolderSpec) {
        match self {
            Held::Exclusive => {}
            Held::Reader => spec.shared = true,
            Held::Permit => spec.permits = Some(PERMITS),
        }
    }

    /// The options of the client that takes over (a writer after a reader).
    pub(crate) fn next(self, opts: LockOptions) -> LockOptions {
        match self {
            Held::Permit => opts.permits(PERMITS),
            Held::Exclusive | Held::Reader => opts,
        }
    }

    /// Takes what must stay held beside the faulted holder for the fault to test this
    /// primitive: the other permit, by a live renewing client, before the holder starts.
    /// Keep the returned client and guard until the scenario ends.
    pub(crate) async fn occupy(
        self,
        t: &Target,
        name: &str,
    ) -> Result<Option<(Locker, LockGuard)>, String> {
        if self != Held::Permit {
            return Ok(None);
        }
        let locker = crate::support::connect(t).await?;
        let g = locker
            .try_lock(name, &renewing(t.ttl).permits(PERMITS))
            .await
            .map_err(|e| format!("the live permit holder: {e}"))?
            .ok_or("the live permit holder found no permit free on a fresh name")?;
        Ok(Some((locker, g)))
    }
}
