//! Connections: a single node (or the primary a set of sentinels names) through
//! [`Reconnecting`], or a cluster through the cluster client's async connection, behind one
//! `ConnectionLike`.
//!
//! [`Reconnecting`] replaces redis-rs' `ConnectionManager`, which gives up after a few retries
//! and then hands the cached failure to the next command even once the server is back. Here one
//! supervisor task per connection reconnects without a retry cap (jittered exponential delay,
//! bounded by [`MAX_RECONNECT_DELAY`]); a command that finds the connection down asks for an
//! attempt at once and waits for the outcome of an attempt that started after it asked (never
//! an older one), at most the connect timeout; and a hook runs on every new connection before
//! any command uses it (the pub/sub side re-subscribes there).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo,
    Pipeline, ProtocolVersion, PushInfo, PushKind, RedisConnectionInfo, RedisError, RedisFuture,
    RedisResult, TlsCertificates, Value,
};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::Config;
use crate::error::{map_err, map_err_connect};
use crate::subs::{PubSubFactory, PubSubLink, Registry};
use lockcore::{Error, Result};

/// The longest pause between two reconnection attempts (the delay doubles from
/// [`MIN_RECONNECT_DELAY`] up to it, with full jitter). A command that needs the connection
/// does not wait for it: it triggers an attempt at once.
pub(crate) const MAX_RECONNECT_DELAY: Duration = Duration::from_millis(1000);
/// The shortest pause between two attempts, so that commands arriving during an outage cannot
/// make the supervisor spin.
const MIN_RECONNECT_DELAY: Duration = Duration::from_millis(10);

/// A multiplexed connection for commands (a `redis::aio::ConnectionLike`). Clones share it.
#[derive(Clone)]
pub enum Conn {
    /// One server (or the primary named by sentinels), reconnecting by itself.
    Single(Reconnecting),
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
    Single(Reconnecting),
    Cluster(ClusterConnection),
}

impl PubSubConn {
    /// `SUBSCRIBE` (`on`) or `UNSUBSCRIBE` `channel`; on a cluster the sharded commands, so the
    /// subscription lives on the node of the channel's slot.
    async fn switch(&self, channel: &str, on: bool) -> RedisResult<()> {
        match self.clone() {
            PubSubConn::Single(c) => {
                c.with_conn(|mut c| async move {
                    if on {
                        c.subscribe(channel).await
                    } else {
                        c.unsubscribe(channel).await
                    }
                })
                .await
            }
            PubSubConn::Cluster(mut c) if on => c.ssubscribe(channel).await,
            PubSubConn::Cluster(mut c) => c.sunsubscribe(channel).await,
        }
    }
}

#[async_trait::async_trait]
impl PubSubLink for PubSubConn {
    async fn subscribe(&self, channel: &str) -> RedisResult<()> {
        self.switch(channel, true).await
    }

    async fn unsubscribe(&self, channel: &str) -> RedisResult<()> {
        self.switch(channel, false).await
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// Runs on every connection after the first (a reconnection) before commands use it; an
/// error fails that attempt.
pub(crate) type OnConnect =
    Arc<dyn Fn(MultiplexedConnection) -> BoxFuture<RedisResult<()>> + Send + Sync>;
/// Receives the push messages (other than disconnections) of every connection.
pub(crate) type OnPush = Arc<dyn Fn(PushInfo) + Send + Sync>;

/// Builds the client for a primary's address.
pub(crate) type PrimaryClient = Arc<dyn Fn(&str, u16) -> RedisResult<Client> + Send + Sync>;

/// Where a single-node connection goes: a fixed server, or whichever primary the sentinels name.
#[derive(Clone)]
pub(crate) enum Target {
    Direct(Client),
    Sentinel {
        /// One client per sentinel, asked in order (the one that answered moves to the front).
        sentinels: Arc<Mutex<Vec<Client>>>,
        master: String,
        /// Builds the client for the primary's address (credentials, db, TLS from the URL).
        primary: PrimaryClient,
    },
}

impl Target {
    async fn open(&self, config: &AsyncConnectionConfig) -> RedisResult<MultiplexedConnection> {
        match self {
            Target::Direct(client) => {
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
            }
            Target::Sentinel {
                sentinels,
                master,
                primary,
            } => {
                let (host, port) = ask_sentinels(sentinels, master).await?;
                let mut conn = primary(&host, port)?
                    .get_multiplexed_async_connection_with_config(config)
                    .await?;
                // A sentinel may name a primary that has just been demoted (or not yet
                // promoted): only a node that says it is the primary gets our writes.
                let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
                match role.first() {
                    Some(Value::BulkString(r)) if r.as_slice() == b"master" => Ok(conn),
                    Some(Value::SimpleString(r)) if r == "master" => Ok(conn),
                    _ => Err(RedisError::from((
                        redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                        "the node the sentinels named is not (yet) the primary",
                    ))),
                }
            }
        }
    }
}

/// Asks each sentinel in turn for the address of `master`.
async fn ask_sentinels(sentinels: &Mutex<Vec<Client>>, master: &str) -> RedisResult<(String, u16)> {
    let list = sentinels.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut last = None;
    for (i, sentinel) in list.iter().enumerate() {
        let answer: RedisResult<Option<(String, u16)>> = async {
            let mut c = sentinel.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(master)
                .query_async(&mut c)
                .await
        }
        .await;
        match answer {
            Ok(Some(addr)) => {
                if i > 0 {
                    // Ask the sentinel that answered first next time.
                    let mut l = sentinels.lock().unwrap_or_else(|e| e.into_inner());
                    if i < l.len() {
                        l.swap(0, i);
                    }
                }
                return Ok(addr);
            }
            Ok(None) => {
                last = Some(RedisError::from((
                    redis::ErrorKind::Io,
                    "a sentinel does not know the primary named in the URL",
                )))
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| RedisError::from((redis::ErrorKind::Io, "no sentinel given"))))
}

/// Whether a command error means the connection (or, behind sentinels, the node's role) cannot
/// be trusted any more: reconnect.
fn breaks_connection(e: &RedisError) -> bool {
    e.is_unrecoverable_error()
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_timeout()
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(
                redis::ServerErrorKind::ReadOnly | redis::ServerErrorKind::MasterDown
            )
        )
}

fn not_connected(msg: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::NotConnected, msg))
}

#[derive(Default)]
struct State {
    /// The live connection and its generation.
    conn: Option<(u64, MultiplexedConnection)>,
    generation: u64,
    /// Number of the last attempt started, and of the last one that failed (with its error).
    started: u64,
    failed: u64,
    last_error: Option<RedisError>,
}

struct Shared {
    target: Target,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    db: i64,
    on_connect: Option<OnConnect>,
    on_push: Option<OnPush>,
    state: Mutex<State>,
    /// Any change of `state` (connected, attempt failed).
    changed: Notify,
    /// Asks the supervisor for an attempt now.
    kick: Notify,
}

/// Aborts the supervisor when the last handle goes.
struct Supervisor(tokio::task::JoinHandle<()>);

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A multiplexed connection to one node that reconnects by itself, without a retry cap (see the
/// module docs of `conn`).
#[derive(Clone)]
pub struct Reconnecting {
    shared: Arc<Shared>,
    _supervisor: Arc<Supervisor>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks generation `generation` dead (once) and asks for a new connection.
    fn broken(&self, generation: u64) {
        let mut st = self.state();
        if st.conn.as_ref().is_some_and(|(g, _)| *g == generation) {
            st.conn = None;
            drop(st);
            self.kick.notify_one();
            self.changed.notify_waiters();
        }
    }

    /// One connection attempt, including the hook.
    async fn attempt(self: &Arc<Self>, generation: u64) -> RedisResult<MultiplexedConnection> {
        let weak = Arc::downgrade(self);
        let on_push = self.on_push.clone();
        let config = self.config.clone().set_push_sender(move |push: PushInfo| {
            if push.kind == PushKind::Disconnection {
                if let Some(shared) = weak.upgrade() {
                    shared.broken(generation);
                }
            } else if let Some(f) = &on_push {
                f(push);
            }
            Ok::<(), ()>(())
        });
        let open = async {
            let conn = self.target.open(&config).await?;
            // Not on the first: nothing was lost before it, and whoever opened it for a
            // purpose (the first SUBSCRIBE) does that itself.
            if generation > 1
                && let Some(hook) = &self.on_connect
            {
                hook(conn.clone()).await?;
            }
            Ok(conn)
        };
        match tokio::time::timeout(self.connect_timeout, open).await {
            Ok(r) => r,
            Err(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connecting to redis timed out",
            ))),
        }
    }
}

async fn supervise(shared: Arc<Shared>) {
    let mut failures = 0u32;
    loop {
        // Sleep until the connection is lost (a kick).
        loop {
            let kicked = shared.kick.notified();
            if shared.state().conn.is_none() {
                break;
            }
            kicked.await;
        }
        let (number, generation) = {
            let mut st = shared.state();
            st.started += 1;
            st.generation += 1;
            (st.started, st.generation)
        };
        match shared.attempt(generation).await {
            Ok(conn) => {
                failures = 0;
                shared.state().conn = Some((generation, conn));
                shared.changed.notify_waiters();
            }
            Err(e) => {
                tracing::debug!(error = %e, "redis reconnection attempt failed; retrying");
                {
                    let mut st = shared.state();
                    st.failed = number;
                    st.last_error = Some(e);
                }
                shared.changed.notify_waiters();
                failures = failures.saturating_add(1);
                let ceiling = MIN_RECONNECT_DELAY
                    .saturating_mul(1u32 << failures.min(16))
                    .min(MAX_RECONNECT_DELAY);
                let jittered = Duration::from_nanos(fastrand::u64(
                    0..=ceiling.as_nanos().min(u64::MAX as u128) as u64,
                ));
                tokio::time::sleep(MIN_RECONNECT_DELAY).await;
                // A command that needs the connection cuts the pause short.
                tokio::select! {
                    _ = tokio::time::sleep(jittered.saturating_sub(MIN_RECONNECT_DELAY)) => {}
                    _ = shared.kick.notified() => {}
                }
            }
        }
    }
}

impl Reconnecting {
    /// Connects (the first attempt's error is returned as is) and starts the supervisor.
    pub(crate) async fn connect(
        target: Target,
        cfg: &Config,
        response_timeout: Duration,
        on_connect: Option<OnConnect>,
        on_push: Option<OnPush>,
    ) -> RedisResult<Reconnecting> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(cfg.connect_timeout))
            .set_response_timeout(Some(response_timeout));
        let shared = Arc::new(Shared {
            target,
            config,
            connect_timeout: cfg.connect_timeout,
            db: cfg.db,
            on_connect,
            on_push,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            kick: Notify::new(),
        });
        let first = {
            let mut st = shared.state();
            st.started = 1;
            st.generation = 1;
            1
        };
        let conn = shared.attempt(first).await?;
        shared.state().conn = Some((first, conn));
        let supervisor = Arc::new(Supervisor(tokio::spawn(supervise(shared.clone()))));
        Ok(Reconnecting {
            shared,
            _supervisor: supervisor,
        })
    }

    /// The live connection; when there is none, asks for an attempt and waits (at most the
    /// connect timeout) for the outcome of an attempt that started after this call.
    async fn current(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let shared = &self.shared;
        let asked_after = {
            let st = shared.state();
            if let Some(c) = &st.conn {
                return Ok(c.clone());
            }
            st.started
        };
        shared.kick.notify_one();
        let deadline = Instant::now() + shared.connect_timeout + Duration::from_millis(100);
        loop {
            let changed = shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let st = shared.state();
                if let Some(c) = &st.conn {
                    return Ok(c.clone());
                }
                if st.failed > asked_after {
                    return Err(st
                        .last_error
                        .clone()
                        .unwrap_or_else(|| not_connected("redis is unreachable")));
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(not_connected("redis is unreachable; still reconnecting"));
            }
        }
    }

    /// Runs `f` on the live connection, marking it broken when `f` fails in a way that says so.
    pub(crate) async fn with_conn<T, F, Fut>(&self, f: F) -> RedisResult<T>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let (generation, conn) = self.current().await?;
        let result = f(conn).await;
        if let Err(e) = &result
            && breaks_connection(e)
        {
            self.shared.broken(generation);
        }
        result
    }
}

impl ConnectionLike for Reconnecting {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.with_conn(move |mut c| async move { c.send_packed_command(cmd).await }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.with_conn(move |mut c| async move {
            c.send_packed_commands(pipeline, offset, count).await
        }))
    }

    fn get_db(&self) -> i64 {
        self.shared.db
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
    Single(Target),
    Cluster {
        nodes: Vec<ConnectionInfo>,
        certs: Option<TlsCertificates>,
    },
}

fn client_for(info: ConnectionInfo, certs: &Option<TlsCertificates>) -> RedisResult<Client> {
    match certs {
        Some(certs) => Client::build_with_tls(info, certs.clone()),
        None => Client::open(info),
    }
}

impl Factory {
    /// A single-node factory on the settings of an application's client (address, TLS,
    /// credentials, database), in RESP3 whatever the client asked: the pub/sub side needs push
    /// messages, and one protocol keeps replies alike.
    pub(crate) fn from_client(client: &Client) -> Result<Factory> {
        let info = client.get_connection_info().clone();
        if matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
            install_crypto_provider();
        }
        let redis = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = Client::open(info.set_redis_settings(redis)).map_err(|e| {
            Error::invalid_config("the client's connection settings").with_source(e)
        })?;
        Ok(Factory::Single(Target::Direct(client)))
    }

    pub(crate) fn new(cfg: &Config) -> Result<Factory> {
        if cfg.tls {
            install_crypto_provider();
        }
        let certs = tls_certificates(cfg)?;
        if let Some(master) = &cfg.sentinel {
            // Sentinels: no credentials (the URL's are the data nodes'), the URL's TLS settings.
            let mut plain = cfg.clone();
            plain.username = None;
            plain.password = None;
            plain.db = 0;
            let sentinels = cfg
                .nodes
                .iter()
                .map(|(h, p)| {
                    let mut info = connection_info(&plain, h, *p)?;
                    info = info.set_redis_settings(
                        RedisConnectionInfo::default().set_protocol(ProtocolVersion::RESP2),
                    );
                    client_for(info, &certs)
                        .map_err(|e| Error::invalid_config("bad TLS settings").with_source(e))
                })
                .collect::<Result<Vec<_>>>()?;
            let primary_cfg = cfg.clone();
            let primary_certs = certs.clone();
            return Ok(Factory::Single(Target::Sentinel {
                sentinels: Arc::new(Mutex::new(sentinels)),
                master: master.clone(),
                primary: Arc::new(move |host: &str, port: u16| {
                    let info = connection_info(&primary_cfg, host, port).map_err(|_| {
                        RedisError::from((
                            redis::ErrorKind::InvalidClientConfig,
                            "the sentinels named an unusable address",
                        ))
                    })?;
                    client_for(info, &primary_certs)
                }),
            }));
        }
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
        let client = client_for(info, &certs)
            .map_err(|e| Error::invalid_config("bad TLS settings").with_source(e))?;
        Ok(Factory::Single(Target::Direct(client)))
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

    /// A new multiplexed, reconnecting command connection.
    pub(crate) async fn command_conn(&self, cfg: &Config) -> Result<Conn> {
        self.command_conn_with_timeout(cfg, cfg.response_timeout)
            .await
    }

    async fn command_conn_with_timeout(
        &self,
        cfg: &Config,
        response_timeout: Duration,
    ) -> Result<Conn> {
        match self {
            Factory::Single(target) => {
                Reconnecting::connect(target.clone(), cfg, response_timeout, None, None)
                    .await
                    .map(Conn::Single)
                    .map_err(|e| map_err_connect("cannot connect to redis", e))
            }
            Factory::Cluster { .. } => {
                let mut cfg = cfg.clone();
                cfg.response_timeout = response_timeout;
                self.cluster_client(&cfg, None)?
                    .get_async_connection()
                    .await
                    .map(Conn::Cluster)
                    .map_err(|e| map_err_connect("cannot connect to the redis cluster", e))
            }
        }
    }

    /// A command connection whose responses may take `extra` longer (for `WAIT`).
    pub(crate) async fn slow_conn(&self, cfg: &Config, extra: Duration) -> Result<Conn> {
        self.command_conn_with_timeout(cfg, cfg.response_timeout + extra)
            .await
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
    async fn open(&self, registry: Weak<Registry>) -> Result<Arc<dyn PubSubLink>> {
        match &self.factory {
            Factory::Single(target) => {
                let on_push: OnPush = {
                    let registry = registry.clone();
                    Arc::new(move |p| {
                        let _ = dispatch(&registry, p);
                    })
                };
                // Every reconnection subscribes to every channel a waiter waits on before it
                // is used, then wakes those waiters: releases published while the connection
                // was down were lost. Not the first connection: the waiters whose join opens it
                // subscribe their channels once it is open (a SUBSCRIBE here too would be the
                // same one twice, and the wake a vote for nothing).
                let on_connect: OnConnect = Arc::new(move |mut conn: MultiplexedConnection| {
                    let registry = registry.clone();
                    Box::pin(async move {
                        let Some(registry) = registry.upgrade() else {
                            return Ok(());
                        };
                        let channels = registry.channel_names();
                        if !channels.is_empty() {
                            conn.subscribe(&channels).await?;
                        }
                        registry.wake_all();
                        Ok(())
                    })
                });
                Reconnecting::connect(
                    target.clone(),
                    &self.cfg,
                    self.cfg.response_timeout,
                    Some(on_connect),
                    Some(on_push),
                )
                .await
                .map(|c| Arc::new(PubSubConn::Single(c)) as Arc<dyn PubSubLink>)
                .map_err(|e| map_err_connect("cannot open the pub/sub connection", e))
            }
            Factory::Cluster { .. } => self
                .factory
                .cluster_client(&self.cfg, Some(registry))?
                .get_async_connection()
                .await
                .map(|c| Arc::new(PubSubConn::Cluster(c)) as Arc<dyn PubSubLink>)
                .map_err(|e| map_err_connect("cannot open the cluster pub/sub connection", e)),
        }
    }
}
