//! Helpers shared by the CLI's process tests: temporary directories, running `locksmith run`,
//! waiting for files and processes.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// A time bound, stretched by `LOCK_TEST_TIME_SCALE`.
pub fn bound(secs: f64) -> Duration {
    Duration::from_secs_f64(secs * conformance::time_scale())
}

/// A fresh directory for one test, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "locksmith-run-{test}-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// A SQLite lock URL in this directory.
    pub fn sqlite(&self) -> String {
        format!("sqlite://{}", self.path("locks.db").display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `locksmith run ARGS` with the URL in `LOCKSMITH_URL` (never in argv), stdout and stderr
/// piped.
pub fn run_cmd(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_locksmith"));
    cmd.arg("run")
        .args(args)
        .env("LOCKSMITH_URL", url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

pub fn code(out: &Output) -> i32 {
    out.status.code().expect("locksmith exited normally")
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Waits until `path` exists (written by a command in another process); panics after `limit`.
pub fn wait_file(path: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The pid written to `path` by `echo $$ > path`.
pub fn read_pid(path: &Path) -> i32 {
    wait_file(path, bound(30.0));
    let deadline = Instant::now() + bound(5.0);
    loop {
        // The writer may not have finished the line yet.
        if let Ok(pid) = std::fs::read_to_string(path).unwrap().trim().parse() {
            return pid;
        }
        assert!(Instant::now() < deadline, "no pid in {}", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` has ended (gone, or a zombie waiting for its parent).
pub fn ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// Waits until process `pid` has ended; false after `limit`.
pub fn wait_ended(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !ended(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

pub fn send(pid: u32, sig: Signal) {
    let pid = Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(pid, sig).unwrap();
}

/// Waits for a child with a time limit (killing it and panicking past the limit).
pub fn wait_output(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut out = Output {
                status,
                stdout: Vec::new(),
                stderr: Vec::new(),
            };
            if let Some(mut s) = child.stdout.take() {
                s.read_to_end(&mut out.stdout).unwrap();
            }
            if let Some(mut s) = child.stderr.take() {
                s.read_to_end(&mut out.stderr).unwrap();
            }
            return out;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let mut said = String::new();
            if let Some(mut s) = child.stderr.take() {
                let _ = s.read_to_string(&mut said);
            }
            panic!("locksmith still running after {limit:?}; it said: {said}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
