//! `interop=sqlx` (PostgreSQL) and `interop=get_lock` (MariaDB) against the real peers, as
//! processes of their own:
//!
//! * sqlx's `PgAdvisoryLock` (the sqlx this workspace builds): this test binary run again as a
//!   child process (`sqlx_peer_process`, started with `--ignored --exact` and the database URL
//!   in `LOCKSMITH_SQLX_PEER_URL`), driven line by line on its stdin.
//! * The `mariadb` command-line client (Debian `mariadb-client`): `GET_LOCK(name, timeout)`,
//!   `RELEASE_LOCK(name)` typed into its stdin, one statement at a time.
//!
//! Both directions (the peer holds and locksmith waits; locksmith holds and the peer waits) and
//! a contention loop whose critical sections must never overlap. Needs
//! `LOCK_TEST_POSTGRES_URL` / `LOCK_TEST_MYSQL_URL` (skipped when unset, failing under
//! `LOCK_TEST_REQUIRE_ALL`); a missing `mariadb` client fails the test.

use std::io::{BufRead, Write};
use std::time::Duration;

use conformance::require_env;
use faultkit::{
    PeerCommand, PeerProcess, TempDir, Window, check_windows, now_unix_micros, unix_micros_at,
};
use lock_sql::SqlBackend;
use lockcore::backend::Backend;
use lockcore::{ErrorKind, LockName, LockOptions, Locker};
use support::with_params;

mod support;

const SQLX_PEER_ENV: &str = "LOCKSMITH_SQLX_PEER_URL";

fn unique(prefix: &str) -> String {
    format!("interop-{prefix}-{:016x}", fastrand::u64(..))
}

fn scaled(secs: f64) -> Duration {
    Duration::from_secs_f64(secs * conformance::time_scale())
}

async fn backend(url: &str, peer: &str) -> SqlBackend {
    SqlBackend::connect(&with_params(
        url,
        &format!("strategy=row-lock&interop={peer}"),
    ))
    .await
    .unwrap()
}

/// Field `field` of a peer's answer line (0 is the first word), as Unix microseconds.
fn stamp(line: &str, field: usize) -> u64 {
    unix_micros_at(line, field).unwrap()
}

// ---- the sqlx peer: this binary, run again ----

/// Not a test: the sqlx peer process. Runs only when started by [`sqlx_peer`] (with the URL in
/// [`SQLX_PEER_ENV`]). Commands on stdin: `try NAME`, `hold NAME`, `wait NAME` (prints `waiting`
/// after a failed try, then blocks in `acquire`), `release`, `loop NAME SECONDS`, `quit`.
#[tokio::test(flavor = "current_thread")]
#[ignore = "the sqlx peer process of the interop tests, started by them"]
async fn sqlx_peer_process() {
    use sqlx::Connection;
    use sqlx::postgres::{PgAdvisoryLock, PgConnection};
    let Ok(url) = std::env::var(SQLX_PEER_ENV) else {
        return;
    };
    let now = || format!("{:.6}", now_unix_micros() as f64 / 1e6);
    let say = |line: String| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").unwrap();
        out.flush().unwrap();
    };
    let mut conn = PgConnection::connect(&url).await.unwrap();
    // On a line of its own: libtest has printed `test sqlx_peer_process ... ` without one.
    say("\nready".into());
    let mut held: Option<PgAdvisoryLock> = None;
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["try", name] => {
                let lock = PgAdvisoryLock::new(name);
                match lock.try_acquire(&mut conn).await.unwrap() {
                    sqlx::Either::Left(guard) => {
                        guard.leak();
                        held = Some(lock);
                        say(format!("acquired {}", now()));
                    }
                    sqlx::Either::Right(_) => say("busy".into()),
                }
            }
            ["hold", name] | ["wait", name] => {
                let lock = PgAdvisoryLock::new(name);
                let free = match lock.try_acquire(&mut conn).await.unwrap() {
                    sqlx::Either::Left(guard) => {
                        guard.leak();
                        true
                    }
                    sqlx::Either::Right(_) => false,
                };
                if !free {
                    say("waiting".into());
                    lock.acquire(&mut conn).await.unwrap().leak();
                }
                held = Some(lock);
                say(format!("acquired {}", now()));
            }
            ["release"] => {
                let lock = held.take().expect("held");
                let t = now();
                let released = lock.force_release(&mut conn).await.unwrap().1;
                assert!(released, "pg_advisory_unlock returned false");
                say(format!("released {t}"));
            }
            ["loop", name, seconds] => {
                let lock = PgAdvisoryLock::new(name);
                let end =
                    std::time::Instant::now() + Duration::from_secs_f64(seconds.parse().unwrap());
                let mut n = 0;
                while std::time::Instant::now() < end {
                    let guard = lock.acquire(&mut conn).await.unwrap();
                    let t0 = now();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let t1 = now();
                    guard.release_now().await.unwrap();
                    say(format!("window {t0} {t1}"));
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                say(format!("done {n}"));
            }
            ["quit"] => return,
            _ => say(format!("error unknown command {line}")),
        }
    }
}

async fn sqlx_peer(url: &str) -> PeerProcess {
    let exe = std::env::current_exe().unwrap();
    let args = [
        "sqlx_peer_process",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]
    .map(String::from);
    // This test binary: no package to install.
    let mut p = PeerCommand::new("sqlx", exe.to_str().unwrap())
        .args(args)
        .env(SQLX_PEER_ENV, url)
        .spawn()
        .unwrap();
    p.expect("ready", scaled(30.0)).await.unwrap();
    p
}

async fn queued(b: &SqlBackend, name: &str) -> usize {
    b.queued_waiters(&LockName::new(name).unwrap())
        .await
        .unwrap()
}

/// Options of locksmith's side: a 10 s lease, waits up to `wait_secs` (scaled).
fn opts(wait_secs: f64) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_timeout(scaled(wait_secs))
}

/// Asserts that locksmith finds `name` busy (the peer holds it).
async fn assert_busy(locker: &Locker, name: &str, opts: &LockOptions) {
    assert!(locker.try_lock(name, opts).await.unwrap().is_none());
}

/// A locksmith waiter for `name`: its guard and when it was granted (Unix µs).
fn spawn_waiter(
    locker: &Locker,
    name: &str,
    opts: &LockOptions,
) -> tokio::task::JoinHandle<(lockcore::Result<lockcore::LockGuard>, u64)> {
    let (locker, name, opts) = (locker.clone(), name.to_owned(), opts.clone());
    tokio::spawn(async move {
        let g = locker.lock(name.as_str(), &opts).await;
        (g, now_unix_micros())
    })
}

/// The waiter's lock, granted no earlier than the peer's release at `released` (Unix µs),
/// without a fencing token (the peer counts nothing); released.
async fn won_after(
    waiter: tokio::task::JoinHandle<(lockcore::Result<lockcore::LockGuard>, u64)>,
    released: u64,
) {
    let (guard, won_at) = waiter.await.unwrap();
    let guard = guard.unwrap();
    assert!(
        won_at >= released,
        "won at {won_at}, released at {released}"
    );
    assert_eq!(guard.fencing_token(), None);
    guard.release().await.unwrap();
}

/// Ends a peer process.
async fn quit(mut p: PeerProcess) {
    p.send("quit").await.unwrap();
    p.wait(scaled(20.0)).await.unwrap();
}

/// Polls `query` (a `SELECT 'waiters', COUNT(*) ...` on the process list) from a watching
/// `mariadb` client until `waiting` holds of its count; whether it did within a scaled bound.
async fn until_user_lock_wait(url: &str, query: &str, waiting: impl Fn(&str) -> bool) -> bool {
    let (mut watcher, _dir) = mariadb_peer(url).await;
    let end = lockcore::Instant::now() + scaled(20.0);
    let mut seen = false;
    while !seen && lockcore::Instant::now() < end {
        watcher.send(query).await.unwrap();
        let line = watcher.expect("waiters", scaled(20.0)).await.unwrap();
        seen = waiting(line.split_whitespace().nth(1).unwrap_or(""));
        if !seen {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    watcher.send("quit").await.unwrap();
    seen
}

#[tokio::test(flavor = "current_thread")]
async fn sqlx_holds_locksmith_waits() {
    let Some(url) = require_env("LOCK_TEST_POSTGRES_URL") else {
        return;
    };
    let name = unique("sqlx");
    let b = backend(&url, "sqlx").await;
    let admin = backend(&url, "sqlx").await;
    let locker = Locker::new(b);
    let mut p = sqlx_peer(&url).await;
    p.send(&format!("hold {name}")).await.unwrap();
    p.expect("acquired", scaled(20.0)).await.unwrap();
    let opts = opts(30.0);
    assert_busy(&locker, &name, &opts).await;
    let waiter = spawn_waiter(&locker, &name, &opts);
    // The waiter sits in the server's queue of sqlx's key.
    faultkit::wait_until("locksmith queued on sqlx's key", scaled(20.0), || {
        let (admin, name) = (&admin, name.as_str());
        async move { Ok(queued(admin, name).await >= 1) }
    })
    .await
    .unwrap();
    p.send("release").await.unwrap();
    let released = stamp(&p.expect("released", scaled(20.0)).await.unwrap(), 1);
    won_after(waiter, released).await;
    quit(p).await;
}

#[tokio::test(flavor = "current_thread")]
async fn locksmith_holds_sqlx_waits() {
    let Some(url) = require_env("LOCK_TEST_POSTGRES_URL") else {
        return;
    };
    let name = unique("sqlx");
    let admin = backend(&url, "sqlx").await;
    let locker = Locker::new(backend(&url, "sqlx").await);
    let opts = opts(20.0);
    let guard = locker.lock(name.as_str(), &opts).await.unwrap();
    let mut p = sqlx_peer(&url).await;
    p.send(&format!("try {name}")).await.unwrap();
    p.expect("busy", scaled(20.0)).await.unwrap();
    p.send(&format!("wait {name}")).await.unwrap();
    p.expect("waiting", scaled(20.0)).await.unwrap();
    // sqlx's acquire waits in the server's queue of the key locksmith holds.
    faultkit::wait_until("sqlx queued on the key", scaled(20.0), || {
        let (admin, name) = (&admin, name.as_str());
        async move { Ok(queued(admin, name).await >= 1) }
    })
    .await
    .unwrap();
    assert!(!p.has_output(), "{:?}", p.seen());
    let released = now_unix_micros();
    guard.release().await.unwrap();
    let line = p.expect("acquired", scaled(20.0)).await.unwrap();
    assert!(stamp(&line, 1) >= released, "{line} before {released}");
    assert_busy(&locker, &name, &opts).await;
    p.send("release").await.unwrap();
    p.expect("released", scaled(20.0)).await.unwrap();
    quit(p).await;
}

/// Both loop on one name for a few seconds.
#[tokio::test(flavor = "current_thread")]
async fn sqlx_contention() {
    let Some(url) = require_env("LOCK_TEST_POSTGRES_URL") else {
        return;
    };
    let name = unique("sqlx");
    let locker = Locker::new(backend(&url, "sqlx").await);
    let mut p = sqlx_peer(&url).await;
    let seconds = 3.0;
    p.send(&format!("loop {name} {seconds}")).await.unwrap();
    let mut windows = locksmith_loop(&locker, &name, seconds).await;
    windows.extend(p.loop_windows("sqlx", scaled(60.0)).await.unwrap());
    report_and_check(windows, "sqlx");
    quit(p).await;
}

async fn locksmith_loop(locker: &Locker, name: &str, seconds: f64) -> Vec<Window> {
    let opts = opts(30.0);
    let mut windows = Vec::new();
    let end = lockcore::Instant::now() + Duration::from_secs_f64(seconds);
    while lockcore::Instant::now() < end {
        let guard = locker.lock(name, &opts).await.unwrap();
        let start_us = now_unix_micros();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let end_us = now_unix_micros();
        guard.release().await.unwrap();
        windows.push(Window::new("locksmith", start_us, end_us));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    windows
}

fn report_and_check(windows: Vec<Window>, peer: &str) {
    let ours = windows.iter().filter(|w| w.side == "locksmith").count();
    eprintln!(
        "{peer} contention: {ours} locksmith windows, {} peer windows",
        windows.len() - ours
    );
    check_windows(&windows, &["locksmith", peer], 3).unwrap();
}

// ---- the mariadb client ----

/// The `mariadb` client on the test server, credentials in a private option file (never on
/// its command line), batch mode, one answer line per statement.
async fn mariadb_peer(url: &str) -> (PeerProcess, TempDir) {
    let u = url::Url::parse(url).unwrap();
    let dir = TempDir::new("mariadb-peer", true).unwrap();
    let cnf = dir.join("client.cnf");
    let password = percent_encoding_decode(u.password().unwrap_or(""));
    let text = format!(
        "[client]\nhost={}\nport={}\nuser={}\npassword={}\ndatabase={}\nprotocol=tcp\n",
        u.host_str().unwrap(),
        u.port().unwrap_or(3306),
        u.username(),
        password,
        u.path().trim_start_matches('/'),
    );
    // The directory is world-readable; the file with the password is not.
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&cnf)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }
    let args = [
        format!("--defaults-file={}", cnf.display()),
        "--batch".into(),
        "--skip-column-names".into(),
        "--unbuffered".into(),
    ];
    let p = PeerCommand::new("mariadb", "mariadb")
        .args(args)
        .package("mariadb-client")
        .spawn()
        .unwrap();
    (p, dir)
}

fn percent_encoding_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// A name is pasted into the peer's SQL: only names that need no quoting.
fn sql_name(name: &str) -> &str {
    assert!(
        name.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    );
    name
}

#[tokio::test(flavor = "current_thread")]
async fn get_lock_peer_holds_locksmith_waits() {
    let Some(url) = require_env("LOCK_TEST_MYSQL_URL") else {
        return;
    };
    let name = unique("getlock");
    let n = sql_name(&name);
    let locker = Locker::new(backend(&url, "get_lock").await);
    let (mut p, _dir) = mariadb_peer(&url).await;
    p.send(&format!(
        "SELECT 'got', GET_LOCK('{n}', 10), UNIX_TIMESTAMP(SYSDATE(6));"
    ))
    .await
    .unwrap();
    let got = p.expect("got", scaled(20.0)).await.unwrap();
    assert_eq!(got.split_whitespace().nth(1), Some("1"), "{got}");
    let opts = opts(30.0);
    assert_busy(&locker, &name, &opts).await;
    let waiter = spawn_waiter(&locker, &name, &opts);
    // A GET_LOCK waits in the server (other tests' waiters may count too: this only makes sure
    // the waiter got that far before the peer lets go; the order of the times proves the rest).
    let waiting = until_user_lock_wait(
        &url,
        &format!(
            "SELECT 'waiters', COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE STATE = 'User lock' AND ID <> CONNECTION_ID() \
             AND IS_USED_LOCK('{n}') IS NOT NULL;"
        ),
        |count| count != "0",
    )
    .await;
    assert!(waiting, "locksmith's GET_LOCK never waited in the server");
    assert!(!waiter.is_finished());
    p.send(&format!(
        "SELECT 'released', UNIX_TIMESTAMP(SYSDATE(6)), RELEASE_LOCK('{n}');"
    ))
    .await
    .unwrap();
    let line = p.expect("released", scaled(20.0)).await.unwrap();
    assert_eq!(line.split_whitespace().nth(2), Some("1"), "{line}");
    let released = stamp(&line, 1);
    won_after(waiter, released).await;
    quit(p).await;
}

#[tokio::test(flavor = "current_thread")]
async fn locksmith_holds_get_lock_peer_waits() {
    let Some(url) = require_env("LOCK_TEST_MYSQL_URL") else {
        return;
    };
    let name = unique("getlock");
    let n = sql_name(&name);
    let locker = Locker::new(backend(&url, "get_lock").await);
    let opts = opts(20.0);
    let guard = locker.lock(name.as_str(), &opts).await.unwrap();
    let (mut p, _dir) = mariadb_peer(&url).await;
    // The exact name is held on the server, by another session than the peer's.
    p.send(&format!(
        "SELECT 'held', IS_USED_LOCK('{n}') IS NOT NULL, IS_USED_LOCK('{n}') <> CONNECTION_ID();"
    ))
    .await
    .unwrap();
    let line = p.expect("held", scaled(20.0)).await.unwrap();
    assert_eq!(line, "held\t1\t1");
    p.send(&format!("SELECT 'try', GET_LOCK('{n}', 0);"))
        .await
        .unwrap();
    assert_eq!(p.expect("try", scaled(20.0)).await.unwrap(), "try\t0");
    p.send(&format!(
        "SELECT 'got', GET_LOCK('{n}', 60), UNIX_TIMESTAMP(SYSDATE(6));"
    ))
    .await
    .unwrap();
    // The peer's statement waits in the server for the name locksmith holds (its text, with
    // the name, shows in the process list in state `User lock`).
    let waiting = until_user_lock_wait(
        &url,
        &format!(
            "SELECT 'waiters', COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE STATE = 'User lock' AND INFO LIKE '%GET_LOCK(''{n}'', 60)%' \
             AND ID <> CONNECTION_ID();"
        ),
        |count| count == "1",
    )
    .await;
    assert!(waiting, "the peer's GET_LOCK never waited in the server");
    assert!(!p.has_output(), "{:?}", p.seen());
    let released = now_unix_micros();
    guard.release().await.unwrap();
    let got = p.expect("got", scaled(30.0)).await.unwrap();
    assert_eq!(got.split_whitespace().nth(1), Some("1"), "{got}");
    assert!(stamp(&got, 2) >= released, "{got} before {released}");
    assert_busy(&locker, &name, &opts).await;
    p.send(&format!("SELECT 'released', RELEASE_LOCK('{n}');"))
        .await
        .unwrap();
    assert_eq!(
        p.expect("released", scaled(20.0)).await.unwrap(),
        "released\t1"
    );
    quit(p).await;
}

#[tokio::test(flavor = "current_thread")]
async fn get_lock_contention() {
    let Some(url) = require_env("LOCK_TEST_MYSQL_URL") else {
        return;
    };
    let name = unique("getlock");
    let n = sql_name(&name).to_owned();
    let locker = Locker::new(backend(&url, "get_lock").await);
    let (mut p, _dir) = mariadb_peer(&url).await;
    let seconds = 3.0;
    // The peer: one statement per critical section, its columns evaluated left to right (each
    // a column of its own: inside one expression MariaDB may evaluate an operand first that
    // comes later): take the lock, a time, the critical section, a time, the release.
    let peer = async {
        let end = lockcore::Instant::now() + Duration::from_secs_f64(seconds);
        while lockcore::Instant::now() < end {
            p.send(&format!(
                "SELECT 'window', GET_LOCK('{n}', 30), UNIX_TIMESTAMP(SYSDATE(6)), SLEEP(0.005), \
                 UNIX_TIMESTAMP(SYSDATE(6)), RELEASE_LOCK('{n}');"
            ))
            .await
            .unwrap();
            let line = p.expect("window", scaled(60.0)).await.unwrap();
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!((fields[1], fields[5]), ("1", "1"), "{line}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let (_, mut windows) = tokio::join!(peer, locksmith_loop(&locker, &name, seconds));
    windows.extend(p.windows("mariadb", 2, 4).unwrap());
    report_and_check(windows, "mariadb");
    quit(p).await;
}

/// A name GET_LOCK would refuse (or a MySQL peer could not lock) is refused before any I/O.
#[tokio::test(flavor = "current_thread")]
async fn get_lock_refuses_long_names_and_capabilities_tell_the_truth() {
    let Some(url) = require_env("LOCK_TEST_MYSQL_URL") else {
        return;
    };
    let b = backend(&url, "get_lock").await;
    let caps = b.capabilities().clone();
    assert!(!caps.fencing && !caps.fair);
    assert_eq!(caps.wait, lockcore::WaitKind::Notify);
    let locker = Locker::new(b);
    let long = "x".repeat(65);
    let e = locker
        .try_lock(long.as_str(), &LockOptions::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidName, "{e}");
    if let Some(pg) = require_env("LOCK_TEST_POSTGRES_URL") {
        let caps = backend(&pg, "sqlx").await.capabilities().clone();
        assert!(!caps.fencing && caps.fair);
        assert_eq!(caps.wait, lockcore::WaitKind::Notify);
    }
    // Settings that do not fit are refused.
    for bad in ["interop=get_lock", "interop=sqlx&strategy=row-lock"] {
        let e = SqlBackend::connect(&with_params(&url, bad))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{bad}: {e}");
    }
}
