//! The exclusive waiters' queue of one lock name (locksmith's own layout only, not under
//! `interop=`): what makes a hand-over cost a release and one attempt however many clients
//! wait, instead of every waiting client trying at each release (a herd).
//!
//! Keys, under the lock's hash tag (one slot on a cluster), beside the share keys
//! ([`ShareKeys`]):
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
//! writer mark of the `shares` module, and may get in ahead of queued writers while the
//! lock is free of writers (FIFO holds among exclusive waiters). A waiting share request is
//! only counted: it keeps an entry in `…:queuexp` (none in `…:queue`), so that
//! [`Backend::queued_waiters`](lockcore::backend::Backend::queued_waiters) sees every waiter.

use std::time::Duration;

use lockcore::Result;
use lockcore::backend::{CancelCleanUp, CleanUpTask};

use crate::conn::Conn;
use crate::grant::{Grant, GrantAsk, NodeAttempt, semaphore_conflict};
use crate::keys::{Keys, ShareKeys};
use crate::lua::{
    advance_fence_lua, announce_lua, keep_entry_lua, out_of_line_lua, prune_queue_lua, take_lua,
    writer_check_lua,
};
use crate::script::{LuaScript, publish_command, run, run_flag, ttl_ms};
use crate::subs::RELEASED;

/// The exclusive acquire with the queue. KEYS: lock, holder, fence, shares, share info,
/// waiting writer, queue, queue expiries. ARGV: token, TTL ms, holder metadata, the writer
/// mark's slack ms (see the `shares` module), the queue entry's TTL ms (0: a `try_lock`,
/// which never joins the queue), `ARGV[6]` `0` when no fencing token is wanted (the counter is
/// left alone and the fence reported is 0; absent or anything else: the counter moves); with
/// `handover=grant`, `KEYS[9]` the grants, `ARGV[7]` the number of this attempt of its waiter
/// and `ARGV[8]` the claim TTL ms: a waiting attempt that queues leaves there what a release
/// needs to grant it the lock (see [`RELEASE`]), naming the attempt, so that the grant tells
/// its waiter which refused attempt it came after. Returns
/// `{1, fence, 0}`, `{0, pttl or -3, position}`
/// (position in the queue, 0 the head, -1 not queued) or `{-1, 0, -1}` (held as a semaphore).
///
/// A name without a holder, shares, a writer's mark or a queue (one `EXISTS` tells) is taken at
/// once: what the full script would do then, in 6 calls instead of 9 (each call inside a script
/// costs the server about as much as a command of its own).
pub(crate) static ACQUIRE_QUEUED: LuaScript = LuaScript::new(concat!(
    r"
if redis.call('EXISTS', KEYS[1], KEYS[4], KEYS[6], KEYS[8]) == 0 then
",
    take_lua!(),
    r"
  if ARGV[6] == '0' then return {1, 0, 0} end
",
    advance_fence_lua!("redis.call('TIME')"),
    r"
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
",
    keep_entry_lua!("qnow + qttl"),
    r"
    redis.call('PEXPIREAT', KEYS[7], last[2])
    if KEYS[9] then
      local fenced = ARGV[6] == '0' and ' 0 ' or ' 1 '
      redis.call('HSET', KEYS[9], ARGV[1], ARGV[7] .. ' ' .. ARGV[8] .. fenced .. ARGV[3])
      redis.call('PEXPIREAT', KEYS[9], last[2])
    end
  end
  return redis.call('ZRANK', KEYS[7], ARGV[1]) or -1
end
",
    out_of_line_lua!(),
    r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  out_of_line()
  return {1, tonumber(redis.call('GET', KEYS[3]) or '0'), 0}
end
",
    writer_check_lua!("{-1, 0, -1}", "{0, left, in_line()}"),
    r"
if holder then return {0, redis.call('PTTL', KEYS[1]), in_line()} end
if queue_live then
  local head = redis.call('ZRANGE', KEYS[7], 0, 0)[1]
  if head and head ~= ARGV[1] then return {0, -3, in_line()} end
  out_of_line()
end
",
    take_lua!(),
    r"
if ARGV[6] == '0' then return {1, 0, 0} end
",
    advance_fence_lua!("qt or redis.call('TIME')"),
    r"
return {1, fence, 0}
"
));

/// Compare-and-delete that hands the lock on (KEYS: lock, holder, queue, queue expiries, and
/// with `handover=grant` the fencing counter and the grants; ARGV: token, channel, `PUBLISH` or
/// `SPUBLISH`). With a live head that left what a grant needs (its last attempt's number, the
/// claim TTL, whether it wants a fencing token, its holder metadata: see [`ACQUIRE_QUEUED`]),
/// the lock goes to the head at once, as the acquire script would give it (lock and holder
/// keys with the claim TTL, the counter moved), the head leaves the queue, and
/// `g:<head> <attempt> <fence>` is published (only that waiter acts). Else `q:<head>` wakes the
/// head to attempt, or `released` when nobody queues. Without queue
/// expiries nobody waits on locksmith's layout (every waiting `lock()`, exclusive or shared,
/// keeps an entry there from its first refused attempt until past its next one), so nothing is
/// published: the uncontended release costs the bare compare-and-delete and one `EXISTS`.
static RELEASE: LuaScript = LuaScript::new(concat!(
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
if redis.call('EXISTS', KEYS[4]) == 0 then return 1 end
local head, qt, qnow = nil, nil, nil
do
",
    prune_queue_lua!("KEYS[3]", "KEYS[4]"),
    r"
  head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
end
if not head then
  redis.call(ARGV[3], ARGV[2], 'released')
  return 1
end
local info = KEYS[6] and redis.call('HGET', KEYS[6], head)
if not info then
  redis.call(ARGV[3], ARGV[2], 'q:' .. head)
  return 1
end
local attempt, claim, fenced, meta = string.match(info, '^(%d+) (%d+) (%d) (.*)$')
redis.call('SET', KEYS[1], head, 'PX', claim)
redis.call('SET', KEYS[2], head .. ' ' .. meta, 'PX', claim)
local fence = 0
if fenced == '1' then
  local now_us = tonumber(qt[1]) * 1000000 + tonumber(qt[2])
  fence = math.max(tonumber(redis.call('GET', KEYS[5]) or '0') + 1, now_us)
  redis.call('SET', KEYS[5], string.format('%d', fence))
end
redis.call('ZREM', KEYS[3], head)
redis.call('ZREM', KEYS[4], head)
redis.call('HDEL', KEYS[6], head)
redis.call(ARGV[3], ARGV[2], 'g:' .. head .. ' ' .. attempt .. ' ' .. string.format('%d', fence))
return 1
"
));

/// A waiter leaves the queue (KEYS: lock, queue, queue expiries, shares, holder, grants; ARGV:
/// token, channel, `PUBLISH` or `SPUBLISH`). When it was the head of a lock nobody holds, the
/// next head is told (a release may have named the leaver). When a release granted it the lock
/// meanwhile (`handover=grant`: the lock holds its token), the grant is given back: the lock
/// is deleted and the next head told. Returns whether it was queued (or counted, or granted).
static LEAVE: LuaScript = LuaScript::new(concat!(
    r"
local counted = redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
local granted = redis.call('GET', KEYS[1]) == ARGV[1]
if granted then redis.call('DEL', KEYS[1], KEYS[5]) end
local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
if not rank and not granted then return counted end
if rank then redis.call('ZREM', KEYS[2], ARGV[1]) end
if (granted or rank == 0) and redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[4]) == 0 then
  local qt, qnow
",
    prune_queue_lua!("KEYS[2]", "KEYS[3]"),
    r"
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then
    redis.call(ARGV[3], ARGV[2], 'q:' .. head)
  elseif granted then
    redis.call(ARGV[3], ARGV[2], 'released')
  end
end
return 1
"
));

/// Compare-and-delete that takes the releaser out of the queue (also on a master that refused
/// its vote, where a vote that reached it before the previous holder's release left an entry)
/// and announces the release as
/// `ARGV[4]`, followed by ` q:<head>` when the queue has a live head (KEYS: lock, holder,
/// queue, queue expiries; ARGV: token, channel, `PUBLISH` or `SPUBLISH`, message): the release
/// of [`release_announced`], which Redlock sends to each master with one message per release.
static RELEASE_NAMED: LuaScript = LuaScript::new(concat!(
    r"
local queued = redis.call('EXISTS', KEYS[4]) == 1
if queued then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
",
    announce_lua!(
        "KEYS[3]",
        "KEYS[4]",
        "ARGV[3]",
        "ARGV[2]",
        "ARGV[4]",
        "ARGV[4] .. ' q:'",
        "queued"
    ),
    r"
return 1
"
));

/// The acquire of one master of a Redlock (no fencing counter; KEYS: lock, holder, fence
/// (unused), shares, share info, waiting writer, queue, queue expiries, as
/// [`ShareKeys::with`]; ARGV: token, TTL ms, holder metadata, the writer mark's slack ms (0:
/// no mark), queue entry TTL ms (0 for a `try_lock`), the waiter's ticket or empty): as the
/// plain acquire script, except that
/// * live shared holders on this master hold the lock too (the read-write check of the
///   `shares` module, the one a single node runs): a waiting writer refused by them
///   marks itself there as waiting (readers that come later are refused on this master) and
///   joins the queue, so that the last reader's release wakes it;
/// * while the master's queue has live waiters a free lock goes only to one of them (any of
///   them: the masters' queues may order them differently, and a vote must be able to win a
///   majority; a newcomer, like the client that just released, cannot barge past them), and a
///   waiting request that loses joins (or refreshes its entry in) the queue, which also
///   decides whom a release wakes (see [`acquire_waiting`]).
///
/// * a waiter's place in the queue is its **ticket** when it brings one (a time in µs that
///   one master's `TIME` gave it, the same on every master: see `lock-redlock`'s acquire), or
///   else, when it is new there, the later of this server's `TIME` and just behind the tail:
///   a newcomer queues last on every master whatever the masters' clocks say, and waiters
///   that joined at once (in different orders on different masters) stand in one order
///   everywhere from their next vote, so a release names the same head on every master.
///
/// With a grant asked for (`handover=grant`: `KEYS[9]` the grants, `ARGV[7]` the number of
/// the waiter's attempt, the same on every master, `ARGV[8]` the claim TTL ms), a refused
/// waiting vote leaves what a release needs to grant it the lock on this master, as the
/// single-node [`ACQUIRE_QUEUED`] does (see [`RELEASE_NAMED_GRANTING`]).
///
/// Returns `{1, 0}`, `{0, pttl of the holder, or ms to the earliest share's expiry, or -3 when
/// free but queued for, place in the queue (µs) and waiters ahead when queued}` or `{-1, 0}`
/// (the name is held as a semaphore).
static ACQUIRE_WAITING: LuaScript = LuaScript::new(concat!(
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
",
    keep_entry_lua!("qnow + tonumber(ARGV[5])"),
    r"
    redis.call('PEXPIREAT', KEYS[7], last[2])
    if KEYS[9] then
      redis.call('HSET', KEYS[9], ARGV[1], ARGV[7] .. ' ' .. ARGV[8] .. ' 0 ' .. ARGV[3])
      redis.call('PEXPIREAT', KEYS[9], last[2])
    end
    reply[3] = at
    reply[4] = redis.call('ZRANK', KEYS[7], ARGV[1])
  end
  return reply
end
",
    out_of_line_lua!(),
    r"
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  out_of_line()
  return {1, 0}
end
",
    writer_check_lua!("{-1, 0}", "in_line({0, left})"),
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
",
    take_lua!(),
    r"
out_of_line()
return {1, 0}
"
));

/// The live entries of the queue (KEYS: queue, queue expiries), by the server's clock.
static COUNT: LuaScript = LuaScript::new(
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
",
);

/// How long a waiter's queue entry should last past each of its attempts when it polls every
/// `poll` at the latest (see [`acquire_waiting`]): past its next attempt, which comes at the
/// latest at the safety-net poll (`poll`, jittered below it), with room for a slow round trip
/// and a busy machine. A crashed waiter holds the queue up (if it is the head of a free lock)
/// at most this long, after which the next waiter's safety poll takes the lock.
pub fn queue_entry_ttl(poll: Duration) -> Duration {
    poll + Duration::from_secs(2)
}

/// Compare-and-delete of the exclusive lock that wakes the queue's head (or, with an empty
/// queue, publishes `released`). Returns whether `token` held the lock.
///
/// Cancel safety: dropping the future may or may not have released the lock.
pub(crate) async fn release(conn: &mut Conn, keys: &Keys, token: &str) -> Result<bool> {
    release_handing_over(conn, keys, token, false).await
}

/// [`release`]; with `grant` (`handover=grant`), a queued head that asked for grants gets the
/// lock from the release script itself (see [`RELEASE`]).
///
/// Cancel safety: as [`release`].
pub(crate) async fn release_handing_over(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    grant: bool,
) -> Result<bool> {
    let sk = ShareKeys::of(keys);
    let all = [
        &*keys.lock,
        &keys.holder,
        &sk.queue,
        &sk.queue_exp,
        &keys.fence,
        &sk.grants,
    ];
    let key_list = if grant { &all[..] } else { &all[..4] };
    let args = [token, &keys.channel, publish_command(conn)];
    run_flag(conn, &RELEASE, key_list, &args, "release script failed").await
}

/// Takes `token` out of the queue of waiters of `keys` (see [`acquire_waiting`]), waking the
/// next waiter when it was the head of a free lock. Returns whether it was queued.
///
/// Cancel safety: dropping the future may leave the entry until its TTL runs out.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn leave_queue(conn: &mut Conn, keys: &Keys, token: &str) -> Result<bool> {
    let sk = ShareKeys::of(keys);
    let key_list = [
        &*keys.lock,
        &sk.queue,
        &sk.queue_exp,
        &sk.shares,
        &keys.holder,
        &sk.grants,
    ];
    let args = [token, &keys.channel, publish_command(conn)];
    let what = "leaving the waiters' queue failed";
    run_flag(conn, &LEAVE, &key_list, &args, what).await
}

/// Compare-and-delete that also publishes on the release channel. Returns whether `token` held
/// the lock (and it is now deleted).
///
/// Cancel safety: dropping the future may or may not have released the lock.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn release_plain(conn: &mut Conn, keys: &Keys, token: &str) -> Result<bool> {
    release_announced(conn, keys, token, RELEASED).await
}

/// [`release_plain`], publishing `message` instead of [`RELEASED`]: a client that sends one
/// release to several servers (Redlock) names it, so its waiters act once on the copies. The
/// releaser leaves the server's queue of waiters, and when a waiter is queued the message is
/// followed by ` q:<its owner token>` (see [`acquire_waiting`]).
///
/// Cancel safety: as [`release_plain`].
///
/// # Errors
/// As [`release_plain`].
pub async fn release_announced(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    message: &str,
) -> Result<bool> {
    release_announced_granting(conn, keys, token, message, false).await
}

/// [`release_announced`]; with `grant` (`handover=grant`), a queued head whose vote asked for
/// it ([`WaitingVote::grant`]) is given the lock by the release itself, with its claim TTL,
/// and the message says so (`<message> g:<owner token> <attempt> 0`, see
/// [`Granted`](crate::subs::Granted)); a head that did not ask is woken as without `grant`.
///
/// Cancel safety: as [`release_plain`].
///
/// # Errors
/// As [`release_plain`].
pub async fn release_announced_granting(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    message: &str,
    grant: bool,
) -> Result<bool> {
    let sk = ShareKeys::of(keys);
    let all = [
        &*keys.lock,
        &keys.holder,
        &sk.queue,
        &sk.queue_exp,
        &sk.grants,
    ];
    let args = [token, &keys.channel, publish_command(conn), message];
    let (script, key_list) = if grant {
        (&RELEASE_NAMED_GRANTING, &all[..])
    } else {
        (&RELEASE_NAMED, &all[..4])
    };
    run_flag(conn, script, key_list, &args, "release script failed").await
}

/// [`RELEASE_NAMED`] that grants the lock to the queue's head when it asked for it (KEYS:
/// lock, holder, queue, queue expiries, grants; ARGV as [`RELEASE_NAMED`]): what the
/// single-node [`RELEASE`] does, on a Redlock master, with the release named in the message:
/// the head's token takes the lock and holder keys with its claim TTL, leaves the queue, and
/// `<message> g:<head> <attempt> 0` is published (no fencing counter on Redlock). A head that
/// left no grant details is woken (`<message> q:<head>`) as without grants.
static RELEASE_NAMED_GRANTING: LuaScript = LuaScript::new(concat!(
    r"
local queued = redis.call('EXISTS', KEYS[4]) == 1
if queued then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('HDEL', KEYS[5], ARGV[1])
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
if not head then
  redis.call(ARGV[3], ARGV[2], ARGV[4])
  return 1
end
local info = redis.call('HGET', KEYS[5], head)
local attempt, claim, meta = nil, nil, nil
if info then attempt, claim, meta = string.match(info, '^(%d+) (%d+) %d (.*)$') end
if not attempt then
  redis.call(ARGV[3], ARGV[2], ARGV[4] .. ' q:' .. head)
  return 1
end
redis.call('SET', KEYS[1], head, 'PX', claim)
redis.call('SET', KEYS[2], head .. ' ' .. meta, 'PX', claim)
redis.call('ZREM', KEYS[3], head)
redis.call('ZREM', KEYS[4], head)
redis.call('HDEL', KEYS[5], head)
redis.call(ARGV[3], ARGV[2], ARGV[4] .. ' g:' .. head .. ' ' .. attempt .. ' 0')
return 1
"
));

/// The single-node acquire without a fencing counter, beside the name's shared holders and
/// with the server's queue of waiters (Redlock's votes on each master). Live shared holders
/// (see `acquire_share`) hold the lock too: a refused request with a non-zero `mark` marks
/// itself as the waiting writer for that long (`writer_mark_ttl`), so that readers coming
/// later are refused on this server. A waiting request (`entry` non-zero) that loses joins the
/// queue (or refreshes its entry there, TTL `entry`, on the server's clock), and a win takes it
/// out. While the queue has live waiters a free lock goes only to one of them, in any order (so
/// a request that did not wait, `entry` zero, or a client that just released cannot barge past
/// them); the queue also decides whom a release wakes ([`release_announced`] and
/// `release_share_announced` name the queue's head after their message, ` q:<owner token>`; a
/// waiter registered with `Waiting::queued` is woken by a message naming it, and no other is).
///
/// A refused waiter learns its place in the queue ([`QueuePlace`], the second of the pair):
/// passed back as [`WaitingVote::ticket`] to every server, it puts the waiter at the same place
/// in each server's queue (a place taken from one server's clock, never a client's).
///
/// Cancel safety: a dropped call may have taken the lock; it then frees after `ttl`; an entry
/// left behind expires after `entry`, a mark after `mark`.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails; `Conflict` when the name is held as a
/// semaphore.
pub async fn acquire_waiting(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    holder: &str,
    ttl: Duration,
    vote: WaitingVote,
) -> Result<(NodeAttempt, Option<QueuePlace>)> {
    let sk = ShareKeys::of(keys);
    let ttl = ttl_ms(ttl).to_string();
    let mark = vote.mark.as_millis().to_string();
    let entry = vote.entry.as_millis().to_string();
    let ticket = vote.ticket.map(|t| t.to_string()).unwrap_or_default();
    let mut args = vec![token, &ttl, holder, &mark, &entry, &ticket];
    let mut key_list = sk.with(keys).to_vec();
    let grant = vote
        .grant
        .filter(|_| !vote.entry.is_zero())
        .map(|g| (g.attempt.to_string(), ttl_ms(g.claim).to_string()));
    if let Some((attempt, claim)) = &grant {
        key_list.push(&sk.grants);
        args.push(attempt);
        args.push(claim);
    }
    let what = "acquire script failed";
    let reply: Vec<i64> = run(conn, &ACQUIRE_WAITING, &key_list, &args, what).await?;
    let attempt = Grant::judge(&reply)?.attempt(false, semaphore_conflict)?;
    let place = match (attempt, reply.get(2), reply.get(3)) {
        (NodeAttempt::Held { .. }, Some(at), Some(ahead)) => Some(QueuePlace {
            at: u64::try_from(*at).unwrap_or(0),
            ahead: u64::try_from(*ahead).unwrap_or(0),
        }),
        _ => None,
    };
    Ok((attempt, place))
}

/// Where a refused vote of [`acquire_waiting`] stands in the server's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuePlace {
    /// Its place (µs): what [`WaitingVote::ticket`] brings to the other servers.
    pub at: u64,
    /// How many waiters stand ahead of it (live or not yet pruned).
    pub ahead: u64,
}

/// How a vote of [`acquire_waiting`] waits on one server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitingVote {
    /// A refused writer marks itself as waiting for this long (zero: no mark; see
    /// `writer_mark_ttl`).
    pub mark: Duration,
    /// A refused request joins the queue (or refreshes its entry) for this long (zero: it
    /// does not queue; see [`queue_entry_ttl`]).
    pub entry: Duration,
    /// The waiter's place in the queue (µs) when it has one from the server whose order all
    /// servers follow (what this function returned there); `None`: a newcomer's place is
    /// just behind the tail, by this server's clock.
    pub ticket: Option<u64>,
    /// `handover=grant`: a refused vote (one that queues, `entry` non-zero) asks a release on
    /// this server to grant it the lock (see [`release_announced_granting`]), naming this
    /// attempt.
    pub grant: Option<GrantAsk>,
}

/// The live entries in the queue of `keys`.
///
/// Cancel safe (reads only).
pub(crate) async fn count(conn: &mut Conn, keys: &Keys) -> Result<usize> {
    let sk = ShareKeys::of(keys);
    let what = "counting the queued waiters failed";
    let n: i64 = run(conn, &COUNT, &[&sk.queue, &sk.queue_exp], &[], what).await?;
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
            if let Err(e) = leave_queue(&mut conn, &keys, &token).await {
                tracing::debug!(error = %e, "leaving the waiters' queue failed; the entry expires by its TTL");
            }
        }))
    }
}
