//! URL parsing: our own parameters are taken out, everything else goes to sqlx untouched.

use std::fmt;

use lockcore::{Error, Result};

/// The lock table used when the URL names none.
pub const DEFAULT_TABLE: &str = "locksmith_locks";

/// How locks are implemented on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// A row of the lock table locked with `SELECT ... FOR UPDATE` inside a transaction held open
    /// on a connection dedicated to the holder (PostgreSQL, MySQL/MariaDB). The lock lives as long
    /// as that connection: a crashed holder frees it at once.
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
    /// The URL for sqlx: our parameters removed, secrets included (never print it).
    pub(crate) sqlx_url: String,
    /// The URL with the password replaced, for describe() and errors.
    pub(crate) redacted: String,
    /// The password, to scrub it from any error text that might echo it.
    pub(crate) password: Option<String>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("dialect", &self.dialect)
            .field("strategy", &self.strategy)
            .field("table", &self.table)
            .field("pool_max", &self.pool_max)
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
        let password = url.password().filter(|p| !p.is_empty()).map(|p| {
            percent_encoding::percent_decode_str(p)
                .decode_utf8_lossy()
                .into_owned()
        });

        let mut strategy = Strategy::Lease;
        let mut table = DEFAULT_TABLE.to_owned();
        let mut pool_max = if dialect == Dialect::Sqlite { 4 } else { 10 };
        let mut pool_max_set = false;
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
                    pool_max_set = true;
                    pool_max = v
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or_else(|| {
                            Error::invalid_config(format!("pool_max must be 1..=1000, got {v:?}"))
                        })?;
                }
                _ => passthrough.push((k.into_owned(), v.into_owned())),
            }
        }
        if !pool_max_set && strategy == Strategy::RowLock {
            // Every held row lock keeps a connection for as long as it is held.
            pool_max = 64;
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
        if password.is_some() {
            let _ = shown.set_password(Some("***"));
        }
        Ok(Config {
            dialect,
            strategy,
            table,
            pool_max,
            sqlx_url,
            redacted: shown.to_string(),
            password,
        })
    }

    /// Removes the password from text that may echo the URL.
    pub(crate) fn scrub(&self, text: String) -> String {
        match &self.password {
            Some(p) if text.contains(p.as_str()) => text.replace(p.as_str(), "***"),
            _ => text,
        }
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
