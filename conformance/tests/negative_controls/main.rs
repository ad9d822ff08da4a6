//! Negative controls: deliberately broken backends that make the classic mistakes. Each must
//! fail exactly the scenarios named here, which proves the suite catches those mistakes. A
//! correct backend over the same toy store passes everything, so the store is not the cause.
//! Waiters poll with lockcore's own `poll_acquire` (as a real polling backend does), so what is
//! caught is not overstated by an unrealistically tight poll.

mod flawed;
mod primitives;
mod toy;

use std::collections::BTreeSet;
use std::sync::Arc;

use conformance::{Status, run_selected};

use flawed::{Flaw, FlawedHarness};
use primitives::{PrimitiveFlaw, WrappedHarness};

/// Runs the whole suite against a backend with `flaw` and returns the failing scenarios.
fn failing(flaw: Flaw) -> BTreeSet<String> {
    failed_scenarios(flaw, Arc::new(FlawedHarness::new(flaw)), |_| true, true)
}

/// Runs the scenarios `selected` accepts against `harness` (a backend with `flaw`) and
/// returns the failing ones; one unsupported is a failure of the control unless
/// `unsupported_ok`, and one skipped always is.
fn failed_scenarios(
    flaw: impl std::fmt::Debug,
    harness: Arc<dyn conformance::Harness>,
    selected: impl Fn(&str) -> bool,
    unsupported_ok: bool,
) -> BTreeSet<String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let report = rt.block_on(run_selected(harness, false, selected, |_| {}));
    let mut failed = BTreeSet::new();
    for r in report.results {
        match r.status {
            Status::Fail => {
                eprintln!(
                    "{flaw:?} fails {}: {}",
                    r.scenario,
                    r.reason.unwrap_or_default()
                );
                failed.insert(r.scenario);
            }
            Status::Pass => {}
            Status::Unsupported if unsupported_ok => {}
            Status::Unsupported | Status::Skipped => {
                panic!("{} did not run: {:?}", r.scenario, r.reason)
            }
        }
    }
    failed
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn correct_toy_backend_passes_everything() {
    assert_eq!(failing(Flaw::None), set(&[]));
}

#[test]
fn setnx_then_expire_is_caught() {
    assert_caught(
        Flaw::SetnxThenExpire,
        // A lock(), and a lock_all of such locks, cancelled between its two requests.
        &[
            "cancelled_acquire_leaves_nothing",
            "cancelled_lock_all_leaves_nothing",
        ],
        // A waiter dropped between its SETNX and its EXPIRE: hit when its poll falls in the
        // 20 ms before the drop. A set's member taken the same way, cancelled after 5 or 10 ms.
        &[
            "grant_at_drop_leaves_nothing",
            "cancelled_set_take_leaves_nothing",
        ],
    );
}

/// `flaw` fails every scenario of `always`, and nothing outside `always` and `sometimes`.
fn assert_caught(flaw: Flaw, always: &[&str], sometimes: &[&str]) {
    assert_fails_between(failing(flaw), always, sometimes);
}

/// [`assert_caught`] for a primitive flaw.
fn assert_primitive_caught(flaw: PrimitiveFlaw, always: &[&str], sometimes: &[&str]) {
    assert_fails_between(failing_primitives(flaw), always, sometimes);
}

/// `failed` holds every scenario of `always`, and nothing outside `always` and `sometimes`.
fn assert_fails_between(failed: BTreeSet<String>, always: &[&str], sometimes: &[&str]) {
    let (always, sometimes) = (set(always), set(sometimes));
    assert!(failed.is_superset(&always), "{failed:?} misses {always:?}");
    let allowed: BTreeSet<String> = always.union(&sometimes).cloned().collect();
    assert!(
        failed.is_subset(&allowed),
        "{failed:?} fails scenarios outside {allowed:?}"
    );
}

#[test]
fn fixed_lock_value_is_caught() {
    assert_caught(
        Flaw::FixedValue,
        &[
            "extend_after_expiry_not_held",
            // The lost guard's release on drop frees the next holder's lock.
            "extend_honours_ttl",
            // A retry after a lost reply cannot tell its own grant from anyone's: it waits
            // (a lock's, a multi-lock's, a campaign's).
            "lost_acquire_reply_is_retried_safely",
            "lost_campaign_reply_is_retried_safely",
            "lost_multi_lock_reply_is_retried_safely",
            "lost_signal_on_expiry",
            "mutual_exclusion_across_expiry",
            "no_resurrection",
            "release_racing_expiry_keeps_next_holder",
            "stale_release_keeps_new_holder",
            // The new leader's value is the old one's: the old leader's renewals extend it.
            "revoked_leader_notices_while_renewing",
        ],
        // The deposed leader's release on drop frees the new leader's lock, when it lands
        // before the new leader resigns.
        &["old_leader_lost_before_new_leader"],
    );
}

#[test]
fn read_then_delete_release_is_caught() {
    // The delete, sent after the pause, frees the lock a racing client took at the expiry: the
    // suite races a client that polls hard, so this scenario catches it every time.
    let always = ["release_racing_expiry_keeps_next_holder"];
    // The same race after the watchdog's release at the maximum hold time is hit only when a
    // polling waiter comes in between the GET and the DEL: on a loaded machine, not every run.
    let sometimes = ["auto_renew_stops_at_max_hold"];
    assert_caught(Flaw::ReadThenDelete, &always, &sometimes);
}

#[test]
fn lease_never_renewed_is_caught() {
    assert_eq!(
        failing(Flaw::NeverRenewed),
        set(&[
            "auto_renew_keeps_lock",
            "auto_renew_stops_at_max_hold",
            "extend_after_expiry_not_held",
            "extend_honours_ttl",
            "lost_signal_on_revoke",
            "no_resurrection",
            // A member revoked behind a set is never noticed: the false renewals keep it valid.
            "multi_lock_lost_when_any_member_is_lost",
            // Nor a leader's key deleted behind it.
            "revoked_leader_notices_while_renewing",
            "revocation_noticed",
        ])
    );
}

#[test]
fn spinning_waiter_is_caught() {
    assert_eq!(
        failing(Flaw::SpinningWaiter),
        set(&["waiter_does_not_spin"])
    );
}

#[test]
fn getset_timestamp_lock_is_caught() {
    assert_caught(
        Flaw::GetsetTimestamp,
        // Its value is a new expiry each attempt: a retry after a lost reply cannot know its
        // own grant, and waits for it to expire.
        &[
            "lost_acquire_reply_is_retried_safely",
            "lost_campaign_reply_is_retried_safely",
            "lost_multi_lock_reply_is_retried_safely",
            "skewed_clock_cannot_steal",
            // The candidate's GETSET takes over a timestamp its clock says has passed.
            "skewed_candidate_cannot_depose_leader",
        ],
        // Its extend compares and writes in two steps: one racing another client's GETSET of
        // the expired timestamp overwrites the new holder's value, and both act at once (seen
        // in 1 full run of many).
        &["mutual_exclusion_across_expiry"],
    );
}

#[test]
fn fencing_counter_reset_when_idle_is_caught() {
    assert_eq!(
        failing(Flaw::FencingResetsWhenIdle),
        set(&["fencing_tokens_increase"])
    );
}

#[test]
fn fencing_counter_expiring_after_five_idle_ttls_is_caught() {
    assert_eq!(
        failing(Flaw::FencingExpiresAfterFiveTtls),
        set(&["fencing_tokens_increase"])
    );
}

#[test]
fn early_expiry_is_caught() {
    // A client polling every millisecond meets the early end in these, every run.
    let always = [
        "auto_renew_stops_at_max_hold",
        "expiry_frees_crashed_holder_after_ttl",
        "extend_honours_ttl",
    ];
    // These take over with waiting lock() calls, whose backoff can sleep past the 10 % window
    // (a new leader's campaign is one).
    let sometimes = [
        "lost_signal_on_expiry",
        "mutual_exclusion_across_expiry",
        "old_leader_lost_before_new_leader",
        // A waiter on the crashed holder's lock wins before its validity deadline when its
        // poll falls in the early 10 %.
        "expired_lease_hands_over_promptly",
    ];
    assert_caught(Flaw::EarlyExpiry, &always, &sometimes);
}

#[test]
fn quick_read_then_delete_release_is_caught() {
    // Releases sent 1 to 3 ms before the expiry, with a racer polling every millisecond, put
    // the 3 ms gap across the expiry.
    let always = ["release_racing_expiry_keeps_next_holder"];
    // As for the slow variant: hit when a polling waiter comes in between.
    let sometimes = ["auto_renew_stops_at_max_hold"];
    // The 3 ms gap is hit by timing: on a saturated machine every release point of one run can
    // land outside it (seen once, in a fresh-clone run of the whole test command). The claim is
    // "caught within three runs of the suite"; every run must stay within the allowed set.
    for run in 1..=3 {
        let failed = failing(Flaw::ReadThenDeleteQuick);
        if run == 3 || failed.is_superset(&set(&always)) {
            return assert_fails_between(failed, &always, &sometimes);
        }
        assert_fails_between(failed, &[], &[&always[..], &sometimes[..]].concat());
    }
}

#[test]
fn path_normalising_keys_are_caught() {
    assert_eq!(failing(Flaw::PathNormalised), set(&["hostile_names"]));
}

#[test]
fn polling_while_declaring_notify_is_caught() {
    assert_caught(
        Flaw::PollsDeclaringNotify,
        // A release just after the waiter's first attempt waits for the next poll too.
        &[
            "missed_wakeup_hands_over_promptly",
            "notify_hands_over_promptly",
        ],
        // A force release is seen at the next poll: later than 400 ms unless the revocation
        // falls in the last 35 ms of the 435 ms interval.
        &["revoked_lock_hands_over_promptly"],
    );
}

#[test]
fn safety_ttl_then_expire_is_caught() {
    assert_caught(
        Flaw::SafetyTtlThenExpire,
        // A lock(), and a lock_all of such locks, cancelled between its two requests.
        &[
            "cancelled_acquire_leaves_nothing",
            "cancelled_lock_all_leaves_nothing",
        ],
        // A waiter dropped between its SET NX and its PEXPIRE leaves three TTLs (60 s): hit
        // when its poll falls in the 20 ms before the drop. A set's member taken the same way.
        &[
            "grant_at_drop_leaves_nothing",
            "cancelled_set_take_leaves_nothing",
        ],
    );
}

#[test]
fn cancelled_waiter_behind_another_leaving_its_entry_is_caught() {
    assert_eq!(
        failing(Flaw::CancelLeavesEntryBehindOthers),
        set(&["cancelled_wait_leaves_nothing"])
    );
}

#[test]
fn wakeup_missed_before_subscribing_is_caught() {
    assert_eq!(
        failing(Flaw::SubscribesAfterFailedAttempt),
        // A force release publishes nothing: the waiter sees it at its 2 s safety poll.
        set(&[
            "missed_wakeup_hands_over_promptly",
            "revoked_lock_hands_over_promptly",
        ])
    );
}

#[test]
fn herd_behind_a_declared_queue_is_caught() {
    assert_eq!(
        failing(Flaw::HerdDeclaringQueue),
        // A force release publishes nothing: the waiters see it at their 1 s poll.
        set(&["hand_over_without_herd", "revoked_lock_hands_over_promptly"])
    );
}

#[test]
fn retry_waiting_on_its_own_lost_grant_is_caught() {
    assert_eq!(
        failing(Flaw::RetryWaitsOnOwnGrant),
        set(&[
            "lost_acquire_reply_is_retried_safely",
            "lost_campaign_reply_is_retried_safely",
            "lost_multi_lock_reply_is_retried_safely",
        ])
    );
}

#[test]
fn lock_granted_to_a_dropped_waiter_is_caught() {
    assert_eq!(
        failing(Flaw::GrantedWaiterLeaks),
        set(&["grant_at_drop_leaves_nothing"])
    );
}

#[test]
fn namespace_left_out_of_keys_is_caught() {
    assert_eq!(
        failing(Flaw::NamespaceIgnored),
        set(&["namespaces_are_independent"])
    );
}

/// Runs the primitive scenarios against the memory backend wrapped with `flaw`; the failing ones.
fn failing_primitives(flaw: PrimitiveFlaw) -> BTreeSet<String> {
    failed_scenarios(
        flaw,
        primitives::shared(WrappedHarness::new(flaw)),
        primitives::is_primitive_scenario,
        false,
    )
}

#[test]
fn primitives_without_a_flaw_pass() {
    assert_eq!(failing_primitives(PrimitiveFlaw::None), set(&[]));
}

#[test]
fn a_permit_too_many_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::LimitPlusOne),
        set(&[
            "permits_never_exceed_the_limit",
            // The crashed holder's permit is not missed: a third of two was free.
            "crashed_permit_returns_after_its_ttl",
            // A third holder beside two renewed ones.
            "renewed_permit_counts_and_expires_on_time",
            // The waiter takes the third permit of two at once: it never waits.
            "permit_won_by_waiting_returns_after_crash",
            // Nor behind the holder of a semaphore of one.
            "cancelled_permit_acquire_leaves_nothing",
            "freed_permit_hands_over_promptly",
            "skewed_client_cannot_sweep_permits",
        ])
    );
}

#[test]
fn limits_split_per_client_are_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::LimitSplitPerClient),
        set(&["permit_limit_disagreement_is_refused"])
    );
}

#[test]
fn writers_sharing_with_readers_are_caught() {
    let failed = failing_primitives(PrimitiveFlaw::WritersShare);
    // Exclusive taken as shared breaks every primitive built on the mutex too.
    for caught in [
        "readers_share_and_writers_exclude",
        "multi_lock_is_all_or_nothing",
        "one_leader_at_a_time",
    ] {
        assert!(failed.contains(caught), "{caught} missing from {failed:?}");
    }
}

#[test]
fn a_leader_replaced_before_its_lost_signal_is_caught() {
    let failed = failing_primitives(PrimitiveFlaw::LeaseEndsEarly);
    assert!(
        failed.contains("old_leader_lost_before_new_leader"),
        "{failed:?}"
    );
}

#[test]
fn a_permit_outliving_its_crashed_holder_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::PermitOutlivesCrash),
        set(&[
            "crashed_permit_returns_after_its_ttl",
            "permit_won_by_waiting_returns_after_crash",
        ])
    );
}

#[test]
fn readers_starving_a_waiting_writer_are_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::WritersDoNotQueue),
        set(&[
            "waiting_writer_is_not_starved",
            "writer_waiting_past_its_marks_holds_readers_back",
        ])
    );
}

#[test]
fn a_sequence_declared_atomic_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::MultiIsASequence),
        set(&["atomic_multi_lock_is_never_seen_partial"])
    );
}

#[test]
fn sets_taken_in_each_clients_order_are_caught() {
    let failed = failing_primitives(PrimitiveFlaw::MultiInClientOrder);
    // A try_lock_all waiting for a busy member breaks the other set scenarios too.
    assert!(
        failed.contains("multi_locks_in_opposite_orders_never_deadlock"),
        "{failed:?}"
    );
}

#[test]
fn a_writer_renewed_as_a_share_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::WriterRenewedAsShare),
        set(&["renewed_writer_still_excludes_readers"])
    );
}

#[test]
fn a_permit_renewed_too_short_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::PermitRenewalShortens),
        set(&["renewed_permit_counts_and_expires_on_time"])
    );
}

#[test]
fn a_permit_renewed_too_long_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::PermitRenewalLengthens),
        set(&["renewed_permit_counts_and_expires_on_time"])
    );
}

#[test]
fn a_queued_permit_without_its_ttl_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::QueuedPermitLeaks),
        set(&["permit_won_by_waiting_returns_after_crash"])
    );
}

#[test]
fn a_queued_reader_without_its_ttl_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::QueuedReaderLeaks),
        set(&["reader_won_by_waiting_returns_after_crash"])
    );
}

#[test]
fn a_queued_writer_without_its_ttl_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::QueuedWriterLeaks),
        set(&["writer_won_by_waiting_returns_after_crash"])
    );
}

#[test]
fn a_leader_blind_to_its_revocation_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::RenewalBlindToRevocation),
        set(&[
            "revoked_leader_notices_while_renewing",
            // The set's renewal of the revoked member succeeds too.
            "multi_lock_lost_when_any_member_is_lost",
            // The declared prompt detection never comes.
            "lost_detection_as_declared",
            "revocation_noticed",
        ])
    );
}

#[test]
fn a_writer_mark_that_lapses_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::WriterMarkLapses),
        set(&["writer_waiting_past_its_marks_holds_readers_back"])
    );
}

#[test]
fn a_late_wake_on_a_freed_permit_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::PermitWakeLate),
        set(&[
            "freed_permit_hands_over_promptly",
            // Its waiter's 1 s lease ran out during the late wake: the permit is back at once.
            "permit_won_by_waiting_returns_after_crash",
        ])
    );
}

#[test]
fn a_late_wake_when_the_last_reader_leaves_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::LastReaderWakeLate),
        set(&[
            "last_reader_leaving_hands_over_promptly",
            // Its writer's 1 s lease ran out during the late wake: the lock is free at once.
            "writer_won_by_waiting_returns_after_crash",
        ])
    );
}

#[test]
fn a_late_wake_at_a_lease_expiry_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::ExpiryWakeLate),
        set(&["expired_lease_hands_over_promptly"])
    );
}

#[test]
fn a_late_wake_at_a_force_release_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::RevokeWakeLate),
        set(&["revoked_lock_hands_over_promptly"])
    );
}

#[test]
fn a_set_given_its_ttl_a_round_trip_late_is_caught() {
    assert_primitive_caught(
        PrimitiveFlaw::SetTtlSetLater,
        // A try_lock_all, and a lock_all (its attempts are the same request), cancelled in the
        // round trip.
        &[
            "cancelled_set_take_leaves_nothing",
            "cancelled_lock_all_leaves_nothing",
        ],
        // Its takes last a round trip longer (20 ms): on a loaded machine the observer of the
        // partial-set scenario may not count its 100 looks inside attempts in time.
        &["atomic_multi_lock_is_never_seen_partial"],
    );
}

#[test]
fn permits_swept_by_a_clients_clock_are_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::PermitSweepByClientClock),
        set(&["skewed_client_cannot_sweep_permits"])
    );
}

#[test]
fn a_leader_judged_by_a_candidates_clock_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::LeaderJudgedByClientClock),
        set(&["skewed_candidate_cannot_depose_leader"])
    );
}

#[test]
fn a_loss_reported_late_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::LossReportedLate),
        set(&["lost_detection_as_declared", "revocation_noticed"])
    );
}

#[test]
fn a_share_given_its_ttl_a_round_trip_late_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::ShareTtlSetLater),
        set(&["cancelled_shared_acquire_leaves_nothing"])
    );
}

#[test]
fn a_permit_given_its_ttl_a_round_trip_late_is_caught() {
    assert_eq!(
        failing_primitives(PrimitiveFlaw::PermitTtlSetLater),
        set(&["cancelled_permit_acquire_leaves_nothing"])
    );
}
