use super::*;

#[tokio::test(start_paused = true)]
async fn at_risk_fires_within_the_margin_unless_renewed() {
    let start = Instant::now();
    let ttl = Duration::from_secs(3);
    let margin = Duration::from_secs(1);
    let (n, s) = LostNotifier::new();
    n.attach_validity(start + ttl, None);
    let validity = s.validity().unwrap();

    // Renewed every second (a third of the TTL) for 5 s: never within the margin.
    let renewer = async {
        for i in 1..=5 {
            tokio::time::sleep_until(start + Duration::from_secs(i)).await;
            assert!(validity.renew_to(Instant::now() + ttl));
        }
    };
    let risk = tokio::select! {
        risk = s.at_risk(margin) => Some(risk),
        () = renewer => None,
    };
    assert_eq!(risk, None, "a lease renewed in time is not at risk");

    // Renewal stops: the last deadline is start + 8 s; the warning comes at 7 s.
    let risk = s.at_risk(margin).await;
    assert_eq!(
        risk,
        Risk::Ending {
            valid_until: start + Duration::from_secs(8)
        }
    );
    assert_eq!(Instant::now(), start + Duration::from_secs(7));
    assert!(!s.is_lost(), "at risk is before lost");

    // A loss reported by the backend is at risk too.
    n.fire(LostReason::RenewalRefused);
    assert_eq!(
        s.at_risk(margin).await,
        Risk::Lost(LostReason::RenewalRefused)
    );
}

#[tokio::test(start_paused = true)]
async fn at_risk_never_fires_after_a_normal_end() {
    let (n, s) = LostNotifier::new();
    n.attach_validity(Instant::now() + Duration::from_secs(2), None);
    let validity = s.validity().unwrap();
    validity.ended.store(true, Ordering::Release);
    drop(n);
    let never =
        tokio::time::timeout(Duration::from_secs(10), s.at_risk(Duration::from_secs(1))).await;
    assert!(never.is_err(), "a released lease is not at risk");
}

#[tokio::test(start_paused = true)]
async fn lost_at_is_the_first_report_or_the_passed_deadline() {
    let start = Instant::now();
    let (n, s) = LostNotifier::new();
    n.attach_validity(start + Duration::from_secs(2), None);
    assert_eq!(s.lost_at(), None);
    tokio::time::sleep(Duration::from_secs(1)).await;
    n.fire(LostReason::ConnectionLost);
    tokio::time::sleep(Duration::from_millis(500)).await;
    n.fire(LostReason::SessionExpired);
    assert_eq!(s.lost_at(), Some(start + Duration::from_secs(1)));
    // A deadline that passed later does not move it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(s.lost_at(), Some(start + Duration::from_secs(1)));

    // Not reported: the deadline, once passed.
    let (n, s) = LostNotifier::new();
    n.attach_validity(Instant::now() + Duration::from_secs(2), None);
    let validity = s.validity().unwrap();
    let deadline = validity.until();
    assert_eq!(s.lost_at(), None);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(s.lost_at(), Some(deadline));
}

#[test]
fn the_shared_state_stays_small() {
    // One allocation per lease for the signal and the validity: with its reference counts
    // and malloc's header, 88 bytes fit a 112-byte chunk (issue 24).
    assert_size_at_most!(NotifierInner, 88);
    assert_eq!(size_of::<LostSignal>(), 8);
}

#[test]
fn every_reason_survives_its_code() {
    for reason in [
        LostReason::RenewalRefused,
        LostReason::ValidityExpired,
        LostReason::MaxHoldReached,
        LostReason::SessionExpired,
        LostReason::ConnectionLost,
    ] {
        assert_eq!(reason_of(reason_code(reason)), Some(reason));
    }
    assert_eq!(reason_of(0), None);
}

#[tokio::test]
async fn closed_once_every_signal_is_gone() {
    let (n, s) = LostNotifier::new();
    let s2 = s.clone();
    drop(s);
    let open = tokio::time::timeout(Duration::from_millis(20), n.closed()).await;
    assert!(open.is_err(), "a clone of the signal is still there");
    let closed = tokio::spawn({
        let n = n.clone();
        async move { n.closed().await }
    });
    drop(s2);
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("closed() resolves when the last signal goes")
        .unwrap();
}

#[tokio::test]
async fn a_bare_signal_ends_released_when_every_notifier_is_gone() {
    let (n, s) = LostNotifier::new();
    let n2 = n.clone();
    let ended = tokio::spawn({
        let s = s.clone();
        async move { s.ended().await }
    });
    drop(n);
    tokio::task::yield_now().await;
    assert!(!ended.is_finished(), "a notifier is still there");
    drop(n2);
    let ended = tokio::time::timeout(Duration::from_secs(10), ended)
        .await
        .expect("ended() resolves when the last notifier goes")
        .unwrap();
    assert_eq!(ended, Ended::Released);

    let (n, s) = LostNotifier::new();
    let waiting = tokio::spawn(async move { s.ended().await });
    n.fire(LostReason::ConnectionLost);
    drop(n);
    let ended = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ended, Ended::Lost(LostReason::ConnectionLost));
}

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
