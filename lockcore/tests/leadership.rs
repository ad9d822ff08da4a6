//! Leadership lasts (issue 35) and is exclusive by construction (issue 33), on the in-process
//! reference backend with tokio's paused clock.

use std::time::Duration;

use lockcore::memory::MemoryBackend;
use lockcore::{AutoRenew, CampaignOptions, DEFAULT_MAX_HOLD, LockOptions, Locker, LostReason};

const SEC: Duration = Duration::from_secs(1);

/// A leader elected with the default options is still the leader, and the only one, long
/// after [`DEFAULT_MAX_HOLD`]: it renews until it resigns. (Before, `campaign` inherited the
/// locks' one-hour maximum and the leader was deposed with `MaxHoldReached`.)
#[tokio::test(start_paused = true)]
async fn leadership_outlasts_the_default_max_hold() {
    let a = Locker::new(MemoryBackend::connect("leadership_lasts"));
    let b = Locker::new(MemoryBackend::connect("leadership_lasts"));
    let leader = a
        .campaign("lasting", "10.0.0.1", &CampaignOptions::new().ttl(10 * SEC))
        .await
        .unwrap();
    tokio::time::sleep(DEFAULT_MAX_HOLD * 3).await;
    assert!(leader.is_leader(), "deposed: {:?}", leader.lost().reason());
    let second = b
        .campaign(
            "lasting",
            "10.0.0.2",
            &CampaignOptions::new().wait_timeout(Duration::ZERO),
        )
        .await;
    assert!(second.is_err(), "a second leader was elected");
    let seen = b.leader("lasting").await.unwrap().expect("no leader");
    assert_eq!(seen.value.as_deref(), Some("10.0.0.1"));
    leader.resign().await.unwrap();
    let next = b
        .campaign(
            "lasting",
            "10.0.0.2",
            &CampaignOptions::new().wait_timeout(SEC),
        )
        .await
        .expect("the next candidate was not elected after the resignation");
    next.resign().await.unwrap();
}

/// A leadership asked to end at a maximum hold time does, with `MaxHoldReached`.
#[tokio::test(start_paused = true)]
async fn leadership_with_a_max_hold_ends_there() {
    let a = Locker::new(MemoryBackend::connect("leadership_max_hold"));
    let opts = CampaignOptions::new()
        .ttl(3 * SEC)
        .auto_renew(AutoRenew::until(10 * SEC));
    let leader = a.campaign("bounded", "x", &opts).await.unwrap();
    let reason = tokio::time::timeout(11 * SEC, leader.lost().lost())
        .await
        .expect("the leadership outlived its maximum hold");
    assert_eq!(reason, LostReason::MaxHoldReached);
}

/// Candidates campaigning together never both lead: the campaign's lock is exclusive whatever
/// else the caller configures (no mode can be given).
#[tokio::test(start_paused = true)]
async fn two_candidates_never_lead_together() {
    let a = Locker::new(MemoryBackend::connect("leadership_exclusive"));
    let b = Locker::new(MemoryBackend::connect("leadership_exclusive"));
    let opts = CampaignOptions::new().wait_timeout(Duration::ZERO);
    let first = a.campaign("one", "a", &opts).await.unwrap();
    assert!(b.campaign("one", "b", &opts).await.is_err());
    // Nor does a shared or permit holder of the name take it beside the leader.
    assert!(
        b.try_lock("one", &LockOptions::new().shared())
            .await
            .unwrap()
            .is_none()
    );
    first.resign().await.unwrap();
}

/// A lock renewed with [`AutoRenew::forever`] is held past [`DEFAULT_MAX_HOLD`], and released
/// when the guard is.
#[tokio::test(start_paused = true)]
async fn a_lock_renewed_forever_outlasts_the_default_max_hold() {
    let a = Locker::new(MemoryBackend::connect("lock_forever"));
    let b = Locker::new(MemoryBackend::connect("lock_forever"));
    let opts = LockOptions::new()
        .ttl(10 * SEC)
        .auto_renew(AutoRenew::forever());
    let g = a.lock("held", &opts).await.unwrap();
    tokio::time::sleep(DEFAULT_MAX_HOLD * 2).await;
    assert!(g.is_valid(), "lost: {:?}", g.lost().reason());
    assert!(
        b.try_lock("held", &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    g.release().await.unwrap();
    assert!(
        b.try_lock("held", &LockOptions::new())
            .await
            .unwrap()
            .is_some()
    );
}
