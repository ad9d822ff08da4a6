//! What the server-restart and partition scenarios need from a lock service ([`Service`],
//! [`Link`]), implemented by the real topologies ([`Target`]) and the negative controls' toy.

use std::time::Duration;

use faultkit::{Proxy, ProxyMode};
use locksmith::Locker;

use crate::support::{connect, connect_url, proxies};
use crate::target::Target;

/// What the server-restart and partition scenarios need from a lock service: clients, a client
/// whose link can be cut, and a restart. The real topologies ([`Target`]) and the negative
/// controls' toy service implement it.
#[async_trait::async_trait]
pub trait Service: Send {
    /// The TTL the scenarios use.
    fn ttl(&self) -> Duration;

    /// A new independent client.
    ///
    /// Cancel safe.
    async fn client(&self) -> Result<Locker, String>;

    /// A new client whose link to the service the returned [`Link`] can cut.
    ///
    /// Cancel safe.
    async fn cuttable_client(&self) -> Result<(Locker, Box<dyn Link>), String>;

    /// Kills every server and starts it again; `None` when there is no server.
    ///
    /// Cancel safety: a dropped restart may leave the service stopped.
    async fn restart(&mut self) -> Option<Result<(), String>>;
}

/// A client's link to the service, which can be cut (requests and replies held, as a
/// blackhole) and healed.
pub trait Link: Send + Sync {
    /// Cuts (`true`) or heals (`false`) the link.
    fn cut(&self, cut: bool);
}

struct Proxies(Vec<Proxy>);

impl Link for Proxies {
    fn cut(&self, cut: bool) {
        for p in &self.0 {
            p.set_mode(if cut {
                ProxyMode::Blackhole
            } else {
                ProxyMode::Pass
            });
        }
    }
}

#[async_trait::async_trait]
impl Service for Target {
    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn client(&self) -> Result<Locker, String> {
        connect(self).await
    }

    async fn cuttable_client(&self) -> Result<(Locker, Box<dyn Link>), String> {
        let (ps, url) = proxies(self).await?;
        Ok((connect_url(&url).await?, Box::new(Proxies(ps))))
    }

    async fn restart(&mut self) -> Option<Result<(), String>> {
        Target::restart(self)
            .await
            .map(|r| r.map_err(|e| e.to_string()))
    }
}
