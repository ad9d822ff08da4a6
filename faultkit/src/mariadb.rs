//! MariaDB 10.11 (Debian): install-db into a throw-away dir, restartable with or without data.

use crate::process::ServerProcess;
use crate::util::{Result, TempDir, Timeouts, free_port, is_root, run};

const USER: &str = "locksmith";
const PASSWORD: &str = "locksmith-pw";
const DB: &str = "locksmith";

/// A MariaDB server (no doublewrite; the log written at commit, fsynced once a second: a killed
/// server keeps every commit) with a database `locksmith`
/// and a TCP user `locksmith`.
#[derive(Debug)]
pub struct MariaDb {
    port: u16,
    process: ServerProcess,
    timeouts: Timeouts,
    dir: TempDir,
}

impl MariaDb {
    /// Installs the system tables, starts the server, creates the user and database; waits
    /// until it accepts connections.
    ///
    /// Cancel safety: a dropped start kills the server.
    pub async fn start() -> Result<Self> {
        Self::start_with(&[]).await
    }

    /// As [`MariaDb::start`], with server options after the defaults, which they override:
    /// `&["--max-connections=50"]`. (The user has `CONNECTION ADMIN`: MariaDB lets it open one
    /// connection past `max_connections`.)
    ///
    /// Cancel safety: a dropped start kills the server.
    pub async fn start_with(options: &[&str]) -> Result<Self> {
        let dir = TempDir::new("mariadb", false)?;
        let timeouts = Timeouts::scaled();
        std::fs::create_dir_all(dir.join("tmp"))?;
        Self::install(&dir, timeouts).await?;
        let port = free_port()?;
        let d = |p: &str| dir.join(p).to_string_lossy().into_owned();
        let mut args = vec![
            "--no-defaults".to_string(),
            format!("--datadir={}", d("data")),
            format!("--tmpdir={}", d("tmp")),
            format!("--socket={}", d("mariadb.sock")),
            format!("--pid-file={}", d("mariadb.pid")),
            format!("--port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--skip-name-resolve".into(),
            "--max-connections=200".into(),
            // 2: the log is written at each commit and fsynced once a second: a killed server
            // (not a crashed OS) keeps every commit, as a restart with data must.
            "--innodb-flush-log-at-trx-commit=2".into(),
            "--innodb-doublewrite=0".into(),
            "--innodb-log-file-size=16M".into(),
            "--innodb-buffer-pool-size=32M".into(),
            "--performance-schema=OFF".into(),
        ];
        if is_root() {
            args.insert(1, "--user=root".into());
        }
        args.extend(options.iter().map(|o| o.to_string()));
        let process = ServerProcess::spawn(
            format!("mariadb :{port}"),
            "mariadbd",
            args,
            dir.join("mariadb.log"),
        )?;
        let mut m = MariaDb {
            port,
            process,
            timeouts,
            dir,
        };
        m.wait_ready().await?;
        m.create_user().await?;
        Ok(m)
    }

    async fn install(dir: &TempDir, t: Timeouts) -> Result<()> {
        let datadir = format!("--datadir={}", dir.join("data").display());
        // Its own temp dir: the bootstrap's temporary tables in the shared /tmp were seen to
        // vanish under it when several installs ran at once ("Could not remove temporary
        // table ... error: 2"), failing the install.
        let tmpdir = format!("--tmpdir={}", dir.join("tmp").display());
        let mut args = vec![
            "--no-defaults",
            datadir.as_str(),
            tmpdir.as_str(),
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
            "--skip-name-resolve",
            "--innodb-log-file-size=16M",
        ];
        if is_root() {
            args.insert(1, "--user=root");
        }
        run("mariadb-install-db", &args, t.start).await.map(drop)
    }

    fn socket(&self) -> String {
        format!("--socket={}", self.dir.join("mariadb.sock").display())
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let sock = self.socket();
        let t = self.timeouts;
        self.process
            .wait_ready("mariadb-admin ping", t.start, || {
                let sock = sock.clone();
                async move {
                    Ok(run(
                        "mariadb-admin",
                        &[
                            "--no-defaults",
                            &sock,
                            "-uroot",
                            "--connect-timeout=2",
                            "ping",
                        ],
                        t.command,
                    )
                    .await
                    .is_ok())
                }
            })
            .await
    }

    async fn create_user(&self) -> Result<()> {
        let sql = format!(
            "CREATE DATABASE {DB}; \
             CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'; \
             GRANT ALL PRIVILEGES ON {DB}.* TO '{USER}'@'127.0.0.1'; \
             GRANT PROCESS, CONNECTION ADMIN ON *.* TO '{USER}'@'127.0.0.1';"
        );
        run(
            "mariadb",
            &["--no-defaults", &self.socket(), "-uroot", "-e", &sql],
            self.timeouts.command,
        )
        .await
        .map(drop)
    }

    /// `mysql://locksmith:locksmith-pw@127.0.0.1:PORT/locksmith`.
    pub fn url(&self) -> String {
        format!("mysql://{USER}:{PASSWORD}@127.0.0.1:{}/{DB}", self.port)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process, to kill, pause or resume it.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    /// Kills the server (`-9`) and starts it again on the same port: with its data (crash
    /// recovery) or, with `keep_data == false`, freshly installed (every table gone).
    ///
    /// Cancel safety: a dropped restart may leave the server stopped.
    pub async fn restart(&mut self, keep_data: bool) -> Result<()> {
        self.process.kill();
        if !keep_data {
            std::fs::remove_dir_all(self.dir.join("data"))?;
            Self::install(&self.dir, self.timeouts).await?;
        }
        self.process.respawn()?;
        self.wait_ready().await?;
        if !keep_data {
            self.create_user().await?;
        }
        Ok(())
    }
}
