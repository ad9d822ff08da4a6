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

use std::time::Duration;

use lockcore::{LockName, Result};

use super::{default_layout_check_lua, run_acquire};
use crate::conn::Conn;
use crate::grant::NodeAttempt;
use crate::keys::Keys;
use crate::script::{LuaScript, run_flag, ttl_ms};
use crate::subs::RELEASED;

/// The default layout's check ([`default_layout_check_lua`]), then redis-py's `SET NX PX` as
/// one idempotent test: KEYS peer key, default lock key, default shares; ARGV owner, TTL ms.
/// Returns `{1, 0}` or `{0, the holder's PTTL}`.
static ACQUIRE: LuaScript = LuaScript::new(concat!(
    default_layout_check_lua!("ARGV[1]", "{0, held_for}"),
    r"
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return {0, redis.call('PTTL', KEYS[1])} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return {1, 0}
"
));

/// redis-py's `LUA_REACQUIRE_SCRIPT`, and the default layout's lock key with it; refused when
/// either is no longer this owner's (an operator freed the default one: the name may be
/// someone else's there).
static EXTEND: LuaScript = LuaScript::new(
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
",
);

/// redis-py's `LUA_RELEASE_SCRIPT`, the default layout's key with it, and a message on
/// locksmith's channel `KEYS[3]` so that locksmith's waiters wake at once.
static RELEASE: LuaScript = LuaScript::new(
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
redis.call('PUBLISH', KEYS[3], ARGV[2])
return 1
",
);

/// Deletes the peer's record (and the default layout's key when this mode wrote it).
static REVOKE: LuaScript = LuaScript::new(
    r"
local was = redis.call('GET', KEYS[1])
if not was then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('GET', KEYS[2]) == was then redis.call('DEL', KEYS[2]) end
redis.call('PUBLISH', KEYS[3], ARGV[1])
return 1
",
);

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
    let args = [token, &ttl_ms(ttl).to_string()];
    let what = "redis-py acquire script failed";
    let (won, pttl): (i64, i64) = run_acquire(conn, &ACQUIRE, keys, &args, what).await?;
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
    let key_list = [keys.lock.as_str(), &keys.holder];
    let args = [token, &ttl_ms(ttl).to_string()];
    run_flag(
        conn,
        &EXTEND,
        &key_list,
        &args,
        "redis-py extend script failed",
    )
    .await
}

pub(crate) async fn release(conn: &mut Conn, keys: &Keys, token: &str) -> Result<bool> {
    let key_list = [keys.lock.as_str(), &keys.holder, &keys.channel];
    let what = "redis-py release script failed";
    run_flag(conn, &RELEASE, &key_list, &[token, RELEASED], what).await
}

pub(crate) async fn revoke(conn: &mut Conn, keys: &Keys) -> Result<bool> {
    let key_list = [keys.lock.as_str(), &keys.holder, &keys.channel];
    let what = "redis-py revoke script failed";
    run_flag(conn, &REVOKE, &key_list, &[RELEASED], what).await
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
