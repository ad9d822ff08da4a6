//! Fault tools for locksmith's tests and its report runner.
//!
//! * Server launchers ([`RedisServer`], [`RedisFailover`], [`Postgres`], [`MariaDb`],
//!   [`ZooKeeper`], [`Etcd`]): each starts real server processes from Rust on free loopback
//!   ports with a throw-away data directory, waits (with a timeout) until they serve, and kills
//!   them when dropped (also on panic). Each member can be killed (`kill -9`), paused
//!   (`SIGSTOP`), resumed (`SIGCONT`) and restarted with or without its data. The replicated
//!   servers share one engine ([`Cluster`]: members, cuts, leaders, restarts) and the SQL
//!   servers another ([`SqlServer`]: URL, install, restart); each launcher gives only its
//!   command line and how its server says it is ready, and dereferences to its engine.
//! * Peer links ([`ZooKeeper::ensemble_with_peer_links`], [`Etcd::cluster_with_peer_links`]):
//!   the members' peer traffic (ZooKeeper's quorum and election ports, etcd's peer port) passes
//!   faultkit, so that `cut_member(i)` cuts one member off from its peers while its clients
//!   still reach its client port, and `heal_member(i)` ends the cut. No privilege needed: the
//!   member that dialled a connection is found in `/proc`.
//! * [`Proxy`]: a TCP proxy between a client and a server whose mode switches at run time:
//!   pass, added latency per direction, blackhole, reset, keepalives answered by the proxy
//!   while nothing passes; and one request's reply lost ([`Proxy::lose_reply`]). Started with a
//!   [`Wire`] (PostgreSQL, MySQL, ZooKeeper), it counts the client's requests.
//!   [`rewrite_url`] points a URL at it.
//! * [`Holder`]: drives a lock-holder *process* (the `locksmith-holder` binary of the `faults`
//!   crate, or anything printing the same JSON lines), so a holder can be SIGKILLed, paused and
//!   resumed like a real one.
//! * [`PeerProcess`] (started from a [`PeerCommand`]): drives another lock client's process
//!   (Curator, go-zookeeper, kazoo, `etcdctl lock`, redis-py, the `mariadb` client, a sqlx
//!   program) line by line for the backends' interop tests, and collects its critical sections
//!   ([`Window`]); [`check_windows`] checks that no two clients' critical sections overlapped
//!   and that each made progress.
//! * [`FencedResource`]: accepts a write only when its fencing token is at least the highest
//!   seen, and counts stale writes rejected and accepted.
//!
//! This crate depends on no backend crate (backends use it as a dev-dependency). Servers come
//! from the Debian packages `scripts/install-servers.sh` installs.
//!
//! Every readiness wait has a timeout ([`Timeouts`]); a server that fails to start gives an
//! [`Error`] carrying the tail of its log.
#![deny(missing_docs)]

/// `impl Deref` and `DerefMut` from a launcher to the engine it wraps (`derefs_to!(Etcd,
/// cluster: Cluster)`): the engine's methods are the launcher's.
macro_rules! derefs_to {
    ($outer:ty, $field:ident: $target:ty) => {
        impl std::ops::Deref for $outer {
            type Target = $target;
            fn deref(&self) -> &$target {
                &self.$field
            }
        }

        impl std::ops::DerefMut for $outer {
            fn deref_mut(&mut self) -> &mut $target {
                &mut self.$field
            }
        }
    };
}

mod cluster;
mod etcd;
mod fence;
mod holder;
mod mariadb;
mod peer;
mod peer_links;
mod postgres;
mod process;
mod proxy;
mod redis;
mod redis_monitor;
mod sql_server;
mod util;
mod wire;
mod zk;

pub use cluster::Cluster;
pub use etcd::Etcd;
pub use fence::{FenceStats, FencedResource};
pub use holder::{HOLDER_URL_ENV, Holder, HolderEvent, HolderSpec, libfaketime};
pub use mariadb::MariaDb;
pub use peer::{PeerCommand, PeerProcess, Window, check_windows, unix_micros, unix_micros_at};
pub use postgres::Postgres;
pub use process::ServerProcess;
pub use proxy::{Direction, Pick, Proxy, ProxyMode, ReplyLoss, rewrite_url};
pub use redis::{RedisFailover, RedisServer, spawn_tls_redis};
pub use redis_monitor::RedisMonitor;
pub use sql_server::SqlServer;
pub use util::{
    Error, Result, TempDir, Timeouts, free_port, now_unix_micros, require_installed, wait_until,
};
pub use wire::Wire;
pub use zk::{ZooKeeper, four_letter as zk_four_letter, mode as zk_mode};
