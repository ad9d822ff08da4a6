//! Distributed locks behind one contract, with the backend picked by URL.
//!
//! `locksmith` re-exports the whole [`lockcore`] contract ([`Locker`], [`LockGuard`],
//! [`LockOptions`], [`AutoRenew`], [`Error`], ...) and adds [`connect`], which picks a backend
//! from the URL's scheme:
//!
//! | URL | backend | cargo feature |
//! |---|---|---|
//! | `memory://[store]` | in-process reference ([`memory::MemoryBackend`]) | always |
//! | `redis://`, `rediss://`, `redis+cluster://`, `rediss+cluster://`, `redis+sentinel://`, `rediss+sentinel://` | Redis | `redis` |
//! | `postgres://`, `postgresql://` | PostgreSQL | `postgres` |
//! | `mysql://`, `mariadb://` | MySQL / MariaDB | `mysql` |
//! | `sqlite://path` | SQLite | `sqlite` |
//! | `zk://host:port[,host:port]/chroot`, `zks://` (TLS) | ZooKeeper | `zk` |
//! | `redlock://h1:p1,h2:p2,...`, `redlocks://...` | Redlock over N independent Redis masters | `redlock` |
//! | `etcd://host:port[,host:port][/prefix]`, `etcds://` (TLS) | etcd v3 | `etcd` |
//!
//! **The [`guide`]** covers choosing a backend, each primitive (mutex, read-write lock,
//! semaphore, multi-lock, leader election), options, interop with other lock clients, the
//! operators' tools, what each backend promises under faults, and measured figures; every
//! example in it is compiled and run by the test command.
//!
//! A URL whose backend was not compiled in is refused with
//! [`ErrorKind::InvalidConfig`] ("built without the `redis` feature"); no error message ever
//! contains a URL's password (see [`redact_url`]: the password field is blanked, the text is
//! never searched for the password). Credentials a server refuses are [`ErrorKind::Auth`] on
//! every backend (`locksmith run` exits 77 for them).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use locksmith::{AutoRenew, ErrorKind, LockOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> locksmith::Result<()> {
//! let locker = locksmith::connect("memory://").await?;
//! let opts = LockOptions::new()
//!     .ttl(Duration::from_secs(10))                        // a crashed holder frees it after 10 s
//!     .wait_timeout(Duration::from_millis(50))             // lock() gives up after 50 ms
//!     .auto_renew(AutoRenew::until(Duration::from_secs(600))); // renewed, but never held > 10 min
//! let guard = locker.lock("reports/daily", &opts).await?;
//! assert!(locker.try_lock("reports/daily", &opts).await?.is_none()); // contention is Ok(None)
//! let err = locker.lock("reports/daily", &opts).await.unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::Timeout);                // the wait deadline passed
//! let token = guard.fencing_token();                         // hand it to the storage you write
//! let lost = guard.lost();                                   // fires if the lease is lost
//! tokio::select! {
//!     reason = lost.lost() => eprintln!("lock lost ({reason}): stop writing"),
//!     _ = async { /* the critical section, writing with `token` */ } => {}
//! }
//! assert!(token.is_some());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Who holds this lock?
//!
//! Every acquisition stores its holder's metadata with the lock ([`Holder`]: host, process id,
//! when acquired, and the [`LockOptions::label`] the application sets), in the request that
//! takes it. [`Locker::inspect`] reads it back from any client, with the fencing token, the TTL
//! left and the queued waiters ([`LockInfo`]); [`Locker::force_release`] frees a lock whoever
//! holds it (its holder's lost signal fires). Both are gated by [`Capabilities::inspect`] and
//! [`Capabilities::force_release`] (`Unsupported` before any I/O where not declared); the
//! [operators' chapter](guide::operators) has the table of what each backend stores, and the CLI has
//! `locksmith status NAME` and `locksmith unlock NAME --force`.
//!
//! ```
//! use locksmith::LockOptions;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> locksmith::Result<()> {
//! let locker = locksmith::connect("memory://operators").await?;
//! let _guard = locker.lock("reports/daily", &LockOptions::new().label("daily report")).await?;
//! let info = locker.inspect("reports/daily").await?;
//! assert!(info.held);
//! assert_eq!(info.holder.unwrap().label.as_deref(), Some("daily report"));
//! assert!(locker.force_release("reports/daily").await?);
//! # Ok(()) }
//! ```
//!
//! # One example per backend
//!
//! Every backend is reached the same way; only the URL (or the [`Config`]) changes. Each
//! backend crate documents its URL parameters and its config type (the same fields):
//!
//! | backend | feature | URL parameters and config type |
//! |---|---|---|
//! | Redis (single, Cluster, Sentinel) | `redis` | `lock_redis` crate docs (URL table, `interop`), `lock_redis::Config` |
//! | PostgreSQL, MySQL/MariaDB, SQLite | `postgres`, `mysql`, `sqlite` | `lock_sql` crate docs (`strategy`, `table`, `pool_max`, `op_timeout_ms`, `interop`, `handover`), `lock_sql::Config` |
//! | ZooKeeper | `zk` | `lock_zk` crate docs (`session_timeout_ms`, `namespace`, `digest`, `lost_after_disconnect`, `interop`), `lock_zk::Config` |
//! | etcd v3 | `etcd` | `lock_etcd` crate docs (`ca`, `domain`, `timeout_ms`), `lock_etcd::Config` |
//! | Redlock | `redlock` | `lock_redlock` crate docs (Redis parameters + `node_timeout_ms`), `lock_redlock::Config` |
//!
//! Each backend crate is re-exported under its own name with its feature (`locksmith::lock_redis`,
//! ...), so its docs are part of this crate's when the feature is on.
//!
//! ```no_run
//! # async fn demo() -> locksmith::Result<()> {
//! use locksmith::LockOptions;
//! let opts = LockOptions::new();
//! // Redis (feature `redis`): a password from the environment, never in code or argv.
//! let redis = locksmith::connect("redis://:s3cret@cache:6379/0?namespace=app").await?;
//! // PostgreSQL (feature `postgres`): a session lock held on a connection of its own.
//! let pg = locksmith::connect("postgres://app:pw@db/app?sslmode=verify-full&sslrootcert=ca.pem&strategy=row-lock").await?;
//! // MySQL / MariaDB (feature `mysql`): lease rows judged on the database clock.
//! let my = locksmith::connect("mysql://app:pw@db/app?strategy=lease").await?;
//! // SQLite (feature `sqlite`): processes of one host, no server.
//! let lite = locksmith::connect("sqlite:///var/lib/app/locks.db").await?;
//! // ZooKeeper (feature `zk`): ephemeral sequential nodes, FIFO, zxid fencing tokens.
//! let zk = locksmith::connect("zk://zk1:2181,zk2:2181,zk3:2181/app?session_timeout_ms=6000").await?;
//! // etcd (feature `etcd`): a key per acquisition on a lease, create-revision fencing.
//! let etcd = locksmith::connect("etcds://app:pw@e1:2379,e2:2379/app?ca=/etc/ca.pem").await?;
//! // Redlock over five independent Redis masters (feature `redlock`): no fencing tokens.
//! let redlock = locksmith::connect("redlock://r1:6379,r2:6379,r3:6379,r4:6379,r5:6379").await?;
//! for locker in [redis, pg, my, lite, zk, etcd, redlock] {
//!     let guard = locker.lock("reports/daily", &opts).await?;
//!     guard.release().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! # URL parameters
//!
//! Every URL kind refuses a query parameter it does not read: `InvalidConfig` naming it and
//! listing the accepted ones (the `locksmith` command exits 78), so a misspelled `strategy` or
//! `sslmode` never runs with the default instead. On SQL URLs only the parameters sqlx reads
//! pass through to it ([`lock_sql::sqlx_params`], every spelling sqlx 0.9 reads; sqlx itself
//! ignores the others). A test checks this table against the code:
//!
//! <!-- url-params -->
//! | URL | accepted query parameters |
//! |---|---|
//! | `memory://` | none |
//! | `redis://`, `rediss://`, `redis+cluster://`, `rediss+cluster://`, `redis+sentinel://`, `rediss+sentinel://` | `namespace`, `min_replicas`, `replica_timeout_ms`, `tls_ca`, `poll_ms`, `connect_timeout_ms`, `response_timeout_ms`, `interop`, `handover` |
//! | `postgres://`, `postgresql://` | `strategy`, `table`, `pool_max`, `op_timeout_ms`, `interop`, `handover`; to sqlx: `sslmode`, `ssl-mode`, `sslrootcert`, `ssl-root-cert`, `ssl-ca`, `sslcert`, `ssl-cert`, `sslkey`, `ssl-key`, `statement-cache-capacity`, `host`, `hostaddr`, `port`, `dbname`, `user`, `password`, `application_name`, `options`, `options[NAME]` |
//! | `mysql://`, `mariadb://` | `strategy`, `table`, `pool_max`, `op_timeout_ms`, `interop`, `handover`; to sqlx: `sslmode`, `ssl-mode`, `sslca`, `ssl-ca`, `sslcert`, `ssl-cert`, `sslkey`, `ssl-key`, `charset`, `collation`, `statement-cache-capacity`, `socket`, `timezone`, `time-zone` |
//! | `sqlite://` | `strategy`, `table`, `pool_max`, `op_timeout_ms`, `interop`, `handover`; to sqlx: `mode`, `cache`, `immutable`, `vfs` |
//! | `zk://`, `zks://` | `ca`, `cert`, `key`, `session_timeout_ms`, `namespace`, `digest`, `lost_after_disconnect`, `interop` |
//! | `redlock://`, `redlocks://` | `node_timeout_ms`, `namespace`, `tls_ca`, `poll_ms`, `connect_timeout_ms`, `response_timeout_ms`, `handover` |
//! | `etcd://`, `etcds://` | `ca`, `domain`, `timeout_ms` |
//! <!-- /url-params -->
//!
//! [`Config`] fields are refused alike when unknown, in every variant (`memory` and `url`
//! included: a `namespace` beside `url` is refused, since the URL says it).
//!
//! # Synchronous programs
//!
//! `locksmith::blocking` (feature `blocking`) gives the same locks to code without async: blocking
//! `lock`, `try_lock`, `with_lock`, `lock_all` / `try_lock_all`, `inspect`, `force_release`,
//! `campaign` / `leader`, on a runtime thread of its own that outlives every guard it hands
//! out.
//!
//! # Configuration without URLs
//!
//! [`Config`] takes a backend's settings from a config file (any serde format) or the
//! environment ([`Config::from_env`]: `APP_LOCK_BACKEND=zk`, `APP_LOCK_HOSTS=z1,z2`,
//! `APP_LOCK_SESSION_TIMEOUT_MS=4000`; [`Config::from_pairs`] for other flat `key=value`
//! sources), unknown keys refused, values validated exactly as the URL's, and
//! [`connect_config`] builds the locker. A URL's query and the environment are read by the same
//! deserializer ([`lockcore::config::from_pairs`]):
//!
//! ```no_run
//! # async fn demo() -> locksmith::Result<()> {
//! // config.json: {"backend": "redis", "nodes": ["cache:6379"], "password": "...", "namespace": "app"}
//! let text = std::fs::read_to_string("config.json").map_err(|e| locksmith::Error::invalid_config(e.to_string()))?;
//! let config: locksmith::Config = serde_json::from_str(&text)
//!     .map_err(|e| locksmith::Error::invalid_config(e.to_string()))?;
//! let locker = locksmith::connect_config(config).await?;
//! # Ok(()) }
//! ```
//!
//! # Clients you already have
//!
//! An application that already has a client or pool for the service builds the backend from
//! it, with no second URL or password to configure, and wraps it in a [`Locker`]:
//!
//! | backend | constructor | what it takes from the client |
//! |---|---|---|
//! | Redis | [`lock_redis::RedisBackend::from_client`] (a `redis::Client`) | address, TLS, credentials, db; own connections |
//! | PostgreSQL | [`lock_sql::SqlBackend::from_pg_pool`] (a `sqlx::PgPool`) | connection settings; own connections |
//! | MySQL / MariaDB | [`lock_sql::SqlBackend::from_mysql_pool`] (a `sqlx::MySqlPool`) | connection settings; own connections |
//! | SQLite | [`lock_sql::SqlBackend::from_sqlite_pool`] (a `sqlx::SqlitePool`) | the pool itself |
//! | ZooKeeper | [`lock_zk::ZkBackend::from_client`] (a `zookeeper_client::Client`) | the session itself |
//! | etcd | [`lock_etcd::EtcdBackend::from_client`] (an `etcd_client::Client`) | the channel itself |
//!
//! The backend crates are re-exported under their own names (`locksmith::lock_redis`, ...)
//! with their features. Each constructor's docs say what it shares and what it opens.
//!
//! # Locking inside your own PostgreSQL transaction
//!
//! `lock_sql::PgXactLock` (feature `postgres`) takes the lock inside a sqlx transaction the
//! application already has (`pg_advisory_xact_lock`): it is released by the transaction's commit
//! or rollback, so the lock covers exactly the writes it commits. It uses the row-lock strategy's
//! key and fencing counter, so it excludes, and is excluded by, `postgres://...?strategy=row-lock`
//! lockers of the same name and table.
//!
//! # Tracing and metrics
//!
//! Every locker emits `tracing` spans (`lock.acquire`, `lock.wait`, `lock.release`,
//! `lock.renew`, `lock.lost`, with the lock name, backend, outcome and waited time) and records
//! metrics through the `metrics` facade (`locksmith_acquire_seconds`, `locksmith_wait_seconds`,
//! `locksmith_handovers_total`, `locksmith_renewals_total`, `locksmith_lost_total`,
//! `locksmith_leases_held`): see [`telemetry`] for the fields and labels. Install your subscriber
//! and recorder before creating lockers; without them the cost is negligible.
//!
//! # Failure modes
//!
//! A distributed lock is a lease: it can end while its holder still believes it holds it. What
//! each backend does under each fault was observed on real servers (the Faults matrix the
//! fault suite writes, `cargo run -p faults --bin locksmith-faults`; the [faults
//! chapter](guide::faults) has the table):
//!
//! * **Holder pause** (GC, SIGSTOP, swap) past the TTL: another client takes the lock; the
//!   paused holder resumes still "holding" it until it checks. Check [`LockGuard::lost`] or
//!   [`LockGuard::is_valid`] before acting, and pass [`LockGuard::fencing_token`] to the storage
//!   you write: **fencing** is what makes the resumed holder's late write harmless (the storage
//!   refuses a token lower than one it has seen). Redlock has no fencing tokens. The default
//!   options give a token wherever the backend has them; [`LockOptions::no_fencing`] says the
//!   holder fences nothing, which the PostgreSQL row lock answers without committing its
//!   counter (most of its acquisition's cost), with a guard that has no token; see [`Fencing`].
//! * **Holder crash**: TTL backends free the lock after the holder's TTL; session-bound ones
//!   (SQL row-lock, ZooKeeper) when the connection or session ends.
//! * **Server restart**: Redis without persistence forgets every lock at once (another client
//!   wins while the holder believes it holds the lock: fence); SQL keeps leases and fencing
//!   counters across a crash (synchronous commits); ZooKeeper and etcd keep them in their log.
//! * **Failover**: Redis replication is asynchronous: a failover can lose a just-granted lock
//!   (`min_replicas` narrows the window, does not close it); ZooKeeper and etcd are consensus
//!   stores (no lost grants); Redlock stays safe only while clocks and pauses stay within its
//!   drift margin.
//! * **Partition**: the holder's lost signal fires before its validity ends, so before another
//!   client can win, on every backend measured (margins in the [faults chapter](guide::faults)).
//!
#![deny(missing_docs)]

mod backend_config;
mod backend_registry;
#[cfg(feature = "blocking")]
pub mod blocking;
pub mod guide;
mod url;

pub use lockcore::*;

#[cfg(feature = "etcd")]
pub use lock_etcd;
#[cfg(feature = "redis")]
pub use lock_redis;
#[cfg(feature = "redlock")]
pub use lock_redlock;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use lock_sql;
#[cfg(feature = "zk")]
pub use lock_zk;

pub use crate::backend_config::connect_config;
pub use crate::backend_registry::{
    CompiledBackend, Config, RegisteredBackend, backend_for_scheme, backends,
};
pub use crate::url::{feature_for_scheme, redact_url, scheme_of};

/// Connects to the lock service named by `url`, choosing the backend by the URL's scheme (see the
/// [crate docs](crate) for the table). Each call makes a new independent client (its own
/// connection or session).
///
/// Cancel safety: dropping the future before it completes leaves nothing behind but a
/// connection attempt being closed.
///
/// # Errors
/// [`ErrorKind::InvalidConfig`] for a malformed URL, an unknown scheme or a backend that was not
/// compiled in (the message names the missing cargo feature); the backend's own errors
/// (`InvalidConfig`, `Unavailable`, ...) when it cannot connect. No message contains the URL's
/// password.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let locker = locksmith::connect("memory://jobs").await.unwrap();
/// assert!(locker.describe().contains("memory"));
///
/// let err = locksmith::connect("nosuch://user:hunter2@host").await.unwrap_err();
/// assert_eq!(err.kind(), locksmith::ErrorKind::InvalidConfig);
/// assert!(!err.to_string().contains("hunter2"));
/// # }
/// ```
pub async fn connect(url: &str) -> Result<Locker> {
    let scheme = scheme_of(url)?;
    match backend_for_scheme(&scheme) {
        Some(RegisteredBackend {
            compiled: Some(backend),
            ..
        }) => (backend.connect)(url).await,
        Some(RegisteredBackend {
            feature: Some(feature),
            ..
        }) => Err(Error::invalid_config(format!(
            "{}: locksmith was built without the `{feature}` feature (enable it: \
             `cargo add locksmith --features {feature}`)",
            redact_url(url)
        ))),
        _ => {
            let known: Vec<&str> = backends().iter().flat_map(|b| b.schemes.to_vec()).collect();
            Err(Error::invalid_config(format!(
                "{}: unknown lock backend scheme `{scheme}` (known: {})",
                redact_url(url),
                known.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> Error {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(connect(url)).unwrap_err()
    }

    #[tokio::test]
    async fn memory_urls_connect_to_named_stores() {
        let a = connect("memory://").await.unwrap();
        let b = connect("memory://default").await.unwrap();
        let c = connect("memory://other/").await.unwrap();
        let opts = LockOptions::new();
        let g = a.try_lock("x", &opts).await.unwrap().unwrap();
        // Same store: contended. Other store: independent.
        assert!(b.try_lock("x", &opts).await.unwrap().is_none());
        assert!(c.try_lock("x", &opts).await.unwrap().is_some());
        g.release().await.unwrap();
        assert!(
            connect("MEMORY://").await.is_ok(),
            "schemes are case-insensitive"
        );
    }

    #[test]
    fn unknown_and_malformed_urls_are_invalid_config_without_password() {
        for url in [
            "nosuch://u:sekrit@host",
            "sekrit",
            "://sekrit@",
            "",
            "memory://bad store",
            "memory:sekrit",
            "1redis://u:sekrit@h",
        ] {
            let e = err(url);
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{url}: {e}");
            assert!(!e.to_string().contains("sekrit"), "{url}: {e}");
            assert!(!format!("{e:?}").contains("sekrit"), "{url}: {e:?}");
        }
    }

    /// Whether the backend feature is compiled in (its scheme would then really connect),
    /// as cargo says (checked against the registry's `compiled` in `registry_follows_features`).
    fn compiled_in(feature: &str) -> bool {
        let compiled = [
            ("redis", cfg!(feature = "redis")),
            ("postgres", cfg!(feature = "postgres")),
            ("mysql", cfg!(feature = "mysql")),
            ("sqlite", cfg!(feature = "sqlite")),
            ("zk", cfg!(feature = "zk")),
            ("redlock", cfg!(feature = "redlock")),
            ("etcd", cfg!(feature = "etcd")),
        ];
        compiled.iter().any(|&(f, on)| f == feature && on)
    }

    #[test]
    fn registry_follows_features() {
        for b in backends() {
            let on = b.feature.is_none_or(compiled_in);
            assert_eq!(b.compiled.is_some(), on, "{}", b.name);
        }
    }

    #[test]
    fn known_schemes_without_their_feature_name_it() {
        for (url, feature) in [
            ("redis://:p%40ss@localhost:6379", "redis"),
            ("rediss://u:pw@localhost", "redis"),
            ("redis+cluster://h1:1,h2:2", "redis"),
            ("rediss+cluster://:pw@h1:1", "redis"),
            ("redis+sentinel://:pw@s1:26379,s2/mymaster", "redis"),
            ("rediss+sentinel://s1/mymaster/0", "redis"),
            ("postgres://u:pw@h/db?strategy=lease", "postgres"),
            ("postgresql://u:pw@h/db", "postgres"),
            ("mysql://u:pw@h/db", "mysql"),
            ("mariadb://u:pw@h/db", "mysql"),
            ("sqlite:///tmp/x.db", "sqlite"),
            ("zk://u:pw@h1:1,h2:2/chroot", "zk"),
            ("zks://h1:1?ca=/ca.pem", "zk"),
            ("redlock://:pw@h1:1,:pw@h2:2,h3:3", "redlock"),
            ("redlocks://:pw@h1:1", "redlock"),
            ("etcd://u:pw@h1:1,h2:2/prefix", "etcd"),
            ("etcds://u:pw@h1:1", "etcd"),
        ] {
            if compiled_in(feature) {
                continue;
            }
            let e = err(url);
            assert_eq!(e.kind(), ErrorKind::InvalidConfig);
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("built without the `{feature}` feature")),
                "{msg}"
            );
            assert!(!msg.contains("pw") && !msg.contains("p%40ss"), "{msg}");
        }
    }

    /// Backends with a server report its version (for the report's provenance): Redis from
    /// `INFO server`, PostgreSQL and MariaDB from the server, SQLite its library version.
    #[tokio::test]
    async fn servers_report_their_versions() {
        let memory = connect("memory://").await.unwrap();
        assert_eq!(memory.backend().server_version().await, None);
        for (var, feature, prefix) in [
            ("LOCK_TEST_REDIS_URL", "redis", "redis 7."),
            ("LOCK_TEST_POSTGRES_URL", "postgres", "PostgreSQL 15"),
            ("LOCK_TEST_MYSQL_URL", "mysql", "10.11"),
            ("LOCK_TEST_SQLITE_URL", "sqlite", "SQLite 3."),
        ] {
            if !compiled_in(feature) {
                continue;
            }
            let Some(url) = conformance::require_env(var) else {
                continue;
            };
            let locker = connect(&url).await.expect(var);
            let version = locker.backend().server_version().await;
            assert!(
                version.as_deref().is_some_and(|v| v.starts_with(prefix)),
                "{var}: {version:?}"
            );
        }
    }
}
