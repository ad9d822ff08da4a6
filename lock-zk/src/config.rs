//! Parsing and validating `zk://` URLs. Nothing here ever echoes the digest password: error
//! messages name the parameter, never its value.

use std::time::Duration;

use lockcore::config::{UrlParts, UserInfoAt, is_segment, millis, parse_hosts};
use lockcore::{Error, Result, Secret};

use crate::contenders::Interop;

/// The session timeout asked for when the URL does not say: a crashed holder blocks its locks
/// for about this long, and a partitioned holder's lost signal fires within 2/3 of it.
pub(crate) const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// The namespace (top-level node under the chroot) when the URL does not say.
const DEFAULT_PORT: u16 = 2181;
const MIN_SESSION_TIMEOUT_MS: u64 = 100;
const MAX_SESSION_TIMEOUT_MS: u64 = 24 * 3600 * 1000;
/// The largest `lost_after_disconnect` factor: the client notices a silent connection 2/5 (+1/20)
/// of the session timeout after the last reply, and the server may expire the session one
/// session timeout after it; a grace past 1/2 would let the lost signal come after the expiry.
pub(crate) const MAX_LOST_AFTER_DISCONNECT: f64 = 0.5;

/// `digest` authentication: ZooKeeper's built-in `user:password` scheme, written
/// `user:password` in a URL's `digest=` or a config file's `digest` (percent-encode reserved
/// characters in a URL). `Debug` never shows the password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digest {
    pub(crate) user: String,
    pub(crate) password: Secret,
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = Secret::deserialize(d)?;
        // The message never repeats the text: it holds a password.
        let (user, password) = text
            .expose()
            .split_once(':')
            .filter(|(u, p)| !u.is_empty() && !p.is_empty())
            .ok_or_else(|| {
                serde::de::Error::custom(
                    "digest must be user:password with a non-empty user and password",
                )
            })?;
        Ok(Digest {
            user: user.to_owned(),
            password: Secret::new(password),
        })
    }
}

impl Digest {
    /// The bytes sent with `addAuth("digest", ...)`.
    pub(crate) fn auth_bytes(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password.expose()).into_bytes()
    }
}

/// A ZooKeeper backend's configuration: what a `zk://` URL says, or the same fields from a
/// config file (any serde format; unknown keys refused), validated the same way
/// ([`Config::validate`], run by [`ZkBackend::from_config`](crate::ZkBackend::from_config)).
///
/// ```
/// let from_file: lock_zk::Config = serde_json::from_str(
///     r#"{"hosts": ["zk1:2181", "zk2"], "chroot": "/app", "namespace": "locks",
///         "session_timeout_ms": 4000, "digest": "me:pw", "lost_after_disconnect": 0.25,
///         "interop": "kazoo"}"#,
/// ).unwrap();
/// let from_url = lock_zk::Config::parse(
///     "zk://zk1:2181,zk2/app?namespace=locks&session_timeout_ms=4000&digest=me:pw&lost_after_disconnect=0.25&interop=kazoo",
/// ).unwrap();
/// assert_eq!(from_file.validate().unwrap(), from_url);
/// assert!(!format!("{from_url:?}").contains("pw\""));
/// ```
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// `host:port` of each server (`host` alone takes port 2181; IPv6 hosts in brackets).
    pub hosts: Vec<String>,
    /// `""` or an absolute path (`/app`).
    #[serde(default)]
    pub chroot: String,
    /// The node under the chroot that holds the locks.
    #[serde(default = "lockcore::config::default_namespace")]
    pub namespace: String,
    /// The session timeout asked of the server (`session_timeout_ms`).
    #[serde(
        rename = "session_timeout_ms",
        with = "millis",
        default = "default_session_timeout"
    )]
    pub session_timeout: Duration,
    /// Digest credentials (`user:password`).
    #[serde(default)]
    pub digest: Option<Digest>,
    /// How long a disconnection may last before held leases are reported lost, as a fraction of
    /// the negotiated session timeout. 0 (the default) is Curator's standard policy: a
    /// suspended connection is a lost lock.
    #[serde(default)]
    pub lost_after_disconnect: f64,
    /// Whose node names this client uses (`interop`: `curator`, the default, or `kazoo`); see
    /// the crate docs' *Interoperating* section.
    #[serde(default)]
    pub interop: Interop,
}

fn default_session_timeout() -> Duration {
    DEFAULT_SESSION_TIMEOUT
}

/// How errors name the URL.
const WHAT: &str = "zk:// URL";

impl Config {
    /// The query parameters a URL may carry (the hosts and the chroot are its address part); any other is
    /// refused with `InvalidConfig`, named (the `locksmith` facade's docs list them per URL
    /// kind, checked by a test).
    pub const URL_PARAMS: &'static [&'static str] = &[
        "session_timeout_ms",
        "namespace",
        "digest",
        "lost_after_disconnect",
        "interop",
    ];

    /// Checks a configuration however it was made (a URL, a file); normalizes the hosts.
    ///
    /// # Errors
    /// `InvalidConfig`, never quoting the password.
    pub fn validate(mut self) -> Result<Config> {
        self.hosts = parse_hosts(WHAT, &self.hosts.join(","), DEFAULT_PORT)?;
        self.chroot = parse_chroot(&self.chroot)?;
        lockcore::config::check_millis(
            WHAT,
            "session_timeout_ms",
            self.session_timeout,
            MIN_SESSION_TIMEOUT_MS,
            MAX_SESSION_TIMEOUT_MS,
        )?;
        check_lost_after_disconnect(self.lost_after_disconnect)?;
        if !is_node_name(&self.namespace) {
            return Err(Error::invalid_config(format!(
                "namespace {:?} must be one path segment of [A-Za-z0-9_.-], not . or ..",
                self.namespace
            )));
        }
        if self.chroot.is_empty() && self.namespace == "zookeeper" {
            return Err(Error::invalid_config(
                "namespace \"zookeeper\" is reserved by ZooKeeper at the root",
            ));
        }
        Ok(self)
    }

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
        if self.interop != Interop::default() {
            s.push_str(&format!("&interop={}", self.interop.as_str()));
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

    /// Parses a `zk://host:port[,host:port...][/chroot][?params]` URL.
    ///
    /// # Errors
    /// `InvalidConfig` for anything malformed or unknown (never quoting the password).
    pub fn parse(url: &str) -> Result<Config> {
        let parts = UrlParts::split(WHAT, url, UserInfoAt::HostPart)?;
        parts.scheme_among(&["zk"], "a ZooKeeper URL starts with zk://")?;
        if parts.userinfo.is_some() {
            return Err(Error::invalid_config(
                "a zk:// URL carries no user info; pass credentials as ?digest=user:password",
            ));
        }
        // The query goes through the same deserializer as a config file.
        let (mut config, hosts): (Config, _) =
            parts.query_and_hosts(WHAT, Self::URL_PARAMS, "hosts")?;
        config.hosts = hosts;
        config.chroot = parts.path.to_owned();
        config.validate()
    }
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

/// A ZooKeeper node name: a plain path segment of at most 200 bytes.
fn is_node_name(s: &str) -> bool {
    s.len() <= 200 && is_segment(s)
}

fn parse_chroot(path: &str) -> Result<String> {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    for seg in trimmed[1..].split('/') {
        if !is_node_name(seg) {
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
        assert!(!c.redacted(None).contains("interop"));
        let c = Config::parse("zk://h?interop=kazoo").unwrap();
        assert_eq!(c.interop, Interop::Kazoo);
        assert!(c.redacted(None).contains("interop=kazoo"));
        assert_eq!(
            Config::parse("zk://h?interop=curator").unwrap().interop,
            Interop::Curator
        );
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
            "redis://h:1",
            "zk://",
            "zk:///chroot",
            "zk://h:notaport",
            "zk://h:0",
            "zk://h:99999",
            "zk://h,,g",
            "zk://h/a//b",
            "zk://h/a/../b",
            "zk://h/zookeeper",
            "zk://h?namespace=zookeeper",
            "zk://h?namespace=a/b",
            "zk://h?session_timeout_ms=abc",
            "zk://h?interop=redisson",
            "zk://h?session_timeout_ms=0",
            "zk://h?session_timeout_ms=",
            "zk://h?unknown=1",
            "zk://h?lost_after_disconnect=0.9",
            "zk://h?lost_after_disconnect=-0.1",
            "zk://h?lost_after_disconnect=NaN",
            "zk://h?lost_after_disconnect=x",
            "zk://user:{secret}@h",
            "zk://h?digest={secret}",
            "zk://h?digest=:{secret}",
            "zk://h?digest=u:{secret}&digest=u:{secret}",
            "zk://h?u:{secret}",
            "zk://h?digset=u:{secret}",
            "zk://h?digest=u:{secret}#frag",
            "zk://h?digest=u:{secret}%FF",
        ];
        conformance::refuses_without_leaking(secret, &bad, Config::parse);
    }

    /// A config file (JSON here) gives the URL's `Config` through the same validation; unknown
    /// keys are refused; bad values are InvalidConfig without the password.
    #[test]
    fn config_file_equals_url_and_refuses_unknown_keys() {
        let e =
            serde_json::from_str::<Config>(r#"{"hosts": ["h"], "digest": "hunter2"}"#).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        let bad = [
            r#"{"hosts": []}"#,
            r#"{"hosts": ["h:0"]}"#,
            r#"{"hosts": ["h"], "chroot": "/a/../b"}"#,
            r#"{"hosts": ["h"], "namespace": "zookeeper"}"#,
            r#"{"hosts": ["h"], "session_timeout_ms": 1}"#,
            r#"{"hosts": ["h"], "lost_after_disconnect": 0.9, "digest": "u:hunter2"}"#,
        ];
        conformance::file_config_checks(
            r#"{"hosts": ["h"]}"#,
            &Config::parse("zk://h").unwrap(),
            (
                r#"{"hosts": ["h"], "session_timeout": 5}"#,
                "session_timeout",
            ),
            "hunter2",
            &bad,
            Config::validate,
        );
    }
}
