//! `locksmith report`'s scenarios whose clients are processes of their own, on every real
//! server of the test run: `crash_frees_lock` (a holder process killed with SIGKILL) and
//! `skewed_clock_cannot_steal` (a holder process whose wall clock runs 60 s ahead, under
//! libfaketime). The backends' own conformance tests play both in process; this runs them for
//! real.

use std::process::Command;

use conformance::require_env;

/// The servers' URL variables (scripts/servers.sh), with the lease strategy of the SQL servers
/// as a second target.
const SERVERS: [(&str, bool); 8] = [
    ("LOCK_TEST_REDIS_URL", false),
    ("LOCK_TEST_REDLOCK_URL", false),
    ("LOCK_TEST_REDIS_CLUSTER_URL", false),
    ("LOCK_TEST_POSTGRES_URL", true),
    ("LOCK_TEST_MYSQL_URL", true),
    ("LOCK_TEST_SQLITE_URL", false),
    ("LOCK_TEST_ZK_URL", false),
    ("LOCK_TEST_ETCD_URL", false),
];

#[test]
fn process_clients_pass_on_every_real_server() {
    let mut urls = Vec::new();
    for (var, with_lease) in SERVERS {
        let Some(url) = require_env(var) else {
            return;
        };
        if with_lease {
            urls.push(conformance::url_with_param(&url, "strategy", "lease"));
        }
        urls.push(url);
    }
    let out_dir = std::env::temp_dir().join(format!(
        "locksmith-cli-report-processes-{}",
        std::process::id()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_locksmith"))
        .args(["report", "--no-bench", "--out"])
        .arg(&out_dir)
        .args(["--scenarios", "crash_frees_lock,skewed_clock_cannot_steal"])
        .args(&urls)
        .output()
        .expect("the locksmith binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let json = std::fs::read_to_string(out_dir.join("report.json")).expect("report.json");
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let backends = report["backends"].as_array().expect("backends");
    assert_eq!(backends.len(), urls.len(), "{stderr}");
    for b in backends {
        let results = b["results"].as_array().expect("results");
        let scenarios: Vec<&str> = results
            .iter()
            .map(|r| r["scenario"].as_str().expect("name"))
            .collect();
        assert_eq!(
            scenarios,
            ["crash_frees_lock", "skewed_clock_cannot_steal"],
            "only the scenarios asked for run"
        );
        for r in results {
            assert_eq!(
                r["status"], "pass",
                "{} {}: {} (stderr: {stderr})",
                b["label"], r["scenario"], r["reason"]
            );
        }
    }
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn an_unknown_scenario_name_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_locksmith"))
        .args(["report", "--no-bench", "--scenarios", "no_such_scenario"])
        .arg("memory://")
        .output()
        .expect("the locksmith binary runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_such_scenario"));
}
