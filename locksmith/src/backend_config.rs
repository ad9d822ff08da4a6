//! A backend picked by configuration instead of a URL: [`Config`], one variant per compiled-in
//! backend, each holding that backend's own config type.

use lockcore::{Locker, Result, Secret};

/// Which backend to use and how, as a config file or the environment says it: the field
/// `backend` names the backend, the other fields are that backend's own config type (the same
/// fields as its URL, refused when unknown). [`connect_config`] builds the [`Locker`].
///
/// | `backend` | fields | cargo feature |
/// |---|---|---|
/// | `memory` | `store` (optional) | always |
/// | `redis` | `lock_redis::Config` | `redis` |
/// | `postgres`, `mysql`, `sqlite` | `lock_sql::Config` (`url` of that database) | `postgres`, `mysql`, `sqlite` |
/// | `zk` | `lock_zk::Config` | `zk` |
/// | `etcd` | `lock_etcd::Config` | `etcd` |
/// | `redlock` | `lock_redlock::Config` (`masters`: one `lock_redis::Config` each, `node_timeout_ms`) | `redlock` |
/// | `url` | `url`: any URL [`connect`](crate::connect) takes | always |
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> locksmith::Result<()> {
/// // In a real service this comes from the service's config file (TOML, YAML, JSON...).
/// let config: locksmith::Config = serde_json::from_str(r#"{"backend": "memory", "store": "jobs"}"#)
///     .map_err(|e| locksmith::Error::invalid_config(e.to_string()))?;
/// let locker = locksmith::connect_config(config).await?;
/// let guard = locker.try_lock("nightly", &locksmith::LockOptions::new()).await?;
/// assert!(guard.is_some());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(tag = "backend", rename_all = "lowercase")]
#[non_exhaustive]
pub enum Config {
    /// The in-process reference backend (tests, one process).
    Memory {
        /// The store name (`default` when absent): lockers of one store contend.
        #[serde(default)]
        store: Option<String>,
    },
    /// Any URL [`connect`](crate::connect) takes (its password stays out of `Debug`).
    Url {
        /// The lock URL.
        url: Secret,
    },
    /// Redis: single node, Cluster or Sentinel.
    #[cfg(feature = "redis")]
    Redis(lock_redis::Config),
    /// PostgreSQL (`url` is a `postgres://` URL).
    #[cfg(feature = "postgres")]
    Postgres(lock_sql::Config),
    /// MySQL / MariaDB (`url` is a `mysql://` or `mariadb://` URL).
    #[cfg(feature = "mysql")]
    Mysql(lock_sql::Config),
    /// SQLite (`url` is a `sqlite://path` URL).
    #[cfg(feature = "sqlite")]
    Sqlite(lock_sql::Config),
    /// ZooKeeper.
    #[cfg(feature = "zk")]
    Zk(lock_zk::Config),
    /// etcd v3.
    #[cfg(feature = "etcd")]
    Etcd(lock_etcd::Config),
    /// Redlock over independent Redis masters.
    #[cfg(feature = "redlock")]
    Redlock(lock_redlock::Config),
}

/// Builds a [`Locker`] from a [`Config`]: the backend's own validation runs first (the same as
/// for its URL), then it connects.
///
/// Cancel safety: as [`connect`](crate::connect).
///
/// # Errors
/// [`ErrorKind::InvalidConfig`](lockcore::ErrorKind::InvalidConfig) for a value the backend
/// refuses, or a SQL variant whose `url` names another database; otherwise as
/// [`connect`](crate::connect). No message contains a password.
pub async fn connect_config(config: Config) -> Result<Locker> {
    match config {
        Config::Memory { store } => {
            crate::connect(&format!(
                "memory://{}",
                store.as_deref().unwrap_or("default")
            ))
            .await
        }
        Config::Url { url } => crate::connect(url.expose()).await,
        #[cfg(feature = "redis")]
        Config::Redis(c) => Ok(Locker::new(lock_redis::RedisBackend::from_config(c).await?)),
        #[cfg(feature = "postgres")]
        Config::Postgres(c) => sql(c, &["postgres", "postgresql"]).await,
        #[cfg(feature = "mysql")]
        Config::Mysql(c) => sql(c, &["mysql", "mariadb"]).await,
        #[cfg(feature = "sqlite")]
        Config::Sqlite(c) => sql(c, &["sqlite"]).await,
        #[cfg(feature = "zk")]
        Config::Zk(c) => Ok(Locker::new(lock_zk::ZkBackend::from_config(c).await?)),
        #[cfg(feature = "etcd")]
        Config::Etcd(c) => Ok(Locker::new(lock_etcd::EtcdBackend::from_config(c).await?)),
        #[cfg(feature = "redlock")]
        Config::Redlock(c) => Ok(Locker::new(
            lock_redlock::RedlockBackend::from_config(c).await?,
        )),
    }
}

/// A SQL variant: its `url` must be of the variant's database.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
async fn sql(c: lock_sql::Config, schemes: &[&str]) -> Result<Locker> {
    let scheme = crate::scheme_of(c.url.expose())?;
    if !schemes.contains(&scheme.as_str()) {
        return Err(lockcore::Error::invalid_config(format!(
            "this backend needs a {} url, not {scheme}://",
            schemes.join(":// or ")
        )));
    }
    Ok(Locker::new(lock_sql::SqlBackend::from_config(c).await?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::{ErrorKind, LockOptions};

    fn parse(json: &str) -> std::result::Result<Config, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn memory_and_url_configs_connect() {
        let a = connect_config(parse(r#"{"backend": "memory", "store": "cfg"}"#).unwrap())
            .await
            .unwrap();
        let b = connect_config(parse(r#"{"backend": "url", "url": "memory://cfg"}"#).unwrap())
            .await
            .unwrap();
        let g = a.try_lock("x", &LockOptions::new()).await.unwrap().unwrap();
        assert!(
            b.try_lock("x", &LockOptions::new())
                .await
                .unwrap()
                .is_none()
        );
        g.release().await.unwrap();
    }

    #[test]
    fn unknown_backends_and_keys_are_refused() {
        let e = parse(r#"{"backend": "gopher", "url": "x"}"#).unwrap_err();
        assert!(e.contains("unknown variant `gopher`"), "{e}");
        assert!(
            parse(r#"{"url": "memory://"}"#).is_err(),
            "backend is required"
        );
        let c = parse(r#"{"backend": "url", "url": "redis://:hunter2@h"}"#).unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        #[cfg(feature = "redis")]
        {
            let e = parse(r#"{"backend": "redis", "nodes": ["h"], "bogus": 1}"#).unwrap_err();
            assert!(e.contains("unknown field `bogus`"), "{e}");
        }
        #[cfg(feature = "postgres")]
        {
            let e = parse(r#"{"backend": "postgres", "url": "postgres://h/db", "tabel": "x"}"#)
                .unwrap_err();
            assert!(e.contains("unknown field `tabel`"), "{e}");
        }
        #[cfg(feature = "zk")]
        assert!(parse(r#"{"backend": "zk", "hosts": ["h"], "bogus": 1}"#).is_err());
        #[cfg(feature = "etcd")]
        assert!(parse(r#"{"backend": "etcd", "hosts": ["h"], "bogus": 1}"#).is_err());
        #[cfg(feature = "redlock")]
        {
            let e = parse(r#"{"backend": "redlock", "masters": [], "bogus": 1}"#).unwrap_err();
            assert!(e.contains("unknown field `bogus`"), "{e}");
            let c = parse(
                r#"{"backend": "redlock", "masters": [{"nodes": ["h1"], "password": "hunter2"}]}"#,
            )
            .unwrap();
            assert!(!format!("{c:?}").contains("hunter2"));
        }
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn a_sql_variant_refuses_another_database() {
        let c = parse(r#"{"backend": "postgres", "url": "mysql://u:hunter2@h/db"}"#).unwrap();
        let e = connect_config(c).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        assert!(!e.to_string().contains("hunter2"));
    }

    /// A backend's config file (JSON) from its test URL.
    type ToJson = Box<dyn Fn(&str) -> Option<String>>;

    /// Every compiled-in backend, configured by a config file's fields (JSON), reaches the
    /// same real server as its URL and locks: the URL's client and the config's client contend.
    #[tokio::test]
    async fn config_files_reach_the_real_servers() {
        let cases: Vec<(&str, ToJson)> = vec![
            #[cfg(feature = "redis")]
            (
                "LOCK_TEST_REDIS_URL",
                Box::new(|url: &str| {
                    let c = lock_redis::Config::parse(url).ok()?;
                    let (h, p) = &c.nodes[0];
                    Some(format!(r#"{{"backend": "redis", "nodes": ["{h}:{p}"]}}"#))
                }),
            ),
            #[cfg(feature = "postgres")]
            (
                "LOCK_TEST_POSTGRES_URL",
                Box::new(|url: &str| {
                    Some(format!(
                        r#"{{"backend": "postgres", "url": "{url}", "op_timeout_ms": 4000}}"#
                    ))
                }),
            ),
            #[cfg(feature = "mysql")]
            (
                "LOCK_TEST_MYSQL_URL",
                Box::new(|url: &str| Some(format!(r#"{{"backend": "mysql", "url": "{url}"}}"#))),
            ),
            #[cfg(feature = "zk")]
            (
                "LOCK_TEST_ZK_URL",
                Box::new(|url: &str| {
                    let c = lock_zk::Config::parse(url).ok()?;
                    Some(format!(
                        r#"{{"backend": "zk", "hosts": {:?}, "session_timeout_ms": 4000}}"#,
                        c.hosts
                    ))
                }),
            ),
            #[cfg(feature = "etcd")]
            (
                "LOCK_TEST_ETCD_URL",
                Box::new(|url: &str| {
                    let c = lock_etcd::Config::parse(url).ok()?;
                    Some(format!(r#"{{"backend": "etcd", "hosts": {:?}}}"#, c.hosts))
                }),
            ),
            #[cfg(feature = "redlock")]
            (
                "LOCK_TEST_REDLOCK_URL",
                Box::new(|url: &str| {
                    let c = lock_redlock::Config::parse(url).ok()?;
                    let masters: Vec<String> = c
                        .masters
                        .iter()
                        .map(|m| format!(r#"{{"nodes": ["{}:{}"]}}"#, m.nodes[0].0, m.nodes[0].1))
                        .collect();
                    Some(format!(
                        r#"{{"backend": "redlock", "masters": [{}], "node_timeout_ms": 200}}"#,
                        masters.join(", ")
                    ))
                }),
            ),
        ];
        let name = format!("cfg-{:016x}", fastrand::u64(..));
        let opts = LockOptions::new();
        for (var, to_json) in cases {
            let Some(url) = conformance::require_env(var) else {
                continue;
            };
            let json = to_json(&url).expect(var);
            let by_config = connect_config(parse(&json).unwrap()).await.expect(var);
            let by_url = crate::connect(&url).await.expect(var);
            // lock() with a deadline, not one try: a Redlock vote can time out on a busy machine.
            let g = by_config
                .lock(
                    name.as_str(),
                    &opts.clone().wait_timeout(
                        std::time::Duration::from_secs(10).mul_f64(conformance::time_scale()),
                    ),
                )
                .await
                .expect(var);
            assert!(
                by_url
                    .try_lock(name.as_str(), &opts)
                    .await
                    .expect(var)
                    .is_none(),
                "{var}: the config's client and the URL's client share the lock"
            );
            g.release().await.expect(var);
            by_config.flush().await;
        }
    }
}
