//! URL parsing: our own parameters are taken out, the driver's ones that sqlx reads go to sqlx
//! untouched, any other is refused.

use std::fmt;

use std::time::Duration;

// A query parameter's value is never shown when it looks like a secret (`sslkey`, a path, is
// hidden anyway).
pub use lockcore::config::Handover;
use lockcore::config::is_secret_param;
use lockcore::{Error, Result, Secret};

/// How errors name the URL (never quoting it: it may hold a password).
const WHAT: &str = "database URL";

/// The lock table used when the URL names none.
pub const DEFAULT_TABLE: &str = "locksmith_locks";

/// How locks are implemented on the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Strategy {
    /// A session lock held by a connection dedicated to the holder (a PostgreSQL advisory lock,
    /// a MariaDB `GET_LOCK` user lock), with the lock row's fencing counter bumped and committed
    /// in the same statement. The lock lives as long as that connection: a crashed holder frees
    /// it at once.
    #[serde(alias = "row_lock", alias = "rowlock")]
    RowLock,
    /// A lease row (owner token, fencing counter, expiry computed on the database clock) taken
    /// over only after it expired (every database; the default).
    #[default]
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

/// An SQL backend's configuration: the database URL plus this crate's own settings, from a
/// URL's query ([`Config::parse`]) or any serde format (unknown keys refused), validated the same
/// way when the backend is built ([`SqlBackend::from_config`](crate::SqlBackend::from_config)).
/// `Debug` shows no part of the URL (it may carry passwords).
///
/// ```
/// use lock_sql::{Config, Strategy};
/// let from_file: Config = serde_json::from_str(
///     r#"{"url": "postgres://app:pw@db/app?sslmode=verify-full", "strategy": "row-lock",
///         "table": "app_locks", "pool_max": 4, "op_timeout_ms": 3000}"#,
/// ).unwrap();
/// let from_url = Config::parse(
///     "postgres://app:pw@db/app?sslmode=verify-full&strategy=row-lock&table=app_locks&pool_max=4&op_timeout_ms=3000",
/// ).unwrap();
/// assert_eq!(from_file, from_url);
/// assert_eq!(from_url.strategy, Strategy::RowLock);
/// assert!(!format!("{from_url:?}").contains("pw"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// The database URL as sqlx takes it (`postgres://`, `mysql://`, `mariadb://`,
    /// `sqlite://`), with the driver's own parameters (`sslmode`, ...), without this crate's.
    pub url: Secret,
    /// How locks are implemented (`lease` by default).
    #[serde(default)]
    pub strategy: Strategy,
    /// The lock table.
    #[serde(default = "default_table")]
    pub table: String,
    /// Connections shared by short statements (default 10; 4 on SQLite).
    #[serde(default)]
    pub pool_max: Option<u32>,
    /// The bound of a statement or connect without a deadline of its own (`op_timeout_ms`).
    #[serde(
        rename = "op_timeout_ms",
        with = "lockcore::config::millis",
        default = "default_op_timeout"
    )]
    pub op_timeout: Duration,
    /// The client whose lock keys to follow (`interop=sqlx` on PostgreSQL, `interop=get_lock`
    /// on MariaDB/MySQL; needs `strategy=row-lock`); `None`: locksmith's own keys.
    #[serde(default)]
    pub interop: Option<crate::Interop>,
    /// How a lease's release hands the lock to the next exclusive waiter (`handover=grant` or
    /// `wake`; PostgreSQL with `strategy=lease` only); `None`: the default, `grant` there.
    #[serde(default)]
    pub handover: Option<Handover>,
}

fn default_table() -> String {
    DEFAULT_TABLE.to_owned()
}
fn default_op_timeout() -> Duration {
    Duration::from_secs(5)
}

/// This crate's URL parameters (taken out of the URL; the driver's, [`sqlx_params`], go to sqlx).
pub(crate) const OWN_PARAMS: &[&str] = &[
    "strategy",
    "table",
    "pool_max",
    "op_timeout_ms",
    "interop",
    "handover",
];

/// The query parameters sqlx 0.9's PostgreSQL driver reads (`PgConnectOptions::parse_from_url`),
/// every spelling it accepts; `options[NAME]` (one server option) is accepted besides these.
const POSTGRES_SQLX_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// The query parameters sqlx 0.9's MySQL driver reads (`MySqlConnectOptions::parse_from_url`).
/// It reads no `ssl_mode`, `sslrootcert`, `user` or `password` (it ignores them silently).
const MYSQL_SQLX_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslca",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "charset",
    "collation",
    "statement-cache-capacity",
    "socket",
    "timezone",
    "time-zone",
];

/// The query parameters sqlx 0.9's SQLite driver reads (`SqliteConnectOptions::from_db_and_params`).
const SQLITE_SQLX_PARAMS: &[&str] = &["mode", "cache", "immutable", "vfs"];

/// The driver's query parameters that pass through to sqlx for a URL scheme (`postgres`,
/// `postgresql`, `mysql`, `mariadb`, `sqlite`), every spelling sqlx 0.9 reads; `None` for
/// another scheme. Any other parameter but this crate's own (`strategy`, `table`, `pool_max`,
/// `op_timeout_ms`, `interop`) is refused with
/// `InvalidConfig`: sqlx ignores a parameter it does not know, so a misspelled `sslmode` would
/// connect without checking the certificate, and a misspelled `strategy` would take locks that
/// do not exclude the other strategy's. PostgreSQL also takes `options[NAME]` (one server option).
///
/// ```
/// assert!(lock_sql::sqlx_params("postgres").unwrap().contains(&"sslrootcert"));
/// assert!(!lock_sql::sqlx_params("mysql").unwrap().contains(&"ssl_mode"));
/// assert_eq!(lock_sql::sqlx_params("redis"), None);
/// ```
pub fn sqlx_params(scheme: &str) -> Option<&'static [&'static str]> {
    Dialect::of_scheme(scheme).map(Dialect::sqlx_params)
}

/// Refuses a query parameter sqlx would not read for this database (see [`sqlx_params`]),
/// naming it (unless it does not look like a parameter name: it may be a misplaced secret) and
/// listing the accepted ones.
fn check_sqlx_param(dialect: Dialect, scheme: &str, key: &str) -> Result<()> {
    let known = dialect.sqlx_params();
    let server_option = dialect == Dialect::Postgres
        && key
            .strip_prefix("options[")
            .and_then(|k| k.strip_suffix(']'))
            .is_some_and(|k| !k.is_empty() && !k.contains(['[', ']']));
    if known.contains(&key) || server_option {
        return Ok(());
    }
    let named = if lockcore::config::is_plain_key(key) {
        format!("`{key}`")
    } else {
        "(its name is not shown: not a plain lowercase name)".to_owned()
    };
    let options = if dialect == Dialect::Postgres {
        ", options[NAME]"
    } else {
        ""
    };
    Err(Error::invalid_config(format!(
        "{WHAT}: unknown query parameter {named} on {scheme}:// (accepted: {}; passed to sqlx: \
         {}{options})",
        OWN_PARAMS.join(", "),
        known.join(", ")
    )))
}

impl Config {
    /// This crate's own URL parameters, taken out of the URL; the driver's ones that pass
    /// through to sqlx are [`sqlx_params`]'s, and any other is refused.
    pub const URL_PARAMS: &'static [&'static str] = OWN_PARAMS;

    /// A configuration for `url` with every setting at its default.
    pub fn new(url: impl Into<String>) -> Config {
        Config {
            url: Secret::new(url),
            strategy: Strategy::default(),
            table: default_table(),
            pool_max: None,
            op_timeout: default_op_timeout(),
            interop: None,
            handover: None,
        }
    }

    /// Parses a URL: this crate's parameters (`strategy`, `table`, `pool_max`,
    /// `op_timeout_ms`) are read by the same deserializer as a config file and taken out; the
    /// rest of the URL is left for sqlx (its parameters are checked against [`sqlx_params`] when
    /// the backend is built, for a URL and a config file's `url` alike).
    ///
    /// # Errors
    /// `InvalidConfig` for a malformed URL or a bad value (the URL is never quoted).
    pub fn parse(raw: &str) -> Result<Config> {
        let mut url = url::Url::parse(raw)
            .map_err(|e| Error::invalid_config(format!("malformed database URL: {e}")))?;
        let (own, rest): (Vec<_>, Vec<_>) = url
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .partition(|(k, _)| OWN_PARAMS.contains(&k.as_str()));
        if rest.is_empty() {
            url.set_query(None);
        } else {
            url.query_pairs_mut().clear().extend_pairs(&rest);
        }
        let mut pairs = vec![("url".to_owned(), String::new())];
        pairs.extend(own);
        let mut config: Config = lockcore::config::from_pairs(WHAT, pairs)?;
        config.url = Secret::new(url.to_string());
        Ok(config)
    }
}

/// Which database the URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    MySql,
    Sqlite,
}

impl Dialect {
    /// The driver's query parameters sqlx reads for this database (see [`sqlx_params`]).
    fn sqlx_params(self) -> &'static [&'static str] {
        match self {
            Dialect::Postgres => POSTGRES_SQLX_PARAMS,
            Dialect::MySql => MYSQL_SQLX_PARAMS,
            Dialect::Sqlite => SQLITE_SQLX_PARAMS,
        }
    }

    /// The database a (lowercase) URL scheme names.
    pub(crate) fn of_scheme(scheme: &str) -> Option<Dialect> {
        match scheme {
            "postgres" | "postgresql" => Some(Dialect::Postgres),
            "mysql" | "mariadb" => Some(Dialect::MySql),
            "sqlite" => Some(Dialect::Sqlite),
            _ => None,
        }
    }
}

/// A parsed URL.
#[derive(Clone)]
pub(crate) struct Parsed {
    pub(crate) dialect: Dialect,
    pub(crate) strategy: Strategy,
    pub(crate) table: String,
    pub(crate) pool_max: u32,
    /// The client-side bound of one statement or connect that has no deadline of its own.
    pub(crate) op_timeout: std::time::Duration,
    /// The peer whose lock keys the row-lock strategy follows.
    pub(crate) interop: Option<crate::Interop>,
    /// How a PostgreSQL lease's release hands the lock over (`Wake` on every other kind).
    pub(crate) handover: Handover,
    /// The URL for sqlx: our parameters removed, secrets included (never print it).
    pub(crate) sqlx_url: String,
    /// The URL with every secret replaced by `***` (the user-info password and the values of
    /// secret-looking query parameters such as `password=` and `sslkey=`), for describe()
    /// and errors.
    pub(crate) redacted: String,
}

impl fmt::Debug for Parsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Parsed")
            .field("dialect", &self.dialect)
            .field("strategy", &self.strategy)
            .field("table", &self.table)
            .field("pool_max", &self.pool_max)
            .field("op_timeout", &self.op_timeout)
            .field("handover", &self.handover)
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

impl Parsed {
    #[cfg(test)]
    pub(crate) fn parse(raw: &str) -> Result<Parsed> {
        Parsed::from_config(Config::parse(raw)?)
    }

    /// Validates a [`Config`] (from a URL or a file) into what the backend runs on.
    pub(crate) fn from_config(config: Config) -> Result<Parsed> {
        // Never echo the URL in an error: it may hold a password.
        let mut url = url::Url::parse(config.url.expose())
            .map_err(|e| Error::invalid_config(format!("malformed database URL: {e}")))?;
        let Some(dialect) = Dialect::of_scheme(url.scheme()) else {
            return Err(Error::invalid_config(format!(
                "unsupported URL scheme {:?}: expected postgres://, postgresql://, mysql://, mariadb:// or sqlite://",
                url.scheme()
            )));
        };
        let Config {
            strategy,
            table,
            pool_max,
            op_timeout,
            interop,
            handover,
            ..
        } = config;
        validate_table(&table)?;
        let pool_max = pool_max.unwrap_or(if dialect == Dialect::Sqlite { 4 } else { 10 });
        if !(1..=1000).contains(&pool_max) {
            return Err(Error::invalid_config(format!(
                "pool_max must be 1..=1000, got {pool_max}"
            )));
        }
        lockcore::config::check_millis(WHAT, "op_timeout_ms", op_timeout, 1, 3_600_000)?;
        let mut passthrough = Vec::new();
        for (k, v) in url.query_pairs() {
            if OWN_PARAMS.contains(&&*k) {
                return Err(Error::invalid_config(format!(
                    "`{k}` is a setting of its own in a config, not a parameter of its url"
                )));
            }
            check_sqlx_param(dialect, url.scheme(), &k)?;
            passthrough.push((k.into_owned(), v.into_owned()))
        }
        if dialect == Dialect::Sqlite && strategy == Strategy::RowLock {
            return Err(Error::invalid_config(
                "strategy=row-lock is not available on SQLite (it has no row locks); use strategy=lease",
            ));
        }
        if let Some(peer) = interop {
            let fits = matches!(
                (peer, dialect),
                (crate::Interop::Sqlx, Dialect::Postgres)
                    | (crate::Interop::GetLock, Dialect::MySql)
            );
            if !fits {
                return Err(Error::invalid_config(format!(
                    "interop={peer} is not available on {dialect:?} (sqlx: PostgreSQL; get_lock: \
                     MariaDB/MySQL)"
                )));
            }
            if strategy != Strategy::RowLock {
                return Err(Error::invalid_config(format!(
                    "interop={peer} needs strategy=row-lock (the peer holds a session lock)"
                )));
            }
        }
        if let Some(h) = handover
            && (dialect != Dialect::Postgres || strategy != Strategy::Lease)
        {
            return Err(Error::invalid_config(format!(
                "handover={h} applies to PostgreSQL with strategy=lease only"
            )));
        }
        let handover = match (dialect, strategy) {
            (Dialect::Postgres, Strategy::Lease) => handover.unwrap_or_default(),
            _ => Handover::Wake,
        };
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
        Ok(Parsed {
            dialect,
            strategy,
            table,
            pool_max,
            op_timeout,
            interop,
            handover,
            sqlx_url,
            redacted: shown.to_string(),
        })
    }

    /// Text from the driver (an error message) with any URL in it and any secret `key=value`
    /// redacted ([`lockcore::secret::redact_text`]): by structure, never by searching for the
    /// password, which would reveal it (a one-letter password turned every `e` into `***`).
    pub(crate) fn scrub(&self, text: String) -> String {
        lockcore::secret::redact_text(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::ErrorKind;

    #[test]
    fn strips_own_params_and_keeps_the_rest() {
        let c = Parsed::parse(
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
        let c = Parsed::parse("mysql://u:p@h/db?strategy=lease").unwrap();
        assert_eq!(c.sqlx_url, "mysql://u:p@h/db");
    }

    /// A password in any part of the URL (user info, `?password=`, `sslkey=`), encoded or
    /// not, never shows in the redacted URL, in Debug, or in scrubbed error text that echoes the
    /// URL.
    #[test]
    fn secrets_from_every_part_of_the_url_never_show() {
        for url in [
            "postgres://u@h/db?password=hunter2%40x&sslmode=verify-full",
            "postgres://u:hunter2%40x@h/db?password=hunter2%40x",
            "mysql://u:hunter2%40x@h/db?ssl-key=hunter2@x&strategy=row-lock",
            "postgres://h/db?user=u&password=hunter2%40x",
        ] {
            let c = Parsed::parse(url).unwrap();
            for shown in [
                c.redacted.clone(),
                format!("{c:?}"),
                c.scrub(format!(
                    "error: cannot connect to '{url}' (password=hunter2@x)"
                )),
            ] {
                assert!(!shown.contains("hunter2"), "{url}: {shown}");
            }
            assert!(c.redacted.contains("***"), "{}", c.redacted);
        }
        // Nothing to hide: the URL shows as is (no panic, no stars).
        let c = Parsed::parse("postgres://u@h/db?sslmode=verify-full").unwrap();
        assert_eq!(c.redacted, "postgres://u@h/db?sslmode=verify-full");
        assert_eq!(c.scrub("x".into()), "x");
        // Issue 37: scrubbing searched the text for the password, so a one-letter password
        // showed wherever its letter did (`***rror communicating with databas***`).
        let c = Parsed::parse("postgres://e:e@h/db?password=a").unwrap();
        let text = "error communicating with database: password authentication failed";
        assert_eq!(c.scrub(text.to_string()), text);
    }

    /// A parameter sqlx does not read is refused, named, with the accepted ones listed: sqlx
    /// would ignore it (a misspelled `sslmode` connects without checking the certificate, a
    /// misspelled `strategy` takes locks that do not exclude the other strategy's). Every
    /// spelling sqlx reads passes. Before the allowlist, every one of these connected.
    #[test]
    fn parameters_sqlx_does_not_read_are_refused_and_named() {
        for (url, key) in [
            ("postgres://u:s3cret@h/db?stratgy=row-lock", "stratgy"),
            (
                "postgresql://h/db?sslmod=verify-full&sslrootcert=ca.pem",
                "sslmod",
            ),
            ("postgres://h/db?sslpassword=s3cret", "sslpassword"),
            ("postgres://h/db?connect_timeout=5", "connect_timeout"),
            ("postgres://h/db?options[]=x", "options[]"),
            ("mysql://u:s3cret@h/db?ssl_mode=verify_identity", "ssl_mode"),
            ("mariadb://h/db?sslrootcert=ca.pem", "sslrootcert"),
            ("mysql://h/db?password=s3cret", "password"),
            ("mysql://h/db?tabel=x", "tabel"),
            ("sqlite:///tmp/x.db?journal_mode=wal", "journal_mode"),
        ] {
            let e = Parsed::parse(url).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{url}");
            let msg = e.to_string();
            assert!(!msg.contains("s3cret"), "{msg}");
            if lockcore::config::is_plain_key(key) {
                assert!(
                    msg.contains(&format!("unknown query parameter `{key}`")),
                    "{msg}"
                );
            }
            assert!(msg.contains("strategy, table"), "the accepted ones: {msg}");
            // A config file's url is checked alike.
            let file = Config::new(url.replace(&format!("{key}="), "x_unknown="));
            let e = Parsed::from_config(file).unwrap_err();
            assert!(e.to_string().contains("`x_unknown`"), "{e}");
        }
        for url in [
            "postgres://u:p@h/db?sslmode=verify-full&sslrootcert=ca.pem&sslcert=c.pem&sslkey=k.pem",
            "postgres://h/db?ssl-mode=require&ssl-root-cert=a&ssl-ca=b&ssl-cert=c&ssl-key=d",
            "postgres://h/db?statement-cache-capacity=10&host=h2&hostaddr=127.0.0.1&port=5433",
            "postgres://h/db?dbname=x&user=u&password=p&application_name=app&options=-c%20a%3Db",
            "postgres://h/db?options[search_path]=app&strategy=row-lock",
            "mysql://h/db?sslmode=required&ssl-mode=verify_ca&sslca=a&ssl-ca=b&sslcert=c",
            "mariadb://h/db?ssl-cert=c&sslkey=k&ssl-key=k&charset=utf8mb4&collation=utf8mb4_bin",
            "mysql://h/db?statement-cache-capacity=5&socket=/tmp/s&timezone=%2B00:00&time-zone=x",
            "sqlite:///tmp/x.db?mode=rwc&cache=shared&immutable=false&vfs=unix",
        ] {
            Parsed::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }

    #[test]
    fn rejects_bad_config() {
        for bad in [
            "postgres://h/db?table=locks;%20drop",
            "postgres://h/db?table=locks; drop",
            "postgres://h/db?table=1abc",
            "postgres://h/db?strategy=advisory",
            "postgres://h/db?pool_max=0",
            "postgres://h/db?handover=pass",
            "postgres://h/db?handover=grant&strategy=row-lock",
            "mysql://h/db?handover=wake",
            "sqlite:///tmp/x.db?handover=grant",
            "sqlite:///tmp/x.db?strategy=row-lock",
            "sqlite::memory:",
            "redis://h",
            "not a url",
        ] {
            let e = Parsed::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{bad}");
        }
        assert_eq!(
            Parsed::parse("postgres://h/db").unwrap().handover,
            Handover::Grant
        );
        let wake = Parsed::parse("postgres://h/db?handover=wake").unwrap();
        assert_eq!(wake.handover, Handover::Wake);
        assert_eq!(
            Parsed::parse("mysql://h/db").unwrap().handover,
            Handover::Wake
        );
        assert!(validate_table(&"a".repeat(63)).is_ok());
        assert!(validate_table(&"a".repeat(64)).is_err());
    }

    /// A config file (JSON here) gives what the URL gives, through the same validation; unknown
    /// keys are refused in a file (in a URL they are the driver's parameters).
    #[test]
    fn config_file_equals_url_and_refuses_unknown_keys() {
        let url = "mysql://u:s3cret@h/db?ssl-mode=required&strategy=row_lock&table=t1&pool_max=3&op_timeout_ms=700";
        let file: Config = serde_json::from_str(
            r#"{"url": "mysql://u:s3cret@h/db?ssl-mode=required", "strategy": "row-lock",
                "table": "t1", "pool_max": 3, "op_timeout_ms": 700}"#,
        )
        .unwrap();
        assert_eq!(file, Config::parse(url).unwrap());
        let (a, b) = (
            Parsed::from_config(file).unwrap(),
            Parsed::parse(url).unwrap(),
        );
        assert_eq!((a.sqlx_url, a.redacted), (b.sqlx_url, b.redacted));
        assert_eq!(
            (a.strategy, a.table, a.pool_max, a.op_timeout),
            (b.strategy, b.table, b.pool_max, b.op_timeout)
        );
        let e = serde_json::from_str::<Config>(r#"{"url": "postgres://h/db", "tabel": "x"}"#)
            .unwrap_err();
        assert!(e.to_string().contains("unknown field `tabel`"), "{e}");
        for bad in [
            r#"{"url": "postgres://u:s3cret@h/db", "table": "x; drop"}"#,
            r#"{"url": "postgres://u:s3cret@h/db", "pool_max": 0}"#,
            r#"{"url": "postgres://u:s3cret@h/db", "op_timeout_ms": 0}"#,
            r#"{"url": "sqlite:///tmp/x.db", "strategy": "row-lock"}"#,
            r#"{"url": "postgres://u:s3cret@h/db?strategy=lease"}"#,
            r#"{"url": "redis://u:s3cret@h"}"#,
        ] {
            let c: Config = serde_json::from_str(bad).unwrap();
            assert!(!format!("{c:?}").contains("s3cret"));
            let e = Parsed::from_config(c).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{bad}");
            assert!(!e.to_string().contains("s3cret"), "{e}");
        }
    }
}
