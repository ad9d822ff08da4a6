//! A backend on its own throw-away topology: the URL to reach it and the faults its servers take.

use std::time::Duration;

use faultkit::{Etcd, MariaDb, Postgres, RedisFailover, RedisServer, TempDir, ZooKeeper};

/// Which topology a backend runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One Redis server without persistence.
    Redis,
    /// Redis primary + replica + 3 sentinels, reached through the sentinels.
    Sentinel {
        /// The `min_replicas` URL parameter.
        min_replicas: u32,
    },
    /// PostgreSQL.
    Postgres {
        /// `strategy=row-lock` (else lease).
        row_lock: bool,
    },
    /// MariaDB.
    MariaDb {
        /// `strategy=row-lock` (else lease).
        row_lock: bool,
    },
    /// A SQLite file (no server).
    Sqlite,
    /// A 3-node ZooKeeper ensemble (tickTime 200 ms, syncLimit 5, session timeout 1 s), its
    /// members linked through faultkit (a member can be cut off from its peers).
    ZooKeeper,
    /// A 3-member etcd cluster (heartbeat 50 ms, election timeout 500 ms, data on tmpfs), its
    /// members linked through faultkit (a member can be cut off from its peers).
    Etcd,
    /// Redlock over 5 independent Redis masters without persistence.
    Redlock,
}

/// The fault targets: a label in the matrix and a topology, for each backend of the
/// `locksmith` registry that has servers (a test checks that none is missing).
pub const TARGETS: &[(&str, Kind)] = &[
    ("redis", Kind::Redis),
    ("redis-sentinel", Kind::Sentinel { min_replicas: 0 }),
    ("redis-sentinel-min1", Kind::Sentinel { min_replicas: 1 }),
    ("postgres-lease", Kind::Postgres { row_lock: false }),
    ("postgres-row-lock", Kind::Postgres { row_lock: true }),
    ("mysql-lease", Kind::MariaDb { row_lock: false }),
    ("mysql-row-lock", Kind::MariaDb { row_lock: true }),
    ("sqlite", Kind::Sqlite),
    ("zk-ensemble", Kind::ZooKeeper),
    ("etcd-cluster", Kind::Etcd),
    ("redlock", Kind::Redlock),
];

impl Kind {
    /// The backend of the `locksmith` registry this topology serves (its name there).
    pub fn backend(self) -> &'static str {
        match self {
            Kind::Redis | Kind::Sentinel { .. } => "redis",
            Kind::Postgres { .. } => "postgres",
            Kind::MariaDb { .. } => "mysql",
            Kind::Sqlite => "sqlite",
            Kind::ZooKeeper => "zk",
            Kind::Etcd => "etcd",
            Kind::Redlock => "redlock",
        }
    }
}

/// How many Redlock masters the `redlock` topology runs.
pub const REDLOCK_MASTERS: usize = 5;

pub(crate) enum Topo {
    Redis(RedisServer),
    Sentinel(RedisFailover),
    Postgres(Postgres),
    MariaDb(MariaDb),
    Sqlite(TempDir),
    ZooKeeper(ZooKeeper),
    Etcd(Etcd),
    Redlock(Vec<RedisServer>),
}

/// A backend under test: its label, its topology, its URL.
pub struct Target {
    /// The label in the matrix.
    pub label: String,
    /// The topology kind.
    pub kind: Kind,
    pub(crate) topo: Topo,
    /// The TTL the scenarios use (for ZooKeeper also the session timeout).
    pub ttl: Duration,
}

impl Target {
    /// Starts the topology of `kind`.
    ///
    /// Cancel safety: a dropped start kills what it started.
    pub async fn start(label: &str, kind: Kind) -> faultkit::Result<Target> {
        let topo = match kind {
            Kind::Redis => Topo::Redis(RedisServer::start().await?),
            Kind::Sentinel { .. } => Topo::Sentinel(RedisFailover::start().await?),
            Kind::Postgres { .. } => Topo::Postgres(Postgres::start().await?),
            Kind::MariaDb { .. } => Topo::MariaDb(MariaDb::start().await?),
            Kind::Sqlite => Topo::Sqlite(TempDir::new("sqlite", false)?),
            Kind::ZooKeeper => Topo::ZooKeeper(ZooKeeper::ensemble_with_peer_links().await?),
            Kind::Etcd => Topo::Etcd(Etcd::cluster_with_peer_links().await?),
            Kind::Redlock => {
                let mut masters = Vec::new();
                for _ in 0..REDLOCK_MASTERS {
                    masters.push(RedisServer::start().await?);
                }
                Topo::Redlock(masters)
            }
        };
        Ok(Target {
            label: label.to_string(),
            kind,
            topo,
            ttl: Duration::from_millis(1000),
        })
    }

    /// The URL clients connect with.
    pub fn url(&self) -> String {
        match (&self.topo, self.kind) {
            (Topo::Redis(r), _) => r.url(),
            (Topo::Sentinel(s), Kind::Sentinel { min_replicas }) if min_replicas > 0 => {
                format!(
                    "{}?min_replicas={min_replicas}&replica_timeout_ms=500",
                    s.sentinel_url()
                )
            }
            (Topo::Sentinel(s), _) => s.sentinel_url(),
            (Topo::Postgres(p), Kind::Postgres { row_lock: true }) => {
                format!("{}?strategy=row-lock", p.url())
            }
            (Topo::Postgres(p), _) => p.url(),
            (Topo::MariaDb(m), Kind::MariaDb { row_lock: true }) => {
                format!("{}?strategy=row-lock", m.url())
            }
            (Topo::MariaDb(m), _) => m.url(),
            (Topo::Sqlite(d), _) => format!("sqlite://{}", d.join("locks.db").display()),
            (Topo::ZooKeeper(z), _) => {
                format!("{}?session_timeout_ms={}", z.url(), self.ttl.as_millis())
            }
            (Topo::Etcd(e), _) => {
                let hosts: Vec<String> = (0..e.len())
                    .map(|i| format!("127.0.0.1:{}", e.client_port(i)))
                    .collect();
                format!("etcd://{}", hosts.join(","))
            }
            (Topo::Redlock(ms), _) => {
                let hosts: Vec<String> = ms
                    .iter()
                    .map(|m| format!("127.0.0.1:{}", m.port()))
                    .collect();
                // A generous per-node timeout: a vote lost to it on a loaded machine makes a
                // one-shot attempt a miss (lock() retries; the scenarios use lock()).
                format!(
                    "redlock://{}?node_timeout_ms={}",
                    hosts.join(","),
                    Duration::from_millis(250)
                        .mul_f64(conformance::time_scale())
                        .as_millis()
                )
            }
        }
    }

    /// The URL of a client that knows only the members on these client ports (or proxies in
    /// front of them): a ZooKeeper ensemble or an etcd cluster, else `None`.
    pub fn url_via(&self, ports: &[u16]) -> Option<String> {
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        match &self.topo {
            Topo::ZooKeeper(_) => Some(format!(
                "zk://{}?session_timeout_ms={}",
                hosts.join(","),
                self.ttl.as_millis()
            )),
            Topo::Etcd(_) => Some(format!("etcd://{}", hosts.join(","))),
            _ => None,
        }
    }

    /// The member that leads now (ZooKeeper, etcd).
    ///
    /// Cancel safe.
    pub async fn leader(&self) -> faultkit::Result<usize> {
        match &self.topo {
            Topo::ZooKeeper(z) => z.leader().await,
            Topo::Etcd(e) => e.leader().await,
            _ => Err(faultkit::Error::msg("no leader in this topology")),
        }
    }

    /// Cuts member `i` off from its peers (or heals it), its client port still reachable
    /// (ZooKeeper, etcd).
    pub fn set_member_cut(&self, i: usize, cut: bool) -> faultkit::Result<()> {
        match (&self.topo, cut) {
            (Topo::ZooKeeper(z), true) => z.cut_member(i),
            (Topo::ZooKeeper(z), false) => z.heal_member(i),
            (Topo::Etcd(e), true) => e.cut_member(i),
            (Topo::Etcd(e), false) => e.heal_member(i),
            _ => Err(faultkit::Error::msg("no peer links in this topology")),
        }
    }

    /// Whether member `i` serves with a quorum behind it: a ZooKeeper leader or follower, an
    /// etcd member that knows a leader.
    ///
    /// Cancel safe.
    pub async fn member_in_quorum(&self, i: usize) -> bool {
        match &self.topo {
            Topo::ZooKeeper(z) => faultkit::zk_mode(z.client_port(i))
                .await
                .ok()
                .flatten()
                .is_some_and(|m| m == "leader" || m == "follower"),
            Topo::Etcd(e) => e.has_leader(i).await.unwrap_or(false),
            _ => false,
        }
    }

    /// How many independent server members the topology has (a quorum of them serves).
    pub fn members(&self) -> usize {
        match &self.topo {
            Topo::ZooKeeper(z) => z.len(),
            Topo::Etcd(e) => e.len(),
            Topo::Redlock(ms) => ms.len(),
            _ => 1,
        }
    }

    /// Kills member `i` (`-9`).
    pub fn kill_member(&mut self, i: usize) {
        match &mut self.topo {
            Topo::ZooKeeper(z) => z.member(i).kill(),
            Topo::Etcd(e) => e.member(i).kill(),
            Topo::Redlock(ms) => ms[i].process().kill(),
            _ => {}
        }
    }

    /// Starts the killed `members` again (with their data; Redis masters empty) and waits until
    /// each serves. All are started before any is waited for: a quorum member serves only once
    /// a quorum runs.
    ///
    /// Cancel safety: a dropped call may leave members stopped.
    pub async fn restart_members(&mut self, members: &[usize]) -> faultkit::Result<()> {
        match &mut self.topo {
            Topo::ZooKeeper(z) => {
                for &i in members {
                    z.member(i).respawn()?;
                }
                for &i in members {
                    wait_zk_member(z, i).await?;
                }
            }
            Topo::Etcd(e) => {
                for &i in members {
                    e.member(i).respawn()?;
                }
                for &i in members {
                    e.wait_healthy(i).await?;
                }
            }
            Topo::Redlock(ms) => {
                for &i in members {
                    ms[i].restart().await?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The client ports the URL names (for proxying); empty without a network.
    pub fn endpoints(&self) -> Vec<u16> {
        match &self.topo {
            Topo::Redis(r) => vec![r.port()],
            Topo::Sentinel(_) => Vec::new(),
            Topo::Postgres(p) => vec![p.port()],
            Topo::MariaDb(m) => vec![m.port()],
            Topo::Sqlite(_) => Vec::new(),
            Topo::ZooKeeper(z) => (0..z.len()).map(|i| z.client_port(i)).collect(),
            Topo::Etcd(e) => (0..e.len()).map(|i| e.client_port(i)).collect(),
            Topo::Redlock(ms) => ms.iter().map(|m| m.port()).collect(),
        }
    }

    /// Kills every server of the topology (`-9`) and starts them again: Redis and the Redlock
    /// masters empty (no persistence), the others with their data. `None` when there is no server.
    ///
    /// Cancel safety: a dropped restart may leave servers stopped.
    pub async fn restart(&mut self) -> Option<faultkit::Result<()>> {
        Some(match &mut self.topo {
            Topo::Redis(r) => r.restart().await,
            Topo::Postgres(p) => p.restart(true).await,
            Topo::MariaDb(m) => m.restart(true).await,
            Topo::ZooKeeper(z) => {
                for i in 0..z.len() {
                    z.member(i).kill();
                }
                let mut res = Ok(());
                for i in 0..z.len() {
                    z.member(i).respawn().ok();
                }
                for i in 0..z.len() {
                    // `restart` of a running member kills it again; wait through a no-op
                    // restart-free readiness instead: a member serves once it names a mode.
                    if let Err(e) = wait_zk_member(z, i).await {
                        res = Err(e);
                    }
                }
                res
            }
            Topo::Etcd(e) => e.restart_all().await,
            Topo::Redlock(ms) => {
                for m in ms.iter_mut() {
                    m.process().kill();
                }
                let mut res = Ok(());
                for m in ms.iter_mut() {
                    if let Err(e) = m.restart().await {
                        res = Err(e);
                    }
                }
                res
            }
            Topo::Sentinel(_) | Topo::Sqlite(_) => return None,
        })
    }
}

async fn wait_zk_member(z: &ZooKeeper, i: usize) -> faultkit::Result<()> {
    let port = z.client_port(i);
    faultkit::wait_until(
        "zookeeper member serving again",
        faultkit::Timeouts::scaled().start,
        || async move {
            Ok(faultkit::zk_mode(port)
                .await
                .ok()
                .flatten()
                .is_some_and(|m| m == "leader" || m == "follower"))
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every backend of the registry but the in-process one has a fault target, and every
    /// target serves a registered backend: a new backend shows up here until it has one.
    #[test]
    fn every_registered_backend_has_a_fault_target() {
        for b in locksmith::backends() {
            let covered = TARGETS.iter().any(|(_, kind)| kind.backend() == b.name);
            assert_eq!(covered, b.feature.is_some(), "{}: fault target", b.name);
        }
        for (label, kind) in TARGETS {
            assert!(
                locksmith::backends()
                    .iter()
                    .any(|b| b.name == kind.backend()),
                "{label}"
            );
        }
        assert_eq!(
            crate::backends().len(),
            TARGETS.len(),
            "every feature is on here"
        );
    }
}
