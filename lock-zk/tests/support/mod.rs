//! What the ZooKeeper tests' proxies need to know of a `zk://` URL: its host list.
#![allow(dead_code)]

use std::net::ToSocketAddrs;

use faultkit::{Proxy, Wire};

/// A faultkit proxy in front of the first host of `url`, parsing ZooKeeper's framing (it counts
/// the client's requests and can answer its pings), and `url` with its host list replaced by
/// the proxy.
pub async fn proxy(url: &str) -> (Proxy, String) {
    let rest = url.strip_prefix("zk://").expect("a zk:// URL");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let first = rest[..end].split(',').next().unwrap();
    let upstream = first
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| panic!("{first}: not a host:port"));
    let proxy = Proxy::start_with_wire(upstream, Wire::ZooKeeper)
        .await
        .expect("a proxy on loopback");
    let through = format!("zk://{}{}", proxy.addr(), &rest[end..]);
    (proxy, through)
}
