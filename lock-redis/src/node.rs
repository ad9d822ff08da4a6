//! The single-node lock protocol, public so that other backends (`lock-redlock`, which runs it on
//! N independent masters) use the very same scripts, key layout and connection setup.
//!
//! * [`Keys`]: the key layout and name escaping of one lock name.
//! * [`acquire`], [`extend`], [`release`], [`revoke`]: one script each, one round trip each.
//! * [`acquire_share`], [`extend_share`], [`release_share_announced`]: a reader's lease beside
//!   the lock key (the read-write protocol of a single node), one script each.
//! * [`Node`]: a connected client of one server (or cluster) from a parsed [`Config`]: a
//!   multiplexed reconnecting command connection plus lazily opened pub/sub [`Subscriptions`]
//!   for the release channel.
//!
//! [`RedisBackend`](crate::RedisBackend) is built on this module and adds waiting, replicas
//! (`WAIT`) and the `Backend` contract.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::LostNotifier;
use lockcore::{Error, ErrorKind, LockName, Result};
use redis::Script;

pub use crate::config::Config;
pub use crate::conn::Conn;
use crate::conn::{Factory, PubSubOpener};
pub use crate::error::map_err;
pub use crate::revoked::channel as revocation_channel;
pub use crate::subs::RELEASED;
pub use crate::subs::{Channel, ExpiryWatch, QueuedWake, Subscriptions, Waiting};

/// Takes the lock for token `ARGV[1]` with TTL `ARGV[2]` ms, atomically. Returns `{1, fence}`
/// (`{1, 0}` without a counter key `KEYS[3]`) or `{0, pttl of the holder}`.
///
/// * **Holder metadata**: `KEYS[2]` gets `"<token> <ARGV[3]>"` (the holder's metadata) with the
///   same TTL, in the same script; extend, release and revoke keep it with the lock. The token
///   prefix ties it to this acquisition (`inspect` ignores a value of another token).
///
/// * **Idempotent for one token**: when the lock already holds `ARGV[1]` (a re-sent script: the
///   cluster client retries after a dropped connection, and the first copy may have run), it
///   resets the TTL and reports success with the current fencing value, instead of reporting
///   its own token as another holder.
/// * **Fencing never goes back**: the new value is `max(last + 1, server TIME in microseconds)`.
///   After a restart without persistence, or a failover to a replica that missed increments,
///   the counter restarts from the server clock, which is past every value handed out before
///   (values run at most one per acquisition ahead of the clock), as long as the server clocks
///   do not step back by more than the time between the last grant and the restart.
macro_rules! acquire_lua {
    () => {
        r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  if KEYS[3] then return {1, tonumber(redis.call('GET', KEYS[3]) or '0')} end
  return {1, 0}
end
if holder then return {0, redis.call('PTTL', KEYS[1])} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[3], 'PX', ARGV[2])
if not KEYS[3] then return {1, 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local fence = math.max(tonumber(redis.call('GET', KEYS[3]) or '0') + 1, now)
redis.call('SET', KEYS[3], string.format('%d', fence))
return {1, fence}
"
    };
}
const ACQUIRE_LUA: &str = acquire_lua!();

/// [`ACQUIRE_LUA`] behind the read-write check of [`shares`](crate::shares): KEYS lock,
/// holder, fence, shares, share info, waiting writer; `ARGV[4]` how long the writer's mark lasts, ms.
/// Also returns `{-1, 0}` when the name is held as a semaphore (a conflict).
const ACQUIRE_BESIDE_SHARES_LUA: &str = concat!(
    crate::shares::writer_check_lua!("{-1, 0}", "{0, left}"),
    acquire_lua!()
);

/// The bare compare-and-delete (no notification), for [`bare_cycle`].
const COMPARE_AND_DELETE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Compare-and-pexpire (of the lock `KEYS[1]` and its holder metadata `KEYS[2]`).
const EXTEND_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Compare-and-pexpire of many locks at once: `KEYS[2i-1]` (and its holder metadata
/// `KEYS[2i]`) is extended to `ARGV[2i]` ms if it holds `ARGV[2i-1]`; returns 1 or 0 per lock,
/// in order.
const EXTEND_MANY_LUA: &str = r"
local r = {}
for i = 1, #KEYS / 2 do
  if redis.call('GET', KEYS[2 * i - 1]) == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', KEYS[2 * i], ARGV[2 * i])
    r[i] = redis.call('PEXPIRE', KEYS[2 * i - 1], ARGV[2 * i])
  else
    r[i] = 0
  end
end
return r
";

/// Delete whoever holds it (an administrator's override), and tell the waiters (`ARGV[2]`:
/// `PUBLISH`, or `SPUBLISH` on a cluster). `KEYS[3..]`, where given: the name's shares and its
/// other keys (see [`shares`](crate::shares)), deleted too; held if either was. `KEYS[6..7]`,
/// where given: the waiters' queue (see [`queue`](crate::queue)), whose head is told.
/// `ARGV[3]`, where given: the namespace's revocation channel (see
/// [`revoked`](crate::revoked)), told the owner tokens taken away (the lock key's and the
/// shares').
const REVOKE_LUA: &str = concat!(
    r"
local owners = {}
if ARGV[3] then
  local owner = redis.call('GET', KEYS[1])
  if owner then table.insert(owners, owner) end
  if KEYS[3] then
    for _, t in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do table.insert(owners, t) end
  end
end
redis.call('DEL', KEYS[2])
local shared = 0
if KEYS[3] then
  shared = redis.call('DEL', KEYS[3])
  redis.call('DEL', KEYS[4], KEYS[5])
end
if redis.call('DEL', KEYS[1]) + shared == 0 then return 0 end
if #owners > 0 then redis.call(ARGV[2], ARGV[3], table.concat(owners, ' ')) end
if not KEYS[6] then
  redis.call(ARGV[2], ARGV[1], 'revoked')
  return 1
end
",
    crate::queue::announce_lua!("KEYS[6]", "KEYS[7]", "ARGV[2]", "ARGV[1]", "'revoked'"),
    r"
return 1
"
);

struct Scripts {
    acquire: Script,
    acquire_beside_shares: Script,
    extend: Script,
    extend_many: Script,
    revoke: Script,
    compare_and_delete: Script,
}

fn scripts() -> &'static Scripts {
    static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        acquire: Script::new(ACQUIRE_LUA),
        acquire_beside_shares: Script::new(ACQUIRE_BESIDE_SHARES_LUA),
        extend: Script::new(EXTEND_LUA),
        extend_many: Script::new(EXTEND_MANY_LUA),
        revoke: Script::new(REVOKE_LUA),
        compare_and_delete: Script::new(COMPARE_AND_DELETE_LUA),
    })
}

/// The keys and channel of one lock name: `<namespace>:{<escaped name>}:lock`,
/// `<namespace>:{<escaped name>}:fence` and the channel `<namespace>:{<escaped name>}:released`.
/// The hash tag is [`LockName::escaped`], which never contains `{` or `}`.
#[derive(Clone, Debug)]
pub struct Keys {
    /// The lock key (value: the owner token; TTL: the lease).
    pub lock: String,
    /// The holder metadata key (`"<token> <metadata>"`, the lock's TTL).
    pub holder: String,
    /// The fencing counter key (no TTL).
    pub fence: String,
    /// The pub/sub channel a release publishes on.
    pub channel: String,
    /// The hash tag (the escaped name).
    pub tag: String,
}

impl Keys {
    /// The keys of `name` under `namespace`.
    pub fn new(namespace: &str, name: &LockName) -> Keys {
        let tag = name.escaped();
        Keys {
            lock: format!("{namespace}:{{{tag}}}:lock"),
            holder: format!("{namespace}:{{{tag}}}:holder"),
            fence: format!("{namespace}:{{{tag}}}:fence"),
            channel: format!("{namespace}:{{{tag}}}:released"),
            tag,
        }
    }
}

/// Appends the key `<namespace>:{<escaped name>}:<suffix>` of [`Keys::new`]'s layout to `out`
/// (`suffix`: `lock`, `holder`, ...): for a batch deriving many keys into one reused buffer.
pub(crate) fn push_key(out: &mut String, namespace: &str, name: &LockName, suffix: &str) {
    out.push_str(namespace);
    out.push_str(":{");
    name.escape_into(out);
    out.push_str("}:");
    out.push_str(suffix);
}

/// A TTL in whole milliseconds for `PX`, rounded up: the server never frees the lock before the
/// client's validity deadline (which is below the TTL by the drift margin anyway).
pub fn ttl_ms(ttl: Duration) -> u64 {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    ms.clamp(1, u64::MAX as u128) as u64
}

/// What one acquire script reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeAttempt {
    /// This token now holds the lock on the node.
    Won {
        /// The new value of the fencing counter, when the counter was asked for.
        fence: Option<u64>,
    },
    /// Another token holds it.
    Held {
        /// The holder's remaining TTL, when it has one.
        pttl: Option<Duration>,
    },
}

/// Runs the acquire script on `conn`: `SET lock token NX PX ttl` and the holder metadata
/// `holder` ([`lockcore::Holder::encode`]) beside it, and with `fencing` the
/// fencing counter's advance (`max(last + 1, server TIME in µs)`) in the same script. One round
/// trip. Idempotent for one token: run again while `token` holds the lock, it resets the TTL and
/// reports `Won` with the same fencing value.
///
/// Cancel safety: a dropped call may have taken the lock; it then frees after `ttl`.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn acquire(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    holder: &str,
    ttl: Duration,
    fencing: bool,
) -> Result<NodeAttempt> {
    let with = AcquireWith {
        fencing,
        ..AcquireWith::default()
    };
    Ok(acquire_replicated(conn, keys, token, holder, ttl, with)
        .await?
        .0)
}

/// What an acquire script does besides taking the lock.
#[derive(Clone, Copy, Debug, Default)]
pub struct AcquireWith {
    /// Advance the fencing counter in the same script and report the token (`false`: the
    /// queued script leaves the counter alone; the others may still move it; no token is
    /// reported either way).
    pub fencing: bool,
    /// Pipeline `WAIT` behind the script.
    pub replicas: Option<Replicas>,
    /// Respect shared holders (see `shares`), marking this writer as waiting
    /// for this long (zero: no mark).
    pub beside_shares: Option<Duration>,
    /// Respect the name's queue of exclusive waiters (only with `beside_shares`): a free lock
    /// goes to the queue's head only (or to anyone while it is empty), and a loser joins it
    /// with an entry of this TTL (zero: a `try_lock`, which does not join).
    pub queue: Option<Duration>,
}

/// As [`acquire`]; with `replicas`, `WAIT` is pipelined behind the script (still one round
/// trip) and the number of replicas that acknowledged is returned too. `WAIT` blocks the
/// connection it runs on: use a connection of its own for it. With `beside_shares` (the
/// writer mark's slack, see `shares`), live shared holders of the name hold
/// it too (this writer is marked as waiting for that long), and a name held as a semaphore is a
/// `Conflict`; fencing is then always on.
///
/// Cancel safety: as [`acquire`].
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails (the lock may then have been taken: it frees
/// after `ttl`).
pub async fn acquire_replicated(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    holder: &str,
    ttl: Duration,
    with: AcquireWith,
) -> Result<(NodeAttempt, Option<i64>)> {
    let (attempt, acked, _) = acquire_queued(conn, keys, token, holder, ttl, with).await?;
    Ok((attempt, acked))
}

/// [`acquire_replicated`], also returning the position in the waiters' queue after the
/// attempt (0: the head; `None`: not queued), with [`AcquireWith::queue`].
pub(crate) async fn acquire_queued(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    holder: &str,
    ttl: Duration,
    with: AcquireWith,
) -> Result<(NodeAttempt, Option<i64>, Option<u64>)> {
    let AcquireWith {
        fencing,
        replicas,
        beside_shares,
        queue,
    } = with;
    let queue = queue.filter(|_| beside_shares.is_some());
    let share_keys = beside_shares.map(|_| crate::shares::ShareKeys::of(keys));
    let mut key_list = vec![keys.lock.as_str(), keys.holder.as_str()];
    let counted = fencing;
    let fencing = fencing || beside_shares.is_some();
    if let Some(sk) = &share_keys {
        key_list = sk.with(keys).to_vec();
    } else if fencing {
        key_list.push(&keys.fence);
    }
    let ttl = ttl_ms(ttl).to_string();
    let slack = beside_shares.map(|d| d.as_millis().to_string());
    let entry = queue.map(|d| d.as_millis().to_string());
    let mut args = vec![token, ttl.as_str(), holder];
    let script = match (&slack, &entry) {
        (Some(slack), Some(entry)) => {
            args.push(slack);
            args.push(entry);
            args.push(if counted { "1" } else { "0" });
            crate::queue::acquire_script()
        }
        (Some(slack), None) => {
            args.push(slack);
            &scripts().acquire_beside_shares
        }
        _ => &scripts().acquire,
    };
    let (reply, acked): (Vec<i64>, _) = eval(conn, script, &key_list, &args, replicas)
        .await
        .map_err(|e| map_err("acquire script failed", e))?;
    let (won, value) = match reply[..] {
        [won, value, ..] => (won, value),
        _ => {
            return Err(Error::new(
                ErrorKind::Backend,
                "the acquire script's reply is malformed",
            ));
        }
    };
    let position = reply.get(2).and_then(|p| u64::try_from(*p).ok());
    if won == -1 {
        return Err(Error::conflict(
            "the lock is held as a semaphore, and this acquisition asks for it exclusively",
        ));
    }
    if won == 1 {
        if !counted {
            return Ok((NodeAttempt::Won { fence: None }, acked, None));
        }
        let fence = u64::try_from(value)
            .map_err(|_| Error::new(lockcore::ErrorKind::Backend, "negative fencing counter"))?;
        return Ok((NodeAttempt::Won { fence: Some(fence) }, acked, None));
    }
    // PTTL: -1 (no expiry, not ours), -2 (gone) or -3 (free, another waiter's turn) give no
    // useful wake-up time.
    Ok((
        NodeAttempt::Held {
            pttl: u64::try_from(value).ok().map(Duration::from_millis),
        },
        acked,
        position,
    ))
}

/// How many replicas must acknowledge a write (`WAIT count timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replicas {
    /// Replicas that must acknowledge.
    pub count: u32,
    /// How long `WAIT` waits for them.
    pub timeout: Duration,
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

/// Compare-and-`PEXPIRE`: resets the lock's TTL to `ttl` if `token` still holds it. Returns
/// whether it did.
///
/// Cancel safety: dropping the future may or may not have extended the lock.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn extend(conn: &mut Conn, keys: &Keys, token: &str, ttl: Duration) -> Result<bool> {
    Ok(extend_replicated(conn, keys, token, ttl, None).await?.0)
}

/// Compare-and-`PEXPIRE` of many locks in one script call (single node only: the keys of one
/// call must live on one server). `items`: lock key, holder key, owner token, TTL. Returns
/// whether each was extended, in order.
///
/// Cancel safety: as [`extend`], for every item.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails (for every item).
pub async fn extend_many(
    conn: &mut Conn,
    items: &[(&str, &str, &str, Duration)],
) -> Result<Vec<bool>> {
    let mut call = ExtendMany::default();
    call.start(items.len());
    for (lock, holder, _, _) in items {
        call.key(lock);
        call.key(holder);
    }
    for (_, _, token, ttl) in items {
        call.arg(token, *ttl);
    }
    call.query(conn).await
}

/// One batched compare-and-`PEXPIRE` call ([`extend_many`]) built in place: every key and
/// argument is copied into the command's one buffer, so a batch of renewals can derive its keys
/// into one reused string instead of allocating strings per lease (issue 24: with 100,000
/// leases, allocation was about half the client's CPU). Reused from call to call.
#[derive(Default)]
pub(crate) struct ExtendMany {
    cmd: redis::Cmd,
}

impl ExtendMany {
    /// Starts a call for `n` leases (keeping the buffers of the last one): then [`Self::key`]
    /// twice per lease (its lock key, then its holder key), then [`Self::arg`] once per lease,
    /// in the same order.
    pub(crate) fn start(&mut self, n: usize) {
        self.cmd.clear();
        self.cmd
            .arg("EVALSHA")
            .arg(scripts().extend_many.get_hash())
            .arg(2 * n);
    }

    pub(crate) fn key(&mut self, key: &str) {
        self.cmd.arg(key);
    }

    /// A lease's owner token and TTL.
    pub(crate) fn arg(&mut self, token: &str, ttl: Duration) {
        self.cmd.arg(token).arg(ttl_ms(ttl));
    }

    /// Sends the call; whether each lease was extended, in order. Loads the script when the
    /// server does not have it (a restart, `SCRIPT FLUSH`), as `Script::invoke_async` does.
    ///
    /// Cancel safety: as [`extend`], for every lease.
    pub(crate) async fn query(&self, conn: &mut Conn) -> Result<Vec<bool>> {
        let held: Vec<i64> = match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                scripts()
                    .extend_many
                    .load_async(conn)
                    .await
                    .map_err(|e| map_err("loading the batched extend script", e))?;
                self.cmd.query_async(conn).await
            }
            other => other,
        }
        .map_err(|e| map_err("extending locks (batched)", e))?;
        Ok(held.into_iter().map(|n| n == 1).collect())
    }
}

/// As [`extend`]; with `replicas`, `WAIT` is pipelined behind the script (one round trip) and
/// the number of replicas that acknowledged is returned too.
///
/// Cancel safety: as [`extend`].
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn extend_replicated(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    ttl: Duration,
    replicas: Option<Replicas>,
) -> Result<(bool, Option<i64>)> {
    let ttl = ttl_ms(ttl).to_string();
    let (n, acked): (i64, _) = eval(
        conn,
        &scripts().extend,
        &[keys.lock.as_str(), keys.holder.as_str()],
        &[token, &ttl],
        replicas,
    )
    .await
    .map_err(|e| map_err("extend script failed", e))?;
    Ok((n == 1, acked))
}

/// Compare-and-delete that also publishes on the release channel. Returns whether `token` held
/// the lock (and it is now deleted).
///
/// Cancel safety: dropping the future may or may not have released the lock.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn release(conn: &mut Conn, keys: &Keys, token: &str) -> Result<bool> {
    release_announced(conn, keys, token, RELEASED).await
}

/// [`release`], publishing `message` instead of [`RELEASED`]: a client that sends one release
/// to several servers (Redlock) names it, so its waiters act once on the copies. The releaser
/// leaves the server's queue of waiters, and when a waiter is queued the message is followed
/// by ` q:<its owner token>` (see [`acquire_waiting`]).
///
/// Cancel safety: as [`release`].
///
/// # Errors
/// As [`release`].
pub async fn release_announced(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    message: &str,
) -> Result<bool> {
    crate::queue::release_named(conn, keys, token, message).await
}

/// [`acquire`] without a fencing counter, beside the name's shared holders and with the
/// server's queue of waiters (Redlock's votes on each master). Live shared holders (see
/// [`acquire_share`]) hold the lock too: a refused request with a non-zero `mark` marks itself
/// as the waiting writer for that long ([`writer_mark_ttl`]), so that readers coming later are
/// refused on this server. A waiting request (`entry` non-zero) that loses joins the queue (or
/// refreshes its entry there, TTL `entry`, on the server's clock), and a win takes it out.
/// While the queue has live waiters a free lock goes only to one of them, in any order (so a
/// request that did not wait, `entry` zero, or a client that just released cannot barge past
/// them); the queue also decides whom a release wakes ([`release_announced`] and
/// [`release_share_announced`] name the queue's head after their message, ` q:<owner
/// token>`; a waiter registered with [`Waiting::queued`] is woken by a message naming it, and
/// no other is).
///
/// A refused waiter learns its place in the queue ([`QueuePlace`], the second of the pair):
/// passed back as [`WaitingVote::ticket`] to every server, it puts the waiter at the same place in each
/// server's queue (a place taken from one server's clock, never a client's).
///
/// Cancel safety: as [`acquire`]; an entry left behind expires after `entry`, a mark after
/// `mark`.
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
    let (won, value, place) =
        crate::queue::acquire_waiting(conn, keys, token, holder, ttl, vote).await?;
    Ok(if won {
        (NodeAttempt::Won { fence: None }, None)
    } else {
        let pttl = u64::try_from(value).ok().map(Duration::from_millis);
        (NodeAttempt::Held { pttl }, place)
    })
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
    /// [`writer_mark_ttl`]).
    pub mark: Duration,
    /// A refused request joins the queue (or refreshes its entry) for this long (zero: it
    /// does not queue; see [`queue_entry_ttl`]).
    pub entry: Duration,
    /// The waiter's place in the queue (µs) when it has one from the server whose order all
    /// servers follow (what this function returned there); `None`: a newcomer's place is
    /// just behind the tail, by this server's clock.
    pub ticket: Option<u64>,
}

/// Takes a shared (reader's) lease for `token` with TTL `ttl` on one server, without a fencing
/// counter: the single-node read-write protocol of `shares` (a sorted set of
/// readers beside the lock key, expiring on the server's clock), the one a single Redis node
/// runs for [`LockMode::Shared`](lockcore::LockMode::Shared). Refused (`Held`) while an
/// exclusive holder or a waiting writer's mark (see [`acquire_waiting`]) is there; `pttl` is
/// then what is left of the one found. A waiting request (`entry` non-zero) that loses is
/// counted among the queued waiters (not ordered among them) for `entry`. Idempotent for one
/// token (a re-sent script resets the share's TTL).
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
    let ask = crate::shares::ShareAsk {
        ttl,
        mode: lockcore::LockMode::Shared,
        entry,
        fencing: false,
    };
    Ok(
        match crate::shares::acquire(conn, keys, token, holder, ask, None).await? {
            crate::shares::ShareAttempt::Won { .. } => NodeAttempt::Won { fence: None },
            crate::shares::ShareAttempt::Held { wait } => NodeAttempt::Held { pttl: wait },
        },
    )
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
    crate::shares::extend(conn, keys, token, ttl, None).await
}

/// Compare-and-remove of a share taken with [`acquire_share`], publishing `message` (followed
/// by ` q:<head token>` when exclusive waiters queue, as [`release_announced`]): returns
/// whether `token` held it.
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
    crate::shares::release_named(conn, keys, token, message).await
}

/// Every live share taken with [`acquire_share`] on one server, as `(owner token, share)` in
/// grant order (the share's fencing token is `None`: these shares have none); empty when the
/// name has no readers (or is used as a semaphore, which [`acquire_share`] never does).
///
/// Cancel safe (drops expired shares only).
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn inspect_shares(
    conn: &mut Conn,
    keys: &Keys,
) -> Result<Vec<(String, lockcore::Share)>> {
    let (mode, shares) = crate::shares::inspect_owned(conn, keys).await?;
    if mode != Some(lockcore::LockMode::Shared) {
        return Ok(Vec::new());
    }
    Ok(shares
        .into_iter()
        .map(|(token, s)| (token, lockcore::Share::new(None, s.ttl_left, s.holder)))
        .collect())
}

/// How long a waiting writer's mark (see [`acquire_waiting`]) should last past each of its
/// attempts when it polls every `poll` at the latest: past its next attempt, and short, so
/// that a writer that gave up holds later readers back that long at most.
pub fn writer_mark_ttl(poll: Duration) -> Duration {
    poll + Duration::from_secs(1)
}

/// Takes `token` out of the queue of waiters of `keys` (see [`acquire_waiting`]), waking the
/// next waiter when it was the head of a free lock. Returns whether it was queued.
///
/// Cancel safety: dropping the future may leave the entry until its TTL runs out.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn leave_queue(conn: &mut Conn, keys: &Keys, token: &str) -> Result<bool> {
    crate::queue::leave(conn, keys, token).await
}

/// How long a waiter's queue entry should last past each of its attempts when it polls every
/// `poll` at the latest (see [`acquire_waiting`]).
pub fn queue_entry_ttl(poll: Duration) -> Duration {
    crate::queue::entry_ttl(poll)
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

/// Deletes the lock whoever holds it and publishes on the release channel. Returns whether it
/// was held.
///
/// Cancel safety: dropping the future may or may not have deleted the lock.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn revoke(conn: &mut Conn, keys: &Keys) -> Result<bool> {
    revoke_keys(conn, keys, &[&keys.lock, &keys.holder], None).await
}

/// [`revoke`], and every shared holder or permit of the name (see
/// `shares`), its waiting writer's mark and its queue with it; the queue's
/// head is told. With `notice` (the namespace's revocation channel, [`revocation_channel`];
/// single node only, a cluster gives `None`), the holders' clients are told too: their lost
/// signals fire at once (see [`Node::listen_for_revocations`]).
///
/// Cancel safety: as [`revoke`].
///
/// # Errors
/// As [`revoke`].
pub async fn revoke_with_shares(
    conn: &mut Conn,
    keys: &Keys,
    notice: Option<&str>,
) -> Result<bool> {
    let sk = crate::shares::ShareKeys::of(keys);
    revoke_keys(
        conn,
        keys,
        &[
            &keys.lock,
            &keys.holder,
            &sk.shares,
            &sk.info,
            &sk.writer,
            &sk.queue,
            &sk.queue_exp,
        ],
        notice.filter(|_| matches!(conn, Conn::Single(_))),
    )
    .await
}

async fn revoke_keys(
    conn: &mut Conn,
    keys: &Keys,
    key_list: &[&str],
    notice: Option<&str>,
) -> Result<bool> {
    let publish = publish_command(conn);
    let mut inv = scripts().revoke.prepare_invoke();
    for k in key_list {
        inv.key(*k);
    }
    inv.arg(&keys.channel).arg(publish);
    if let Some(channel) = notice {
        inv.arg(channel);
    }
    let n: i64 = inv
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("revoke failed", e))?;
    Ok(n == 1)
}

/// The bare Redis lock primitive, without this library: `SET lock token NX PX 10000`, then the
/// compare-and-delete script. Two round trips; what the benchmark compares `try_lock` + release
/// with.
///
/// Cancel safety: dropping the future may leave the key held for up to 10 s.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails; `Backend` when the key was held.
pub async fn bare_cycle(conn: &mut Conn, keys: &Keys) -> Result<()> {
    let token = lockcore::OwnerToken::random().to_hex();
    let set: Option<String> = redis::cmd("SET")
        .arg(&keys.lock)
        .arg(&token)
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query_async(conn)
        .await
        .map_err(|e| map_err("bare SET NX PX failed", e))?;
    if set.is_none() {
        return Err(Error::new(
            lockcore::ErrorKind::Backend,
            "the bare cycle's name was held",
        ));
    }
    let n: i64 = scripts()
        .compare_and_delete
        .key(&keys.lock)
        .arg(&token)
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("bare compare-and-delete failed", e))?;
    if n == 1 {
        Ok(())
    } else {
        Err(Error::new(
            lockcore::ErrorKind::Backend,
            "the bare cycle's key was gone before its delete",
        ))
    }
}

/// Sends `PING`.
///
/// Cancel safe.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn ping(conn: &mut Conn) -> Result<()> {
    redis::cmd("PING")
        .query_async::<()>(conn)
        .await
        .map_err(|e| map_err("PING failed", e))
}

/// The server's version from `INFO server` (`redis 7.0.15`; on a cluster, the node that answers).
///
/// Cancel safe.
///
/// # Errors
/// `Unavailable` or `Backend` when the command fails; `Backend` when the reply has no version.
pub async fn server_version(conn: &mut Conn) -> Result<String> {
    let text: String = redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .map_err(|e| map_err("INFO server failed", e))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("redis_version:"))
        .map(|v| format!("redis {v}"))
        .ok_or_else(|| Error::new(ErrorKind::Backend, "INFO server has no redis_version"))
}

/// The server's `run_id` (`INFO server`): random for every redis-server process, so two
/// addresses whose servers report the same one reach the same process (what Redlock must know
/// to count each master's vote once, whatever names the configuration gives it).
///
/// Cancel safe.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails (a user without the right to run `INFO`:
/// `Backend`), or its `INFO server` has no `run_id`.
pub async fn server_run_id(conn: &mut Conn) -> Result<String> {
    let text: String = redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .map_err(|e| map_err("INFO server failed", e))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("run_id:"))
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| Error::new(ErrorKind::Backend, "INFO server has no run_id"))
}

/// The number of commands the server has run since its start: the sum of `calls=` over
/// `INFO commandstats` (on a cluster, of the node the command is routed to).
///
/// Cancel safe.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn server_requests(conn: &mut Conn) -> Result<u64> {
    let mut info = redis::cmd("INFO");
    info.arg("commandstats");
    let reply: redis::Value = match conn {
        Conn::Single(_) => info.query_async(conn).await,
        Conn::Cluster(c) => {
            use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
            c.route_command(
                info,
                RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
            )
            .await
        }
    }
    .map_err(|e| map_err("INFO commandstats failed", e))?;
    let mut texts = Vec::new();
    collect_text(reply, &mut texts);
    Ok(texts.iter().map(|t| command_calls(t, |_| true)).sum())
}

/// The calls an `INFO commandstats` text counts for the commands `counted` accepts (by name:
/// `get`, `evalsha`, ...).
pub fn command_calls(info: &str, counted: impl Fn(&str) -> bool) -> u64 {
    info.lines()
        .filter_map(|l| {
            let (command, stats) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            if !counted(command) {
                return None;
            }
            stats
                .split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Every text in a reply (one `INFO` text, or one per node on a cluster).
fn collect_text(v: redis::Value, out: &mut Vec<String>) {
    use redis::Value as V;
    match v {
        V::BulkString(b) => out.push(String::from_utf8_lossy(&b).into_owned()),
        V::SimpleString(s) => out.push(s),
        V::VerbatimString { text, .. } => out.push(text),
        V::Array(items) | V::Set(items) => items.into_iter().for_each(|i| collect_text(i, out)),
        V::Map(pairs) => pairs.into_iter().for_each(|(_, v)| collect_text(v, out)),
        _ => {}
    }
}

/// A connected client of one Redis server (or cluster): the command connection and the pub/sub
/// side, from one [`Config`]. Clones share both.
#[derive(Clone)]
pub struct Node {
    cfg: Config,
    conn: Conn,
    factory: Factory,
    subs: Arc<Subscriptions>,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("url", &self.cfg.redacted())
            .field("subscriptions", &self.subs)
            .finish()
    }
}

impl Node {
    /// Opens the command connection to the server(s) of `cfg` and checks it with `PING` (wrong
    /// credentials or an unreachable server fail here, not at the first lock). The pub/sub
    /// connection opens on the first [`Subscriptions::join`].
    ///
    /// Cancel safety: dropping the future closes whatever connection it had opened.
    ///
    /// # Errors
    /// `InvalidConfig` for an unreadable `tls_ca` file or bad TLS settings; `Unavailable` when
    /// the server cannot be reached; `Auth` when it refuses the credentials (wrong password).
    pub async fn connect(cfg: &Config) -> Result<Node> {
        Self::connect_with(cfg, Factory::new(cfg)?).await
    }

    /// As [`Node::connect`], on the settings of an application's client (`cfg` gives the rest:
    /// namespace, timeouts, poll).
    pub async fn from_client(cfg: &Config, client: &redis::Client) -> Result<Node> {
        Self::connect_with(cfg, Factory::from_client(client)?).await
    }

    async fn connect_with(cfg: &Config, factory: Factory) -> Result<Node> {
        let mut conn = factory.command_conn(cfg).await?;
        redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| map_err("PING after connecting failed", e))?;
        let subs = Subscriptions::new(Box::new(PubSubOpener {
            factory: factory.clone(),
            cfg: cfg.clone(),
        }));
        Ok(Node {
            cfg: cfg.clone(),
            conn,
            factory,
            subs,
        })
    }

    /// The configuration this node was connected with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// A handle to the multiplexed command connection (cheap; handles share the connection).
    pub fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// This node's release-notification subscriptions.
    pub fn subscriptions(&self) -> &Arc<Subscriptions> {
        &self.subs
    }

    /// Subscribes to the namespace's revocation channel ([`revocation_channel`]; single node
    /// only: `Ok(None)` on a cluster), so that [`Node::watch_revoked`] leases learn of a
    /// [`revoke_with_shares`] with a notice at once. Keep the returned subscription for as long
    /// as the leases should hear (it is renewed after reconnects; a notice sent while the
    /// pub/sub connection was down is lost, and the lease's renewal finds out instead).
    ///
    /// Cancel safety: a dropped call leaves the client not listening (or listening, with the
    /// subscription dropped: the channel is unsubscribed).
    ///
    /// # Errors
    /// `Unavailable` or `Backend` when the pub/sub connection or the `SUBSCRIBE` fails.
    pub async fn listen_for_revocations(&self) -> Result<Option<Waiting>> {
        if matches!(self.conn, Conn::Cluster(_)) {
            return Ok(None);
        }
        let channel = revocation_channel(&self.cfg.namespace);
        let waiting = self.subs.join(&channel).await?;
        self.subs.registry.revocations.listen_on(channel);
        Ok(Some(waiting))
    }

    /// A held lease of `token` (the owner token's 128 bits, [`lockcore::OwnerToken::uuid`])
    /// whose `lost` fires when a revocation notice names it (only once
    /// [`Node::listen_for_revocations`] has run; a no-op before). Pair it with
    /// [`Node::unwatch_revoked`].
    pub fn watch_revoked(&self, token: u128, lost: LostNotifier) {
        self.subs.registry.revocations.watch(token, lost);
    }

    /// The lease of `token` is no longer held here.
    pub fn unwatch_revoked(&self, token: u128) {
        self.subs.registry.revocations.unwatch(token);
    }

    /// The keys of `name` in this node's namespace.
    pub fn keys(&self, name: &LockName) -> Keys {
        Keys::new(&self.cfg.namespace, name)
    }

    /// A new command connection whose responses may take `extra` longer than the configured
    /// response timeout (for blocking commands such as `WAIT`).
    pub(crate) async fn slow_conn(&self, extra: Duration) -> Result<Conn> {
        self.factory.slow_conn(&self.cfg, extra).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_a_slot_and_ignore_user_braces() {
        let k = Keys::new("ns", &LockName::new("{a}x").unwrap());
        assert_eq!(k.lock, "ns:{%7Ba%7Dx}:lock");
        assert_eq!(k.fence, "ns:{%7Ba%7Dx}:fence");
        let plain = Keys::new("ns", &LockName::new("a").unwrap());
        assert_eq!(plain.lock, "ns:{a}:lock");
        assert_ne!(k.lock, plain.lock);
    }

    #[test]
    fn ttl_rounds_up() {
        assert_eq!(ttl_ms(Duration::from_micros(1500)), 2);
        assert_eq!(ttl_ms(Duration::from_millis(30)), 30);
        assert_eq!(ttl_ms(Duration::from_nanos(1)), 1);
    }
}
