//! Clients of a real server that connect through faultkit's TCP proxies (one per loopback
//! endpoint their URL names): to delay every reply
//! ([`Harness::client_with_reply_delay`](crate::Harness::client_with_reply_delay)), or to crash
//! as a killed process does ([`Harness::crash`](crate::Harness::crash): its connections are
//! reset, without a goodbye such as a ZooKeeper close-session).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use faultkit::{Direction, Pick, Proxy, ProxyMode, ReplyLoss, Wire, rewrite_url};
use lockcore::{Error, Result};

/// Proxies started for clients; they forward as long as this value lives (a harness keeps it,
/// so a proxied client works for the whole scenario).
#[derive(Default)]
pub struct ClientProxies {
    /// Each proxy with the group (one client's URL) it belongs to.
    proxies: Mutex<Vec<(ProxyGroup, Arc<Proxy>)>>,
    next_group: AtomicU64,
}

/// The proxies of one URL made by [`ClientProxies::url`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProxyGroup(u64);

impl std::fmt::Debug for ClientProxies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientProxies").finish_non_exhaustive()
    }
}

impl ClientProxies {
    /// No proxies yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `url` names at least one loopback endpoint (`127.0.0.1:port`, `localhost:port`)
    /// that a proxy can stand in front of.
    pub fn can_proxy(url: &str) -> bool {
        !loopback_ports(url).is_empty()
    }

    /// `url` rewritten to reach each loopback endpoint it names through a new proxy that
    /// delays every reply by `delay` (requests pass at once, so each takes effect on the
    /// server when sent). Must be called inside a tokio runtime; the proxies run on it.
    ///
    /// Cancel safe: a dropped call leaves at most idle proxies behind.
    ///
    /// # Errors
    /// `Unsupported` when the URL names no loopback endpoint; `Unavailable` when a proxy could
    /// not listen.
    pub async fn url(&self, url: &str, delay: Duration) -> Result<String> {
        Ok(self.group(url, delay).await?.0)
    }

    /// As [`ClientProxies::url`], with the group of the proxies, for
    /// [`ClientProxies::crash`].
    ///
    /// Cancel safe: a dropped call leaves at most idle proxies behind.
    ///
    /// # Errors
    /// As [`ClientProxies::url`].
    pub async fn group(&self, url: &str, delay: Duration) -> Result<(String, ProxyGroup)> {
        self.group_parsing(url, delay, None).await
    }

    /// As [`ClientProxies::group`], the proxies parsing `wire` (see [`Proxy::requests`]).
    async fn group_parsing(
        &self,
        url: &str,
        delay: Duration,
        wire: Option<Wire>,
    ) -> Result<(String, ProxyGroup)> {
        let group = ProxyGroup(self.next_group.fetch_add(1, Ordering::Relaxed));
        let ports = loopback_ports(url);
        if ports.is_empty() {
            return Err(Error::unsupported(
                "the URL names no loopback endpoint to put a proxy in front of",
            ));
        }
        let mut out = url.to_string();
        for port in ports {
            let upstream = ([127, 0, 0, 1], port).into();
            let started = match wire {
                Some(w) => Proxy::start_with_wire(upstream, w).await,
                None => Proxy::start(upstream).await,
            };
            let proxy =
                started.map_err(|e| Error::unavailable("starting a reply-delay proxy", e))?;
            proxy.set_latency(Direction::ToClient, delay);
            out = rewrite_url(&out, port, proxy.port());
            self.proxies
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((group, Arc::new(proxy)));
        }
        Ok((out, group))
    }

    /// `url` rewritten as [`ClientProxies::url`] (without delay), with the count of the
    /// requests that the client connecting to it sends, over every connection it opens.
    ///
    /// Cancel safe: a dropped call leaves at most idle proxies behind.
    ///
    /// # Errors
    /// As [`ClientProxies::url`].
    pub async fn counting(&self, url: &str) -> Result<(String, crate::RequestCount)> {
        // ZooKeeper's session pings are keepalives, not work: parsed out of the count.
        let wire = url.starts_with("zk").then_some(Wire::ZooKeeper);
        let (url, group) = self.group_parsing(url, Duration::ZERO, wire).await?;
        let proxies = self.of_group(group);
        let count = crate::RequestCount::new(move || proxies.iter().map(|p| p.requests()).sum());
        Ok((url, count))
    }

    /// Whether a proxy in front of `url` sees requests in clear text (no TLS), so that a
    /// [`ReplyLoser`](crate::ReplyLoser) can pick a request by the lock name it carries.
    pub fn sees_clear_text(url: &str) -> bool {
        let lower = url.to_ascii_lowercase();
        let encrypted_scheme = ["rediss:", "redlocks:", "etcds:", "https:", "zks:"]
            .iter()
            .any(|s| lower.starts_with(s));
        let encrypted_param = [
            "sslmode=require",
            "sslmode=verify",
            "ssl-mode=required",
            "ssl-mode=verify",
            "tls=true",
            "tls=1",
        ]
        .iter()
        .any(|p| lower.contains(p));
        !encrypted_scheme && !encrypted_param
    }

    /// `url` rewritten as [`ClientProxies::url`] (without delay), with a [`ReplyLoser`](crate::ReplyLoser) of
    /// the client connecting to it: a lost reply resets the connection it came on, after the
    /// server applied the request.
    ///
    /// Cancel safe: a dropped call leaves at most idle proxies behind.
    ///
    /// # Errors
    /// As [`ClientProxies::url`].
    pub async fn losing(&self, url: &str) -> Result<(String, Arc<dyn crate::ReplyLoser>)> {
        let (url, group) = self
            .group(&without_opportunistic_tls(url), Duration::ZERO)
            .await?;
        Ok((url, Arc::new(ProxiesLosingReplies(self.of_group(group)))))
    }

    fn of_group(&self, group: ProxyGroup) -> Vec<Arc<Proxy>> {
        self.proxies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(g, _)| *g == group)
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// Crashes the client behind `group` as a killed process: its connections are reset (as
    /// the kernel closes a dead process's sockets) and so is every reconnection, so its
    /// session or connection-bound locks end only as the server's timeouts say.
    pub fn crash(&self, group: ProxyGroup) {
        for (g, p) in self
            .proxies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            if *g == group {
                p.set_mode(ProxyMode::Reset);
            }
        }
    }
}

/// `url` without the TLS its client would negotiate unasked (PostgreSQL's `sslmode=prefer`,
/// MariaDB's `ssl-mode=preferred`), so that a proxy sees its requests in clear text.
fn without_opportunistic_tls(url: &str) -> String {
    let lower = url.to_ascii_lowercase();
    let param = if lower.starts_with("postgres") && !lower.contains("sslmode=") {
        "sslmode=disable"
    } else if (lower.starts_with("mysql") || lower.starts_with("mariadb"))
        && !lower.contains("ssl-mode=")
    {
        "ssl-mode=disabled"
    } else {
        return url.to_owned();
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// The proxies of one client, arming each (the request goes to whichever endpoint serves it).
struct ProxiesLosingReplies(Vec<Arc<Proxy>>);

impl crate::ReplyLoser for ProxiesLosingReplies {
    fn lose_next_reply(&self, pattern: &[u8]) {
        for p in &self.0 {
            p.lose_reply(Pick::Matching(pattern.to_vec()), ReplyLoss::Reset);
        }
    }

    fn disarm(&self) -> u64 {
        self.0
            .iter()
            .map(|p| {
                p.disarm();
                p.replies_lost() as u64
            })
            .sum()
    }
    fn silence(&self, on: bool) -> bool {
        let mode = if on {
            ProxyMode::Blackhole
        } else {
            ProxyMode::Pass
        };
        for p in &self.0 {
            p.set_mode(mode);
        }
        true
    }
}

/// The ports of the loopback endpoints (`127.0.0.1:port`, `localhost:port`) in `url`, in order,
/// without repeats.
fn loopback_ports(url: &str) -> Vec<u16> {
    let mut ports = Vec::new();
    for host in ["127.0.0.1:", "localhost:"] {
        let mut rest = url;
        while let Some(i) = rest.find(host) {
            rest = &rest[i + host.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(port) = digits.parse::<u16>()
                && !ports.contains(&port)
            {
                ports.push(port);
            }
        }
    }
    ports
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_loopback_port_once() {
        assert_eq!(
            loopback_ports("redlock://127.0.0.1:1,localhost:2,127.0.0.1:1,db.example:3"),
            [1, 2]
        );
        assert_eq!(loopback_ports("postgres://u:p@127.0.0.1:15432/db"), [15432]);
        assert!(loopback_ports("sqlite:///tmp/x.db").is_empty());
        assert!(!ClientProxies::can_proxy("memory://x"));
        assert!(ClientProxies::sees_clear_text("redis://127.0.0.1:1"));
        assert!(!ClientProxies::sees_clear_text("rediss://127.0.0.1:1"));
        assert!(!ClientProxies::sees_clear_text(
            "postgres://u@127.0.0.1:1/db?sslmode=verify-full"
        ));
        assert!(!ClientProxies::sees_clear_text("etcds://127.0.0.1:1"));
        // Redlock's TLS scheme: its masters' replies cannot be picked by lock name either.
        assert!(!ClientProxies::sees_clear_text(
            "redlocks://127.0.0.1:1,127.0.0.1:2"
        ));
        assert!(ClientProxies::sees_clear_text(
            "redlock://127.0.0.1:1,127.0.0.1:2"
        ));
    }
}
