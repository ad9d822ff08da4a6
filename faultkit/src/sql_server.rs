//! What the SQL server launchers ([`Postgres`](crate::Postgres), [`MariaDb`](crate::MariaDb))
//! share: one server on a loopback port with a throw-away data directory, a `locksmith` user
//! and database, started and restarted (with or without its data) alike. Each launcher gives
//! its install, readiness check and user creation ([`Dialect`]).

use std::ops::DerefMut;

use crate::process::ServerProcess;
use crate::util::{Result, TempDir, Timeouts};

/// The user every launcher creates.
pub(crate) const USER: &str = "locksmith";
/// Its password.
pub(crate) const PASSWORD: &str = "locksmith-pw";
/// The database it owns.
pub(crate) const DB: &str = "locksmith";

/// One started SQL server: its port on 127.0.0.1, its process and its directory.
/// [`Postgres`](crate::Postgres) and [`MariaDb`](crate::MariaDb) dereference to it.
#[derive(Debug)]
pub struct SqlServer {
    scheme: &'static str,
    pub(crate) port: u16,
    pub(crate) process: ServerProcess,
    pub(crate) timeouts: Timeouts,
    pub(crate) dir: TempDir,
}

impl SqlServer {
    /// A started server answering URLs of `scheme`.
    pub(crate) fn new(
        scheme: &'static str,
        port: u16,
        process: ServerProcess,
        timeouts: Timeouts,
        dir: TempDir,
    ) -> Self {
        SqlServer {
            scheme,
            port,
            process,
            timeouts,
            dir,
        }
    }

    /// `SCHEME://locksmith:locksmith-pw@127.0.0.1:PORT/locksmith` (`postgres`, `mysql`).
    pub fn url(&self) -> String {
        format!(
            "{}://{USER}:{PASSWORD}@127.0.0.1:{}/{DB}",
            self.scheme, self.port
        )
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process (group), to kill, pause or resume it.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}

/// What one SQL server kind does its own way.
pub(crate) trait Dialect: DerefMut<Target = SqlServer> {
    /// Creates the system tables in `dir`'s `data` directory.
    async fn install(dir: &TempDir, t: Timeouts) -> Result<()>;
    /// Waits (with the start timeout) until the server accepts connections.
    async fn wait_ready(&mut self) -> Result<()>;
    /// Creates the `locksmith` user and database.
    async fn create_user(&self) -> Result<()>;
}

/// Waits until a just-spawned server serves and creates its user and database.
///
/// Cancel safety: a dropped start kills the server (it dies with `server`).
pub(crate) async fn ready<D: Dialect>(mut server: D) -> Result<D> {
    server.wait_ready().await?;
    server.create_user().await?;
    Ok(server)
}

/// Kills the server (`-9`) and starts it again on the same port: with its data (crash
/// recovery) or, with `keep_data == false`, freshly installed (every table gone).
///
/// Cancel safety: a dropped restart may leave the server stopped.
pub(crate) async fn restart<D: Dialect>(server: &mut D, keep_data: bool) -> Result<()> {
    server.process.kill();
    if !keep_data {
        std::fs::remove_dir_all(server.dir.join("data"))?;
        D::install(&server.dir, server.timeouts).await?;
    }
    // PostgreSQL's backends run in sessions of their own (PostgreSQL makes each child a group
    // leader), so the group kill misses them: they exit once they notice the postmaster's death
    // and hold the shared memory block until then, which fails a start ("pre-existing shared
    // memory block is still in use"). Start again until they are gone.
    let deadline = tokio::time::Instant::now() + server.timeouts.start;
    loop {
        server.process.respawn()?;
        match server.wait_ready().await {
            Ok(()) => break,
            Err(e)
                if e.to_string().contains("pre-existing shared memory block")
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
    if !keep_data {
        server.create_user().await?;
    }
    Ok(())
}
