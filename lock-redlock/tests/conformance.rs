//! The shared conformance suite against Redlock over the test servers' 5 independent masters
//! (`LOCK_TEST_REDLOCK_URL`, or built from `LOCK_TEST_REDLOCK_URLS`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::{Harness, Target};
use lock_redlock::RedlockBackend;
use lockcore::{Locker, Result};

/// Clients from one URL; revocation through a separate admin client, as an operator would.
struct RedlockHarness {
    url: String,
    /// The latency proxies of clients with delayed replies (one per master), kept for the run.
    proxies: Mutex<Vec<faultkit::Proxy>>,
}

#[lockcore::backend::async_trait]
impl Harness for RedlockHarness {
    fn label(&self) -> String {
        "redlock".to_owned()
    }

    async fn client(&self) -> Result<Locker> {
        Ok(Locker::new(RedlockBackend::connect(&self.url).await?))
    }

    fn can_revoke(&self) -> bool {
        true
    }

    fn can_delay_replies(&self) -> bool {
        true
    }

    /// Every master through its own faultkit proxy delaying replies by `delay`; the per-node
    /// timeout is set well above the delay (a vote that comes back late is still a vote here:
    /// the scenario checks that the validity counts from the send).
    async fn client_with_reply_delay(&self, delay: Duration) -> Result<Locker> {
        let (base, query) = self.url.split_once('?').unwrap_or((&self.url, ""));
        let (scheme, hosts) = base.split_once("://").expect("a redlock:// URL");
        let mut proxied = Vec::new();
        for host in hosts.trim_end_matches('/').split(',') {
            let addr = tokio::net::lookup_host(host)
                .await
                .ok()
                .and_then(|mut a| a.next())
                .unwrap_or_else(|| panic!("cannot resolve {host}"));
            let proxy = faultkit::Proxy::start(addr).await.expect("a proxy");
            proxy.set_latency(faultkit::Direction::ToClient, delay);
            proxied.push(format!("127.0.0.1:{}", proxy.port()));
            self.proxies.lock().expect("proxies").push(proxy);
        }
        let timeout = (delay * 8).as_millis();
        let sep = if query.is_empty() { "" } else { "&" };
        let url = format!(
            "{scheme}://{}?{query}{sep}node_timeout_ms={timeout}",
            proxied.join(",")
        );
        Ok(Locker::new(RedlockBackend::connect(&url).await?))
    }
}

/// `LOCK_TEST_REDLOCK_URLS` (the masters as `redis://` URLs) as one `redlock://` URL.
fn from_node_list(urls: &str) -> String {
    let hosts: Vec<&str> = urls
        .split(',')
        .map(|u| u.trim_start_matches("redis://").trim_end_matches('/'))
        .collect();
    format!("redlock://{}", hosts.join(","))
}

fn main() -> std::process::ExitCode {
    let make = |url| {
        Arc::new(RedlockHarness {
            url,
            proxies: Mutex::new(Vec::new()),
        }) as Arc<dyn Harness>
    };
    // scripts/servers.sh exports both; older environments only have the node list.
    let target = match (
        std::env::var("LOCK_TEST_REDLOCK_URL"),
        std::env::var("LOCK_TEST_REDLOCK_URLS"),
    ) {
        (Err(_), Ok(urls)) if !urls.is_empty() => {
            Target::fixed("redlock", from_node_list(&urls), make)
        }
        _ => Target::new("redlock", "LOCK_TEST_REDLOCK_URL", make),
    };
    conformance::run_tests(vec![target])
}
