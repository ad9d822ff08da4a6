//! The locksmith contract: one lock/lease API over pluggable distributed-lock backends.
//!
//! * [`Locker`] is the client users hold: [`Locker::try_lock`] returns `Ok(None)` on contention,
//!   [`Locker::lock`] waits until the lock is acquired (or up to a deadline, when asked with
//!   [`LockOptions::wait_timeout`]); [`Locker::with_lock`] runs work under the lock, renewing it.
//!   All of them give a [`LockGuard`].
//! * A [`LockGuard`] carries a random owner token, an optional fencing token, a validity deadline
//!   and a [`LostSignal`]; it renews itself while it exists (below) and releases on drop through
//!   a background task, never blocking.
//! * Backends implement the small [`backend::Backend`] and [`backend::Lease`] traits and declare
//!   [`Capabilities`]; everything only backend authors need lives in the [`backend`] module, the
//!   crate root is the user API. [`memory::MemoryBackend`] is the in-process reference.
//! * Operators ask [`Locker::inspect`] who holds a lock ([`LockInfo`]: held or free, fencing
//!   token, TTL left, the holder's [`Holder`] metadata written at acquire with the
//!   [`LockOptions::label`], queued waiters) and free it with [`Locker::force_release`], both
//!   gated by capability (see the [`inspect`] module).
//!
//! # One rule for every guard: renewed while it exists
//!
//! Every guard, from [`Locker::lock`], [`Locker::try_lock`] or [`Locker::with_lock`], is renewed
//! in the background while it exists (every third of the TTL), as Redisson's watchdog, Curator
//! and etcd sessions do: a 45 s job under the 30 s default TTL keeps its lock. The TTL only
//! bounds how long a *crashed* holder keeps the lock. A lock's renewal stops at a maximum hold
//! time, [`DEFAULT_MAX_HOLD`] (one hour) unless [`LockOptions::auto_renew`] names another or
//! [`AutoRenew::forever`] (no maximum); the lease then ends ([`LostReason::MaxHoldReached`],
//! logged at `WARN`) and the lock is released. A [leadership](Locker::campaign) has no maximum
//! unless its [`CampaignOptions`] ask for one: a leader renews until it resigns or is lost.
//! Releasing or dropping the guard stops the renewal. [`LockOptions::no_auto_renew`] opts out: the lease then
//! ends one TTL after it was acquired (or last [extended](LockGuard::extend)), guard or not.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockcore::Result<()> {
//! use std::time::Duration;
//! use lockcore::{LockOptions, Locker, memory::MemoryBackend};
//!
//! let locker = Locker::new(MemoryBackend::connect("doc"));
//! let opts = LockOptions::new().ttl(Duration::from_secs(5));
//! let guard = locker.lock("inventory/42", &opts).await?;
//! // Contention is not an error:
//! assert!(locker.try_lock("inventory/42", &opts).await?.is_none());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # One name, one lock: the compatibility table
//!
//! A name can be taken many ways: an exclusive lock, a shared lock, one of N permits, a member
//! of a multi-lock, a campaign ([`Locker::campaign`], exclusive by construction: its
//! [`CampaignOptions`] have no mode), and per backend its other settings (a SQL strategy,
//! PostgreSQL's transaction lock, an `interop=` layout) and the peers those follow. Each
//! backend declares, beside its [`Capabilities`], what every pair does
//! ([`Capabilities::compatibility_table`], [`Locker::compatibility`]): exclude, share, refuse
//! with a typed error, or a documented limit with its reason (a peer that reads only its own
//! layout). The conformance suite's `compat_*` family checks each cell the suite can take on
//! the real servers, `locksmith report` shows the table with each cell's result, and the
//! backends' own tests check the cells of their settings and peers. Multi-locks and the
//! blocking API take the modes of their options as single locks do (a set of readers, a set
//! of permits): no mode is meaningless there, so none is refused.
//!
//! # Where things live
//!
//! Each file holds one concern, and no files import each other, directly or around a circle:
//! the client is built on the backend contract, never the other way.
//!
//! * The contract's vocabulary: `name` ([`LockName`]), `mode` ([`LockMode`]), `options`
//!   ([`LockOptions`]), `capabilities` ([`Capabilities`]), [`compatibility`] (the table),
//!   `error` ([`Error`], [`ErrorKind`]), [`inspect`] ([`LockInfo`], [`Holder`]), `lost`
//!   ([`LostSignal`] and the notifier backends fire), [`secret`], `compact_time` (8-byte
//!   instants for a lease's state).
//! * What backends implement and use: [`backend`] (the traits, the request, cancellation
//!   clean-up, detached attempts, polling), [`config`] (URL and file configuration),
//!   [`registry`] (one registration a backend), `waiting` (which calls wait).
//! * The client over them: `locker` ([`Locker`], [`LockGuard`], the lease state and the one
//!   watchdog per client), [`telemetry`], and the primitives built on its locks: `multi`
//!   ([`MultiGuard`]) and `election` ([`Locker::campaign`]).
//! * [`memory`]: the in-process reference backend.

#![deny(missing_docs)]

/// Asserts that a type takes at most `bytes`, naming its size when it does not: the memory
/// budgets of a held lease (issue 24), checked by the unit tests of the types they bound.
#[cfg(test)]
macro_rules! assert_size_at_most {
    ($t:ty, $bytes:expr) => {
        assert!(
            std::mem::size_of::<$t>() <= $bytes,
            "{}: {} bytes, over {}",
            stringify!($t),
            std::mem::size_of::<$t>(),
            $bytes
        )
    };
}

pub mod backend;
mod capabilities;
mod compact_time;
pub mod compatibility;
pub mod config;
mod election;
mod error;
pub mod inspect;
mod locker;
mod lost;
pub mod memory;
mod mode;
mod multi;
mod name;
mod options;
pub mod registry;
pub mod secret;
pub mod telemetry;
mod waiting;

pub use backend::OwnerToken;
pub use capabilities::{Capabilities, LossDetection, MAX_TTL, RenewKind, WaitKind};
pub use compatibility::{Cell, Compatibility, Relation, Way, WayKind};
pub use election::{CampaignOptions, Leader, LeaderWatch, Leadership};
pub use error::{Error, ErrorKind, Result, WithLockError};
pub use inspect::{AcquiredClock, Holder, LockInfo, Share};
pub use locker::{LockGuard, Locker, WAIT_DEADLINE_SLACK};
pub use lost::{Ended, LostReason, LostSignal, Risk};
pub use mode::{LockMode, MAX_PERMITS, Support};
pub use multi::{MultiGuard, ORDERED_AFTER_LOSSES};
pub use name::{IntoLockName, LockName, MAX_NAME_LEN};
pub use options::{
    AutoRenew, DEFAULT_MAX_HOLD, DEFAULT_RETRY_UNAVAILABLE, DEFAULT_TTL, Fencing, LockOptions,
};
pub use secret::Secret;
pub use waiting::{WaitMark, acquire_within};

/// The monotonic clock every deadline of the contract is on (tokio's, so paused test time
/// applies).
pub use tokio::time::Instant;
