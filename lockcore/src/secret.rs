//! Secrets from URLs (passwords) that never print, and the one place that redacts them from
//! text: every backend, the facade and the CLI show a URL or a client's error text through
//! these functions.
//!
//! Redaction works on the structure of the text, never by searching for the secret: it blanks
//! the password field of a URL's user info and the values of secret query parameters
//! (`password=`, `sslpassword=`...). Replacing the secret wherever it occurs as a substring
//! would reveal it: a one-letter password `e` turned "error communicating with database" into
//! `***rror communicating with databas***`.

use std::fmt;

/// A secret, such as a password taken from a URL: `Debug` and `Display` show `***`, so it can sit
/// in a configuration struct that derives `Debug` without ever reaching a log, an error or a
/// report.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(secret: impl Into<String>) -> Self {
        Secret(secret.into())
    }

    /// The secret itself, for the one place that sends it to the server.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// Read from a config file or a URL like a plain string (it is never serialized back).
impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// User info as a redacted URL shows it: `user:***@`, `:***@`, `user@` or nothing.
pub fn redacted_userinfo(user: Option<&str>, password: Option<&Secret>) -> String {
    match (user, password) {
        (Some(u), Some(_)) => format!("{u}:***@"),
        (None, Some(_)) => ":***@".to_owned(),
        (Some(u), None) => format!("{u}@"),
        (None, None) => String::new(),
    }
}

/// Whether a query parameter carries a secret, so that its value is never shown
/// (`password`, `sslpassword`, `pwd`, `auth_token`, `secret`, `sslkey`, `credentials`...). Errs
/// on the side of hiding.
pub fn is_secret_param(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "pass",
        "pwd",
        "secret",
        "token",
        "key",
        "auth",
        "credential",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// `url` with any password replaced by `***`: the one in the user info (`user:***@host`) and the
/// values of secret query parameters ([`is_secret_param`]).
///
/// It works on text, so URLs that do not parse are redacted too (`redis://:p@ss@host` gives
/// `redis://:***@host`, `zk://u:pw@h1:1,h2:2` gives `zk://u:***@h1:1,h2:2`). Where the user info
/// is ambiguous it errs towards hiding too much: everything from the first `:` after `://` to the
/// last `@` is hidden.
///
/// ```
/// use lockcore::config::redact_url;
/// assert_eq!(redact_url("redis://app:s3cret@cache:6379/0"), "redis://app:***@cache:6379/0");
/// assert_eq!(redact_url("postgres://db/x?user=a&password=pw"), "postgres://db/x?user=a&password=***");
/// assert_eq!(redact_url("memory://"), "memory://");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(i) = url.find("://") else {
        return redact_query(url);
    };
    let (head, rest) = url.split_at(i + 3);
    let mut out = String::with_capacity(url.len());
    out.push_str(head);
    let mut tail = rest;
    // The user info ends at the last `@` (a password may contain `@`, `/`, `?`...); a password
    // starts after the first `:` before it.
    if let Some(at) = rest.rfind('@')
        && let Some(colon) = rest[..at].find(':')
    {
        out.push_str(&rest[..=colon]);
        out.push_str("***");
        tail = &rest[at..];
    }
    out.push_str(&redact_query(tail));
    out
}

/// Redacts the values of secret query parameters after the first `?`.
fn redact_query(s: &str) -> String {
    let Some((before, query)) = s.split_once('?') else {
        return s.to_owned();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((key, _)) if is_secret_param(key) => format!("{key}=***"),
            _ => param.to_owned(),
        })
        .collect();
    format!("{before}?{}", params.join("&"))
}

/// `text` (a client's error message, a log line) with every URL in it redacted as
/// [`redact_url`] does, and the values of secret `key=value` pairs outside URLs blanked
/// (`password=pw host=db` in a libpq-style connection string gives `password=*** host=db`).
/// Nothing else is touched: the text is never searched for the secret itself.
///
/// ```
/// use lockcore::secret::redact_text;
/// assert_eq!(
///     redact_text("cannot connect to postgres://app:s3cret@db/x: refused"),
///     "cannot connect to postgres://app:***@db/x: refused"
/// );
/// assert_eq!(redact_text("password=pw host=db"), "password=*** host=db");
/// assert_eq!(redact_text("error communicating with database"), "error communicating with database");
/// ```
pub fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        // Words end at whitespace and at quotes or brackets around them; a URL holds none of
        // these unencoded.
        let start = rest.find(|c: char| !is_word_end(c)).unwrap_or(rest.len());
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let end = rest.find(is_word_end).unwrap_or(rest.len());
        let word = &rest[..end];
        if word.contains("://") {
            out.push_str(&redact_url(word));
        } else if let Some((key, value)) = word.split_once('=')
            && !value.is_empty()
            && is_secret_param(key.rsplit(['?', '&', ',', ';', '(']).next().unwrap_or(key))
        {
            out.push_str(key);
            out.push_str("=***");
        } else {
            out.push_str(word);
        }
        rest = &rest[end..];
    }
    out
}

fn is_word_end(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints() {
        let s = Secret::new("hunter2");
        assert_eq!(s.expose(), "hunter2");
        assert!(!format!("{s:?} {s} {:?}", Some(&s)).contains("hunter2"));
    }

    /// Issue 37: the SQL backend replaced the password wherever it occurred in an error's text,
    /// so a one-letter password `e` showed as `***rror communicating with databas***`.
    #[test]
    fn redaction_blanks_fields_and_never_searches_for_the_secret() {
        let plain = "error communicating with database: password authentication failed for \
                     user \"e\" (using password: YES)";
        assert_eq!(redact_text(plain), plain);
        for (text, want) in [
            (
                "connect to postgres://e:e@127.0.0.1:1/e failed",
                "connect to postgres://e:***@127.0.0.1:1/e failed",
            ),
            (
                "'mysql://u:pw@h/db?sslpassword=k&x=1'",
                "'mysql://u:***@h/db?sslpassword=***&x=1'",
            ),
            ("url=\"redis://:pw@h:6379\"", "url=\"redis://:***@h:6379\""),
            ("host=db password=e user=e", "host=db password=*** user=e"),
            ("a=b c==d", "a=b c==d"),
            ("", ""),
        ] {
            assert_eq!(redact_text(text), want, "{text}");
        }
    }
}
