//! The operators' commands: `locksmith status NAME` (who holds a lock) and
//! `locksmith unlock NAME --force` (free it whoever holds it).

use std::time::{Duration, UNIX_EPOCH};

use locksmith::{Error, ErrorKind, LockInfo, Locker, redact_url};

use crate::duration::show;

/// Exit codes of `status` and `unlock`.
pub mod exit {
    /// `status`: held. `unlock`: something was released.
    pub const HELD: u8 = 0;
    /// `status`: free. `unlock`: nothing was held.
    pub const FREE: u8 = 1;
    /// Bad arguments, an unreachable server, a backend that cannot tell.
    pub const ERROR: u8 = 2;
}

/// Connects within `timeout`, or prints why not.
async fn connect(url: &str, timeout: Duration) -> Result<Locker, u8> {
    match tokio::time::timeout(timeout, locksmith::connect(url)).await {
        Ok(Ok(l)) => Ok(l),
        Ok(Err(e)) => Err(fail(&e)),
        Err(_) => {
            eprintln!(
                "locksmith: no connection to {} within {} (--connect-timeout); giving up",
                redact_url(url),
                show(timeout)
            );
            Err(exit::ERROR)
        }
    }
}

fn fail(e: &Error) -> u8 {
    eprintln!("locksmith: {e:#}");
    if e.kind() == ErrorKind::Unsupported {
        eprintln!("locksmith: this backend does not support the command (see its capabilities)");
    }
    exit::ERROR
}

/// `locksmith status`: prints the lock's state; 0 held, 1 free, 2 on error.
pub async fn status(url: &str, name: &str, json: bool, timeout: Duration) -> u8 {
    let locker = match connect(url, timeout).await {
        Ok(l) => l,
        Err(code) => return code,
    };
    let info = match locker.inspect(name).await {
        Ok(i) => i,
        Err(e) => return fail(&e),
    };
    if json {
        println!("{}", to_json(&info));
    } else {
        print!("{info}");
    }
    if info.held { exit::HELD } else { exit::FREE }
}

/// `locksmith unlock --force`: 0 released, 1 nothing was held, 2 on error (or without
/// `--force`).
pub async fn unlock(url: &str, name: &str, force: bool, timeout: Duration) -> u8 {
    if !force {
        eprintln!(
            "locksmith: unlock frees {name:?} whoever holds it; the holder loses the lock and its \
             work may still be running. Check `locksmith status {name}` first, then run again \
             with --force."
        );
        return exit::ERROR;
    }
    let locker = match connect(url, timeout).await {
        Ok(l) => l,
        Err(code) => return code,
    };
    match locker.force_release(name).await {
        Ok(true) => {
            println!("released {name}");
            exit::HELD
        }
        Ok(false) => {
            println!("{name} was not held");
            exit::FREE
        }
        Err(e) => fail(&e),
    }
}

/// The `--json` form: one object, times as Unix milliseconds and seconds.
fn to_json(info: &LockInfo) -> String {
    let holder = |h: &locksmith::Holder| {
        serde_json::json!({
            "host": h.host,
            "pid": h.pid,
            "label": h.label,
            "acquired_at_unix_ms": h.acquired_at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
            "acquired_at_clock": h.clock.as_str(),
        })
    };
    // Every holder where several hold it (shared, permits); the fields above are the first's.
    let holders: Vec<_> = info
        .shares
        .iter()
        .map(|s| {
            serde_json::json!({
                "fencing_token": s.fencing_token,
                "ttl_left_secs": s.ttl_left.map(|t| t.as_secs_f64()),
                "holder": s.holder.as_ref().map(holder),
            })
        })
        .collect();
    serde_json::json!({
        "name": info.name.as_str(),
        "held": info.held,
        "mode": info.mode.map(|m| m.to_string()),
        "fencing_token": info.fencing_token,
        "ttl_left_secs": info.ttl_left.map(|t| t.as_secs_f64()),
        "holder": info.holder.as_ref().map(holder),
        // A holder's bare value in place of metadata (an etcd election leader's proposal).
        "value": info.value,
        "holders": holders,
        "waiters": info.waiters,
    })
    .to_string()
}
