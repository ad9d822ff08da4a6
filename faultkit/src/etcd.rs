//! etcd 3.4 (Debian): a single node or a 3-member cluster on loopback, data on tmpfs.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::peer_links::PeerLinks;
use crate::process::ServerProcess;
use crate::util::{Error, Result, TempDir, Timeouts, free_port};

/// `GET path` over HTTP/1.0 on 127.0.0.1:port; the body.
async fn http_get(port: u16, path: &str) -> Result<String> {
    let f = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    let out = tokio::time::timeout(Duration::from_secs(2), f)
        .await
        .map_err(|_| Error::msg(format!("etcd :{port} GET {path}: no answer")))??;
    Ok(out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}

#[derive(Debug)]
struct Member {
    client_port: u16,
    data: PathBuf,
    process: ServerProcess,
}

/// An etcd node or cluster (`--heartbeat-interval 50 --election-timeout 500`). Members are
/// numbered from 0 and listen on 127.0.0.1 with distinct ports.
#[derive(Debug)]
pub struct Etcd {
    members: Vec<Member>,
    timeouts: Timeouts,
    peers: Option<PeerLinks>,
    _dir: TempDir,
}

impl Etcd {
    /// One node.
    ///
    /// Cancel safety: a dropped start kills what it started.
    pub async fn single() -> Result<Self> {
        Self::start(1).await
    }

    /// A 3-member cluster; returns once every member reports healthy.
    ///
    /// Cancel safety: a dropped start kills what it started.
    pub async fn cluster() -> Result<Self> {
        Self::start(3).await
    }

    /// A 3-member cluster whose members reach each other through faultkit (their peer ports), so
    /// that [`Etcd::cut_member`] can cut one off from its peers while its clients still reach
    /// it. The links run on the calling tokio runtime: it must keep running (a multi-threaded
    /// runtime, or one that is not blocked) while the cluster serves.
    ///
    /// Cancel safety: a dropped start kills what it started.
    pub async fn cluster_with_peer_links() -> Result<Self> {
        Self::launch(3, true).await
    }

    /// `n` members.
    ///
    /// Cancel safety: a dropped start kills what it started.
    pub async fn start(n: usize) -> Result<Self> {
        Self::launch(n, false).await
    }

    async fn launch(n: usize, peer_links: bool) -> Result<Self> {
        let dir = TempDir::new("etcd", true)?;
        let timeouts = Timeouts::scaled();
        let mut ports = Vec::new();
        for _ in 0..n {
            ports.push((free_port()?, free_port()?));
        }
        let peers = if peer_links && n > 1 {
            let real: Vec<Vec<u16>> = ports.iter().map(|&(_, p)| vec![p]).collect();
            Some(PeerLinks::start(&real, vec![None]).await?)
        } else {
            None
        };
        // What the members advertise (and the cluster lists): the fronts where there are links.
        let advertised = |i: usize| match &peers {
            Some(p) => p.front(i, 0),
            None => ports[i].1,
        };
        let cluster: Vec<String> = (0..n)
            .map(|i| format!("m{i}=http://127.0.0.1:{}", advertised(i)))
            .collect();
        let cluster = cluster.join(",");
        let token = format!("faultkit-{:x}", fastrand::u64(..));
        let mut members = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let data = dir.join(format!("m{i}"));
            let c = format!("http://127.0.0.1:{client}");
            let p = format!("http://127.0.0.1:{peer}");
            let advertise = format!("http://127.0.0.1:{}", advertised(i));
            let args: Vec<String> = [
                "--name",
                &format!("m{i}"),
                "--data-dir",
                &data.to_string_lossy(),
                "--listen-client-urls",
                &c,
                "--advertise-client-urls",
                &c,
                "--listen-peer-urls",
                &p,
                "--initial-advertise-peer-urls",
                &advertise,
                "--initial-cluster",
                &cluster,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                &token,
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                "500",
                "--logger",
                "zap",
                "--log-outputs",
                "stderr",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let process = ServerProcess::spawn(
                format!("etcd m{i} :{client}"),
                "etcd",
                args,
                dir.join(format!("m{i}.log")),
            )?;
            members.push(Member {
                client_port: *client,
                data,
                process,
            });
        }
        if let Some(p) = &peers {
            p.attach(members.iter().map(|m| m.process.pid_cell()).collect());
        }
        let mut e = Etcd {
            members,
            timeouts,
            peers,
            _dir: dir,
        };
        for i in 0..n {
            e.wait_member(i).await?;
        }
        Ok(e)
    }

    /// Waits (with the start timeout) until member `i` reports healthy: after a
    /// `member(i).respawn()`, once a quorum of members runs.
    ///
    /// Cancel safe.
    pub async fn wait_healthy(&mut self, i: usize) -> Result<()> {
        self.wait_member(i).await
    }

    async fn wait_member(&mut self, i: usize) -> Result<()> {
        let t = self.timeouts.start;
        let m = &mut self.members[i];
        let port = m.client_port;
        m.process
            .wait_ready("/health", t, || async move {
                Ok(http_get(port, "/health")
                    .await?
                    .contains("\"health\":\"true\""))
            })
            .await
    }

    /// `http://127.0.0.1:p1,http://127.0.0.1:p2,...`: every member's client URL, comma-separated
    /// (the form the etcd backend's URL takes them in may differ: see [`Etcd::client_urls`]).
    pub fn url(&self) -> String {
        self.client_urls().join(",")
    }

    /// Each member's client URL (`http://127.0.0.1:PORT`).
    pub fn client_urls(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect()
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

    /// Cuts member `i` off from its peers: nothing passes between it and the other members (its
    /// peer port and theirs, both ways; held like dropped packets) while its clients still reach
    /// its client port. It loses its leader within an election timeout (500 ms) and, as a
    /// follower without a leader, answers no linearizable request; the others elect a leader
    /// among themselves if it led. An error unless the cluster was started with
    /// [`Etcd::cluster_with_peer_links`].
    pub fn cut_member(&self, i: usize) -> Result<()> {
        self.links()?.set_cut(i, true);
        Ok(())
    }

    /// Ends [`Etcd::cut_member`]: member `i` reaches its peers again (held traffic is
    /// delivered) and catches up.
    pub fn heal_member(&self, i: usize) -> Result<()> {
        self.links()?.set_cut(i, false);
        Ok(())
    }

    /// Whether member `i` is cut off from its peers now.
    pub fn is_cut(&self, i: usize) -> bool {
        self.peers.as_ref().is_some_and(|p| p.is_cut(i))
    }

    /// Whether member `i` knows a leader now (`etcd_server_has_leader 1` in its metrics, served
    /// on its client port).
    ///
    /// Cancel safe.
    pub async fn has_leader(&self, i: usize) -> Result<bool> {
        let metrics = http_get(self.members[i].client_port, "/metrics").await?;
        Ok(metrics
            .lines()
            .any(|l| l.trim() == "etcd_server_has_leader 1"))
    }

    fn links(&self) -> Result<&PeerLinks> {
        self.peers.as_ref().ok_or_else(|| {
            Error::msg("this cluster's members reach each other directly: start it with Etcd::cluster_with_peer_links to cut one off")
        })
    }

    /// Member `i`'s process, to kill, pause or resume it.
    pub fn member(&mut self, i: usize) -> &mut ServerProcess {
        &mut self.members[i].process
    }

    /// The member whose metrics say `etcd_server_is_leader 1`.
    ///
    /// Cancel safe.
    pub async fn leader(&self) -> Result<usize> {
        for (i, m) in self.members.iter().enumerate() {
            if let Ok(metrics) = http_get(m.client_port, "/metrics").await
                && metrics
                    .lines()
                    .any(|l| l.trim() == "etcd_server_is_leader 1")
            {
                return Ok(i);
            }
        }
        Err(Error::msg("no etcd member says it leads"))
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
                    "new etcd leader: none after {timeout:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills every member (`-9`) at once and starts them all again with their data, waiting
    /// until each is healthy (a member reports healthy only once a quorum is back, so they are
    /// all started before any is waited for).
    ///
    /// Cancel safety: a dropped restart may leave members stopped.
    pub async fn restart_all(&mut self) -> Result<()> {
        for m in &mut self.members {
            m.process.kill();
        }
        for m in &mut self.members {
            m.process.respawn()?;
        }
        for i in 0..self.members.len() {
            self.wait_member(i).await?;
        }
        Ok(())
    }

    /// Kills member `i` (`-9`) and starts it again, waiting until it is healthy. Without its
    /// data (`keep_data == false`) only a single node can restart (it starts as a new, empty
    /// cluster); a cluster member would need a member remove/add, which this does not do.
    ///
    /// Cancel safety: a dropped restart may leave the member stopped.
    pub async fn restart(&mut self, i: usize, keep_data: bool) -> Result<()> {
        if !keep_data && self.members.len() > 1 {
            return Err(Error::msg(
                "an etcd cluster member cannot rejoin without its data (needs member remove/add)",
            ));
        }
        self.members[i].process.kill();
        if !keep_data {
            std::fs::remove_dir_all(&self.members[i].data)?;
        }
        self.members[i].process.respawn()?;
        self.wait_member(i).await
    }
}
