//! The shared conformance suite against Redlock over the test servers' 5 independent masters
//! (`LOCK_TEST_REDLOCK_URL`, or built from `LOCK_TEST_REDLOCK_URLS`).

use std::sync::Arc;
use std::time::Duration;

use conformance::{ClientProxies, Harness, ReplyLoser, RequestCount, Target, url_with_param};
use lock_redlock::RedlockBackend;
use lockcore::{Locker, Result};

/// Clients from one URL; revocation through a separate admin client, as an operator would.
struct RedlockHarness {
    label: &'static str,
    url: String,
    /// The latency proxies of clients with delayed replies (one per master), kept for the run.
    delayed: ClientProxies,
}

#[lockcore::backend::async_trait]
impl Harness for RedlockHarness {
    fn label(&self) -> String {
        self.label.to_owned()
    }

    async fn client(&self) -> Result<Locker> {
        Ok(Locker::new(RedlockBackend::connect(&self.url).await?))
    }

    fn can_revoke(&self) -> bool {
        true
    }

    /// `poll_ms=10000`: a waiter whose release message never reached it waits 5 to 10 s.
    async fn client_with_long_poll(&self) -> Result<Locker> {
        Ok(Locker::new(
            RedlockBackend::connect(&url_with_param(&self.url, "poll_ms", "10000")).await?,
        ))
    }

    fn can_open_other_namespace(&self) -> bool {
        true
    }

    /// The `namespace` parameter: another key prefix on every master.
    async fn client_in_other_namespace(&self) -> Result<Locker> {
        Ok(Locker::new(
            RedlockBackend::connect(&url_with_param(&self.url, "namespace", "lsc-other")).await?,
        ))
    }

    fn can_delay_replies(&self) -> bool {
        true
    }

    /// Every master through its own faultkit proxy delaying replies by `delay`; the per-node
    /// timeout is set well above the delay (a vote that comes back late is still a vote here:
    /// the scenario checks that the validity counts from the send).
    async fn client_with_reply_delay(&self, delay: Duration) -> Result<Locker> {
        let url = self.delayed.url(&self.url, delay).await?;
        let timeout = (delay * 8).as_millis();
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}node_timeout_ms={timeout}");
        Ok(Locker::new(RedlockBackend::connect(&url).await?))
    }

    fn can_count_requests(&self) -> bool {
        true
    }

    /// Every master through its own counting proxy: the requests to all masters together.
    async fn client_counting_requests(&self) -> Result<(Locker, RequestCount)> {
        let (url, count) = self.delayed.counting(&self.url).await?;
        Ok((Locker::new(RedlockBackend::connect(&url).await?), count))
    }

    fn can_lose_replies(&self) -> bool {
        // A lost reply is picked by the lock name in the request: not through TLS.
        self.can_delay_replies() && ClientProxies::sees_clear_text(&self.url)
    }

    /// Every master through its own faultkit proxy, each losing its reply to the request
    /// asked for (a vote applied on every master, heard from none).
    async fn client_losing_replies(&self) -> Result<(Locker, Arc<dyn ReplyLoser>)> {
        let (url, loser) = self.delayed.losing(&self.url).await?;
        Ok((Locker::new(RedlockBackend::connect(&url).await?), loser))
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

/// The masters of the test servers, handing a lock over as `params` says (empty: the default,
/// `handover=grant`).
fn target(label: &'static str, params: &'static str) -> Target {
    let make = move |url: String| {
        let url = if params.is_empty() {
            url
        } else {
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}{params}")
        };
        Arc::new(RedlockHarness {
            label,
            url,
            delayed: ClientProxies::new(),
        }) as Arc<dyn Harness>
    };
    // scripts/servers.sh exports both; older environments only have the node list.
    match (
        std::env::var("LOCK_TEST_REDLOCK_URL"),
        std::env::var("LOCK_TEST_REDLOCK_URLS"),
    ) {
        (Err(_), Ok(urls)) if !urls.is_empty() => Target::fixed(label, from_node_list(&urls), make),
        _ => Target::new(label, "LOCK_TEST_REDLOCK_URL", make),
    }
}

fn main() -> std::process::ExitCode {
    conformance::run_tests(vec![
        target("redlock", ""),
        // The wake-up hand-over (each master's release wakes its queue's head to vote) keeps
        // the contract too.
        target("redlock-wake", "handover=wake"),
    ])
}
