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

use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};

use crate::{Error, Result};

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
mod tests {
    use super::*;
    use crate::ErrorKind;
    use std::time::Duration;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Opts {
        #[serde(default)]
        flag: bool,
        #[serde(default)]
        secret: Option<crate::Secret>,
        #[serde(rename = "poll_ms", with = "millis", default)]
        poll: Duration,
        #[serde(default)]
        ratio: f64,
        #[serde(default)]
        kind: Option<Kind>,
    }

    #[derive(serde::Deserialize, Debug, PartialEq)]
    #[serde(rename_all = "kebab-case")]
    enum Kind {
        RowLock,
        Lease,
    }

    #[test]
    fn pairs_parse_into_typed_fields() {
        let pairs = query_pairs(
            "t",
            "flag=true&secret=hunter%402&poll_ms=250&ratio=0.5&kind=row-lock",
        )
        .unwrap();
        let o: Opts = from_pairs("t", pairs).unwrap();
        assert!(o.flag);
        assert_eq!(o.secret.as_ref().unwrap().expose(), "hunter@2");
        assert_eq!(o.poll, Duration::from_millis(250));
        assert_eq!(o.ratio, 0.5);
        assert_eq!(o.kind, Some(Kind::RowLock));
        assert!(!format!("{o:?}").contains("hunter"));
    }

    #[test]
    fn bad_pairs_are_invalid_config_without_values() {
        for q in [
            "nope=1",
            "poll_ms=abc",
            "poll_ms=-1",
            "flag=maybe",
            "poll_ms=1&poll_ms=2",
            "kind=advisory",
            "poll_ms",
            "Sekrit=1",
            "x=%ff",
        ] {
            let e = query_pairs("t", q)
                .and_then(|p| from_pairs::<Opts>("t", p))
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{q}");
            assert!(
                !e.to_string().contains("abc") && !e.to_string().contains("Sekrit"),
                "{e}"
            );
        }
    }
}
