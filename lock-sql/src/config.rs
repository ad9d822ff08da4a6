//! URL parsing: our own parameters are taken out, everything else goes to sqlx untouched.

use std::fmt;

use lockcore::{Error, Result};

/// The lock table used when the URL names none.
pub const DEFAULT_TABLE: &str = "locksmith_locks";

/// How locks are implemented on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// A session lock held by a connection dedicated to the holder (a PostgreSQL advisory lock,
    /// a MariaDB `GET_LOCK` user lock), with the lock row's fencing counter bumped and committed
    /// in the same statement. The lock lives as long as that connection: a crashed holder frees
    /// it at once.
    RowLock,
    /// A lease row (owner token, fencing counter, expiry computed on the database clock) taken
    /// over only after it expired (every database; the default).
    Lease,
}

impl Strategy {
    /// The name used in URLs (`strategy=row-lock` / `strategy=lease`).
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::RowLock => "row-lock",
            Strategy::Lease => "lease",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which database the URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    MySql,
    Sqlite,
}

/// A parsed URL.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) dialect: Dialect,
    pub(crate) strategy: Strategy,
    pub(crate) table: String,
    pub(crate) pool_max: u32,
    /// The client-side bound of one statement or connect that has no deadline of its own.
    pub(crate) op_timeout: std::time::Duration,
    /// The URL for sqlx: our parameters removed, secrets included (never print it).
    pub(crate) sqlx_url: String,
    /// The URL with every secret replaced by `***` (the user-info password and the values of
    /// secret-looking query parameters such as `password=` and `sslpassword=`), for describe()
    /// and errors.
    pub(crate) redacted: String,
    /// Every secret the URL carries (decoded and as written), to scrub them from any error text
    /// that might echo them.
    secrets: Vec<lockcore::Secret>,
}

/// Whether a query parameter carries a secret: its value is never shown. Errs on the side of
/// hiding (`sslkey` is a path, hidden anyway).
fn is_secret_param(key: &str) -> bool {
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

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("dialect", &self.dialect)
            .field("strategy", &self.strategy)
            .field("table", &self.table)
            .field("pool_max", &self.pool_max)
            .field("op_timeout", &self.op_timeout)
            .field("url", &self.redacted)
            .finish()
    }
}

/// Checks a table name: `^[A-Za-z_][A-Za-z0-9_]{0,62}$`. The name is pasted into SQL as an
/// identifier (identifiers cannot be bound), so nothing else is allowed.
pub fn validate_table(table: &str) -> Result<()> {
    let mut chars = table.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && table.len() <= 63;
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_config(format!(
            "table name {table:?} is not allowed: it must match ^[A-Za-z_][A-Za-z0-9_]{{0,62}}$"
        )))
    }
}

impl Config {
    pub(crate) fn parse(raw: &str) -> Result<Config> {
        // Never echo `raw` in an error: it may hold a password.
        let mut url = url::Url::parse(raw)
            .map_err(|e| Error::invalid_config(format!("malformed database URL: {e}")))?;
        let dialect = match url.scheme() {
            "postgres" | "postgresql" => Dialect::Postgres,
            "mysql" | "mariadb" => Dialect::MySql,
            "sqlite" => Dialect::Sqlite,
            other => {
                return Err(Error::invalid_config(format!(
                    "unsupported URL scheme {other:?}: expected postgres://, postgresql://, mysql://, mariadb:// or sqlite://"
                )));
            }
        };
        let mut secrets = Vec::new();
        if let Some(p) = url.password().filter(|p| !p.is_empty()) {
            secrets.push(p.to_owned());
            secrets.push(
                percent_encoding::percent_decode_str(p)
                    .decode_utf8_lossy()
                    .into_owned(),
            );
        }

        let mut strategy = Strategy::Lease;
        let mut table = DEFAULT_TABLE.to_owned();
        let mut pool_max = if dialect == Dialect::Sqlite { 4 } else { 10 };
        let mut op_timeout = std::time::Duration::from_secs(5);
        let mut passthrough = Vec::new();
        for (k, v) in url.query_pairs() {
            match &*k {
                "strategy" => {
                    strategy = match &*v {
                        "row-lock" | "row_lock" | "rowlock" => Strategy::RowLock,
                        "lease" => Strategy::Lease,
                        other => {
                            return Err(Error::invalid_config(format!(
                                "unknown strategy {other:?}: expected row-lock or lease"
                            )));
                        }
                    }
                }
                "table" => {
                    validate_table(&v)?;
                    table = v.into_owned();
                }
                "pool_max" => {
                    pool_max = v
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or_else(|| {
                            Error::invalid_config(format!("pool_max must be 1..=1000, got {v:?}"))
                        })?;
                }
                "op_timeout_ms" => {
                    op_timeout = v
                        .parse::<u64>()
                        .ok()
                        .filter(|n| (1..=3_600_000).contains(n))
                        .map(std::time::Duration::from_millis)
                        .ok_or_else(|| {
                            Error::invalid_config(format!(
                                "op_timeout_ms must be 1..=3600000, got {v:?}"
                            ))
                        })?;
                }
                _ => {
                    if is_secret_param(&k) && !v.is_empty() {
                        secrets.push(v.clone().into_owned());
                    }
                    passthrough.push((k.into_owned(), v.into_owned()))
                }
            }
        }
        if dialect == Dialect::Sqlite && strategy == Strategy::RowLock {
            return Err(Error::invalid_config(
                "strategy=row-lock is not available on SQLite (it has no row locks); use strategy=lease",
            ));
        }
        if passthrough.is_empty() {
            url.set_query(None);
        } else {
            url.query_pairs_mut().clear().extend_pairs(&passthrough);
        }
        if dialect == Dialect::Sqlite {
            let path = url.path();
            let host = url.host_str().unwrap_or("");
            if path.contains(":memory:")
                || host.contains(":memory:")
                || passthrough
                    .iter()
                    .any(|(k, v)| k == "mode" && v == "memory")
            {
                return Err(Error::invalid_config(
                    "an in-memory SQLite database cannot hold locks shared between connections; use a file",
                ));
            }
        }
        let sqlx_url = url.to_string();
        let mut shown = url.clone();
        if shown.password().is_some() {
            let _ = shown.set_password(Some("***"));
        }
        if !passthrough.is_empty() {
            shown
                .query_pairs_mut()
                .clear()
                .extend_pairs(passthrough.iter().map(|(k, v)| {
                    let v = if is_secret_param(k) {
                        "***"
                    } else {
                        v.as_str()
                    };
                    (k.as_str(), v)
                }));
        }
        // Also the raw (still percent-encoded) forms of the query secrets, longest first so a
        // secret containing another is replaced whole.
        for (k, v) in url
            .query()
            .unwrap_or("")
            .split('&')
            .filter_map(|kv| kv.split_once('='))
        {
            if is_secret_param(k) && !v.is_empty() {
                secrets.push(v.to_owned());
            }
        }
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Ok(Config {
            dialect,
            strategy,
            table,
            pool_max,
            op_timeout,
            sqlx_url,
            redacted: shown.to_string(),
            secrets: secrets.into_iter().map(lockcore::Secret::new).collect(),
        })
    }

    /// Removes every secret of the URL from text that may echo it.
    pub(crate) fn scrub(&self, mut text: String) -> String {
        for s in &self.secrets {
            if text.contains(s.expose()) {
                text = text.replace(s.expose(), "***");
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::ErrorKind;

    #[test]
    fn strips_own_params_and_keeps_the_rest() {
        let c = Config::parse(
            "postgres://u:s3cret@h:5/db?sslmode=require&strategy=row-lock&table=t1&pool_max=3&application_name=x",
        )
        .unwrap();
        assert_eq!(c.strategy, Strategy::RowLock);
        assert_eq!(c.table, "t1");
        assert_eq!(c.pool_max, 3);
        assert_eq!(
            c.sqlx_url,
            "postgres://u:s3cret@h:5/db?sslmode=require&application_name=x"
        );
        assert!(!c.redacted.contains("s3cret"));
        assert!(!format!("{c:?}").contains("s3cret"));
        let c = Config::parse("mysql://u:p@h/db?strategy=lease").unwrap();
        assert_eq!(c.sqlx_url, "mysql://u:p@h/db");
    }

    /// A password in any part of the URL (user info, `?password=`, `sslpassword=`), encoded or
    /// not, never shows in the redacted URL, in Debug, or in scrubbed error text.
    #[test]
    fn secrets_from_every_part_of_the_url_never_show() {
        for url in [
            "postgres://u@h/db?password=hunter2%40x&sslmode=verify-full",
            "postgres://u:hunter2%40x@h/db?sslpassword=hunter2%40x",
            "mysql://u@h/db?password=hunter2@x&strategy=row-lock",
            "postgres://h/db?user=u&password=hunter2%40x",
        ] {
            let c = Config::parse(url).unwrap();
            for shown in [
                c.redacted.clone(),
                format!("{c:?}"),
                c.scrub("error: password hunter2@x / hunter2%40x rejected".to_string()),
            ] {
                assert!(!shown.contains("hunter2"), "{url}: {shown}");
            }
            assert!(c.redacted.contains("***"), "{}", c.redacted);
        }
        // Nothing to hide: the URL shows as is (no panic, no stars).
        let c = Config::parse("postgres://u@h/db?sslmode=verify-full").unwrap();
        assert_eq!(c.redacted, "postgres://u@h/db?sslmode=verify-full");
        assert_eq!(c.scrub("x".into()), "x");
    }

    #[test]
    fn rejects_bad_config() {
        for bad in [
            "postgres://h/db?table=locks;%20drop",
            "postgres://h/db?table=locks; drop",
            "postgres://h/db?table=1abc",
            "postgres://h/db?strategy=advisory",
            "postgres://h/db?pool_max=0",
            "sqlite:///tmp/x.db?strategy=row-lock",
            "sqlite::memory:",
            "redis://h",
            "not a url",
        ] {
            let e = Config::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{bad}");
        }
        assert!(validate_table(&"a".repeat(63)).is_ok());
        assert!(validate_table(&"a".repeat(64)).is_err());
    }
}
