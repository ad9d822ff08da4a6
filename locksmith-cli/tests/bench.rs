//! `locksmith bench` against a real server: the requests the waiting clients send per
//! hand-over are counted by proxies in front of them, beside the server's own counter, over
//! the run's steady window; what each waiter paid once is beside them.

use std::process::Command;

use conformance::require_env;

/// On Redis the server's counter (`INFO commandstats`) counts every command the clients send
/// and every command their scripts run inside, so what the clients send (counted at the
/// proxies) is a positive part of it: a count of zero would mean the workers bypassed the
/// proxies, one above the server's that the proxies counted something else.
#[test]
fn bench_counts_what_waiting_clients_send() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_locksmith"))
        .args(["bench", "--secs", "1", "--processes", "2"])
        .args(["--waiters", "8", "--waiter-processes", "2"])
        .args(["--fair-processes", "0", &url])
        .output()
        .expect("the locksmith binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let header = stdout.lines().next().expect("a header");
    assert!(
        header.ends_with("sent/hand-over  sent once/waiter"),
        "{stdout}"
    );
    let row = stdout
        .lines()
        .find(|l| l.starts_with("redis"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    let once: f64 = cells[cells.len() - 1]
        .parse()
        .unwrap_or_else(|_| panic!("the clients' count once per waiter: {row}"));
    let sent: f64 = cells[cells.len() - 2]
        .parse()
        .unwrap_or_else(|_| panic!("the clients' count: {row}"));
    // "<server per hand-over> (8w/2p)" just before it.
    assert_eq!(cells[cells.len() - 3], "(8w/2p)", "{row}");
    let server: f64 = cells[cells.len() - 4]
        .parse()
        .unwrap_or_else(|_| panic!("the server's count: {row}"));
    assert!(
        sent > 0.0,
        "the workers' requests went around the proxies: {row}"
    );
    assert!(
        sent <= server,
        "the clients sent more than the server counted: {row}"
    );
    // Each waiter subscribes when it starts waiting (and leaves the queue when its wait is cut
    // off): requests of its own beyond the hand-overs' rate, which the window's edges (a
    // hand-over in flight at each) cannot cancel out.
    assert!(
        once > 0.0,
        "a waiter's start-up and tear-down cost nothing: {row}"
    );
}
