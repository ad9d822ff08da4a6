//! `interop=redis-py`: redis-py's `Lock`, as redis-py 4.3.4 (`redis/lock.py`, the Debian
//! `python3-redis` package) keeps it.
//!
//! * The key is the lock name itself, no prefix (`Lock(r, name)` uses `name` as the key).
//! * Acquire: redis-py sends `SET name token NX PX timeout` (`do_acquire`). Ours is the same
//!   test and write in one script (the default mode's acquire script without its fencing
//!   counter): the key is set only when absent; when it already holds our own token (a re-sent
//!   script) its TTL is reset; otherwise the holder's `PTTL` comes back.
//! * Release: redis-py's `LUA_RELEASE_SCRIPT` deletes the key only if it holds the caller's
//!   token; ours does the same and then publishes on locksmith's own channel (which redis-py
//!   does not read) so that locksmith's waiters wake at once.
//! * Extend: redis-py's `LUA_REACQUIRE_SCRIPT` (token-checked `PEXPIRE`); ours is the same.
//!
//! * Beside the peer's key, the name's key on locksmith's default layout (checked first, with
//!   the name's shares and permits, and written, extended and deleted with the peer's key), so
//!   that locksmith clients without `interop=` exclude this mode's holders and the other way
//!   round (see `default_layout_check_lua` in the parent module).
//!
//! The token is the owner token's 32 hex digits: redis-py's own are `uuid1().hex`, the same
//! shape, and it compares them as opaque bytes.

use std::sync::OnceLock;
use std::time::Duration;

use lockcore::{LockName, Result};
use redis::Script;

use super::{default_layout_check_lua, default_shares_key};
use crate::conn::Conn;
use crate::error::map_err;
use crate::node::{Keys, NodeAttempt, RELEASED, ttl_ms};

/// The default layout's check ([`default_layout_check_lua`]), then redis-py's `SET NX PX` as
/// one idempotent test: KEYS peer key, default lock key, default shares; ARGV owner, TTL ms.
/// Returns `{1, 0}` or `{0, the holder's PTTL}`.
const ACQUIRE_LUA: &str = concat!(
    default_layout_check_lua!("ARGV[1]", "{0, held_for}"),
    r"
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return {0, redis.call('PTTL', KEYS[1])} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return {1, 0}
"
);

/// redis-py's `LUA_REACQUIRE_SCRIPT`, and the default layout's lock key with it; refused when
/// either is no longer this owner's (an operator freed the default one: the name may be
/// someone else's there).
const EXTEND_LUA: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
";

/// redis-py's `LUA_RELEASE_SCRIPT`, the default layout's key with it, and a message on
/// locksmith's channel `KEYS[3]` so that locksmith's waiters wake at once.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
redis.call('PUBLISH', KEYS[3], ARGV[2])
return 1
";

/// Deletes the peer's record (and the default layout's key when this mode wrote it).
const REVOKE_LUA: &str = r"
local was = redis.call('GET', KEYS[1])
if not was then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('GET', KEYS[2]) == was then redis.call('DEL', KEYS[2]) end
redis.call('PUBLISH', KEYS[3], ARGV[1])
return 1
";

struct Scripts {
    acquire: Script,
    extend: Script,
    release: Script,
    revoke: Script,
}

fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        acquire: Script::new(ACQUIRE_LUA),
        extend: Script::new(EXTEND_LUA),
        release: Script::new(RELEASE_LUA),
        revoke: Script::new(REVOKE_LUA),
    })
}

/// The key is the exact name; the channel is locksmith's own (`<namespace>:{<name>}:released`,
/// as in the default mode), for wake-ups among locksmith clients only; `holder` is the default
/// layout's lock key of the name, which this mode writes beside the peer's key.
pub(crate) fn keys(namespace: &str, name: &LockName) -> Keys {
    let default = Keys::new(namespace, name);
    Keys {
        lock: name.as_str().to_owned(),
        fence: String::new(),
        holder: default.lock.clone(),
        ..default
    }
}

pub(crate) async fn acquire(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    ttl: Duration,
) -> Result<NodeAttempt> {
    let (won, pttl): (i64, i64) = scripts()
        .acquire
        .key(&keys.lock)
        .key(&keys.holder)
        .key(default_shares_key(&keys.holder))
        .arg(token)
        .arg(ttl_ms(ttl))
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("redis-py acquire script failed", e))?;
    if won == 1 {
        return Ok(NodeAttempt::Won { fence: None });
    }
    // A redis-py Lock without timeout has no TTL (-1): no wake-up time.
    Ok(NodeAttempt::Held {
        pttl: u64::try_from(pttl)
            .ok()
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis),
    })
}

pub(crate) async fn extend(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    ttl: Duration,
) -> Result<bool> {
    let n: i64 = scripts()
        .extend
        .key(&keys.lock)
        .key(&keys.holder)
        .arg(token)
        .arg(ttl_ms(ttl))
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("redis-py extend script failed", e))?;
    Ok(n == 1)
}

pub(crate) async fn release(conn: &mut Conn, keys: &Keys, token: &str) -> Result<bool> {
    let n: i64 = scripts()
        .release
        .key(&keys.lock)
        .key(&keys.holder)
        .key(&keys.channel)
        .arg(token)
        .arg(RELEASED)
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("redis-py release script failed", e))?;
    Ok(n == 1)
}

pub(crate) async fn revoke(conn: &mut Conn, keys: &Keys) -> Result<bool> {
    let n: i64 = scripts()
        .revoke
        .key(&keys.lock)
        .key(&keys.holder)
        .key(&keys.channel)
        .arg(RELEASED)
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("redis-py revoke script failed", e))?;
    Ok(n == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_the_exact_name() {
        let name = LockName::new("jobs:{nightly} 42/é").unwrap();
        let k = keys("locksmith", &name);
        assert_eq!(k.lock, "jobs:{nightly} 42/é");
        assert_eq!(k.channel, Keys::new("locksmith", &name).channel);
        // The default layout's lock key is written beside it.
        assert_eq!(k.holder, Keys::new("locksmith", &name).lock);
    }
}
