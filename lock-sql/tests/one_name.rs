//! One name, one lock (issue 33): every way of taking a name on the SQL backends excludes every
//! other way, whatever retries, late answers and strategies come between. Each test stages its
//! sequence on the real servers (LOCK_TEST_* from scripts/servers.sh env; unset means skip,
//! unless LOCK_TEST_REQUIRE_ALL is set).

use std::time::Duration;

use lock_sql::SqlBackend;
use lockcore::backend::{AcquireRequest, Backend};
use lockcore::{ErrorKind, LockMode, LockName, OwnerToken};

/// `LOCK_TEST_TIME_SCALE` (1 when unset): bounds stretch with it on a loaded machine.
fn scale() -> f64 {
    std::env::var("LOCK_TEST_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s: &f64| *s >= 1.0)
        .unwrap_or(1.0)
}

fn scaled(d: Duration) -> Duration {
    d.mul_f64(scale())
}

fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn sqlite_url() -> String {
    match std::env::var("LOCK_TEST_SQLITE_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => {
            let _ = conformance::require_env("LOCK_TEST_SQLITE_URL");
            let path =
                std::env::temp_dir().join(format!("lock-sql-one-name-{}.db", std::process::id()));
            format!("sqlite://{}", path.display())
        }
    }
}

/// (label, url) of every lease backend whose server is configured.
fn lease_variants() -> Vec<(&'static str, String)> {
    let mut v = Vec::new();
    if let Some(pg) = conformance::require_env("LOCK_TEST_POSTGRES_URL") {
        v.push(("pg-lease", with_params(&pg, "strategy=lease")));
    }
    if let Some(my) = conformance::require_env("LOCK_TEST_MYSQL_URL") {
        v.push(("mysql-lease", with_params(&my, "strategy=lease")));
    }
    v.push(("sqlite-lease", sqlite_url()));
    v
}

fn request(name: &LockName, mode: LockMode, ttl: Duration) -> AcquireRequest {
    let mut req = AcquireRequest::new(name.clone(), OwnerToken::random(), ttl);
    req.mode = mode;
    req
}

/// Waits (polling `inspect`) until nobody holds `name`: a lease left to run out.
async fn until_free(backend: &SqlBackend, name: &LockName) {
    let bound = tokio::time::Instant::now() + scaled(Duration::from_secs(20));
    loop {
        let info = backend.inspect(name).await.expect("inspect");
        if !info.held && info.shares.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < bound,
            "{name}: still held: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An attempt re-sent with the same owner token (its first try committed, its reply was lost,
/// its lease ran out, and another holder came in a mode that excludes it) re-checks everything
/// the first try checked: it does not take the name beside that holder. Regression (MariaDB
/// lease): the exclusive upsert retook its own row whatever the live shares, and cleared
/// `shares_until`, so a writer held beside a reader, and the next writer too.
#[tokio::test]
async fn a_retried_attempt_rechecks_what_the_first_checked() {
    let cases = [
        (LockMode::Exclusive, LockMode::Shared),
        (LockMode::Exclusive, LockMode::Permit { limit: 2 }),
        (LockMode::Exclusive, LockMode::Exclusive),
        (LockMode::Shared, LockMode::Exclusive),
        (LockMode::Permit { limit: 1 }, LockMode::Permit { limit: 1 }),
        (LockMode::Permit { limit: 2 }, LockMode::Exclusive),
    ];
    for (label, url) in lease_variants() {
        let backend = SqlBackend::connect(&url).await.expect("connect");
        let other = SqlBackend::connect(&url).await.expect("connect");
        for (retried, intruder) in cases {
            let name = LockName::new(unique("retry-recheck")).unwrap();
            let case = format!("{label}: {retried} retried past a {intruder} holder");
            // The first try commits; its reply is lost (the lease is never released).
            let first = request(&name, retried, Duration::from_millis(300));
            let won = backend.try_acquire(&first).await.expect("first try");
            assert!(won.is_some(), "{case}: the first try took nothing");
            std::mem::forget(won);
            until_free(&backend, &name).await;
            // Another holder comes once the lease ran out.
            let held = request(&name, intruder, Duration::from_secs(30));
            let intruding = other.try_acquire(&held).await.expect("intruder");
            assert!(intruding.is_some(), "{case}: the intruder took nothing");
            // The same request again, same token.
            match backend.try_acquire(&first).await {
                Ok(None) => {}
                Err(e) if e.kind() == ErrorKind::Conflict => {}
                Ok(Some(_)) => panic!("{case}: the retry holds beside the intruder"),
                Err(e) => panic!("{case}: {e}"),
            }
            // The intruder still holds alone: a second writer gets nothing either.
            let second = request(&name, LockMode::Exclusive, Duration::from_secs(30));
            match other.try_acquire(&second).await {
                Ok(None) => {}
                Err(e) if e.kind() == ErrorKind::Conflict => {}
                Ok(Some(_)) => panic!("{case}: a second writer holds beside the intruder"),
                Err(e) => panic!("{case}: {e}"),
            }
            intruding.unwrap().lease.release().await.expect("release");
        }
    }
}
