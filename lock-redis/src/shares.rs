//! Shared holders and semaphore permits on one Redis server (and, for readers, on each master
//! of a Redlock, through `node::acquire_share` and its siblings): leases in a sorted set beside the
//! exclusive lock key, each scored with its expiry on the server's clock (`TIME`), never the
//! client's (Redisson's expirable semaphore trusts client clocks; a client whose clock runs
//! ahead would free live permits).
//!
//! Keys, all under the lock's hash tag (one slot on a cluster):
//! * `…:shares`: sorted set, owner token → expiry (server ms). The key itself expires with the
//!   longest share, so a name whose holders all crashed leaves nothing behind.
//! * `…:shareinfo`: hash, `mode` → `shared` or `permit:<limit>` (how the name is used while
//!   held: a request with another mode or limit is refused, not silently split), and owner
//!   token → `"<fence> <holder metadata>"`.
//! * `…:writer`: a writer waiting behind shared holders (its token; PX a little past the
//!   writer's next attempt, which refreshes it). Shared requests that come while it exists
//!   wait, so a stream of readers cannot starve a writer; a writer that gives up stops
//!   holding them back within that PX.
//! * `…:queue`, `…:queuexp`: the exclusive waiters' queue (see `queue`),
//!   passed to every share script so that a share release wakes the queue's head (a writer
//!   waiting behind the readers), not a waiter that is not next.
//!
//! Every script reads the server clock once and drops the expired shares first (a release
//! only looks at its own share's expiry; an acquire finding the set empty has none to drop),
//! and a release publishes on the lock's release channel, as the exclusive release does.

use std::time::Duration;

use lockcore::{Error, Holder, LockMode, Result, Share};

use crate::conn::Conn;
use crate::error::map_err;
use crate::grant::{Grant, NodeAttempt};
use crate::keys::{Keys, ShareKeys};
use crate::lua::{announce_lua, drop_expired_lua, keep_entry_lua};
use crate::script::{
    LuaScript, Replicas, eval, publish_command, run, run_flag, ttl_ms, under_replicated,
};

/// Takes a share for token `ARGV[1]`, TTL `ARGV[2]` ms, metadata `ARGV[3]`, mode `ARGV[4]`
/// (`shared` or `permit:<limit>`), limit `ARGV[5]` (0 for shared), `ARGV[6]` the TTL ms of a
/// waiter's entry (0: a `try_lock`), `ARGV[7]` `1` to advance the fencing counter (`0`: no
/// counter, the fence reported is 0: Redlock's masters keep none). KEYS: lock, holder (unused here, kept for one layout),
/// fence, shares, share info, waiting writer, queue, queue expiries. A waiting request that
/// does not win records itself in the queue's expiries only (counted as a queued waiter, see
/// `queue`, without a place in the exclusive waiters' order). Returns
/// `{1, fence}`, `{0, ms until a place may free}` or `{-1, 0}` (the name is used in another
/// way: another mode or limit, or as a mutex by a semaphore request). Idempotent for one
/// token: a re-sent script whose first copy ran resets the share's TTL and reports its fence.
static ACQUIRE: LuaScript = LuaScript::new(concat!(
    r"
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local ttl = tonumber(ARGV[2])
local function waits(left)
  local qttl = tonumber(ARGV[6])
  if qttl > 0 then
",
    keep_entry_lua!("now + qttl"),
    r"
  end
  return {0, left}
end
redis.call('ZREM', KEYS[8], ARGV[1])
local function keep_until_last()
  local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[4], last[2])
  redis.call('PEXPIREAT', KEYS[5], last[2])
end
-- The expired shares go first (none to look at when the set is empty: the uncontended case
-- makes no call for them, nor for this token's share or the mode).
local n = redis.call('ZCARD', KEYS[4])
if n > 0 then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
    redis.call('HDEL', KEYS[5], unpack(gone))
    n = n - #gone
  end
end
if n > 0 then
  local mine = redis.call('HGET', KEYS[5], ARGV[1])
  if mine and redis.call('ZSCORE', KEYS[4], ARGV[1]) then
    redis.call('ZADD', KEYS[4], now + ttl, ARGV[1])
    keep_until_last()
    return {1, tonumber(string.match(mine, '^%d+'))}
  end
  if redis.call('HGET', KEYS[5], 'mode') ~= ARGV[4] then return {-1, 0} end
end
local limit = tonumber(ARGV[5])
if limit > 0 then
  if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, 0} end
  if n >= limit then
    local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
    return waits(tonumber(first[2]) - now)
  end
elseif redis.call('EXISTS', KEYS[1], KEYS[6]) > 0 then
  local w = redis.call('PTTL', KEYS[1])
  if w ~= -2 then return waits(w) end
  w = redis.call('PTTL', KEYS[6])
  if w ~= -2 then return waits(w) end
end
local fence = 0
if ARGV[7] == '1' then
  fence = math.max(tonumber(redis.call('GET', KEYS[3]) or '0') + 1, now_us)
  redis.call('SET', KEYS[3], string.format('%d', fence))
end
redis.call('ZADD', KEYS[4], now + ttl, ARGV[1])
redis.call('HSET', KEYS[5], 'mode', ARGV[4], ARGV[1], string.format('%d', fence) .. ' ' .. ARGV[3])
if n == 0 then
  -- The only share: the keys last as long as it does.
  redis.call('PEXPIREAT', KEYS[4], now + ttl)
  redis.call('PEXPIREAT', KEYS[5], now + ttl)
else
  keep_until_last()
end
return {1, fence}
"
));

/// Resets the share of token `ARGV[1]` to `ARGV[2]` ms from now if it is live. KEYS as
/// [`ACQUIRE`]'s. Returns 1 or 0.
static EXTEND: LuaScript = LuaScript::new(concat!(
    drop_expired_lua!(),
    r"
if not redis.call('ZSCORE', KEYS[4], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[4], last[2])
redis.call('PEXPIREAT', KEYS[5], last[2])
return 1
"
));

/// Removes the share of token `ARGV[1]` if it is live and tells the waiters (`ARGV[2]`:
/// channel, `ARGV[3]`: `PUBLISH` or `SPUBLISH`) with `$plain`, or `$head .. <head token>` when
/// exclusive waiters queue (see [`announce_lua`]). Returns 1 or 0.
macro_rules! release_share_lua {
    ($plain:literal, $head:literal) => {
        concat!(
            r"
local t = redis.call('TIME')
local now = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
local until_ms = redis.call('ZSCORE', KEYS[4], ARGV[1])
if not until_ms or tonumber(until_ms) <= now then return 0 end
if redis.call('ZCARD', KEYS[4]) == 1 then
  redis.call('DEL', KEYS[4], KEYS[5])
else
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('HDEL', KEYS[5], ARGV[1])
end
",
            announce_lua!("KEYS[7]", "KEYS[8]", "ARGV[3]", "ARGV[2]", $plain, $head),
            r"
return 1
"
        )
    };
}

/// A single node's share release: `released`, or `q:<head>`.
static RELEASE: LuaScript = LuaScript::new(release_share_lua!("'released'", "'q:'"));

/// A Redlock master's share release: the release's own message `ARGV[4]` (the same on every
/// master, see [`release_share_announced`]), followed by ` q:<head>` when exclusive
/// waiters queue.
static RELEASE_NAMED: LuaScript = LuaScript::new(release_share_lua!("ARGV[4]", "ARGV[4] .. ' q:'"));

/// Every live share: `{mode or '', {ms left, fence and metadata, token}...}` flattened.
static INSPECT: LuaScript = LuaScript::new(concat!(
    drop_expired_lua!(),
    r"
local all = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
local out = {redis.call('HGET', KEYS[5], 'mode') or ''}
for i = 1, #all, 2 do
  table.insert(out, tonumber(all[i + 1]) - now)
  table.insert(out, redis.call('HGET', KEYS[5], all[i]) or '')
  table.insert(out, all[i])
end
return out
"
));

/// How a share is recorded in the share info's `mode` field.
fn mode_field(mode: LockMode) -> (String, u32) {
    match mode {
        LockMode::Permit { limit } => (format!("permit:{limit}"), limit),
        _ => ("shared".to_owned(), 0),
    }
}

/// What one share attempt reported.
pub(crate) enum ShareAttempt {
    Won { fence: u64 },
    Held { wait: Option<Duration> },
}

fn conflict(mode: LockMode) -> Error {
    Error::conflict(format!(
        "the lock is in use in another way (another mode or permit limit, or as a mutex), and \
         this acquisition asks for {mode}"
    ))
}

/// What a share attempt asks for.
pub(crate) struct ShareAsk {
    /// The share's TTL.
    pub(crate) ttl: Duration,
    /// Shared, or one of N permits.
    pub(crate) mode: LockMode,
    /// A waiting request that loses is counted among the queued waiters for this long (zero:
    /// a `try_lock`, not counted).
    pub(crate) entry: Duration,
    /// Advance the name's fencing counter (a single node always does; Redlock keeps none).
    pub(crate) fencing: bool,
}

/// One share attempt (one script, one round trip; with `replicas`, `WAIT` pipelined behind
/// it, on a connection of its own: a share that too few replicas acknowledged is released
/// and reported `Unavailable`, as an exclusive acquisition is).
///
/// Cancel safety: a dropped call may have taken the share; it then frees after `ask.ttl`.
pub(crate) async fn acquire(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    holder: &str,
    ask: ShareAsk,
    replicas: Option<Replicas>,
) -> Result<ShareAttempt> {
    let ShareAsk {
        ttl,
        mode,
        entry,
        fencing,
    } = ask;
    let share_keys = ShareKeys::of(keys);
    let (mode_str, limit) = mode_field(mode);
    let ttl = ttl_ms(ttl).to_string();
    let limit = limit.to_string();
    let entry = entry.as_millis().to_string();
    let fencing = if fencing { "1" } else { "0" };
    let args = [token, &ttl, holder, &mode_str, &limit, &entry, fencing];
    let (reply, acked): (Vec<i64>, _) =
        eval(conn, ACQUIRE.get(), &share_keys.with(keys), &args, replicas)
            .await
            .map_err(|e| map_err("share acquire script failed", e))?;
    let grant = Grant::judge(&reply)?;
    if let Some(r) = replicas
        && matches!(grant, Grant::Won(_))
        && acked.unwrap_or(0) < i64::from(r.count)
    {
        if let Err(e) = release(conn, keys, token).await {
            tracing::warn!(error = %e, "could not release an under-replicated share; it frees after its ttl");
        }
        return Err(under_replicated("the share", acked, &r, ""));
    }
    match grant {
        Grant::Won(fence) => Ok(ShareAttempt::Won {
            fence: Grant::fence(fence)?,
        }),
        Grant::Held(wait) => Ok(ShareAttempt::Held {
            wait: Grant::wait(wait),
        }),
        Grant::Conflict => Err(conflict(mode)),
    }
}

/// Compare-and-extend of a share: whether `token` still held it. With `replicas`, an
/// extension too few replicas acknowledged is `Unavailable` (a promoted replica would end the
/// share early).
///
/// Cancel safety: dropping the future may or may not have extended the share.
pub(crate) async fn extend(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    ttl: Duration,
    replicas: Option<Replicas>,
) -> Result<bool> {
    let share_keys = ShareKeys::of(keys);
    let ttl = ttl_ms(ttl).to_string();
    let (n, acked): (i64, _) = eval(
        conn,
        EXTEND.get(),
        &share_keys.with(keys),
        &[token, &ttl],
        replicas,
    )
    .await
    .map_err(|e| map_err("share extend script failed", e))?;
    if let Some(r) = replicas
        && n == 1
        && acked.unwrap_or(0) < i64::from(r.count)
    {
        return Err(under_replicated("the share's extension", acked, &r, ""));
    }
    Ok(n == 1)
}

/// Compare-and-remove of a share, waking the waiters: whether `token` still held it.
///
/// Cancel safety: dropping the future may leave the share held until its TTL runs out.
pub(crate) async fn release(conn: &mut Conn, keys: &Keys, token: &str) -> Result<bool> {
    release_with(conn, keys, token, None).await
}

async fn release_with(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    message: Option<&str>,
) -> Result<bool> {
    let share_keys = ShareKeys::of(keys);
    let publish = publish_command(conn);
    let (script, args) = match message {
        Some(m) => (&RELEASE_NAMED, vec![token, &keys.channel, publish, m]),
        None => (&RELEASE, vec![token, &keys.channel, publish]),
    };
    let what = "share release script failed";
    run_flag(conn, script, &share_keys.with(keys), &args, what).await
}

/// Every live share of the name, in grant order, and the mode they hold it in.
///
/// Cancel safe (drops expired shares only).
pub(crate) async fn inspect(
    conn: &mut Conn,
    keys: &Keys,
) -> Result<(Option<LockMode>, Vec<Share>)> {
    let (mode, shares) = inspect_owned(conn, keys).await?;
    Ok((mode, shares.into_iter().map(|(_, s)| s).collect()))
}

/// [`inspect`], each share with its owner token (in grant order).
///
/// Cancel safe (drops expired shares only).
async fn inspect_owned(
    conn: &mut Conn,
    keys: &Keys,
) -> Result<(Option<LockMode>, Vec<(String, Share)>)> {
    let share_keys = ShareKeys::of(keys);
    let what = "share inspect script failed";
    let raw: Vec<redis::Value> = run(conn, &INSPECT, &share_keys.with(keys), &[], what).await?;
    let mut items = raw.into_iter();
    let mode_str: String = items
        .next()
        .map(|v| redis::from_redis_value(v).unwrap_or_default())
        .unwrap_or_default();
    let mode = parse_mode(&mode_str);
    let mut shares = Vec::new();
    while let (Some(left), Some(entry), Some(token)) = (items.next(), items.next(), items.next()) {
        let left: i64 = redis::from_redis_value(left).unwrap_or(0);
        let entry: String = redis::from_redis_value(entry).unwrap_or_default();
        let token: String = redis::from_redis_value(token).unwrap_or_default();
        let (fence, meta) = entry.split_once(' ').unwrap_or((&entry, ""));
        let share = Share::new(
            fence.parse().ok(),
            u64::try_from(left).ok().map(Duration::from_millis),
            Holder::decode(meta),
        );
        shares.push((token, share));
    }
    Ok((mode.filter(|_| !shares.is_empty()), shares))
}

fn parse_mode(s: &str) -> Option<LockMode> {
    match s.strip_prefix("permit:") {
        Some(limit) => limit.parse().ok().map(|limit| LockMode::Permit { limit }),
        None => (s == "shared").then_some(LockMode::Shared),
    }
}

/// Takes a shared (reader's) lease for `token` with TTL `ttl` on one server, without a fencing
/// counter: the single-node read-write protocol of this module (a sorted set of readers beside
/// the lock key, expiring on the server's clock), the one a single Redis node runs for
/// [`LockMode::Shared`]. Refused (`Held`) while an exclusive holder or a waiting writer's mark
/// (see `acquire_waiting`) is there; `pttl` is then what is
/// left of the one found. A waiting request (`entry` non-zero) that loses is counted among the
/// queued waiters (not ordered among them) for `entry`. Idempotent for one token (a re-sent
/// script resets the share's TTL).
///
/// Cancel safety: a dropped call may have taken the share; it then frees after `ttl`.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails; `Conflict` when the name is held as a
/// semaphore.
pub async fn acquire_share(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    holder: &str,
    ttl: Duration,
    entry: Duration,
) -> Result<NodeAttempt> {
    let ask = ShareAsk {
        ttl,
        mode: LockMode::Shared,
        entry,
        fencing: false,
    };
    Ok(match acquire(conn, keys, token, holder, ask, None).await? {
        ShareAttempt::Won { .. } => NodeAttempt::Won { fence: None },
        ShareAttempt::Held { wait } => NodeAttempt::Held { pttl: wait },
    })
}

/// Compare-and-extend of a share taken with [`acquire_share`]: resets it to `ttl` if `token`
/// still holds it; returns whether it did.
///
/// Cancel safety: dropping the future may or may not have extended the share.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn extend_share(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    ttl: Duration,
) -> Result<bool> {
    extend(conn, keys, token, ttl, None).await
}

/// Compare-and-remove of a share taken with [`acquire_share`], publishing `message` (followed
/// by ` q:<head token>` when exclusive waiters queue, as
/// `release_announced`): returns whether `token` held it.
///
/// Cancel safety: dropping the future may leave the share held until its TTL runs out.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn release_share_announced(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    message: &str,
) -> Result<bool> {
    release_with(conn, keys, token, Some(message)).await
}

/// Every live share taken with [`acquire_share`] on one server, as `(owner token, share)` in
/// grant order (the share's fencing token is `None`: these shares have none); empty when the
/// name has no readers (or is used as a semaphore, which [`acquire_share`] never does).
///
/// Cancel safe (drops expired shares only).
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn inspect_shares(conn: &mut Conn, keys: &Keys) -> Result<Vec<(String, Share)>> {
    let (mode, shares) = inspect_owned(conn, keys).await?;
    if mode != Some(LockMode::Shared) {
        return Ok(Vec::new());
    }
    Ok(shares
        .into_iter()
        .map(|(token, s)| (token, Share::new(None, s.ttl_left, s.holder)))
        .collect())
}

/// How long a waiting writer's mark (see `acquire_waiting`)
/// should last past each of its attempts when it polls every `poll` at the latest: past its
/// next attempt, and short, so that a writer that gave up holds later readers back that long
/// at most.
pub fn writer_mark_ttl(poll: Duration) -> Duration {
    poll + Duration::from_secs(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_through_the_share_info() {
        for mode in [LockMode::Shared, LockMode::Permit { limit: 7 }] {
            assert_eq!(parse_mode(&mode_field(mode).0), Some(mode));
        }
        assert_eq!(parse_mode(""), None);
        assert_eq!(parse_mode("permit:x"), None);
    }
}
