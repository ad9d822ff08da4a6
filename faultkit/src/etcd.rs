//! etcd 3.4 (Debian): a single node or a 3-member cluster on loopback, data on tmpfs.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cluster::{Cluster, Member, Probes};
use crate::peer_links::PeerLinks;
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

/// How an etcd member says it serves (`/health`) and leads (its metrics).
const PROBES: Probes = Probes {
    server: "etcd",
    ready_what: "/health",
    ready: |port| {
        Box::pin(async move {
            Ok(http_get(port, "/health")
                .await?
                .contains("\"health\":\"true\""))
        })
    },
    leads: |port| {
        Box::pin(async move {
            let metrics = http_get(port, "/metrics").await?;
            Ok(metrics
                .lines()
                .any(|l| l.trim() == "etcd_server_is_leader 1"))
        })
    },
};

/// An etcd node or cluster (`--heartbeat-interval 50 --election-timeout 500`). Members are
/// numbered from 0 and listen on 127.0.0.1 with distinct ports. What every member set does
/// (ports, cuts, kills, leaders, restarts) comes from [`Cluster`], which it dereferences to.
#[derive(Debug)]
pub struct Etcd {
    cluster: Cluster,
}

derefs_to!(Etcd, cluster: Cluster);

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
    /// that [`Cluster::cut_member`] can cut one off from its peers while its clients still reach
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
            members.push(Member::spawn(
                format!("etcd m{i} :{client}"),
                "etcd",
                args,
                dir.join(format!("m{i}.log")),
                *client,
                data,
            )?);
        }
        let cluster = Cluster::assemble(dir, timeouts, peers, members, PROBES).await?;
        Ok(Etcd { cluster })
    }

    /// `http://127.0.0.1:p1,http://127.0.0.1:p2,...`: every member's client URL, comma-separated
    /// (the form the etcd backend's URL takes them in may differ: see [`Etcd::client_urls`]).
    pub fn url(&self) -> String {
        self.client_urls().join(",")
    }

    /// Each member's client URL (`http://127.0.0.1:PORT`).
    pub fn client_urls(&self) -> Vec<String> {
        self.client_ports()
            .map(|port| format!("http://127.0.0.1:{port}"))
            .collect()
    }

    /// Whether member `i` knows a leader now (`etcd_server_has_leader 1` in its metrics, served
    /// on its client port).
    ///
    /// Cancel safe.
    pub async fn has_leader(&self, i: usize) -> Result<bool> {
        let metrics = http_get(self.client_port(i), "/metrics").await?;
        Ok(metrics
            .lines()
            .any(|l| l.trim() == "etcd_server_has_leader 1"))
    }

    /// Kills member `i` (`-9`) and starts it again, waiting until it is healthy. Without its
    /// data (`keep_data == false`) only a single node can restart (it starts as a new, empty
    /// cluster); a cluster member would need a member remove/add, which this does not do.
    ///
    /// Cancel safety: a dropped restart may leave the member stopped.
    pub async fn restart(&mut self, i: usize, keep_data: bool) -> Result<()> {
        if !keep_data && self.len() > 1 {
            return Err(Error::msg(
                "an etcd cluster member cannot rejoin without its data (needs member remove/add)",
            ));
        }
        self.restart_member(i, keep_data, |data| Ok(std::fs::remove_dir_all(data)?))
            .await
    }
}
