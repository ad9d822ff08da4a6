//! The conformance harness of a URL: every client is a fresh `locksmith::connect(url)`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conformance::{
    ClientProxies, Harness, HolderProcess, ProxyGroup, ReplyLoser, RequestCount, SkewedHolder,
    url_with_param, url_with_path,
};
use locksmith::registry::{HarnessHints, OtherNamespace};
use locksmith::{ErrorKind, Instant, LockGuard, LockName, Locker, Result, redact_url};

/// A harness holding only a URL (and what one probe learnt), so it works from any runtime.
pub struct UrlHarness {
    label: String,
    url: String,
    can_revoke: bool,
    min_ttl: Duration,
    /// Proxies of the clients with delayed replies, and of those to crash.
    proxies: ClientProxies,
    /// The proxies of each client to crash, by the client's backend.
    crashable: Mutex<HashMap<usize, ProxyGroup>>,
    /// For `memory:` URLs, the probe's client, kept while the harness lives: an in-process
    /// store lives while a client holds it, and a scenario whose first client finished before
    /// the next one connected met a fresh store (its fencing counter back at 1: seen once as
    /// `mutual_exclusion_under_contention` failing on `memory://` in `locksmith report`).
    _store_keeper: Option<Locker>,
}

/// A client's identity while it lives: its backend's address.
fn key(locker: &Locker) -> usize {
    Arc::as_ptr(locker.backend()) as *const () as usize
}

/// What the registry says about the backend of `url` for this harness (`None` for a scheme it
/// does not know or a backend not compiled in).
fn hints(url: &str) -> Option<(String, HarnessHints)> {
    let scheme = locksmith::scheme_of(url).ok()?;
    let backend = locksmith::backend_for_scheme(&scheme)?.compiled?;
    Some((scheme, backend.harness))
}

/// Whether clients of `url` can go through proxies: loopback servers, of a scheme whose client
/// keeps to the addresses it is given (a cluster client follows the nodes' announced addresses
/// around a proxy).
fn proxiable(url: &str) -> bool {
    let unproxiable =
        hints(url).is_some_and(|(scheme, h)| h.unproxiable_schemes.contains(&scheme.as_str()));
    !unproxiable && ClientProxies::can_proxy(url)
}

/// How long a holder process may take to start, connect and take a free lock.
const HOLDER_START: Duration = Duration::from_secs(30);

/// A holder process of this executable's hidden `holder` subcommand for `url`, renewing its
/// lease.
fn holder_spec(url: &str, name: &LockName, ttl: Duration) -> Result<faultkit::HolderSpec> {
    let exe = std::env::current_exe().map_err(|e| {
        locksmith::Error::backend("finding the locksmith executable for a holder process", e)
    })?;
    let mut spec = faultkit::HolderSpec::new(exe, url, name.as_str(), ttl);
    spec.prefix = vec!["holder".into()];
    spec.renew = true;
    Ok(spec)
}

/// Maps a holder process's failure to a backend error saying what it did not do.
fn holder_failed(what: &'static str) -> impl Fn(faultkit::Error) -> locksmith::Error {
    move |e| locksmith::Error::new(ErrorKind::Backend, format!("a holder process {what}: {e}"))
}

impl UrlHarness {
    /// Connects once to learn whether the backend can force-release locks and its smallest TTL;
    /// a failed probe is not reported here (the suite reports it as every scenario failing).
    pub async fn probe(label: String, url: String) -> Self {
        let (can_revoke, min_ttl, store_keeper) = match locksmith::connect(&url).await {
            Ok(client) => {
                let caps = client.capabilities();
                let (can_revoke, min_ttl) = (caps.force_release, caps.min_ttl);
                client.flush().await;
                let keeper = url.starts_with("memory:").then_some(client);
                (can_revoke, min_ttl, keeper)
            }
            Err(_) => (false, Duration::ZERO, None),
        };
        // The backend's floor (etcd grants leases in whole seconds).
        let floor = hints(&url).map_or(HarnessHints::DEFAULT.min_scenario_ttl, |(_, h)| {
            h.min_scenario_ttl
        });
        UrlHarness {
            label,
            url,
            can_revoke,
            min_ttl: min_ttl.max(floor),
            proxies: ClientProxies::new(),
            crashable: Mutex::new(HashMap::new()),
            _store_keeper: store_keeper,
        }
    }

    /// The URL with its password redacted.
    pub fn shown_url(&self) -> String {
        redact_url(&self.url)
    }
}

#[async_trait]
impl Harness for UrlHarness {
    fn label(&self) -> String {
        self.label.clone()
    }

    async fn client(&self) -> Result<Locker> {
        locksmith::connect(&self.url).await
    }

    fn can_revoke(&self) -> bool {
        self.can_revoke
    }

    /// Holders are this executable's hidden `holder` subcommand (as in the fault suite); an
    /// in-process store (`memory://`) has nothing another process could hold.
    fn can_kill_holder_process(&self) -> bool {
        !self.url.starts_with("memory:")
    }

    async fn killed_holder_process(&self, name: &LockName, ttl: Duration) -> Result<Instant> {
        let mut spec = holder_spec(&self.url, name, ttl)?;
        spec.id = "killed-holder".into();
        // Killed on drop, also when this call is dropped.
        let mut holder = faultkit::Holder::spawn(&spec).map_err(holder_failed("did not start"))?;
        holder
            .wait_for("acquired", HOLDER_START)
            .await
            .map_err(holder_failed("did not take the lock"))?;
        let killed = Instant::now();
        holder
            .kill()
            .await
            .map_err(holder_failed("could not be killed"))?;
        Ok(killed)
    }

    /// Where libfaketime is installed (Debian package `faketime`) and holders can run.
    fn can_run_skewed_process(&self) -> bool {
        self.can_kill_holder_process() && faultkit::libfaketime().is_some()
    }

    async fn skewed_holder_process(
        &self,
        holder: &SkewedHolder<'_>,
    ) -> Result<Option<HolderProcess>> {
        let (ahead, wait) = (holder.ahead, holder.wait);
        // Only the wall clock: tokio's timers keep to the real monotonic clock.
        let mut spec = holder_spec(&self.url, holder.name, holder.ttl)?;
        spec.clock_ahead = Some(ahead);
        spec.wait = wait;
        spec.permits = holder.permits;
        spec.id = "skewed-holder".into();
        let mut holder = faultkit::Holder::spawn(&spec).map_err(holder_failed("did not start"))?;
        let connected = holder
            .wait_for("connected", HOLDER_START)
            .await
            .map_err(holder_failed("did not connect"))?;
        // Its events carry its wall clock: unless it runs ahead, the scenario proves nothing.
        let skew = connected.t_us as i128 - faultkit::now_unix_micros() as i128;
        if skew < (ahead / 2).as_micros() as i128 {
            return Err(locksmith::Error::new(
                ErrorKind::Backend,
                format!(
                    "libfaketime did not skew the holder process's clock ({skew} us ahead, \
                     {ahead:?} asked)"
                ),
            ));
        }
        loop {
            let event = holder
                .next(wait + HOLDER_START)
                .await
                .map_err(holder_failed("neither took the lock nor timed out"))?;
            match event.event.as_str() {
                "acquired" => return Ok(Some(Box::new(holder))),
                "timeout" => return Ok(None),
                "error" => {
                    return Err(locksmith::Error::new(
                        ErrorKind::Backend,
                        format!(
                            "the holder process failed: {}",
                            event.error.unwrap_or_default()
                        ),
                    ));
                }
                _ => {}
            }
        }
    }

    fn min_scenario_ttl(&self) -> Duration {
        self.min_ttl
    }

    fn can_open_other_namespace(&self) -> bool {
        other_namespace(&self.url).is_some()
    }

    /// The same server with the backend's namespace setting changed (see `other_namespace`).
    async fn client_in_other_namespace(&self) -> Result<Locker> {
        match other_namespace(&self.url) {
            Some(url) => locksmith::connect(&url).await,
            None => Err(locksmith::Error::unsupported(
                "no namespace setting is known for this URL's scheme",
            )),
        }
    }

    /// Where the URL names loopback servers a proxy can stand in front of.
    fn can_delay_replies(&self) -> bool {
        proxiable(&self.url)
    }

    /// Through proxies that [`Harness::crash`] resets, where the servers are on loopback.
    async fn crashable_client(&self) -> Result<Locker> {
        if !proxiable(&self.url) {
            return self.client().await;
        }
        let (url, group) = self.proxies.group(&self.url, Duration::ZERO).await?;
        let client = locksmith::connect(&url).await?;
        // A key reused by a new client belongs to a client that is gone.
        self.crashable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key(&client), group);
        Ok(client)
    }

    /// A killed process: its connections reset, no release, no goodbye (a ZooKeeper session
    /// is left to expire, a SQL session ends as the server sees the socket go). Clients not
    /// behind a proxy (an embedded backend, a cluster) are dropped, which for them is the
    /// same: they hold nothing a connection ends.
    async fn crash(&self, guard: LockGuard, client: Locker) {
        guard.abandon();
        let group = self
            .crashable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key(&client));
        if let Some(group) = group {
            self.proxies.crash(group);
        }
        drop(client);
    }

    /// Through faultkit proxies delaying every reply (kept running by the harness).
    async fn client_with_reply_delay(&self, delay: Duration) -> Result<Locker> {
        let mut url = self.proxies.url(&self.url, delay).await?;
        if let Some(param) = hints(&url).and_then(|(_, h)| h.reply_timeout_param)
            && !url.contains(&format!("{param}="))
        {
            // A reply that comes back late still counts here (a Redlock vote): the scenario
            // checks that the validity counts from the send.
            let sep = if url.contains('?') { '&' } else { '?' };
            url = format!("{url}{sep}{param}={}", (delay * 8).as_millis());
        }
        locksmith::connect(&url).await
    }

    fn can_count_requests(&self) -> bool {
        proxiable(&self.url)
    }

    /// Through proxies that count the client's requests.
    async fn client_counting_requests(&self) -> Result<(Locker, RequestCount)> {
        let (url, count) = self.proxies.counting(&self.url).await?;
        Ok((locksmith::connect(&url).await?, count))
    }

    fn can_lose_replies(&self) -> bool {
        // A lost reply is picked by the lock name in the request: not through TLS, nor under
        // interop=sqlx (its requests carry sqlx's numeric key of the name).
        proxiable(&self.url)
            && ClientProxies::sees_clear_text(&self.url)
            && !self.url.contains("interop=sqlx")
    }

    /// Through proxies that lose the replies asked for.
    async fn client_losing_replies(&self) -> Result<(Locker, Arc<dyn ReplyLoser>)> {
        let (url, loser) = self.proxies.losing(&self.url).await?;
        Ok((locksmith::connect(&url).await?, loser))
    }
}

/// `url` with another namespace, as the backend's registration says (the `namespace`
/// parameter of Redis, Redlock and ZooKeeper, etcd's key prefix in the path, SQL's `table`
/// parameter, another `memory://` store). `None` for a backend without one.
fn other_namespace(url: &str) -> Option<String> {
    Some(match hints(url)?.1.other_namespace {
        OtherNamespace::Param { key, value } => url_with_param(url, key, value),
        OtherNamespace::Path(path) => url_with_path(url, path),
        OtherNamespace::Suffix(suffix) => {
            format!("{}{suffix}", url.split('?').next().unwrap_or(url))
        }
        _ => return None,
    })
}

/// One label per URL: the scheme, plus the `strategy` query parameter if any
/// (`postgres-lease`), made unique with `-2`, `-3`... Never contains a secret.
pub fn labels(urls: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(urls.len());
    for url in urls {
        let mut base = locksmith::scheme_of(url).unwrap_or_else(|_| "invalid".to_string());
        if let Some(strategy) = query_param(url, "strategy") {
            let clean: String = strategy
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
                .take(24)
                .collect();
            if !clean.is_empty() {
                base = format!("{base}-{clean}");
            }
        }
        let mut label = base.clone();
        let mut n = 2;
        while out.contains(&label) {
            label = format!("{base}-{n}");
            n += 1;
        }
        out.push(label);
    }
    out
}

fn query_param<'a>(url: &'a str, key: &str) -> Option<&'a str> {
    let (_, query) = url.split_once('?')?;
    let query = query.split('#').next().unwrap_or(query);
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_unique_and_secret_free() {
        let urls: Vec<String> = [
            "memory://",
            "memory://other",
            "postgres://u:pw@h/db?strategy=lease",
            "postgres://u:pw@h/db?strategy=row-lock&password=pw",
            "postgresql://u:pw@h/db?strategy=lease",
            "redis://:pw@h",
            "not a url pw",
            "zk://u:pw@h1:1,h2:2",
            "postgres://u:pw@h/db?strategy=<x>",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            labels(&urls),
            [
                "memory",
                "memory-2",
                "postgres-lease",
                "postgres-row-lock",
                "postgresql-lease",
                "redis",
                "invalid",
                "zk",
                "postgres-x",
            ]
        );
        for l in labels(&urls) {
            assert!(!l.contains("pw"), "{l}");
        }
    }

    #[tokio::test]
    async fn probe_learns_capabilities() {
        let h = UrlHarness::probe("memory".into(), "memory://probe".into()).await;
        assert!(h.can_revoke(), "the memory backend force-releases");
        assert!(h.client().await.is_ok());
        let bad = UrlHarness::probe("x".into(), "nosuch://u:pw@h".into()).await;
        assert!(!bad.can_revoke());
        assert_eq!(bad.shown_url(), "nosuch://u:***@h");
        assert!(!bad.client().await.unwrap_err().to_string().contains("pw"));
    }
}
