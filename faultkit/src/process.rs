//! One server process: spawned in its own process group, signalled as a group, killed on drop.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::process::{Pid, Signal, kill_process_group};

use crate::util::{Error, Result, tail};

const SETPRIV: &str = "/usr/bin/setpriv";

/// A server process started by a launcher. It runs in its own process group, so that signals
/// reach its children (those that stay in the group; [`ServerProcess::pause`] also reaches the
/// others); `Drop` kills the group with SIGKILL and reaps
/// it, also when a test panics; and the server is started with a parent-death signal, so it
/// dies with the thread that started it even when the test process is killed.
#[derive(Debug)]
pub struct ServerProcess {
    label: String,
    program: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
    /// The running process's id (0 while none runs), shared with whoever must follow it across
    /// respawns (the peer links that tell which member dialled a connection).
    pid_cell: Arc<AtomicU32>,
}

impl ServerProcess {
    /// Starts `program args`, appending stdout and stderr to `log`.
    pub fn spawn(
        label: impl Into<String>,
        program: impl Into<String>,
        args: Vec<String>,
        log: impl Into<PathBuf>,
    ) -> Result<Self> {
        let mut p = ServerProcess {
            label: label.into(),
            program: program.into(),
            args,
            log: log.into(),
            child: None,
            pid_cell: Arc::new(AtomicU32::new(0)),
        };
        p.start()?;
        Ok(p)
    }

    fn start(&mut self) -> Result<()> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let err = out.try_clone()?;
        // Through `setpriv --pdeathsig KILL` where it exists: the server dies with the thread
        // that started it, so a test process killed by a timeout leaves no server behind.
        let mut cmd = if Path::new(SETPRIV).exists() {
            let mut c = Command::new(SETPRIV);
            c.args(["--pdeathsig", "KILL", "--", &self.program]);
            c
        } else {
            Command::new(&self.program)
        };
        let child = cmd
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| Error::msg(format!("{}: cannot run {}: {e}", self.label, self.program)))?;
        self.pid_cell.store(child.id(), Ordering::Relaxed);
        self.child = Some(child);
        Ok(())
    }

    /// The process id, kept current across respawns (0 while none runs).
    pub(crate) fn pid_cell(&self) -> Arc<AtomicU32> {
        self.pid_cell.clone()
    }

    /// The label given at spawn (for messages).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The process id while it runs (also while paused).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether the process is still there (running or paused; not exited).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    fn signal(&self, sig: Signal) -> Result<()> {
        let pid = self
            .pid()
            .and_then(|p| Pid::from_raw(p as i32))
            .ok_or_else(|| Error::msg(format!("{}: not running", self.label)))?;
        kill_process_group(pid, sig)
            .map_err(|e| Error::msg(format!("{}: signal {sig:?}: {e}", self.label)))
    }

    /// `kill -9` of the whole process group, then reaps it and waits (up to 5 s) until every
    /// process of the group is gone: a PostgreSQL backend still exiting keeps the shared memory
    /// block, and a restart right away fails with "pre-existing shared memory block is still in
    /// use". Does nothing if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            self.pid_cell.store(0, Ordering::Relaxed);
            let _ = self.signal_pid(c.id(), Signal::KILL);
            let _ = c.wait();
            if let Some(pid) = Pid::from_raw(c.id() as i32) {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                while rustix::process::test_kill_process_group(pid).is_ok()
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
        }
    }

    fn signal_pid(&self, pid: u32, sig: Signal) -> Result<()> {
        let pid = Pid::from_raw(pid as i32).ok_or_else(|| Error::msg("bad pid"))?;
        kill_process_group(pid, sig).map_err(|e| Error::msg(format!("{}: {e}", self.label)))
    }

    /// `SIGSTOP` to the server and every process under it: it freezes (connections stay open,
    /// nothing answers). The descendants are signalled one by one, because the group alone
    /// misses some: PostgreSQL's backends, one per connection, each call `setsid()` and so
    /// leave the group, and a paused postmaster with running backends would go on serving
    /// every connection already open.
    pub fn pause(&self) -> Result<()> {
        // The parent first, so that it starts no new child while the tree is walked.
        self.signal(Signal::STOP)?;
        self.signal_descendants(Signal::STOP);
        Ok(())
    }

    /// `SIGCONT`: resumes a paused server and every process under it.
    pub fn resume(&self) -> Result<()> {
        self.signal_descendants(Signal::CONT);
        self.signal(Signal::CONT)
    }

    /// Sends `sig` to every descendant of the server process (children that left its group).
    fn signal_descendants(&self, sig: Signal) {
        let Some(root) = self.pid() else { return };
        for pid in descendants(root) {
            if let Some(pid) = Pid::from_raw(pid as i32) {
                // Gone meanwhile: nothing to pause.
                let _ = rustix::process::kill_process(pid, sig);
            }
        }
    }

    /// Kills it (if running) and starts the same command again. Readiness is the launcher's
    /// business.
    pub fn respawn(&mut self) -> Result<()> {
        self.kill();
        self.start()
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last lines of its log, for error messages.
    pub fn log_tail(&self) -> String {
        tail(&self.log, 30)
    }

    /// An error saying what failed, with the log's tail.
    pub fn failure(&self, what: &str, cause: impl std::fmt::Display) -> Error {
        Error::msg(format!(
            "{} ({}): {what}: {cause}\n---- last lines of {} ----\n{}",
            self.label,
            self.program,
            self.log.display(),
            self.log_tail()
        ))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

impl ServerProcess {
    /// Polls `check` until it says ready, failing early (with the log's tail) when the process
    /// exits and after `timeout`.
    ///
    /// Cancel safe.
    pub async fn wait_ready<F, Fut>(
        &mut self,
        what: &str,
        timeout: std::time::Duration,
        mut check: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = String::new();
        loop {
            match check().await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => last = e.to_string(),
            }
            if !self.is_running() {
                return Err(self.failure(what, "the process exited"));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(self.failure(what, format!("not ready after {timeout:?} ({last})")));
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// Every process under `root` (children, their children, ...), from `/proc`'s parent links.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            // `pid (comm) state ppid ...`: the command name may hold spaces and parentheses.
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|(_, ppid)| *ppid == parent)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    found.remove(0);
    found
}
