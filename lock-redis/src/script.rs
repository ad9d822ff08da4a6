//! How a script call goes to the server: the scripts' one registration ([`LuaScript`]), the
//! call itself (with `WAIT` pipelined behind it where replicas must acknowledge), and the
//! arguments every script shares (a TTL in ms, the publish command of the deployment).

use std::sync::OnceLock;
use std::time::Duration;

use lockcore::{Error, ErrorKind, Result};
use redis::Script;

use crate::conn::Conn;
use crate::error::map_err;

/// A Lua script's text and its `redis::Script` (the SHA1 computed once, on first use): one
/// `static` per script, so a script is declared, registered and named in one place.
pub(crate) struct LuaScript {
    lua: &'static str,
    script: OnceLock<Script>,
}

impl LuaScript {
    pub(crate) const fn new(lua: &'static str) -> LuaScript {
        LuaScript {
            lua,
            script: OnceLock::new(),
        }
    }

    pub(crate) fn get(&self) -> &Script {
        self.script.get_or_init(|| Script::new(self.lua))
    }
}

/// How many replicas must acknowledge a write (`WAIT count timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replicas {
    /// Replicas that must acknowledge.
    pub count: u32,
    /// How long `WAIT` waits for them.
    pub timeout: Duration,
}

/// A TTL in whole milliseconds for `PX`, rounded up: the server never frees the lock before the
/// client's validity deadline (which is below the TTL by the drift margin anyway).
pub fn ttl_ms(ttl: Duration) -> u64 {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    ms.clamp(1, u64::MAX as u128) as u64
}

/// How releases are announced: classic `PUBLISH` on a single node; on a cluster sharded
/// `SPUBLISH` (Redis 7), which stays on the nodes of the channel's slot (the lock's slot: the
/// channel carries the same hash tag) instead of being broadcast over the cluster bus.
pub(crate) fn publish_command(conn: &Conn) -> &'static str {
    match conn {
        Conn::Single(_) => "PUBLISH",
        Conn::Cluster(_) => "SPUBLISH",
    }
}

/// Runs `script` on `conn`; with `replicas`, as one pipeline `EVALSHA ...; WAIT n t` (one round
/// trip; on a cluster the pipeline goes to the master of the keys' slot, which `WAIT` must
/// reach), loading the script once on `NOSCRIPT`.
pub(crate) async fn eval<T: redis::FromRedisValue>(
    conn: &mut Conn,
    script: &Script,
    keys: &[&str],
    args: &[&str],
    replicas: Option<Replicas>,
) -> redis::RedisResult<(T, Option<i64>)> {
    let Some(r) = replicas else {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            inv.arg(*a);
        }
        return Ok((inv.invoke_async(conn).await?, None));
    };
    let mut pipe = redis::pipe();
    pipe.cmd("EVALSHA")
        .arg(script.get_hash())
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .cmd("WAIT")
        .arg(r.count)
        .arg(r.timeout.as_millis() as u64);
    match pipe.query_async::<(T, i64)>(conn).await {
        Ok((v, n)) => Ok((v, Some(n))),
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            let (v, n) = pipe.query_async::<(T, i64)>(conn).await?;
            Ok((v, Some(n)))
        }
        Err(e) => Err(e),
    }
}

/// Runs `script` once (no `WAIT`); a failure is reported as `what` failed.
pub(crate) async fn run<T: redis::FromRedisValue>(
    conn: &mut Conn,
    script: &LuaScript,
    keys: &[&str],
    args: &[&str],
    what: &str,
) -> Result<T> {
    eval(conn, script.get(), keys, args, None)
        .await
        .map(|(reply, _)| reply)
        .map_err(|e| map_err(what, e))
}

/// [`run`] for the scripts that answer 1 (done: held, released, extended) or 0.
pub(crate) async fn run_flag(
    conn: &mut Conn,
    script: &LuaScript,
    keys: &[&str],
    args: &[&str],
    what: &str,
) -> Result<bool> {
    Ok(run::<i64>(conn, script, keys, args, what).await? == 1)
}

/// The acknowledgement `WAIT` asked for and did not get: the write may be lost in a failover.
/// `what` the write (`the lock`, ...), `then` what was done about it (may be empty).
pub(crate) fn under_replicated(what: &str, acked: Option<i64>, r: &Replicas, then: &str) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!(
            "only {} of {} replicas acknowledged {what} within {:?}{then}",
            acked.unwrap_or(0),
            r.count,
            r.timeout
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up() {
        assert_eq!(ttl_ms(Duration::from_micros(1500)), 2);
        assert_eq!(ttl_ms(Duration::from_millis(30)), 30);
        assert_eq!(ttl_ms(Duration::from_nanos(1)), 1);
    }
}
