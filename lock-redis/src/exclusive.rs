//! The exclusive lock of one name on one server: its scripts (acquire, beside the shares and
//! with the waiters' queue; extend, one or many; revoke) and their calls, one round trip each.
//! The queued acquire script itself, the releases and the queue's bookkeeping are the `queue`
//! module's; the read-write check and the other pieces shared with shares are in `lua`.

use std::time::Duration;

use lockcore::{Error, ErrorKind, OwnerToken, Result};

use crate::conn::Conn;
use crate::error::map_err;
pub use crate::grant::GrantAsk;
use crate::grant::{Grant, NodeAttempt, semaphore_conflict};
use crate::keys::{Keys, ShareKeys};
use crate::lua::{advance_fence_lua, announce_lua, take_lua, writer_check_lua};
use crate::queue::ACQUIRE_QUEUED;
use crate::script::{LuaScript, Replicas, eval, publish_command, run_flag, ttl_ms};

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
        concat!(
            r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  if KEYS[3] then return {1, tonumber(redis.call('GET', KEYS[3]) or '0')} end
  return {1, 0}
end
if holder then return {0, redis.call('PTTL', KEYS[1])} end
",
            take_lua!(),
            r"
if not KEYS[3] then return {1, 0} end
",
            advance_fence_lua!("redis.call('TIME')"),
            r"
return {1, fence}
"
        )
    };
}
static ACQUIRE: LuaScript = LuaScript::new(acquire_lua!());

/// [`ACQUIRE`] behind the read-write check of the shares ([`writer_check_lua`]): KEYS lock,
/// holder, fence, shares, share info, waiting writer; `ARGV[4]` how long the writer's mark lasts, ms.
/// Also returns `{-1, 0}` when the name is held as a semaphore (a conflict).
static ACQUIRE_BESIDE_SHARES: LuaScript = LuaScript::new(concat!(
    writer_check_lua!("{-1, 0}", "{0, left}"),
    acquire_lua!()
));

/// The bare compare-and-delete (no notification), for [`bare_cycle`].
static COMPARE_AND_DELETE: LuaScript = LuaScript::new(
    r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
",
);

/// Compare-and-pexpire (of the lock `KEYS[1]` and its holder metadata `KEYS[2]`).
static EXTEND: LuaScript = LuaScript::new(
    r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
",
);

/// Compare-and-pexpire of many locks at once: `KEYS[2i-1]` (and its holder metadata
/// `KEYS[2i]`) is extended to `ARGV[2i]` ms if it holds `ARGV[2i-1]`; returns 1 or 0 per lock,
/// in order.
static EXTEND_MANY: LuaScript = LuaScript::new(
    r"
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
",
);

/// Delete whoever holds it (an administrator's override), and tell the waiters (`ARGV[2]`:
/// `PUBLISH`, or `SPUBLISH` on a cluster). `KEYS[3..]`, where given: the name's shares and its
/// other keys (see `shares`), deleted too; held if either was. `KEYS[6..7]`, where given: the
/// waiters' queue (see [`crate::queue`]), whose head is told.
/// `ARGV[3]`, where given: the namespace's revocation channel (see
/// [`revoked`](crate::revoked)), told the owner tokens taken away (the lock key's and the
/// shares').
static REVOKE: LuaScript = LuaScript::new(concat!(
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
    announce_lua!("KEYS[6]", "KEYS[7]", "ARGV[2]", "ARGV[1]", "'revoked'"),
    r"
return 1
"
));

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
    /// `handover=grant` (only with `queue`): a loser that joins the queue asks for the lock to
    /// be granted to it by the release (see `queue`).
    pub grant: Option<GrantAsk>,
}

/// Who asks for the lock, and for how long.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Asker<'a> {
    /// The owner token.
    pub(crate) token: &'a str,
    /// The holder metadata ([`lockcore::Holder::encode`]).
    pub(crate) holder: &'a str,
    /// The lease's TTL.
    pub(crate) ttl: Duration,
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
    let asker = Asker { token, holder, ttl };
    let (attempt, acked, _) = acquire_queued(conn, keys, asker, with).await?;
    Ok((attempt, acked))
}

/// [`acquire_replicated`], also returning the position in the waiters' queue after the
/// attempt (0: the head; `None`: not queued), with [`AcquireWith::queue`].
pub(crate) async fn acquire_queued(
    conn: &mut Conn,
    keys: &Keys,
    Asker { token, holder, ttl }: Asker<'_>,
    with: AcquireWith,
) -> Result<(NodeAttempt, Option<i64>, Option<u64>)> {
    let AcquireWith {
        fencing,
        replicas,
        beside_shares,
        queue,
        grant,
    } = with;
    let queue = queue.filter(|_| beside_shares.is_some());
    let share_keys = beside_shares.map(|_| ShareKeys::of(keys));
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
    let grant = grant
        .filter(|_| entry.is_some())
        .map(|g| (g.attempt.to_string(), ttl_ms(g.claim).to_string()));
    let mut args = vec![token, ttl.as_str(), holder];
    let script = match (&slack, &entry) {
        (Some(slack), Some(entry)) => {
            args.push(slack);
            args.push(entry);
            args.push(if counted { "1" } else { "0" });
            if let (Some((attempt, claim)), Some(sk)) = (&grant, &share_keys) {
                key_list.push(&sk.grants);
                args.push(attempt);
                args.push(claim);
            }
            ACQUIRE_QUEUED.get()
        }
        (Some(slack), None) => {
            args.push(slack);
            ACQUIRE_BESIDE_SHARES.get()
        }
        _ => ACQUIRE.get(),
    };
    let (reply, acked): (Vec<i64>, _) = eval(conn, script, &key_list, &args, replicas)
        .await
        .map_err(|e| map_err("acquire script failed", e))?;
    let position = reply.get(2).and_then(|p| u64::try_from(*p).ok());
    let attempt = Grant::judge(&reply)?.attempt(counted, semaphore_conflict)?;
    let position = position.filter(|_| matches!(attempt, NodeAttempt::Held { .. }));
    Ok((attempt, acked, position))
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
            .arg(EXTEND_MANY.get().get_hash())
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
                EXTEND_MANY
                    .get()
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
        EXTEND.get(),
        &[keys.lock.as_str(), keys.holder.as_str()],
        &[token, &ttl],
        replicas,
    )
    .await
    .map_err(|e| map_err("extend script failed", e))?;
    Ok((n == 1, acked))
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
/// head is told. With `notice` (the namespace's revocation channel, [`channel`](crate::revoked::channel);
/// single node only, a cluster gives `None`), the holders' clients are told too: their lost
/// signals fire at once (see `Node::listen_for_revocations`).
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
    let sk = ShareKeys::of(keys);
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
    let mut args = vec![keys.channel.as_str(), publish_command(conn)];
    args.extend(notice);
    run_flag(conn, &REVOKE, key_list, &args, "revoke failed").await
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
    let token = OwnerToken::random().to_hex();
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
            ErrorKind::Backend,
            "the bare cycle's name was held",
        ));
    }
    let n: i64 = COMPARE_AND_DELETE
        .get()
        .key(&keys.lock)
        .arg(&token)
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("bare compare-and-delete failed", e))?;
    if n == 1 {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Backend,
            "the bare cycle's key was gone before its delete",
        ))
    }
}
