//! Refused credentials are one exit code on every backend (issue 37: a wrong password exited
//! 69 on Redis, PostgreSQL and MariaDB but 78 on etcd): `locksmith run` exits 77
//! (`exit::AUTH`, sysexits' `EX_NOPERM`), never runs its command, and never shows the password
//! it was given. Runs on the shared servers whose URLs carry a password; skipped without them.

mod support;
use support::*;

/// `url` with its password replaced by `wrong` (`scheme://[user]:password@...`).
fn with_password(url: &str, wrong: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (userinfo, host) = rest.split_once('@').expect("a URL with credentials");
    let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
    format!("{scheme}://{user}:{wrong}@{host}")
}

#[test]
fn a_wrong_password_exits_77_on_every_backend() {
    const WRONG: &str = "not-the-Passw0rd";
    let mut tried = 0;
    for var in [
        "LOCK_TEST_REDIS_AUTH_URL",
        "LOCK_TEST_POSTGRES_URL",
        "LOCK_TEST_MYSQL_URL",
        "LOCK_TEST_ETCD_TLS_URL",
    ] {
        let Some(url) = conformance::require_env(var) else {
            continue;
        };
        tried += 1;
        let dir = TempDir::new("auth-exit");
        let ran = dir.path("ran");
        let out = run_cmd(
            &with_password(&url, WRONG),
            &[
                "--wait",
                "0",
                "--connect-timeout",
                "20s",
                "auth-exit",
                "--",
                "touch",
                ran.to_str().unwrap(),
            ],
        )
        .output()
        .unwrap();
        let said = stderr(&out);
        assert_eq!(code(&out), 77, "{var}: {said}");
        assert!(!ran.exists(), "{var}: the command ran without the lock");
        assert!(!said.contains(WRONG), "{var}: the password shows: {said}");
    }
    if tried == 0 {
        eprintln!("skipped: no server URL with a password is set");
    }
}

#[test]
fn a_url_keeps_everything_but_its_password() {
    assert_eq!(
        with_password("redis://:pw@127.0.0.1:1", "x"),
        "redis://:x@127.0.0.1:1"
    );
    assert_eq!(
        with_password("etcds://u:pw@h:1?ca=/c.pem", "x"),
        "etcds://u:x@h:1?ca=/c.pem"
    );
}
