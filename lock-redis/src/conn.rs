//! Connections: a single node through a reconnecting `ConnectionManager`, or a cluster through
//! the cluster client's async connection, behind one `ConnectionLike`.

use std::sync::Weak;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{
    Client, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline, ProtocolVersion,
    RedisConnectionInfo, RedisFuture, RedisResult, TlsCertificates, ToRedisArgs, Value,
};

use crate::config::Config;
use crate::subs::{PubSubFactory, Registry};
use crate::{map_err, map_err_connect};
use lockcore::{Error, Result};

/// A multiplexed connection for commands (a `redis::aio::ConnectionLike`). Clones share it.
#[derive(Clone)]
pub enum Conn {
    /// One server, through a reconnecting connection manager.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The RESP3 connection that carries this client's subscriptions.
#[derive(Clone)]
pub(crate) enum PubSubConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl PubSubConn {
    pub(crate) async fn subscribe(&mut self, channel: impl ToRedisArgs) -> RedisResult<()> {
        match self {
            PubSubConn::Single(c) => c.subscribe(channel).await,
            PubSubConn::Cluster(c) => c.subscribe(channel).await,
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: impl ToRedisArgs) -> RedisResult<()> {
        match self {
            PubSubConn::Single(c) => c.unsubscribe(channel).await,
            PubSubConn::Cluster(c) => c.unsubscribe(channel).await,
        }
    }
}

fn connection_info(cfg: &Config, host: &str, port: u16) -> Result<ConnectionInfo> {
    let addr = if cfg.tls {
        ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host.to_owned(), port)
    };
    // RESP3 everywhere: the pub/sub side needs push messages, and one protocol keeps replies alike.
    let mut redis = RedisConnectionInfo::default()
        .set_db(cfg.db)
        .set_protocol(ProtocolVersion::RESP3);
    if let Some(user) = &cfg.username {
        redis = redis.set_username(user);
    }
    if let Some(pw) = &cfg.password {
        redis = redis.set_password(pw.expose());
    }
    Ok(addr
        .into_connection_info()
        .map_err(|e| map_err("bad connection settings", e))?
        .set_redis_settings(redis))
}

fn tls_certificates(cfg: &Config) -> Result<Option<TlsCertificates>> {
    let Some(path) = &cfg.tls_ca else {
        return Ok(None);
    };
    let pem = std::fs::read(path).map_err(|e| {
        Error::invalid_config(format!("cannot read the tls_ca file {}", path.display()))
            .with_source(e)
    })?;
    Ok(Some(TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    }))
}

fn install_crypto_provider() {
    // The redis crate builds rustls configs from the process default provider; install ring's
    // unless the application installed one already (a lost race is harmless).
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// How to open connections for one parsed URL.
#[derive(Clone)]
pub(crate) enum Factory {
    Single(Client),
    Cluster {
        nodes: Vec<ConnectionInfo>,
        certs: Option<TlsCertificates>,
    },
}

impl Factory {
    pub(crate) fn new(cfg: &Config) -> Result<Factory> {
        if cfg.tls {
            install_crypto_provider();
        }
        let certs = tls_certificates(cfg)?;
        let nodes = cfg
            .nodes
            .iter()
            .map(|(h, p)| connection_info(cfg, h, *p))
            .collect::<Result<Vec<_>>>()?;
        if cfg.cluster {
            return Ok(Factory::Cluster { nodes, certs });
        }
        let info = nodes
            .into_iter()
            .next()
            .expect("one node, checked by the parser");
        let client = match certs {
            Some(certs) => Client::build_with_tls(info, certs),
            None => Client::open(info),
        }
        .map_err(|e| Error::invalid_config("bad TLS settings").with_source(e))?;
        Ok(Factory::Single(client))
    }

    fn cluster_client(&self, cfg: &Config, push: Option<Weak<Registry>>) -> Result<ClusterClient> {
        let Factory::Cluster { nodes, certs } = self else {
            unreachable!("cluster_client on a single-node factory");
        };
        let mut b = ClusterClientBuilder::new(nodes.clone())
            .connection_timeout(cfg.connect_timeout)
            .response_timeout(cfg.response_timeout)
            .retries(3);
        if let Some(certs) = certs {
            b = b.certs(certs.clone());
        }
        if let Some(registry) = push {
            b = b.push_sender(move |p| dispatch(&registry, p));
        }
        b.build()
            .map_err(|e| Error::invalid_config("bad cluster settings").with_source(e))
    }

    fn manager_config(cfg: &Config) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(cfg.connect_timeout))
            .set_response_timeout(Some(cfg.response_timeout))
            .set_number_of_retries(3)
    }

    /// A new multiplexed, reconnecting command connection.
    pub(crate) async fn command_conn(&self, cfg: &Config) -> Result<Conn> {
        match self {
            Factory::Single(client) => client
                .get_connection_manager_with_config(Self::manager_config(cfg))
                .await
                .map(Conn::Single)
                .map_err(|e| map_err_connect("cannot connect to redis", e)),
            Factory::Cluster { .. } => self
                .cluster_client(cfg, None)?
                .get_async_connection()
                .await
                .map(Conn::Cluster)
                .map_err(|e| map_err_connect("cannot connect to the redis cluster", e)),
        }
    }

    /// A command connection whose responses may take `extra` longer (for `WAIT`).
    pub(crate) async fn slow_conn(&self, cfg: &Config, extra: std::time::Duration) -> Result<Conn> {
        let mut cfg = cfg.clone();
        cfg.response_timeout += extra;
        self.command_conn(&cfg).await
    }
}

fn dispatch(registry: &Weak<Registry>, push: redis::PushInfo) -> std::result::Result<(), ()> {
    match registry.upgrade() {
        Some(r) => {
            r.dispatch(push);
            Ok(())
        }
        None => Err(()),
    }
}

/// Opens the pub/sub connection lazily, on the first wait.
pub(crate) struct PubSubOpener {
    pub(crate) factory: Factory,
    pub(crate) cfg: Config,
}

#[async_trait::async_trait]
impl PubSubFactory for PubSubOpener {
    async fn open(&self, registry: Weak<Registry>) -> Result<PubSubConn> {
        match &self.factory {
            Factory::Single(client) => {
                let config = Factory::manager_config(&self.cfg)
                    .set_push_sender(move |p| dispatch(&registry, p))
                    .set_automatic_resubscription();
                client
                    .get_connection_manager_with_config(config)
                    .await
                    .map(PubSubConn::Single)
                    .map_err(|e| map_err_connect("cannot open the pub/sub connection", e))
            }
            Factory::Cluster { .. } => self
                .factory
                .cluster_client(&self.cfg, Some(registry))?
                .get_async_connection()
                .await
                .map(PubSubConn::Cluster)
                .map_err(|e| map_err_connect("cannot open the cluster pub/sub connection", e)),
        }
    }
}
