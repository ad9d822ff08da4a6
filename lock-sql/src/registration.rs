//! This crate's entries in the `locksmith` facade's registry: one per database, each behind its
//! cargo feature.

use lockcore::registry::{Connecting, HarnessHints, OtherNamespace, Registration};
use lockcore::{Error, Locker};

use crate::SqlBackend;
use crate::config::{Config, Dialect};

/// Every database's harness hints: the lock table is the namespace.
const HARNESS: HarnessHints = HarnessHints {
    other_namespace: OtherNamespace::Param {
        key: "table",
        value: "locksmith_locks_other",
    },
    ..HarnessHints::DEFAULT
};

/// PostgreSQL for the `locksmith` facade: connect from a `postgres://` URL or a [`Config`]
/// whose `url` is one.
#[cfg(feature = "postgres")]
pub const POSTGRES: Registration<Config> = Registration {
    connect,
    connect_config: |config| of_dialect(config, Dialect::Postgres, "postgres:// or postgresql://"),
    harness: HARNESS,
};

/// MySQL / MariaDB for the `locksmith` facade: connect from a `mysql://` or `mariadb://` URL or
/// a [`Config`] whose `url` is one.
#[cfg(feature = "mysql")]
pub const MYSQL: Registration<Config> = Registration {
    connect,
    connect_config: |config| of_dialect(config, Dialect::MySql, "mysql:// or mariadb://"),
    harness: HARNESS,
};

/// SQLite for the `locksmith` facade: connect from a `sqlite://path` URL or a [`Config`] whose
/// `url` is one.
#[cfg(feature = "sqlite")]
pub const SQLITE: Registration<Config> = Registration {
    connect,
    connect_config: |config| of_dialect(config, Dialect::Sqlite, "sqlite://"),
    harness: HARNESS,
};

fn connect(url: &str) -> Connecting<'_> {
    Box::pin(async move { Ok(Locker::new(SqlBackend::connect(url).await?)) })
}

/// Connects a config whose `url` names `dialect`'s database (written `expected` in the error).
fn of_dialect(config: Config, dialect: Dialect, expected: &'static str) -> Connecting<'static> {
    Box::pin(async move {
        let scheme = lockcore::config::scheme_of(config.url.expose())?;
        if Dialect::of_scheme(&scheme) != Some(dialect) {
            return Err(Error::invalid_config(format!(
                "this backend needs a {expected} url, not {scheme}://"
            )));
        }
        Ok(Locker::new(SqlBackend::from_config(config).await?))
    })
}
