//! MariaDB 10.11 (Debian): install-db into a throw-away dir, restartable with or without data.

use crate::process::ServerProcess;
use crate::sql_server::{DB, Dialect, PASSWORD, SqlServer, USER};
use crate::util::{Result, TempDir, Timeouts, free_port, is_root, run};

/// A MariaDB server (no doublewrite; the log written at commit, fsynced once a second: a killed
/// server keeps every commit) with a database `locksmith`
/// and a TCP user `locksmith`. Its URL, port and process come from [`SqlServer`], which it
/// dereferences to.
#[derive(Debug)]
pub struct MariaDb {
    server: SqlServer,
}

derefs_to!(MariaDb, server: SqlServer);

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
        let server = SqlServer::new("mysql", port, process, timeouts, dir);
        crate::sql_server::ready(MariaDb { server }).await
    }

    fn socket(&self) -> String {
        format!("--socket={}", self.dir.join("mariadb.sock").display())
    }

    /// Kills the server (`-9`) and starts it again on the same port: with its data (crash
    /// recovery) or, with `keep_data == false`, freshly installed (every table gone).
    ///
    /// Cancel safety: a dropped restart may leave the server stopped.
    pub async fn restart(&mut self, keep_data: bool) -> Result<()> {
        crate::sql_server::restart(self, keep_data).await
    }
}

impl Dialect for MariaDb {
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
}
