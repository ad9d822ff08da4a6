//! The lost-lease signal.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::watch;

/// Why a lease is known lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LostReason {
    /// A renewal was refused: the lease was no longer the holder's.
    RenewalRefused,
    /// The validity deadline passed without a successful renewal (the server could not be reached
    /// in time, or auto-renewal was off or had reached its maximum hold time).
    ValidityExpired,
    /// The backend session that carried the lease expired.
    SessionExpired,
    /// The connection that carried the lease dropped (the server released the lock).
    ConnectionLost,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::RenewalRefused => "renewal refused",
            LostReason::ValidityExpired => "validity deadline passed",
            LostReason::SessionExpired => "session expired",
            LostReason::ConnectionLost => "connection lost",
        })
    }
}

/// The sending half, given to backends with each acquisition so they can report a loss they see
/// first (a session expiry, a dropped connection). The first reason reported wins.
#[derive(Clone)]
pub struct LostNotifier(Arc<watch::Sender<Option<LostReason>>>);

impl fmt::Debug for LostNotifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LostNotifier")
            .field(&*self.0.borrow())
            .finish()
    }
}

impl LostNotifier {
    /// A new notifier and its signal.
    pub fn new() -> (LostNotifier, LostSignal) {
        let (tx, rx) = watch::channel(None);
        (LostNotifier(Arc::new(tx)), LostSignal(rx))
    }

    /// Reports the lease lost; returns false if it was already reported.
    pub fn fire(&self, reason: LostReason) -> bool {
        self.0.send_if_modified(|state| {
            if state.is_none() {
                *state = Some(reason);
                true
            } else {
                false
            }
        })
    }

    /// Whether the lease was reported lost.
    pub fn is_fired(&self) -> bool {
        self.0.borrow().is_some()
    }

    /// Resolves when every signal is gone (the guard and its watchdog ended): backends use it to
    /// stop watching a lease nobody listens to any more.
    pub async fn closed(&self) {
        self.0.closed().await
    }
}

/// Fires when the lease is known lost. Clone it freely; select on [`LostSignal::lost`] in the
/// critical section to stop work that must not outlive the lease.
#[derive(Clone, Debug)]
pub struct LostSignal(watch::Receiver<Option<LostReason>>);

impl LostSignal {
    /// The reason, if the lease is known lost.
    pub fn reason(&self) -> Option<LostReason> {
        *self.0.borrow()
    }

    /// Whether the lease is known lost.
    pub fn is_lost(&self) -> bool {
        self.reason().is_some()
    }

    /// Waits until the lease is known lost and returns why. Pending forever if the lease is
    /// released normally.
    ///
    /// Cancel safe: dropping the future loses nothing.
    pub async fn lost(&self) -> LostReason {
        let mut rx = self.0.clone();
        let reason = rx.wait_for(|r| r.is_some()).await.ok().and_then(|r| *r);
        match reason {
            Some(reason) => reason,
            // Every notifier is gone without a loss: the lease ended normally.
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_reason_wins_and_release_is_not_loss() {
        let (n, s) = LostNotifier::new();
        assert!(!s.is_lost());
        assert!(n.fire(LostReason::SessionExpired));
        assert!(!n.fire(LostReason::ValidityExpired));
        assert_eq!(s.lost().await, LostReason::SessionExpired);

        let (n, s) = LostNotifier::new();
        drop(n);
        let never = tokio::time::timeout(std::time::Duration::from_millis(20), s.lost()).await;
        assert!(never.is_err(), "a lease that ended normally is not lost");
    }
}
