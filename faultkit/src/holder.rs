//! Driving a lock-holder process: spawn it, read its JSON events, kill, pause or resume it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

use crate::util::{Error, Result};

/// One line a holder process prints on stdout (JSON). Every event has `event` and `t_us`
/// (microseconds since the Unix epoch, the clock holders and tests share on one machine);
/// the other fields belong to some events only.
///
/// Events: `connected`; `acquired` (`fence`, `valid_for_us`); `timeout` (the wait ran out);
/// `lost` (`reason`); `checked` (`valid`: the holder checked its lease before a write);
/// `write` (`fence`, `accepted`: the fenced resource's answer); `extend` (`ok`, `lost_before`:
/// whether the lost signal had fired when the call returned, `error`); `error` (`error`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderEvent {
    /// What happened.
    pub event: String,
    /// When, in microseconds since the Unix epoch.
    pub t_us: u64,
    /// The fencing token (acquired, write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// How long the lease is valid from the acquisition (acquired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_for_us: Option<u64>,
    /// Why the lease was lost (lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Whether the lease was valid when checked (checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid: Option<bool>,
    /// Whether the resource accepted the write (write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<bool>,
    /// Whether the operation succeeded (extend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,
    /// Whether the lost signal had fired when the operation returned (extend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_before: Option<bool>,
    /// An error message (error, extend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl HolderEvent {
    /// An event named `event`, stamped now.
    pub fn now(event: &str) -> Self {
        HolderEvent {
            event: event.to_string(),
            t_us: crate::now_unix_micros(),
            ..Default::default()
        }
    }

    /// As one JSON line (no newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The environment variable that gives a holder process its lock service URL (see
/// [`HolderSpec::args`]).
pub const HOLDER_URL_ENV: &str = "LOCKSMITH_HOLDER_URL";

/// How to run a holder: the program (the `locksmith-holder` binary of the `faults` crate) and
/// what it should do. [`HolderSpec::args`] gives its command line.
#[derive(Clone, Debug)]
pub struct HolderSpec {
    /// The holder binary.
    pub program: PathBuf,
    /// Arguments before the holder's flags (a subcommand, e.g. `["holder"]`).
    pub prefix: Vec<String>,
    /// The lock service URL.
    pub url: String,
    /// The lock name.
    pub name: String,
    /// The lease TTL.
    pub ttl: Duration,
    /// How long to wait for the lock.
    pub wait: Duration,
    /// Renew the lease automatically.
    pub renew: bool,
    /// A fenced resource to write to, in a loop, while holding.
    pub resource: Option<SocketAddr>,
    /// The pause between a check of the lease and the write it guards, and between loops.
    pub work: Duration,
    /// Call `extend` after each loop (the "next lock operation" of a resumed holder).
    pub extend: bool,
    /// The writer id the holder gives the resource.
    pub id: String,
    /// Run with the wall clock this far ahead (libfaketime preloaded; the monotonic clock stays
    /// true). See [`libfaketime`].
    pub clock_ahead: Option<Duration>,
    /// Hold the lock shared (a reader) instead of exclusive.
    pub shared: bool,
    /// Hold one of this many semaphore permits instead of the exclusive lock.
    pub permits: Option<u32>,
}

/// libfaketime's preload library (Debian package `libfaketime`), if installed. A holder whose
/// clock runs ahead preloads it directly, not through the `faketime` wrapper: both keep a named
/// semaphore and shared memory in /dev/shm named by the process id, which a killed process
/// leaves behind, and a later process given the same pid fails on them (`sem_open: File
/// exists`); a [`Holder`] removes its own when it is killed or dropped.
pub fn libfaketime() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib")
        .ok()?
        .filter_map(|d| d.ok())
        .map(|d| d.path().join("faketime/libfaketime.so.1"))
        .find(|p| p.exists())
}

/// The files libfaketime keeps for process `pid`.
fn faketime_files(pid: u32) -> [PathBuf; 2] {
    [
        PathBuf::from(format!("/dev/shm/sem.faketime_sem_{pid}")),
        PathBuf::from(format!("/dev/shm/faketime_shm_{pid}")),
    ]
}

impl HolderSpec {
    /// A holder of `name` at `url` with `ttl`, waiting up to 30 s, no renewal, no resource,
    /// 100 ms work steps.
    pub fn new(program: impl Into<PathBuf>, url: &str, name: &str, ttl: Duration) -> Self {
        HolderSpec {
            program: program.into(),
            prefix: Vec::new(),
            url: url.to_string(),
            name: name.to_string(),
            ttl,
            wait: Duration::from_secs(30),
            renew: false,
            resource: None,
            work: Duration::from_millis(100),
            extend: false,
            id: "holder".into(),
            clock_ahead: None,
            shared: false,
            permits: None,
        }
    }

    /// The command line the holder binary takes (after the prefix). The URL is not on it: the
    /// holder reads it from [`HOLDER_URL_ENV`], which [`Holder::spawn`] sets.
    pub fn args(&self) -> Vec<String> {
        let mut a = self.prefix.clone();
        a.extend([
            "--name".to_string(),
            self.name.clone(),
            "--ttl-ms".into(),
            self.ttl.as_millis().to_string(),
            "--wait-ms".into(),
            self.wait.as_millis().to_string(),
            "--work-ms".into(),
            self.work.as_millis().to_string(),
            "--id".into(),
            self.id.clone(),
        ]);
        if self.renew {
            a.push("--renew".into());
        }
        if self.extend {
            a.push("--extend".into());
        }
        if let Some(r) = self.resource {
            a.push("--resource".into());
            a.push(r.to_string());
        }
        if self.shared {
            a.push("--shared".into());
        }
        if let Some(n) = self.permits {
            a.push("--permits".into());
            a.push(n.to_string());
        }
        a
    }
}

/// A running holder process (killed on drop). Its events arrive in order through
/// [`Holder::next`] / [`Holder::wait_for`]; all of them are kept in [`Holder::history`].
#[derive(Debug)]
pub struct Holder {
    child: tokio::process::Child,
    events: mpsc::UnboundedReceiver<HolderEvent>,
    history: Vec<HolderEvent>,
    id: String,
    /// Files the process keeps that a kill leaves behind (libfaketime's).
    leaves_behind: Vec<PathBuf>,
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        self.remove_leftovers();
    }
}

impl Holder {
    /// Starts the holder described by `spec`. Must be called inside a tokio runtime.
    pub fn spawn(spec: &HolderSpec) -> Result<Self> {
        let mut command = tokio::process::Command::new(&spec.program);
        if let Some(ahead) = spec.clock_ahead {
            let lib = libfaketime().ok_or_else(|| {
                Error::msg("libfaketime is not installed (Debian package libfaketime)")
            })?;
            command
                .env("LD_PRELOAD", lib)
                .env("FAKETIME", format!("+{}s", ahead.as_secs()))
                // Only the wall clock: tokio's timers keep to the real monotonic clock.
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let mut child = command
            .args(spec.args())
            // Not on the command line, which any user of the machine can read (`ps`): the URL
            // may carry a password.
            .env(HOLDER_URL_ENV, &spec.url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::msg(format!("{}: {e}", spec.program.display())))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, events) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<HolderEvent>(&line) {
                    Ok(e) => {
                        if tx.send(e).is_err() {
                            break;
                        }
                    }
                    Err(_) => eprintln!("holder: {line}"),
                }
            }
        });
        let leaves_behind = match (spec.clock_ahead, child.id()) {
            (Some(_), Some(pid)) => faketime_files(pid).to_vec(),
            _ => Vec::new(),
        };
        Ok(Holder {
            child,
            events,
            history: Vec::new(),
            id: spec.id.clone(),
            leaves_behind,
        })
    }

    /// Removes what the process leaves behind when killed (it is gone, or going: SIGKILL sent).
    fn remove_leftovers(&mut self) {
        for p in self.leaves_behind.drain(..) {
            let _ = std::fs::remove_file(p);
        }
    }

    /// The writer id it gives the resource.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The next event, within `timeout`.
    ///
    /// Cancel safe.
    pub async fn next(&mut self, timeout: Duration) -> Result<HolderEvent> {
        let e = tokio::time::timeout(timeout, self.events.recv())
            .await
            .map_err(|_| Error::msg(format!("holder {}: no event in {timeout:?}", self.id)))?
            .ok_or_else(|| Error::msg(format!("holder {}: exited", self.id)))?;
        self.history.push(e.clone());
        Ok(e)
    }

    /// Reads events until one named `event` (or `error`, which fails), within `timeout`.
    ///
    /// Cancel safe.
    pub async fn wait_for(&mut self, event: &str, timeout: Duration) -> Result<HolderEvent> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let e = self.next(left).await.map_err(|e| {
                Error::msg(format!(
                    "waiting for `{event}`: {e} (seen: {:?})",
                    self.names()
                ))
            })?;
            if e.event == event {
                return Ok(e);
            }
            if e.event == "error" && event != "error" {
                return Err(Error::msg(format!(
                    "holder {}: {}",
                    self.id,
                    e.error.unwrap_or_default()
                )));
            }
        }
    }

    /// Events already read, in order.
    pub fn history(&self) -> &[HolderEvent] {
        &self.history
    }

    /// The first event named `event` read so far.
    pub fn seen(&self, event: &str) -> Option<&HolderEvent> {
        self.history.iter().find(|e| e.event == event)
    }

    fn names(&self) -> Vec<&str> {
        self.history.iter().map(|e| e.event.as_str()).collect()
    }

    fn signal(&self, sig: Signal) -> Result<()> {
        let pid = self
            .pid()
            .and_then(|p| Pid::from_raw(p as i32))
            .ok_or_else(|| Error::msg("holder not running"))?;
        kill_process(pid, sig).map_err(|e| Error::msg(format!("holder signal: {e}")))
    }

    /// SIGKILL, then reaps it.
    ///
    /// Cancel safe.
    pub async fn kill(&mut self) -> Result<()> {
        self.signal(Signal::KILL)?;
        let _ = self.child.wait().await;
        self.remove_leftovers();
        Ok(())
    }

    /// SIGSTOP.
    pub fn pause(&self) -> Result<()> {
        self.signal(Signal::STOP)
    }

    /// SIGCONT.
    pub fn resume(&self) -> Result<()> {
        self.signal(Signal::CONT)
    }
}
