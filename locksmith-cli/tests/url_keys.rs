//! Every URL kind refuses a misspelled query parameter through the command: exit 78 (bad
//! configuration), the parameter named, nothing connected (the hosts here listen nowhere, so a
//! URL that got as far as connecting would exit 69 instead). No server is needed.

use std::process::{Command, Output};

fn run(url: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_locksmith"))
        .args(["run", "--wait", "0", "--connect-timeout", "20s"])
        .args(["url-keys", "--", "true"])
        .env("LOCKSMITH_URL", url)
        .output()
        .expect("the locksmith binary runs")
}

/// One URL per scheme the facade registers, each with a misspelled parameter (a near miss of a
/// real one: the silent failures the refusal prevents), and the parameter.
const CASES: &[(&str, &str)] = &[
    ("memory://jobs?stor=x", "stor"),
    (
        "sqlite:///tmp/locksmith-url-keys/locks.db?stratgy=lease",
        "stratgy",
    ),
    (
        "postgres://u:hunter2@127.0.0.1:1/db?sslmod=verify-full&sslrootcert=ca.pem",
        "sslmod",
    ),
    (
        "postgresql://u:hunter2@127.0.0.1:1/db?stratgy=row-lock",
        "stratgy",
    ),
    (
        "mysql://u:hunter2@127.0.0.1:1/db?ssl_mode=verify_identity",
        "ssl_mode",
    ),
    (
        "mariadb://u:hunter2@127.0.0.1:1/db?sslrootcert=ca.pem",
        "sslrootcert",
    ),
    ("redis://:hunter2@127.0.0.1:1?namespase=app", "namespase"),
    ("rediss://:hunter2@127.0.0.1:1?tls_cs=/etc/ca.pem", "tls_cs"),
    (
        "redis+cluster://127.0.0.1:1,127.0.0.1:2?min_replica=1",
        "min_replica",
    ),
    (
        "rediss+cluster://127.0.0.1:1,127.0.0.1:2?namespase=app",
        "namespase",
    ),
    (
        "redis+sentinel://127.0.0.1:1/mymaster?namespase=app",
        "namespase",
    ),
    ("rediss+sentinel://127.0.0.1:1/mymaster?poll=5", "poll"),
    (
        "redlock://:hunter2@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?node_timeout=50",
        "node_timeout",
    ),
    (
        "redlocks://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?namespase=app",
        "namespase",
    ),
    (
        "zk://127.0.0.1:1/app?session_timeout=4000&digest=u:hunter2",
        "session_timeout",
    ),
    (
        "zks://127.0.0.1:1/app?ca=/etc/ca.pem&digset=u:hunter2",
        "digset",
    ),
    ("etcd://u:hunter2@127.0.0.1:1?timeout=500", "timeout"),
    ("etcds://127.0.0.1:1?ca_file=/etc/ca.pem", "ca_file"),
];

#[test]
fn a_misspelled_parameter_exits_78_naming_it_on_every_url_kind() {
    let mut failures = Vec::new();
    for (url, key) in CASES {
        let out = run(url);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let ok = out.status.code() == Some(78)
            && stderr.contains(&format!("`{key}`"))
            && !stderr.contains("hunter2");
        if !ok {
            failures.push(format!("{url}: {:?} {stderr}", out.status.code()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The cases cover every scheme the facade registers.
#[test]
fn the_cases_cover_every_registered_scheme() {
    for backend in locksmith::backends() {
        for scheme in backend.schemes {
            assert!(
                CASES
                    .iter()
                    .any(|(url, _)| url.starts_with(&format!("{scheme}://"))),
                "no case for {scheme}://"
            );
        }
    }
}
