//! Parsing and validating `etcd://` and `etcds://` URLs. Nothing here ever echoes the password:
//! error messages name the parameter, never its value.

use std::path::PathBuf;
use std::time::Duration;

use lockcore::config::{
    UrlParts, UserInfoAt, check_millis, decode_userinfo, is_segment, millis, parse_hosts,
};
use lockcore::{Error, Result, Secret};

/// The key namespace when the URL gives no path.
pub(crate) use lockcore::config::DEFAULT_NAMESPACE;
const DEFAULT_PORT: u16 = 2379;
/// How long one request may take before it is reported `Unavailable`.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_TIMEOUT_MS: u64 = 600_000;

/// An etcd backend's configuration: what an `etcd[s]://[user:password@]host:port[,...][/namespace][?params]`
/// URL says, or the same fields from a config file (any serde format; unknown keys refused),
/// validated the same way ([`Config::validate`], run by
/// [`EtcdBackend::from_config`](crate::EtcdBackend::from_config)). `Debug` never shows the
/// password.
///
/// ```
/// let from_file: lock_etcd::Config = serde_json::from_str(
///     r#"{"tls": true, "hosts": ["e1:2379", "e2"], "namespace": "app/locks", "user": "app",
///         "password": "s3cret", "ca": "/etc/ca.pem", "timeout_ms": 2000}"#,
/// ).unwrap();
/// let from_url = lock_etcd::Config::parse(
///     "etcds://app:s3cret@e1:2379,e2/app/locks?ca=/etc/ca.pem&timeout_ms=2000",
/// ).unwrap();
/// assert_eq!(from_file.validate().unwrap(), from_url);
/// assert!(!format!("{from_url:?}").contains("s3cret"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// `host:port` of each member (`host` alone takes 2379; IPv6 hosts in brackets).
    pub hosts: Vec<String>,
    /// `etcds`: TLS.
    #[serde(default)]
    pub tls: bool,
    /// The key prefix every lock lives under (no leading or trailing `/`).
    #[serde(default = "lockcore::config::default_namespace")]
    pub namespace: String,
    /// The user (with `password`).
    #[serde(default)]
    pub user: Option<String>,
    /// The password.
    #[serde(default)]
    pub password: Option<Secret>,
    /// CA certificate (PEM) that verifies the servers (TLS only).
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// TLS server name to verify instead of the host (TLS only).
    #[serde(default)]
    pub domain: Option<String>,
    /// How long one request may take before it is reported `Unavailable` (`timeout_ms`).
    #[serde(rename = "timeout_ms", with = "millis", default = "default_timeout")]
    pub timeout: Duration,
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

/// How errors name the URL.
const WHAT: &str = "etcd URL";

impl Config {
    /// The query parameters a URL may carry (the hosts, the namespace and the user info are its address part); any other is
    /// refused with `InvalidConfig`, named (the `locksmith` facade's docs list them per URL
    /// kind, checked by a test).
    pub const URL_PARAMS: &'static [&'static str] = &["ca", "domain", "timeout_ms"];

    /// Checks a configuration however it was made (a URL, a file); normalizes hosts and
    /// namespace.
    ///
    /// # Errors
    /// `InvalidConfig`, never quoting the password.
    pub fn validate(mut self) -> Result<Config> {
        self.hosts = parse_hosts(WHAT, &self.hosts.join(","), DEFAULT_PORT)?;
        self.namespace = parse_namespace(&self.namespace)?;
        match (&self.user, &self.password) {
            (None, None) => {}
            (Some(user), Some(password)) => {
                if user.is_empty() || password.expose().is_empty() {
                    return Err(Error::invalid_config(
                        "etcd user info needs a non-empty user and password",
                    ));
                }
                if user.chars().any(|c| c.is_control()) {
                    return Err(Error::invalid_config(
                        "the etcd user name has control characters",
                    ));
                }
            }
            _ => {
                return Err(Error::invalid_config(
                    "etcd credentials need both a user and a password",
                ));
            }
        }
        if self.ca.is_some() && !self.tls {
            return Err(Error::invalid_config("ca= is for etcds:// (TLS) URLs only"));
        }
        if self.ca.as_ref().is_some_and(|c| c.as_os_str().is_empty()) {
            return Err(Error::invalid_config("etcd `ca` is empty"));
        }
        if let Some(domain) = &self.domain {
            if !self.tls {
                return Err(Error::invalid_config(
                    "domain= is for etcds:// (TLS) URLs only",
                ));
            }
            if domain.is_empty()
                || !domain
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
            {
                return Err(Error::invalid_config(format!(
                    "domain {domain:?} is not a DNS name"
                )));
            }
        }
        check_millis(WHAT, "timeout_ms", self.timeout, 1, MAX_TIMEOUT_MS)?;
        Ok(self)
    }

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
        let user = match self.user {
            Some(_) => {
                lockcore::config::redacted_userinfo(self.user.as_deref(), self.password.as_ref())
            }
            None => String::new(),
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

    /// Parses an `etcd://` or `etcds://` URL.
    ///
    /// # Errors
    /// `InvalidConfig` for anything malformed or unknown (never quoting the password).
    pub fn parse(url: &str) -> Result<Config> {
        let parts = UrlParts::split(WHAT, url, UserInfoAt::LastAt)?;
        let tls = parts.scheme_among(
            &["etcd", "etcds"],
            "an etcd URL starts with etcd:// or etcds:// (TLS)",
        )? == 1;
        let (user, password) = match parts.userinfo {
            None => (None, None),
            Some(info) => match decode_userinfo(WHAT, info)? {
                (user, Some(password)) => (Some(user), Some(password)),
                (_, None) => {
                    return Err(Error::invalid_config(
                        "etcd user info must be user:password (percent-encode reserved characters)",
                    ));
                }
            },
        };
        // The query goes through the same deserializer as a config file.
        let (mut config, hosts): (Config, _) =
            parts.query_and_hosts(WHAT, Self::URL_PARAMS, "hosts")?;
        config.tls = tls;
        config.hosts = hosts;
        config.namespace = parts.path.to_owned();
        config.user = user;
        config.password = password;
        config.validate()
    }
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
        if !is_segment(seg) {
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
            "http://h:1",
            "etcd://",
            "etcd:///ns",
            "etcd://h:notaport",
            "etcd://h:0",
            "etcd://h:99999",
            "etcd://h,,g",
            "etcd://h/a//b",
            "etcd://h/a/../b",
            "etcd://h/a b",
            "etcd://h?ca=/x",
            "etcds://h?timeout_ms=0",
            "etcds://h?timeout_ms=abc",
            "etcds://h?unknown=1",
            "etcd://user{secret}@h",
            "etcd://:{secret}@h",
            "etcd://u:{secret}%FF@h",
            "etcd://u:{secret}@h?{secret}",
            "etcd://u:{secret}@h?ca=x&ca=y",
            "etcd://u:{secret}@h#frag",
            "etcd://u:{secret}@h/../x",
        ];
        conformance::refuses_without_leaking(secret, &bad, Config::parse);
    }

    /// A config file (JSON here) gives the URL's `Config` through the same validation; unknown
    /// keys are refused.
    #[test]
    fn config_file_equals_url_and_refuses_unknown_keys() {
        let bad = [
            r#"{"hosts": []}"#,
            r#"{"hosts": ["h"], "ca": "/ca.pem"}"#,
            r#"{"hosts": ["h"], "password": "hunter2"}"#,
            r#"{"hosts": ["h"], "namespace": "a/../b", "user": "u", "password": "hunter2"}"#,
            r#"{"hosts": ["h"], "timeout_ms": 0}"#,
        ];
        conformance::file_config_checks(
            r#"{"hosts": ["h"]}"#,
            &Config::parse("etcd://h").unwrap(),
            (r#"{"hosts": ["h"], "timeout": 5}"#, "timeout"),
            "hunter2",
            &bad,
            Config::validate,
        );
    }
}
