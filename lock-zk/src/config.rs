//! Parsing and validating `zk://` URLs. Nothing here ever echoes the digest password: error
//! messages name the parameter, never its value.

use std::time::Duration;

use lockcore::{Error, Result, Secret};
use percent_encoding::percent_decode_str;

/// The session timeout asked for when the URL does not say: a crashed holder blocks its locks
/// for about this long, and a partitioned holder's lost signal fires within 2/3 of it.
pub(crate) const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// The namespace (top-level node under the chroot) when the URL does not say.
pub(crate) const DEFAULT_NAMESPACE: &str = "locksmith";
const DEFAULT_PORT: u16 = 2181;
const MIN_SESSION_TIMEOUT_MS: u64 = 100;
const MAX_SESSION_TIMEOUT_MS: u64 = 24 * 3600 * 1000;
/// The largest `lost_after_disconnect` factor: the client notices a silent connection 2/5 (+1/20)
/// of the session timeout after the last reply, and the server may expire the session one
/// session timeout after it; a grace past 1/2 would let the lost signal come after the expiry.
pub(crate) const MAX_LOST_AFTER_DISCONNECT: f64 = 0.5;

/// `digest` authentication: ZooKeeper's built-in `user:password` scheme.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Digest {
    pub(crate) user: String,
    pub(crate) password: Secret,
}

impl Digest {
    /// The bytes sent with `addAuth("digest", ...)`.
    pub(crate) fn auth_bytes(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password.expose()).into_bytes()
    }
}

/// A parsed `zk://host:port[,host:port...][/chroot][?params]` URL.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Config {
    /// `host:port` pairs, IPv6 hosts in brackets.
    pub(crate) hosts: Vec<String>,
    /// `""` or an absolute path without trailing slash.
    pub(crate) chroot: String,
    pub(crate) namespace: String,
    pub(crate) session_timeout: Duration,
    pub(crate) digest: Option<Digest>,
    /// How long a disconnection may last before held leases are reported lost, as a fraction of
    /// the negotiated session timeout. 0 (the default) is Curator's standard policy: a
    /// suspended connection is a lost lock.
    pub(crate) lost_after_disconnect: f64,
}

impl Config {
    /// The connect string for the client: the hosts only (the chroot is applied by this crate,
    /// so that it can be created when missing).
    pub(crate) fn connect_string(&self) -> String {
        self.hosts.join(",")
    }

    /// The node under which every lock lives: `<chroot>/<namespace>`.
    pub(crate) fn base_path(&self) -> String {
        format!("{}/{}", self.chroot, self.namespace)
    }

    /// The URL with the password replaced by `***`.
    pub(crate) fn redacted(&self, negotiated: Option<Duration>) -> String {
        let mut s = format!(
            "zk://{}{}?namespace={}&session_timeout_ms={}",
            self.connect_string(),
            self.chroot,
            self.namespace,
            self.session_timeout.as_millis()
        );
        if self.lost_after_disconnect > 0.0 {
            s.push_str(&format!(
                "&lost_after_disconnect={}",
                self.lost_after_disconnect
            ));
        }
        if let Some(n) = negotiated {
            s.push_str(&format!(" (negotiated {} ms)", n.as_millis()));
        }
        if let Some(d) = &self.digest {
            // After the negotiated note would read oddly; keep parameters together.
            let at = s.find(" (").unwrap_or(s.len());
            s.insert_str(at, &format!("&digest={}:***", d.user));
        }
        s
    }

    pub(crate) fn parse(url: &str) -> Result<Config> {
        let rest = strip_scheme(url)
            .ok_or_else(|| Error::invalid_config("a ZooKeeper URL starts with zk://"))?;
        if rest.contains('#') {
            return Err(Error::invalid_config("a zk:// URL has no #fragment"));
        }
        let (before_query, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => (&before_query[..i], &before_query[i..]),
            None => (before_query, ""),
        };
        if authority.contains('@') {
            return Err(Error::invalid_config(
                "a zk:// URL carries no user info; pass credentials as ?digest=user:password",
            ));
        }
        let hosts = parse_hosts(authority)?;
        let chroot = parse_chroot(path)?;
        let mut config = Config {
            hosts,
            chroot,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            digest: None,
            lost_after_disconnect: 0.0,
        };
        let mut seen: Vec<&'static str> = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode(raw_key).ok().filter(|k| is_plain_key(k));
            let key: &'static str = match key.as_deref() {
                Some("session_timeout_ms") => "session_timeout_ms",
                Some("namespace") => "namespace",
                Some("digest") => "digest",
                Some("lost_after_disconnect") => "lost_after_disconnect",
                // Echo a key only when it cannot be a misplaced secret.
                Some(other) => {
                    return Err(Error::invalid_config(format!(
                        "unknown zk:// parameter {other:?} (known: session_timeout_ms, namespace, digest, lost_after_disconnect)"
                    )));
                }
                None => {
                    return Err(Error::invalid_config(
                        "a zk:// query parameter is malformed (expected key=value with a known key)",
                    ));
                }
            };
            if seen.contains(&key) {
                return Err(Error::invalid_config(format!(
                    "zk:// parameter {key} is given twice"
                )));
            }
            seen.push(key);
            let value = decode(raw_value).map_err(|_| {
                Error::invalid_config(format!(
                    "zk:// parameter {key} is not valid percent-encoded UTF-8"
                ))
            })?;
            if value.is_empty() {
                return Err(Error::invalid_config(format!(
                    "zk:// parameter {key} is empty"
                )));
            }
            match key {
                "session_timeout_ms" => {
                    let ms: u64 = value.parse().map_err(|_| {
                        Error::invalid_config(format!(
                            "session_timeout_ms must be a whole number of milliseconds, got {value:?}"
                        ))
                    })?;
                    if !(MIN_SESSION_TIMEOUT_MS..=MAX_SESSION_TIMEOUT_MS).contains(&ms) {
                        return Err(Error::invalid_config(format!(
                            "session_timeout_ms {ms} is outside {MIN_SESSION_TIMEOUT_MS}..={MAX_SESSION_TIMEOUT_MS}"
                        )));
                    }
                    config.session_timeout = Duration::from_millis(ms);
                }
                "lost_after_disconnect" => {
                    config.lost_after_disconnect = parse_lost_after_disconnect(&value)?;
                }
                "namespace" => {
                    if !is_segment(&value) {
                        return Err(Error::invalid_config(format!(
                            "namespace {value:?} must be one path segment of [A-Za-z0-9_.-], not . or .."
                        )));
                    }
                    config.namespace = value;
                }
                "digest" => {
                    // Never echo the value: it holds the password.
                    let (user, password) = value.split_once(':').ok_or_else(|| {
                        Error::invalid_config(
                            "digest must be user:password (percent-encode reserved characters)",
                        )
                    })?;
                    if user.is_empty() || password.is_empty() {
                        return Err(Error::invalid_config(
                            "digest must be user:password with a non-empty user and password",
                        ));
                    }
                    config.digest = Some(Digest {
                        user: user.to_owned(),
                        password: Secret::new(password),
                    });
                }
                _ => unreachable!("keys are matched above"),
            }
        }
        if config.chroot.is_empty() && config.namespace == "zookeeper" {
            return Err(Error::invalid_config(
                "namespace \"zookeeper\" is reserved by ZooKeeper at the root",
            ));
        }
        Ok(config)
    }
}

/// Validates a `lost_after_disconnect` factor (a fraction of the session timeout).
pub(crate) fn parse_lost_after_disconnect(value: &str) -> Result<f64> {
    let factor: f64 = value.parse().map_err(|_| {
        Error::invalid_config(format!(
            "lost_after_disconnect must be a fraction of the session timeout (0 to {MAX_LOST_AFTER_DISCONNECT}), got {value:?}"
        ))
    })?;
    check_lost_after_disconnect(factor)?;
    Ok(factor)
}

/// A factor outside `0..=MAX_LOST_AFTER_DISCONNECT` could report the loss after the server
/// expired the session.
pub(crate) fn check_lost_after_disconnect(factor: f64) -> Result<()> {
    if !(0.0..=MAX_LOST_AFTER_DISCONNECT).contains(&factor) {
        return Err(Error::invalid_config(format!(
            "lost_after_disconnect {factor} is outside 0..={MAX_LOST_AFTER_DISCONNECT} (a fraction of the session timeout; larger would report the loss after the server may have expired the session)"
        )));
    }
    Ok(())
}

fn strip_scheme(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once("://")?;
    scheme.eq_ignore_ascii_case("zk").then_some(rest)
}

fn decode(s: &str) -> std::result::Result<String, std::str::Utf8Error> {
    percent_decode_str(s).decode_utf8().map(|c| c.into_owned())
}

fn is_plain_key(k: &str) -> bool {
    !k.is_empty() && k.len() <= 32 && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

fn is_segment(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.len() <= 200
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

fn parse_hosts(authority: &str) -> Result<Vec<String>> {
    if authority.is_empty() {
        return Err(Error::invalid_config(
            "a zk:// URL needs at least one host:port",
        ));
    }
    let mut hosts = Vec::new();
    for entry in authority.split(',') {
        let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
            let (h, after) = rest
                .split_once(']')
                .ok_or_else(|| Error::invalid_config(format!("bad IPv6 host in {entry:?}")))?;
            if h.is_empty()
                || !h
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
            {
                return Err(Error::invalid_config(format!("bad IPv6 host in {entry:?}")));
            }
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| Error::invalid_config(format!("bad host:port {entry:?}")))?,
                ),
            };
            (format!("[{h}]"), port)
        } else {
            let (h, p) = match entry.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (entry, None),
            };
            if h.is_empty()
                || !h
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
            {
                return Err(Error::invalid_config(format!("bad host in {entry:?}")));
            }
            (h.to_owned(), p)
        };
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| Error::invalid_config(format!("bad port in {entry:?}")))?,
        };
        hosts.push(format!("{host}:{port}"));
    }
    Ok(hosts)
}

fn parse_chroot(path: &str) -> Result<String> {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    for seg in trimmed[1..].split('/') {
        if !is_segment(seg) {
            return Err(Error::invalid_config(format!(
                "chroot {path:?}: every segment must be [A-Za-z0-9_.-], not empty, . or .."
            )));
        }
    }
    if trimmed == "/zookeeper" || trimmed.starts_with("/zookeeper/") {
        return Err(Error::invalid_config(
            "the chroot may not be under /zookeeper (reserved)",
        ));
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::ErrorKind;

    #[test]
    fn parses_full_url() {
        let c = Config::parse(
            "zk://h1:1,[::1]:2,h3/app/x?session_timeout_ms=4000&namespace=ns&digest=me:p%40ss%3Aw",
        )
        .unwrap();
        assert_eq!(c.hosts, ["h1:1", "[::1]:2", "h3:2181"]);
        assert_eq!(c.chroot, "/app/x");
        assert_eq!(c.namespace, "ns");
        assert_eq!(c.session_timeout, Duration::from_millis(4000));
        let d = c.digest.clone().unwrap();
        assert_eq!(d.user, "me");
        assert_eq!(d.password.expose(), "p@ss:w");
        assert_eq!(c.base_path(), "/app/x/ns");
        let shown = format!("{c:?} {}", c.redacted(None));
        assert!(
            !shown.contains("p@ss") && !shown.contains("p%40ss"),
            "{shown}"
        );
        assert!(shown.contains("me:***"), "{shown}");
        assert_eq!(c.lost_after_disconnect, 0.0);
        let c = Config::parse("zk://h?lost_after_disconnect=0.25").unwrap();
        assert_eq!(c.lost_after_disconnect, 0.25);
        assert!(c.redacted(None).contains("lost_after_disconnect=0.25"));
    }

    #[test]
    fn defaults() {
        let c = Config::parse("zk://127.0.0.1:12181").unwrap();
        assert_eq!(c.chroot, "");
        assert_eq!(c.base_path(), "/locksmith");
        assert_eq!(c.session_timeout, DEFAULT_SESSION_TIMEOUT);
        assert!(c.digest.is_none());
        assert_eq!(Config::parse("zk://h/").unwrap().chroot, "");
    }

    #[test]
    fn rejects_bad_urls_without_leaking() {
        let secret = "hunter2-secret";
        let bad = [
            "redis://h:1".to_owned(),
            "zk://".to_owned(),
            "zk:///chroot".to_owned(),
            "zk://h:notaport".to_owned(),
            "zk://h:0".to_owned(),
            "zk://h:99999".to_owned(),
            "zk://h,,g".to_owned(),
            "zk://h/a//b".to_owned(),
            "zk://h/a/../b".to_owned(),
            "zk://h/zookeeper".to_owned(),
            "zk://h?namespace=zookeeper".to_owned(),
            "zk://h?namespace=a/b".to_owned(),
            "zk://h?session_timeout_ms=abc".to_owned(),
            "zk://h?session_timeout_ms=0".to_owned(),
            "zk://h?session_timeout_ms=".to_owned(),
            "zk://h?unknown=1".to_owned(),
            "zk://h?lost_after_disconnect=0.9".to_owned(),
            "zk://h?lost_after_disconnect=-0.1".to_owned(),
            "zk://h?lost_after_disconnect=NaN".to_owned(),
            "zk://h?lost_after_disconnect=x".to_owned(),
            format!("zk://user:{secret}@h"),
            format!("zk://h?digest={secret}"),
            format!("zk://h?digest=:{secret}"),
            format!("zk://h?digest=u:{secret}&digest=u:{secret}"),
            format!("zk://h?u:{secret}"),
            format!("zk://h?digset=u:{secret}"),
            format!("zk://h?digest=u:{secret}#frag"),
            format!("zk://h?digest=u:{secret}%FF"),
        ];
        for url in &bad {
            let e = Config::parse(url).expect_err(url);
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{url}");
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains(secret), "{url} leaked: {shown}");
        }
    }
}
