//! The `locksmith` binary end to end, on the embedded memory backend (no server needed).

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn locksmith(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_locksmith"))
        .args(args)
        .output()
        .expect("the locksmith binary runs")
}

/// `locksmith run --url URL --wait 0 NAME -- COMMAND...`: one attempt, the command run only if
/// the lock was free.
fn run_at_once(url: &str, name: &str, command: &[&str]) -> Output {
    let mut args = vec!["run", "--url", url, "--wait", "0", name, "--"];
    args.extend_from_slice(command);
    locksmith(&args)
}

/// A SQLite lock URL in a fresh file (`run` refuses memory://, whose locks live in one
/// process).
fn sqlite_url(test: &str) -> String {
    let dir = std::env::temp_dir().join(format!("locksmith-cli-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    format!("sqlite://{}/locks.db", dir.display())
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited normally")
}

#[test]
fn run_passes_the_command_exit_code_and_environment() {
    let url = sqlite_url("env");
    let out = run_at_once(
        &url,
        "job",
        &[
            "sh",
            "-c",
            "echo \"$LOCKSMITH_LOCK_NAME $LOCKSMITH_FENCING_TOKEN\"; exit 3",
        ],
    );
    assert_eq!(code(&out), 3, "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut words = stdout.split_whitespace();
    assert_eq!(words.next(), Some("job"));
    assert!(
        words.next().is_some_and(|t| t.parse::<u64>().is_ok()),
        "{stdout}"
    );
}

#[test]
fn run_reports_setup_errors_with_distinct_codes() {
    let url = sqlite_url("codes");
    let not_found = locksmith(&["run", "--url", &url, "j", "--", "/nonexistent/cmd"]);
    assert_eq!(code(&not_found), 127, "{not_found:?}");
    let bad_url = locksmith(&["run", "--url", "nosuch://u:hunter2@h", "j", "--", "true"]);
    assert_eq!(code(&bad_url), 78, "{bad_url:?}");
    assert!(!String::from_utf8_lossy(&bad_url.stderr).contains("hunter2"));
    let bad_ttl = locksmith(&["run", "--url", &url, "--ttl", "5x", "j", "--", "true"]);
    assert_eq!(code(&bad_ttl), 2, "{bad_ttl:?}");
    assert!(String::from_utf8_lossy(&bad_ttl.stderr).contains("invalid duration"));
    let bad_name = locksmith(&["run", "--url", &url, "a\u{1}b", "--", "true"]);
    assert_eq!(code(&bad_name), 78, "{bad_name:?}");
}

#[test]
fn report_writes_three_files_without_bench() {
    let dir = std::env::temp_dir().join(format!("locksmith-cli-report-{}", std::process::id()));
    let out = locksmith(&[
        "report",
        "--no-bench",
        "--out",
        dir.to_str().unwrap(),
        "memory://",
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    for f in ["report.json", "report.md", "report.html"] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("memory  acquire_release_reacquire"),
        "{stderr}"
    );
    let json = std::fs::read_to_string(dir.join("report.json")).unwrap();
    assert!(json.contains("\"status\": \"pass\""));
    // Provenance names the commit the binary was built from (this checkout's HEAD here).
    let head = std::process::Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short=12",
            "HEAD",
        ])
        .output()
        .expect("git");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    let report: serde_json::Value = serde_json::from_str(&json).expect("report JSON");
    let commit = report["provenance"]["git_commit"]
        .as_str()
        .unwrap_or_default();
    assert!(
        !head.is_empty() && commit.starts_with(&head),
        "provenance commit {commit:?}, HEAD {head:?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Two processes on one host exclude each other through the embedded SQLite default: while the
/// first holds the lock (its command waits for a file that only the test creates), the second
/// finds it busy (75) and never runs its command.
#[test]
fn two_processes_exclude_each_other_through_sqlite() {
    let dir = std::env::temp_dir().join(format!("locksmith-cli-exclude-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/locks.db", dir.display());
    let (go, ran) = (dir.join("go"), dir.join("second-ran"));
    let wait_for_go = format!(
        "echo held > {dir}/held; while [ ! -e {go} ]; do sleep 0.05; done",
        dir = dir.display(),
        go = go.display()
    );
    let mut first = Command::new(env!("CARGO_BIN_EXE_locksmith"))
        .args([
            "run",
            "--url",
            &url,
            "--wait",
            "0",
            "nightly",
            "--",
            "sh",
            "-c",
            &wait_for_go,
        ])
        .spawn()
        .expect("the first locksmith runs");
    // The first process holds the lock once its command has started.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !dir.join("held").exists() {
        assert!(
            Instant::now() < deadline,
            "the first process never got the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = run_at_once(&url, "nightly", &["touch", ran.to_str().unwrap()]);
    assert_eq!(code(&second), 75, "{second:?}");
    assert!(
        !ran.exists(),
        "the second process ran its command while the lock was held"
    );
    std::fs::write(&go, "").unwrap();
    assert!(first.wait().unwrap().success());
    // Released: the next process gets the lock at once.
    let third = run_at_once(&url, "nightly", &["touch", ran.to_str().unwrap()]);
    assert_eq!(code(&third), 0, "{third:?}");
    assert!(ran.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `bench` measures hand-over across separate OS processes (its own worker processes on one
/// SQLite file) besides tasks, and shows server requests per hand-over as unsupported where
/// the backend has no counter.
#[test]
fn bench_measures_across_processes() {
    let url = sqlite_url("bench");
    let out = locksmith(&[
        "bench",
        "--secs",
        "0.3",
        "--processes",
        "2",
        "--waiters",
        "4",
        "--waiter-processes",
        "2",
        "--fair-processes",
        "3",
        "--fair-secs",
        "0.3",
        &url,
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = stdout
        .lines()
        .find(|l| l.starts_with("sqlite"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(row.contains("(2)"), "two processes: {row}");
    assert!(row.contains("unsupported"), "{row}");
    assert!(
        row.contains("(3p 0.3s)"),
        "fairness over three processes: {row}"
    );
}

/// `bench --renewals` holds auto-renewed leases in a worker process and measures it from
/// outside: RSS, CPU share, the goal beside each, and no lease lost across renewals (a 1.5 s
/// TTL renews every 0.5 s, so the 1.2 s window covers two rounds).
#[test]
fn bench_renewals_measures_a_worker_from_outside() {
    let url = sqlite_url("renewals");
    let out = locksmith(&[
        "bench",
        "--renewals",
        "50",
        "--renewal-ttl",
        "1.5s",
        "--renewal-window",
        "1.2s",
        &url,
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("50 auto-renewed leases"), "{stdout}");
    assert!(stdout.contains("MiB at the end"), "{stdout}");
    assert!(stdout.contains("% of one core"), "{stdout}");
    assert!(
        stdout.contains("goal for 100,000 leases: 64 MiB"),
        "{stdout}"
    );
    assert!(stdout.contains("leases lost: 0"), "{stdout}");
    // SQLite has no server-side count: said, not invented.
    assert!(stdout.contains("- (not a single Redis server"), "{stdout}");
}
