//! The shared conformance suite against every Redis variant the test servers provide.

use std::sync::Arc;
use std::time::Duration;

use conformance::{ClientProxies, Harness, ReplyLoser, RequestCount, Target, url_with_param};
use lock_redis::RedisBackend;
use lockcore::{Locker, Result};

/// Clients from one URL; revocation through a separate admin client, as an operator would.
struct RedisHarness {
    label: &'static str,
    url: String,
    delayed: ClientProxies,
}

#[lockcore::backend::async_trait]
impl Harness for RedisHarness {
    fn label(&self) -> String {
        self.label.to_owned()
    }

    async fn client(&self) -> Result<Locker> {
        Ok(Locker::new(RedisBackend::connect(&self.url).await?))
    }

    fn can_revoke(&self) -> bool {
        true
    }

    /// `poll_ms=10000`: a waiter whose release message never reached it waits 5 to 10 s.
    async fn client_with_long_poll(&self) -> Result<Locker> {
        Ok(Locker::new(
            RedisBackend::connect(&url_with_param(&self.url, "poll_ms", "10000")).await?,
        ))
    }

    fn can_open_other_namespace(&self) -> bool {
        // Under interop= a lock is the peer's (the exact name, or the peer's key): the
        // `namespace` setting does not apply, by design.
        !self.url.contains("interop=")
    }

    /// The `namespace` parameter: another key prefix.
    async fn client_in_other_namespace(&self) -> Result<Locker> {
        Ok(Locker::new(
            RedisBackend::connect(&url_with_param(&self.url, "namespace", "lsc-other")).await?,
        ))
    }

    fn can_delay_replies(&self) -> bool {
        // A cluster client follows the nodes' announced addresses, around any proxy.
        !self.url.starts_with("redis+cluster") && ClientProxies::can_proxy(&self.url)
    }

    /// Through faultkit proxies delaying every reply (the harness keeps them running).
    async fn client_with_reply_delay(&self, delay: Duration) -> Result<Locker> {
        let url = self.delayed.url(&self.url, delay).await?;
        Ok(Locker::new(RedisBackend::connect(&url).await?))
    }

    fn can_count_requests(&self) -> bool {
        self.can_delay_replies()
    }

    /// Through a faultkit proxy that counts the requests.
    async fn client_counting_requests(&self) -> Result<(Locker, RequestCount)> {
        let (url, count) = self.delayed.counting(&self.url).await?;
        Ok((Locker::new(RedisBackend::connect(&url).await?), count))
    }

    fn can_lose_replies(&self) -> bool {
        // A lost reply is picked by the lock name in the request: not through TLS.
        self.can_delay_replies() && ClientProxies::sees_clear_text(&self.url)
    }

    /// Through a faultkit proxy that loses the replies asked for.
    async fn client_losing_replies(&self) -> Result<(Locker, Arc<dyn ReplyLoser>)> {
        let (url, loser) = self.delayed.losing(&self.url).await?;
        Ok((Locker::new(RedisBackend::connect(&url).await?), loser))
    }
}

/// Appends the TLS test server's CA (from `LOCK_TEST_REDIS_TLS_CA`) as `?tls_ca=`.
fn with_test_ca(url: String) -> String {
    match std::env::var("LOCK_TEST_REDIS_TLS_CA") {
        Ok(ca) if !ca.is_empty() && !url.contains("tls_ca=") => {
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}tls_ca={ca}")
        }
        _ => url,
    }
}

fn target(label: &'static str, var: &'static str) -> Target {
    target_with(label, var, "")
}

/// A target on the server of `var` with `params` added to its URL (`interop=...`).
fn target_with(label: &'static str, var: &'static str, params: &'static str) -> Target {
    Target::new(label, var, move |url| {
        let url = if url.starts_with("rediss") {
            with_test_ca(url)
        } else {
            url
        };
        let url = if params.is_empty() {
            url
        } else {
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}{params}")
        };
        Arc::new(RedisHarness {
            label,
            url,
            delayed: ClientProxies::new(),
        }) as Arc<dyn Harness>
    })
}

fn main() -> std::process::ExitCode {
    conformance::run_tests(vec![
        target("redis", "LOCK_TEST_REDIS_URL"),
        target("redis-auth", "LOCK_TEST_REDIS_AUTH_URL"),
        target("redis-acl", "LOCK_TEST_REDIS_ACL_URL"),
        target("redis-tls", "LOCK_TEST_REDIS_TLS_URL"),
        target("redis-cluster", "LOCK_TEST_REDIS_CLUSTER_URL"),
        // The interop modes keep the contract with the peers' layouts (issue 23).
        target_with(
            "redis-interop-redis-py",
            "LOCK_TEST_REDIS_URL",
            "interop=redis-py",
        ),
        target_with(
            "redis-interop-redisson",
            "LOCK_TEST_REDIS_URL",
            "interop=redisson",
        ),
    ])
}
