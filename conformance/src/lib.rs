//! The locksmith conformance suite: every scenario written once, run against any backend through
//! a [`Harness`], as named tests ([`run_tests`]) or as a report ([`run_all`]).
#![deny(missing_docs)]

mod bounded;
mod escape;
mod exiting;
pub mod faults;
mod harness;
pub mod holder;
pub mod interop;
mod measure;
mod proxied;
mod refusals;
pub mod report;
mod run;
pub mod scenarios;

use std::process::ExitCode;
use std::sync::Arc;

use libtest_mimic::{Arguments, Failed, Trial};

pub use exiting::exiting_waiter;
pub use faults::{FaultCell, FaultInfo, FaultMatrix, FaultOutcome};
pub use harness::{
    BoxFuture, FnHarness, Harness, HolderProcess, ReplyLoser, RequestCount, SkewedHolder,
    url_with_param, url_with_path,
};
pub use measure::{
    Figures, HandoverLatency, MEASURE_TIME, ProcessHandover, ServerRequests, measure, measure_with,
};
pub use proxied::{ClientProxies, ProxyGroup};
pub use refusals::{file_config_checks, refuses_without_leaking};
pub use report::{Provenance, Report, SCHEMA_VERSION, ScenarioInfo};
pub use run::{
    BackendReport, Progress, ScenarioResult, Status, TIME_SCALE_ENV, run_all, run_scenario,
    run_scenario_bounded, run_selected, scenario_timeout, time_scale,
};
pub use scenarios::Scenario;

/// Set (to anything) in CI: a missing server URL is then a failure, not a skip.
pub const REQUIRE_ALL_ENV: &str = "LOCK_TEST_REQUIRE_ALL";

/// Reads a server URL for a test from `var`. `None` (the caller skips, saying so) when it is
/// unset and [`REQUIRE_ALL_ENV`] is not set.
///
/// # Panics
/// When `var` is unset and [`REQUIRE_ALL_ENV`] is set: in CI a missing server is a failure.
pub fn require_env(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ if std::env::var_os(REQUIRE_ALL_ENV).is_some() => {
            panic!("{var} is not set, and {REQUIRE_ALL_ENV} says every server is required")
        }
        _ => {
            eprintln!("skipping: {var} is not set (scripts/test.sh sets it)");
            None
        }
    }
}

/// One backend variant under test: a label, the environment variable holding its URL, and how
/// to make its harness from that URL.
pub struct Target {
    label: String,
    /// The environment variable with the URL; `None` for a fixed URL.
    env_var: Option<String>,
    fixed_url: String,
    make: Box<dyn Fn(String) -> Arc<dyn Harness> + Send + Sync>,
}

impl Target {
    /// A target named `label` (test names are `label::scenario`) whose URL is read from
    /// `env_var`.
    pub fn new(
        label: impl Into<String>,
        env_var: impl Into<String>,
        make: impl Fn(String) -> Arc<dyn Harness> + Send + Sync + 'static,
    ) -> Self {
        Target {
            label: label.into(),
            env_var: Some(env_var.into()),
            fixed_url: String::new(),
            make: Box::new(make),
        }
    }

    /// A target with a fixed URL, for backends that need no server (`memory://`, a SQLite file).
    pub fn fixed(
        label: impl Into<String>,
        url: impl Into<String>,
        make: impl Fn(String) -> Arc<dyn Harness> + Send + Sync + 'static,
    ) -> Self {
        Target {
            label: label.into(),
            env_var: None,
            fixed_url: url.into(),
            make: Box::new(make),
        }
    }
}

/// Runs every scenario against every target as separately named libtest tests, taking libtest's
/// command line (filters, `--test-threads`, `--list`). Unsupported scenarios show as ignored with
/// their reason. Call it from a `harness = false` test target's `main`.
///
/// Each trial runs on its own tokio runtime, so a harness must hold configuration only, never a
/// connection: every client comes from [`Harness::client`].
pub fn run_tests(targets: Vec<Target>) -> ExitCode {
    let args = Arguments::from_args();
    let trials = targets.into_iter().flat_map(trials_for).collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// The trials of one target: one per scenario, unsupported ones ignored with kind
/// `unsupported`.
fn trials_for(target: Target) -> Vec<Trial> {
    let all = scenarios::all();
    let test_name = |s: &Scenario| format!("{}::{}", target.label, s.name);
    let env_var = target.env_var.clone().unwrap_or_default();
    let url = match target.env_var.as_ref().map(std::env::var) {
        None => target.fixed_url.clone(),
        Some(Ok(url)) if !url.is_empty() => url,
        _ if std::env::var_os(REQUIRE_ALL_ENV).is_some() => {
            let msg = format!(
                "{env_var} is not set, and {REQUIRE_ALL_ENV} says every server is required"
            );
            return vec![Trial::test(
                format!("{}::server_url", target.label),
                move || Err(msg.into()),
            )];
        }
        _ => {
            eprintln!(
                "{}: {env_var} is not set; its scenarios are skipped",
                target.label
            );
            return all
                .iter()
                .map(|s| {
                    Trial::test(test_name(s), || Err("skipped: no server URL".into()))
                        .with_ignored_flag(true)
                        .with_kind("skipped")
                })
                .collect();
        }
    };
    let harness = (target.make)(url);
    // Bounded: a server that accepts but never answers fails every scenario, loudly, at once.
    let connect_bound = std::time::Duration::from_secs(30).mul_f64(time_scale());
    let rt = bounded::runtime();
    let probe = rt.block_on(async {
        let connect = tokio::time::timeout(connect_bound, harness.client());
        let client = connect.await.map_err(|_| {
            lockcore::Error::timeout(format!("no client within {connect_bound:?}"))
        })??;
        Ok::<_, lockcore::Error>(client.capabilities().clone())
    });
    rt.shutdown_timeout(std::time::Duration::from_secs(10));
    let caps = match probe {
        Ok(caps) => caps,
        Err(e) => {
            // Loud: every scenario fails with the connection error.
            let msg = format!("could not connect a client: {e}");
            return all
                .iter()
                .map(|s| {
                    let msg = msg.clone();
                    Trial::test(test_name(s), move || Err(msg.into()))
                })
                .collect();
        }
    };
    let scale = time_scale();
    all.into_iter()
        .map(|scenario| {
            let name = test_name(&scenario);
            match (scenario.applies)(&caps, &*harness) {
                Err(why) => {
                    eprintln!("{name}: unsupported: {why}");
                    let why = format!("unsupported: {why}");
                    Trial::test(name, move || Err(why.into()))
                        .with_ignored_flag(true)
                        .with_kind("unsupported")
                }
                Ok(()) => {
                    let (harness, caps) = (harness.clone(), caps.clone());
                    Trial::test(name.clone(), move || {
                        let result = run::run_scenario_bounded(scenario, harness, caps, scale);
                        // For scripts/run-tests.sh's table of the slowest tests (libtest-mimic
                        // has no --report-time).
                        println!("test-time:\t{name}\t{:.3}", result.millis as f64 / 1000.0);
                        if let Some(observed) = &result.observed {
                            println!("{name}: observed: {observed}");
                        }
                        match result.status {
                            Status::Pass => Ok(()),
                            _ => Err(Failed::from(result.reason.unwrap_or_default())),
                        }
                    })
                }
            }
        })
        .collect()
}
