//! Instants in 8 bytes: nanoseconds from one origin per process, where a lease's state keeps
//! several of them (issue 24: 100,000 leases on one client within 64 MiB). A `tokio::time::
//! Instant` takes 16 bytes, 24 in a `Mutex` or a `OnceLock`; this takes 8, and an atomic one
//! needs no lock around it.
//!
//! The conversion is exact (both sides count nanoseconds) and holds tokio's paused test clock
//! too, whose instants are the runtime's real instants plus the time advanced. An instant more
//! than 292 years from the origin saturates (none occurs: deadlines are at most a maximum TTL
//! or hold away).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// What stands for "none" in [`AtomicInstant`] and [`CompactInstant`].
const NONE: i64 = i64::MIN;

fn origin() -> std::time::Instant {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

fn to_nanos(at: Instant) -> i64 {
    let (at, origin) = (at.into_std(), origin());
    let since = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    if at >= origin {
        since(at - origin)
    } else {
        // Never NONE: at most -(i64::MAX).
        -since(origin - at)
    }
}

fn from_nanos(n: i64) -> Instant {
    let origin = origin();
    Instant::from_std(if n >= 0 {
        origin + Duration::from_nanos(n.unsigned_abs())
    } else {
        origin - Duration::from_nanos(n.unsigned_abs())
    })
}

/// An `Option<Instant>` in 8 bytes, ordered as the instants are (none first).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct CompactInstant(i64);

impl CompactInstant {
    pub(crate) fn new(at: Option<Instant>) -> Self {
        CompactInstant(at.map_or(NONE, to_nanos))
    }

    pub(crate) fn get(self) -> Option<Instant> {
        (self.0 != NONE).then(|| from_nanos(self.0))
    }
}

impl std::fmt::Debug for CompactInstant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

/// An `Option<Duration>` in 8 bytes: whole nanoseconds, up to 584 years (longer saturates;
/// TTLs and intervals are at most [`MAX_TTL`](crate::MAX_TTL)).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompactDuration(u64);

impl CompactDuration {
    pub(crate) fn new(d: Option<Duration>) -> Self {
        CompactDuration(d.map_or(u64::MAX, |d| {
            u64::try_from(d.as_nanos()).map_or(u64::MAX - 1, |n| n.min(u64::MAX - 1))
        }))
    }

    pub(crate) fn get(self) -> Option<Duration> {
        (self.0 != u64::MAX).then(|| Duration::from_nanos(self.0))
    }
}

/// An atomic `Option<Instant>` in 8 bytes.
pub(crate) struct AtomicInstant(AtomicI64);

impl AtomicInstant {
    pub(crate) fn new(at: Option<Instant>) -> Self {
        AtomicInstant(AtomicI64::new(CompactInstant::new(at).0))
    }

    pub(crate) fn load(&self) -> Option<Instant> {
        CompactInstant(self.0.load(Ordering::Acquire)).get()
    }

    pub(crate) fn store(&self, at: Option<Instant>) {
        self.0.store(CompactInstant::new(at).0, Ordering::Release);
    }

    /// Sets it to `at` if it is none; returns whether it did.
    pub(crate) fn set_if_none(&self, at: Instant) -> bool {
        self.0
            .compare_exchange(
                NONE,
                CompactInstant::new(Some(at)).0,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Replaces the value with `f(current)` unless `f` returns `None` (then nothing changes);
    /// returns whether it changed. `f` may run more than once, as the value races.
    pub(crate) fn update(
        &self,
        mut f: impl FnMut(Option<Instant>) -> Option<Option<Instant>>,
    ) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                f(CompactInstant(cur).get()).map(|new| CompactInstant::new(new).0)
            })
            .is_ok()
    }
}

impl std::fmt::Debug for AtomicInstant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.load().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_survive_the_round_trip() {
        let now = Instant::now();
        for at in [
            now,
            now + Duration::from_nanos(1),
            now + Duration::from_secs(3600 * 24 * 365),
            now.checked_sub(Duration::from_secs(1)).unwrap_or(now),
        ] {
            assert_eq!(CompactInstant::new(Some(at)).get(), Some(at));
            let a = AtomicInstant::new(None);
            assert_eq!(a.load(), None);
            assert!(a.set_if_none(at));
            assert!(!a.set_if_none(now));
            assert_eq!(a.load(), Some(at));
        }
        assert_eq!(CompactInstant::new(None).get(), None);
        for d in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_secs(30),
        ] {
            assert_eq!(CompactDuration::new(Some(d)).get(), Some(d));
        }
        assert_eq!(CompactDuration::new(None).get(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn paused_clock_instants_survive_too() {
        let start = Instant::now();
        tokio::time::advance(Duration::from_millis(1500)).await;
        let later = Instant::now();
        assert_eq!(CompactInstant::new(Some(later)).get(), Some(later));
        assert_eq!(
            CompactInstant::new(Some(later)).get().unwrap() - start,
            Duration::from_millis(1500)
        );
    }
}
