//! Parsing and validation of `redis://` URLs, with the password kept out of every printable form.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lockcore::{Error, Result, Secret};
use percent_encoding::percent_decode_str;

/// The default key namespace.
pub(crate) const DEFAULT_NAMESPACE: &str = "locksmith";

/// Everything a `redis://` URL says, validated (see the [crate docs](crate) for the form and
/// parameters). `Debug` never shows the password.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// `rediss`: TLS with certificate verification.
    pub tls: bool,
    /// `+cluster`: a Redis Cluster.
    pub cluster: bool,
    /// `+sentinel`: the name of the primary the sentinels in `nodes` watch.
    pub sentinel: Option<String>,
    /// Host and port of each node given (one unless `cluster`).
    pub nodes: Vec<(String, u16)>,
    /// The ACL user name.
    pub username: Option<String>,
    /// The password.
    pub password: Option<Secret>,
    /// The database number.
    pub db: i64,
    /// The key prefix.
    pub namespace: String,
    /// `WAIT` for this many replicas after winning.
    pub min_replicas: u32,
    /// The `WAIT` timeout.
    pub replica_timeout: Duration,
    /// PEM file of the CA that signed the server certificate.
    pub tls_ca: Option<PathBuf>,
    /// Safety-net poll of a notified waiter.
    pub poll: Duration,
    /// Connection timeout.
    pub connect_timeout: Duration,
    /// Per-command response timeout.
    pub response_timeout: Duration,
}

fn bad(msg: impl fmt::Display) -> Error {
    // Never echo the URL itself: it may carry a password.
    Error::invalid_config(format!("invalid redis URL: {msg}"))
}

fn decode(part: &str, what: &str) -> Result<String> {
    percent_decode_str(part)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            bad(format_args!(
                "the {what} is not valid percent-encoded UTF-8"
            ))
        })
}

fn parse_ms(key: &str, value: &str, min: u64, max: u64) -> Result<Duration> {
    match value.parse::<u64>() {
        Ok(ms) if (min..=max).contains(&ms) => Ok(Duration::from_millis(ms)),
        _ => Err(bad(format_args!(
            "query parameter `{key}` must be a whole number of milliseconds in {min}..={max}"
        ))),
    }
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
    /// Parses `redis://`, `rediss://`, `redis+cluster://`, `rediss+cluster://`,
    /// `redis+sentinel://` and `rediss+sentinel://` URLs.
    ///
    /// # Errors
    /// `InvalidConfig` for anything malformed or unknown (the URL itself is never quoted).
    pub fn parse(url: &str) -> Result<Config> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected <scheme>://..."))?;
        let (tls, cluster, sentinel) = match scheme.to_ascii_lowercase().as_str() {
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
        if rest.contains('#') {
            return Err(bad(
                "fragments (`#...`) are not supported; use ?tls_ca= for TLS",
            ));
        }
        let (before_query, query) = match rest.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => (&before_query[..i], &before_query[i + 1..]),
            None => (before_query, ""),
        };
        // The password may contain `@` only percent-encoded, but split on the last one anyway.
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => {
                let (user, pw) = match u.split_once(':') {
                    Some((user, pw)) => (user, Some(pw)),
                    None => (u, None),
                };
                let user = decode(user, "user name")?;
                if user.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return Err(bad("the user name contains white space"));
                }
                let pw = pw.map(|p| decode(p, "password")).transpose()?;
                if pw.is_none() && !user.is_empty() {
                    return Err(bad(
                        "a user name without a password; write redis://user:password@host",
                    ));
                }
                (
                    (!user.is_empty()).then_some(user),
                    pw.filter(|p| !p.is_empty()).map(Secret::new),
                )
            }
        };
        let default_port = if sentinel { 26379 } else { 6379 };
        let nodes = hosts
            .split(',')
            .map(|h| parse_host_port(h, default_port))
            .collect::<Result<Vec<_>>>()?;
        if !cluster && !sentinel && nodes.len() != 1 {
            return Err(bad(
                "several hosts need the redis+cluster:// or redis+sentinel:// scheme",
            ));
        }
        // Sentinel: the path is `<primary name>[/db]`.
        let (master, path) = if sentinel {
            let (name, db) = match path.split_once('/') {
                Some((n, d)) => (n, d),
                None => (path, ""),
            };
            let name = decode(name, "primary name")?;
            if name.is_empty()
                || name.len() > 128
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
            {
                return Err(bad(
                    "redis+sentinel:// needs the primary's name as the path \
                     (1 to 128 characters of [A-Za-z0-9_.:-]), like /mymaster or /mymaster/0",
                ));
            }
            (Some(name), db)
        } else {
            (None, path)
        };
        let db = match path {
            "" => 0,
            p => match p.parse::<i64>() {
                Ok(db) if (0..=1_000_000).contains(&db) => db,
                _ => return Err(bad("the path must be a database number, like /0")),
            },
        };
        if cluster && db != 0 {
            return Err(bad("Redis Cluster has only database 0"));
        }
        let mut cfg = Config {
            tls,
            cluster,
            sentinel: master,
            nodes,
            username,
            password,
            db,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            min_replicas: 0,
            replica_timeout: Duration::from_millis(100),
            tls_ca: None,
            poll: Duration::from_millis(1000),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
        };
        let mut seen = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| bad("a query parameter has no `=value`"))?;
            let key = decode(key, "query parameter name")?;
            let value = decode(value, "query parameter value")?;
            if seen.contains(&key) {
                return Err(bad(format_args!("query parameter `{key}` is given twice")));
            }
            match key.as_str() {
                "namespace" => {
                    // No braces (they would pick the hash slot) and nothing that needs quoting.
                    if value.is_empty()
                        || value.len() > 64
                        || !value
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
                    {
                        return Err(bad(
                            "namespace must be 1 to 64 characters of [A-Za-z0-9_.:-]",
                        ));
                    }
                    cfg.namespace = value;
                }
                "min_replicas" => {
                    cfg.min_replicas =
                        value
                            .parse::<u32>()
                            .ok()
                            .filter(|n| *n <= 100)
                            .ok_or_else(|| {
                                bad("query parameter `min_replicas` must be a number in 0..=100")
                            })?;
                }
                "replica_timeout_ms" => {
                    cfg.replica_timeout = parse_ms(&key, &value, 1, 60_000)?;
                }
                "tls_ca" => {
                    if value.is_empty() {
                        return Err(bad("query parameter `tls_ca` is empty"));
                    }
                    cfg.tls_ca = Some(PathBuf::from(value));
                }
                "poll_ms" => cfg.poll = parse_ms(&key, &value, 10, 3_600_000)?,
                "connect_timeout_ms" => cfg.connect_timeout = parse_ms(&key, &value, 1, 600_000)?,
                "response_timeout_ms" => cfg.response_timeout = parse_ms(&key, &value, 1, 600_000)?,
                _ => {
                    return Err(bad(format_args!(
                        "unknown query parameter `{key}` (known: namespace, min_replicas, \
                         replica_timeout_ms, tls_ca, poll_ms, connect_timeout_ms, \
                         response_timeout_ms)"
                    )));
                }
            }
            seen.push(key);
        }
        if cfg.tls_ca.is_some() && !cfg.tls {
            return Err(bad("`tls_ca` needs the rediss:// scheme"));
        }
        Ok(cfg)
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
        let mut out = format!("{scheme}://");
        match (&self.username, &self.password) {
            (Some(u), Some(_)) => out.push_str(&format!("{u}:***@")),
            (None, Some(_)) => out.push_str(":***@"),
            (Some(u), None) => out.push_str(&format!("{u}@")),
            (None, None) => {}
        }
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|(h, p)| {
                if h.contains(':') {
                    format!("[{h}]:{p}")
                } else {
                    format!("{h}:{p}")
                }
            })
            .collect();
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
        ] {
            let e = Config::parse(url).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{url}");
        }
    }
}
