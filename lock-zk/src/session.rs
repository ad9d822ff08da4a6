//! One ZooKeeper session: opening it, and the registry of the leases held in it (reported lost
//! together when the connection is suspended or the session ends).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::backend::LostNotifier;
use lockcore::{Error, LostReason, Result};
use zookeeper_client as zk;

use crate::config::Config;
use crate::errors::map_err;
use crate::stats::{Stats, bump};

/// One ZooKeeper session and the leases held in it.
pub(crate) struct Session {
    pub(crate) client: zk::Client,
    pub(crate) id: i64,
    pub(crate) registry: Mutex<Registry>,
}

#[derive(Default)]
pub(crate) struct Registry {
    pub(crate) next: u64,
    /// Set while the connection is suspended or the session ended: a lease registered
    /// meanwhile is lost at once.
    pub(crate) suspended: Option<LostReason>,
    pub(crate) leases: HashMap<u64, LostNotifier>,
}

impl Session {
    pub(crate) fn new(client: zk::Client) -> Arc<Session> {
        Arc::new(Session {
            id: client.session_id().0,
            client,
            registry: Mutex::new(Registry::default()),
        })
    }

    pub(crate) fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a held lease; reports it lost at once if the session is suspended.
    pub(crate) fn register(&self, lost: LostNotifier, stats: &Stats) -> u64 {
        let mut reg = self.registry();
        reg.next += 1;
        let id = reg.next;
        match reg.suspended {
            Some(reason) => {
                if lost.fire(reason) {
                    bump(&stats.lost_fired);
                }
            }
            None => {
                reg.leases.insert(id, lost);
            }
        }
        id
    }

    /// The node of lease `id` was deleted behind it (an operator's force release, seen by the
    /// lease's watch on its own node): reports it lost, if it is still held (a release
    /// unregisters before it deletes, so its own delete reports nothing).
    pub(crate) fn revoked(&self, id: u64, stats: &Stats) {
        let lost = self.registry().leases.remove(&id);
        if let Some(lost) = lost
            && lost.fire(LostReason::RenewalRefused)
        {
            bump(&stats.lost_fired);
            tracing::debug!(
                session = self.id,
                "zookeeper lock node deleted behind its holder"
            );
        }
    }

    pub(crate) fn unregister(&self, id: u64) {
        self.registry().leases.remove(&id);
    }

    pub(crate) fn held(&self) -> usize {
        self.registry().leases.len()
    }

    /// Reports every held lease lost and keeps reporting new ones until [`Session::resume`].
    pub(crate) fn suspend(&self, reason: LostReason, stats: &Stats) {
        let drained: Vec<LostNotifier> = {
            let mut reg = self.registry();
            // An expiry outranks a suspension.
            if reg.suspended != Some(LostReason::SessionExpired) {
                reg.suspended = Some(reason);
            }
            reg.leases.drain().map(|(_, n)| n).collect()
        };
        for lost in drained {
            if lost.fire(reason) {
                bump(&stats.lost_fired);
                tracing::debug!(session = self.id, %reason, "zookeeper lock lost");
            }
        }
    }

    pub(crate) fn resume(&self) {
        let mut reg = self.registry();
        if reg.suspended == Some(LostReason::ConnectionLost) {
            reg.suspended = None;
        }
    }

    pub(crate) fn ended(&self) -> bool {
        self.client.state().is_terminated()
    }
}

/// Opens one session with the settings of `config`.
pub(crate) async fn open_client(config: &Config) -> Result<zk::Client> {
    let mut connector = zk::Client::connector()
        .with_session_timeout(config.session_timeout)
        // Fail the first connection once every host was tried, instead of retrying for a
        // whole session timeout; reconnections later still cycle through the hosts.
        .with_fail_eagerly();
    if let Some(d) = &config.digest {
        connector = connector.with_auth("digest", &d.auth_bytes());
    }
    let hosts = config.connect_string();
    let connect_bound = config.session_timeout * 2 + Duration::from_secs(5);
    let tls = if config.tls {
        Some(tls_options(config)?)
    } else {
        None
    };
    let connect = async {
        if let Some(tls) = tls {
            connector.with_tls(tls).secure_connect(&hosts).await
        } else {
            connector.connect(&hosts).await
        }
    };
    match tokio::time::timeout(connect_bound, connect).await {
        Ok(Ok(client)) => Ok(client),
        // The client reports a failed handshake as no host answering, its cause only logged:
        // say which settings decide a TLS handshake.
        Ok(Err(e @ zk::Error::NoHosts)) if config.tls => Err(map_err(
            format!(
                "connecting to ZooKeeper at {hosts} over TLS (no server completed the handshake: \
                 is it the secure client port, did ca= sign its certificate, does it require a \
                 client certificate, cert= and key=?)"
            ),
            e,
        )),
        Ok(Err(e)) => Err(map_err(format!("connecting to ZooKeeper at {hosts}"), e)),
        Err(_) => Err(Error::new(
            lockcore::ErrorKind::Unavailable,
            format!("connecting to ZooKeeper at {hosts}: no session within {connect_bound:?}"),
        )),
    }
}

/// The client's TLS settings from `ca=`, `cert=` and `key=` (validated: TLS has a CA).
/// Unreadable or malformed files are `InvalidConfig` naming the path, never the contents.
fn tls_options(config: &Config) -> Result<zk::TlsOptions> {
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).map_err(|e| {
            Error::invalid_config(format!("reading {}", path.display())).with_source(e)
        })
    };
    let malformed = |what: String| {
        move |e: zk::Error| Error::invalid_config(format!("{what}: not usable PEM")).with_source(e)
    };
    let mut options = zk::TlsOptions::new();
    if let Some(ca) = &config.ca {
        options = options
            .with_pem_ca(&read(ca)?)
            .map_err(malformed(format!("CA file {}", ca.display())))?;
    }
    if let (Some(cert), Some(key)) = (&config.cert, &config.key) {
        options = options
            .with_pem_identity(&read(cert)?, &read(key)?)
            .map_err(malformed(format!(
                "client certificate {} / key {}",
                cert.display(),
                key.display()
            )))?;
    }
    Ok(options)
}
