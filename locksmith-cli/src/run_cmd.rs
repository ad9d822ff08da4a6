//! `locksmith run`: hold a lock while a command runs, and never let the command outlive it.

use std::time::Duration;

use locksmith::{
    AutoRenew, Error, ErrorKind, LockGuard, LockOptions, Locker, LostReason, Risk, redact_url,
};
use rustix::process::Signal;
use tokio::time::Instant;

use crate::RunArgs;
use crate::duration::{Wait, show};
use crate::exit;
use crate::group::{self, Group};

/// Runs the command under the lock and returns the exit code (see `locksmith run --help`).
///
/// Must run on the main thread (see [`Group::spawn`]).
pub async fn run(args: RunArgs) -> u8 {
    if locksmith::scheme_of(&args.url).is_ok_and(|s| s == "memory") {
        // A bad memory URL (an unknown parameter) is reported as such first, like any URL's.
        if let Err(e) = locksmith::connect(&args.url).await {
            return fail(&e);
        }
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
    // From here on a termination request ends locksmith through its clean-up, never by the
    // signal's default action: while waiting, the wait is given up and its queue entry removed;
    // while the command runs, the request is forwarded to it (`supervise`).
    let (signals, mut requests) = group::Signals::catch(group::TERMINATION);
    let acquired = tokio::select! {
        acquired = acquire(&locker, &args) => acquired,
        Some(sig) = requests.recv() => {
            // The wait is dropped: its clean-up (a queue entry) runs on the locker's background.
            finish(&locker, &args).await;
            eprintln!(
                "locksmith: {} while waiting for lock {:?}; gave up without running the command",
                group::name(sig),
                args.lock_name()
            );
            return 128u8.saturating_add(u8::try_from(sig.as_raw()).unwrap_or(0));
        }
    };
    let guard = match acquired {
        Ok(Some(g)) => g,
        Ok(None) => {
            finish(&locker, &args).await;
            if !args.quiet {
                let how = match args.wait() {
                    Wait::For(d) if !d.is_zero() => format!(" after waiting {}", show(d)),
                    _ => String::new(),
                };
                eprintln!(
                    "locksmith: lock {:?} is busy{how}; not running the command",
                    args.lock_name()
                );
            }
            return args.busy_exit_code;
        }
        Err(e) => {
            finish(&locker, &args).await;
            return fail(&e);
        }
    };

    let mut env = vec![("LOCKSMITH_LOCK_NAME", args.lock_name().to_owned())];
    if let Some(token) = guard.fencing_token() {
        env.push(("LOCKSMITH_FENCING_TOKEN", token.to_string()));
    }
    let code = match Group::spawn(&args.command, &env) {
        Ok(group) => supervise(group, &guard, &args, signals, requests).await,
        Err(e) => {
            eprintln!("locksmith: cannot start the command's guard process: {e}");
            exit::CANNOT_EXECUTE
        }
    };
    release(guard, &locker, &args).await;
    code
}

/// How long locksmith waits, before it exits, for its clean-up to reach the lock service (a
/// release, a given-up wait's queue entry): past it, what is left frees with its TTL or session.
const CLEAN_UP_BOUND: Duration = Duration::from_secs(5);

/// Every way out after connecting: waits for the locker's background work (a dropped wait's
/// queue entry, a release), up to [`CLEAN_UP_BOUND`], so that the runtime's end at exit does
/// not drop it.
async fn finish(locker: &Locker, args: &RunArgs) {
    if let Err(e) = locker.shutdown(CLEAN_UP_BOUND).await {
        eprintln!(
            "locksmith: clean-up of lock {:?} unfinished: {e:#}",
            args.lock_name()
        );
    }
}

/// Takes the lock: one attempt for `--wait 0`, else waits. `Ok(None)` when busy / timed out.
async fn acquire(locker: &Locker, args: &RunArgs) -> locksmith::Result<Option<LockGuard>> {
    let mut opts = LockOptions::new()
        .ttl(args.ttl)
        .auto_renew(AutoRenew::until(lock_hold(args)))
        .mode(args.mode());
    if let Some(label) = &args.label {
        opts = opts.label(label.as_str());
    }
    match args.wait() {
        Wait::For(d) if d.is_zero() => locker.try_lock(args.lock_name(), &opts).await,
        wait => {
            let opts = match wait {
                Wait::Forever => opts.wait_forever(),
                Wait::For(d) => opts.wait_timeout(d),
            };
            match locker.lock(args.lock_name(), &opts).await {
                Ok(g) => Ok(Some(g)),
                Err(e) if e.kind() == ErrorKind::Timeout => Ok(None),
                Err(e) => Err(e),
            }
        }
    }
}

/// Terminates the group because its lease is at risk or lost: SIGTERM now, SIGKILL shortly
/// before the validity ends (at once when lost: the lock may be someone else's already).
/// locksmith's exit code.
async fn end_at_risk(group: &mut Group, args: &RunArgs, risk: Risk, hold_end: Instant) -> u8 {
    let now = Instant::now();
    let kill_by = match risk {
        Risk::Ending { valid_until } => valid_until.checked_sub(kill_lead(args)).unwrap_or(now),
        Risk::Lost(_) => now,
    };
    // The lease ended at the hold's end (its last renewal asked for what was left of it): that
    // is max hold, not a failing server.
    if risk == Risk::Lost(LostReason::MaxHoldReached) || now + kill_lead(args) >= hold_end {
        return end_at_max_hold(group, args, kill_by).await;
    }
    match risk {
        Risk::Lost(reason) => eprintln!(
            "locksmith: lock {:?} lost ({reason}); terminating the command at once",
            args.lock_name()
        ),
        Risk::Ending { .. } => eprintln!(
            "locksmith: lock {:?} at risk: no renewal landed and its validity ends in {}; \
             terminating the command (SIGKILL in {} at the latest)",
            args.lock_name(),
            show(kill_by.saturating_duration_since(now) + kill_lead(args)),
            show(grace_until(args, kill_by))
        ),
    }
    let _ = group::terminate(group, grace_until(args, kill_by)).await;
    exit::LOCK_LOST
}

/// Terminates the group because --max-hold was reached; locksmith's exit code.
async fn end_at_max_hold(group: &mut Group, args: &RunArgs, kill_by: Instant) -> u8 {
    eprintln!(
        "locksmith: --max-hold {} reached: terminating the command (lock {:?} is released \
         after it)",
        show(args.max_hold),
        args.lock_name()
    );
    let _ = group::terminate(group, grace_until(args, kill_by)).await;
    exit::MAX_HOLD
}

/// How long the lock may be held: --max-hold for the command, then --kill-grace for it to exit
/// and the lead SIGKILL keeps before the lease ends, so the command stops under the lock.
fn lock_hold(args: &RunArgs) -> Duration {
    // Saturating: a hold too long for the library is refused by it (exit 78), never a panic.
    args.max_hold
        .saturating_add(args.kill_grace)
        .saturating_add(kill_lead(args))
}

/// When the warning comes that the lease may end: with at most this much validity left and no
/// renewal landing. Half the TTL stays clear of a healthy lease's lowest point (two thirds of
/// the TTL left, renewed every third) and leaves the command half a TTL to exit on SIGTERM.
fn risk_margin(args: &RunArgs) -> Duration {
    args.ttl / 2
}

/// How long before the validity deadline the group must be gone: SIGKILL and the reaping of the
/// group take a few milliseconds; a tenth of the TTL (at most 200 ms) covers them.
fn kill_lead(args: &RunArgs) -> Duration {
    (args.ttl / 10).min(Duration::from_millis(200))
}

/// --kill-grace, shortened so that SIGKILL comes at `kill_by` at the latest: the command never
/// runs past the lease's validity, whatever it does with SIGTERM.
fn grace_until(args: &RunArgs, kill_by: Instant) -> Duration {
    args.kill_grace
        .min(kill_by.saturating_duration_since(Instant::now()))
}

/// Waits for the command's group while forwarding signals to it; terminates it when the lock
/// is lost, --max-hold is reached, or a forwarded termination request is not obeyed within
/// --kill-grace. Returns locksmith's exit code once nothing of the group is left.
async fn supervise(
    mut group: Group,
    guard: &LockGuard,
    args: &RunArgs,
    mut signals: group::Signals,
    mut requests: tokio::sync::mpsc::UnboundedReceiver<Signal>,
) -> u8 {
    let pgid = group.pgid;
    let signal = guard.lost();
    let at_risk = signal.at_risk(risk_margin(args));
    tokio::pin!(at_risk);
    // Once the lease's validity reaches the hold's end, nothing renews it any more and its
    // nearing end is no risk (--max-hold's timer stops the command first): from then on only a
    // loss counts.
    let mut hold_bound = false;
    let lost = signal.lost();
    tokio::pin!(lost);
    // The termination requests are caught already (since the wait); now every other signal
    // the command should get, into the same stream.
    signals.add(group::FORWARDED);
    let signals = &mut requests;
    // The command is told to stop at --max-hold; the library keeps the lease until the kill
    // grace after it has run out (`lock_hold`), so that the command stops under the lock.
    let hold_end = guard.acquired_at() + lock_hold(args);
    let max_hold = tokio::time::sleep_until(guard.acquired_at() + args.max_hold);
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
            risk = &mut at_risk, if !hold_bound => {
                if let Risk::Ending { valid_until } = risk
                    && valid_until + Duration::from_millis(1) >= hold_end
                {
                    hold_bound = true;
                    continue;
                }
                return end_at_risk(&mut group, args, risk, hold_end).await;
            }
            reason = &mut lost, if hold_bound => {
                return end_at_risk(&mut group, args, Risk::Lost(reason), hold_end).await;
            }
            () = &mut max_hold => {
                return end_at_max_hold(&mut group, args, hold_end - kill_lead(args)).await;
            }
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

async fn release(guard: LockGuard, locker: &Locker, args: &RunArgs) {
    let name = args.lock_name();
    // Bounded as the rest of the clean-up: past the bound, the lock frees with its TTL.
    let released = tokio::time::timeout(CLEAN_UP_BOUND, guard.release())
        .await
        .unwrap_or_else(|_| {
            Err(Error::timeout(format!(
                "no answer within {}",
                show(CLEAN_UP_BOUND)
            )))
        });
    match released {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotHeld => {}
        Err(e) => eprintln!(
            "locksmith: releasing lock {name:?} failed ({e:#}); it frees when its TTL runs out"
        ),
    }
    finish(locker, args).await;
}

/// Prints a lock error and maps it to an exit code.
fn fail(e: &Error) -> u8 {
    eprintln!("locksmith: {e:#}");
    match e.kind() {
        ErrorKind::InvalidConfig
        | ErrorKind::InvalidName
        | ErrorKind::Unsupported
        | ErrorKind::Conflict => exit::CONFIG,
        ErrorKind::Auth => exit::AUTH,
        _ => exit::UNAVAILABLE,
    }
}
