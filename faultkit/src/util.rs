//! Small shared helpers: errors, temp dirs, free ports, bounded waits, commands with timeouts.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// A fault-tool failure: a server that did not start or answer in time, a failed command.
/// The message carries the context (and the tail of the server's log where there is one).
#[derive(Debug)]
pub struct Error(String);

impl Error {
    /// An error with this message.
    pub fn msg(msg: impl Into<String>) -> Self {
        Error(msg.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error(format!("i/o: {e}"))
    }
}

/// The result of a fault-tool call.
pub type Result<T> = std::result::Result<T, Error>;

/// How long readiness waits may take. Scaled by `LOCK_TEST_TIME_SCALE` (as the conformance
/// suite's bounds are) through [`Timeouts::scaled`].
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// A server's start until it serves.
    pub start: Duration,
    /// One control command (`redis-cli`, `psql`, ...).
    pub command: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            start: Duration::from_secs(60),
            command: Duration::from_secs(10),
        }
    }
}

impl Timeouts {
    /// The defaults multiplied by `LOCK_TEST_TIME_SCALE` (1 when unset).
    pub fn scaled() -> Self {
        let scale = std::env::var("LOCK_TEST_TIME_SCALE")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v > 0.0)
            .unwrap_or(1.0);
        let d = Self::default();
        Timeouts {
            start: d.start.mul_f64(scale),
            command: d.command.mul_f64(scale),
        }
    }
}

/// The environment variable that makes every test server required (CI): a test that would
/// skip for want of a server fails instead.
const REQUIRE_ALL_ENV: &str = "LOCK_TEST_REQUIRE_ALL";

/// Whether `program` (a name looked up in `PATH`, or a path) can be run here, for a test that
/// launches its own server to skip without it. Panics, saying what is missing, when it is not
/// installed and `LOCK_TEST_REQUIRE_ALL` is set (CI, where every server is required).
pub fn require_installed(program: &str) -> bool {
    let found = if program.contains('/') {
        Path::new(program).is_file()
    } else {
        std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|dir| dir.join(program).is_file())
        })
    };
    if !found {
        assert!(
            std::env::var_os(REQUIRE_ALL_ENV).is_none(),
            "{program} is not installed, and {REQUIRE_ALL_ENV} says every server is required \
             (scripts/install-servers.sh installs it)"
        );
        eprintln!("skipping: {program} is not installed (scripts/install-servers.sh installs it)");
    }
    found
}

/// Microseconds since the Unix epoch on the wall clock: the one clock holder processes and the
/// test process share on one machine.
pub fn now_unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A free TCP port on 127.0.0.1 for a server to bind, probed by binding it (then freed).
///
/// Picked at random above Linux's ephemeral range (32768-60999 by default) rather than asked of
/// the kernel: test binaries run side by side (scripts/run-tests.sh), and a port the kernel
/// hands out as ephemeral is soon reused as the source port of some client's connection, so a
/// server started on it a moment later could not bind. A race with another process probing the
/// same port in between is still possible but rare.
pub fn free_port() -> Result<u16> {
    // Never the same port twice in one process: servers started at once would otherwise both
    // get a port free when asked, the second fail to bind it, and its readiness check reach the
    // first (two handles, one server).
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..200 {
        let port = fastrand::u16(61_000..65_000);
        if handed_out.contains(&port) {
            continue;
        }
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            let port = l.local_addr()?.port();
            handed_out.push(port);
            return Ok(port);
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    handed_out.push(port);
    Ok(port)
}

/// Polls `check` every 50 ms until it returns `Ok(true)`, for at most `timeout`. `what` names
/// the wait in the error. `on_timeout` may add context (a log tail) to the error.
///
/// Cancel safe.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() >= deadline {
            return Err(Error(format!(
                "{what}: not ready after {timeout:?}{}",
                last_err
                    .map(|e| format!(" (last error: {e})"))
                    .unwrap_or_default()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `current` every 20 ms until it names another member than `old` (a new leader, a new
/// primary after a failover), for at most `timeout`; returns it. `what` names the wait in the
/// error.
///
/// Cancel safe.
pub(crate) async fn wait_for_other<F, Fut>(
    what: &str,
    old: usize,
    timeout: Duration,
    mut current: F,
) -> Result<usize>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<usize>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(new) = current().await.ok()
            && new != old
        {
            return Ok(new);
        }
        if Instant::now() >= deadline {
            return Err(Error(format!("{what}: none after {timeout:?}")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs a command to completion within `timeout`; its stdout on exit code 0, an error with its
/// stderr otherwise.
///
/// Cancel safety: a dropped call kills the command.
pub(crate) async fn run(program: &str, args: &[&str], timeout: Duration) -> Result<String> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .map_err(|_| {
            Error(format!(
                "{program} {}: no answer in {timeout:?}",
                args.join(" ")
            ))
        })?
        .map_err(|e| Error(format!("{program}: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error(format!(
            "{program} {}: {} {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        )))
    }
}

/// The last `lines` lines of a log file, for error messages.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A directory removed (with everything in it) when dropped.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// A new empty directory `faultkit-<what>-<random>` under `/dev/shm` when `fast` and
    /// writable (tmpfs: fsync-heavy servers like etcd run twice as fast there), else under the
    /// system temp dir. World-readable, so servers that drop privileges can enter it.
    pub fn new(what: &str, fast: bool) -> Result<Self> {
        let shm = Path::new("/dev/shm");
        let base = if fast && shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let path = base.join(format!("faultkit-{what}-{:016x}", fastrand::u64(..)));
        std::fs::create_dir_all(&path)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(TempDir { path })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path inside it.
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Whether we run as root (some servers need telling, or a user switch).
pub(crate) fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}
