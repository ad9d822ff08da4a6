//! Parsing and validating `etcd://` and `etcds://` URLs. Nothing here ever echoes the password:
//! error messages name the parameter, never its value.

use std::path::PathBuf;
use std::time::Duration;

use lockcore::{Error, Result, Secret};
use percent_encoding::percent_decode_str;

/// The key namespace when the URL gives no path.
pub(crate) const DEFAULT_NAMESPACE: &str = "locksmith";
const DEFAULT_PORT: u16 = 2379;
/// How long one request may take before it is reported `Unavailable`.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_TIMEOUT_MS: u64 = 600_000;

/// A parsed `etcd[s]://[user:password@]host:port[,host:port...][/namespace][?params]` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    pub(crate) tls: bool,
    /// `host:port` pairs, IPv6 hosts in brackets.
    pub(crate) hosts: Vec<String>,
    /// The key prefix every lock lives under (no leading or trailing `/`).
    pub(crate) namespace: String,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<Secret>,
    /// CA certificate (PEM) that verifies the servers (`etcds://` only).
    pub(crate) ca: Option<PathBuf>,
    /// TLS server name to verify instead of the host (`etcds://` only).
    pub(crate) domain: Option<String>,
    pub(crate) timeout: Duration,
}

impl Config {
    /// The endpoints as the client takes them (`http://h:p` or `https://h:p`).
    pub(crate) fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.hosts
            .iter()
            .map(|h| format!("{scheme}://{h}"))
            .collect()
    }

    /// The URL with the password replaced by `***`.
    pub(crate) fn redacted(&self) -> String {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        let user = match (&self.user, &self.password) {
            (Some(u), Some(_)) => format!("{u}:***@"),
            (Some(u), None) => format!("{u}@"),
            _ => String::new(),
        };
        let mut s = format!(
            "{scheme}://{user}{}/{}",
            self.hosts.join(","),
            self.namespace
        );
        let mut params = Vec::new();
        if let Some(ca) = &self.ca {
            params.push(format!("ca={}", ca.display()));
        }
        if let Some(d) = &self.domain {
            params.push(format!("domain={d}"));
        }
        if self.timeout != DEFAULT_TIMEOUT {
            params.push(format!("timeout_ms={}", self.timeout.as_millis()));
        }
        if !params.is_empty() {
            s.push('?');
            s.push_str(&params.join("&"));
        }
        s
    }

    pub(crate) fn parse(url: &str) -> Result<Config> {
        let (tls, rest) = strip_scheme(url).ok_or_else(|| {
            Error::invalid_config("an etcd URL starts with etcd:// or etcds:// (TLS)")
        })?;
        if rest.contains('#') {
            return Err(Error::invalid_config("an etcd URL has no #fragment"));
        }
        // The user info ends at the last `@` before the host list (a password may hold `@`, `/`
        // or `?` when not percent-encoded); it is never echoed.
        let (userinfo, rest) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (before_query, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => (&before_query[..i], &before_query[i..]),
            None => (before_query, ""),
        };
        let hosts = parse_hosts(authority)?;
        let namespace = parse_namespace(path)?;
        let (user, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (u, p) = info.split_once(':').ok_or_else(|| {
                    Error::invalid_config(
                        "etcd user info must be user:password (percent-encode reserved characters)",
                    )
                })?;
                let user = decode(u).map_err(|_| {
                    Error::invalid_config("the etcd user name is not valid percent-encoded UTF-8")
                })?;
                let password = decode(p).map_err(|_| {
                    Error::invalid_config("the etcd password is not valid percent-encoded UTF-8")
                })?;
                if user.is_empty() || password.is_empty() {
                    return Err(Error::invalid_config(
                        "etcd user info needs a non-empty user and password",
                    ));
                }
                if user.chars().any(|c| c.is_control()) {
                    return Err(Error::invalid_config(
                        "the etcd user name has control characters",
                    ));
                }
                (Some(user), Some(Secret::new(password)))
            }
        };
        let mut config = Config {
            tls,
            hosts,
            namespace,
            user,
            password,
            ca: None,
            domain: None,
            timeout: DEFAULT_TIMEOUT,
        };
        let mut seen: Vec<&'static str> = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let key: &'static str = match decode(raw_key).ok().as_deref() {
                Some("ca") => "ca",
                Some("domain") => "domain",
                Some("timeout_ms") => "timeout_ms",
                // Echo a key only when it cannot be a misplaced secret.
                Some(k) if is_plain_key(k) => {
                    return Err(Error::invalid_config(format!(
                        "unknown etcd URL parameter {k:?} (known: ca, domain, timeout_ms)"
                    )));
                }
                _ => {
                    return Err(Error::invalid_config(
                        "an etcd URL query parameter is malformed (expected key=value with a known key)",
                    ));
                }
            };
            if seen.contains(&key) {
                return Err(Error::invalid_config(format!(
                    "etcd URL parameter {key} is given twice"
                )));
            }
            seen.push(key);
            let value = decode(raw_value).map_err(|_| {
                Error::invalid_config(format!(
                    "etcd URL parameter {key} is not valid percent-encoded UTF-8"
                ))
            })?;
            if value.is_empty() {
                return Err(Error::invalid_config(format!(
                    "etcd URL parameter {key} is empty"
                )));
            }
            match key {
                "ca" => {
                    if !tls {
                        return Err(Error::invalid_config("ca= is for etcds:// (TLS) URLs only"));
                    }
                    config.ca = Some(PathBuf::from(value));
                }
                "domain" => {
                    if !tls {
                        return Err(Error::invalid_config(
                            "domain= is for etcds:// (TLS) URLs only",
                        ));
                    }
                    if !value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
                    {
                        return Err(Error::invalid_config(format!(
                            "domain {value:?} is not a DNS name"
                        )));
                    }
                    config.domain = Some(value);
                }
                "timeout_ms" => {
                    let ms: u64 = value.parse().ok().filter(|ms| (1..=MAX_TIMEOUT_MS).contains(ms)).ok_or_else(|| {
                        Error::invalid_config(format!(
                            "timeout_ms must be a whole number of milliseconds in 1..={MAX_TIMEOUT_MS}, got {value:?}"
                        ))
                    })?;
                    config.timeout = Duration::from_millis(ms);
                }
                _ => unreachable!("keys are matched above"),
            }
        }
        Ok(config)
    }
}

fn strip_scheme(url: &str) -> Option<(bool, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme.eq_ignore_ascii_case("etcd") {
        Some((false, rest))
    } else if scheme.eq_ignore_ascii_case("etcds") {
        Some((true, rest))
    } else {
        None
    }
}

fn decode(s: &str) -> std::result::Result<String, std::str::Utf8Error> {
    percent_decode_str(s).decode_utf8().map(|c| c.into_owned())
}

fn is_plain_key(k: &str) -> bool {
    !k.is_empty() && k.len() <= 32 && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

fn parse_hosts(authority: &str) -> Result<Vec<String>> {
    if authority.is_empty() {
        return Err(Error::invalid_config(
            "an etcd URL needs at least one host:port",
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

/// `/a/b/` -> `a/b`; empty -> the default. Segments of `[A-Za-z0-9_.-]`, never `.` or `..`.
fn parse_namespace(path: &str) -> Result<String> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return Ok(DEFAULT_NAMESPACE.to_owned());
    }
    if trimmed.len() > 200 {
        return Err(Error::invalid_config(
            "the etcd key prefix is longer than 200 bytes",
        ));
    }
    for seg in trimmed.split('/') {
        let ok = !seg.is_empty()
            && seg != "."
            && seg != ".."
            && seg
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !ok {
            return Err(Error::invalid_config(format!(
                "etcd key prefix {path:?}: every segment must be [A-Za-z0-9_.-], not empty, . or .."
            )));
        }
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
            "etcds://me:p%40ss%3Aw@h1:1,[::1]:2,h3/app/x?ca=/tmp/ca.pem&domain=localhost&timeout_ms=2500",
        )
        .unwrap();
        assert!(c.tls);
        assert_eq!(c.hosts, ["h1:1", "[::1]:2", "h3:2379"]);
        assert_eq!(c.namespace, "app/x");
        assert_eq!(c.user.as_deref(), Some("me"));
        assert_eq!(c.password.as_ref().unwrap().expose(), "p@ss:w");
        assert_eq!(c.ca.as_deref(), Some(std::path::Path::new("/tmp/ca.pem")));
        assert_eq!(c.domain.as_deref(), Some("localhost"));
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(
            c.endpoints(),
            ["https://h1:1", "https://[::1]:2", "https://h3:2379"]
        );
        let shown = format!("{c:?} {}", c.redacted());
        assert!(
            !shown.contains("p@ss") && !shown.contains("p%40ss"),
            "{shown}"
        );
        assert!(shown.contains("me:***@"), "{shown}");
    }

    #[test]
    fn defaults() {
        let c = Config::parse("etcd://127.0.0.1:12379").unwrap();
        assert!(!c.tls);
        assert_eq!(c.namespace, DEFAULT_NAMESPACE);
        assert_eq!(c.endpoints(), ["http://127.0.0.1:12379"]);
        assert!(c.user.is_none() && c.password.is_none());
        assert_eq!(Config::parse("ETCD://h/").unwrap().namespace, "locksmith");
        assert_eq!(
            Config::parse("etcd://h").unwrap().redacted(),
            "etcd://h:2379/locksmith"
        );
    }

    #[test]
    fn rejects_bad_urls_without_leaking() {
        let secret = "hunter2-secret";
        let bad = [
            "http://h:1".to_owned(),
            "etcd://".to_owned(),
            "etcd:///ns".to_owned(),
            "etcd://h:notaport".to_owned(),
            "etcd://h:0".to_owned(),
            "etcd://h:99999".to_owned(),
            "etcd://h,,g".to_owned(),
            "etcd://h/a//b".to_owned(),
            "etcd://h/a/../b".to_owned(),
            "etcd://h/a b".to_owned(),
            "etcd://h?ca=/x".to_owned(),
            "etcds://h?timeout_ms=0".to_owned(),
            "etcds://h?timeout_ms=abc".to_owned(),
            "etcds://h?unknown=1".to_owned(),
            format!("etcd://user{secret}@h"),
            format!("etcd://:{secret}@h"),
            format!("etcd://u:{secret}%FF@h"),
            format!("etcd://u:{secret}@h?{secret}"),
            format!("etcd://u:{secret}@h?ca=x&ca=y"),
            format!("etcd://u:{secret}@h#frag"),
            format!("etcd://u:{secret}@h/../x"),
        ];
        for url in &bad {
            let e = Config::parse(url).expect_err(url);
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{url}");
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains(secret), "{url} leaked: {shown}");
        }
    }
}
