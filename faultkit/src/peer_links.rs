//! The peer traffic of a cluster (ZooKeeper's quorum and election ports, etcd's peer port)
//! routed through faultkit, so that one member can be cut off from its peers while clients still
//! reach its client port: the partial partition in which a client's session, watch or stream sits
//! on a member that has lost the quorum.
//!
//! Every member's peer ports get a *front*: a listener of faultkit that forwards to the member's
//! real port, and the cluster's configuration names the fronts as the members' peer addresses, so
//! every connection between two members passes one front. Whose a connection is matters too: a
//! member cut off must neither be reached (its fronts hold its traffic) nor reach the others
//! through their fronts. The dialling member is found from `/proc` (the process that owns the
//! connection's source socket), which needs no privilege: the servers are this process's
//! children. A cut holds the bytes (like an iptables `DROP`): connections stay open, nothing
//! passes either way, new connections are accepted and reach nobody; a heal delivers what was
//! held, as TCP retransmission would.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::util::{Error, Result, free_port};

/// Rewrites the first read of a connection from a member (what the member announces about
/// itself when it dials a peer), given the dialling member's real peer ports and their fronts;
/// `None` keeps it.
pub(crate) type FirstRead = Arc<dyn Fn(&[u8], &[u16], &[u16]) -> Option<Vec<u8>> + Send + Sync>;

struct Shared {
    /// `real[member][port]`.
    real: Vec<Vec<u16>>,
    /// `fronts[member][port]`, once all are bound.
    fronts: OnceLock<Vec<Vec<u16>>>,
    /// Which members are cut off.
    cut: watch::Sender<Vec<bool>>,
    /// Each member's process id, current across respawns (set once the members were spawned;
    /// a connection accepted before waits for it, so that its dialler is known).
    pids: watch::Sender<Option<Vec<Arc<AtomicU32>>>>,
}

/// The fronts of every member's peer ports, and the switch that cuts a member off.
pub(crate) struct PeerLinks {
    /// `fronts[member][port]`: the port the cluster's configuration names for that peer port.
    fronts: Vec<Vec<u16>>,
    shared: Arc<Shared>,
    accept: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for PeerLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerLinks")
            .field("fronts", &self.fronts)
            .field("cut", &*self.shared.cut.borrow())
            .finish()
    }
}

impl PeerLinks {
    /// Fronts for `real[member][port]` (each member's real peer ports), on free ports of
    /// 127.0.0.1. `first_read[port]` may rewrite what a dialling member first sends to that
    /// kind of port. Must be called inside a tokio runtime: the fronts run on it.
    pub(crate) async fn start(
        real: &[Vec<u16>],
        first_read: Vec<Option<FirstRead>>,
    ) -> Result<Self> {
        let shared = Arc::new(Shared {
            real: real.to_vec(),
            fronts: OnceLock::new(),
            cut: watch::channel(vec![false; real.len()]).0,
            pids: watch::channel(None).0,
        });
        let mut fronts = Vec::new();
        let mut accept = Vec::new();
        for (member, ports) in real.iter().enumerate() {
            let mut mine = Vec::new();
            for (k, &port) in ports.iter().enumerate() {
                let listener = bind_free().await?;
                mine.push(listener.local_addr()?.port());
                let upstream: SocketAddr = ([127, 0, 0, 1], port).into();
                let rewrite = first_read.get(k).cloned().flatten();
                accept.push(tokio::spawn(accept_loop(
                    listener,
                    member,
                    upstream,
                    shared.clone(),
                    rewrite,
                )));
            }
            fronts.push(mine);
        }
        let _ = shared.fronts.set(fronts.clone());
        Ok(PeerLinks {
            fronts,
            shared,
            accept,
        })
    }

    /// The front of member `member`'s peer port number `port` (in the order given to `start`).
    pub(crate) fn front(&self, member: usize, port: usize) -> u16 {
        self.fronts[member][port]
    }

    /// Tells the links each member's process (once they were spawned).
    pub(crate) fn attach(&self, pids: Vec<Arc<AtomicU32>>) {
        self.shared.pids.send_replace(Some(pids));
    }

    /// Cuts member `i` off from its peers (or heals it).
    pub(crate) fn set_cut(&self, i: usize, cut: bool) {
        self.shared.cut.send_modify(|c| c[i] = cut);
    }

    /// Whether member `i` is cut off.
    pub(crate) fn is_cut(&self, i: usize) -> bool {
        self.shared.cut.borrow()[i]
    }
}

impl Drop for PeerLinks {
    fn drop(&mut self) {
        // Each accept task owns its connections: aborting it ends them.
        for a in &self.accept {
            a.abort();
        }
    }
}

async fn bind_free() -> Result<TcpListener> {
    for _ in 0..20 {
        if let Ok(l) = TcpListener::bind(("127.0.0.1", free_port()?)).await {
            return Ok(l);
        }
    }
    Err(Error::msg("no free port for a peer front"))
}

async fn accept_loop(
    listener: TcpListener,
    target: usize,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    rewrite: Option<FirstRead>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((inbound, _)) = accepted {
                    conns.spawn(link(inbound, target, upstream, shared.clone(), rewrite.clone()));
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// One connection from a member (or anyone) to member `target`'s peer port.
async fn link(
    inbound: TcpStream,
    target: usize,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    rewrite: Option<FirstRead>,
) {
    let _ = inbound.set_nodelay(true);
    let (Ok(from), Ok(front)) = (inbound.peer_addr(), inbound.local_addr()) else {
        return;
    };
    let pids: Vec<u32> = {
        let mut rx = shared.pids.subscribe();
        let Ok(attached) = rx.wait_for(|p| p.is_some()).await else {
            return;
        };
        attached
            .iter()
            .flatten()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    };
    let dialer = tokio::task::spawn_blocking(move || dialler(from.port(), front.port(), &pids))
        .await
        .ok()
        .flatten();
    let blocked = move |cut: &Vec<bool>| cut[target] || dialer.is_some_and(|d| cut[d]);
    let mut rx = shared.cut.subscribe();
    // Nothing reaches a cut member, not even a connection attempt.
    if rx.wait_for(|c| !blocked(c)).await.is_err() {
        return;
    }
    let Ok(outbound) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    let (ir, iw) = inbound.into_split();
    let (or, ow) = outbound.into_split();
    // The announcement names the dialler's real peer ports, which its peer may dial back
    // (ZooKeeper does, when the dialler's id is the lower): rewritten to its fronts, or that
    // connection would bypass them and no cut could hold it. A dialler not found in /proc
    // (its socket already closed: ZooKeeper drops the connection it will redial) is looked for
    // among every member's ports.
    let rewrite = rewrite.map(|f| {
        let fronts = shared.fronts.get().cloned().unwrap_or_default();
        let members: Vec<MemberPorts> = (0..shared.real.len())
            .filter(|m| dialer.is_none_or(|d| d == *m))
            .filter_map(|m| Some((shared.real[m].clone(), fronts.get(m)?.clone())))
            .collect();
        (f, members)
    });
    tokio::join!(
        pump(ir, ow, rx.clone(), blocked, rewrite),
        pump(or, iw, rx, blocked, None)
    );
}

/// A member's real peer ports and their fronts, in the same order.
type MemberPorts = (Vec<u16>, Vec<u16>);

/// Copies one direction, holding each chunk while the link is cut.
async fn pump(
    mut r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    mut rx: watch::Receiver<Vec<bool>>,
    blocked: impl Fn(&Vec<bool>) -> bool,
    mut rewrite: Option<(FirstRead, Vec<MemberPorts>)>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let rewritten = rewrite.take().and_then(|(f, members)| {
            members.iter().find_map(|(real, fronts)| {
                f(&buf[..n], real, fronts).filter(|out| out.as_slice() != &buf[..n])
            })
        });
        let chunk = rewritten.as_deref().unwrap_or(&buf[..n]);
        if rx.wait_for(|c| !blocked(c)).await.is_err() || w.write_all(chunk).await.is_err() {
            return;
        }
    }
    // The end of the stream passes only when the link does, as a FIN would (a cut member's
    // peer learns of a closed connection by its own timeout, not by a goodbye). The other
    // direction may go on (a half-closed connection).
    if rx.wait_for(|c| !blocked(c)).await.is_ok() {
        let _ = w.shutdown().await;
    }
}

/// Which of the processes `pids` (by index) owns the socket connected from 127.0.0.1:`from`
/// to the front on port `front`: the member that dialled.
fn dialler(from: u16, front: u16, pids: &[u32]) -> Option<usize> {
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(t).ok())
        .find_map(|table| socket_inode(&table, from, front))?;
    let wanted = format!("socket:[{inode}]");
    pids.iter().position(|&pid| {
        pid != 0
            && std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == wanted.as_str())
                })
            })
    })
}

/// The inode of the socket whose local port is `local` and remote port `remote`, from a
/// `/proc/net/tcp{,6}` table (`sl local_address rem_address st ... uid timeout inode`, ports in
/// hex after the last `:`).
fn socket_inode(table: &str, local: u16, remote: u16) -> Option<u64> {
    let port = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 9 && port(f[1]) == Some(local) && port(f[2]) == Some(remote))
            .then(|| f[9].parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn socket_inode_reads_the_ports_in_hex() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:F230 0100007F:EE48 01 00000000:00000000 00:00000000 00000000     0        0 123456 1 0000000000000000 20 4 30 10 -1\n";
        assert_eq!(super::socket_inode(table, 0xF230, 0xEE48), Some(123456));
        assert_eq!(super::socket_inode(table, 0xEE48, 0xF230), None);
    }
}
