//! The fault tools themselves: proxy modes against an echo server, a launcher's start, pause,
//! kill and restart. Quick (a few seconds) and without the shared servers.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use faultkit::{Direction, Proxy, ProxyMode, RedisServer, Wire, rewrite_url};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

async fn round_trip(s: &mut TcpStream, timeout: Duration) -> std::io::Result<Option<Duration>> {
    let t = Instant::now();
    s.write_all(b"ping").await?;
    let mut buf = [0u8; 4];
    match tokio::time::timeout(timeout, s.read_exact(&mut buf)).await {
        Ok(r) => {
            r?;
            assert_eq!(&buf, b"ping");
            Ok(Some(t.elapsed()))
        }
        Err(_) => Ok(None),
    }
}

#[tokio::test]
async fn proxy_passes_delays_blackholes_and_resets() {
    let proxy = Proxy::start(echo_server().await).await.unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(
        round_trip(&mut s, Duration::from_secs(5))
            .await
            .unwrap()
            .is_some()
    );

    // Latency on the reply path only.
    proxy.set_latency(Direction::ToClient, Duration::from_millis(200));
    let rtt = round_trip(&mut s, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert!(rtt >= Duration::from_millis(200), "{rtt:?}");
    proxy.set_latency(Direction::ToClient, Duration::ZERO);

    // Blackhole: nothing comes back; after healing, the held bytes arrive, in order.
    proxy.set_mode(ProxyMode::Blackhole);
    assert!(
        round_trip(&mut s, Duration::from_millis(300))
            .await
            .unwrap()
            .is_none()
    );
    proxy.set_mode(ProxyMode::Pass);
    let mut buf = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
        .await
        .expect("held bytes delivered after healing")
        .unwrap();
    assert_eq!(&buf, b"ping");

    // Reset: the open connection gets an RST, new ones too; Pass again lets new ones through.
    proxy.set_mode(ProxyMode::Reset);
    let mut buf = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("the reset arrives");
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{r:?}"
    );
    let mut s2 = TcpStream::connect(proxy.addr()).await.unwrap();
    let r = round_trip(&mut s2, Duration::from_secs(5)).await;
    assert!(r.is_err() || r.as_ref().unwrap().is_none(), "{r:?}");
    proxy.set_mode(ProxyMode::Pass);
    let mut s3 = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(
        round_trip(&mut s3, Duration::from_secs(5))
            .await
            .unwrap()
            .is_some()
    );
}

/// A ZooKeeper client frame: length, xid, opcode.
fn zk_frame(xid: i32, op: i32) -> Vec<u8> {
    let mut f = 8u32.to_be_bytes().to_vec();
    f.extend_from_slice(&xid.to_be_bytes());
    f.extend_from_slice(&op.to_be_bytes());
    f
}

/// With a wire, the proxy counts requests (not the connect request, pings or syncs), and under
/// `AnswerKeepalives` it answers pings itself while nothing else passes either way.
#[tokio::test]
async fn proxy_with_a_wire_counts_requests_and_answers_keepalives() {
    let proxy = Proxy::start_with_wire(echo_server().await, Wire::ZooKeeper)
        .await
        .unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    let (connect, ping, sync, get) = (
        zk_frame(0, 0),
        zk_frame(-2, 11),
        zk_frame(1, 9),
        zk_frame(2, 8),
    );
    let mut all = connect.clone();
    all.extend_from_slice(&ping);
    all.extend_from_slice(&sync);
    all.extend_from_slice(&get);
    // Split inside a frame: counting follows frames, not reads.
    // The first part's echo shows the proxy read it on its own before the rest is sent.
    let mut echoed = vec![0u8; all.len()];
    s.write_all(&all[..14]).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut echoed[..14]))
        .await
        .expect("the first part passed both ways")
        .unwrap();
    s.write_all(&all[14..]).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut echoed[14..]))
        .await
        .expect("passed both ways")
        .unwrap();
    assert_eq!(echoed, all);
    assert_eq!(proxy.requests(), 1, "only the getChildren counts");

    proxy.set_mode(ProxyMode::AnswerKeepalives);
    s.write_all(&get).await.unwrap();
    s.write_all(&ping).await.unwrap();
    let mut reply = [0u8; 20];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut reply))
        .await
        .expect("the proxy answers the ping")
        .unwrap();
    assert_eq!(&reply[..4], &16u32.to_be_bytes(), "{reply:?}");
    assert_eq!(&reply[4..8], &(-2i32).to_be_bytes(), "{reply:?}");
    let mut more = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), s.read(&mut more))
            .await
            .is_err(),
        "nothing else came back"
    );
    assert_eq!(proxy.requests(), 2, "counted in every mode");
}

#[test]
fn rewrite_url_replaces_a_whole_port() {
    assert_eq!(
        rewrite_url("redis://127.0.0.1:6379/0", 6379, 4000),
        "redis://127.0.0.1:4000/0"
    );
    assert_eq!(
        rewrite_url("postgres://u:p@localhost:5432/db", 5432, 1),
        "postgres://u:p@127.0.0.1:1/db"
    );
    assert_eq!(
        rewrite_url("redis://127.0.0.1:63790", 6379, 1),
        "redis://127.0.0.1:63790"
    );
}

#[tokio::test]
async fn redis_launcher_starts_pauses_restarts_empty_and_kills() {
    let mut r = RedisServer::start().await.unwrap();
    r.cli(&["SET", "k", "v"]).await.unwrap();
    assert_eq!(r.cli(&["GET", "k"]).await.unwrap().trim(), "v");
    r.process().pause().unwrap();
    let paused = tokio::time::timeout(Duration::from_millis(300), r.cli(&["PING"])).await;
    assert!(paused.is_err(), "a paused server does not answer");
    r.process().resume().unwrap();
    assert_eq!(r.cli(&["PING"]).await.unwrap().trim(), "PONG");
    let pid = r.process().pid().unwrap();
    r.restart().await.unwrap();
    assert_ne!(r.process().pid().unwrap(), pid);
    assert_eq!(
        r.cli(&["GET", "k"]).await.unwrap().trim(),
        "",
        "no persistence"
    );
    let port = r.port();
    drop(r);
    assert!(
        TcpStream::connect(("127.0.0.1", port)).await.is_err(),
        "killed on drop"
    );
}
