//! The conformance harness of a URL: every client is a fresh `locksmith::connect(url)`.

use std::time::Duration;

use async_trait::async_trait;
use conformance::Harness;
use locksmith::{Locker, Result, redact_url};

/// A harness holding only a URL (and what one probe learnt), so it works from any runtime.
pub struct UrlHarness {
    label: String,
    url: String,
    can_revoke: bool,
    min_ttl: Duration,
}

impl UrlHarness {
    /// Connects once to learn whether the backend can force-release locks and its smallest TTL;
    /// a failed probe is not reported here (the suite reports it as every scenario failing).
    pub async fn probe(label: String, url: String) -> Self {
        let (can_revoke, min_ttl) = match locksmith::connect(&url).await {
            Ok(client) => {
                let caps = client.capabilities();
                let probed = (caps.force_release, caps.min_ttl);
                client.flush().await;
                probed
            }
            Err(_) => (false, Duration::ZERO),
        };
        // etcd grants leases in whole seconds: scenario TTLs below a second would be granted a
        // longer one (as lock-etcd's own harness, scenarios start at one second there).
        let floor = if url.starts_with("etcd://") || url.starts_with("etcds://") {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(300)
        };
        UrlHarness {
            label,
            url,
            can_revoke,
            min_ttl: min_ttl.max(floor),
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

    fn min_scenario_ttl(&self) -> Duration {
        self.min_ttl
    }
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
