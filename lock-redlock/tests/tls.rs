//! `redlocks://` against real TLS-only Redis masters, each with its own password: the server
//! certificate is verified against the test CA (`tls_ca`), a client without that CA is refused,
//! and locking, exclusion, hand-over by notification, extend and release work over TLS.
//!
//! Three redis-server processes of this test's own (faultkit's `ServerProcess`, killed on drop)
//! listen with TLS only, with the certificate and CA that scripts/servers.sh made for the shared
//! TLS Redis (`LOCK_TEST_REDIS_TLS_CA`; `server.pem` and `server.key` beside it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use conformance::{require_env, time_scale};
use faultkit::{ServerProcess, TempDir, free_port};
use lock_redlock::RedlockBackend;
use lockcore::{ErrorKind, LockName, LockOptions, Locker};

fn scaled(d: Duration) -> Duration {
    d.mul_f64(time_scale())
}

/// One TLS-only master with a password.
struct TlsMaster {
    port: u16,
    password: String,
    _process: ServerProcess,
}

async fn pings(port: u16, ca: &Path, password: &str) -> faultkit::Result<bool> {
    let out = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::process::Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(ca)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "--no-auth-warning",
            ])
            .env("REDISCLI_AUTH", password)
            .arg("PING")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| faultkit::Error::msg("redis-cli PING timed out"))??;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "PONG")
}

impl TlsMaster {
    async fn start(dir: &TempDir, i: usize, certs: &Path) -> TlsMaster {
        let port = free_port().expect("a free port");
        let password = format!("pw-{i}-{:08x}", fastrand::u32(..));
        let mut process = faultkit::spawn_tls_redis(dir, &format!("m{i}"), port, certs, &password)
            .expect("redis-server (Debian package redis-server)");
        let ca = certs.join("ca.pem");
        process
            .wait_ready("TLS PING", scaled(Duration::from_secs(10)), || {
                pings(port, &ca, &password)
            })
            .await
            .expect("TLS master ready");
        TlsMaster {
            port,
            password,
            _process: process,
        }
    }
}

/// `redlocks://` over `masters`, each with its own password, and `query`.
fn url(masters: &[TlsMaster], query: &str) -> String {
    let hosts: Vec<String> = masters
        .iter()
        .map(|m| format!(":{}@127.0.0.1:{}", m.password, m.port))
        .collect();
    format!("redlocks://{}{query}", hosts.join(","))
}

/// Where the shared TLS Redis's CA, certificate and key are, when the servers run.
fn certs() -> Option<PathBuf> {
    let ca = require_env("LOCK_TEST_REDIS_TLS_CA")?;
    let dir = Path::new(&ca).parent()?.to_path_buf();
    for f in ["ca.pem", "server.pem", "server.key"] {
        assert!(
            dir.join(f).is_file(),
            "{} is missing",
            dir.join(f).display()
        );
    }
    Some(dir)
}

async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(scaled(Duration::from_secs(30)), fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish in time"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_masters_with_their_own_passwords_lock_exclude_and_release() {
    let Some(certs) = certs() else { return };
    let dir = TempDir::new("redlock-tls", false).expect("temp dir");
    let mut masters = Vec::new();
    for i in 0..3 {
        masters.push(TlsMaster::start(&dir, i, &certs).await);
    }
    let ca = certs.join("ca.pem");
    let good = url(&masters, &format!("?tls_ca={}", ca.display()));

    // Certificate verification is on: without the test CA (the system roots only) the masters'
    // certificates are refused and no majority can be reached.
    let unverified = bounded(
        "connect without the CA",
        RedlockBackend::connect(&url(&masters, "")),
    )
    .await
    .map(|_| ())
    .expect_err("connected to masters whose certificate no trusted CA signed");
    assert_eq!(unverified.kind(), ErrorKind::Unavailable, "{unverified:?}");
    let shown = format!("{unverified:?} {unverified}");
    assert!(shown.contains("certificate"), "{shown}");
    assert!(
        !shown.contains(&masters[0].password),
        "a password in {shown}"
    );
    // Each master checks its own password: one wrong password is refused as `Auth` (the one
    // kind for refused credentials on every backend), and not echoed.
    let mut wrong = url(&masters, &format!("?tls_ca={}", ca.display()));
    wrong = wrong.replacen(&masters[1].password, "not-the-password", 1);
    let refused = bounded(
        "connect with a wrong password",
        RedlockBackend::connect(&wrong),
    )
    .await
    .map(|_| ())
    .expect_err("a master accepted a wrong password");
    assert_eq!(refused.kind(), ErrorKind::Auth, "{refused:?}");
    assert!(format!("{refused:?}").contains("WRONGPASS"), "{refused:?}");
    let shown = format!("{refused:?} {refused}");
    assert!(!shown.contains("not-the-password"), "{shown}");
    assert!(!shown.contains(&masters[0].password), "{shown}");

    let backend = bounded("connect", RedlockBackend::connect(&good))
        .await
        .expect("connect over TLS with the CA");
    let shown = format!(
        "{backend:?} {}",
        lockcore::backend::Backend::describe(&backend)
    );
    for m in &masters {
        assert!(!shown.contains(&m.password), "a password in {shown}");
    }
    let a = Locker::new(backend);
    let b = Locker::new(
        bounded("connect", RedlockBackend::connect(&good))
            .await
            .expect("second client"),
    );
    let n = LockName::new(format!("tls-{:08x}", fastrand::u32(..))).expect("name");
    let opts = LockOptions::new()
        .ttl(scaled(Duration::from_secs(10)))
        .wait_timeout(scaled(Duration::from_secs(10)));

    let g = bounded("lock", a.lock(&n, &opts))
        .await
        .expect("lock over TLS");
    assert!(
        bounded("try_lock", b.try_lock(&n, &opts))
            .await
            .expect("try_lock")
            .is_none(),
        "a second holder over TLS"
    );
    // A waiter is handed the lock when the holder releases (notification over TLS pub/sub, or
    // its fallbacks), well before the holder's TTL.
    let waiter = {
        let (b, n, opts) = (b.clone(), n.clone(), opts.clone());
        tokio::spawn(async move { b.lock(&n, &opts).await })
    };
    bounded("extend", g.extend(scaled(Duration::from_secs(10))))
        .await
        .expect("extend over TLS");
    bounded("release", g.release())
        .await
        .expect("release over TLS");
    let g2 = bounded("waiter", waiter)
        .await
        .expect("waiter task")
        .expect("the waiter got the lock after the release");
    assert!(g2.is_valid());
    bounded("release", g2.release()).await.expect("release");
    a.flush().await;
    b.flush().await;
}
