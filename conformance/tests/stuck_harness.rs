//! A scenario whose harness never delivers a client where the scenario makes one off its
//! runtime (on a thread of its own): the scenario fails by itself, in time, and leaves no
//! blocking task behind that its runtime's drop would wait for (the CI run that hung for 85
//! minutes could not end such a trial, whatever its timeout).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use conformance::{Harness, Status, run_scenario_bounded, scenario_timeout, scenarios};
use lockcore::backend::Backend;
use lockcore::memory::MemoryBackend;
use lockcore::{Locker, Result};

/// Memory clients, the first only: every later `client()` never returns (a connect that hangs).
struct SecondClientHangs {
    store: String,
    clients: AtomicU64,
}

#[async_trait]
impl Harness for SecondClientHangs {
    fn label(&self) -> String {
        "second-client-hangs".into()
    }

    async fn client(&self) -> Result<Locker> {
        if self.clients.fetch_add(1, Ordering::SeqCst) > 0 {
            std::future::pending::<()>().await;
        }
        Ok(Locker::new(MemoryBackend::connect(&self.store)))
    }
}

#[test]
fn a_waiter_whose_client_never_connects_leaves_no_blocking_task() {
    let Some(scenario) = scenarios::all()
        .into_iter()
        .find(|s| s.name == "waiter_does_not_spin")
    else {
        panic!("no scenario waiter_does_not_spin");
    };
    let caps = MemoryBackend::connect("caps").capabilities().clone();
    let harness = std::sync::Arc::new(SecondClientHangs {
        store: format!("stuck-harness-{:016x}", fastrand::u64(..)),
        clients: AtomicU64::new(0),
    });
    // A small scale: the scenario's timeout is 9 s; its own bound on the waiter under 2 s.
    let scale = 0.05;
    let start = Instant::now();
    let result = run_scenario_bounded(scenario, harness, caps, scale);
    let took = start.elapsed();
    let reason = result.reason.unwrap_or_default();
    assert_eq!(result.status, Status::Fail, "{reason}");
    assert!(
        !reason.contains("blocking task"),
        "the stuck waiter was left running where the runtime's drop waits for it: {reason}"
    );
    assert!(
        reason.contains("the waiter had not returned"),
        "the scenario did not bound its waiter: {reason}"
    );
    assert!(
        took < scenario_timeout(scale) + Duration::from_secs(5),
        "took {took:?}"
    );
}
