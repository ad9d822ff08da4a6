//! Parsing of `redlock://` URLs into one `lock_redis` node configuration per master: each
//! comma-separated node becomes a `redis://` URL parsed by lock-redis itself, so host, password,
//! database and parameter rules are exactly the Redis backend's.

use std::time::Duration;

use lock_redis::node;
use lockcore::config::{host_port, redacted_userinfo};
use lockcore::{Error, Result};

/// A validated configuration, as the backend uses it.
#[derive(Clone, Debug)]
pub(crate) struct Parsed {
    /// One configuration per master, in URL order.
    pub nodes: Vec<node::Config>,
    /// How long one node may take to answer one acquire before its vote counts as lost, when
    /// the URL sets it (`node_timeout_ms`); otherwise derived from each request's TTL
    /// ([`Parsed::node_timeout`]).
    pub node_timeout: Option<Duration>,
    /// The bound of requests that are not votes (ping, force release, the bare cycle): the
    /// nodes' own response timeout (`response_timeout_ms`).
    pub response_timeout: Duration,
    /// The key prefix (the same on every node).
    pub namespace: String,
    /// The notified waiter's safety-net poll.
    pub poll: Duration,
    /// How a release hands the lock to the next waiter (`handover=grant`, the default: each
    /// master's release grants it to its queue's head, and a majority of grants holds; `wake`:
    /// the head is woken to vote).
    pub handover: lock_redis::Handover,
    /// How long connecting to one node may take.
    pub connect_timeout: Duration,
    /// The URL with every password replaced by `***`.
    pub redacted: String,
}

/// A Redlock backend's configuration: what a `redlock[s]://h1:p1,h2:p2,...` URL says
/// ([`Config::parse`]), or the same from a config file (any serde format; unknown keys
/// refused): one single-node [`lock_redis::Config`] per master, and the per-node timeout.
/// Validated by [`Config::validate`] (run by
/// [`RedlockBackend::from_config`](crate::RedlockBackend::from_config)). `Debug` never shows a
/// password.
///
/// ```
/// let from_file: lock_redlock::Config = serde_json::from_str(
///     r#"{"masters": [{"nodes": ["r1:6379"], "password": "s3cret"},
///                     {"nodes": ["r2:6379"], "password": "s3cret"},
///                     {"nodes": ["r3:6379"], "password": "s3cret"}],
///         "node_timeout_ms": 100}"#,
/// ).unwrap();
/// let from_url = lock_redlock::Config::parse(
///     "redlock://:s3cret@r1:6379,:s3cret@r2:6379,:s3cret@r3:6379?node_timeout_ms=100",
/// ).unwrap();
/// assert_eq!(from_file.validate().unwrap(), from_url);
/// assert!(!format!("{from_url:?}").contains("s3cret"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// One configuration per master (a single host each), in voting order: each a
    /// [`lock_redis::Config`] (a table of fields) or its `redis[s]://` URL (text, so that a
    /// list of masters can be one environment variable: `masters=redis://r1,redis://r2,...`).
    #[serde(deserialize_with = "de_masters")]
    pub masters: Vec<node::Config>,
    /// How long one master may take to answer one vote before it counts as lost
    /// (`node_timeout_ms`); by default a tenth of the lock's TTL, within 50 ms..=1 s.
    #[serde(
        default,
        rename = "node_timeout_ms",
        with = "lockcore::config::millis_opt"
    )]
    pub node_timeout: Option<Duration>,
}

/// One master: its fields, or its `redis[s]://` URL.
struct Master(node::Config);

impl<'de> serde::Deserialize<'de> for Master {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct MasterVisitor;
        impl<'de> serde::de::Visitor<'de> for MasterVisitor {
            type Value = Master;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a Redis node's config fields or its redis:// URL")
            }
            fn visit_str<E: serde::de::Error>(self, url: &str) -> std::result::Result<Master, E> {
                // lock-redis's errors never quote the URL.
                node::Config::parse(url).map(Master).map_err(E::custom)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<Master, A::Error> {
                serde::Deserialize::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(Master)
            }
        }
        d.deserialize_any(MasterVisitor)
    }
}

fn de_masters<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<node::Config>, D::Error> {
    let masters: Vec<Master> = serde::Deserialize::deserialize(d)?;
    Ok(masters.into_iter().map(|m| m.0).collect())
}

/// The least per-node timeout derived from a TTL (see [`Parsed::node_timeout`]).
pub(crate) const NODE_TIMEOUT_FLOOR: Duration = Duration::from_millis(50);
/// The most per-node timeout derived from a TTL (see [`Parsed::node_timeout`]).
pub(crate) const NODE_TIMEOUT_CAP: Duration = Duration::from_secs(1);

/// How errors name the URL (never quoting it: it may carry passwords).
const WHAT: &str = "invalid redlock URL";

fn bad(msg: impl std::fmt::Display) -> Error {
    Error::invalid_config(format!("{WHAT}: {msg}"))
}

impl Config {
    /// Parses `redlock[s]://[[user]:pw@]h1[:p1],[[user]:pw@]h2[:p2],...[/db][?params]`: each
    /// node becomes one master's `redis[s]://` configuration, with the path and the query
    /// parameters (but `node_timeout_ms`) of the URL.
    ///
    /// # Errors
    /// `InvalidConfig`, never quoting the URL.
    pub fn parse(url: &str) -> Result<Config> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected redlock://host:port,host:port,..."))?;
        let node_scheme = match scheme.to_ascii_lowercase().as_str() {
            "redlock" => "redis",
            "redlocks" => "rediss",
            _ => return Err(bad("the scheme must be redlock or redlocks")),
        };
        if rest.contains('#') {
            return Err(bad("fragments (`#...`) are not supported"));
        }
        let (before_query, query) = match rest.split_once('?') {
            Some((b, q)) => (b, q),
            None => (rest, ""),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => (&before_query[..i], &before_query[i + 1..]),
            None => (before_query, ""),
        };
        let mut node_timeout = None;
        let mut node_query = Vec::new();
        let mut timeout_seen = false;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let key = pair.split_once('=').map_or(pair, |(k, _)| k);
            match key {
                "node_timeout_ms" => {
                    if std::mem::replace(&mut timeout_seen, true) {
                        return Err(bad("query parameter `node_timeout_ms` is given twice"));
                    }
                    let value = pair.split_once('=').map_or("", |(_, v)| v);
                    node_timeout = match value.parse::<u64>() {
                        Ok(ms) if (1..=60_000).contains(&ms) => Some(Duration::from_millis(ms)),
                        _ => {
                            return Err(bad(
                                "query parameter `node_timeout_ms` must be a whole number of \
                                 milliseconds in 1..=60000",
                            ));
                        }
                    };
                }
                "min_replicas" | "replica_timeout_ms" => {
                    return Err(bad(format_args!(
                        "query parameter `{key}` does not apply to Redlock (its masters have no \
                         replicas to wait for)"
                    )));
                }
                _ => node_query.push(pair),
            }
        }
        let node_query = node_query.join("&");
        let mut nodes = Vec::new();
        for (i, part) in authority.split(',').enumerate() {
            if part.is_empty() {
                return Err(bad(format_args!("node {} is empty", i + 1)));
            }
            let mut node_url = format!("{node_scheme}://{part}");
            if !path.is_empty() {
                node_url.push('/');
                node_url.push_str(path);
            }
            if !node_query.is_empty() {
                node_url.push('?');
                node_url.push_str(&node_query);
            }
            let cfg = node::Config::parse(&node_url).map_err(|e| {
                let msg = e.message();
                let msg = msg.strip_prefix("invalid redis URL: ").unwrap_or(msg);
                bad(format_args!("node {}: {msg}", i + 1))
            })?;
            nodes.push(cfg);
        }
        Config {
            masters: nodes,
            node_timeout,
        }
        .validate()
    }

    /// Checks a configuration however it was made (a URL, a file): every master one host
    /// (no cluster, Sentinel or `min_replicas`), each validated as lock-redis validates it,
    /// none repeated, all with one namespace; `node_timeout_ms` in 1..=60000.
    ///
    /// # Errors
    /// `InvalidConfig`, never quoting a password.
    pub fn validate(mut self) -> Result<Config> {
        if self.masters.is_empty() {
            return Err(bad("no node given"));
        }
        if let Some(timeout) = self.node_timeout {
            lockcore::config::check_millis(WHAT, "node_timeout_ms", timeout, 1, 60_000)?;
        }
        let mut masters: Vec<node::Config> = Vec::with_capacity(self.masters.len());
        for (i, m) in std::mem::take(&mut self.masters).into_iter().enumerate() {
            let m = m.validate().map_err(|e| {
                let msg = e.message();
                let msg = msg.strip_prefix("invalid redis URL: ").unwrap_or(msg);
                bad(format_args!("node {}: {msg}", i + 1))
            })?;
            if m.cluster || m.sentinel.is_some() || m.nodes.len() != 1 {
                return Err(bad(format_args!("node {} is not one host", i + 1)));
            }
            if m.min_replicas > 0 {
                return Err(bad(
                    "`min_replicas` does not apply to Redlock (its masters have no replicas to \
                     wait for)",
                ));
            }
            if let Some(peer) = m.interop {
                return Err(bad(format_args!(
                    "`interop={peer}` does not apply to Redlock (no peer client speaks Redlock's \
                     quorum over these keys)"
                )));
            }
            if masters.first().is_some_and(|f| f.handover != m.handover) {
                return Err(bad(format_args!(
                    "node {} has another `handover`: every master must hand a lock over the \
                     same way",
                    i + 1
                )));
            }
            if masters.iter().any(|n| n.nodes[0] == m.nodes[0]) {
                return Err(bad(format_args!(
                    "node {} repeats an earlier node: each master must vote once",
                    i + 1
                )));
            }
            if masters.first().is_some_and(|f| f.namespace != m.namespace) {
                return Err(bad(format_args!(
                    "node {} has another namespace: the lock keys must be the same on every master",
                    i + 1
                )));
            }
            masters.push(m);
        }
        self.masters = masters;
        Ok(self)
    }
}

impl Parsed {
    /// The backend's view of a validated [`Config`].
    pub(crate) fn from_config(config: Config) -> Result<Parsed> {
        let Config {
            masters: nodes,
            node_timeout,
        } = config.validate()?;
        let scheme = if nodes[0].tls { "redlocks" } else { "redlock" };
        let first = &nodes[0];
        let handover = first.handover;
        let (namespace, poll, connect_timeout, response_timeout) = (
            first.namespace.clone(),
            first.poll,
            first.connect_timeout,
            first.response_timeout,
        );
        let redacted = {
            let hosts: Vec<String> = nodes
                .iter()
                .map(|n| {
                    let (h, p) = &n.nodes[0];
                    let auth = redacted_userinfo(n.username.as_deref(), n.password.as_ref());
                    format!("{auth}{}", host_port(h, *p))
                })
                .collect();
            let timeout = match node_timeout {
                Some(t) => format!("&node_timeout_ms={}", t.as_millis()),
                None => String::new(),
            };
            format!(
                "{scheme}://{}/{}?namespace={namespace}{timeout}",
                hosts.join(","),
                first.db,
            )
        };
        Ok(Parsed {
            nodes,
            node_timeout,
            response_timeout,
            namespace,
            poll,
            handover,
            connect_timeout,
            redacted,
        })
    }

    /// How long one node may take to answer one vote (acquire) of a lock with this `ttl` before
    /// the vote counts as lost: `node_timeout_ms` when the URL sets it, otherwise a tenth of the
    /// TTL, at least [`NODE_TIMEOUT_FLOOR`] and at most [`NODE_TIMEOUT_CAP`].
    ///
    /// Why: the Redlock specification asks for a per-node timeout that is small compared with
    /// the TTL, so that a dead node costs the caller little and the validity left after a vote
    /// stays large. A fixed 50 ms (the old default) was small for every TTL, but on a loaded
    /// 2-core machine a healthy node's reply regularly takes longer, and a lost vote turns an
    /// uncontended `try_lock` into a refusal. A tenth of the TTL keeps 90 % of the validity in
    /// the worst case, while giving a healthy but busy node the time it needs.
    pub(crate) fn node_timeout(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (ttl / 10).clamp(NODE_TIMEOUT_FLOOR, NODE_TIMEOUT_CAP))
    }

    /// The majority: `N/2 + 1`.
    pub(crate) fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::ErrorKind;

    fn parsed(url: &str) -> Result<Parsed> {
        Parsed::from_config(Config::parse(url)?)
    }

    /// A config file is validated as a URL is: one host per master, none repeated, one
    /// namespace, no cluster, Sentinel or min_replicas; the URL and the file agree.
    #[test]
    fn config_files_are_validated_as_urls_are() {
        let file = |json: &str| serde_json::from_str::<Config>(json).unwrap().validate();
        let ok = file(r#"{"masters": [{"nodes": ["a"]}, {"nodes": ["b:7000"]}]}"#).unwrap();
        assert_eq!(ok, Config::parse("redlock://a,b:7000").unwrap());
        for (json, says) in [
            (r#"{"masters": []}"#, "no node"),
            (
                r#"{"masters": [{"nodes": ["a"]}, {"nodes": ["a:6379"]}]}"#,
                "repeats",
            ),
            (
                r#"{"masters": [{"nodes": ["a"]}, {"nodes": ["b"], "namespace": "x"}]}"#,
                "namespace",
            ),
            (
                r#"{"masters": [{"nodes": ["a"], "min_replicas": 1}]}"#,
                "min_replicas",
            ),
            (
                r#"{"masters": [{"nodes": ["a", "b"], "cluster": true}]}"#,
                "one host",
            ),
            (
                r#"{"masters": [{"nodes": ["a"]}], "node_timeout_ms": 0}"#,
                "node_timeout_ms",
            ),
            (
                r#"{"masters": [{"nodes": ["a"], "interop": "redis-py"}]}"#,
                "interop",
            ),
            (
                r#"{"masters": [{"nodes": ["a"]}, {"nodes": ["b"], "handover": "wake"}]}"#,
                "handover",
            ),
        ] {
            let e = file(json).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig);
            assert!(e.to_string().contains(says), "{json}: {e}");
        }
    }

    #[test]
    fn handover_is_grant_by_default_and_wake_on_request() {
        let default = parsed("redlock://a,b,c").unwrap();
        assert_eq!(default.handover, lock_redis::Handover::Grant);
        let wake = parsed("redlock://a,b,c?handover=wake").unwrap();
        assert_eq!(wake.handover, lock_redis::Handover::Wake);
        assert!(
            wake.nodes
                .iter()
                .all(|n| n.handover == lock_redis::Handover::Wake)
        );
        let e = parsed("redlock://a,b,c?handover=sometimes").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    }

    #[test]
    fn parses_nodes_with_their_own_passwords() {
        let c = parsed(
            "redlock://:pw1@127.0.0.1:1,u:p%40w2@h2:2,[::1]:3/2?namespace=x&node_timeout_ms=20&poll_ms=100",
        )
        .unwrap();
        assert_eq!(c.nodes.len(), 3);
        assert_eq!(c.quorum(), 2);
        assert_eq!(c.nodes[0].password.as_ref().unwrap().expose(), "pw1");
        assert_eq!(c.nodes[1].username.as_deref(), Some("u"));
        assert_eq!(c.nodes[1].password.as_ref().unwrap().expose(), "p@w2");
        assert!(c.nodes[2].password.is_none());
        assert_eq!(c.nodes[2].nodes[0], ("::1".to_owned(), 3));
        assert!(
            c.nodes
                .iter()
                .all(|n| n.db == 2 && n.namespace == "x" && !n.tls)
        );
        assert_eq!(c.node_timeout, Some(Duration::from_millis(20)));
        assert_eq!(
            c.node_timeout(Duration::from_secs(10)),
            Duration::from_millis(20)
        );
        assert_eq!(c.poll, Duration::from_millis(100));
        assert!(!c.redacted.contains("pw1") && !c.redacted.contains("p@w2"));
        assert!(!format!("{c:?}").contains("pw1"));
        assert_eq!(
            c.redacted,
            "redlock://:***@127.0.0.1:1,u:***@h2:2,[::1]:3/2?namespace=x&node_timeout_ms=20"
        );
        let c = parsed("redlocks://a:1,b:2,c:3,d:4,e:5?tls_ca=/ca.pem").unwrap();
        assert_eq!(c.quorum(), 3);
        assert_eq!(
            c.redacted,
            "redlocks://a:1,b:2,c:3,d:4,e:5/0?namespace=locksmith"
        );
        assert!(c.nodes.iter().all(|n| n.tls && n.tls_ca.is_some()));
    }

    #[test]
    fn node_timeout_is_a_tenth_of_the_ttl_within_bounds() {
        let c = parsed("redlock://a:1,b:2,c:3").unwrap();
        assert_eq!(c.node_timeout, None);
        let ms = |v| Duration::from_millis(v);
        assert_eq!(c.node_timeout(ms(100)), ms(50));
        assert_eq!(c.node_timeout(ms(2_000)), ms(200));
        assert_eq!(c.node_timeout(ms(10_000)), ms(1_000));
        assert_eq!(c.node_timeout(ms(3_600_000)), ms(1_000));
    }

    #[test]
    fn rejects_bad_urls_without_quoting_them() {
        for url in [
            "",
            "redis://a:1",
            "redlock://",
            "redlock://a:1,,b:2",
            "redlock://a:1,a:1",
            "redlock://a:1,b:notaport",
            "redlock://a:1?node_timeout_ms=0",
            "redlock://a:1?node_timeout_ms=1&node_timeout_ms=2",
            "redlock://a:1?min_replicas=1",
            "redlock://a:1?bogus=1",
            "redlock://a:1/abc",
            "redlock://a:1#x",
            "redlock://:s3cret@a:1?tls_ca=/x",
        ] {
            let e = parsed(url).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{url}");
            assert!(!e.to_string().contains("s3cret"), "{e}");
        }
    }
}
