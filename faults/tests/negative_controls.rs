//! The fault scenarios catch the classic fault-time mistakes, shown on a toy service built
//! correct or with one deliberate flaw (assertions are exact: each flaw is caught by its
//! scenario, and only by it).

use conformance::{FaultCell, FaultOutcome};
use faults::toy::{Flaw, ToyService};
use faults::{partition, server_restart};

async fn run(flaw: Flaw) -> (FaultCell, FaultCell) {
    let mut svc = ToyService::new(flaw);
    let mut restart = FaultCell::new("toy", "server_restart");
    server_restart(&mut svc, &mut restart).await.unwrap();
    let mut part = FaultCell::new("toy", "partition");
    partition(&mut svc, &mut part).await.unwrap();
    (restart, part)
}

fn violations(c: &FaultCell) -> Vec<(&str, u64)> {
    c.counts
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| (k.as_str(), *v))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correct_service_holds_under_restart_and_partition() {
    let (restart, part) = run(Flaw::None).await;
    assert_eq!(violations(&restart), vec![], "{restart:?}");
    assert_eq!(violations(&part), vec![], "{part:?}");
    assert!(part.margin_ms.unwrap() > 0.0, "{part:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_counter_reset_by_a_restart_is_caught_by_server_restart() {
    let (restart, part) = run(Flaw::CounterResetsOnRestart).await;
    // Tokens went back twice: the waiter's after the holder's, and not again after that
    // (the relock after the waiter gets the next value of the fresh counter).
    assert_eq!(
        violations(&restart),
        vec![("token_regressions", 1)],
        "{restart:?}"
    );
    assert_eq!(violations(&part), vec![], "{part:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_signal_after_another_client_won_is_caught_by_partition() {
    let (restart, part) = run(Flaw::LateLostSignal).await;
    assert_eq!(violations(&restart), vec![], "{restart:?}");
    assert_eq!(
        violations(&part),
        vec![("lost_after_other_won", 1)],
        "{part:?}"
    );
    assert!(part.margin_ms.unwrap() < 0.0, "{part:?}");
}

#[test]
fn outcome_is_set_by_the_runner_not_the_scenario() {
    // The scenarios only count; run_fault turns a non-zero violation count into a violation.
    assert_eq!(FaultCell::new("toy", "x").outcome, FaultOutcome::Holds);
}
