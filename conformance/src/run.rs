//! Running scenarios: as libtest tests, or collected into a report.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lockcore::{Capabilities, Instant};
use serde::Serialize;

use crate::bounded;
use crate::harness::Harness;
use crate::measure::{Figures, measure};
use crate::scenarios::{self, Ctx, Scenario};

/// Multiplies every time bound in the scenarios; set `LOCK_TEST_TIME_SCALE` on slow machines.
pub const TIME_SCALE_ENV: &str = "LOCK_TEST_TIME_SCALE";

/// The time scale from [`TIME_SCALE_ENV`], 1.0 by default.
pub fn time_scale() -> f64 {
    std::env::var(TIME_SCALE_ENV)
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0)
        .unwrap_or(1.0)
}

/// How one scenario ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// It passed.
    Pass,
    /// It failed; the reason says how.
    Fail,
    /// The backend cannot support it (a capability it does not declare); never counted as passed.
    Unsupported,
    /// It was not run (for example: no server URL given).
    Skipped,
}

impl Status {
    /// A short label.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Unsupported => "unsupported",
            Status::Skipped => "skipped",
        }
    }
}

/// One scenario's result against one backend.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioResult {
    /// The scenario's name.
    pub scenario: String,
    /// How it ended.
    pub status: Status,
    /// Why it did not pass.
    pub reason: Option<String>,
    /// What it measured, where it reports a figure (passed or not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed: Option<String>,
    /// How long it ran, in milliseconds.
    pub millis: u64,
}

/// Everything measured about one backend.
#[derive(Clone, Debug, Serialize)]
pub struct BackendReport {
    /// The harness label.
    pub label: String,
    /// The backend as it describes itself (secrets redacted).
    pub backend: String,
    /// The server's name and version as it reports it (`None` for the embedded backends, a
    /// backend that cannot say, or no connection).
    pub server_version: Option<String>,
    /// The declared capabilities (`None` if no client could connect).
    pub capabilities: Option<Capabilities>,
    /// The backend's whole compatibility table
    /// ([`Capabilities::compatibility_table`]); each client cell's result is its `compat_`
    /// scenario's.
    pub compatibility: Option<lockcore::Compatibility>,
    /// One result per scenario, in suite order.
    pub results: Vec<ScenarioResult>,
    /// Latency and hand-over figures, if measured.
    pub figures: Option<Figures>,
    /// Why nothing ran, if a client could not connect.
    pub error: Option<String>,
}

/// Progress of a report run, for a terminal.
#[derive(Clone, Debug)]
pub enum Progress<'a> {
    /// A scenario ended.
    Scenario {
        /// The backend's label.
        label: &'a str,
        /// How many scenarios have ended, this one included.
        done: usize,
        /// How many there are.
        total: usize,
        /// Its result.
        result: &'a ScenarioResult,
    },
    /// The benchmark started.
    Measuring {
        /// The backend's label.
        label: &'a str,
    },
}

/// The longest a scenario may run before it counts as hung.
pub fn scenario_timeout(scale: f64) -> Duration {
    Duration::from_secs(180).mul_f64(scale)
}

/// Runs one scenario against a harness whose capabilities are known.
///
/// Cancel safety: dropping the future abandons the scenario; its locks are released in the
/// background or expire after their TTL.
pub async fn run_scenario(
    scenario: Scenario,
    harness: Arc<dyn Harness>,
    caps: &Capabilities,
    scale: f64,
) -> ScenarioResult {
    let start = Instant::now();
    let (status, reason, observed) = match (scenario.applies)(caps, &*harness) {
        Err(why) => (Status::Unsupported, Some(why.to_string()), None),
        Ok(()) => {
            let ctx = Ctx::new(harness, caps.clone(), scenario.name, scale);
            let (status, reason) =
                match tokio::time::timeout(scenario_timeout(scale), (scenario.run)(&ctx)).await {
                    Ok(Ok(())) => (Status::Pass, None),
                    Ok(Err(why)) => (Status::Fail, Some(why)),
                    Err(_) => (
                        Status::Fail,
                        Some(format!("hung for {:?}", scenario_timeout(scale))),
                    ),
                };
            (status, reason, ctx.observed())
        }
    };
    ScenarioResult {
        scenario: scenario.name.to_string(),
        status,
        reason,
        observed,
        millis: start.elapsed().as_millis() as u64,
    }
}

/// What a scenario may take beyond [`scenario_timeout`] on its own thread: its runtime's timer
/// ends it first when timers still run; this is for when they do not.
const THREAD_SLACK: Duration = Duration::from_secs(60);

/// [`run_scenario`] on a thread and a runtime of its own, waited for with a bound: a scenario
/// that hangs where its timeout cannot end it (a blocking call on a runtime thread, a `Drop`
/// that blocks) fails, saying so, after [`scenario_timeout`] and a slack; one whose blocking
/// tasks still run 10 s after it ended fails too (something it called never returns). The
/// thread of a hung scenario is left behind; the process ends it.
pub fn run_scenario_bounded(
    scenario: Scenario,
    harness: Arc<dyn Harness>,
    caps: Capabilities,
    scale: f64,
) -> ScenarioResult {
    let name = scenario.name;
    let bound = scenario_timeout(scale) + THREAD_SLACK.mul_f64(scale) + bounded::SHUTDOWN;
    let start = Instant::now();
    let ran = bounded::on_own_thread(format!("scenario {name}"), bound, bounded::SHUTDOWN, {
        move || async move { run_scenario(scenario, harness, &caps, scale).await }
    });
    match ran {
        Ok(result) => result,
        Err((hung, result)) => {
            let mut result = result.unwrap_or_else(|| ScenarioResult {
                scenario: name.to_string(),
                status: Status::Fail,
                reason: None,
                observed: None,
                millis: start.elapsed().as_millis() as u64,
            });
            let before = result.reason.take().map(|r| format!(" ({r})"));
            result.status = Status::Fail;
            result.reason = Some(format!("{hung}{}", before.unwrap_or_default()));
            result
        }
    }
}

/// Runs every scenario against `harness` (a few at a time), then measures it when `measure_it`,
/// reporting progress as it goes.
///
/// Cancel safety: as [`run_scenario`].
pub async fn run_all(
    harness: Arc<dyn Harness>,
    measure_it: bool,
    progress: impl FnMut(Progress<'_>),
) -> BackendReport {
    run_selected(harness, measure_it, |_| true, progress).await
}

/// [`run_all`] for the scenarios whose name `selected` accepts only (the others are left out
/// of the report).
///
/// Cancel safety: as [`run_scenario`].
pub async fn run_selected(
    harness: Arc<dyn Harness>,
    measure_it: bool,
    selected: impl Fn(&str) -> bool,
    mut progress: impl FnMut(Progress<'_>),
) -> BackendReport {
    let label = harness.label();
    let scale = time_scale();
    let probe = match harness.client().await {
        Ok(c) => c,
        Err(e) => {
            return BackendReport {
                label,
                backend: String::new(),
                server_version: None,
                capabilities: None,
                compatibility: None,
                results: scenarios::all()
                    .iter()
                    .filter(|s| selected(s.name))
                    .map(|s| ScenarioResult {
                        scenario: s.name.to_string(),
                        status: Status::Fail,
                        reason: Some(format!("could not connect: {e}")),
                        observed: None,
                        millis: 0,
                    })
                    .collect(),
                figures: None,
                error: Some(e.to_string()),
            };
        }
    };
    let caps = probe.capabilities().clone();
    let backend = probe.describe();
    let server_version = probe.backend().server_version().await;
    drop(probe);
    let all: Vec<_> = scenarios::all()
        .into_iter()
        .filter(|s| selected(s.name))
        .collect();
    let total = all.len();
    let mut results = Vec::with_capacity(total);
    let mut stream = futures::stream::iter(all.into_iter().map(|s| {
        let (harness, caps, name) = (harness.clone(), caps.clone(), s.name);
        async move {
            let bounded =
                tokio::task::spawn_blocking(move || run_scenario_bounded(s, harness, caps, scale));
            bounded.await.unwrap_or_else(|e| ScenarioResult {
                scenario: name.to_string(),
                status: Status::Fail,
                reason: Some(format!("its thread panicked: {e}")),
                observed: None,
                millis: 0,
            })
        }
    }))
    .buffered(4);
    while let Some(result) = stream.next().await {
        results.push(result);
        progress(Progress::Scenario {
            label: &label,
            done: results.len(),
            total,
            result: results.last().expect("just pushed"),
        });
    }
    drop(stream);
    let figures = if measure_it {
        progress(Progress::Measuring { label: &label });
        measure(&*harness).await.ok()
    } else {
        None
    };
    BackendReport {
        label,
        backend,
        server_version,
        compatibility: Some(caps.compatibility_table()),
        capabilities: Some(caps),
        results,
        figures,
        error: None,
    }
}
