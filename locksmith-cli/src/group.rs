//! The command's process group, and the guard process that kills it when locksmith dies.
//!
//! `locksmith run` does not start the command itself: it starts this same binary as a guard
//! (`locksmith __locksmith-guard COMMAND...`) in a new process group, and the guard starts the
//! command inside that group. The guard asks Linux to signal it when locksmith dies
//! (`PR_SET_PDEATHSIG`; locksmith spawns it from the main thread, which lives as long as the
//! process, since the signal follows the thread that forked), and then kills the whole group
//! with SIGKILL: the command and everything it started. So even `kill -9` of locksmith never
//! leaves the command running without the lock. A direct parent-death signal on the command
//! would only reach the command itself, not the processes it started.

use std::ffi::{OsStr, OsString};
use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

/// `argv[1]` that makes this binary the guard of a command.
pub const GUARD_ARG: &str = "__locksmith-guard";
/// The pid of the locksmith process that started the guard (for the guard's parent check).
const PARENT_ENV: &str = "LOCKSMITH_GUARD_PARENT";

/// What locksmith forwards to the command's group: every catchable signal that would end,
/// stop or concern the command (the program-error signals SIGSEGV, SIGBUS, ... concern
/// locksmith itself; SIGPIPE is ignored by Rust programs, so forwarding it would only pass on
/// locksmith's own broken pipes; SIGCHLD is locksmith's own business).
pub const FORWARDED: &[Signal] = &[
    Signal::HUP,
    Signal::INT,
    Signal::QUIT,
    Signal::TERM,
    Signal::USR1,
    Signal::USR2,
    Signal::ALARM,
    Signal::WINCH,
    Signal::TSTP,
    Signal::CONT,
    Signal::URG,
    Signal::XCPU,
    Signal::XFSZ,
    Signal::VTALARM,
    Signal::PROF,
    Signal::IO,
    #[cfg(target_os = "linux")]
    Signal::POWER,
    #[cfg(target_os = "linux")]
    Signal::STKFLT,
];

/// Signals that ask locksmith to end: after forwarding one, the group gets SIGKILL if it is
/// still running `--kill-grace` later.
pub fn is_termination_request(sig: Signal) -> bool {
    TERMINATION.contains(&sig)
}

/// The signal's name for messages (`SIGTERM`).
pub fn name(sig: Signal) -> String {
    let known = [
        (Signal::HUP, "SIGHUP"),
        (Signal::INT, "SIGINT"),
        (Signal::QUIT, "SIGQUIT"),
        (Signal::TERM, "SIGTERM"),
        (Signal::KILL, "SIGKILL"),
        (Signal::USR1, "SIGUSR1"),
        (Signal::USR2, "SIGUSR2"),
    ];
    known.iter().find(|(s, _)| *s == sig).map_or_else(
        || format!("signal {}", sig.as_raw()),
        |(_, n)| (*n).to_owned(),
    )
}

/// The termination requests ([`is_termination_request`]): caught from the start of the wait,
/// so that none ends locksmith before its clean-up.
pub const TERMINATION: &[Signal] = &[Signal::TERM, Signal::INT, Signal::HUP, Signal::QUIT];

/// The signals caught so far, delivered into one stream. Locksmith's default reaction to each
/// (ending or stopping) is replaced by the stream from the moment it is caught, for the rest
/// of the process. A signal whose handler cannot be installed is left alone.
pub struct Signals {
    tx: mpsc::UnboundedSender<Signal>,
    caught: Vec<Signal>,
}

impl Signals {
    /// Catches `signals`; their deliveries come out of the receiver.
    pub fn catch(signals: &[Signal]) -> (Signals, mpsc::UnboundedReceiver<Signal>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut caught = Signals {
            tx,
            caught: Vec::new(),
        };
        caught.add(signals);
        (caught, rx)
    }

    /// Catches `signals` too, into the same stream (each signal once, however often named).
    pub fn add(&mut self, signals: &[Signal]) {
        for &sig in signals {
            if self.caught.contains(&sig) {
                continue;
            }
            let Ok(mut stream) = signal(SignalKind::from_raw(sig.as_raw())) else {
                continue;
            };
            self.caught.push(sig);
            let tx = self.tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    if tx.send(sig).is_err() {
                        break;
                    }
                }
            });
        }
    }
}

/// The command running in its own process group under the guard.
pub struct Group {
    /// The guard: the group's leader, whose exit status is the command's.
    pub guard: Child,
    /// The group's id (the guard's pid).
    pub pgid: Pid,
}

impl Group {
    /// Starts `command` under a guard in a new process group. `env` is added to the
    /// command's environment.
    ///
    /// Call it from the thread that lives as long as the process (the main thread): the
    /// guard's parent-death signal fires when the spawning thread ends.
    pub fn spawn(command: &[String], env: &[(&str, String)]) -> io::Result<Group> {
        // /proc/self/exe still runs this binary if its file was replaced or deleted meanwhile.
        let exe = if cfg!(target_os = "linux") {
            std::path::PathBuf::from("/proc/self/exe")
        } else {
            std::env::current_exe()?
        };
        let mut cmd = Command::new(exe);
        cmd.arg0("locksmith")
            .arg(GUARD_ARG)
            .args(command)
            .env(PARENT_ENV, std::process::id().to_string())
            .process_group(0)
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let guard = cmd.spawn()?;
        let pgid = guard
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw)
            .ok_or_else(|| io::Error::other("the guard process has no pid"))?;
        Ok(Group { guard, pgid })
    }
}

/// Sends `sig` to every process of the group `pgid` (nothing to do when it is gone).
pub fn signal_group(pgid: Pid, sig: Signal) {
    let _ = rustix::process::kill_process_group(pgid, sig);
}

/// Whether any process of the group `pgid` is still there.
pub fn group_alive(pgid: Pid) -> bool {
    rustix::process::test_kill_process_group(pgid).is_ok()
}

/// Waits until the group `pgid` is empty, at most `limit`; true if it is. Polls: processes
/// that are not our children give no event when they end.
pub async fn wait_group_gone(pgid: Pid, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while group_alive(pgid) {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// SIGTERM to the whole group, SIGKILL after `grace` if the guard (and so the command) has not
/// exited; then waits until the group is empty. Returns the guard's status.
pub async fn terminate(group: &mut Group, grace: Duration) -> io::Result<ExitStatus> {
    signal_group(group.pgid, Signal::TERM);
    let status = match tokio::time::timeout(grace, group.guard.wait()).await {
        Ok(status) => status,
        Err(_) => {
            eprintln!(
                "locksmith: the command ignored SIGTERM for {}; killing its process group",
                crate::duration::show(grace)
            );
            signal_group(group.pgid, Signal::KILL);
            group.guard.wait().await
        }
    };
    end_leftovers(group.pgid, grace).await;
    status
}

/// After the command exited: terminates what it left running in its group (background jobs),
/// SIGTERM then SIGKILL after `grace`, so that nothing of it outlives the lock.
pub async fn end_leftovers(pgid: Pid, grace: Duration) {
    if !group_alive(pgid) {
        return;
    }
    eprintln!(
        "locksmith: the command left processes running in its group; terminating them before \
         releasing the lock"
    );
    signal_group(pgid, Signal::TERM);
    if !wait_group_gone(pgid, grace).await {
        signal_group(pgid, Signal::KILL);
        // Killed processes are gone once their parent (or init) reaps them.
        if !wait_group_gone(pgid, Duration::from_secs(5)).await {
            eprintln!("locksmith: processes of the command's group are still there after SIGKILL");
        }
    }
}

/// When this process was started as a guard (`argv[1]` is [`GUARD_ARG`]): runs the command
/// and returns the exit code for `main`. `None` otherwise.
pub fn guard_main() -> Option<u8> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(OsStr::new(GUARD_ARG)) {
        return None;
    }
    Some(guard(args.collect()))
}

/// The guard: dies with locksmith, taking the group with it; otherwise waits for the command
/// and exits with its code (128+N when signal N killed it).
fn guard(command: Vec<OsString>) -> u8 {
    let parent = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|p| p.parse::<i32>().ok())
        .and_then(Pid::from_raw);
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::HUP)) {
        eprintln!("locksmith: cannot set the guard's parent-death signal: {e}");
        return crate::exit::UNAVAILABLE;
    }
    // Set after the fork: locksmith may have died in between, before the signal was armed.
    if parent_gone(parent) {
        return crate::exit::LOCK_LOST;
    }
    let Some((program, args)) = command.split_first() else {
        return crate::exit::CONFIG;
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("locksmith: cannot start the guard's runtime: {e}");
            return crate::exit::UNAVAILABLE;
        }
    };
    rt.block_on(async move {
        // The guard is in the group, so it gets every signal locksmith forwards to the group;
        // the command gets them directly. The guard only checks whether locksmith is gone.
        let (_caught, mut signals) = Signals::catch(FORWARDED);
        let mut child = match Command::new(program)
            .args(args)
            .env_remove(PARENT_ENV)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!("locksmith: cannot run {program:?}: {e}");
                return match e.kind() {
                    io::ErrorKind::NotFound => crate::exit::NOT_FOUND,
                    _ => crate::exit::CANNOT_EXECUTE,
                };
            }
        };
        loop {
            tokio::select! {
                status = child.wait() => return exit_code(status),
                Some(_) = signals.recv() => {
                    if parent_gone(parent) {
                        kill_own_group(&mut child);
                        return crate::exit::LOCK_LOST;
                    }
                }
                () = watch_parent(parent) => {
                    kill_own_group(&mut child);
                    return crate::exit::LOCK_LOST;
                }
            }
        }
    })
}

/// Locksmith died: the lock is no longer renewed, so nothing of the command may go on. Kills
/// the whole group, the guard included.
fn kill_own_group(child: &mut Child) {
    let _ = child.start_kill();
    signal_group(rustix::process::getpgrp(), Signal::KILL);
}

/// Whether the locksmith that started the guard is gone (the guard was re-parented).
fn parent_gone(parent: Option<Pid>) -> bool {
    parent.is_none() || rustix::process::getppid() != parent
}

/// Where there is no parent-death signal: notices locksmith's death by polling.
async fn watch_parent(parent: Option<Pid>) {
    if cfg!(target_os = "linux") {
        return std::future::pending().await;
    }
    while !parent_gone(parent) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A child's exit status as a shell reports it: its code, or 128+N when signal N ended it.
pub fn exit_code(status: io::Result<ExitStatus>) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
            (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
            (None, None) => 1,
        },
        Err(e) => {
            eprintln!("locksmith: lost track of the command: {e}");
            crate::exit::UNAVAILABLE
        }
    }
}
