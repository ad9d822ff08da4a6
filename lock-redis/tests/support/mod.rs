//! Throw-away redis-server processes for tests that kill or restart a server (never the shared
//! test servers). Each lives in its own temporary directory on a free loopback port and is killed
//! when dropped, also on panic.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lockcore::Instant;

/// One redis-server (or sentinel) child process.
pub struct RedisProcess {
    pub port: u16,
    dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

/// A free loopback port (bound and released; the server binds it right after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "lock-redis-test-{tag}-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl RedisProcess {
    /// A server without persistence: a restart comes back empty.
    pub async fn start() -> RedisProcess {
        Self::start_with(&["--save", "", "--appendonly", "no"]).await
    }

    /// A server that keeps its data across a kill (append-only file, fsync on every write).
    pub async fn start_persistent() -> RedisProcess {
        Self::start_with(&[
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ])
        .await
    }

    pub async fn start_with(extra: &[&str]) -> RedisProcess {
        let port = free_port();
        let dir = temp_dir("server");
        let mut args: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            dir.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut p = RedisProcess {
            port,
            dir,
            args,
            child: None,
        };
        p.spawn().await;
        p
    }

    /// A sentinel watching `primary_port` under the name `name` (quorum `quorum`), failing over
    /// quickly.
    pub async fn start_sentinel(name: &str, primary_port: u16, quorum: u32) -> RedisProcess {
        let port = free_port();
        let dir = temp_dir("sentinel");
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {name} 127.0.0.1 {primary_port} {quorum}\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 5000\n\
                 sentinel parallel-syncs {name} 1\n",
                dir = dir.display()
            ),
        )
        .unwrap();
        let mut p = RedisProcess {
            port,
            dir,
            args: vec![conf.display().to_string(), "--sentinel".into()],
            child: None,
        };
        p.spawn().await;
        p
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        self.child = Some(child);
        self.wait_ready().await;
    }

    async fn wait_ready(&self) {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = self.raw().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .is_ok()
            {
                return;
            }
            assert!(
                Instant::now() < end,
                "redis-server on {} did not start",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A plain connection to this process, for inspection.
    pub async fn raw(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the process again on the same port and directory.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    /// SIGSTOP / SIGCONT.
    pub fn pause(&self, stop: bool) {
        let pid = self.child.as_ref().expect("running").id();
        let sig = if stop { "-STOP" } else { "-CONT" };
        Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap();
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A paused process ignores SIGKILL until continued on some kernels: continue first.
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits (bounded, scaled) until `cond` holds, checking every few ms.
pub async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + Duration::from_secs_f64(15.0 * conformance::time_scale());
    while !cond().await {
        assert!(Instant::now() < end, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
