//! The proxy's lost replies against a recording echo server: the picked request reaches the
//! server (it is recorded there), its reply never reaches the client, which sees a reset or
//! nothing; other requests and connections pass.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use faultkit::{Pick, Proxy, ReplyLoss};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Generous bounds for a loaded 2-core machine (`LOCK_TEST_TIME_SCALE` stretches them).
fn scaled(ms: u64) -> Duration {
    let s: f64 = std::env::var("LOCK_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    Duration::from_millis(ms).mul_f64(s.max(1.0))
}

/// An echo server that records every request it read (what the server "applied").
async fn recording_echo() -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let rec = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let rec = rec.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    rec.lock().unwrap().push(buf[..n].to_vec());
                    if s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// Sends `req` and reads its echo: `Ok(true)` when it came back, `Ok(false)` when nothing came
/// within `d`, `Err` on a reset or close.
async fn call(s: &mut TcpStream, req: &[u8], d: Duration) -> std::io::Result<bool> {
    s.write_all(req).await?;
    let mut buf = vec![0u8; req.len()];
    match tokio::time::timeout(d, s.read_exact(&mut buf)).await {
        Ok(r) => {
            r?;
            assert_eq!(buf, req);
            Ok(true)
        }
        Err(_) => Ok(false),
    }
}

fn applied(seen: &Mutex<Vec<Vec<u8>>>, req: &[u8]) -> bool {
    seen.lock().unwrap().iter().any(|r| r.as_slice() == req)
}

#[tokio::test]
async fn matching_request_is_applied_and_its_reply_reset() {
    let (addr, seen) = recording_echo().await;
    let proxy = Proxy::start(addr).await.unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut other = TcpStream::connect(proxy.addr()).await.unwrap();
    proxy.lose_reply(Pick::Matching(b"EVALSHA".to_vec()), ReplyLoss::Reset);
    // Requests that do not match pass, on any connection.
    assert!(call(&mut s, b"GET k", scaled(5000)).await.unwrap());
    assert!(call(&mut other, b"PING", scaled(5000)).await.unwrap());
    assert!(proxy.armed());
    assert_eq!(proxy.replies_lost(), 0);
    // The matching one reaches the server; the client gets a reset instead of its reply.
    let r = call(&mut s, b"*3 EVALSHA abc 1 k", scaled(5000)).await;
    assert!(r.is_err(), "a reset instead of the reply, got {r:?}");
    assert!(
        applied(&seen, b"*3 EVALSHA abc 1 k"),
        "the server applied it"
    );
    assert!(proxy.wait_replies_lost(1, scaled(5000)).await);
    assert!(!proxy.armed(), "one request only");
    // The other connection, and new ones, pass; the same pattern again passes (disarmed).
    assert!(call(&mut other, b"PING 2", scaled(5000)).await.unwrap());
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(call(&mut s, b"EVALSHA again", scaled(5000)).await.unwrap());
    assert_eq!(proxy.replies_lost(), 1);
}

#[tokio::test]
async fn pattern_split_over_two_reads_is_found() {
    let (addr, seen) = recording_echo().await;
    let proxy = Proxy::start(addr).await.unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    proxy.lose_reply(Pick::Matching(b"DELETE".to_vec()), ReplyLoss::Reset);
    // "DEL" in one request, "ETE" in the next: the second read completes the pattern.
    assert!(call(&mut s, b"xx DEL", scaled(5000)).await.unwrap());
    assert!(call(&mut s, b"ETE yy", scaled(5000)).await.is_err());
    assert!(applied(&seen, b"ETE yy"));
    // Split after its first two bytes, on a new connection.
    proxy.lose_reply(Pick::Matching(b"ABC".to_vec()), ReplyLoss::Reset);
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(call(&mut s, b"AB", scaled(5000)).await.unwrap());
    assert!(call(&mut s, b"Cz", scaled(5000)).await.is_err());
}

#[tokio::test]
async fn nth_request_and_next() {
    let (addr, seen) = recording_echo().await;
    let proxy = Proxy::start(addr).await.unwrap();
    let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
    // Counted over every connection: a 1, b 2, a 3 (picked).
    proxy.lose_reply(Pick::Nth(3), ReplyLoss::Reset);
    assert!(call(&mut a, b"one", scaled(5000)).await.unwrap());
    assert!(call(&mut b, b"two", scaled(5000)).await.unwrap());
    assert!(call(&mut a, b"three", scaled(5000)).await.is_err());
    assert!(applied(&seen, b"three"));
    assert!(call(&mut b, b"four", scaled(5000)).await.unwrap());
    proxy.lose_reply(Pick::Next, ReplyLoss::Reset);
    assert!(call(&mut b, b"five", scaled(5000)).await.is_err());
    assert!(applied(&seen, b"five"));
    assert_eq!(proxy.replies_lost(), 2);
    // Disarmed before it picked: nothing is lost.
    proxy.lose_reply(Pick::Next, ReplyLoss::Reset);
    assert!(proxy.disarm());
    let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(call(&mut c, b"six", scaled(5000)).await.unwrap());
}

#[tokio::test]
async fn timeout_drops_the_reply_and_tells_no_one() {
    let (addr, seen) = recording_echo().await;
    let proxy = Proxy::start(addr).await.unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    proxy.lose_reply(Pick::Next, ReplyLoss::Timeout);
    // No reply, no reset: the client's own timeout ends the call.
    assert!(!call(&mut s, b"lost", scaled(500)).await.unwrap());
    assert!(applied(&seen, b"lost"));
    assert!(proxy.wait_replies_lost(1, scaled(5000)).await);
    // Later requests on that connection do not reach the server, and nothing comes back; the
    // connection is not closed either.
    assert!(!call(&mut s, b"after", scaled(300)).await.unwrap());
    assert!(!applied(&seen, b"after"));
    // Other connections pass.
    let mut t = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(call(&mut t, b"fine", scaled(5000)).await.unwrap());
}

#[tokio::test]
async fn unsent_request_is_not_applied_and_the_connection_reset() {
    let (addr, seen) = recording_echo().await;
    let proxy = Proxy::start(addr).await.unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    proxy.lose_reply(Pick::Matching(b"DEL".to_vec()), ReplyLoss::Unsent);
    assert!(call(&mut s, b"GET k", scaled(5000)).await.unwrap());
    // The client sees a reset, as for a lost reply; the server never saw the request.
    let r = call(&mut s, b"DEL k", scaled(5000)).await;
    assert!(r.is_err(), "a reset instead of the reply, got {r:?}");
    assert!(proxy.wait_replies_lost(1, scaled(5000)).await);
    assert!(!applied(&seen, b"DEL k"), "the server never got it");
    assert!(!proxy.armed(), "one request only");
    // A new connection passes, the same request too (disarmed).
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(call(&mut s, b"DEL k", scaled(5000)).await.unwrap());
    assert!(applied(&seen, b"DEL k"));
}

/// A server that also sends bytes of its own, unasked, as fast as it can (as an HTTP/2
/// server's frames of other streams, keep-alive answers or watch events), and publishes what
/// it read.
async fn chatty_recorder() -> (SocketAddr, tokio::sync::watch::Receiver<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (seen, rx) = tokio::sync::watch::channel(Vec::new());
    let seen = Arc::new(seen);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let seen = seen.clone();
            let (mut r, mut w) = s.into_split();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = r.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    seen.send_modify(|all| all.extend_from_slice(&buf[..n]));
                }
            });
            tokio::spawn(async move {
                while w.write_all(b".").await.is_ok() {
                    tokio::task::yield_now().await;
                }
            });
        }
    });
    (addr, rx)
}

/// A reply lost by reset is dropped only once the picked request was written to the server:
/// what the server sends before that answers earlier requests. (The proxy took the first bytes
/// read after the pick for the reply, and could reset the connection before it had written the
/// request, which the server then never applied: the etcd lost-release flake.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_comes_only_after_the_request_was_sent() {
    let (addr, mut seen) = chatty_recorder().await;
    let proxy = Proxy::start(addr).await.unwrap();
    for i in 0..200 {
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let req = format!("PICK-{i};");
        proxy.lose_reply(Pick::Matching(req.as_bytes().to_vec()), ReplyLoss::Reset);
        // Unasked bytes flow before the request.
        let mut buf = [0u8; 64];
        assert!(s.read(&mut buf).await.unwrap() > 0);
        s.write_all(req.as_bytes()).await.unwrap();
        // Read until the reset (or close).
        let ended = tokio::time::timeout(scaled(5000), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "round {i}: no reset");
        assert!(proxy.wait_replies_lost(i + 1, scaled(5000)).await);
        // The server read it (its reader publishes it before the reset reaches it).
        let got = tokio::time::timeout(
            scaled(5000),
            seen.wait_for(|all| all.windows(req.len()).any(|w| w == req.as_bytes())),
        )
        .await;
        assert!(
            got.is_ok_and(|r| r.is_ok()),
            "round {i}: the connection was reset before the request reached the server"
        );
    }
}
