//! Parsing and validation of `redis://` URLs, with the password kept out of every printable form.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub use lockcore::config::Handover;
use lockcore::config::{UrlParts, UserInfoAt, check_millis, decode_userinfo, host_port};
use lockcore::{Error, Result, Secret};

/// A Redis backend's configuration: what a `redis://` URL says, or the same fields from a config
/// file (see the [crate docs](crate) for each parameter). `Debug` never shows the password.
///
/// Build it from a URL with [`Config::parse`], or deserialize it (any serde format; unknown keys
/// are refused) and pass it to [`RedisBackend::from_config`](crate::RedisBackend::from_config),
/// which validates it exactly as a URL is validated ([`Config::validate`]). The URL's query
/// parameters are the same fields, read by the same deserializer. In a file, `nodes` is a list
/// of `"host:port"` strings (`"host"` alone takes the default port), durations are whole
/// milliseconds under the URL's names (`poll_ms`, ...):
///
/// ```
/// let from_file: lock_redis::Config = serde_json::from_str(
///     r#"{"nodes": ["cache:6379"], "password": "s3cret", "db": 2, "namespace": "app", "poll_ms": 500}"#,
/// ).unwrap();
/// let from_file = from_file.validate().unwrap();
/// let from_url = lock_redis::Config::parse("redis://:s3cret@cache:6379/2?namespace=app&poll_ms=500").unwrap();
/// assert_eq!(from_file, from_url);
/// assert!(!format!("{from_file:?}").contains("s3cret"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// `rediss`: TLS with certificate verification.
    #[serde(default)]
    pub tls: bool,
    /// `+cluster`: a Redis Cluster.
    #[serde(default)]
    pub cluster: bool,
    /// `+sentinel`: the name of the primary the sentinels in `nodes` watch.
    #[serde(default)]
    pub sentinel: Option<String>,
    /// Host and port of each node given (one unless `cluster` or `sentinel`).
    #[serde(deserialize_with = "de_nodes")]
    pub nodes: Vec<(String, u16)>,
    /// The ACL user name.
    #[serde(default)]
    pub username: Option<String>,
    /// The password.
    #[serde(default)]
    pub password: Option<Secret>,
    /// The database number.
    #[serde(default)]
    pub db: i64,
    /// The key prefix.
    #[serde(default = "lockcore::config::default_namespace")]
    pub namespace: String,
    /// `WAIT` for this many replicas after winning.
    #[serde(default)]
    pub min_replicas: u32,
    /// The `WAIT` timeout (`replica_timeout_ms`).
    #[serde(
        rename = "replica_timeout_ms",
        with = "lockcore::config::millis",
        default = "default_replica_timeout"
    )]
    pub replica_timeout: Duration,
    /// PEM file of the CA that signed the server certificate.
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
    /// Safety-net poll of a notified waiter (`poll_ms`).
    #[serde(
        rename = "poll_ms",
        with = "lockcore::config::millis",
        default = "default_poll"
    )]
    pub poll: Duration,
    /// Connection timeout (`connect_timeout_ms`).
    #[serde(
        rename = "connect_timeout_ms",
        with = "lockcore::config::millis",
        default = "default_timeout"
    )]
    pub connect_timeout: Duration,
    /// Per-command response timeout (`response_timeout_ms`).
    #[serde(
        rename = "response_timeout_ms",
        with = "lockcore::config::millis",
        default = "default_timeout"
    )]
    pub response_timeout: Duration,
    /// The lock client whose layout and protocol to follow (`interop=redis-py`,
    /// `interop=redisson`); `None`: locksmith's own.
    #[serde(default)]
    pub interop: Option<crate::Interop>,
    /// How a release hands the lock to the next exclusive waiter (`handover=grant` or
    /// `handover=wake`; see [`Handover`]). In locksmith's own layout only: under `interop=`
    /// and with `min_replicas` a release always wakes.
    #[serde(default)]
    pub handover: Handover,
}

fn default_replica_timeout() -> Duration {
    Duration::from_millis(100)
}
fn default_poll() -> Duration {
    Duration::from_millis(1000)
}
fn default_timeout() -> Duration {
    Duration::from_secs(2)
}

/// `nodes` in a config file: `"host:port"` strings; a missing port is 0 until
/// [`Config::validate`] puts in the default one (6379, or 26379 for sentinels).
fn de_nodes<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<(String, u16)>, D::Error> {
    use serde::Deserialize;
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|n| parse_host_port(n, 0).map_err(serde::de::Error::custom))
        .collect()
}

/// The query parameters a URL may carry; the other fields come from the URL's address part.
const URL_PARAMS: &[&str] = &[
    "namespace",
    "min_replicas",
    "replica_timeout_ms",
    "tls_ca",
    "poll_ms",
    "connect_timeout_ms",
    "response_timeout_ms",
    "interop",
    "handover",
];

/// How errors name the URL (never quoting it: it may carry a password).
const WHAT: &str = "invalid redis URL";

fn bad(msg: impl fmt::Display) -> Error {
    Error::invalid_config(format!("{WHAT}: {msg}"))
}

fn check_ms(key: &str, value: Duration, min: u64, max: u64) -> Result<()> {
    check_millis(WHAT, key, value, min, max)
}

fn parse_host_port(part: &str, default_port: u16) -> Result<(String, u16)> {
    if part.is_empty() {
        return Err(bad("a host is missing"));
    }
    let (host, port) = if let Some(rest) = part.strip_prefix('[') {
        // [IPv6]:port
        let end = rest
            .find(']')
            .ok_or_else(|| bad("unclosed `[` in an IPv6 host"))?;
        let host = &rest[..end];
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(bad("unexpected text after an IPv6 host")),
        };
        (host.to_owned(), port)
    } else {
        match part.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (part.to_owned(), None),
        }
    };
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b))
    {
        return Err(bad(
            "a host is empty or contains characters not allowed in a host name",
        ));
    }
    let port = match port {
        None => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(bad("a port is not a number in 1..=65535")),
        },
    };
    Ok((host, port))
}

impl Config {
    /// The query parameters a URL may carry; any other is refused with `InvalidConfig`, named
    /// (the `locksmith` facade's docs list them per URL kind, checked by a test).
    pub const URL_PARAMS: &'static [&'static str] = URL_PARAMS;

    /// Parses `redis://`, `rediss://`, `redis+cluster://`, `rediss+cluster://`,
    /// `redis+sentinel://` and `rediss+sentinel://` URLs.
    ///
    /// # Errors
    /// `InvalidConfig` for anything malformed or unknown (the URL itself is never quoted).
    pub fn parse(url: &str) -> Result<Config> {
        let parts = UrlParts::split(WHAT, url, UserInfoAt::HostPart)?;
        let (tls, cluster, sentinel) = match parts.scheme.to_ascii_lowercase().as_str() {
            "redis" => (false, false, false),
            "rediss" => (true, false, false),
            "redis+cluster" => (false, true, false),
            "rediss+cluster" => (true, true, false),
            "redis+sentinel" => (false, false, true),
            "rediss+sentinel" => (true, false, true),
            _ => {
                return Err(bad(
                    "the scheme must be redis, rediss, redis+cluster, rediss+cluster, \
                     redis+sentinel or rediss+sentinel",
                ));
            }
        };
        let (username, password) = match parts.userinfo {
            None => (None, None),
            Some(u) => {
                let (user, password) = decode_userinfo(WHAT, u)?;
                (
                    (!user.is_empty()).then_some(user),
                    password.filter(|p| !p.expose().is_empty()),
                )
            }
        };
        let (hosts, path) = (parts.hosts, parts.path.strip_prefix('/').unwrap_or(""));
        let default_port = if sentinel { 26379 } else { 6379 };
        let nodes = hosts
            .split(',')
            .map(|h| parse_host_port(h, default_port))
            .collect::<Result<Vec<_>>>()?;
        // Sentinel: the path is `<primary name>[/db]`.
        let (master, path) = if sentinel {
            let (name, db) = match path.split_once('/') {
                Some((n, d)) => (n, d),
                None => (path, ""),
            };
            let name = percent_encoding::percent_decode_str(name)
                .decode_utf8()
                .map_err(|_| bad("the primary name is not valid percent-encoded UTF-8"))?;
            (Some(name.into_owned()), db)
        } else {
            (None, path)
        };
        let db = match path {
            "" => 0,
            p => match p.parse::<i64>() {
                Ok(db) => db,
                _ => return Err(bad("the path must be a database number, like /0")),
            },
        };
        // The query goes through the same deserializer as a config file; the address part fills
        // in the rest.
        let query: Config =
            lockcore::config::from_query(WHAT, parts.query, URL_PARAMS, &["nodes"])?;
        Config {
            tls,
            cluster,
            sentinel: master,
            nodes,
            username,
            password,
            db,
            ..query
        }
        .validate()
    }

    /// Checks a configuration however it was made (a URL, a file) and fills in default ports.
    ///
    /// # Errors
    /// `InvalidConfig`, naming the field, never the password.
    pub fn validate(mut self) -> Result<Config> {
        if self.nodes.is_empty() {
            return Err(bad("no node given"));
        }
        let sentinel = self.sentinel.is_some();
        if sentinel && self.cluster {
            return Err(bad(
                "a configuration is either a cluster or sentinels, not both",
            ));
        }
        if !self.cluster && !sentinel && self.nodes.len() != 1 {
            return Err(bad(
                "several hosts need the redis+cluster:// or redis+sentinel:// scheme",
            ));
        }
        let default_port = if sentinel { 26379 } else { 6379 };
        for (_, port) in &mut self.nodes {
            if *port == 0 {
                *port = default_port;
            }
        }
        if let Some(name) = &self.sentinel
            && (name.is_empty()
                || name.len() > 128
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b)))
        {
            return Err(bad(
                "redis+sentinel:// needs the primary's name as the path \
                 (1 to 128 characters of [A-Za-z0-9_.:-]), like /mymaster or /mymaster/0",
            ));
        }
        if let Some(user) = &self.username
            && (user.is_empty() || user.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(bad("the user name is empty or contains white space"));
        }
        if self.username.is_some() && self.password.is_none() {
            return Err(bad(
                "a user name without a password; write redis://user:password@host",
            ));
        }
        if !(0..=1_000_000).contains(&self.db) {
            return Err(bad("the database number must be in 0..=1000000"));
        }
        if self.cluster && self.db != 0 {
            return Err(bad("Redis Cluster has only database 0"));
        }
        // No braces (they would pick the hash slot) and nothing that needs quoting.
        if self.namespace.is_empty()
            || self.namespace.len() > 64
            || !self
                .namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
        {
            return Err(bad(
                "namespace must be 1 to 64 characters of [A-Za-z0-9_.:-]",
            ));
        }
        if self.min_replicas > 100 {
            return Err(bad("`min_replicas` must be a number in 0..=100"));
        }
        check_ms("replica_timeout_ms", self.replica_timeout, 1, 60_000)?;
        check_ms("poll_ms", self.poll, 10, 3_600_000)?;
        check_ms("connect_timeout_ms", self.connect_timeout, 1, 600_000)?;
        check_ms("response_timeout_ms", self.response_timeout, 1, 600_000)?;
        if let Some(peer) = self.interop {
            // The peers' own clients announce and renew on one server; a cluster's sharded
            // channels and WAIT's replica bookkeeping are not part of their protocol here.
            if self.cluster {
                return Err(bad(format_args!(
                    "`interop={peer}` is supported on a single node or with sentinels, not on a \
                     cluster"
                )));
            }
            if self.min_replicas > 0 {
                return Err(bad(format_args!(
                    "`interop={peer}` cannot be combined with `min_replicas`"
                )));
            }
        }
        if let Some(ca) = &self.tls_ca {
            if ca.as_os_str().is_empty() {
                return Err(bad("`tls_ca` is empty"));
            }
            if !self.tls {
                return Err(bad("`tls_ca` needs the rediss:// scheme"));
            }
        }
        Ok(self)
    }

    /// The URL again, with the password replaced by `***`.
    pub fn redacted(&self) -> String {
        let scheme = match (self.tls, self.cluster, self.sentinel.is_some()) {
            (false, false, false) => "redis",
            (true, false, false) => "rediss",
            (false, true, _) => "redis+cluster",
            (true, true, _) => "rediss+cluster",
            (false, false, true) => "redis+sentinel",
            (true, false, true) => "rediss+sentinel",
        };
        let mut out = format!(
            "{scheme}://{}",
            lockcore::config::redacted_userinfo(self.username.as_deref(), self.password.as_ref())
        );
        let hosts: Vec<String> = self.nodes.iter().map(|(h, p)| host_port(h, *p)).collect();
        out.push_str(&hosts.join(","));
        if let Some(master) = &self.sentinel {
            out.push_str(&format!("/{master}"));
        }
        out.push_str(&format!("/{}?namespace={}", self.db, self.namespace));
        if self.min_replicas > 0 {
            out.push_str(&format!(
                "&min_replicas={}&replica_timeout_ms={}",
                self.min_replicas,
                self.replica_timeout.as_millis()
            ));
        }
        if let Some(ca) = &self.tls_ca {
            out.push_str(&format!("&tls_ca={}", ca.display()));
        }
        if let Some(peer) = self.interop {
            out.push_str(&format!("&interop={peer}"));
        }
        if self.handover != Handover::default() {
            out.push_str(&format!("&handover={}", self.handover));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::ErrorKind;

    #[test]
    fn parses_the_forms() {
        let c = Config::parse("redis://127.0.0.1:16379").unwrap();
        assert_eq!(c.nodes, vec![("127.0.0.1".to_owned(), 16379)]);
        assert!(!c.tls && !c.cluster);
        assert_eq!(c.namespace, "locksmith");

        let c = Config::parse("redis://:pw@h/3?namespace=x.y&min_replicas=1&replica_timeout_ms=50")
            .unwrap();
        assert_eq!(c.password.as_ref().unwrap().expose(), "pw");
        assert_eq!(c.username, None);
        assert_eq!((c.db, c.min_replicas), (3, 1));
        assert_eq!(c.replica_timeout, Duration::from_millis(50));
        assert_eq!(c.nodes[0].1, 6379);

        let c = Config::parse("redis://locksmith:s3cret%3Ap%40ss%2Fw0rd@127.0.0.1:16385").unwrap();
        assert_eq!(c.username.as_deref(), Some("locksmith"));
        assert_eq!(c.password.as_ref().unwrap().expose(), "s3cret:p@ss/w0rd");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(!c.redacted().contains("s3cret"));

        let c = Config::parse("rediss+cluster://a:1,b:2,[::1]:3?tls_ca=/x/ca.pem").unwrap();
        assert!(c.tls && c.cluster);
        assert_eq!(c.nodes.len(), 3);
        assert_eq!(c.nodes[2], ("::1".to_owned(), 3));

        let c = Config::parse("redis+sentinel://:pw@a,b:26380/mymaster/2").unwrap();
        assert_eq!(c.sentinel.as_deref(), Some("mymaster"));
        assert_eq!(
            c.nodes,
            vec![("a".to_owned(), 26379), ("b".to_owned(), 26380)]
        );
        assert_eq!(c.db, 2);
        assert!(!c.cluster && !c.tls);
        assert_eq!(
            c.redacted(),
            "redis+sentinel://:***@a:26379,b:26380/mymaster/2?namespace=locksmith"
        );
        let c = Config::parse("rediss+sentinel://a/m").unwrap();
        assert!(c.tls && c.sentinel.is_some() && c.db == 0);
    }

    #[test]
    fn rejects_bad_urls() {
        for url in [
            "",
            "http://h",
            "redis://",
            "redis://h:notaport",
            "redis://h:0",
            "redis://h:70000",
            "redis://h/abc",
            "redis://a,b",
            "redis://h?bogus=1",
            "redis://h?namespace=",
            "redis://h?namespace={x}",
            "redis://h?min_replicas=-1",
            "redis://h?replica_timeout_ms=abc",
            "redis://h?namespace=a&namespace=b",
            "redis://h?tls_ca=/x",
            "redis://h#insecure",
            "redis://h?poll_ms",
            "redis+cluster://a:1,b:2/1",
            "redis://us er:pw@h",
            "redis://user@h",
            "redis+sentinel://a:1",
            "redis+sentinel://a:1/",
            "redis+sentinel://a:1/m/x",
            "redis+sentinel://a:1/m{x}",
            "redis://h?interop=jedis",
            "redis://h?interop=",
            "redis+cluster://a:1,b:2?interop=redis-py",
            "redis://h?interop=redisson&min_replicas=1",
        ] {
            let e = Config::parse(url).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{url}");
        }
    }

    #[test]
    fn handover_from_url_and_file() {
        assert_eq!(
            Config::parse("redis://h").unwrap().handover,
            Handover::default()
        );
        let url = Config::parse("redis://h?handover=grant").unwrap();
        assert_eq!(url.handover, Handover::Grant);
        assert_eq!(
            Config::parse("redis://h?handover=wake").unwrap().handover,
            Handover::Wake
        );
        assert!(Config::parse("redis://h?handover=fast").is_err());
        let file: Config =
            serde_json::from_str(r#"{"nodes": ["h"], "handover": "grant"}"#).unwrap();
        assert_eq!(file.handover, Handover::Grant);
    }

    #[test]
    fn interop_from_url_and_file() {
        assert_eq!(Config::parse("redis://h").unwrap().interop, None);
        let url = Config::parse("redis://h?interop=redis-py").unwrap();
        assert_eq!(url.interop, Some(crate::Interop::RedisPy));
        assert!(url.redacted().ends_with("&interop=redis-py"));
        let file: Config =
            serde_json::from_str(r#"{"nodes": ["h"], "interop": "redisson"}"#).unwrap();
        assert_eq!(
            file.validate().unwrap(),
            Config::parse("redis://h?interop=redisson").unwrap()
        );
    }

    /// A config file (JSON here; any serde format) gives the same `Config` as the URL, through
    /// the same validation, and refuses unknown keys.
    #[test]
    fn config_file_equals_url_and_refuses_unknown_keys() {
        let url = Config::parse(
            "rediss+sentinel://app:s3cret@s1,s2:26380/mymaster/3?namespace=jobs&poll_ms=250\
             &min_replicas=1&replica_timeout_ms=40&tls_ca=/etc/ca.pem&connect_timeout_ms=900\
             &response_timeout_ms=700",
        )
        .unwrap();
        let file: Config = serde_json::from_str(
            r#"{"tls": true, "sentinel": "mymaster", "nodes": ["s1", "s2:26380"],
                "username": "app", "password": "s3cret", "db": 3, "namespace": "jobs",
                "poll_ms": 250, "min_replicas": 1, "replica_timeout_ms": 40,
                "tls_ca": "/etc/ca.pem", "connect_timeout_ms": 900, "response_timeout_ms": 700}"#,
        )
        .unwrap();
        assert_eq!(file.validate().unwrap(), url);
        assert!(!format!("{url:?}").contains("s3cret"));
        // Defaults match too.
        let file: Config = serde_json::from_str(r#"{"nodes": ["h"]}"#).unwrap();
        assert_eq!(
            file.validate().unwrap(),
            Config::parse("redis://h").unwrap()
        );
        // Unknown keys are refused, in a file and in a URL.
        let e = serde_json::from_str::<Config>(r#"{"nodes": ["h"], "pol_ms": 5}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `pol_ms`"), "{e}");
        assert_eq!(
            Config::parse("redis://h?pol_ms=5").unwrap_err().kind(),
            ErrorKind::InvalidConfig
        );
        // Address fields belong to the URL's address part, not its query.
        assert!(Config::parse("redis://h?password=x").is_err());
        // Validation is the URL's: a bad file value is InvalidConfig, without the password.
        for bad in [
            r#"{"nodes": ["h"], "namespace": "{x}", "password": "s3cret"}"#,
            r#"{"nodes": ["a", "b"]}"#,
            r#"{"nodes": []}"#,
            r#"{"nodes": ["h"], "poll_ms": 1}"#,
            r#"{"nodes": ["h"], "tls_ca": "/ca.pem"}"#,
            r#"{"nodes": ["h"], "cluster": true, "db": 1}"#,
            r#"{"nodes": ["h"], "username": "u"}"#,
        ] {
            let e = serde_json::from_str::<Config>(bad)
                .unwrap()
                .validate()
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{bad}");
            assert!(!e.to_string().contains("s3cret"));
        }
    }
}
