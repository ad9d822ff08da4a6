//! The watchdog: renews a lease (when asked) up to the maximum hold time, fires the lost
//! signal at the validity deadline and releases a lease whose validity ran out.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Backend;
use crate::{AutoRenew, ErrorKind, LostSignal};

use super::inner::LockerInner;
use super::lease::GuardShared;

/// Keeps one lease: renews it (when asked) until the maximum hold time, fires the lost signal
/// when the validity deadline passes or a renewal is refused, and releases a lease whose validity
/// ran out (so that session-bound backends honour the TTL too, and the lock frees at the maximum
/// hold time whatever the TTL).
pub(super) async fn watchdog(
    shared: Arc<GuardShared>,
    locker: Arc<LockerInner>,
    signal: LostSignal,
    ttl: Duration,
    acquired_at: Instant,
    renew: Option<AutoRenew>,
) {
    let caps = locker.backend.capabilities();
    let interval = renew.as_ref().map(|r| ttl.mul_f64(r.fraction()));
    let mut next_renew = interval.map(|i| acquired_at + i);
    loop {
        let moved = shared.validity.moved.notified();
        let valid_until = shared.valid_until();
        tokio::select! {
            // An extend moved the deadline (maybe earlier): re-arm.
            _ = moved => continue,
            _ = tokio::time::sleep_until(valid_until) => {
                // A manual extend may have moved the deadline while we slept.
                if shared.valid_until() > Instant::now() {
                    continue;
                }
                shared.notifier.fire(shared.validity.expiry_reason());
                if shared.begin_release() {
                    locker.release_in_background(shared.clone());
                }
                return;
            }
            _ = signal.reported() => return,
            _ = sleep_until_opt(next_renew) => {
                let (Some(hold_deadline), Some(interval)) = (shared.hold_deadline, interval) else {
                    return;
                };
                let remaining_hold = hold_deadline.saturating_duration_since(Instant::now());
                // The last renewal asks the server for what is left of the hold, so that the
                // lock frees there even if the release at the deadline is lost.
                let new_ttl = ttl.min(remaining_hold);
                if new_ttl < caps.min_ttl.max(Duration::from_millis(1)) {
                    shared.validity.renewal_ended_by_hold();
                    next_renew = None;
                    continue;
                }
                match tokio::time::timeout_at(valid_until, shared.extend(new_ttl, caps, true)).await {
                    Ok(Ok(_granted)) => {
                        next_renew = (new_ttl == ttl).then(|| Instant::now() + interval);
                        if next_renew.is_none() {
                            // The last renewal: the lease ends where the hold does.
                            shared.validity.renewal_ended_by_hold();
                        }
                    }
                    Ok(Err(e)) if e.kind() == ErrorKind::NotHeld => return,
                    Ok(Err(e)) => {
                        tracing::warn!(error = %format!("{e:#}"), "lease renewal failed; retrying before the validity deadline");
                        next_renew = Some((Instant::now() + interval / 4).min(valid_until));
                    }
                    Err(_elapsed) => {
                        // Loop again: the validity branch fires the signal and releases.
                        next_renew = None;
                    }
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
