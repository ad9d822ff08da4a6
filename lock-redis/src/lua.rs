//! The Lua pieces that the exclusive lock, its waiters' queue and the shares of one name have
//! in common, each written once and spliced into the scripts (`concat!`) of every mode: how a
//! grant is judged beside shared holders ([`writer_check_lua`]), how a free lock is taken and
//! its fencing counter moved ([`take_lua`], [`advance_fence_lua`]), how a waiter is counted
//! and kept in line ([`prune_queue_lua`], [`keep_entry_lua`], [`out_of_line_lua`]), and whom a
//! release wakes ([`announce_lua`]). A mode's own file holds only its scripts and keys.
//!
//! Key positions are those of [`ShareKeys::with`](crate::keys::ShareKeys::with): `KEYS[1]`
//! lock, `[2]` holder, `[3]` fence, `[4]` shares, `[5]` share info, `[6]` waiting writer,
//! `[7]` queue, `[8]` queue expiries; `ARGV[1]` is always the owner token.

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
pub(crate) use drop_expired_lua;

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
            crate::lua::drop_expired_lua!(),
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
pub(crate) use writer_check_lua;

/// Takes the free lock for token `ARGV[1]`: the lock key `KEYS[1]` and the holder metadata
/// `KEYS[2]` (`"<token> <ARGV[3]>"`), both with the TTL `ARGV[2]` ms.
macro_rules! take_lua {
    () => {
        r"
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[3], 'PX', ARGV[2])
"
    };
}
pub(crate) use take_lua;

/// `local fence`: the fencing counter `KEYS[3]` moved to `max(last + 1, server time in µs)`,
/// the time read from `$time` (a Lua expression giving a `TIME` reply).
macro_rules! advance_fence_lua {
    ($time:literal) => {
        concat!(
            r"
local t = ",
            $time,
            r"
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local fence = math.max(tonumber(redis.call('GET', KEYS[3]) or '0') + 1, now_us)
redis.call('SET', KEYS[3], string.format('%d', fence))
"
        )
    };
}
pub(crate) use advance_fence_lua;

/// Drops the expired entries of the queue `$q` / `$qexp` (by the server's clock, `qnow`, ms;
/// `qt` and `qnow` must be declared `local` before).
macro_rules! prune_queue_lua {
    ($q:literal, $qexp:literal) => {
        concat!(
            r"
qt = redis.call('TIME')
qnow = tonumber(qt[1]) * 1000 + math.floor(tonumber(qt[2]) / 1000)
local stale = redis.call('ZRANGEBYSCORE', ",
            $qexp,
            r", '-inf', qnow)
if #stale > 0 then
  redis.call('ZREMRANGEBYSCORE', ",
            $qexp,
            r", '-inf', qnow)
  redis.call('ZREM', ",
            $q,
            r", unpack(stale))
end
"
        )
    };
}
pub(crate) use prune_queue_lua;

/// Counts the waiter `ARGV[1]` among the name's waiters until `$until` (server ms): its entry
/// in the queue's expiries `KEYS[8]`, which lasts as long as its latest entry (`local last`:
/// that entry and its expiry).
macro_rules! keep_entry_lua {
    ($until:literal) => {
        concat!(
            r"
redis.call('ZADD', KEYS[8], ",
            $until,
            r", ARGV[1])
local last = redis.call('ZRANGE', KEYS[8], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[8], last[2])
"
        )
    };
}
pub(crate) use keep_entry_lua;

/// `local function out_of_line()`: takes the token `ARGV[1]` out of the queue `KEYS[7..8]`
/// and, where given, out of the grants `KEYS[9]` (a waiter that won; `queue_live` must say
/// whether the queue exists).
macro_rules! out_of_line_lua {
    () => {
        r"
local function out_of_line()
  if queue_live and redis.call('ZREM', KEYS[7], ARGV[1]) == 1 then
    redis.call('ZREM', KEYS[8], ARGV[1])
    if KEYS[9] then redis.call('HDEL', KEYS[9], ARGV[1]) end
  end
end
"
    };
}
pub(crate) use out_of_line_lua;

/// Tells the waiters that the lock may be free: `q:<head>` when the queue `$q` has a live head
/// (only that waiter acts), else `$plain`; `$cmd` (`PUBLISH` or `SPUBLISH`) on channel `$chan`.
/// With a sixth argument the head's message is `$head .. <head token>` instead (a Redlock
/// master's release names itself: `<message> q:<head>`); with a seventh, `$live` (a Lua
/// condition) says whether the queue is there to be read, instead of an `EXISTS` of `$qexp`.
/// Without waiters it costs one `EXISTS` more than a plain publish.
macro_rules! announce_lua {
    ($q:literal, $qexp:literal, $cmd:literal, $chan:literal, $plain:literal) => {
        crate::lua::announce_lua!($q, $qexp, $cmd, $chan, $plain, "'q:'")
    };
    ($q:literal, $qexp:literal, $cmd:literal, $chan:literal, $plain:literal, $head:literal) => {
        crate::lua::announce_lua!(
            $q,
            $qexp,
            $cmd,
            $chan,
            $plain,
            $head,
            concat!("redis.call('EXISTS', ", $qexp, ") == 1")
        )
    };
    (
        $q:literal,
        $qexp:literal,
        $cmd:literal,
        $chan:literal,
        $plain:literal,
        $head:literal,
        $live:expr
    ) => {
        concat!(
            r"
local head, qt, qnow = nil, nil, nil
if ",
            $live,
            r" then
",
            crate::lua::prune_queue_lua!($q, $qexp),
            r"
  head = redis.call('ZRANGE', ",
            $q,
            r", 0, 0)[1]
end
if head then
  redis.call(",
            $cmd,
            ", ",
            $chan,
            ", ",
            $head,
            r" .. head)
else
  redis.call(",
            $cmd,
            ", ",
            $chan,
            ", ",
            $plain,
            r")
end
"
        )
    };
}
pub(crate) use announce_lua;
