//! ZooKeeper over TLS: a `zks://` URL to the secure client port (`LOCK_TEST_ZK_TLS_URL`,
//! `zks://127.0.0.1:12182?ca=...&cert=...&key=...` from `scripts/servers.sh env`). The full
//! conformance suite also runs over it (`tests/conformance.rs`, target `zk-tls`); these tests
//! cover what only TLS has: the server verified against `ca=`, the client certificate.

use std::time::Duration;

use lock_zk::ZkBackend;
use lockcore::backend::Backend;
use lockcore::{ErrorKind, LockOptions, Locker};

/// A CA certificate that signed nothing the test servers use (made once with `openssl req
/// -x509`; its key was thrown away).
const OTHER_CA: &str = include_str!("other-ca.pem");

fn tls_url() -> Option<String> {
    conformance::require_env("LOCK_TEST_ZK_TLS_URL")
}

fn unique(prefix: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    format!("{prefix}-{:x}-{:x}", std::process::id(), t.as_nanos())
}

/// `url` with the value of query parameter `key` replaced by `value`.
fn with_param(url: &str, key: &str, value: &str) -> String {
    let (base, query) = url.split_once('?').expect("the TLS URL has parameters");
    let params: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, _)) if k == key => format!("{key}={value}"),
            _ => p.to_owned(),
        })
        .collect();
    format!("{base}?{}", params.join("&"))
}

/// `url` without query parameter `key`.
fn without_param(url: &str, key: &str) -> String {
    let (base, query) = url.split_once('?').expect("the TLS URL has parameters");
    let params: Vec<&str> = query
        .split('&')
        .filter(|p| p.split_once('=').map(|(k, _)| k) != Some(key))
        .collect();
    format!("{base}?{}", params.join("&"))
}

fn opts() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_timeout(Duration::from_secs(30))
}

/// Two clients over TLS exclude each other, and a release hands the lock over; `describe()`
/// names the TLS URL (`zks://`) and shows the certificate paths, never the files' contents.
#[tokio::test]
async fn locks_over_tls() {
    let Some(url) = tls_url() else { return };
    let a = ZkBackend::connect(&url).await.unwrap();
    let shown = format!("{a:?} {}", a.describe());
    assert!(shown.contains("zks://"), "{shown}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    let a = Locker::new(a);
    let b = Locker::new(ZkBackend::connect(&url).await.unwrap());
    let name = unique("tls");
    let g = a
        .try_lock(name.as_str(), &opts())
        .await
        .unwrap()
        .expect("a free lock");
    assert!(
        b.try_lock(name.as_str(), &opts()).await.unwrap().is_none(),
        "held over TLS by the other client"
    );
    let waiter = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move { b.lock(name.as_str(), &opts()).await }
    });
    g.release().await.unwrap();
    let g2 = waiter
        .await
        .unwrap()
        .expect("handed over after the release");
    g2.release().await.unwrap();
}

/// A server certificate that the URL's `ca=` did not sign is refused: the connect fails
/// (`Unavailable`, as every backend reports a server it cannot use) and says what to check.
#[tokio::test]
async fn wrong_ca_is_refused() {
    let Some(url) = tls_url() else { return };
    let ca = std::env::temp_dir().join(format!("{}.pem", unique("lock-zk-other-ca")));
    std::fs::write(&ca, OTHER_CA).unwrap();
    let wrong = with_param(&url, "ca", ca.to_str().unwrap());
    let result = tokio::time::timeout(Duration::from_secs(60), ZkBackend::connect(&wrong)).await;
    std::fs::remove_file(&ca).ok();
    let err = result
        .expect("a refused certificate fails the connect, not hangs it")
        .expect_err("a server certificate from another CA must not verify");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    // The client does not return the handshake's cause; the message names what to check.
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("TLS") && shown.contains("ca="), "{shown}");
}

/// The secure port asks for a client certificate (`ssl.clientAuth=need`): without `cert=` and
/// `key=` the server refuses the handshake, with the same kind of error.
#[tokio::test]
async fn server_refuses_a_client_without_certificate() {
    let Some(url) = tls_url() else { return };
    let anonymous = without_param(&without_param(&url, "cert"), "key");
    let result =
        tokio::time::timeout(Duration::from_secs(60), ZkBackend::connect(&anonymous)).await;
    let err = result
        .expect("a refused handshake fails the connect, not hangs it")
        .expect_err("the server requires a client certificate");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    assert!(err.to_string().contains("cert="), "{err}");
}

/// Files that cannot be used are `InvalidConfig` naming the file, before any connection.
#[tokio::test]
async fn unreadable_or_malformed_files_are_invalid_config() {
    let Some(url) = tls_url() else { return };
    let missing = with_param(&url, "ca", "/nonexistent/lock-zk-ca.pem");
    let err = ZkBackend::connect(&missing).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err:?}");
    assert!(
        err.to_string().contains("/nonexistent/lock-zk-ca.pem"),
        "{err}"
    );
    let garbage = std::env::temp_dir().join(format!("{}.pem", unique("lock-zk-garbage")));
    std::fs::write(&garbage, "not a PEM file").unwrap();
    let bad_key = with_param(&url, "key", garbage.to_str().unwrap());
    let err = ZkBackend::connect(&bad_key).await.unwrap_err();
    std::fs::remove_file(&garbage).ok();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err:?}");
}
