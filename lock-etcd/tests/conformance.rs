//! The conformance suite against etcd: the shared single node (`LOCK_TEST_ETCD_URL`) and the
//! TLS + RBAC variant (`LOCK_TEST_ETCD_TLS_URL`, `etcds://user:password@...?ca=...`).

use std::sync::Arc;
use std::time::Duration;

use conformance::{ClientProxies, Harness, ReplyLoser, RequestCount, Target, url_with_path};
use lock_etcd::EtcdBackend;
use lockcore::backend::async_trait;
use lockcore::{Locker, Result};

/// etcd leases are whole seconds; the test servers' minimum lease TTL is 1 s.
const MIN_TTL: Duration = Duration::from_secs(1);

struct EtcdHarness {
    label: &'static str,
    url: String,
    delayed: ClientProxies,
}

#[async_trait]
impl Harness for EtcdHarness {
    fn label(&self) -> String {
        self.label.into()
    }

    async fn client(&self) -> Result<Locker> {
        Ok(Locker::new(EtcdBackend::connect(&self.url).await?))
    }

    /// An operator's admin delete of the lock's keys (`force_release` from another client).
    fn can_revoke(&self) -> bool {
        true
    }

    fn min_scenario_ttl(&self) -> Duration {
        MIN_TTL
    }

    fn can_open_other_namespace(&self) -> bool {
        true
    }

    /// Another key prefix (the URL path), under `locksmith/`, where the TLS server's role may write.
    async fn client_in_other_namespace(&self) -> Result<Locker> {
        Ok(Locker::new(
            EtcdBackend::connect(&url_with_path(&self.url, "/locksmith/lsc-other")).await?,
        ))
    }

    fn can_delay_replies(&self) -> bool {
        ClientProxies::can_proxy(&self.url)
    }

    /// Through faultkit proxies delaying every reply (the harness keeps them running).
    async fn client_with_reply_delay(&self, delay: Duration) -> Result<Locker> {
        let url = self.delayed.url(&self.url, delay).await?;
        Ok(Locker::new(EtcdBackend::connect(&url).await?))
    }

    fn can_count_requests(&self) -> bool {
        self.can_delay_replies()
    }

    /// Through a faultkit proxy that counts the requests.
    async fn client_counting_requests(&self) -> Result<(Locker, RequestCount)> {
        let (url, count) = self.delayed.counting(&self.url).await?;
        Ok((Locker::new(EtcdBackend::connect(&url).await?), count))
    }

    fn can_lose_replies(&self) -> bool {
        // A lost reply is picked by the lock name in the request: not through TLS.
        self.can_delay_replies() && ClientProxies::sees_clear_text(&self.url)
    }

    /// Through a faultkit proxy that loses the replies asked for.
    async fn client_losing_replies(&self) -> Result<(Locker, Arc<dyn ReplyLoser>)> {
        let (url, loser) = self.delayed.losing(&self.url).await?;
        Ok((Locker::new(EtcdBackend::connect(&url).await?), loser))
    }
}

fn main() -> std::process::ExitCode {
    let target = |label: &'static str, var: &str| {
        Target::new(label, var, move |url| {
            Arc::new(EtcdHarness {
                label,
                url,
                delayed: ClientProxies::new(),
            }) as Arc<dyn Harness>
        })
    };
    conformance::run_tests(vec![
        target("etcd", "LOCK_TEST_ETCD_URL"),
        target("etcd-tls", "LOCK_TEST_ETCD_TLS_URL"),
    ])
}
