//! Redis: a single node without persistence, and primary + replica + 3 sentinels.

use std::time::Duration;

use crate::process::ServerProcess;
use crate::util::{Result, TempDir, Timeouts, free_port, run, wait_for_other};

/// Runs `redis-cli -p PORT args...` and returns its output.
///
/// Cancel safety: a dropped call kills `redis-cli`.
pub(crate) async fn cli(port: u16, args: &[&str], timeout: Duration) -> Result<String> {
    let p = port.to_string();
    let mut all = vec!["-h", "127.0.0.1", "-p", p.as_str()];
    all.extend_from_slice(args);
    run("redis-cli", &all, timeout).await
}

async fn pings(port: u16) -> Result<bool> {
    Ok(cli(port, &["PING"], Duration::from_secs(2)).await?.trim() == "PONG")
}

fn spawn_redis(dir: &TempDir, label: &str, port: u16, extra: &[String]) -> Result<ServerProcess> {
    let mut after = strings(&["--enable-debug-command", "local"]);
    after.extend_from_slice(extra);
    spawn_redis_listening(
        dir,
        label,
        port,
        strings(&["--port", &port.to_string()]),
        after,
    )
}

/// `redis-server` without persistence in `dir/label`, listening as `listen` says on port
/// `port` of 127.0.0.1, with `after` last (where it overrides the defaults).
fn spawn_redis_listening(
    dir: &TempDir,
    label: &str,
    port: u16,
    listen: Vec<String>,
    after: Vec<String>,
) -> Result<ServerProcess> {
    let sub = dir.join(label);
    std::fs::create_dir_all(&sub)?;
    let mut args = listen;
    args.extend(strings(&[
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--dir",
        &sub.to_string_lossy(),
    ]));
    args.extend(after);
    ServerProcess::spawn(
        format!("redis {label} :{port}"),
        "redis-server",
        args,
        sub.join("redis.log"),
    )
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Spawns a TLS-only `redis-server` (no plain port) in `dir/label`, on `port` of 127.0.0.1,
/// without persistence, with `password`, serving the certificate `server.pem` and key
/// `server.key` found in `certs` (clients are not asked for certificates; `ca.pem` there
/// verifies any that are given). Waiting until it serves is the caller's (a TLS `PING` needs
/// the CA and the password): [`ServerProcess::wait_ready`].
pub fn spawn_tls_redis(
    dir: &TempDir,
    label: &str,
    port: u16,
    certs: &std::path::Path,
    password: &str,
) -> Result<ServerProcess> {
    let file = |f: &str| certs.join(f).to_string_lossy().into_owned();
    let listen = strings(&[
        "--port",
        "0",
        "--tls-port",
        &port.to_string(),
        "--tls-cert-file",
        &file("server.pem"),
        "--tls-key-file",
        &file("server.key"),
        "--tls-ca-cert-file",
        &file("ca.pem"),
        "--tls-auth-clients",
        "no",
        "--requirepass",
        password,
    ]);
    spawn_redis_listening(dir, label, port, listen, Vec::new())
}

/// One Redis server, without persistence (`save ""`, no AOF: a restart loses every key, the
/// fencing counters included) unless started with [`RedisServer::start_persistent`].
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    process: ServerProcess,
    timeouts: Timeouts,
    _dir: TempDir,
}

impl RedisServer {
    /// Starts it and waits until it answers `PING`.
    ///
    /// Cancel safety: a dropped start kills the server.
    pub async fn start() -> Result<Self> {
        Self::launch(&[]).await
    }

    /// Starts one that keeps its data across a kill (append-only file, fsync on every write):
    /// [`RedisServer::restart`] brings back every key written before.
    ///
    /// Cancel safety: a dropped start kills the server.
    pub async fn start_persistent() -> Result<Self> {
        Self::launch(&["--appendonly", "yes", "--appendfsync", "always"]).await
    }

    async fn launch(extra: &[&str]) -> Result<Self> {
        let dir = TempDir::new("redis", false)?;
        let port = free_port()?;
        let timeouts = Timeouts::scaled();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let process = spawn_redis(&dir, "node", port, &extra)?;
        let mut s = RedisServer {
            port,
            process,
            timeouts,
            _dir: dir,
        };
        s.wait_ready().await?;
        Ok(s)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let port = self.port;
        self.process
            .wait_ready("PING", self.timeouts.start, || pings(port))
            .await
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process, to kill, pause or resume it.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    /// Kills it (`-9`) and starts it again on the same port and data directory, and waits
    /// until it answers: empty without persistence, with every key written before after
    /// [`RedisServer::start_persistent`].
    ///
    /// Cancel safety: a dropped restart may leave the server stopped.
    pub async fn restart(&mut self) -> Result<()> {
        self.process.respawn()?;
        self.wait_ready().await
    }

    /// Runs a command through `redis-cli` (for example `["PEXPIRE", key, "10"]`).
    ///
    /// Cancel safe.
    pub async fn cli(&self, args: &[&str]) -> Result<String> {
        cli(self.port, args, self.timeouts.command).await
    }

    /// Starts `MONITOR` on it: every command it runs from then on, with its arguments.
    ///
    /// Cancel safety: a dropped start kills `redis-cli`.
    pub async fn monitor(&self) -> Result<crate::RedisMonitor> {
        crate::RedisMonitor::start(self.port, self.timeouts.command).await
    }
}

/// The master name the sentinels of a [`RedisFailover`] monitor.
const MASTER: &str = "faultkit";

/// A Redis primary, one replica and three sentinels (quorum 2, `down-after-milliseconds`
/// 1000, `failover-timeout` 3000): a failover takes about 2-3 s after the primary stops
/// answering. Nodes are persistence-free.
#[derive(Debug)]
pub struct RedisFailover {
    nodes: Vec<(u16, ServerProcess)>,
    sentinels: Vec<(u16, ServerProcess)>,
    timeouts: Timeouts,
    _dir: TempDir,
}

impl RedisFailover {
    /// Starts the primary (node 0), the replica (node 1) and the sentinels, and waits until the
    /// replica is in sync and every sentinel sees the replica and the two other sentinels.
    ///
    /// Cancel safety: a dropped start kills what it started.
    pub async fn start() -> Result<Self> {
        let dir = TempDir::new("redis-failover", false)?;
        let timeouts = Timeouts::scaled();
        let p0 = free_port()?;
        let p1 = free_port()?;
        let mut nodes = vec![(p0, spawn_redis(&dir, "node0", p0, &[])?)];
        nodes.push((
            p1,
            spawn_redis(
                &dir,
                "node1",
                p1,
                &["--replicaof".into(), "127.0.0.1".into(), p0.to_string()],
            )?,
        ));
        for (port, proc) in &mut nodes {
            let port = *port;
            proc.wait_ready("PING", timeouts.start, || pings(port))
                .await?;
        }
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port()?;
            let sub = dir.join(format!("sentinel{i}"));
            std::fs::create_dir_all(&sub)?;
            let conf = sub.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir \"{}\"\n\
                     sentinel monitor {MASTER} 127.0.0.1 {p0} 2\n\
                     sentinel down-after-milliseconds {MASTER} 1000\n\
                     sentinel failover-timeout {MASTER} 3000\n\
                     sentinel parallel-syncs {MASTER} 1\n",
                    sub.display()
                ),
            )?;
            let proc = ServerProcess::spawn(
                format!("redis sentinel{i} :{port}"),
                "redis-server",
                vec![conf.to_string_lossy().into_owned(), "--sentinel".into()],
                sub.join("sentinel.log"),
            )?;
            sentinels.push((port, proc));
        }
        let mut f = RedisFailover {
            nodes,
            sentinels,
            timeouts,
            _dir: dir,
        };
        let replica = f.nodes[1].0;
        let t = f.timeouts;
        f.nodes[1]
            .1
            .wait_ready("replica in sync", t.start, || async move {
                Ok(cli(replica, &["INFO", "replication"], t.command)
                    .await?
                    .contains("master_link_status:up"))
            })
            .await?;
        for (port, proc) in &mut f.sentinels {
            let port = *port;
            proc.wait_ready("sentinel sees replica and peers", t.start, || async move {
                let out = cli(port, &["SENTINEL", "MASTER", MASTER], t.command).await?;
                let kv: Vec<&str> = out.lines().collect();
                let get = |k: &str| {
                    kv.chunks(2)
                        .find(|c| c[0] == k)
                        .and_then(|c| c.get(1))
                        .and_then(|v| v.parse::<u32>().ok())
                        .unwrap_or(0)
                };
                Ok(get("num-slaves") >= 1 && get("num-other-sentinels") >= 2)
            })
            .await?;
        }
        Ok(f)
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/faultkit`: a client that asks the
    /// sentinels for the primary (and follows a failover).
    pub fn sentinel_url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// The URL of node `i` (0: the first primary, 1: the first replica).
    pub fn node_url(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}", self.nodes[i].0)
    }

    /// The port of node `i`.
    pub fn node_port(&self, i: usize) -> u16 {
        self.nodes[i].0
    }

    /// Node `i`'s process, to kill, pause or resume it.
    pub fn node(&mut self, i: usize) -> &mut ServerProcess {
        &mut self.nodes[i].1
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|(p, _)| *p).collect()
    }

    /// The node index the sentinels name as primary now (asked of the first sentinel that
    /// answers).
    ///
    /// Cancel safe.
    pub async fn primary(&self) -> Result<usize> {
        let mut last = None;
        for (port, _) in &self.sentinels {
            match cli(
                *port,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER],
                self.timeouts.command,
            )
            .await
            {
                Ok(out) => {
                    let p: Option<u16> = out.lines().nth(1).and_then(|l| l.trim().parse().ok());
                    if let Some(i) = self.nodes.iter().position(|(np, _)| Some(*np) == p) {
                        return Ok(i);
                    }
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| crate::Error::msg("no sentinel names a known primary")))
    }

    /// Waits until the sentinels name another primary than node `old`; returns the new one.
    ///
    /// Cancel safe.
    pub async fn wait_failover(&self, old: usize, timeout: Duration) -> Result<usize> {
        wait_for_other("sentinel failover", old, timeout, || self.primary()).await
    }

    /// The `ROLE` node `i` gives itself (`master` or `slave`).
    ///
    /// Cancel safe.
    pub async fn role(&self, i: usize) -> Result<String> {
        let out = cli(self.nodes[i].0, &["ROLE"], self.timeouts.command).await?;
        Ok(out.lines().next().unwrap_or_default().trim().to_string())
    }

    /// Runs a command on node `i` through `redis-cli`.
    ///
    /// Cancel safe.
    pub async fn cli(&self, i: usize, args: &[&str]) -> Result<String> {
        cli(self.nodes[i].0, args, self.timeouts.command).await
    }
}
