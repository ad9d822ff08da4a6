//! Polling for backends that cannot be notified: [`Backoff`] (exponential, full jitter, capped)
//! and [`poll_acquire`], the default [`Backend::acquire`].

use std::time::Duration;

use tokio::time::Instant;

use crate::Result;

use super::{AcquireRequest, Acquired, Backend};

/// Exponential backoff with full jitter, capped: the poll schedule for backends that cannot be
/// notified, and the safety-net poll for those that can.
#[derive(Clone, Debug, PartialEq)]
pub struct Backoff {
    /// The first delay's upper bound.
    pub initial: Duration,
    /// The cap on any delay.
    pub max: Duration,
}

impl Backoff {
    /// 5 ms doubling up to a quarter of the TTL, capped at 1 s and at least 10 ms.
    pub fn for_ttl(ttl: Duration) -> Self {
        Backoff {
            initial: Duration::from_millis(5),
            max: (ttl / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)),
        }
    }

    /// The delay before poll number `attempt` (0-based): uniform in `[0, min(max, initial * 2^attempt)]`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self
            .initial
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max);
        let nanos = ceiling.as_nanos().min(u64::MAX as u128) as u64;
        Duration::from_nanos(fastrand::u64(0..=nanos))
    }
}

/// Polls [`Backend::try_acquire`] until it succeeds or `deadline` passes, sleeping per `backoff`
/// between attempts (never past the deadline). The default [`Backend::acquire`].
///
/// Cancel safe as far as `try_acquire` is.
pub async fn poll_acquire<B: Backend + ?Sized>(
    backend: &B,
    req: &AcquireRequest,
    deadline: Option<Instant>,
    backoff: &Backoff,
) -> Result<Option<Acquired>> {
    poll_attempts(req, deadline, backoff, || backend.try_acquire(req)).await
}

/// [`poll_acquire`] with an attempt of the backend's choosing: the attempt of a waiting
/// `lock()` may differ from a `try_lock`'s (a writer marks itself as waiting behind shared
/// holders, which a `try_lock` must not). Marks `req` waiting after each attempt that lost.
///
/// Cancel safe as far as `attempt` is.
pub async fn poll_attempts<F, Fut>(
    req: &AcquireRequest,
    deadline: Option<Instant>,
    backoff: &Backoff,
    mut try_once: F,
) -> Result<Option<Acquired>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<Acquired>>>,
{
    let mut attempt = 0u32;
    loop {
        if let Some(lease) = try_once().await? {
            return Ok(Some(lease));
        }
        req.waiting.mark();
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(None);
        }
        let mut wake = now + backoff.delay(attempt);
        if let Some(d) = deadline {
            wake = wake.min(d);
        }
        tokio::time::sleep_until(wake).await;
        attempt = attempt.saturating_add(1);
    }
}
