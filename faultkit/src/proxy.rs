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
use crate::wire::{Message, Parser, Wire};

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
    /// Nothing passes either way and nothing is held (what either end sends meanwhile is
    /// lost), but the proxy answers the client's keepalives itself, as a ZooKeeper follower cut
    /// off from its leader does: the client's connection looks alive while the leader, no
    /// longer hearing of the session, expires it. Keepalives are known only to a proxy
    /// started with a [`Wire`] that has them ([`Wire::ZooKeeper`]: pings); otherwise nothing
    /// is answered. A connection that lost bytes this way is not fit to carry on afterwards.
    AnswerKeepalives,
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

/// Which request a [`Proxy::lose_reply`] picks, counted from when it is armed, over every
/// connection through the proxy.
///
/// A "request" is what one read from a client socket returns: a client writes a request in one
/// go (and the proxy sets `TCP_NODELAY`), so on loopback that is one request, or a few a
/// client pipelined together (their replies are lost together).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pick {
    /// The next request.
    Next,
    /// The `n`th request (1 is the next one).
    Nth(usize),
    /// The next request whose bytes contain this pattern (also across two reads of one
    /// connection). The clear-text protocols carry what a test can name: a Redis key or script
    /// argument, a SQL keyword or a bound parameter, a ZooKeeper path, an etcd key in a gRPC
    /// message.
    Matching(Vec<u8>),
}

/// How a lost reply shows to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyLoss {
    /// Once the server's reply arrives (so the server has applied the request), it is dropped
    /// and the connection is reset, both ends (TCP RST): the client sees a reset instead of
    /// the reply, the server sees its client go.
    ///
    /// The reply is whatever the server sends first once the request was written to it. On a
    /// multiplexed protocol (HTTP/2: gRPC, etcd) that may be a frame of another stream, or a
    /// flow-control frame acknowledging the request's bytes, before the server ran the
    /// request; the reset may then cancel it. The client cannot tell (nor can it on a real
    /// network): it must be ready for both outcomes, as for [`ReplyLoss::Unsent`].
    Reset,
    /// The request itself is lost: it never reaches the server, and the connection is reset,
    /// both ends, at once. The client sees what it sees with [`ReplyLoss::Reset`] (a reset
    /// instead of the reply), but nothing was applied: a client that takes a reset for "it was
    /// applied" (or gives up) is caught here.
    Unsent,
    /// The reply and everything after it on that connection are dropped, in both directions,
    /// and neither end is told: the client sees no reply (its own timeout), the server a silent
    /// client (a blackhole on that one connection, until the proxy is dropped).
    Timeout,
}

#[derive(Clone, Debug)]
struct Armed {
    which: Pick,
    how: ReplyLoss,
    /// Requests seen since arming (for `Nth`).
    seen: usize,
}

/// Where a connection stands with a lost reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loss {
    /// Nothing picked on this connection.
    None,
    /// The picked request was read from the client and is on its way to the server: nothing
    /// more goes to the server, while what the server sends meanwhile (answers to earlier
    /// requests, since it has not seen this one) still reaches the client.
    Picked(ReplyLoss),
    /// The picked request went to the server; the reply is awaited (and will be dropped).
    Forwarded(ReplyLoss),
    /// The reply came and was dropped.
    Dropped(ReplyLoss),
}

struct Shared {
    upstream: Mutex<SocketAddr>,
    settings: watch::Sender<Settings>,
    armed: Mutex<Option<Armed>>,
    /// How many replies were lost so far.
    lost: watch::Sender<usize>,
    /// The protocol parsed on the client-to-server direction, if any.
    wire: Option<Wire>,
    /// Requests the clients sent: messages parsed when `wire` is set, reads from a client
    /// socket otherwise.
    requests: watch::Sender<u64>,
}

impl Shared {
    /// Whether `chunk` (after `tail`, the end of the connection's previous read) is the armed
    /// request; disarms when it is.
    fn picks(&self, tail: &[u8], chunk: &[u8]) -> Option<ReplyLoss> {
        let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        let a = armed.as_mut()?;
        a.seen += 1;
        let hit = match &a.which {
            Pick::Next => true,
            Pick::Nth(n) => a.seen >= *n,
            Pick::Matching(p) => {
                let mut joined = tail.to_vec();
                joined.extend_from_slice(chunk);
                // A match that lies wholly in the tail was seen (and missed) with the previous
                // read; only one reaching into this chunk counts.
                !p.is_empty()
                    && joined
                        .windows(p.len())
                        .enumerate()
                        .any(|(i, w)| w == p.as_slice() && i + p.len() > tail.len())
            }
        };
        hit.then(|| armed.take().map(|a| a.how)).flatten()
    }
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
        Self::launch(upstream, None).await
    }

    /// As [`Proxy::start`], parsing the clients' `wire` protocol: [`Proxy::requests`] counts
    /// their requests (round trips, as the [`Wire`] defines them), and
    /// [`ProxyMode::AnswerKeepalives`] can answer their keepalives. The clients must not use
    /// TLS.
    ///
    /// Cancel safe.
    pub async fn start_with_wire(upstream: SocketAddr, wire: Wire) -> Result<Self> {
        Self::launch(upstream, Some(wire)).await
    }

    async fn launch(upstream: SocketAddr, wire: Option<Wire>) -> Result<Self> {
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
            armed: Mutex::new(None),
            lost: watch::channel(0).0,
            wire,
            requests: watch::channel(0).0,
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

    /// Requests the clients sent through the proxy so far, over every connection: the
    /// messages of the [`Wire`] when started with [`Proxy::start_with_wire`] (in every mode),
    /// else what one read from a client socket returns, as for [`Pick`] (forwarded ones). A
    /// client's request count is the server work it causes: a herd of waiters shows as a count
    /// growing with their number.
    pub fn requests(&self) -> u64 {
        *self.shared.requests.borrow()
    }

    /// Waits up to `d` until the clients have sent at least `n` requests in all (see
    /// [`Proxy::requests`]); whether they had.
    ///
    /// Cancel safe.
    pub async fn wait_requests(&self, n: u64, d: Duration) -> bool {
        let mut rx = self.shared.requests.subscribe();
        tokio::time::timeout(d, rx.wait_for(|&r| r >= n))
            .await
            .is_ok_and(|r| r.is_ok())
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

impl Proxy {
    /// Arms a lost reply: the request `which` picks is forwarded to the server, and its reply
    /// is lost as `how` says. One request only: the proxy disarms once it picked one. Arming
    /// again replaces what was armed and not yet picked.
    pub fn lose_reply(&self, which: Pick, how: ReplyLoss) {
        *self.shared.armed.lock().unwrap_or_else(|e| e.into_inner()) = Some(Armed {
            which,
            how,
            seen: 0,
        });
    }

    /// Disarms a [`Proxy::lose_reply`] that picked nothing yet. Returns whether one was armed.
    pub fn disarm(&self) -> bool {
        self.shared
            .armed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some()
    }

    /// Whether a [`Proxy::lose_reply`] is armed and has picked no request yet.
    pub fn armed(&self) -> bool {
        self.shared
            .armed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// How many replies were lost so far (counted when the server's reply to a picked request
    /// arrived and was dropped, or, with [`ReplyLoss::Unsent`], when the request was).
    pub fn replies_lost(&self) -> usize {
        *self.shared.lost.borrow()
    }

    /// Waits up to `d` until at least `n` replies were lost; whether they were.
    ///
    /// Cancel safe.
    pub async fn wait_replies_lost(&self, n: usize, d: Duration) -> bool {
        let mut rx = self.shared.lost.subscribe();
        tokio::time::timeout(d, rx.wait_for(|&l| l >= n))
            .await
            .is_ok_and(|r| r.is_ok())
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
    // This connection's lost reply, if the armed request is one of its own.
    let (loss, mut loss_rx) = watch::channel(Loss::None);
    let loss = Arc::new(loss);
    // Keepalives the proxy answers itself, from the client's direction to the client.
    let (answers_tx, answers_rx) = mpsc::unbounded_channel();
    let both = async {
        tokio::join!(
            pump(
                cr,
                sw,
                Direction::ToServer,
                rx1,
                &shared,
                &loss,
                Answers::Send(answers_tx)
            ),
            pump(
                sr,
                cw,
                Direction::ToClient,
                rx2,
                &shared,
                &loss,
                Answers::Deliver(answers_rx)
            )
        )
    };
    let reset = async {
        if rx.wait_for(|s| s.mode == ProxyMode::Reset).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    // A reply lost by reset: both ends reset once it came (and was dropped); a request lost
    // unsent: at once.
    let lost_reset = async {
        if loss_rx
            .wait_for(|l| {
                matches!(
                    l,
                    Loss::Dropped(ReplyLoss::Reset) | Loss::Dropped(ReplyLoss::Unsent)
                )
            })
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = both => {}
        _ = reset => {}
        _ = lost_reset => {}
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

/// The keepalive replies of one connection: its client-to-server pump sends them, its
/// server-to-client pump delivers them.
enum Answers {
    Send(mpsc::UnboundedSender<Vec<u8>>),
    Deliver(mpsc::UnboundedReceiver<Vec<u8>>),
}

impl Answers {
    /// The next reply to deliver; never, on the sending side or once no more can come.
    async fn next(&mut self) -> Vec<u8> {
        match self {
            Answers::Deliver(rx) => match rx.recv().await {
                Some(reply) => reply,
                None => std::future::pending().await,
            },
            Answers::Send(_) => std::future::pending().await,
        }
    }
}

async fn pump(
    mut r: OwnedReadHalf,
    mut w: NoFin,
    dir: Direction,
    mut rx: watch::Receiver<Settings>,
    shared: &Shared,
    loss: &watch::Sender<Loss>,
    mut answers: Answers,
) {
    // Each chunk with its arrival time, and whether it ends with the picked request (the
    // writer marks the request forwarded once it wrote it).
    let (tx, mut queue) = mpsc::unbounded_channel::<(Instant, Vec<u8>, bool)>();
    let mut parser = match (dir, shared.wire) {
        (Direction::ToServer, Some(wire)) => Some(Parser::new(wire)),
        _ => None,
    };
    let answer_tx = match &answers {
        Answers::Send(tx) => Some(tx.clone()),
        Answers::Deliver(_) => None,
    };
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        // The end of the previous read, so that a pattern split over two reads is found.
        let mut tail: Vec<u8> = Vec::new();
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            let answering = shared.settings.borrow().mode == ProxyMode::AnswerKeepalives;
            // The parser sees every byte, whatever happens to them, to keep its framing.
            for m in parser.as_mut().map(|p| p.feed(chunk)).unwrap_or_default() {
                match m {
                    Message::Request => {
                        shared.requests.send_modify(|r| *r += 1);
                    }
                    Message::Keepalive(reply) if answering => {
                        if let Some(tx) = &answer_tx {
                            let _ = tx.send(reply);
                        }
                    }
                    _ => {}
                }
            }
            if answering {
                continue;
            }
            let state = *loss.borrow();
            let mut picked = false;
            match (dir, state) {
                // Until the picked request was written to the server, what the server sends
                // answers earlier requests: it passes.
                (Direction::ToClient, Loss::Picked(_)) => {}
                // After a picked request nothing more reaches the server (only the picked
                // request is applied), and nothing reaches the client.
                (_, Loss::Picked(_) | Loss::Forwarded(_) | Loss::Dropped(_)) => {
                    if dir == Direction::ToClient
                        && let Loss::Forwarded(how) = state
                    {
                        // The server answered the picked request: it applied it. The reply
                        // is dropped here, and the loss counted.
                        loss.send_replace(Loss::Dropped(how));
                        shared.lost.send_modify(|l| *l += 1);
                    }
                    continue;
                }
                (Direction::ToServer, Loss::None) => {
                    if shared.wire.is_none() {
                        shared.requests.send_modify(|r| *r += 1);
                    }
                    match shared.picks(&tail, chunk) {
                        Some(ReplyLoss::Unsent) => {
                            // Not sent at all; the connection is reset at once.
                            loss.send_replace(Loss::Dropped(ReplyLoss::Unsent));
                            shared.lost.send_modify(|l| *l += 1);
                            continue;
                        }
                        Some(how) => {
                            // Marked before the request is queued: nothing read from the
                            // client after it goes to the server. Once the writer wrote it,
                            // any reply read is the picked request's (or a later one's) and
                            // is dropped.
                            loss.send_replace(Loss::Picked(how));
                            picked = true;
                        }
                        None => {}
                    }
                    if let Some(p) = shared
                        .armed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_ref()
                        .and_then(|a| match &a.which {
                            Pick::Matching(p) => Some(p.len()),
                            _ => None,
                        })
                    {
                        let keep = p.saturating_sub(1).min(n);
                        tail.clear();
                        tail.extend_from_slice(&chunk[n - keep..]);
                    }
                }
                (Direction::ToClient, Loss::None) => {}
            }
            if tx.send((Instant::now(), chunk.to_vec(), picked)).is_err() {
                break;
            }
        }
    };
    let write = async move {
        loop {
            let (at, data, picked) = tokio::select! {
                next = queue.recv() => match next {
                    Some(next) => next,
                    None => break,
                },
                reply = answers.next() => {
                    let Some(half) = w.0.as_mut() else { return };
                    if half.write_all(&reply).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            loop {
                let s = *rx.borrow_and_update();
                if matches!(s.mode, ProxyMode::Blackhole | ProxyMode::AnswerKeepalives) {
                    tokio::select! {
                        changed = rx.changed() => if changed.is_err() { return },
                        reply = answers.next() => {
                            let Some(half) = w.0.as_mut() else { return };
                            if half.write_all(&reply).await.is_err() {
                                return;
                            }
                        }
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
            // Replies queued before the pick are delivered; none read after it is queued.
            let Some(half) = w.0.as_mut() else { return };
            if half.write_all(&data).await.is_err() {
                return;
            }
            if picked {
                loss.send_modify(|l| {
                    if let Loss::Picked(how) = *l {
                        *l = Loss::Forwarded(how);
                    }
                });
            }
        }
        // A connection whose reply was lost by timeout tells neither end anything: no FIN
        // (the proxy holds the other socket open until it is dropped).
        if matches!(
            *loss.borrow(),
            Loss::Picked(ReplyLoss::Timeout)
                | Loss::Forwarded(ReplyLoss::Timeout)
                | Loss::Dropped(ReplyLoss::Timeout)
        ) {
            std::future::pending::<()>().await;
        }
        if let Some(half) = w.0.as_mut() {
            let _ = half.shutdown().await;
        }
    };
    tokio::join!(read, write);
}
