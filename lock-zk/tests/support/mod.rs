//! Test helpers: a TCP proxy between a client and ZooKeeper that can be paused, to play a
//! network partition or a crashed process whose session must expire (closing the session would
//! delete its ephemeral nodes at once).
#![allow(dead_code)]

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards every connection to `upstream` until paused.
pub struct Proxy {
    addr: SocketAddr,
    paused: watch::Sender<bool>,
}

impl Proxy {
    /// Starts a proxy on an ephemeral loopback port (on the current runtime).
    pub async fn start(upstream: String) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (paused, rx) = watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if *rx.borrow() {
                    // Paused: the server is unreachable; the client sees the connection end.
                    drop(inbound);
                    continue;
                }
                let (upstream, mut rx) = (upstream.clone(), rx.clone());
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = rx.wait_for(|p| *p) => {}
                    }
                });
            }
        });
        Ok(Proxy { addr, paused })
    }

    /// `host:port` of the proxy.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cuts every connection and refuses new ones until [`Proxy::resume`].
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Forwards new connections again.
    pub fn resume(&self) {
        self.paused.send_replace(false);
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
