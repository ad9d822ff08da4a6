//! The locksmith contract: one lock/lease API over pluggable distributed-lock backends.
//!
//! * [`Locker`] is the client users hold: [`Locker::try_lock`] returns `Ok(None)` on contention,
//!   [`Locker::lock`] waits up to a deadline. Both return a [`LockGuard`].
//! * A [`LockGuard`] carries a random owner token, an optional fencing token, a validity deadline
//!   and a [`LostSignal`]; it renews itself when asked ([`AutoRenew`], always bounded by a
//!   maximum hold time) and releases on drop through a background task, never blocking.
//! * Backends implement the small [`Backend`] and [`Lease`] traits and declare
//!   [`Capabilities`]; [`memory::MemoryBackend`] is the in-process reference.
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
#![deny(missing_docs)]

mod backend;
mod capabilities;
mod error;
mod locker;
mod lost;
pub mod memory;
mod name;
mod options;
mod secret;

pub use backend::{
    AcquireRequest, Acquired, Backend, Background, Backoff, BoxLease, Lease, OwnerToken,
    poll_acquire,
};
pub use capabilities::{Capabilities, RenewKind, WaitKind};
pub use error::{Error, ErrorKind, Result};
pub use locker::{LockGuard, Locker, drift_margin};
pub use lost::{LostNotifier, LostReason, LostSignal};
pub use name::{IntoLockName, LockName, MAX_NAME_LEN};
pub use options::{AutoRenew, DEFAULT_TTL, DEFAULT_WAIT, LockOptions, MAX_TTL};
pub use secret::Secret;

/// Re-exported so backends name the same types.
pub use async_trait::async_trait;
pub use tokio::time::Instant;
