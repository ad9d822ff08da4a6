//! The exclusive waiters' queue of one lock name (locksmith's own layout only, not under
//! `interop=`): what makes a hand-over cost a release and one attempt however many clients
//! wait, instead of every waiting client trying at each release (a herd).
//!
//! Keys, under the lock's hash tag (one slot on a cluster), beside the share keys
//! ([`ShareKeys`](crate::shares::ShareKeys)):
//! * `…:queue`: sorted set, owner token → when it joined (server `TIME`, µs): the order.
//! * `…:queuexp`: sorted set, owner token → when its entry expires (server `TIME`, ms). A
//!   waiter's every attempt refreshes its entry to a little past its next attempt
//!   ([`entry_ttl`]); an entry whose waiter crashed expires on the **server's clock** and is
//!   pruned by the next script that reads the queue. (Redisson's `RedissonFairLock` keeps the
//!   order in a list and the timeouts in a sorted set too, but computes the timeouts and the
//!   "now" that prunes them from the calling client's `System.currentTimeMillis()` (script
//!   arguments), so a client whose clock runs ahead prunes live waiters, and one running
//!   behind keeps dead ones for as long as it is off; here no client clock is ever compared.
//!   Redisson also gives every waiting thread a channel of its own, a `SUBSCRIBE` and an
//!   `UNSUBSCRIBE` per wait; here a client's waiters share one subscription per name.) Both keys expire
//!   with their latest entry, so a name whose waiters all crashed leaves nothing behind.
//!
//! The acquire script grants a free lock only to the queue's live head, or to anyone when the
//! queue is empty (an uncontended `try_lock` costs what it did: one script); a waiting
//! `lock()` that does not win joins (or stays in) the queue. Every script that frees the lock
//! (release, a share's release, an operator's revoke, a head leaving) publishes
//! `q:<head token>` on the lock's channel instead of a plain `released`: only the waiter with
//! that token acts on it (see [`crate::subs`]), so one hand-over costs the release and the
//! head's one attempt. A waiter dropped while queued (a cancelled or timed-out `lock()`) leaves
//! the queue from the background ([`Leave`]), and wakes the next head if it was the head of a
//! free lock.
//!
//! Shared holders and permits do not queue: readers are kept from starving a writer by the
//! writer mark of [`shares`](crate::shares), and may get in ahead of queued writers while the
//! lock is free of writers (FIFO holds among exclusive waiters). A waiting share request is
//! only counted: it keeps an entry in `…:queuexp` (none in `…:queue`), so that
//! [`Backend::queued_waiters`](lockcore::backend::Backend::queued_waiters) sees every waiter.

use std::time::Duration;

use lockcore::Result;
use lockcore::backend::{CancelCleanUp, CleanUpTask};
use redis::Script;

use crate::node::{Conn, Keys, map_err, publish_command};
use crate::shares::ShareKeys;

/// What a message naming the queue's head starts with (`q:<owner token>`).
pub const HEAD_PREFIX: &str = "q:";

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

/// Tells the waiters that the lock may be free: `q:<head>` when the queue `$q` has a live head
/// (only that waiter acts), else `$plain`; `$cmd` (`PUBLISH` or `SPUBLISH`) on channel `$chan`.
/// With a sixth argument the head's message is `$head .. <head token>` instead (a Redlock
/// master's release names itself: `<message> q:<head>`). Without waiters (no `$qexp` key) it
/// costs one `EXISTS` more than a plain publish.
macro_rules! announce_lua {
    ($q:literal, $qexp:literal, $cmd:literal, $chan:literal, $plain:literal) => {
        crate::queue::announce_lua!($q, $qexp, $cmd, $chan, $plain, "'q:'")
    };
    ($q:literal, $qexp:literal, $cmd:literal, $chan:literal, $plain:literal, $head:literal) => {
        concat!(
            r"
local head, qt, qnow = nil, nil, nil
if redis.call('EXISTS', ",
            $qexp,
            r") == 1 then
",
            crate::queue::prune_queue_lua!($q, $qexp),
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

/// The exclusive acquire with the queue. KEYS: lock, holder, fence, shares, share info,
/// waiting writer, queue, queue expiries. ARGV: token, TTL ms, holder metadata, the writer
/// mark's slack ms (see [`shares`](crate::shares)), the queue entry's TTL ms (0: a `try_lock`,
/// which never joins the queue), `ARGV[6]` `0` when no fencing token is wanted (the counter is
/// left alone and the fence reported is 0; absent or anything else: the counter moves). Returns
/// `{1, fence, 0}`, `{0, pttl or -3, position}`
/// (position in the queue, 0 the head, -1 not queued) or `{-1, 0, -1}` (held as a semaphore).
///
/// A name without a holder, shares, a writer's mark or a queue (one `EXISTS` tells) is taken at
/// once: what the full script would do then, in 6 calls instead of 9 (each call inside a script
/// costs the server about as much as a command of its own).
const ACQUIRE_QUEUED_LUA: &str = concat!(
    r"
if redis.call('EXISTS', KEYS[1], KEYS[4], KEYS[6], KEYS[8]) == 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[3], 'PX', ARGV[2])
  if ARGV[6] == '0' then return {1, 0, 0} end
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fence = math.max(tonumber(redis.call('GET', KEYS[3]) or '0') + 1, now_us)
  redis.call('SET', KEYS[3], string.format('%d', fence))
  return {1, fence, 0}
end
local qttl = tonumber(ARGV[5])
local qt, qnow = nil, nil
local queue_live = redis.call('EXISTS', KEYS[8]) == 1
if queue_live then
",
    prune_queue_lua!("KEYS[7]", "KEYS[8]"),
    r"
end
local function in_line()
  if qttl > 0 then
    if not qt then
      qt = redis.call('TIME')
      qnow = tonumber(qt[1]) * 1000 + math.floor(tonumber(qt[2]) / 1000)
    end
    if not redis.call('ZSCORE', KEYS[7], ARGV[1]) then
      redis.call('ZADD', KEYS[7], qt[1] * 1000000 + qt[2], ARGV[1])
    end
    redis.call('ZADD', KEYS[8], qnow + qttl, ARGV[1])
    local last = redis.call('ZRANGE', KEYS[8], -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', KEYS[7], last[2])
    redis.call('PEXPIREAT', KEYS[8], last[2])
  end
  return redis.call('ZRANK', KEYS[7], ARGV[1]) or -1
end
local function out_of_line()
  if queue_live and redis.call('ZREM', KEYS[7], ARGV[1]) == 1 then
    redis.call('ZREM', KEYS[8], ARGV[1])
  end
end
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  out_of_line()
  return {1, tonumber(redis.call('GET', KEYS[3]) or '0'), 0}
end
",
    crate::shares::writer_check_lua!("{-1, 0, -1}", "{0, left, in_line()}"),
    r"
if holder then return {0, redis.call('PTTL', KEYS[1]), in_line()} end
if queue_live then
  local head = redis.call('ZRANGE', KEYS[7], 0, 0)[1]
  if head and head ~= ARGV[1] then return {0, -3, in_line()} end
  out_of_line()
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[3], 'PX', ARGV[2])
if ARGV[6] == '0' then return {1, 0, 0} end
local t = qt or redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local fence = math.max(tonumber(redis.call('GET', KEYS[3]) or '0') + 1, now_us)
redis.call('SET', KEYS[3], string.format('%d', fence))
return {1, fence, 0}
"
);

/// Compare-and-delete that wakes the queue's head (KEYS: lock, holder, queue, queue expiries;
/// ARGV: token, channel, `PUBLISH` or `SPUBLISH`).
const RELEASE_QUEUED_LUA: &str = concat!(
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
",
    announce_lua!("KEYS[3]", "KEYS[4]", "ARGV[3]", "ARGV[2]", "'released'"),
    r"
return 1
"
);

/// A waiter leaves the queue (KEYS: lock, queue, queue expiries, shares; ARGV: token, channel,
/// `PUBLISH` or `SPUBLISH`). When it was the head of a lock nobody holds, the next head is
/// told (a release may have named the leaver). Returns whether it was queued (or counted).
const LEAVE_LUA: &str = concat!(
    r"
local counted = redis.call('ZREM', KEYS[3], ARGV[1])
local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
if not rank then return counted end
redis.call('ZREM', KEYS[2], ARGV[1])
if rank == 0 and redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[4]) == 0 then
  local qt, qnow
",
    prune_queue_lua!("KEYS[2]", "KEYS[3]"),
    r"
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then redis.call(ARGV[3], ARGV[2], 'q:' .. head) end
end
return 1
"
);

/// Compare-and-delete that takes the releaser out of the queue (also on a master that refused
/// its vote, where a vote that reached it before the previous holder's release left an entry)
/// and announces the release as
/// `ARGV[4]`, followed by ` q:<head>` when the queue has a live head (KEYS: lock, holder,
/// queue, queue expiries; ARGV: token, channel, `PUBLISH` or `SPUBLISH`, message): the release
/// of [`crate::node::release_announced`], which Redlock sends to each master with one message
/// per release.
const RELEASE_NAMED_LUA: &str = concat!(
    r"
local queued = redis.call('EXISTS', KEYS[4]) == 1
if queued then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
local head, qt, qnow = nil, nil, nil
if queued then
",
    prune_queue_lua!("KEYS[3]", "KEYS[4]"),
    r"
  head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
end
if head then
  redis.call(ARGV[3], ARGV[2], ARGV[4] .. ' q:' .. head)
else
  redis.call(ARGV[3], ARGV[2], ARGV[4])
end
return 1
"
);

/// The acquire of one master of a Redlock (no fencing counter; KEYS: lock, holder, fence
/// (unused), shares, share info, waiting writer, queue, queue expiries, as
/// [`ShareKeys::with`]; ARGV: token, TTL ms, holder metadata, the writer mark's slack ms (0:
/// no mark), queue entry TTL ms (0 for a `try_lock`), the waiter's ticket or empty): as the
/// plain acquire script, except that
/// * live shared holders on this master hold the lock too (the read-write check of
///   [`shares`](crate::shares), the one a single node runs): a waiting writer refused by them
///   marks itself there as waiting (readers that come later are refused on this master) and
///   joins the queue, so that the last reader's release wakes it;
/// * while the master's queue has live waiters a free lock goes only to one of them (any of
///   them: the masters' queues may order them differently, and a vote must be able to win a
///   majority; a newcomer, like the client that just released, cannot barge past them), and a
///   waiting request that loses joins (or refreshes its entry in) the queue, which also
///   decides whom a release wakes (see [`crate::node::acquire_waiting`]).
///
/// * a waiter's place in the queue is its **ticket** when it brings one (a time in µs that
///   one master's `TIME` gave it, the same on every master: see `lock-redlock`'s acquire), or
///   else, when it is new there, the later of this server's `TIME` and just behind the tail:
///   a newcomer queues last on every master whatever the masters' clocks say, and waiters
///   that joined at once (in different orders on different masters) stand in one order
///   everywhere from their next vote, so a release names the same head on every master.
///
/// Returns `{1, 0}`, `{0, pttl of the holder, or ms to the earliest share's expiry, or -3 when
/// free but queued for, place in the queue (µs) and waiters ahead when queued}` or `{-1, 0}`
/// (the name is held as a semaphore).
const ACQUIRE_WAITING_LUA: &str = concat!(
    r"
local holder = redis.call('GET', KEYS[1])
local queue_live = redis.call('EXISTS', KEYS[8]) == 1
local qt, qnow = nil, nil
local function in_line(reply)
  if tonumber(ARGV[5]) > 0 then
    if not qt then
      qt = redis.call('TIME')
      qnow = tonumber(qt[1]) * 1000 + math.floor(tonumber(qt[2]) / 1000)
    end
    local at = tonumber(redis.call('ZSCORE', KEYS[7], ARGV[1]) or '')
    local ticket = tonumber(ARGV[6] or '')
    if ticket then
      if at ~= ticket then redis.call('ZADD', KEYS[7], ticket, ARGV[1]) end
      at = ticket
    elseif not at then
      at = tonumber(qt[1]) * 1000000 + tonumber(qt[2])
      local tail = redis.call('ZRANGE', KEYS[7], -1, -1, 'WITHSCORES')[2]
      if tail and tonumber(tail) >= at then at = tonumber(tail) + 1 end
      redis.call('ZADD', KEYS[7], at, ARGV[1])
    end
    redis.call('ZADD', KEYS[8], qnow + tonumber(ARGV[5]), ARGV[1])
    local last = redis.call('ZRANGE', KEYS[8], -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', KEYS[7], last[2])
    redis.call('PEXPIREAT', KEYS[8], last[2])
    reply[3] = at
    reply[4] = redis.call('ZRANK', KEYS[7], ARGV[1])
  end
  return reply
end
local function out_of_line()
  if queue_live and redis.call('ZREM', KEYS[7], ARGV[1]) == 1 then
    redis.call('ZREM', KEYS[8], ARGV[1])
  end
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  out_of_line()
  return {1, 0}
end
",
    crate::shares::writer_check_lua!("{-1, 0}", "in_line({0, left})"),
    r"
if holder then
  return in_line({0, redis.call('PTTL', KEYS[1])})
end
if queue_live then
",
    prune_queue_lua!("KEYS[7]", "KEYS[8]"),
    r"
  if redis.call('ZCARD', KEYS[7]) > 0 and not redis.call('ZSCORE', KEYS[7], ARGV[1]) then
    return in_line({0, -3})
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[3], 'PX', ARGV[2])
out_of_line()
return {1, 0}
"
);

/// The live entries of the queue (KEYS: queue, queue expiries), by the server's clock.
const COUNT_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
";

struct Scripts {
    acquire: Script,
    acquire_waiting: Script,
    release: Script,
    release_named: Script,
    leave: Script,
    count: Script,
}

fn scripts() -> &'static Scripts {
    static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        acquire: Script::new(ACQUIRE_QUEUED_LUA),
        acquire_waiting: Script::new(ACQUIRE_WAITING_LUA),
        release: Script::new(RELEASE_QUEUED_LUA),
        release_named: Script::new(RELEASE_NAMED_LUA),
        leave: Script::new(LEAVE_LUA),
        count: Script::new(COUNT_LUA),
    })
}

/// The script behind [`crate::node::acquire_replicated`] when it queues.
pub(crate) fn acquire_script() -> &'static Script {
    &scripts().acquire
}

/// How long a waiter's queue entry lasts past each of its attempts: past its next attempt,
/// which comes at the latest at the safety-net poll (`poll`, jittered below it), with room
/// for a slow round trip and a busy machine. A crashed waiter holds the queue up (if it is
/// the head of a free lock) at most this long, after which the next waiter's safety poll
/// takes the lock.
pub fn entry_ttl(poll: Duration) -> Duration {
    poll + Duration::from_secs(2)
}

/// Compare-and-delete of the exclusive lock that wakes the queue's head (or, with an empty
/// queue, publishes `released`). Returns whether `token` held the lock.
///
/// Cancel safety: dropping the future may or may not have released the lock.
pub(crate) async fn release(conn: &mut Conn, keys: &Keys, token: &str) -> Result<bool> {
    let sk = ShareKeys::of(keys);
    let n: i64 = scripts()
        .release
        .key(&keys.lock)
        .key(&keys.holder)
        .key(&sk.queue)
        .key(&sk.queue_exp)
        .arg(token)
        .arg(&keys.channel)
        .arg(publish_command(conn))
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("release script failed", e))?;
    Ok(n == 1)
}

/// Takes `token` out of the queue of `keys`, waking the next head when it was the head of a
/// free lock. Returns whether it was queued.
///
/// Cancel safety: dropping the future may leave the entry queued until its TTL runs out.
pub(crate) async fn leave(conn: &mut Conn, keys: &Keys, token: &str) -> Result<bool> {
    let sk = ShareKeys::of(keys);
    let n: i64 = scripts()
        .leave
        .key(&keys.lock)
        .key(&sk.queue)
        .key(&sk.queue_exp)
        .key(&sk.shares)
        .arg(token)
        .arg(&keys.channel)
        .arg(publish_command(conn))
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("leaving the waiters' queue failed", e))?;
    Ok(n == 1)
}

/// See [`crate::node::release_announced`].
pub(crate) async fn release_named(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    message: &str,
) -> Result<bool> {
    let sk = ShareKeys::of(keys);
    let n: i64 = scripts()
        .release_named
        .key(&keys.lock)
        .key(&keys.holder)
        .key(&sk.queue)
        .key(&sk.queue_exp)
        .arg(token)
        .arg(&keys.channel)
        .arg(publish_command(conn))
        .arg(message)
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("release script failed", e))?;
    Ok(n == 1)
}

/// See [`crate::node::acquire_waiting`]: `(won, pttl)`; a name held as a semaphore is a
/// `Conflict`.
pub(crate) async fn acquire_waiting(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    holder: &str,
    ttl: Duration,
    vote: crate::node::WaitingVote,
) -> Result<(bool, i64, Option<crate::node::QueuePlace>)> {
    let sk = ShareKeys::of(keys);
    let mut inv = scripts().acquire_waiting.prepare_invoke();
    for k in sk.with(keys) {
        inv.key(k);
    }
    let reply: Vec<i64> = inv
        .arg(token)
        .arg(crate::node::ttl_ms(ttl))
        .arg(holder)
        .arg(vote.mark.as_millis() as u64)
        .arg(vote.entry.as_millis() as u64)
        .arg(vote.ticket.map(|t| t.to_string()).unwrap_or_default())
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("acquire script failed", e))?;
    let (won, pttl) = (reply.first().copied(), reply.get(1).copied().unwrap_or(0));
    if won == Some(-1) {
        return Err(lockcore::Error::conflict(
            "the lock is held as a semaphore, and this acquisition asks for it exclusively",
        ));
    }
    let place = match (reply.get(2), reply.get(3)) {
        (Some(at), Some(ahead)) => Some(crate::node::QueuePlace {
            at: u64::try_from(*at).unwrap_or(0),
            ahead: u64::try_from(*ahead).unwrap_or(0),
        }),
        _ => None,
    };
    Ok((won == Some(1), pttl, place))
}

/// The live entries in the queue of `keys`.
///
/// Cancel safe (reads only).
pub(crate) async fn count(conn: &mut Conn, keys: &Keys) -> Result<usize> {
    let sk = ShareKeys::of(keys);
    let n: i64 = scripts()
        .count
        .key(&sk.queue)
        .key(&sk.queue_exp)
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("counting the queued waiters failed", e))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// A waiter's way out of the queue (or its count) when its `lock()` ends without the lock
/// (dropped, timed out, failed): armed in a [`CleanUpIfCancelled`](lockcore::backend::CleanUpIfCancelled) before
/// its first attempt, disarmed when it wins (the winning script took it out of the queue).
/// Sent on the connection its attempts use, so it reaches the server after an attempt still
/// in flight at the drop (which may have queued it again).
pub(crate) struct Leave {
    pub(crate) conn: Conn,
    pub(crate) keys: Keys,
    pub(crate) token: String,
}

impl CancelCleanUp for Leave {
    fn start(self) -> Option<CleanUpTask> {
        let Leave {
            mut conn,
            keys,
            token,
        } = self;
        // An attempt in flight at the drop was written to the connection when it was first
        // polled: this script, sent later on the same connection, runs after it.
        Some(Box::pin(async move {
            if let Err(e) = leave(&mut conn, &keys, &token).await {
                tracing::debug!(error = %e, "leaving the waiters' queue failed; the entry expires by its TTL");
            }
        }))
    }
}
