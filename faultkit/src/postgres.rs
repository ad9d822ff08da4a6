//! PostgreSQL 15 (Debian): initdb into a throw-away dir, restartable with or without its data.

use crate::process::ServerProcess;
use crate::sql_server::{DB, Dialect, PASSWORD, SqlServer, USER};
use crate::util::{Result, TempDir, Timeouts, free_port, is_root, run};

const BIN: &str = "/usr/lib/postgresql/15/bin";

/// A PostgreSQL server (fsync off: a killed server keeps every commit, a crashed OS would not;
/// synchronous commit on; trust authentication on 127.0.0.1) with a database
/// `locksmith` owned by the user `locksmith`. PostgreSQL refuses to run as root: as root, it
/// runs as the `postgres` user (through `setpriv`). Its URL, port and process (the
/// postmaster's process group) come from [`SqlServer`], which it dereferences to.
#[derive(Debug)]
pub struct Postgres {
    server: SqlServer,
}

derefs_to!(Postgres, server: SqlServer);

/// `program args` as the postgres user when we are root.
fn as_pg(program: &str, args: &[String]) -> (String, Vec<String>) {
    if is_root() {
        let mut all: Vec<String> = [
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
            program,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        all.extend_from_slice(args);
        ("setpriv".into(), all)
    } else {
        (program.into(), args.to_vec())
    }
}

impl Postgres {
    /// initdb, start, create the user and database; waits until it accepts connections.
    ///
    /// Cancel safety: a dropped start kills the server.
    pub async fn start() -> Result<Self> {
        Self::start_with(&[]).await
    }

    /// As [`Postgres::start`], with server settings (`-c name=value`) after the defaults, which
    /// they override: `&[("max_connections", "50"), ("synchronous_commit", "off")]`.
    ///
    /// Cancel safety: a dropped start kills the server.
    pub async fn start_with(settings: &[(&str, &str)]) -> Result<Self> {
        let dir = TempDir::new("postgres", false)?;
        let timeouts = Timeouts::scaled();
        if is_root() {
            run(
                "chown",
                &["postgres:postgres", &dir.path().to_string_lossy()],
                timeouts.command,
            )
            .await?;
        }
        Self::install(&dir, timeouts).await?;
        let port = free_port()?;
        let mut server_args: Vec<String> = vec![
            "-D".into(),
            dir.join("data").to_string_lossy().into_owned(),
            "-p".into(),
            port.to_string(),
            "-k".into(),
            dir.path().to_string_lossy().into_owned(),
            "-c".into(),
            "listen_addresses=127.0.0.1".into(),
            "-c".into(),
            "fsync=off".into(),
            "-c".into(),
            "full_page_writes=off".into(),
            "-c".into(),
            "max_connections=100".into(),
        ];
        for (name, value) in settings {
            server_args.push("-c".into());
            server_args.push(format!("{name}={value}"));
        }
        let (prog, args) = as_pg(&format!("{BIN}/postgres"), &server_args);
        let process = ServerProcess::spawn(
            format!("postgres :{port}"),
            prog,
            args,
            dir.join("postgres.log"),
        )?;
        let server = SqlServer::new("postgres", port, process, timeouts, dir);
        crate::sql_server::ready(Postgres { server }).await
    }

    async fn psql_as_postgres(&self, sql: &str) -> Result<String> {
        let port = self.port.to_string();
        run(
            &format!("{BIN}/psql"),
            &[
                "-X",
                "-q",
                "-t",
                "-A",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-c",
                sql,
            ],
            self.timeouts.command,
        )
        .await
    }

    /// Kills the server (`-9`; its backends exit when they notice) and starts it again on the same
    /// port: with its data directory (crash recovery) or, with `keep_data == false`, from a
    /// fresh initdb (every table gone).
    ///
    /// Cancel safety: a dropped restart may leave the server stopped.
    pub async fn restart(&mut self, keep_data: bool) -> Result<()> {
        crate::sql_server::restart(self, keep_data).await
    }
}

impl Dialect for Postgres {
    async fn install(dir: &TempDir, t: Timeouts) -> Result<()> {
        let (prog, args) = as_pg(
            &format!("{BIN}/initdb"),
            &[
                "-D".into(),
                dir.join("data").to_string_lossy().into_owned(),
                "-U".into(),
                "postgres".into(),
                "--auth=trust".into(),
                "--no-locale".into(),
                "-E".into(),
                "UTF8".into(),
                "--no-sync".into(),
                "--no-instructions".into(),
            ],
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&prog, &args, t.start).await.map(drop)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let port = self.port.to_string();
        let t = self.timeouts;
        self.process
            .wait_ready("pg_isready", t.start, || {
                let port = port.clone();
                async move {
                    Ok(run(
                        "pg_isready",
                        &["-q", "-h", "127.0.0.1", "-p", &port, "-d", "postgres"],
                        t.command,
                    )
                    .await
                    .is_ok())
                }
            })
            .await
    }

    async fn create_user(&self) -> Result<()> {
        self.psql_as_postgres(&format!("CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'"))
            .await?;
        self.psql_as_postgres(&format!("CREATE DATABASE {DB} OWNER {USER}"))
            .await
            .map(drop)
    }
}
