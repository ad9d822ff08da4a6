//! What lock-sql's test binaries share: server URLs and their variants (LOCK_TEST_* from
//! scripts/servers.sh env; unset means skip, unless LOCK_TEST_REQUIRE_ALL is set), unique
//! names, clients, scaled bounds. Each binary uses part of it.
#![allow(dead_code)]

use std::time::Duration;

use lock_sql::SqlBackend;
use lockcore::{LockOptions, Locker};

/// `url` with query parameters `params` added.
pub fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// A lock name (or any label) no other run uses: `prefix` and a random suffix.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// `d` stretched by `LOCK_TEST_TIME_SCALE` (a loaded machine).
pub fn scaled(d: Duration) -> Duration {
    d.mul_f64(conformance::time_scale())
}

/// The SQLite database of the tests: `LOCK_TEST_SQLITE_URL`, else (outside CI only) a
/// temporary file of this process.
pub fn sqlite_url() -> String {
    match std::env::var("LOCK_TEST_SQLITE_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => {
            let _ = conformance::require_env("LOCK_TEST_SQLITE_URL");
            let path =
                std::env::temp_dir().join(format!("lock-sql-test-{}.db", std::process::id()));
            format!("sqlite://{}", path.display())
        }
    }
}

/// (label, url) of every variant whose server is configured: both strategies on PostgreSQL
/// and MariaDB, leases on SQLite.
pub fn variants() -> Vec<(&'static str, String)> {
    let mut v = Vec::new();
    if let Some(pg) = conformance::require_env("LOCK_TEST_POSTGRES_URL") {
        v.push(("pg-row-lock", with_params(&pg, "strategy=row-lock")));
        v.push(("pg-lease", with_params(&pg, "strategy=lease")));
    }
    if let Some(my) = conformance::require_env("LOCK_TEST_MYSQL_URL") {
        v.push(("mysql-row-lock", with_params(&my, "strategy=row-lock")));
        v.push(("mysql-lease", with_params(&my, "strategy=lease")));
    }
    v.push(("sqlite-lease", sqlite_url()));
    v
}

/// The variants of one strategy: `"lease"` or `"row-lock"`.
pub fn variants_of(strategy: &str) -> Vec<(&'static str, String)> {
    variants()
        .into_iter()
        .filter(|(label, _)| label.ends_with(strategy))
        .collect()
}

/// The lease variants (every dialect).
pub fn lease_variants() -> Vec<(&'static str, String)> {
    variants_of("lease")
}

/// The PostgreSQL URL with `params`, or `None` (skipped) when no server is configured.
pub fn pg_url(params: &str) -> Option<String> {
    conformance::require_env("LOCK_TEST_POSTGRES_URL").map(|pg| with_params(&pg, params))
}

/// The MySQL/MariaDB URL with `params`, or `None` (skipped) when no server is configured.
pub fn my_url(params: &str) -> Option<String> {
    conformance::require_env("LOCK_TEST_MYSQL_URL").map(|my| with_params(&my, params))
}

/// A client of `url`.
pub async fn client(url: &str) -> Locker {
    Locker::new(SqlBackend::connect(url).await.expect("connect"))
}

/// Two clients of `url` (connected separately: they share no connection).
pub async fn two_clients(url: &str) -> (Locker, Locker) {
    (client(url).await, client(url).await)
}

/// Options of a lease of `ttl` whose `lock()` waits up to `wait`.
pub fn opts(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).wait_timeout(wait)
}
