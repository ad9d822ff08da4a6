//! Every scenario, written once, by family (one file each), and [`all`]: the one list that
//! registers them, in report order.
//!
//! Modules use one another in one direction only: this list uses the families and
//! `applies`; a family uses `support` and `context`; `support` uses `context`.

mod applies;
mod basics;
mod cancel_points;
mod cancellation;
mod compat;
mod context;
mod election;
mod expiry;
mod fencing;
mod handover;
mod herd;
mod inspect;
mod latency;
mod leadership;
mod lost_replies;
mod lost_reply_modes;
mod multi;
mod multi_progress;
mod names;
mod primitive_leases;
mod primitives;
mod renewal;
mod silent;
mod skew;
mod support;
mod waiting;

use std::future::Future;

use crate::harness::BoxFuture;

use self::applies::{
    always, needs_atomic_multi, needs_clock_skew, needs_counting, needs_extend_sets_ttl,
    needs_fair, needs_fencing, needs_inspect, needs_lease_loss, needs_lost_detection,
    needs_lost_replies, needs_native_renewal, needs_notified_permits, needs_notified_revoke,
    needs_notified_shared, needs_notify, needs_other_namespace, needs_permit_expiry, needs_permits,
    needs_reply_delay, needs_revoke, needs_shared, needs_shared_expiry, needs_shared_fencing,
    needs_shared_notify, needs_skewed_client, needs_skewed_permits, needs_ttl_expiry,
};
pub(crate) use self::compat::scenario_name as compat_scenario_name;
pub use self::context::{Ctx, Failure, Outcome, Scenario};
use self::waiting::needs_thread_cpu_clock;

fn boxed<'a, F: Future<Output = Outcome> + Send + 'a>(f: F) -> BoxFuture<'a, Outcome> {
    Box::pin(f)
}

/// A scenario from its family's module and body function; the function's name is the
/// scenario's name.
macro_rules! scenario {
    ($family:ident :: $name:ident, $applies:expr, $summary:expr) => {
        Scenario {
            name: stringify!($name),
            summary: $summary,
            applies: $applies,
            run: |ctx| boxed($family::$name(ctx)),
        }
    };
}

/// Every scenario, in report order.
pub fn all() -> Vec<Scenario> {
    vec![
        scenario!(
            basics::acquire_release_reacquire,
            always,
            "a lock can be taken, released and taken again"
        ),
        scenario!(
            basics::try_lock_contended_returns_none,
            always,
            "try_lock on a held lock returns Ok(None), not an error"
        ),
        scenario!(
            basics::independent_names,
            always,
            "locks with different names do not interfere"
        ),
        scenario!(
            basics::reentrancy_as_declared,
            always,
            "a holder taking its own lock again is refused unless reentrancy is declared"
        ),
        scenario!(
            waiting::wait_deadline_honoured,
            always,
            "lock() on a held lock returns Timeout at its deadline, within a bound"
        ),
        scenario!(
            waiting::waiter_does_not_spin,
            needs_thread_cpu_clock,
            "a waiting lock() sleeps until notified or its next poll; it does not spin"
        ),
        scenario!(
            waiting::wait_succeeds_on_release,
            always,
            "a waiting lock() gets the lock soon after the holder releases"
        ),
        scenario!(
            cancellation::cancelled_wait_leaves_nothing,
            always,
            "dropping a pending lock() leaves no lock and no queue entry behind"
        ),
        scenario!(
            cancellation::given_up_waiters_leave_nothing,
            always,
            "waiters that gave up (a wait timeout, a dropped lock()) and then shut their client down leave nothing behind: the next holder gets the lock within 1 s of the release"
        ),
        scenario!(
            silent::wait_deadline_against_a_silent_server,
            needs_lost_replies,
            "against a server that answers nothing, lock() returns Unavailable (Timeout where the backend bounds its requests by the deadline) by its wait deadline plus the stated slack, and Unavailable without a deadline after its retry_unavailable_for (2 s), not after every attempt's response timeout"
        ),
        scenario!(
            cancel_points::cancelled_acquire_leaves_nothing,
            always,
            "an acquire cancelled at any point (on the way to a free lock; waiting, just after the holder's release) leaves the lock free within the TTL + 250 ms"
        ),
        scenario!(
            cancel_points::cancelled_shared_acquire_leaves_nothing,
            needs_shared,
            "read-write lock: a reader's acquire cancelled at any point (on the way to a free lock; waiting behind a writer, just after its release) leaves no share: a writer gets the lock within the TTL + 250 ms"
        ),
        scenario!(
            cancel_points::cancelled_permit_acquire_leaves_nothing,
            needs_permits,
            "semaphore of one permit: an acquire cancelled at any point (on the way to a free permit; waiting, just after the holder gave it back) leaves the permit free within the TTL + 250 ms"
        ),
        scenario!(
            cancel_points::cancelled_lock_all_leaves_nothing,
            always,
            "a lock_all of 3 names cancelled at any point (on the way to a free set; waiting on a busy member, just after its release) leaves every member free within the TTL + 250 ms"
        ),
        scenario!(
            basics::mutual_exclusion_under_contention,
            always,
            "N clients x M tasks never overlap inside the critical section"
        ),
        scenario!(
            expiry::expiry_frees_crashed_holder_after_ttl,
            needs_ttl_expiry,
            "a crashed holder's lock frees after the TTL, and not before"
        ),
        scenario!(
            expiry::crash_frees_lock,
            always,
            "a crashed holder's lock becomes free within its TTL plus a bound"
        ),
        scenario!(
            expiry::extend_after_expiry_not_held,
            needs_lease_loss,
            "extending a lease that ran out returns NotHeld and changes nothing"
        ),
        scenario!(
            expiry::stale_release_keeps_new_holder,
            needs_lease_loss,
            "a stale holder's release does not free the new holder's lock"
        ),
        scenario!(
            expiry::release_racing_expiry_keeps_next_holder,
            needs_ttl_expiry,
            "a release sent as the lease runs out never frees the next holder's lock"
        ),
        scenario!(
            fencing::fencing_tokens_increase,
            needs_fencing,
            "fencing tokens strictly increase across holders, expiry takeover and idle periods included"
        ),
        scenario!(
            fencing::no_fencing_still_excludes,
            always,
            "holders that ask for no fencing token still exclude each other, and a token asked for after them is above the one before"
        ),
        scenario!(
            renewal::auto_renew_keeps_lock,
            always,
            "auto-renewal keeps the lock past several TTLs"
        ),
        scenario!(
            renewal::auto_renew_stops_at_max_hold,
            always,
            "auto-renewal stops at the maximum hold time and the lock frees"
        ),
        scenario!(
            renewal::lost_signal_on_expiry,
            always,
            "the lost signal fires when the lease runs out, before a waiting client wins the lock"
        ),
        scenario!(
            renewal::lost_signal_on_revoke,
            needs_revoke,
            "a lock taken away behind its holder fires the lost signal at the next renewal, before the validity ends"
        ),
        scenario!(
            renewal::lost_detection_as_declared,
            needs_lost_detection,
            "a lock taken away behind a holder that does not renew (TTL 30 s): the backend's own detection fires its lost signal within the bound loss_detection declares (pushed within X, checked every X) plus a scaled 150 ms"
        ),
        scenario!(
            renewal::revocation_noticed,
            needs_revoke,
            "force_release behind a renewing holder: its lost signal fires within the declared loss_detection bound plus a scaled 150 ms where one is declared (TTL 30 s: no renewal explains it), else by its next renewal"
        ),
        scenario!(
            waiting::fifo_order,
            needs_fair,
            "8 waiters, each seen queued before the next comes, are served in arrival order where fairness is declared"
        ),
        scenario!(
            waiting::notify_hands_over_promptly,
            needs_notify,
            "a backend declaring notification hands a released lock to a waiter far faster than any poll interval"
        ),
        scenario!(
            renewal::native_lease_ends_with_session,
            needs_native_renewal,
            "a backend declaring native renewal frees a crashed holder's lock with its session, long before the TTL"
        ),
        scenario!(
            basics::drop_releases_promptly,
            always,
            "dropping a guard releases the lock within a bound, long before its TTL"
        ),
        scenario!(
            names::hostile_names,
            always,
            "every valid hostile name works as its own lock: no InvalidName, no collision"
        ),
        scenario!(
            names::names_are_exact_byte_strings,
            always,
            "names are case-sensitive byte strings distinct over their whole length: no folding, normalisation or truncation"
        ),
        scenario!(
            expiry::extend_honours_ttl,
            needs_extend_sets_ttl,
            "extend(ttl) sets the lease to the TTL given, longer and shorter than before"
        ),
        scenario!(
            expiry::no_resurrection,
            needs_lease_loss,
            "release and extend on an absent or taken-over lease return NotHeld and change or create nothing"
        ),
        scenario!(
            latency::validity_counts_from_send,
            needs_reply_delay,
            "with latency on the reply path, validity counts from when the request was sent, and the holder knows it lost before a waiter wins"
        ),
        scenario!(
            skew::skewed_clock_cannot_steal,
            needs_clock_skew,
            "a client whose clock runs a minute ahead cannot take a lock that is still held"
        ),
        scenario!(
            waiting::missed_wakeup_hands_over_promptly,
            needs_notify,
            "a release in the gap between a waiter's failed attempt and its subscription still wakes it at once, not at a safety poll"
        ),
        scenario!(
            cancellation::grant_at_drop_leaves_nothing,
            always,
            "a waiter dropped at the moment it is granted the lock leaves nothing held: another client gets it long before the TTL"
        ),
        scenario!(
            cancellation::deadline_in_a_winning_attempt_leaves_nothing,
            needs_reply_delay,
            "a lock() whose deadline passes while the reply of its winning attempt is on the way returns by its deadline (or with the lock), and leaves nothing held once its client's background work is done"
        ),
        scenario!(
            names::namespaces_are_independent,
            needs_other_namespace,
            "one name in two namespaces on one server is two locks: neither excludes nor frees the other, and fencing tokens increase within each"
        ),
        scenario!(
            expiry::mutual_exclusion_across_expiry,
            always,
            "holders that overrun their lease and those that release hand over without two ever acting at once"
        ),
        scenario!(
            inspect::inspect_reports_holder,
            needs_inspect,
            "inspect from another client sees the holder's host, pid, label, token and TTL left, the waiters where known, and a free lock as free; force_release frees it and fires the holder's lost signal"
        ),
        scenario!(
            lost_replies::lost_acquire_reply_is_retried_safely,
            needs_lost_replies,
            "an acquire applied on the server whose reply is lost: lock()'s retry gets the lock within half its TTL, nobody else holds it meanwhile, and nothing stays held after its release"
        ),
        scenario!(
            lost_replies::lost_release_reply_frees_the_lock,
            needs_lost_replies,
            "a release applied on the server whose reply is lost: release() returns, the lock is free for another client at once, and the first client's retry or clean-up never frees the next holder's lock"
        ),
        scenario!(
            herd::hand_over_without_herd,
            needs_counting,
            "with 16 clients waiting on a backend that declares a queue (fair), a hand-over costs at most 10 requests of all clients together, not one or more per waiter; any other backend reports its requests per hand-over"
        ),
        scenario!(
            primitives::permits_never_exceed_the_limit,
            needs_permits,
            "a semaphore of 3 permits: 3 holders at once and not a 4th, fencing tokens increasing across permits, and 6 clients looping lock/release never more than 3 at a time"
        ),
        scenario!(
            primitives::permit_limit_disagreement_is_refused,
            needs_permits,
            "a client asking for one of 5 permits beside a holder of one of 3 is refused with a conflict (try_lock and lock, at once), not silently split; once the name is free a new limit is accepted"
        ),
        scenario!(
            primitives::crashed_permit_returns_after_its_ttl,
            needs_permit_expiry,
            "a crashed holder's permit comes back after its TTL: not before its validity deadline (a permit too many), not later than TTL + 3 s (a leak)"
        ),
        scenario!(
            primitives::readers_share_and_writers_exclude,
            needs_shared,
            "read-write lock: two readers hold together, a writer is refused beside them and holds alone, a reader or second writer is refused beside it"
        ),
        scenario!(
            primitives::waiting_writer_is_not_starved,
            needs_shared,
            "read-write lock: a reader arriving behind a waiting writer waits too; the writer gets the lock when the first reader leaves, before the later reader"
        ),
        scenario!(
            primitives::writer_that_gave_up_frees_readers,
            needs_shared,
            "read-write lock: a writer whose wait behind a reader timed out holds later readers back for 6 s at most, not for the readers' TTL (30 s)"
        ),
        scenario!(
            primitives::every_reader_woken_by_one_release,
            needs_shared_notify,
            "read-write lock: one writer's release lets all 6 readers waiting behind it (3 in each of 2 clients, safety-net poll 10 s where the backend has one) hold within 1 s"
        ),
        scenario!(
            primitives::fencing_increases_across_modes,
            needs_shared_fencing,
            "read-write lock with fencing: every reader and writer gets a token above all earlier ones, across modes"
        ),
        scenario!(
            multi::multi_lock_is_all_or_nothing,
            always,
            "a multi-lock with one busy member: try_lock_all returns None and lock_all times out, the free members left free; once free the set is taken whole, and its release frees every member"
        ),
        scenario!(
            multi::multi_locks_in_opposite_orders_never_deadlock,
            always,
            "two clients taking the same two names in opposite orders, 10 rounds each at once: every round completes (canonical order, no deadlock)"
        ),
        scenario!(
            multi::cancelled_multi_lock_leaves_nothing,
            always,
            "a lock_all dropped while waiting for its second member leaves the first free within 3 s (TTL 30 s): no partial set left behind (an atomic backend holds no member while it waits)"
        ),
        scenario!(
            multi::atomic_multi_lock_is_never_seen_partial,
            needs_atomic_multi,
            "a backend taking a set in one request: two clients take and release a set of 4 over and over while an observer holding its last name finds every other member free, every time (no part of a set is ever held)"
        ),
        scenario!(
            multi_progress::multi_lock_progresses_under_member_traffic,
            needs_fair,
            "the multi-lock's progress bound on a fair backend: while 4 clients take its two members in a loop (2 on each name, holding 2 ms), a lock_all of both gets the set within 5 s, in each of 3 rounds (not starved waiting for both to be free at one instant)"
        ),
        scenario!(
            multi::multi_lock_lost_when_any_member_is_lost,
            needs_revoke,
            "one member of a held set revoked behind its holder: the set's one lost signal fires, naming it, within a TTL"
        ),
        scenario!(
            election::one_leader_at_a_time,
            needs_inspect,
            "three candidates campaigning 4 rounds each: never two leaders, terms increasing, an observer reads the leader's value and term, a watch sees the leadership change hands"
        ),
        scenario!(
            election::old_leader_lost_before_new_leader,
            always,
            "a leader whose renewals stop is deposed when its lease runs out: its lost signal fires before the next candidate is elected"
        ),
        scenario!(
            lost_reply_modes::lost_shared_acquire_reply_is_retried_safely,
            |c, h| needs_lost_replies(c, h).and(needs_shared(c, h)),
            "a shared acquire whose reply was lost: the retry gets its own share at once, writers stay out, nothing is left behind"
        ),
        scenario!(
            lost_reply_modes::lost_permit_acquire_reply_is_retried_safely,
            |c, h| needs_lost_replies(c, h).and(needs_permits(c, h)),
            "a permit acquire whose reply was lost: the retry holds one permit, not two, and nothing is left behind"
        ),
        scenario!(
            lost_reply_modes::lost_multi_lock_reply_is_retried_safely,
            needs_lost_replies,
            "a multi-lock whose reply was lost: the retry gets the whole set at once, and nothing is left behind"
        ),
        scenario!(
            lost_reply_modes::lost_campaign_reply_is_retried_safely,
            needs_lost_replies,
            "a campaign whose reply was lost: the candidate is elected at once, alone, and nothing is left behind"
        ),
        scenario!(
            leadership::revoked_leader_notices_while_renewing,
            needs_revoke,
            "a renewing leader whose key is deleted behind it: a new leader is elected, and the old one's lost signal fires within a TTL of the deletion, from a renewal that found the key gone"
        ),
        scenario!(
            primitive_leases::renewed_writer_still_excludes_readers,
            needs_shared,
            "read-write lock: a writer renewed 6 times (every third of a TTL) still excludes readers and other writers after each renewal"
        ),
        scenario!(
            primitive_leases::renewed_permit_counts_and_expires_on_time,
            needs_permits,
            "semaphore: two holders of 2 permits renewed 6 times still fill it after each renewal; where leases end by TTL, one that then crashes gets its permit back after its validity deadline, within half a TTL (and a renewal in flight) of its lease's end"
        ),
        scenario!(
            primitive_leases::permit_won_by_waiting_returns_after_crash,
            needs_permit_expiry,
            "semaphore: a holder granted its permit from the queue (it waited) that crashes gets it back after its validity deadline, within half a TTL of its lease's end: a queued grant carries the waiter's TTL"
        ),
        scenario!(
            primitive_leases::reader_won_by_waiting_returns_after_crash,
            needs_shared_expiry,
            "read-write lock: a reader granted its share when the writer before it left (it waited) that crashes gives it back after its validity deadline, within half a TTL of its lease's end: a share granted to a waiter carries the waiter's TTL"
        ),
        scenario!(
            primitive_leases::writer_won_by_waiting_returns_after_crash,
            needs_shared_expiry,
            "read-write lock: a writer granted the lock when the reader before it left (it waited) that crashes gives it back after its validity deadline, within half a TTL of its lease's end: a writer granted from behind readers carries its TTL"
        ),
        scenario!(
            primitive_leases::writer_waiting_past_its_marks_holds_readers_back,
            needs_shared,
            "read-write lock: a writer waiting behind a reader for 6 s (past every writer's mark, queue entry and session timer) still holds back a reader tried after each second of its wait, and gets the lock when the reader leaves"
        ),
        scenario!(
            handover::freed_permit_hands_over_promptly,
            needs_notified_permits,
            "semaphore with notification: a waiter for one of 2 held permits gets the one given back within 400 ms"
        ),
        scenario!(
            handover::last_reader_leaving_hands_over_promptly,
            needs_notified_shared,
            "read-write lock with notification: a writer waiting behind two readers gets the lock within 400 ms of the last one leaving"
        ),
        scenario!(
            handover::expired_lease_hands_over_promptly,
            needs_ttl_expiry,
            "a client waiting on a crashed holder's lock gets it after the holder's validity deadline and within a quarter TTL + 500 ms of its lease's end (not TTL + 3 s)"
        ),
        scenario!(
            handover::revoked_lock_hands_over_promptly,
            needs_notified_revoke,
            "with notification: a lock force-released behind its holder while a client waits is the waiter's within 400 ms"
        ),
        scenario!(
            skew::skewed_client_cannot_sweep_permits,
            needs_skewed_permits,
            "semaphore: a client whose clock runs a minute ahead (in process, or a process under libfaketime) is refused a permit of a full one (TTL 10 s), and the holders keep theirs"
        ),
        scenario!(
            skew::skewed_candidate_cannot_depose_leader,
            needs_skewed_client,
            "election: a candidate whose clock runs a minute ahead, campaigning 500 ms against a leader with a 10 s lease, is not elected, and the leader still leads"
        ),
        scenario!(
            cancel_points::cancelled_set_take_leaves_nothing,
            always,
            "a try_lock_all of 3 free names cancelled during the take (0 to 1.5 typical takes, and 5 to 40 ms in): every member free for another client within the TTL + 250 ms"
        ),
    ]
    .into_iter()
    .chain(compat::scenarios())
    .collect()
}
