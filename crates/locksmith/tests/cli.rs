//! The `locksmith` binary end to end, on the embedded memory backend (no server needed).

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn locksmith(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_locksmith"))
        .args(args)
        .output()
        .expect("the locksmith binary runs")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited normally")
}

#[test]
fn run_passes_the_command_exit_code_and_environment() {
    let out = locksmith(&[
        "run",
        "--url",
        "memory://",
        "--wait",
        "0",
        "job",
        "--",
        "sh",
        "-c",
        "echo \"$LOCKSMITH_LOCK_NAME $LOCKSMITH_FENCING_TOKEN\"; exit 3",
    ]);
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
fn run_terminates_the_command_when_the_lock_is_lost() {
    // Renewal stops at --max-hold; the lease then runs out, the lost signal fires, and the
    // command (which would sleep 30 s) gets SIGTERM.
    let start = Instant::now();
    let out = locksmith(&[
        "run",
        "--url",
        "memory://",
        "--ttl",
        "300ms",
        "--max-hold",
        "1s",
        "job",
        "--",
        "sleep",
        "30",
    ]);
    assert_eq!(code(&out), 70, "{out:?}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lost"),
        "{out:?}"
    );
}

#[test]
fn run_reports_setup_errors_with_distinct_codes() {
    let not_found = locksmith(&["run", "--url", "memory://", "j", "--", "/nonexistent/cmd"]);
    assert_eq!(code(&not_found), 127, "{not_found:?}");
    let bad_url = locksmith(&["run", "--url", "nosuch://u:hunter2@h", "j", "--", "true"]);
    assert_eq!(code(&bad_url), 78, "{bad_url:?}");
    assert!(!String::from_utf8_lossy(&bad_url.stderr).contains("hunter2"));
    let bad_ttl = locksmith(&[
        "run",
        "--url",
        "memory://",
        "--ttl",
        "5x",
        "j",
        "--",
        "true",
    ]);
    assert_eq!(code(&bad_ttl), 2, "{bad_ttl:?}");
    assert!(String::from_utf8_lossy(&bad_ttl.stderr).contains("invalid duration"));
    let bad_name = locksmith(&["run", "--url", "memory://", "a\u{1}b", "--", "true"]);
    assert_eq!(code(&bad_name), 78, "{bad_name:?}");
}

#[test]
fn report_writes_three_files_without_bench() {
    let dir = std::env::temp_dir().join(format!("locksmith-cli-{}", std::process::id()));
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
    std::fs::remove_dir_all(&dir).ok();
}
