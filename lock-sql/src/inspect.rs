//! What every dialect's `inspect` shares: the lock row's columns (`holder`, the holder's
//! metadata written by the acquiring statement; `acquired_at`, the server's clock then) turned
//! into a [`LockInfo`].

use std::time::{Duration, UNIX_EPOCH};

use lockcore::{Holder, LockInfo, LockName};

/// A held lock from its row: the fencing counter (the holder's token), the seconds left
/// (leases), the stored metadata and when it was acquired in Unix milliseconds on the server's
/// clock.
pub(crate) fn held(
    name: &LockName,
    fence: Option<i64>,
    remaining_secs: Option<f64>,
    holder: Option<&str>,
    acquired_ms: Option<f64>,
) -> LockInfo {
    let holder = holder.and_then(Holder::decode).map(|h| match acquired_ms {
        Some(ms) if ms.is_finite() && ms >= 0.0 => {
            h.at_server_time(UNIX_EPOCH + Duration::from_secs_f64(ms / 1000.0))
        }
        _ => h,
    });
    LockInfo::held(name.clone())
        .with_fencing_token(fence.and_then(|f| u64::try_from(f).ok()))
        .with_ttl_left(
            remaining_secs
                .filter(|r| r.is_finite() && *r > 0.0)
                .map(|r| Duration::from_secs_f64(r.min(1e9))),
        )
        .with_holder(holder)
}
