//! Backend configuration from text: the one code path through which a URL's query, a config
//! file and the environment all reach a backend's `Config` type.
//!
//! Every backend crate has a public `Config` that derives [`serde::Deserialize`] with
//! `#[serde(deny_unknown_fields)]`. A config file (TOML, JSON, YAML...) deserializes into it
//! directly; a URL's query string and environment-style `key=value` pairs go through
//! [`from_pairs`], which parses the text values into the same fields (numbers, booleans, lists
//! separated by commas). Both then go through the backend's own validation, so the rules and
//! the error messages are the same whatever the source.
//!
//! ```
//! use std::time::Duration;
//! #[derive(serde::Deserialize, Debug, PartialEq)]
//! #[serde(deny_unknown_fields)]
//! struct Opts {
//!     #[serde(default)]
//!     namespace: Option<String>,
//!     #[serde(rename = "poll_ms", with = "lockcore::config::millis", default)]
//!     poll: Duration,
//!     #[serde(default)]
//!     hosts: Vec<String>,
//! }
//! let pairs = lockcore::config::query_pairs("test URL", "namespace=app&poll_ms=250&hosts=a:1,b:2")?;
//! let from_url: Opts = lockcore::config::from_pairs("test URL", pairs)?;
//! let from_json: Opts = serde_json::from_str(
//!     r#"{"namespace": "app", "poll_ms": 250, "hosts": ["a:1", "b:2"]}"#,
//! ).unwrap();
//! assert_eq!(from_url, from_json);
//! let err = lockcore::config::from_pairs::<Opts>("test URL", vec![("nope".into(), "1".into())]);
//! assert_eq!(err.unwrap_err().kind(), lockcore::ErrorKind::InvalidConfig);
//! # Ok::<(), lockcore::Error>(())
//! ```

use std::fmt;
use std::time::Duration;

use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};

use crate::{Error, Result, Secret};

/// The namespace (key prefix, node) every backend keeps its locks under when its URL or
/// config does not say.
pub const DEFAULT_NAMESPACE: &str = "locksmith";

/// [`DEFAULT_NAMESPACE`], for `#[serde(default = "lockcore::config::default_namespace")]`.
pub fn default_namespace() -> String {
    DEFAULT_NAMESPACE.to_owned()
}

/// The scheme of a lock URL, lowercased (`redis+cluster` for `REDIS+CLUSTER://...`).
///
/// # Errors
/// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) when `url` does not start
/// with a scheme (`letter [letters digits + - .]* :`). The message does not repeat the input,
/// which might be a secret pasted in the wrong place.
pub fn scheme_of(url: &str) -> Result<String> {
    let bad = || {
        Error::invalid_config(
            "not a lock URL: expected `scheme://...` (for example memory:// or redis://host:6379)",
        )
    };
    let (scheme, _) = url.split_once(':').ok_or_else(bad)?;
    let mut chars = scheme.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) {
        return Err(bad());
    }
    Ok(scheme.to_ascii_lowercase())
}

/// Splits and percent-decodes a URL query (`a=1&b=x%2Cy`) into `(key, value)` pairs, in order.
/// `what` names the source in errors ("redis URL").
///
/// # Errors
/// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for a parameter without `=`,
/// text that is not percent-encoded UTF-8, or a key that is not `[a-z0-9_-]` (such a key is not
/// repeated in the message: it may be a misplaced secret). Values are never repeated.
pub fn query_pairs(what: &str, query: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            Error::invalid_config(format!("{what}: a query parameter has no `=value`"))
        })?;
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| {
                    Error::invalid_config(format!(
                        "{what}: a query parameter is not valid percent-encoded UTF-8"
                    ))
                })
        };
        let key = decode(key)?;
        if !is_plain_key(&key) {
            return Err(Error::invalid_config(format!(
                "{what}: a query parameter name is malformed (expected lowercase letters, digits, `_`)"
            )));
        }
        pairs.push((key, decode(value)?));
    }
    Ok(pairs)
}

/// Whether `key` looks like a parameter name (and so may be repeated in an error message).
pub fn is_plain_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 40
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Where a URL's user info ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserInfoAt {
    /// At the last `@` of the host part (before the first `/` and `?`): a password holds `@`,
    /// `/` and `?` only percent-encoded.
    HostPart,
    /// At the last `@` of the whole URL: a password may hold `@`, `/` or `?` as they are.
    LastAt,
}

/// The parts of a `scheme://[userinfo@]hosts[/path][?query]` URL, not yet decoded: the shape
/// every backend URL but SQL's (which sqlx reads) shares. Nothing here quotes the URL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UrlParts<'a> {
    /// The scheme as written (compare it case-insensitively).
    pub scheme: &'a str,
    /// The user info (`user:password`, still percent-encoded), without its `@`.
    pub userinfo: Option<&'a str>,
    /// The host list (`h1:p1,h2:p2`).
    pub hosts: &'a str,
    /// The path with its leading `/` (`""` when none).
    pub path: &'a str,
    /// The query without its `?` (`""` when none).
    pub query: &'a str,
}

impl<'a> UrlParts<'a> {
    /// Splits `url`. `what` names the URL in errors (`"invalid redis URL"`).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) without `://` or with a
    /// `#fragment` (which no backend takes).
    pub fn split(what: &str, url: &'a str, userinfo_at: UserInfoAt) -> Result<UrlParts<'a>> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| Error::invalid_config(format!("{what}: expected <scheme>://...")))?;
        if rest.contains('#') {
            return Err(Error::invalid_config(format!(
                "{what}: fragments (`#...`) are not supported"
            )));
        }
        let (userinfo, rest) = match userinfo_at {
            UserInfoAt::LastAt => match rest.rsplit_once('@') {
                Some((u, r)) => (Some(u), r),
                None => (None, rest),
            },
            UserInfoAt::HostPart => (None, rest),
        };
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) =
            before_query.split_at(before_query.find('/').unwrap_or(before_query.len()));
        let (userinfo, hosts) = match (userinfo_at, authority.rsplit_once('@')) {
            (UserInfoAt::HostPart, Some((u, h))) => (Some(u), h),
            _ => (userinfo, authority),
        };
        Ok(UrlParts {
            scheme,
            userinfo,
            hosts,
            path,
            query,
        })
    }
}

impl UrlParts<'_> {
    /// Which of `schemes` this URL's is (compared case-insensitively), as its index: a backend
    /// with a plain and a TLS scheme tells them apart by it.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) saying `expected` (`"an
    /// etcd URL starts with etcd:// or etcds:// (TLS)"`) for any other scheme.
    pub fn scheme_among(&self, schemes: &[&str], expected: &str) -> Result<usize> {
        schemes
            .iter()
            .position(|s| self.scheme.eq_ignore_ascii_case(s))
            .ok_or_else(|| Error::invalid_config(expected.to_owned()))
    }

    /// The URL's query read into a backend's config `T` (through [`from_query`]: only the
    /// `known` parameters, `hosts_field` being the field the address part fills in), and its
    /// host list, split at commas (checked later with the rest of `T`, by [`parse_hosts`]).
    /// `what` names the URL in errors.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) as [`from_query`], and
    /// for a URL without hosts.
    pub fn query_and_hosts<T: DeserializeOwned>(
        &self,
        what: &str,
        known: &[&str],
        hosts_field: &str,
    ) -> Result<(T, Vec<String>)> {
        let config = from_query(what, self.query, known, &[hosts_field])?;
        if self.hosts.is_empty() {
            return Err(Error::invalid_config(format!(
                "{what}: at least one host:port is needed"
            )));
        }
        Ok((config, self.hosts.split(',').map(str::to_owned).collect()))
    }
}

/// Percent-decodes user info (`user[:password]`) into the user name and the password (`None`
/// without a `:`); either may be empty. `what` names the URL in errors.
///
/// # Errors
/// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for text that is not
/// percent-encoded UTF-8 (the text is not quoted).
pub fn decode_userinfo(what: &str, userinfo: &str) -> Result<(String, Option<Secret>)> {
    let (user, password) = match userinfo.split_once(':') {
        Some((u, p)) => (u, Some(p)),
        None => (userinfo, None),
    };
    let decode = |part: &str, name: &str| {
        percent_encoding::percent_decode_str(part)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| {
                Error::invalid_config(format!(
                    "{what}: the {name} is not valid percent-encoded UTF-8"
                ))
            })
    };
    let user = decode(user, "user name")?;
    let password = password
        .map(|p| decode(p, "password").map(Secret::new))
        .transpose()?;
    Ok((user, password))
}

/// Reads a URL's query into `T` through [`from_pairs`] (so a query and a config file are read
/// alike): only the `known` parameters are taken (the others are the URL's address part);
/// `required` are `T`'s fields without a default that the address part fills in afterwards
/// (given empty here).
///
/// # Errors
/// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig), prefixed with `what`, for a
/// malformed query ([`query_pairs`]), an unknown parameter (named, with the known ones), a
/// repeated one or a bad value (never quoted).
pub fn from_query<T: DeserializeOwned>(
    what: &str,
    query: &str,
    known: &[&str],
    required: &[&str],
) -> Result<T> {
    let pairs = query_pairs(what, query)?;
    if let Some((key, _)) = pairs.iter().find(|(k, _)| !known.contains(&k.as_str())) {
        // query_pairs refused any key that is not plain: this one may be repeated.
        return Err(Error::invalid_config(format!(
            "{what}: unknown query parameter `{key}` (known: {})",
            known.join(", ")
        )));
    }
    let placeholders = required.iter().map(|k| ((*k).to_owned(), String::new()));
    from_pairs(what, placeholders.chain(pairs).collect())
}

/// Checks that a duration setting lies in `min..=max` milliseconds.
///
/// # Errors
/// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) naming `key` and the range,
/// prefixed with `what`.
pub fn check_millis(what: &str, key: &str, value: Duration, min: u64, max: u64) -> Result<()> {
    if (Duration::from_millis(min)..=Duration::from_millis(max)).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid_config(format!(
            "{what}: `{key}` must be a whole number of milliseconds in {min}..={max}"
        )))
    }
}

/// Parses a host list (`h1:p1,h2,[::1]:p3`) into `host:port` entries, IPv6 hosts in brackets,
/// a missing port being `default_port`. Host names are `[A-Za-z0-9._-]`, IPv6 addresses hex
/// digits, `:` and `.`; ports 1..=65535.
///
/// # Errors
/// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig), prefixed with `what`, for an
/// empty list or entry, or a bad host or port.
pub fn parse_hosts(what: &str, hosts: &str, default_port: u16) -> Result<Vec<String>> {
    if hosts.is_empty() {
        return Err(Error::invalid_config(format!(
            "{what}: at least one host:port is needed"
        )));
    }
    let bad = |msg: &str, entry: &str| Error::invalid_config(format!("{what}: {msg} {entry:?}"));
    let mut out = Vec::new();
    for entry in hosts.split(',') {
        let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
            let (h, after) = rest
                .split_once(']')
                .ok_or_else(|| bad("bad IPv6 host in", entry))?;
            if h.is_empty()
                || !h
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
            {
                return Err(bad("bad IPv6 host in", entry));
            }
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("bad host:port", entry))?,
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
                return Err(bad("bad host in", entry));
            }
            (h.to_owned(), p)
        };
        let port = match port {
            None => default_port,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad("bad port in", entry))?,
        };
        out.push(format!("{host}:{port}"));
    }
    Ok(out)
}

/// Whether `s` is one plain path segment: `[A-Za-z0-9_.-]`, not empty, `.` or `..` (a
/// ZooKeeper node, an etcd key prefix part).
pub fn is_segment(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// `host:port`, an IPv6 host in brackets (`[::1]:6379`).
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

pub use crate::secret::{is_secret_param, redact_url, redacted_userinfo};
pub use handover::Handover;

mod handover;

/// Deserializes `T` from text pairs (a URL query, environment variables): each value is parsed as
/// the field's type asks (`"250"` for a number, `"true"`/`"false"` for a flag, `"a,b"` for a
/// list, the text itself for a string or a unit enum variant). Unknown and repeated keys are
/// refused when `T` says so (`deny_unknown_fields`; serde refuses duplicates always).
///
/// # Errors
/// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig), prefixed with `what`, naming the
/// parameter but never repeating its value.
pub fn from_pairs<T: DeserializeOwned>(what: &str, pairs: Vec<(String, String)>) -> Result<T> {
    let map = de::value::MapDeserializer::new(
        pairs
            .into_iter()
            .map(|(key, value)| (key.clone(), Text { key, value })),
    );
    T::deserialize(map).map_err(|e: TextError| Error::invalid_config(format!("{what}: {e}")))
}

/// Turns a serde error into [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig), for
/// backends that deserialize a config file themselves.
pub fn invalid(what: &str, err: impl fmt::Display) -> Error {
    Error::invalid_config(format!("{what}: {err}"))
}

/// A duration written as whole milliseconds (`poll_ms = 250`), for
/// `#[serde(with = "lockcore::config::millis")]`.
pub mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Reads whole milliseconds.
    ///
    /// # Errors
    /// When the value is not a non-negative whole number.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }

    /// Writes whole milliseconds.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// An optional duration written as whole milliseconds, for
/// `#[serde(with = "lockcore::config::millis_opt", default)]`.
pub mod millis_opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    /// Reads whole milliseconds, if given.
    ///
    /// # Errors
    /// When the value is not a non-negative whole number.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

/// The error of [`from_pairs`] (serde's plain message error).
type TextError = de::value::Error;

/// One text value and the key it belongs to (for error messages).
struct Text {
    key: String,
    value: String,
}

impl<'de> IntoDeserializer<'de, TextError> for Text {
    type Deserializer = Text;
    fn into_deserializer(self) -> Text {
        self
    }
}

impl Text {
    fn parse<T: std::str::FromStr>(&self, expected: &str) -> Result<T, TextError> {
        self.value.trim().parse().map_err(|_| {
            de::Error::custom(format_args!("parameter `{}` must be {expected}", self.key))
        })
    }
}

macro_rules! parse_number {
    ($($method:ident $visit:ident $ty:ty, $what:literal;)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TextError> {
            visitor.$visit(self.parse::<$ty>($what)?)
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Text {
    type Error = TextError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TextError> {
        visitor.visit_string(self.value)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TextError> {
        match self.value.trim() {
            "true" | "1" | "yes" | "on" => visitor.visit_bool(true),
            "false" | "0" | "no" | "off" => visitor.visit_bool(false),
            _ => Err(de::Error::custom(format_args!(
                "parameter `{}` must be true or false",
                self.key
            ))),
        }
    }

    parse_number! {
        deserialize_i8 visit_i8 i8, "a whole number";
        deserialize_i16 visit_i16 i16, "a whole number";
        deserialize_i32 visit_i32 i32, "a whole number";
        deserialize_i64 visit_i64 i64, "a whole number";
        deserialize_u8 visit_u8 u8, "a non-negative whole number";
        deserialize_u16 visit_u16 u16, "a non-negative whole number";
        deserialize_u32 visit_u32 u32, "a non-negative whole number";
        deserialize_u64 visit_u64 u64, "a non-negative whole number";
        deserialize_f32 visit_f32 f32, "a number";
        deserialize_f64 visit_f64 f64, "a number";
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TextError> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, TextError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TextError> {
        let key = self.key;
        let items: Vec<Text> = if self.value.is_empty() {
            Vec::new()
        } else {
            self.value
                .split(',')
                .map(|v| Text {
                    key: key.clone(),
                    value: v.to_owned(),
                })
                .collect()
        };
        visitor.visit_seq(de::value::SeqDeserializer::new(items.into_iter()))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TextError> {
        visitor.visit_enum(self.value.into_deserializer())
    }

    serde::forward_to_deserialize_any! {
        i128 u128 char str string bytes byte_buf unit unit_struct tuple tuple_struct map struct
        identifier ignored_any
    }
}

/// Deserializes with [`serde::Deserialize`] from any self-describing format and maps the error
/// to [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig).
pub fn from_value<'de, T: serde::Deserialize<'de>, D: de::Deserializer<'de>>(
    what: &str,
    d: D,
) -> Result<T>
where
    D::Error: fmt::Display,
{
    T::deserialize(d).map_err(|e| invalid(what, e))
}

#[cfg(test)]
mod tests;
