//! The engine the replicated-server launchers ([`Etcd`](crate::Etcd),
//! [`ZooKeeper`](crate::ZooKeeper)) share: members on loopback client ports, started, waited
//! for, cut off from their peers, killed and restarted alike. Each launcher gives only its
//! command lines and how a member says it serves and leads ([`Probes`]).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use crate::peer_links::PeerLinks;
use crate::process::ServerProcess;
use crate::util::{Error, Result, TempDir, Timeouts, wait_for_other};

/// An answer about the member listening on a client port.
pub(crate) type PortCheck = fn(u16) -> Pin<Box<dyn Future<Output = Result<bool>> + Send>>;

/// How a server kind says what the engine asks of its members.
#[derive(Clone, Copy)]
pub(crate) struct Probes {
    /// The server's name in messages (`etcd`, `zookeeper`).
    pub(crate) server: &'static str,
    /// What `ready` checks, for the start error (`/health`).
    pub(crate) ready_what: &'static str,
    /// Whether the member serves.
    pub(crate) ready: PortCheck,
    /// Whether the member leads now.
    pub(crate) leads: PortCheck,
}

impl std::fmt::Debug for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probes")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// One started member.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) client_port: u16,
    pub(crate) data: PathBuf,
    pub(crate) process: ServerProcess,
}

impl Member {
    /// Starts `program args` (logging to `log`) as the member serving on `client_port` with
    /// its data in `data`.
    pub(crate) fn spawn(
        label: String,
        program: &str,
        args: Vec<String>,
        log: PathBuf,
        client_port: u16,
        data: PathBuf,
    ) -> Result<Member> {
        Ok(Member {
            client_port,
            data,
            process: ServerProcess::spawn(label, program, args, log)?,
        })
    }
}

/// The members of one etcd cluster or ZooKeeper ensemble (one member for a single server),
/// numbered from 0, each listening on 127.0.0.1 with its own client port. [`Etcd`](crate::Etcd)
/// and [`ZooKeeper`](crate::ZooKeeper) dereference to it.
#[derive(Debug)]
pub struct Cluster {
    members: Vec<Member>,
    timeouts: Timeouts,
    peers: Option<PeerLinks>,
    probes: Probes,
    _dir: TempDir,
}

impl Cluster {
    /// Takes over started members (their peer links, if any, attached to them) and waits until
    /// each serves.
    ///
    /// Cancel safety: a dropped start kills what it started (the members die with `Cluster`).
    pub(crate) async fn assemble(
        dir: TempDir,
        timeouts: Timeouts,
        peers: Option<PeerLinks>,
        members: Vec<Member>,
        probes: Probes,
    ) -> Result<Self> {
        if let Some(p) = &peers {
            p.attach(members.iter().map(|m| m.process.pid_cell()).collect());
        }
        let mut cluster = Cluster {
            members,
            timeouts,
            peers,
            probes,
            _dir: dir,
        };
        for i in 0..cluster.len() {
            cluster.wait_healthy(i).await?;
        }
        Ok(cluster)
    }

    /// The members' client ports.
    pub(crate) fn client_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.members.iter().map(|m| m.client_port)
    }

    /// Waits (with the start timeout) until member `i` serves: after a `member(i).respawn()`,
    /// once a quorum of members runs.
    ///
    /// Cancel safe.
    pub async fn wait_healthy(&mut self, i: usize) -> Result<()> {
        let t = self.timeouts.start;
        let Probes {
            ready, ready_what, ..
        } = self.probes;
        let m = &mut self.members[i];
        let port = m.client_port;
        m.process.wait_ready(ready_what, t, || ready(port)).await
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

    /// Cuts member `i` off from its peers: nothing passes between it and the other members
    /// (their peer ports, both ways; held like dropped packets) while its clients still reach
    /// its client port. An error unless the members were started with peer links
    /// ([`Etcd::cluster_with_peer_links`](crate::Etcd::cluster_with_peer_links),
    /// [`ZooKeeper::ensemble_with_peer_links`](crate::ZooKeeper::ensemble_with_peer_links)).
    pub fn cut_member(&self, i: usize) -> Result<()> {
        self.links()?.set_cut(i, true);
        Ok(())
    }

    /// Ends [`Cluster::cut_member`]: member `i` reaches its peers again (held traffic is
    /// delivered) and catches up.
    pub fn heal_member(&self, i: usize) -> Result<()> {
        self.links()?.set_cut(i, false);
        Ok(())
    }

    /// Whether member `i` is cut off from its peers now.
    pub fn is_cut(&self, i: usize) -> bool {
        self.peers.as_ref().is_some_and(|p| p.is_cut(i))
    }

    fn links(&self) -> Result<&PeerLinks> {
        self.peers.as_ref().ok_or_else(|| {
            Error::msg(format!(
                "these {} members reach each other directly: start them with peer links to cut one off",
                self.probes.server
            ))
        })
    }

    /// Member `i`'s process, to kill, pause or resume it.
    pub fn member(&mut self, i: usize) -> &mut ServerProcess {
        &mut self.members[i].process
    }

    /// The member that says it leads now (a standalone server leads).
    ///
    /// Cancel safe.
    pub async fn leader(&self) -> Result<usize> {
        for (i, m) in self.members.iter().enumerate() {
            if let Ok(true) = (self.probes.leads)(m.client_port).await {
                return Ok(i);
            }
        }
        Err(Error::msg(format!(
            "no {} member says it leads",
            self.probes.server
        )))
    }

    /// Waits until a member other than `old` leads; returns it.
    ///
    /// Cancel safe.
    pub async fn wait_new_leader(&self, old: usize, timeout: Duration) -> Result<usize> {
        let what = format!("new {} leader", self.probes.server);
        wait_for_other(&what, old, timeout, || self.leader()).await
    }

    /// Kills every member (`-9`) at once and starts them all again with their data, waiting
    /// until each serves (a member serves only once a quorum is back, so they are all started
    /// before any is waited for).
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
            self.wait_healthy(i).await?;
        }
        Ok(())
    }

    /// Kills member `i` (`-9`), runs `forget` on its data directory unless `keep_data`, starts
    /// it again and waits until it serves.
    ///
    /// Cancel safety: a dropped restart may leave the member stopped.
    pub(crate) async fn restart_member(
        &mut self,
        i: usize,
        keep_data: bool,
        forget: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<()> {
        self.members[i].process.kill();
        if !keep_data {
            forget(&self.members[i].data)?;
        }
        self.members[i].process.respawn()?;
        self.wait_healthy(i).await
    }
}
