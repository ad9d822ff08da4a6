//! URL helpers: the scheme, its cargo feature, and password redaction.

use lockcore::{Error, Result};

/// The scheme of a lock URL, lowercased (`redis+cluster` for `REDIS+CLUSTER://...`).
///
/// # Errors
/// [`ErrorKind::InvalidConfig`](lockcore::ErrorKind::InvalidConfig) when `url` does not start
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

/// The cargo feature of `locksmith` that a (lowercase) scheme needs: `Some("redis")` for
/// `redis`, `rediss`, `redis+cluster`, `rediss+cluster`, `redis+sentinel` and
/// `rediss+sentinel`; `postgres` for `postgres` and `postgresql`; `mysql` for `mysql` and
/// `mariadb`; `sqlite`; `zk`; `redlock` for `redlock` and `redlocks`; `etcd` for `etcd` and `etcds`. `None` for `memory`
/// (always built in) and for unknown
/// schemes.
///
/// ```
/// assert_eq!(locksmith::feature_for_scheme("rediss+cluster"), Some("redis"));
/// assert_eq!(locksmith::feature_for_scheme("gopher"), None);
/// ```
pub fn feature_for_scheme(scheme: &str) -> Option<&'static str> {
    Some(match scheme {
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel"
        | "rediss+sentinel" => "redis",
        "postgres" | "postgresql" => "postgres",
        "mysql" | "mariadb" => "mysql",
        "sqlite" => "sqlite",
        "zk" => "zk",
        "redlock" | "redlocks" => "redlock",
        "etcd" | "etcds" => "etcd",
        _ => return None,
    })
}

/// Query parameters whose values are secrets.
fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["pass", "pwd", "secret", "token", "auth", "key"]
        .iter()
        .any(|s| key.contains(s))
}

/// `url` with any password replaced by `***`: the one in the user info (`user:***@host`) and the
/// values of secret-looking query parameters (`?password=***`, `token`, `secret`, ...).
///
/// It works on text, so URLs that do not parse are redacted too (`redis://:p@ss@host` gives
/// `redis://:***@host`, `zk://u:pw@h1:1,h2:2` gives `zk://u:***@h1:1,h2:2`). Where the user info
/// is ambiguous it errs towards hiding too much: everything from the first `:` after `://` to the
/// last `@` is hidden.
///
/// ```
/// use locksmith::redact_url;
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
            Some((key, _)) if is_secret_key(key) => format!("{key}=***"),
            _ => param.to_owned(),
        })
        .collect();
    format!("{before}?{}", params.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_in_user_info() {
        for (url, want) in [
            ("redis://:pw@host:6379", "redis://:***@host:6379"),
            (
                "redis://user:pw@host:6379/0",
                "redis://user:***@host:6379/0",
            ),
            ("rediss://user:p%40ss@host", "rediss://user:***@host"),
            ("postgres://u:pw@h:5432/db", "postgres://u:***@h:5432/db"),
            ("mysql://u:a:b:c@h/db", "mysql://u:***@h/db"),
            // No password: unchanged.
            ("postgres://u@h:5432/db", "postgres://u@h:5432/db"),
            ("redis://host:6379", "redis://host:6379"),
            ("zk://h1:2181,h2:2181/chroot", "zk://h1:2181,h2:2181/chroot"),
            ("sqlite:///tmp/a@b.db", "sqlite:///tmp/a@b.db"),
            ("sqlite:x.db", "sqlite:x.db"),
            ("memory://", "memory://"),
            ("", ""),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn redacts_urls_that_do_not_parse() {
        for (url, want) in [
            ("redis://:p@ss@host", "redis://:***@host"),
            ("zk://u:pw@h1:1,h2:2", "zk://u:***@h1:1,h2:2"),
            ("zk://u:pw@h1:1,h2:2/chroot", "zk://u:***@h1:1,h2:2/chroot"),
            ("redis://:pa/ss@host", "redis://:***@host"),
            ("redis://:a?b#c@host", "redis://:***@host"),
            ("redis://u:12/34@host", "redis://u:***@host"),
            (
                "redis+cluster://:pw@h1:1,h2:2",
                "redis+cluster://:***@h1:1,h2:2",
            ),
            ("not a url :pw@", "not a url :pw@"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
        // Without `://` there is no user info, but the query is still redacted.
        assert_eq!(
            redact_url("sqlite:x.db?password=pw&mode=rwc"),
            "sqlite:x.db?password=***&mode=rwc"
        );
    }

    #[test]
    fn redacts_secret_query_parameters() {
        assert_eq!(
            redact_url("postgres://u:pw@h/db?strategy=lease&password=pw2&sslmode=require"),
            "postgres://u:***@h/db?strategy=lease&password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("redis://h/?Auth_Token=t&db=1"),
            "redis://h/?Auth_Token=***&db=1"
        );
        // A query `@` hides more than needed rather than less.
        assert!(!redact_url("postgres://u:pw@h/db?app=a@b").contains("pw"));
    }

    #[test]
    fn never_leaks_a_password_marker() {
        let marker = "Zx9Q";
        for url in [
            format!("redis://:{marker}@h"),
            format!("redis://:{marker}@@h"),
            format!("redis://u:{marker}/x?y@h:1/2"),
            format!("zk://u:{marker}@h1:1,h2:2"),
            format!("postgres://u:{marker}@h/db?password={marker}"),
            format!("mysql://h/db?pwd={marker}&x=1"),
        ] {
            assert!(!redact_url(&url).contains(marker), "{url}");
        }
    }

    #[test]
    fn schemes() {
        assert_eq!(scheme_of("REDIS+Cluster://x").unwrap(), "redis+cluster");
        assert_eq!(scheme_of("sqlite:x.db").unwrap(), "sqlite");
        for bad in ["", "x", "://h", "1ab://h", "a b://h", "é://h"] {
            assert_eq!(
                scheme_of(bad).unwrap_err().kind(),
                lockcore::ErrorKind::InvalidConfig,
                "{bad}"
            );
        }
        assert_eq!(feature_for_scheme("postgresql"), Some("postgres"));
        assert_eq!(feature_for_scheme("memory"), None);
    }
}
