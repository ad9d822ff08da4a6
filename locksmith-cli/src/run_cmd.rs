//! `locksmith run`: hold a lock while a command runs, and never let the command outlive it.

use locksmith::{
    AutoRenew, Error, ErrorKind, LockGuard, LockOptions, Locker, LostReason, redact_url,
};
use rustix::process::Signal;

use crate::RunArgs;
use crate::duration::{Wait, show};
use crate::exit;
use crate::group::{self, Group};

/// Runs the command under the lock and returns the exit code (see `locksmith run --help`).
///
/// Must run on the main thread (see [`Group::spawn`]).
pub async fn run(args: RunArgs) -> u8 {
    if locksmith::scheme_of(&args.url).is_ok_and(|s| s == "memory") {
        eprintln!(
            "locksmith: memory:// locks exist inside one process only, so they cannot keep two \
             `locksmith run` processes apart; on one host without a server use \
             sqlite:///path/to/locks.db"
        );
        return exit::CONFIG;
    }
    let locker =
        match tokio::time::timeout(args.connect_timeout, locksmith::connect(&args.url)).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return fail(&e),
            Err(_) => {
                eprintln!(
                    "locksmith: no connection to {} within {} (--connect-timeout); giving up",
                    redact_url(&args.url),
                    show(args.connect_timeout)
                );
                return exit::UNAVAILABLE;
            }
        };
    let guard = match acquire(&locker, &args).await {
        Ok(Some(g)) => g,
        Ok(None) => {
            if !args.quiet {
                let how = match args.wait() {
                    Wait::For(d) if !d.is_zero() => format!(" after waiting {}", show(d)),
                    _ => String::new(),
                };
                eprintln!(
                    "locksmith: lock {:?} is busy{how}; not running the command",
                    args.name
                );
            }
            return args.busy_exit_code;
        }
        Err(e) => return fail(&e),
    };

    let mut env = vec![("LOCKSMITH_LOCK_NAME", args.name.clone())];
    if let Some(token) = guard.fencing_token() {
        env.push(("LOCKSMITH_FENCING_TOKEN", token.to_string()));
    }
    let code = match Group::spawn(&args.command, &env) {
        Ok(group) => supervise(group, &guard, &args).await,
        Err(e) => {
            eprintln!("locksmith: cannot start the command's guard process: {e}");
            exit::CANNOT_EXECUTE
        }
    };
    release(guard, &locker, &args.name).await;
    code
}

/// Takes the lock: one attempt for `--wait 0`, else waits. `Ok(None)` when busy / timed out.
async fn acquire(locker: &Locker, args: &RunArgs) -> locksmith::Result<Option<LockGuard>> {
    let opts = LockOptions::new()
        .ttl(args.ttl)
        .auto_renew(AutoRenew::until(args.max_hold));
    match args.wait() {
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

/// Terminates the group because --max-hold was reached; locksmith's exit code.
async fn end_at_max_hold(group: &mut Group, args: &RunArgs) -> u8 {
    eprintln!(
        "locksmith: --max-hold {} reached: terminating the command (lock {:?} is released \
         after it)",
        show(args.max_hold),
        args.name
    );
    let _ = group::terminate(group, args.kill_grace).await;
    exit::MAX_HOLD
}

/// Waits for the command's group while forwarding signals to it; terminates it when the lock
/// is lost, --max-hold is reached, or a forwarded termination request is not obeyed within
/// --kill-grace. Returns locksmith's exit code once nothing of the group is left.
async fn supervise(mut group: Group, guard: &LockGuard, args: &RunArgs) -> u8 {
    let pgid = group.pgid;
    let lost = guard.lost();
    let mut signals = group::catch(group::FORWARDED);
    // The library ends the lease at the same moment (acquired + max hold): whichever of the two
    // wakes first, max hold is what ended it.
    let hold_end = guard.acquired_at() + args.max_hold;
    let max_hold = tokio::time::sleep_until(hold_end);
    tokio::pin!(max_hold);
    // Set when a forwarded SIGTERM/SIGINT/SIGHUP/SIGQUIT starts the kill grace.
    let mut kill_at: Option<(tokio::time::Instant, Signal)> = None;
    let code = loop {
        let escalate = async {
            match kill_at {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = group.guard.wait() => break group::exit_code(status),
            reason = lost.lost() => {
                if reason == LostReason::MaxHoldReached || tokio::time::Instant::now() >= hold_end {
                    return end_at_max_hold(&mut group, args).await;
                }
                eprintln!(
                    "locksmith: lock {:?} lost ({reason}); terminating the command",
                    args.name
                );
                let _ = group::terminate(&mut group, args.kill_grace).await;
                return exit::LOCK_LOST;
            }
            () = &mut max_hold => return end_at_max_hold(&mut group, args).await,
            Some(sig) = signals.recv() => {
                group::signal_group(pgid, sig);
                if group::is_termination_request(sig) && kill_at.is_none() {
                    kill_at = Some((tokio::time::Instant::now() + args.kill_grace, sig));
                }
            }
            () = escalate => {
                if let Some((_, sig)) = kill_at.take() {
                    eprintln!(
                        "locksmith: the command is still running {} after {}; killing its \
                         process group",
                        show(args.kill_grace),
                        group::name(sig)
                    );
                }
                group::signal_group(pgid, Signal::KILL);
            }
        }
    };
    group::end_leftovers(pgid, args.kill_grace).await;
    code
}

async fn release(guard: LockGuard, locker: &Locker, name: &str) {
    match guard.release().await {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotHeld => {}
        Err(e) => eprintln!(
            "locksmith: releasing lock {name:?} failed ({e:#}); it frees when its TTL runs out"
        ),
    }
    locker.flush().await;
}

/// Prints a lock error and maps it to an exit code.
fn fail(e: &Error) -> u8 {
    eprintln!("locksmith: {e:#}");
    match e.kind() {
        ErrorKind::InvalidConfig | ErrorKind::InvalidName | ErrorKind::Unsupported => exit::CONFIG,
        _ => exit::UNAVAILABLE,
    }
}
