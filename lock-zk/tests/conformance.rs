//! The conformance suite against ZooKeeper (`LOCK_TEST_ZK_URL`), and again over TLS to its
//! secure client port (`LOCK_TEST_ZK_TLS_URL`, `zks://...?ca=...&cert=...&key=...`).
//!
//! Every client connects through faultkit proxies of its own so that `crash` can play a killed
//! process: its connections and reconnections are reset, the session is never closed and
//! expires on the server one session timeout later (dropping a client would close its session
//! and delete its ephemeral nodes at once).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::{
    ClientProxies, Harness, ProxyGroup, ReplyLoser, RequestCount, Target, url_with_param,
};
use lock_zk::ZkBackend;
use lockcore::backend::async_trait;
use lockcore::{LockGuard, LockName, Locker, Result};

/// The session timeout the tests ask for (the server has tickTime=500, minSessionTimeout=1000).
const SESSION_TIMEOUT_MS: u64 = 2000;

struct ZkHarness {
    label: &'static str,
    url: String,
    /// Every client's proxies (kept running, those of crashed clients resetting).
    proxies: ClientProxies,
    /// The proxies of each live client.
    groups: Mutex<HashMap<usize, ProxyGroup>>,
}

fn key(locker: &Locker) -> usize {
    Arc::as_ptr(locker.backend()) as *const () as usize
}

#[async_trait]
impl Harness for ZkHarness {
    fn label(&self) -> String {
        self.label.into()
    }

    async fn client(&self) -> Result<Locker> {
        let (url, group) = self.proxies.group(&self.url, Duration::ZERO).await?;
        let locker = Locker::new(ZkBackend::connect(&url).await?);
        // A key reused by a new client belongs to a client that is gone: replace its group.
        self.groups.lock().unwrap().insert(key(&locker), group);
        Ok(locker)
    }

    async fn crash(&self, guard: LockGuard, client: Locker) {
        guard.abandon();
        if let Some(group) = self.groups.lock().unwrap().remove(&key(&client)) {
            // Kept (resetting every reconnection) so the session can only expire.
            self.proxies.crash(group);
        }
        drop(client);
    }

    fn can_revoke(&self) -> bool {
        true
    }

    async fn revoke(&self, name: &LockName) -> Result<()> {
        // An operator's session with the same identity (digest) as the clients, without a
        // proxy of its own.
        let admin = Locker::new(ZkBackend::connect(&self.url).await?);
        admin.force_release(name).await.map(drop)
    }

    fn min_scenario_ttl(&self) -> Duration {
        Duration::from_millis(SESSION_TIMEOUT_MS)
    }

    fn can_open_other_namespace(&self) -> bool {
        true
    }

    /// The `namespace` parameter: another top-level node.
    async fn client_in_other_namespace(&self) -> Result<Locker> {
        Ok(Locker::new(
            ZkBackend::connect(&url_with_param(&self.url, "namespace", "lsc-other")).await?,
        ))
    }

    fn can_delay_replies(&self) -> bool {
        ClientProxies::can_proxy(&self.url)
    }

    /// Through faultkit proxies delaying every reply (the harness keeps them running).
    async fn client_with_reply_delay(&self, delay: Duration) -> Result<Locker> {
        let url = self.proxies.url(&self.url, delay).await?;
        Ok(Locker::new(ZkBackend::connect(&url).await?))
    }

    fn can_count_requests(&self) -> bool {
        self.can_delay_replies()
    }

    /// Through a faultkit proxy that counts the requests.
    async fn client_counting_requests(&self) -> Result<(Locker, RequestCount)> {
        let (url, count) = self.proxies.counting(&self.url).await?;
        Ok((Locker::new(ZkBackend::connect(&url).await?), count))
    }

    fn can_lose_replies(&self) -> bool {
        // A lost reply is picked by the lock name in the request: not through TLS.
        self.can_delay_replies() && ClientProxies::sees_clear_text(&self.url)
    }

    /// Through a faultkit proxy that loses the replies asked for.
    async fn client_losing_replies(&self) -> Result<(Locker, Arc<dyn ReplyLoser>)> {
        let (url, loser) = self.proxies.losing(&self.url).await?;
        Ok((Locker::new(ZkBackend::connect(&url).await?), loser))
    }
}

fn main() -> std::process::ExitCode {
    let target = |label: &'static str, var: &str| {
        Target::new(label, var, move |url| {
            Arc::new(ZkHarness {
                label,
                url: url_with_param(&url, "session_timeout_ms", &SESSION_TIMEOUT_MS.to_string()),
                proxies: ClientProxies::new(),
                groups: Mutex::new(HashMap::new()),
            }) as Arc<dyn Harness>
        })
    };
    conformance::run_tests(vec![
        target("zk", "LOCK_TEST_ZK_URL"),
        target("zk-tls", "LOCK_TEST_ZK_TLS_URL"),
    ])
}
