//! [`Handover`]: how a backend's release passes an exclusive lock to the next queued waiter,
//! one setting for every backend that can do it server-side.

use std::fmt;

/// How a release hands the exclusive lock to the queue's head (`handover=` in a URL,
/// `handover` in a config file). Each backend that reads it says where it applies (Redis and
/// Redlock in locksmith's own layout, PostgreSQL with `strategy=lease`); elsewhere a release
/// always wakes, and a backend refuses the key where it would be ignored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize)]
#[non_exhaustive]
pub enum Handover {
    /// The release wakes the queue's head, which then sends an attempt of its own: two trips.
    #[serde(rename = "wake")]
    Wake,
    /// The default: the release gives the lock to the head itself, with a short claim TTL, and
    /// tells it so; the head holds as soon as that message arrives (one trip), its validity
    /// counted from the send of its last refused attempt, and its renewal extends the claim to
    /// the lease's TTL. A lease that is not auto-renewed asks for no grant (it could not keep a
    /// claim) and is woken instead.
    #[default]
    #[serde(rename = "grant")]
    Grant,
}

impl Handover {
    /// The name used in URLs (`handover=grant` / `handover=wake`).
    pub fn as_str(self) -> &'static str {
        match self {
            Handover::Wake => "wake",
            Handover::Grant => "grant",
        }
    }
}

impl fmt::Display for Handover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
