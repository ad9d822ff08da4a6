//! ZooKeeper 3.8 (Debian, java): a single server or a 3-node ensemble on loopback.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cluster::{Cluster, Member, Probes};
use crate::peer_links::{FirstRead, PeerLinks};
use crate::util::{Error, Result, TempDir, Timeouts, free_port};

const CLASSPATH: &str = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";

/// Sends a four-letter word (`srvr`, `ruok`, ...) to a ZooKeeper client port and returns the
/// answer.
///
/// Cancel safe.
pub async fn four_letter(port: u16, word: &str) -> Result<String> {
    let f = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(word.as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    tokio::time::timeout(Duration::from_secs(2), f)
        .await
        .map_err(|_| Error::msg(format!("zookeeper :{port} {word}: no answer")))?
        .map_err(Error::from)
}

/// The `Mode:` a ZooKeeper member reports through `srvr` (`leader`, `follower`, `standalone`),
/// `None` while it does not serve.
///
/// Cancel safe.
pub async fn mode(port: u16) -> Result<Option<String>> {
    let out = four_letter(port, "srvr").await?;
    Ok(out
        .lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(|m| m.trim().to_string()))
}

/// How a ZooKeeper member says it serves and leads (`srvr`'s `Mode:`; a standalone server
/// leads).
const PROBES: Probes = Probes {
    server: "zookeeper",
    ready_what: "srvr Mode:",
    ready: |port| Box::pin(async move { Ok(mode(port).await?.is_some()) }),
    leads: |port| {
        Box::pin(async move {
            let mode = mode(port).await?;
            Ok(matches!(mode.as_deref(), Some("leader" | "standalone")))
        })
    },
};

/// A ZooKeeper server or ensemble (`tickTime` 200 ms by default, so the minimum session timeout
/// is 400 ms; `java -Xmx256m`). Members are numbered from 0. What every member set does (ports,
/// cuts, kills, leaders, restarts) comes from [`Cluster`], which it dereferences to.
#[derive(Debug)]
pub struct ZooKeeper {
    cluster: Cluster,
    tick: Duration,
}

derefs_to!(ZooKeeper, cluster: Cluster);

impl ZooKeeper {
    /// One standalone server.
    ///
    /// Cancel safety: a dropped start kills what it started.
    pub async fn single() -> Result<Self> {
        Self::start(1, Duration::from_millis(200)).await
    }

    /// A 3-node ensemble; returns once every member serves (as leader or follower).
    ///
    /// Cancel safety: a dropped start kills what it started.
    pub async fn ensemble() -> Result<Self> {
        Self::start(3, Duration::from_millis(200)).await
    }

    /// A 3-node ensemble whose members reach each other through faultkit (their quorum and
    /// election ports), so that [`Cluster::cut_member`] can cut one off from its peers while
    /// its clients still reach it. The links run on the calling tokio runtime: it must keep
    /// running (a multi-threaded runtime, or one that is not blocked) while the ensemble serves.
    ///
    /// Cancel safety: a dropped start kills what it started.
    pub async fn ensemble_with_peer_links() -> Result<Self> {
        Self::launch(3, Duration::from_millis(200), true).await
    }

    /// `n` members (1: standalone) with this `tickTime`.
    ///
    /// Cancel safety: a dropped start kills what it started.
    pub async fn start(n: usize, tick: Duration) -> Result<Self> {
        Self::launch(n, tick, false).await
    }

    async fn launch(n: usize, tick: Duration, peer_links: bool) -> Result<Self> {
        let dir = TempDir::new("zk", false)?;
        let timeouts = Timeouts::scaled();
        let mut ports = Vec::new();
        for _ in 0..n {
            ports.push((free_port()?, free_port()?, free_port()?));
        }
        let peers = if peer_links && n > 1 {
            let real: Vec<Vec<u16>> = ports.iter().map(|&(_, q, e)| vec![q, e]).collect();
            Some(PeerLinks::start(&real, vec![None, Some(election_announce())]).await?)
        } else {
            None
        };
        // Member `me`'s view of the ensemble: its own peer ports (which it binds), the others'
        // fronts where there are links.
        let servers = |me: usize| -> String {
            if n == 1 {
                return String::new();
            }
            ports
                .iter()
                .enumerate()
                .map(|(i, &(_, q, e))| {
                    let (q, e) = match &peers {
                        Some(p) if i != me => (p.front(i, 0), p.front(i, 1)),
                        _ => (q, e),
                    };
                    format!("server.{}=127.0.0.1:{q}:{e}\n", i + 1)
                })
                .collect()
        };
        let mut members = Vec::new();
        for (i, (client, _, _)) in ports.iter().enumerate() {
            let servers = servers(i);
            let sub = dir.join(format!("zk{i}"));
            let data = sub.join("data");
            std::fs::create_dir_all(&data)?;
            std::fs::write(data.join("myid"), format!("{}\n", i + 1))?;
            let cfg = sub.join("zoo.cfg");
            std::fs::write(
                &cfg,
                format!(
                    "tickTime={}\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={client}\n\
                     clientPortAddress=127.0.0.1\nmaxClientCnxns=0\nadmin.enableServer=false\n\
                     4lw.commands.whitelist=srvr,mntr,ruok,stat,cons\nextendedTypesEnabled=true\n\
                     forceSync=no\n{servers}",
                    tick.as_millis(),
                    data.display()
                ),
            )?;
            let args = vec![
                "-Xmx256m".to_string(),
                "-Xms32m".into(),
                "-XX:+UseSerialGC".into(),
                "-XX:TieredStopAtLevel=1".into(),
                "-Djava.net.preferIPv4Stack=true".into(),
                "-Dzookeeper.admin.enableServer=false".into(),
                // An election that fails (a member cut off, a peer link reset) checks its votes
                // again after a backoff doubling from 200 ms up to 60 s by default: after a few
                // cuts the two healthy members of a test could take over a minute to elect
                // (seen in a full run). Capped at 2 s, an election still never spins.
                "-Dzookeeper.fastleader.maxNotificationInterval=2000".into(),
                "-cp".into(),
                CLASSPATH.into(),
                "org.apache.zookeeper.server.quorum.QuorumPeerMain".into(),
                cfg.to_string_lossy().into_owned(),
            ];
            members.push(Member::spawn(
                format!("zookeeper {i} :{client}"),
                "java",
                args,
                sub.join("zk.log"),
                *client,
                data,
            )?);
        }
        let cluster = Cluster::assemble(dir, timeouts, peers, members, PROBES).await?;
        Ok(ZooKeeper { cluster, tick })
    }

    /// `zk://127.0.0.1:p1,127.0.0.1:p2,...` (every member).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .client_ports()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!("zk://{}", hosts.join(","))
    }

    /// The `tickTime` (the minimum session timeout is twice it).
    pub fn tick(&self) -> Duration {
        self.tick
    }

    /// Kills member `i` (`-9`) and starts it again: with its data, or with an empty data dir
    /// (a single server then forgets every node; an ensemble member resyncs from the leader).
    /// Waits until it serves.
    ///
    /// Cancel safety: a dropped restart may leave the member stopped.
    pub async fn restart(&mut self, i: usize, keep_data: bool) -> Result<()> {
        self.restart_member(i, keep_data, |data| {
            for e in std::fs::read_dir(data)? {
                let p = e?.path();
                if p.file_name().is_some_and(|n| n != "myid") {
                    if p.is_dir() {
                        std::fs::remove_dir_all(&p)?;
                    } else {
                        std::fs::remove_file(&p)?;
                    }
                }
            }
            Ok(())
        })
        .await
    }
}

/// A member dialling a peer's election port announces its own election address (ZooKeeper
/// 3.6+), and a peer with a higher id drops that connection and dials back *to the announced
/// address*, the member's real port: around the links. The announcement is rewritten to the
/// member's front, so the dial-back passes the links too. The message: protocol version (i64,
/// -65536 or -65535), sid (i64), length (i32), `host:port[|host:port...]`.
fn election_announce() -> FirstRead {
    std::sync::Arc::new(|first: &[u8], real: &[u16], fronts: &[u16]| {
        let version = i64::from_be_bytes(first.get(..8)?.try_into().ok()?);
        if version != -65536 && version != -65535 {
            return None;
        }
        let len = usize::try_from(i32::from_be_bytes(first.get(16..20)?.try_into().ok()?)).ok()?;
        let addr = std::str::from_utf8(first.get(20..20 + len)?).ok()?;
        let (real, front) = (real.get(1)?.to_string(), fronts.get(1)?);
        let announced: Vec<String> = addr
            .split('|')
            .map(|a| match a.rsplit_once(':') {
                Some((host, port)) if port == real => format!("{host}:{front}"),
                _ => a.to_string(),
            })
            .collect();
        let announced = announced.join("|");
        let mut out = first[..16].to_vec();
        out.extend_from_slice(&(announced.len() as i32).to_be_bytes());
        out.extend_from_slice(announced.as_bytes());
        out.extend_from_slice(&first[20 + len..]);
        Some(out)
    })
}
