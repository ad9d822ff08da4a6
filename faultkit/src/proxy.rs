//! A TCP proxy between a client and a server, whose mode switches at run time.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::util::Result;

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forwards bytes (after the configured latency, if any).
    Pass,
    /// Accepts connections and bytes but delivers nothing, in either direction, until the mode
    /// changes; then delivers what it held, in order, as TCP retransmission would after a
    /// network partition heals (like an iptables `DROP`).
    Blackhole,
    /// Resets every open connection (TCP RST to both ends) and resets new ones at once, until
    /// the mode changes (like an iptables `REJECT --reject-with tcp-reset`).
    Reset,
}

/// A direction of traffic through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Requests: client to server.
    ToServer,
    /// Replies: server to client.
    ToClient,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Settings {
    mode: ProxyMode,
    to_server: Duration,
    to_client: Duration,
}

impl Settings {
    fn latency(&self, d: Direction) -> Duration {
        match d {
            Direction::ToServer => self.to_server,
            Direction::ToClient => self.to_client,
        }
    }
}

struct Shared {
    upstream: Mutex<SocketAddr>,
    settings: watch::Sender<Settings>,
}

/// A TCP proxy on a free port of 127.0.0.1 forwarding to an upstream server. Dropping it closes
/// every connection through it.
///
/// ```no_run
/// # async fn demo() -> faultkit::Result<()> {
/// use std::time::Duration;
/// use faultkit::{Direction, Proxy, ProxyMode};
/// let proxy = Proxy::start("127.0.0.1:6379".parse().unwrap()).await?;
/// let url = faultkit::rewrite_url("redis://127.0.0.1:6379", 6379, proxy.port());
/// proxy.set_latency(Direction::ToClient, Duration::from_millis(300)); // slow replies
/// proxy.set_mode(ProxyMode::Blackhole);                                // cut off
/// proxy.set_mode(ProxyMode::Pass);                                     // healed
/// # Ok(()) }
/// ```
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream())
            .field("settings", &*self.shared.settings.borrow())
            .finish()
    }
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`, in [`ProxyMode::Pass`]
    /// without latency. Must be called inside a tokio runtime; the proxy runs on it.
    ///
    /// Cancel safe.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (settings, _) = watch::channel(Settings {
            mode: ProxyMode::Pass,
            to_server: Duration::ZERO,
            to_client: Duration::ZERO,
        });
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            settings,
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Proxy {
            addr,
            shared,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The server new connections go to.
    pub fn upstream(&self) -> SocketAddr {
        *self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Points new connections at another server (a failover's new primary, as a moved virtual
    /// IP would). Open connections keep their server; reset them to move them.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = upstream;
    }

    /// Switches the mode for every connection, open or new.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.shared.settings.send_modify(|s| s.mode = mode);
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        self.shared.settings.borrow().mode
    }

    /// Delays every chunk going in `direction` by `latency` (counted from when the proxy read
    /// it). `Direction::ToClient` is "latency on the reply path".
    pub fn set_latency(&self, direction: Direction, latency: Duration) {
        self.shared.settings.send_modify(|s| match direction {
            Direction::ToServer => s.to_server = latency,
            Direction::ToClient => s.to_client = latency,
        });
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // The accept task owns the connections' JoinSet: aborting it aborts them all.
        self.accept.abort();
    }
}

/// `url` with its first `127.0.0.1:from` / `localhost:from` replaced by `127.0.0.1:to`: the
/// URL a client uses to go through a proxy listening on port `to`.
pub fn rewrite_url(url: &str, from: u16, to: u16) -> String {
    for host in ["127.0.0.1", "localhost"] {
        let old = format!("{host}:{from}");
        if let Some(i) = url.find(&old) {
            let end = i + old.len();
            // Only a whole port: `:6379` must not match `:63790`.
            if !url[end..].starts_with(|c: char| c.is_ascii_digit()) {
                return format!("{}127.0.0.1:{to}{}", &url[..i], &url[end..]);
            }
        }
    }
    url.to_string()
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((client, _)) = accepted {
                    conns.spawn(serve(client, shared.clone()));
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// `SO_LINGER` 0: closing the socket sends RST. (Deprecated in tokio because a *non-zero* linger
/// blocks the closing thread; a zero linger never blocks.)
#[allow(deprecated)]
fn set_reset_on_close(s: &TcpStream) {
    let _ = s.set_linger(Some(Duration::ZERO));
}

async fn serve(client: TcpStream, shared: Arc<Shared>) {
    // Linger 0: dropping a socket sends RST, which is what Reset needs. A normal close first
    // shuts the write half down (FIN), so data is never cut short by it.
    set_reset_on_close(&client);
    let _ = client.set_nodelay(true);
    let mut rx = shared.settings.subscribe();
    if rx.borrow().mode == ProxyMode::Reset {
        return;
    }
    let upstream = *shared.upstream.lock().unwrap_or_else(|e| e.into_inner());
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    set_reset_on_close(&server);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let (cw, sw) = (NoFin(Some(cw)), NoFin(Some(sw)));
    let (rx1, rx2) = (rx.clone(), rx.clone());
    let both = async {
        tokio::join!(
            pump(cr, sw, Direction::ToServer, rx1),
            pump(sr, cw, Direction::ToClient, rx2)
        )
    };
    let reset = async {
        if rx.wait_for(|s| s.mode == ProxyMode::Reset).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = both => {}
        _ = reset => {}
    }
}

/// Copies one direction: a reader queues chunks with their arrival time; a writer delivers each
/// once its latency has passed and the mode is not blackhole.
/// A write half that does not send FIN when dropped (tokio's does): dropped mid-stream (a
/// reset), the socket's last close then sends RST thanks to the zero linger.
struct NoFin(Option<OwnedWriteHalf>);

impl Drop for NoFin {
    fn drop(&mut self) {
        if let Some(w) = self.0.take() {
            w.forget();
        }
    }
}

async fn pump(
    mut r: OwnedReadHalf,
    mut w: NoFin,
    dir: Direction,
    mut rx: watch::Receiver<Settings>,
) {
    let (tx, mut queue) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    };
    let write = async move {
        while let Some((at, data)) = queue.recv().await {
            loop {
                let s = *rx.borrow_and_update();
                if s.mode == ProxyMode::Blackhole {
                    if rx.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
                let due = at + s.latency(dir);
                if Instant::now() >= due {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(due) => {}
                    changed = rx.changed() => if changed.is_err() { return },
                }
            }
            let Some(half) = w.0.as_mut() else { return };
            if half.write_all(&data).await.is_err() {
                return;
            }
        }
        if let Some(half) = w.0.as_mut() {
            let _ = half.shutdown().await;
        }
    };
    tokio::join!(read, write);
}
