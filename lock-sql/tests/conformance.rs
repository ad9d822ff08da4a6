//! The conformance suite against PostgreSQL, MySQL/MariaDB and SQLite, both strategies.

use std::sync::Arc;
use std::time::Duration;

use conformance::{ClientProxies, Harness, ReplyLoser, RequestCount, Target, url_with_param};
use lock_sql::SqlBackend;
use lockcore::backend::async_trait;
use lockcore::{LockGuard, Locker, Result};

struct SqlHarness {
    label: String,
    url: String,
    row_lock: bool,
    delayed: ClientProxies,
}

#[async_trait]
impl Harness for SqlHarness {
    fn label(&self) -> String {
        self.label.clone()
    }

    async fn client(&self) -> Result<Locker> {
        Ok(Locker::new(SqlBackend::connect(&self.url).await?))
    }

    /// A crashed row-lock holder is a process whose connection died: the server ends the
    /// holding session (as it does when the socket of a killed process closes). A lease holder
    /// just stops renewing; its row expires after the TTL.
    async fn crash(&self, guard: LockGuard, client: Locker) {
        if self.row_lock {
            let name = guard.name().clone();
            let admin = SqlBackend::connect(&self.url)
                .await
                .expect("admin connection");
            guard.abandon();
            admin.revoke(&name).await.expect("terminating the holder");
        } else {
            guard.abandon();
        }
        drop(client);
    }

    fn can_revoke(&self) -> bool {
        true
    }

    fn min_scenario_ttl(&self) -> Duration {
        Duration::from_millis(300)
    }

    fn max_name_len(&self) -> usize {
        if self.url.contains("interop=get_lock") {
            lock_sql::MAX_GET_LOCK_CHARS
        } else {
            lockcore::MAX_NAME_LEN
        }
    }

    fn can_open_other_namespace(&self) -> bool {
        // Under interop= a lock is the peer's (the exact name, or the peer's key): the
        // `table` setting does not apply, by design.
        !self.url.contains("interop=")
    }

    /// The `table` parameter: another lock table in the same database.
    async fn client_in_other_namespace(&self) -> Result<Locker> {
        Ok(Locker::new(
            SqlBackend::connect(&url_with_param(&self.url, "table", "locksmith_locks_other"))
                .await?,
        ))
    }

    fn can_delay_replies(&self) -> bool {
        // SQLite is a file: there is no reply path to delay.
        ClientProxies::can_proxy(&self.url)
    }

    /// Through faultkit proxies delaying every reply (the harness keeps them running).
    async fn client_with_reply_delay(&self, delay: Duration) -> Result<Locker> {
        let url = self.delayed.url(&self.url, delay).await?;
        Ok(Locker::new(SqlBackend::connect(&url).await?))
    }

    fn can_count_requests(&self) -> bool {
        self.can_delay_replies()
    }

    /// Through a faultkit proxy that counts the requests.
    async fn client_counting_requests(&self) -> Result<(Locker, RequestCount)> {
        let (url, count) = self.delayed.counting(&self.url).await?;
        Ok((Locker::new(SqlBackend::connect(&url).await?), count))
    }

    fn can_lose_replies(&self) -> bool {
        // A lost reply is picked by the lock name in the request: not through TLS, nor under
        // interop=sqlx (its requests carry sqlx's numeric key of the name).
        self.can_delay_replies()
            && ClientProxies::sees_clear_text(&self.url)
            && !self.url.contains("interop=sqlx")
    }

    /// Through a faultkit proxy that loses the replies asked for.
    async fn client_losing_replies(&self) -> Result<(Locker, Arc<dyn ReplyLoser>)> {
        let (url, loser) = self.delayed.losing(&self.url).await?;
        Ok((Locker::new(SqlBackend::connect(&url).await?), loser))
    }
}

fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

fn target(label: &'static str, env: &'static str, params: &'static str) -> Target {
    Target::new(label, env, move |url| {
        Arc::new(SqlHarness {
            label: label.into(),
            url: with_params(&url, params),
            row_lock: params.contains("row-lock"),
            delayed: ClientProxies::new(),
        }) as Arc<dyn Harness>
    })
}

fn main() -> std::process::ExitCode {
    let mut targets = vec![
        target(
            "postgres-row-lock",
            "LOCK_TEST_POSTGRES_URL",
            "strategy=row-lock",
        ),
        target("postgres-lease", "LOCK_TEST_POSTGRES_URL", "strategy=lease"),
        target(
            "postgres-tls-lease",
            "LOCK_TEST_POSTGRES_TLS_URL",
            "strategy=lease",
        ),
        target("mysql-row-lock", "LOCK_TEST_MYSQL_URL", "strategy=row-lock"),
        target("mysql-lease", "LOCK_TEST_MYSQL_URL", "strategy=lease"),
        // A user who may not create (or run) the share procedures: shares take the
        // transaction of statements instead.
        target(
            "mysql-lease-no-routines",
            "LOCK_TEST_MYSQL_PLAIN_URL",
            "strategy=lease",
        ),
        // The interop modes keep the contract on the peers' keys (issue 23).
        target(
            "postgres-interop-sqlx",
            "LOCK_TEST_POSTGRES_URL",
            "strategy=row-lock&interop=sqlx",
        ),
        target(
            "mysql-interop-get_lock",
            "LOCK_TEST_MYSQL_URL",
            "strategy=row-lock&interop=get_lock",
        ),
        target(
            "mysql-tls-lease",
            "LOCK_TEST_MYSQL_TLS_URL",
            "strategy=lease",
        ),
    ];
    let sqlite_set = std::env::var("LOCK_TEST_SQLITE_URL").is_ok_and(|v| !v.is_empty());
    if sqlite_set || std::env::var_os(conformance::REQUIRE_ALL_ENV).is_some() {
        targets.push(target(
            "sqlite-lease",
            "LOCK_TEST_SQLITE_URL",
            "strategy=lease",
        ));
    } else {
        // Outside CI only: a temporary file stands in for the configured database.
        let path =
            std::env::temp_dir().join(format!("lock-sql-conformance-{}.db", std::process::id()));
        targets.push(Target::fixed(
            "sqlite-lease",
            format!("sqlite://{}", path.display()),
            |url| {
                Arc::new(SqlHarness {
                    label: "sqlite-lease".into(),
                    url,
                    row_lock: false,
                    delayed: ClientProxies::new(),
                }) as Arc<dyn Harness>
            },
        ));
    }
    conformance::run_tests(targets)
}
