//! Shared holders and semaphore permits on one Redis server (and, for readers, on each master
//! of a Redlock, through [`crate::node::acquire_share`] and its siblings): leases in a sorted set beside the
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
//! * `…:queue`, `…:queuexp`: the exclusive waiters' queue (see [`queue`](crate::queue)),
//!   passed to every share script so that a share release wakes the queue's head (a writer
//!   waiting behind the readers), not a waiter that is not next.
//!
//! Every script reads the server clock once and drops the expired shares first (a release
//! only looks at its own share's expiry; an acquire finding the set empty has none to drop),
//! and a release publishes on the lock's release channel, as the exclusive release does.

use std::time::Duration;

use lockcore::{Error, Holder, LockMode, Result, Share};
use redis::Script;

use crate::node::{Conn, Keys, Replicas, eval, map_err, publish_command, ttl_ms};

/// The server clock in ms as `now` (and in µs as `now_us`), and the expired shares of
/// `KEYS[4]` (with their `KEYS[5]` entries) gone.
macro_rules! drop_expired_lua {
    () => {
        r"
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  redis.call('HDEL', KEYS[5], unpack(gone))
end
"
    };
}

/// The read-write check in front of an exclusive acquire script (`KEYS[4..6]`: shares, share
/// info, waiting writer; `ARGV[4]`: how long the writer's mark lasts, ms, past the writer's next
/// attempt; 0 for an attempt that will not wait, which marks nothing). Live shares hold the
/// name: a shared use returns `$held` (a Lua expression that may use `left`, the ms to the
/// earliest share's expiry) with this writer marked as waiting; a semaphore use is a conflict,
/// `$conflict`. Otherwise the writer's own mark goes, and the exclusive script runs. The mark
/// is short (not the readers' TTL) so that a writer that gives up or is cancelled holds later
/// readers back for that long at most. One check for every exclusive script beside shares
/// (a single node's, a queued one's, a Redlock master's).
macro_rules! writer_check_lua {
    ($conflict:literal, $held:literal) => {
        concat!(
            r"
if redis.call('EXISTS', KEYS[4]) == 1 then
",
            crate::shares::drop_expired_lua!(),
            r"
  local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  if first[2] then
    if redis.call('HGET', KEYS[5], 'mode') ~= 'shared' then return ",
            $conflict,
            r" end
    local left = tonumber(first[2]) - now
    local mark = tonumber(ARGV[4])
    if mark > 0 then redis.call('SET', KEYS[6], ARGV[1], 'PX', mark) end
    return ",
            $held,
            r"
  end
end
if redis.call('GET', KEYS[6]) == ARGV[1] then redis.call('DEL', KEYS[6]) end
"
        )
    };
}
pub(crate) use drop_expired_lua;
pub(crate) use writer_check_lua;

/// Takes a share for token `ARGV[1]`, TTL `ARGV[2]` ms, metadata `ARGV[3]`, mode `ARGV[4]`
/// (`shared` or `permit:<limit>`), limit `ARGV[5]` (0 for shared), `ARGV[6]` the TTL ms of a
/// waiter's entry (0: a `try_lock`), `ARGV[7]` `1` to advance the fencing counter (`0`: no
/// counter, the fence reported is 0: Redlock's masters keep none). KEYS: lock, holder (unused here, kept for one layout),
/// fence, shares, share info, waiting writer, queue, queue expiries. A waiting request that
/// does not win records itself in the queue's expiries only (counted as a queued waiter, see
/// [`queue`](crate::queue), without a place in the exclusive waiters' order). Returns
/// `{1, fence}`, `{0, ms until a place may free}` or `{-1, 0}` (the name is used in another
/// way: another mode or limit, or as a mutex by a semaphore request). Idempotent for one
/// token: a re-sent script whose first copy ran resets the share's TTL and reports its fence.
const ACQUIRE_SHARE_LUA: &str = r"
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local ttl = tonumber(ARGV[2])
local function waits(left)
  local qttl = tonumber(ARGV[6])
  if qttl > 0 then
    redis.call('ZADD', KEYS[8], now + qttl, ARGV[1])
    local last = redis.call('ZRANGE', KEYS[8], -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', KEYS[8], last[2])
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
";

/// Resets the share of token `ARGV[1]` to `ARGV[2]` ms from now if it is live. KEYS as
/// [`ACQUIRE_SHARE_LUA`]'s. Returns 1 or 0.
const EXTEND_SHARE_LUA: &str = concat!(
    drop_expired_lua!(),
    r"
if not redis.call('ZSCORE', KEYS[4], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[4], last[2])
redis.call('PEXPIREAT', KEYS[5], last[2])
return 1
"
);

/// Removes the share of token `ARGV[1]` if it is live and tells the waiters (`ARGV[2]`:
/// channel, `ARGV[3]`: `PUBLISH` or `SPUBLISH`) with `$plain`, or `$head .. <head token>` when
/// exclusive waiters queue (see [`announce_lua`](crate::queue::announce_lua)). Returns 1 or 0.
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
            crate::queue::announce_lua!("KEYS[7]", "KEYS[8]", "ARGV[3]", "ARGV[2]", $plain, $head),
            r"
return 1
"
        )
    };
}

/// A single node's share release: `released`, or `q:<head>`.
const RELEASE_SHARE_LUA: &str = release_share_lua!("'released'", "'q:'");

/// A Redlock master's share release: the release's own message `ARGV[4]` (the same on every
/// master, see [`crate::node::release_announced`]), followed by ` q:<head>` when exclusive
/// waiters queue.
const RELEASE_SHARE_NAMED_LUA: &str = release_share_lua!("ARGV[4]", "ARGV[4] .. ' q:'");

/// Every live share: `{mode or '', {ms left, fence and metadata, token}...}` flattened.
const INSPECT_SHARES_LUA: &str = concat!(
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
);

struct Scripts {
    acquire: Script,
    extend: Script,
    release: Script,
    release_named: Script,
    inspect: Script,
}

fn scripts() -> &'static Scripts {
    static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        acquire: Script::new(ACQUIRE_SHARE_LUA),
        extend: Script::new(EXTEND_SHARE_LUA),
        release: Script::new(RELEASE_SHARE_LUA),
        release_named: Script::new(RELEASE_SHARE_NAMED_LUA),
        inspect: Script::new(INSPECT_SHARES_LUA),
    })
}

/// The share keys beside a lock's keys (same hash tag).
#[derive(Clone, Debug)]
pub(crate) struct ShareKeys {
    pub(crate) shares: String,
    pub(crate) info: String,
    pub(crate) writer: String,
    /// The exclusive waiters' queue: owner token → arrival (server µs).
    pub(crate) queue: String,
    /// The same waiters: owner token → when the entry expires (server ms).
    pub(crate) queue_exp: String,
}

impl ShareKeys {
    pub(crate) fn of(keys: &Keys) -> ShareKeys {
        let base = keys.lock.strip_suffix(":lock").unwrap_or(&keys.lock);
        ShareKeys {
            shares: format!("{base}:shares"),
            info: format!("{base}:shareinfo"),
            writer: format!("{base}:writer"),
            queue: format!("{base}:queue"),
            queue_exp: format!("{base}:queuexp"),
        }
    }

    /// The eight keys of the share scripts and of the exclusive script behind the writer check
    /// (the queue's two last).
    pub(crate) fn with<'a>(&'a self, keys: &'a Keys) -> [&'a str; 8] {
        [
            &keys.lock,
            &keys.holder,
            &keys.fence,
            &self.shares,
            &self.info,
            &self.writer,
            &self.queue,
            &self.queue_exp,
        ]
    }
}

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

/// The acknowledgement `WAIT` asked for and did not get: the write may be lost in a failover.
fn under_replicated(what: &str, acked: Option<i64>, r: &Replicas) -> Error {
    Error::new(
        lockcore::ErrorKind::Unavailable,
        format!(
            "only {} of {} replicas acknowledged the {what} within {:?}",
            acked.unwrap_or(0),
            r.count,
            r.timeout
        ),
    )
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
    let ((won, value), acked): ((i64, i64), _) = eval(
        conn,
        &scripts().acquire,
        &share_keys.with(keys),
        &[
            token,
            &ttl,
            holder,
            &mode_str,
            &limit,
            &entry,
            if fencing { "1" } else { "0" },
        ],
        replicas,
    )
    .await
    .map_err(|e| map_err("share acquire script failed", e))?;
    if let Some(r) = replicas
        && won == 1
        && acked.unwrap_or(0) < i64::from(r.count)
    {
        if let Err(e) = release(conn, keys, token).await {
            tracing::warn!(error = %e, "could not release an under-replicated share; it frees after its ttl");
        }
        return Err(under_replicated("share", acked, &r));
    }
    match won {
        1 => Ok(ShareAttempt::Won {
            fence: u64::try_from(value).map_err(|_| {
                Error::new(lockcore::ErrorKind::Backend, "negative fencing counter")
            })?,
        }),
        0 => Ok(ShareAttempt::Held {
            wait: u64::try_from(value).ok().map(Duration::from_millis),
        }),
        _ => Err(conflict(mode)),
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
        &scripts().extend,
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
        return Err(under_replicated("share's extension", acked, &r));
    }
    Ok(n == 1)
}

/// Compare-and-remove of a share, waking the waiters: whether `token` still held it.
///
/// Cancel safety: dropping the future may leave the share held until its TTL runs out.
pub(crate) async fn release(conn: &mut Conn, keys: &Keys, token: &str) -> Result<bool> {
    release_with(conn, keys, token, None).await
}

/// [`release`], announced with `message` (and ` q:<head>` behind it when exclusive waiters
/// queue) instead of `released`: see [`crate::node::release_share_announced`].
///
/// Cancel safety: as [`release`].
pub(crate) async fn release_named(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    message: &str,
) -> Result<bool> {
    release_with(conn, keys, token, Some(message)).await
}

async fn release_with(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    message: Option<&str>,
) -> Result<bool> {
    let share_keys = ShareKeys::of(keys);
    let publish = publish_command(conn);
    let script = match message {
        Some(_) => &scripts().release_named,
        None => &scripts().release,
    };
    let mut inv = script.prepare_invoke();
    for k in share_keys.with(keys) {
        inv.key(k);
    }
    inv.arg(token).arg(&keys.channel).arg(publish);
    if let Some(m) = message {
        inv.arg(m);
    }
    let n: i64 = inv
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("share release script failed", e))?;
    Ok(n == 1)
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
pub(crate) async fn inspect_owned(
    conn: &mut Conn,
    keys: &Keys,
) -> Result<(Option<LockMode>, Vec<(String, Share)>)> {
    let share_keys = ShareKeys::of(keys);
    let mut inv = scripts().inspect.prepare_invoke();
    for k in share_keys.with(keys) {
        inv.key(k);
    }
    let raw: Vec<redis::Value> = inv
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("share inspect script failed", e))?;
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

    #[test]
    fn share_keys_keep_the_lock_hash_tag() {
        let keys = Keys::new("ns", &lockcore::LockName::new("a/b").unwrap());
        let s = ShareKeys::of(&keys);
        let tag = format!("{{{}}}", keys.tag);
        for k in [&s.shares, &s.info, &s.writer, &s.queue, &s.queue_exp] {
            assert!(k.contains(&tag), "{k}");
        }
    }
}
