//! Test tools: own PostgreSQL / MariaDB instances (for tests that restart a server or need
//! small connection limits; never the shared ones), and a TCP proxy that counts the client's
//! requests and can go silent (an unreachable database).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PGBIN: &str = "/usr/lib/postgresql/15/bin";

/// Whether servers may be started here (the Debian packages are installed); under
/// `LOCK_TEST_REQUIRE_ALL` their absence fails the test.
pub fn can_start(binary: &str) -> bool {
    let ok = std::path::Path::new(binary).exists()
        || Command::new("which")
            .arg(binary)
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !ok && std::env::var_os(conformance::REQUIRE_ALL_ENV).is_some() {
        panic!("{binary} is not installed (LOCK_TEST_REQUIRE_ALL is set)");
    }
    ok
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn scratch_dir(label: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "lock-sql-{label}-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + timeout;
    while !ok() {
        assert!(
            std::time::Instant::now() < end,
            "{what}: not ready after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A PostgreSQL 15 of our own on a free port (trust auth, user `postgres`), started like
/// scripts/servers.sh does (including `synchronous_commit = off`, so a test sees what the
/// library forces). Stopped and deleted on drop.
pub struct OwnPostgres {
    dir: PathBuf,
    pub port: u16,
}

impl OwnPostgres {
    pub fn start(max_connections: u32) -> OwnPostgres {
        let dir = scratch_dir("pg");
        let port = free_port();
        let pg = OwnPostgres { dir, port };
        std::fs::create_dir_all(pg.dir.join("sock")).unwrap();
        if is_root() {
            Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&pg.dir)
                .status()
                .unwrap();
        }
        let data = pg.dir.join("data");
        let st = pg
            .as_pg(&format!("{PGBIN}/initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=trust",
                "--no-locale",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "initdb failed");
        let conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
             max_connections = {max_connections}\nsuperuser_reserved_connections = 0\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n",
            pg.dir.join("sock").display()
        );
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap();
        std::io::Write::write_all(&mut f, conf.as_bytes()).unwrap();
        pg.pg_ctl("start");
        pg
    }

    fn as_pg(&self, program: &str) -> Command {
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", program])
                .current_dir(&self.dir);
            c
        } else {
            Command::new(program)
        }
    }

    fn pg_ctl(&self, action: &str) {
        let mut c = self.as_pg(&format!("{PGBIN}/pg_ctl"));
        c.arg("-D").arg(self.dir.join("data"));
        match action {
            "start" => {
                c.arg("-l")
                    .arg(self.dir.join("postgres.log"))
                    .args(["-w", "-t", "60", "start"]);
            }
            // Immediate: no checkpoint, no flush of WAL buffers; recovery runs at the next
            // start, as after a crash.
            "crash" => {
                c.args(["-m", "immediate", "-w", "-t", "30", "stop"]);
            }
            other => panic!("{other}"),
        }
        let st = c
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "pg_ctl {action} failed");
    }

    /// Crashes the server (immediate shutdown) and starts it again on the same port.
    pub fn crash_and_restart(&self) {
        self.pg_ctl("crash");
        self.pg_ctl("start");
    }

    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = self
            .as_pg(&format!("{PGBIN}/pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "-t", "20", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A MariaDB 10.11 of our own on a free port, started like scripts/servers.sh does; user
/// `locksmith`/`pw` on database `locksmith` (no CONNECTION ADMIN, so `max_connections` binds).
/// Killed and deleted on drop.
pub struct OwnMariadb {
    dir: PathBuf,
    child: Child,
    pub port: u16,
}

impl OwnMariadb {
    pub fn start(max_connections: u32) -> OwnMariadb {
        let dir = scratch_dir("my");
        let port = free_port();
        std::fs::create_dir_all(dir.join("data")).unwrap();
        std::fs::create_dir_all(dir.join("tmp")).unwrap();
        let root: &[&str] = if is_root() { &["--user=root"] } else { &[] };
        let st = Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .args(root)
            .args([
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
                "--skip-name-resolve",
                "--innodb-log-file-size=16M",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "mariadb-install-db failed");
        let sock = dir.join("mariadb.sock");
        let child = Command::new("mariadbd")
            .arg("--no-defaults")
            .args(root)
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--tmpdir={}", dir.join("tmp").display()))
            .arg(format!("--socket={}", sock.display()))
            .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
            .arg(format!("--port={port}"))
            .args(["--bind-address=127.0.0.1", "--skip-name-resolve"])
            .arg(format!("--log-error={}", dir.join("mariadb.log").display()))
            .arg(format!("--max-connections={max_connections}"))
            .args([
                "--innodb-flush-log-at-trx-commit=1",
                "--innodb-doublewrite=0",
                "--innodb-log-file-size=16M",
                "--innodb-buffer-pool-size=64M",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let my = OwnMariadb { dir, child, port };
        wait_until("mariadbd", Duration::from_secs(60), || {
            Command::new("mariadb-admin")
                .arg("--no-defaults")
                .arg(format!("--socket={}", sock.display()))
                .args(["-uroot", "--connect-timeout=2", "ping"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        let mut c = Command::new("mariadb")
            .arg("--no-defaults")
            .arg(format!("--socket={}", sock.display()))
            .arg("-uroot")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        std::io::Write::write_all(
            c.stdin.as_mut().unwrap(),
            b"CREATE DATABASE locksmith;
              CREATE USER 'locksmith'@'127.0.0.1' IDENTIFIED BY 'pw';
              GRANT ALL PRIVILEGES ON locksmith.* TO 'locksmith'@'127.0.0.1';
              GRANT PROCESS ON *.* TO 'locksmith'@'127.0.0.1';\n",
        )
        .unwrap();
        drop(c.stdin.take());
        assert!(c.wait().unwrap().success(), "mariadb user setup failed");
        my
    }

    pub fn url(&self) -> String {
        format!(
            "mysql://locksmith:pw@127.0.0.1:{}/locksmith?ssl-mode=disabled",
            self.port
        )
    }
}

impl Drop for OwnMariadb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Which protocol a [`Proxy`] parses to count requests.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// PostgreSQL frontend messages: a round trip ends with `Sync` (`S`) or is a simple
    /// `Query` (`Q`). The URL must say `sslmode=disable`.
    Postgres,
    /// MySQL client packets: a command is a packet with sequence id 0. The URL must say
    /// `ssl-mode=disabled`.
    MySql,
}

/// A TCP proxy on 127.0.0.1 in front of `target`: counts the client's requests (round trips)
/// and can go silent (`stall`: nothing is forwarded either way, as with a dropped network).
pub struct Proxy {
    pub addr: SocketAddr,
    requests: Arc<AtomicU64>,
    stalled: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr, wire: Wire) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let stalled = Arc::new(AtomicBool::new(false));
        let (r, s) = (requests.clone(), stalled.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (r, s) = (r.clone(), s.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = pump(cr, sw, s.clone(), Some((wire, r)));
                    let down = pump(sr, cw, s, None);
                    tokio::select! { _ = up => {}, _ = down => {} }
                });
            }
        });
        Proxy {
            addr,
            requests,
            stalled,
            task,
        }
    }

    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    pub fn stall(&self, on: bool) {
        self.stalled.store(on, Ordering::SeqCst);
    }

    /// `url` with its host and port replaced by the proxy's.
    pub fn url(&self, url: &str) -> String {
        let mut u = url::Url::parse(url).unwrap();
        u.set_host(Some("127.0.0.1")).unwrap();
        u.set_port(Some(self.addr.port())).unwrap();
        u.to_string()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Forwards bytes; while stalled, holds them (never forwards, never closes). Counts requests
/// on the client-to-server direction.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    stalled: Arc<AtomicBool>,
    count: Option<(Wire, Arc<AtomicU64>)>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut parser = Parser::default();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some((wire, c)) = &count {
            let k = parser.feed(*wire, &buf[..n]);
            c.fetch_add(k, Ordering::SeqCst);
        }
        while stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Splits the client's byte stream into messages and counts request ends.
#[derive(Default)]
struct Parser {
    pending: Vec<u8>,
    /// Messages seen (PostgreSQL: the first, the startup message, has no type byte).
    seen: u64,
}

impl Parser {
    fn feed(&mut self, wire: Wire, bytes: &[u8]) -> u64 {
        self.pending.extend_from_slice(bytes);
        let mut counted = 0;
        loop {
            let p = &self.pending;
            let (len, request) = match wire {
                Wire::Postgres if self.seen == 0 => {
                    if p.len() < 4 {
                        break;
                    }
                    (u32::from_be_bytes([p[0], p[1], p[2], p[3]]) as usize, false)
                }
                Wire::Postgres => {
                    if p.len() < 5 {
                        break;
                    }
                    let l = u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as usize + 1;
                    (l, p[0] == b'S' || p[0] == b'Q')
                }
                Wire::MySql => {
                    if p.len() < 4 {
                        break;
                    }
                    let l = (p[0] as usize) | (p[1] as usize) << 8 | (p[2] as usize) << 16;
                    (l + 4, p[3] == 0)
                }
            };
            if self.pending.len() < len {
                break;
            }
            self.pending.drain(..len);
            self.seen += 1;
            if request {
                counted += 1;
            }
        }
        counted
    }
}
