//! The registry: every backend the facade knows, listed once. [`connect`](crate::connect)'s URL
//! dispatch, [`Config`]'s variants and [`connect_config`](crate::connect_config)'s dispatch,
//! [`feature_for_scheme`](crate::feature_for_scheme), and the `locksmith` command's conformance
//! harness all read it.
//!
//! Adding a backend: a crate exporting a [`lockcore::registry::Registration`], a cargo feature
//! in `locksmith/Cargo.toml`, and one entry in the [`registry!`] call at the end of this file
//! (CONTRIBUTING.md, "Adding a backend", has the whole list).

use lockcore::registry::{Connecting, HarnessHints, OtherNamespace};
use lockcore::{Error, Locker, Result, Secret, memory};

/// One backend of the registry, compiled in or not.
#[derive(Debug)]
#[non_exhaustive]
pub struct RegisteredBackend {
    /// The backend's name: the `backend` tag of its [`Config`] variant (`redis`, `postgres`).
    pub name: &'static str,
    /// The cargo feature of `locksmith` that brings it (`None`: always built in).
    pub feature: Option<&'static str>,
    /// The URL schemes it takes (lowercase).
    pub schemes: &'static [&'static str],
    /// How to connect to it and test it; `None` when its feature is off.
    pub compiled: Option<CompiledBackend>,
}

/// What a compiled-in backend's registration gives.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct CompiledBackend {
    /// Connects to the service a URL of one of the backend's schemes names.
    pub connect: for<'a> fn(&'a str) -> Connecting<'a>,
    /// What the conformance harness needs to know about the backend's URLs.
    pub harness: HarnessHints,
}

impl std::fmt::Debug for CompiledBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledBackend")
            .field("harness", &self.harness)
            .finish_non_exhaustive()
    }
}

/// Every backend the facade knows, in the registry's order, compiled in or not.
///
/// ```
/// let memory = &locksmith::backends()[0];
/// assert_eq!((memory.name, memory.feature), ("memory", None));
/// assert!(locksmith::backends().iter().any(|b| b.schemes.contains(&"zk")));
/// ```
pub fn backends() -> &'static [RegisteredBackend] {
    BACKENDS
}

/// The backend that takes URLs of this (lowercase) scheme, compiled in or not.
///
/// ```
/// let b = locksmith::backend_for_scheme("rediss+cluster").unwrap();
/// assert_eq!(b.feature, Some("redis"));
/// assert!(locksmith::backend_for_scheme("gopher").is_none());
/// ```
pub fn backend_for_scheme(scheme: &str) -> Option<&'static RegisteredBackend> {
    BACKENDS.iter().find(|b| b.schemes.contains(&scheme))
}

/// Lists every backend once and generates from that list [`Config`], its dispatch and the
/// [`BACKENDS`] table. Each entry: the `Config` variant's docs, the variant and the backend's
/// config type, the cargo feature (also the variant's `backend` tag), the backend crate's
/// registration, and the URL schemes (here rather than in the crate, so that a URL of a backend
/// built without its feature is still recognised and its feature named).
macro_rules! registry {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident($config:ty) = $feature:literal, $registration:path, [$($scheme:literal),+ $(,)?];
    )*) => {
        /// Which backend to use and how, as a config file or the environment says it: the field
        /// `backend` names the backend, the other fields are that backend's own config type (the
        /// same fields as its URL, refused when unknown). [`connect_config`](crate::connect_config)
        /// builds the [`Locker`].
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
        // deny_unknown_fields: the `memory` and `url` variants' own (the other variants' types
        // deny theirs). A field beside `url` (`namespace`...) is refused rather than applied:
        // the URL already says everything, and a second source for a setting could contradict
        // it without anyone noticing.
        #[serde(tag = "backend", rename_all = "lowercase", deny_unknown_fields)]
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
            $(
                $(#[doc = $doc])*
                #[cfg(feature = $feature)]
                $variant($config),
            )*
        }

        /// Reads the fields of a registered backend's variant from text pairs (all but
        /// `backend`) into its own config type, so that numbers and lists are parsed as that
        /// type asks ([`lockcore::config::from_pairs`]); `None` for `memory`, `url` and unknown
        /// names. `Some(Err)` names the missing cargo feature of a known backend not compiled in.
        pub(crate) fn variant_from_pairs(
            backend: &str,
            pairs: Vec<(String, String)>,
        ) -> Option<Result<Config>> {
            let _ = &pairs;
            match backend {
                $(
                    $feature => {
                        #[cfg(feature = $feature)]
                        return Some(
                            lockcore::config::from_pairs::<$config>(
                                concat!($feature, " config"),
                                pairs,
                            )
                            .map(Config::$variant),
                        );
                        #[cfg(not(feature = $feature))]
                        return Some(Err(Error::invalid_config(concat!(
                            "backend `", $feature, "`: locksmith was built without the `",
                            $feature, "` feature"
                        ))));
                    }
                )*
                _ => None,
            }
        }

        /// Connects a [`Config`] of a registered backend.
        pub(crate) async fn connect_registered(config: Config) -> Result<Locker> {
            match config {
                Config::Memory { store } => {
                    crate::connect(&format!("memory://{}", store.as_deref().unwrap_or("default")))
                        .await
                }
                Config::Url { url } => crate::connect(url.expose()).await,
                $(
                    #[cfg(feature = $feature)]
                    Config::$variant(c) => {
                        let registration: &lockcore::registry::Registration<$config> =
                            &$registration;
                        (registration.connect_config)(c).await
                    }
                )*
            }
        }

        /// The registry's table (see [`registry!`]).
        static BACKENDS: &[RegisteredBackend] = &[
            RegisteredBackend {
                name: "memory",
                feature: None,
                schemes: &["memory"],
                compiled: Some(CompiledBackend {
                    connect: connect_memory,
                    harness: HarnessHints {
                        other_namespace: OtherNamespace::Suffix("-other"),
                        ..HarnessHints::DEFAULT
                    },
                }),
            },
            $(
                RegisteredBackend {
                    name: $feature,
                    feature: Some($feature),
                    schemes: &[$($scheme),+],
                    #[cfg(feature = $feature)]
                    compiled: Some(CompiledBackend {
                        connect: ($registration).connect,
                        harness: ($registration).harness,
                    }),
                    #[cfg(not(feature = $feature))]
                    compiled: None,
                },
            )*
        ];
    };
}

registry! {
    /// Redis: single node, Cluster or Sentinel.
    Redis(lock_redis::Config) = "redis", lock_redis::REGISTRATION,
        ["redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel"];
    /// PostgreSQL (`url` is a `postgres://` URL).
    Postgres(lock_sql::Config) = "postgres", lock_sql::POSTGRES, ["postgres", "postgresql"];
    /// MySQL / MariaDB (`url` is a `mysql://` or `mariadb://` URL).
    Mysql(lock_sql::Config) = "mysql", lock_sql::MYSQL, ["mysql", "mariadb"];
    /// SQLite (`url` is a `sqlite://path` URL).
    Sqlite(lock_sql::Config) = "sqlite", lock_sql::SQLITE, ["sqlite"];
    /// ZooKeeper.
    Zk(lock_zk::Config) = "zk", lock_zk::REGISTRATION, ["zk", "zks"];
    /// Redlock over independent Redis masters.
    Redlock(lock_redlock::Config) = "redlock", lock_redlock::REGISTRATION, ["redlock", "redlocks"];
    /// etcd v3.
    Etcd(lock_etcd::Config) = "etcd", lock_etcd::REGISTRATION, ["etcd", "etcds"];
}

/// `memory://[store]`: the in-process reference backend, always built in.
fn connect_memory(url: &str) -> Connecting<'_> {
    Box::pin(async move {
        Ok(Locker::new(memory::MemoryBackend::connect(&memory_store(
            url,
        )?)))
    })
}

/// The store name of a `memory://[store]` URL: `default` when empty.
fn memory_store(url: &str) -> Result<String> {
    // The input is not repeated in these errors: it may hold a secret in the wrong place.
    let rest = url
        .split_once("://")
        .map(|(_, rest)| rest)
        .ok_or_else(|| Error::invalid_config("a memory URL looks like memory://[store]"))?;
    if let Some((_, query)) = rest.split_once('?') {
        // A memory URL has no parameters: refuse one as every backend refuses an unknown
        // one, named (query_pairs refuses a name that is not plain without quoting it).
        let what = "memory URL";
        let pairs = lockcore::config::query_pairs(what, query)?;
        let named = pairs
            .first()
            .map(|(key, _)| format!("unknown query parameter `{key}`"))
            .unwrap_or_else(|| "a `?` without parameters".to_owned());
        return Err(Error::invalid_config(format!(
            "{what}: {named} (memory://[store] takes none)"
        )));
    }
    let store = rest.trim_end_matches('/');
    if store.is_empty() {
        return Ok("default".to_owned());
    }
    if store
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        Ok(store.to_owned())
    } else {
        Err(Error::invalid_config(
            "memory://[store]: a store name is made of letters, digits, `_`, `-` and `.`",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheme names one backend; names and features are unique.
    #[test]
    fn the_registry_is_consistent() {
        let mut schemes: Vec<&str> = backends().iter().flat_map(|b| b.schemes.to_vec()).collect();
        let n = schemes.len();
        schemes.sort_unstable();
        schemes.dedup();
        assert_eq!(schemes.len(), n, "a scheme is registered twice");
        for b in backends() {
            assert_eq!(
                backends().iter().filter(|o| o.name == b.name).count(),
                1,
                "{}",
                b.name
            );
            for s in b.schemes {
                let parsed = lockcore::config::scheme_of(&format!("{s}://")).ok();
                assert_eq!(
                    parsed.as_deref(),
                    Some(*s),
                    "schemes are registered lowercase"
                );
            }
        }
        assert!(backend_for_scheme("memory").unwrap().compiled.is_some());
    }

    /// A memory URL's query is refused, its parameter named (before, the whole store part was
    /// refused as a bad store name, the parameter unnamed).
    #[test]
    fn memory_urls_refuse_parameters_by_name() {
        for (url, named) in [
            ("memory://jobs?stor=x", Some("`stor`")),
            ("memory://?namespace=a", Some("`namespace`")),
            ("memory://jobs?", None),
            ("memory://jobs?Sekrit=1", None),
        ] {
            let e = memory_store(url).unwrap_err();
            assert_eq!(e.kind(), lockcore::ErrorKind::InvalidConfig, "{url}");
            let msg = e.to_string();
            if let Some(named) = named {
                assert!(
                    msg.contains(&format!("unknown query parameter {named}")),
                    "{msg}"
                );
            }
            assert!(!msg.contains("Sekrit"), "{msg}");
        }
        assert_eq!(memory_store("memory://jobs/").unwrap(), "jobs");
    }
}
