//! `interop=redisson`: Redisson's `RLock`, as Redisson 4.7.0 keeps it. Redisson is a Java
//! library from Maven, which the project's machines cannot reach; this follows its published
//! source (github.com/redisson/redisson, tag `redisson-4.7.0`):
//!
//! * `RedissonLock.tryLockInnerAsync`: the lock is a hash at the exact lock name (`getRawName`),
//!   taken when the key does not exist or already has the caller's field
//!   (`<client id>:<thread id>`, `RedissonBaseLock.getLockName`): `HINCRBY name field 1`,
//!   `PEXPIRE name leaseTime`; otherwise the script returns the key's `PTTL`.
//! * `RedissonLock.unlockInnerAsync`: if the field exists, `HINCRBY -1`; at zero `DEL` and
//!   `PUBLISH` (or `SPUBLISH` with sharded pub/sub) of `LockPubSub.UNLOCK_MESSAGE` (the long `0`,
//!   sent as `0`) on `getChannelName()`, that is `prefixName("redisson_lock__channel", name)`:
//!   `redisson_lock__channel:{<name>}`, or `redisson_lock__channel:<name>` when the name already
//!   contains `{` (`RedissonObject.prefixName`).
//! * `renewal/LockTask`: renewal is `PEXPIRE` if `HEXISTS name field`.
//! * `forceUnlockAsync`: `DEL`, then the same publish.
//!
//! Beside the hash, the name's key on locksmith's default layout (checked first, with the
//! name's shares and permits, and written, extended and deleted with the hash), so that
//! locksmith clients without `interop=` exclude this mode's holders and the other way round.
//!
//! This side's field is `<owner token as a hyphenated UUID>:1` (a client id of its own, never
//! Redisson's) with count 1: each acquisition is its own owner, never reentrant, so a Redisson
//! client never mistakes it for its own. The acquire script is Redisson's test, made idempotent
//! for one owner (a re-sent script resets the TTL instead of counting twice). Redisson's unlock
//! latch key (`redisson_unlock_latch:...`, its own retry bookkeeping) is not written: no peer
//! reads another client's latch.

use std::time::Duration;

use lockcore::{LockName, OwnerToken, Result};

use super::{default_channel, default_layout_check_lua, run_acquire};
use crate::conn::Conn;
use crate::grant::NodeAttempt;
use crate::keys::Keys;
use crate::script::{LuaScript, run_flag, ttl_ms};
use crate::subs::RELEASED;

/// Redisson's `LockPubSub.UNLOCK_MESSAGE` as it goes over the wire (a `LongCodec` 0).
pub(crate) const UNLOCK_MESSAGE: &str = "0";

/// The default layout's check ([`default_layout_check_lua`]), then `tryLockInnerAsync`'s test
/// (`exists == 0 or hexists field`), idempotent for one owner: a new holder's field is set to
/// 1, a holder that already has its field only gets its TTL back; the default layout's lock key
/// `KEYS[2]` is written with the field and TTL beside it. KEYS hash, default lock key, default
/// shares; ARGV TTL ms, field. Returns -3 (won; a PTTL is never below -2) or the holder's PTTL.
static ACQUIRE: LuaScript = LuaScript::new(concat!(
    default_layout_check_lua!("ARGV[2]", "held_for"),
    r"
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  redis.call('set', KEYS[2], ARGV[2], 'PX', ARGV[1])
  return -3
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  redis.call('set', KEYS[2], ARGV[2], 'PX', ARGV[1])
  return -3
end
return redis.call('pttl', KEYS[1])
"
));

/// `LockTask`'s renewal of one lock, and the default layout's key with it (refused when that
/// is no longer this owner's: an operator freed it).
static EXTEND: LuaScript = LuaScript::new(
    r"
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 and redis.call('get', KEYS[2]) == ARGV[2] then
  redis.call('pexpire', KEYS[1], ARGV[1])
  redis.call('pexpire', KEYS[2], ARGV[1])
  return 1
end
return 0
",
);

/// `unlockInnerAsync` for a count of 1 (this side never counts higher): delete and publish
/// Redisson's unlock message; the default layout's key `KEYS[3]` goes too, and locksmith's
/// default-layout waiters hear of it on `KEYS[4]`.
static RELEASE: LuaScript = LuaScript::new(
    r"
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
  return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
if redis.call('get', KEYS[3]) == ARGV[2] then
  redis.call('del', KEYS[3])
  redis.call('publish', KEYS[4], ARGV[3])
end
return 1
",
);

/// `forceUnlockAsync` (and the default layout's key, when one of the hash's fields wrote it).
static REVOKE: LuaScript = LuaScript::new(
    r"
local m = redis.call('get', KEYS[3])
if m and redis.call('hexists', KEYS[1], m) == 1 then
  redis.call('del', KEYS[3])
  redis.call('publish', KEYS[4], ARGV[2])
end
if redis.call('del', KEYS[1]) == 1 then
  redis.call('publish', KEYS[2], ARGV[1])
  return 1
end
return 0
",
);

/// `RedissonObject.prefixName("redisson_lock__channel", name)`.
pub(crate) fn channel(name: &str) -> String {
    if name.contains('{') {
        format!("redisson_lock__channel:{name}")
    } else {
        format!("redisson_lock__channel:{{{name}}}")
    }
}

/// The hash at the exact name and Redisson's channel; `holder` is the default layout's lock key
/// of the name (in `namespace`), which this mode writes beside the hash.
pub(crate) fn keys(namespace: &str, name: &LockName) -> Keys {
    let default = Keys::new(namespace, name);
    Keys {
        lock: name.as_str().to_owned(),
        fence: String::new(),
        channel: channel(name.as_str()),
        tag: name.escaped(),
        holder: default.lock,
    }
}

/// This acquisition's field: `<client id>:<thread id>` as Redisson writes it, with the owner
/// token (hyphenated, as Redisson's client ids are UUIDs) as the client id.
pub(crate) fn field(token: &OwnerToken) -> String {
    format!("{}:1", token.uuid().hyphenated())
}

pub(crate) async fn acquire(
    conn: &mut Conn,
    keys: &Keys,
    field: &str,
    ttl: Duration,
) -> Result<NodeAttempt> {
    let args = [&ttl_ms(ttl).to_string(), field];
    let what = "redisson acquire script failed";
    let r: i64 = run_acquire(conn, &ACQUIRE, keys, &args, what).await?;
    if r == -3 {
        return Ok(NodeAttempt::Won { fence: None });
    }
    // A Redisson lock taken without a lease time has a TTL (the watchdog's 30 s); -1 (none) or
    // -2 (gone meanwhile) give no wake-up time.
    Ok(NodeAttempt::Held {
        pttl: u64::try_from(r).ok().map(Duration::from_millis),
    })
}

pub(crate) async fn extend(
    conn: &mut Conn,
    keys: &Keys,
    field: &str,
    ttl: Duration,
) -> Result<bool> {
    let key_list = [keys.lock.as_str(), &keys.holder];
    let args = [&ttl_ms(ttl).to_string(), field];
    run_flag(
        conn,
        &EXTEND,
        &key_list,
        &args,
        "redisson extend script failed",
    )
    .await
}

/// Redisson's hash and channel, then the default layout's lock key and channel.
fn both_layouts(keys: &Keys) -> [String; 4] {
    let mirror = keys.holder.clone();
    let mirror_channel = default_channel(&mirror);
    [
        keys.lock.clone(),
        keys.channel.clone(),
        mirror,
        mirror_channel,
    ]
}

pub(crate) async fn release(conn: &mut Conn, keys: &Keys, field: &str) -> Result<bool> {
    let key_list = both_layouts(keys);
    let key_list = key_list.each_ref().map(String::as_str);
    let args = [UNLOCK_MESSAGE, field, RELEASED];
    run_flag(
        conn,
        &RELEASE,
        &key_list,
        &args,
        "redisson release script failed",
    )
    .await
}

pub(crate) async fn revoke(conn: &mut Conn, keys: &Keys) -> Result<bool> {
    let key_list = both_layouts(keys);
    let key_list = key_list.each_ref().map(String::as_str);
    let args = [UNLOCK_MESSAGE, RELEASED];
    run_flag(
        conn,
        &REVOKE,
        &key_list,
        &args,
        "redisson force unlock failed",
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_follows_redisson() {
        let k = keys("locksmith", &LockName::new("orders:42").unwrap());
        assert_eq!(k.lock, "orders:42");
        assert_eq!(k.channel, "redisson_lock__channel:{orders:42}");
        // prefixName leaves a name that has a brace as it is.
        assert_eq!(channel("{shard}x"), "redisson_lock__channel:{shard}x");
        let token = OwnerToken::random();
        let f = field(&token);
        assert_eq!(f.len(), 36 + 2);
        assert!(f.ends_with(":1") && f.starts_with(&token.uuid().hyphenated().to_string()));
    }
}
