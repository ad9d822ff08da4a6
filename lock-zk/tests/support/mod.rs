//! Test helpers: a TCP proxy between a client and ZooKeeper that understands the protocol's
//! framing (4-byte length + payload), to play network faults:
//! * `pause`: connections reset, new ones refused (a partition the client notices at once, or
//!   a crashed process whose session must expire: closing the session would delete its
//!   ephemeral nodes at once);
//! * `blackhole`: connections stay open, nothing passes either way (the client notices only
//!   by its own read timeout);
//! * `answer_pings_only`: nothing passes, but the proxy answers the client's pings itself, as a
//!   follower cut off from the leader does (it keeps the client's connection alive while the
//!   leader, no longer hearing of the session, expires it).
//!
//! It also counts the client's requests (pings and syncs excluded).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, watch};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Forward,
    Reset,
    Blackhole,
    AnswerPings,
}

/// Forwards every connection to `upstream` until told otherwise.
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    requests: Arc<AtomicU64>,
}

const PING_XID: i32 = -2;
const PING_OP: i32 = 11;
const SYNC_OP: i32 = 9;

async fn read_frame(r: &mut (impl AsyncReadExt + Unpin)) -> std::io::Result<Vec<u8>> {
    let len = r.read_u32().await? as usize;
    let mut frame = vec![0; 4 + len];
    frame[..4].copy_from_slice(&(len as u32).to_be_bytes());
    r.read_exact(&mut frame[4..]).await?;
    Ok(frame)
}

fn is_ping(frame: &[u8]) -> bool {
    frame.len() >= 12
        && i32::from_be_bytes(frame[4..8].try_into().unwrap()) == PING_XID
        && i32::from_be_bytes(frame[8..12].try_into().unwrap()) == PING_OP
}

/// A `sync`: the backend's once-per-client heartbeat to the leader while it holds leases.
fn is_sync(frame: &[u8]) -> bool {
    frame.len() >= 12 && i32::from_be_bytes(frame[8..12].try_into().unwrap()) == SYNC_OP
}

fn ping_reply() -> Vec<u8> {
    let mut r = Vec::with_capacity(20);
    r.extend_from_slice(&16u32.to_be_bytes());
    r.extend_from_slice(&PING_XID.to_be_bytes());
    r.extend_from_slice(&0i64.to_be_bytes()); // zxid (the client ignores it on pings)
    r.extend_from_slice(&0i32.to_be_bytes()); // no error
    r
}

impl Proxy {
    /// Starts a proxy on an ephemeral loopback port (on the current runtime).
    pub async fn start(upstream: String) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, rx) = watch::channel(Mode::Forward);
        let requests = Arc::new(AtomicU64::new(0));
        let counter = requests.clone();
        tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let now = *rx.borrow();
                if now == Mode::Reset {
                    // The server is unreachable: the client sees the connection end.
                    drop(inbound);
                    continue;
                }
                let (upstream, rx, counter) = (upstream.clone(), rx.clone(), counter.clone());
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    serve(inbound, outbound, rx, counter).await;
                });
            }
        });
        Ok(Proxy {
            addr,
            mode,
            requests,
        })
    }

    /// `host:port` of the proxy.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cuts every connection and refuses new ones until [`Proxy::resume`].
    pub fn pause(&self) {
        self.mode.send_replace(Mode::Reset);
    }

    /// Keeps connections open but lets nothing through, either way.
    pub fn blackhole(&self) {
        self.mode.send_replace(Mode::Blackhole);
    }

    /// Lets nothing through but answers the client's pings (a follower cut off from the
    /// leader).
    pub fn answer_pings_only(&self) {
        self.mode.send_replace(Mode::AnswerPings);
    }

    /// Forwards again (new connections; a blackholed connection carries on).
    pub fn resume(&self) {
        self.mode.send_replace(Mode::Forward);
    }

    /// Requests the client sent through the proxy (pings, syncs and the connect request
    /// excluded: a sync is the backend's per-client heartbeat to the leader).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

async fn serve(
    inbound: TcpStream,
    outbound: TcpStream,
    mut mode: watch::Receiver<Mode>,
    counter: Arc<AtomicU64>,
) {
    let (mut client_r, client_w) = inbound.into_split();
    let (mut server_r, mut server_w) = outbound.into_split();
    let client_w = Arc::new(Mutex::new(client_w));
    let up = {
        let (client_w, mode) = (client_w.clone(), mode.clone());
        async move {
            let mut first = true;
            loop {
                let frame = read_frame(&mut client_r).await?;
                let ping = !first && is_ping(&frame);
                if !first && !ping && !is_sync(&frame) {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
                first = false;
                let now = *mode.borrow();
                match now {
                    Mode::Forward => server_w.write_all(&frame).await?,
                    Mode::AnswerPings if ping => {
                        client_w.lock().await.write_all(&ping_reply()).await?
                    }
                    _ => {}
                }
            }
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        }
    };
    let down = {
        let (client_w, mode) = (client_w.clone(), mode.clone());
        async move {
            loop {
                let frame = read_frame(&mut server_r).await?;
                let now = *mode.borrow();
                if now == Mode::Forward {
                    client_w.lock().await.write_all(&frame).await?;
                }
            }
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = mode.wait_for(|m| *m == Mode::Reset) => {}
    }
}

/// Splits a `zk://` URL into (first host:port, the rest after the host list).
pub fn split_url(url: &str) -> (String, String) {
    let rest = url.strip_prefix("zk://").expect("a zk:// URL");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let first = rest[..end].split(',').next().unwrap().to_owned();
    (first, rest[end..].to_owned())
}

/// `url` pointed at `addr` instead of its hosts.
pub fn via(url: &str, addr: SocketAddr) -> String {
    let (_, tail) = split_url(url);
    format!("zk://{addr}{tail}")
}

/// `url` with `param` added to its query.
pub fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}
