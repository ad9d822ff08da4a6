//! `locksmith run`: hold a lock while a command runs.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use locksmith::{AutoRenew, Error, ErrorKind, LockGuard, LockOptions, Locker};
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal as SignalStream, SignalKind, signal};

use crate::RunArgs;
use crate::duration::{Wait, show};
use crate::exit;

/// Runs the command under the lock and returns the exit code (see `locksmith run --help`).
pub async fn run(args: RunArgs) -> u8 {
    let locker = match locksmith::connect(&args.url).await {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    let guard = match acquire(&locker, &args).await {
        Ok(Some(g)) => g,
        Ok(None) => {
            let how = match args.wait {
                Wait::For(d) if d.is_zero() => String::new(),
                Wait::For(d) => format!(" after waiting {}", show(d)),
                Wait::Forever => String::new(),
            };
            eprintln!(
                "locksmith: lock {:?} is busy{how}; not running the command",
                args.name
            );
            return exit::LOCK_BUSY;
        }
        Err(e) => return fail(&e),
    };

    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("LOCKSMITH_LOCK_NAME", &args.name)
        .kill_on_drop(true);
    if let Some(token) = guard.fencing_token() {
        command.env("LOCKSMITH_FENCING_TOKEN", token.to_string());
    }
    let child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("locksmith: cannot run {:?}: {e}", args.command[0]);
            release(guard, &locker, &args.name).await;
            return match e.kind() {
                io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
        }
    };
    let code = supervise(child, &guard, &args).await;
    release(guard, &locker, &args.name).await;
    code
}

/// Takes the lock: one attempt for `--wait 0`, else waits. `Ok(None)` when busy / timed out.
async fn acquire(locker: &Locker, args: &RunArgs) -> locksmith::Result<Option<LockGuard>> {
    let opts = LockOptions::new()
        .ttl(args.ttl)
        .auto_renew(AutoRenew::until(args.max_hold));
    match args.wait {
        Wait::For(d) if d.is_zero() => locker.try_lock(args.name.as_str(), &opts).await,
        wait => {
            let opts = match wait {
                Wait::Forever => opts.wait_forever(),
                Wait::For(d) => opts.wait_timeout(d),
            };
            match locker.lock(args.name.as_str(), &opts).await {
                Ok(g) => Ok(Some(g)),
                Err(e) if e.kind() == ErrorKind::Timeout => Ok(None),
                Err(e) => Err(e),
            }
        }
    }
}

/// Waits for the command, forwarding SIGTERM and SIGHUP, and terminates it if the lock is lost.
async fn supervise(mut child: Child, guard: &LockGuard, args: &RunArgs) -> u8 {
    let lost = guard.lost();
    let mut sigterm = signal(SignalKind::terminate()).ok();
    let mut sighup = signal(SignalKind::hangup()).ok();
    // A terminal's Ctrl-C reaches the command (same process group); locksmith only has to
    // survive it so that it can release the lock once the command is gone.
    let mut sigint = signal(SignalKind::interrupt()).ok();
    loop {
        tokio::select! {
            status = child.wait() => return exit_code(status),
            reason = lost.lost() => {
                eprintln!(
                    "locksmith: lock {:?} lost ({reason}); terminating the command",
                    args.name
                );
                let _ = terminate(&mut child, args.kill_grace).await;
                return exit::LOCK_LOST;
            }
            () = next(&mut sigterm) => send(&child, rustix::process::Signal::TERM),
            () = next(&mut sighup) => send(&child, rustix::process::Signal::HUP),
            () = next(&mut sigint) => {}
        }
    }
}

/// The next delivery of a signal; pending forever if its handler could not be installed.
async fn next(sig: &mut Option<SignalStream>) {
    match sig {
        Some(s) => {
            if s.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

fn send(child: &Child, sig: rustix::process::Signal) {
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(rustix::process::Pid::from_raw);
    if let Some(pid) = pid {
        // The child may have exited in between: then there is nothing to signal.
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// SIGTERM, then SIGKILL after `grace`; waits for the child to be gone.
async fn terminate(child: &mut Child, grace: Duration) -> io::Result<ExitStatus> {
    send(child, rustix::process::Signal::TERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            eprintln!(
                "locksmith: the command ignored SIGTERM for {}; killing it",
                show(grace)
            );
            child.start_kill()?;
            child.wait().await
        }
    }
}

fn exit_code(status: io::Result<ExitStatus>) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
            (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
            (None, None) => 1,
        },
        Err(e) => {
            eprintln!("locksmith: lost track of the command: {e}");
            exit::UNAVAILABLE
        }
    }
}

async fn release(guard: LockGuard, locker: &Locker, name: &str) {
    match guard.release().await {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotHeld => {}
        Err(e) => eprintln!(
            "locksmith: releasing lock {name:?} failed ({e}); it frees when its TTL runs out"
        ),
    }
    locker.flush().await;
}

/// Prints a lock error and maps it to an exit code.
fn fail(e: &Error) -> u8 {
    eprintln!("locksmith: {e}");
    match e.kind() {
        ErrorKind::InvalidConfig | ErrorKind::InvalidName | ErrorKind::Unsupported => exit::CONFIG,
        _ => exit::UNAVAILABLE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(argv: &[&str]) -> RunArgs {
        let mut full = vec!["locksmith", "run"];
        full.extend_from_slice(argv);
        match crate::Cli::try_parse_from(full).unwrap().command {
            crate::Command::Run(a) => a,
            _ => unreachable!(),
        }
    }

    #[tokio::test]
    async fn busy_lock_exits_75_without_running_the_command() {
        // The memory store is shared within the process: hold the lock here.
        let holder = locksmith::connect("memory://run-busy").await.unwrap();
        let guard = holder
            .try_lock("job", &LockOptions::new())
            .await
            .unwrap()
            .unwrap();
        let marker = std::env::temp_dir().join(format!("locksmith-busy-{}", std::process::id()));
        let touch = format!("touch {}", marker.display());
        for wait in ["0", "200ms"] {
            let code = run(args(&[
                "--url",
                "memory://run-busy",
                "--wait",
                wait,
                "job",
                "--",
                "sh",
                "-c",
                &touch,
            ]))
            .await;
            assert_eq!(code, exit::LOCK_BUSY, "--wait {wait}");
        }
        assert!(!marker.exists(), "the command must not run");
        guard.release().await.unwrap();
        // Free now: it runs, and the lock is released afterwards.
        let code = run(args(&[
            "--url",
            "memory://run-busy",
            "--wait",
            "0",
            "job",
            "--",
            "sh",
            "-c",
            &touch,
        ]))
        .await;
        assert_eq!(code, 0);
        assert!(marker.exists());
        std::fs::remove_file(&marker).ok();
        assert!(
            holder
                .try_lock("job", &LockOptions::new())
                .await
                .unwrap()
                .is_some()
        );
    }
}
