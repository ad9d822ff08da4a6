//! ZooKeeper 3.8 (Debian, java): a single server or a 3-node ensemble on loopback.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::process::ServerProcess;
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

#[derive(Debug)]
struct Member {
    client_port: u16,
    data: PathBuf,
    process: ServerProcess,
}

/// A ZooKeeper server or ensemble (`tickTime` 200 ms by default, so the minimum session timeout
/// is 400 ms; `java -Xmx256m`). Members are numbered from 0.
#[derive(Debug)]
pub struct ZooKeeper {
    members: Vec<Member>,
    timeouts: Timeouts,
    tick: Duration,
    _dir: TempDir,
}

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

    /// `n` members (1: standalone) with this `tickTime`.
    ///
    /// Cancel safety: a dropped start kills what it started.
    pub async fn start(n: usize, tick: Duration) -> Result<Self> {
        let dir = TempDir::new("zk", false)?;
        let timeouts = Timeouts::scaled();
        let mut ports = Vec::new();
        for _ in 0..n {
            ports.push((free_port()?, free_port()?, free_port()?));
        }
        let servers: String = if n > 1 {
            ports
                .iter()
                .enumerate()
                .map(|(i, (_, q, e))| format!("server.{}=127.0.0.1:{q}:{e}\n", i + 1))
                .collect()
        } else {
            String::new()
        };
        let mut members = Vec::new();
        for (i, (client, _, _)) in ports.iter().enumerate() {
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
                "-cp".into(),
                CLASSPATH.into(),
                "org.apache.zookeeper.server.quorum.QuorumPeerMain".into(),
                cfg.to_string_lossy().into_owned(),
            ];
            let process = ServerProcess::spawn(
                format!("zookeeper {i} :{client}"),
                "java",
                args,
                sub.join("zk.log"),
            )?;
            members.push(Member {
                client_port: *client,
                data,
                process,
            });
        }
        let mut zk = ZooKeeper {
            members,
            timeouts,
            tick,
            _dir: dir,
        };
        for i in 0..n {
            zk.wait_member(i).await?;
        }
        Ok(zk)
    }

    async fn wait_member(&mut self, i: usize) -> Result<()> {
        let t = self.timeouts.start;
        let m = &mut self.members[i];
        let port = m.client_port;
        m.process
            .wait_ready("srvr Mode:", t, || async move {
                Ok(mode(port).await?.is_some())
            })
            .await
    }

    /// `zk://127.0.0.1:p1,127.0.0.1:p2,...` (every member).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        format!("zk://{}", hosts.join(","))
    }

    /// Member `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Never: there is at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The `tickTime` (the minimum session timeout is twice it).
    pub fn tick(&self) -> Duration {
        self.tick
    }

    /// Member `i`'s process, to kill, pause or resume it.
    pub fn member(&mut self, i: usize) -> &mut ServerProcess {
        &mut self.members[i].process
    }

    /// The member that says `Mode: leader` (or `standalone`) now.
    ///
    /// Cancel safe.
    pub async fn leader(&self) -> Result<usize> {
        for (i, m) in self.members.iter().enumerate() {
            if let Ok(Some(mode)) = mode(m.client_port).await
                && (mode == "leader" || mode == "standalone")
            {
                return Ok(i);
            }
        }
        Err(Error::msg("no zookeeper member says it leads"))
    }

    /// Waits until a member other than `old` leads; returns it.
    ///
    /// Cancel safe.
    pub async fn wait_new_leader(&self, old: usize, timeout: Duration) -> Result<usize> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(new) = self.leader().await.ok()
                && new != old
            {
                return Ok(new);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(crate::Error::msg(format!(
                    "new zookeeper leader: none after {timeout:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills member `i` (`-9`) and starts it again: with its data, or with an empty data dir
    /// (a single server then forgets every node; an ensemble member resyncs from the leader).
    /// Waits until it serves.
    ///
    /// Cancel safety: a dropped restart may leave the member stopped.
    pub async fn restart(&mut self, i: usize, keep_data: bool) -> Result<()> {
        self.members[i].process.kill();
        if !keep_data {
            let data = self.members[i].data.clone();
            for e in std::fs::read_dir(&data)? {
                let p = e?.path();
                if p.file_name().is_some_and(|n| n != "myid") {
                    if p.is_dir() {
                        std::fs::remove_dir_all(&p)?;
                    } else {
                        std::fs::remove_file(&p)?;
                    }
                }
            }
        }
        self.members[i].process.respawn()?;
        self.wait_member(i).await
    }
}
