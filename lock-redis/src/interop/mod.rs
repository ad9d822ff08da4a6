//! `interop=...`: locks shared with another Redis lock client, on its key layout and protocol.
//!
//! Each mode is one module that speaks the peer's protocol ([`redis_py`], [`redisson`]); this
//! module picks one and says what of the contract holds in it (the [`Capabilities`] it
//! declares). A mode never weakens mutual exclusion: every acquisition checks the peer's own
//! record of the lock (the same key, the same test the peer makes) in one script.

mod compat;
mod redis_py;
mod redisson;

pub(crate) use compat::table as compatibility;

/// The check every interop acquire script makes first, so that a name taken on locksmith's
/// default layout (`<namespace>:{<name>}:lock`, or its shared holders and permits in
/// `…:shares`) is held for this mode too: `KEYS[2]` is the default layout's lock key, `KEYS[3]`
/// its shares; `$owner` the Lua expression of this acquisition's owner. Held by another owner,
/// or by a live share or permit: the script returns `$held` (a Lua expression that may use
/// `held_for`, the ms until the holder's lease may end). A winning script then writes the
/// default layout's lock key with its owner and TTL beside the peer's record (and extends and
/// deletes the two together), so that every default-layout script (exclusive, queued,
/// shared, permits, multi-locks) sees the name held. A default-layout holder and an interop
/// holder of one name therefore exclude each other in both orders. Re-run with the same owner
/// (a re-sent script), the check is made again: nothing the first copy checked is skipped.
macro_rules! default_layout_check_lua {
    ($owner:literal, $held:literal) => {
        concat!(
            r"
local mirror = redis.call('GET', KEYS[2])
if mirror and mirror ~= ",
            $owner,
            r" then
  local held_for = redis.call('PTTL', KEYS[2])
  return ",
            $held,
            r"
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local live = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if live[2] then
    local held_for = tonumber(live[2]) - now
    return ",
            $held,
            r"
  end
end
"
        )
    };
}
pub(crate) use default_layout_check_lua;

/// The default layout's shares key of a name whose default lock key is `mirror`
/// (`<namespace>:{<name>}:lock`), as [`ShareKeys`](crate::keys::ShareKeys) names it.
pub(crate) fn default_shares_key(mirror: &str) -> String {
    let base = mirror.strip_suffix(":lock").unwrap_or(mirror);
    format!("{base}:shares")
}

/// Runs a mode's acquire script on the keys its [`default_layout_check_lua`] reads: the
/// peer's record, the default layout's lock key beside it (`keys.holder`), and the default
/// layout's shares.
async fn run_acquire<T: redis::FromRedisValue>(
    conn: &mut Conn,
    script: &LuaScript,
    keys: &Keys,
    args: &[&str],
    what: &str,
) -> Result<T> {
    let shares = default_shares_key(&keys.holder);
    run(
        conn,
        script,
        &[&keys.lock, &keys.holder, &shares],
        args,
        what,
    )
    .await
}

/// The default layout's release channel of a name whose default lock key is `mirror`
/// ([`Keys::new`]'s `channel`).
pub(crate) fn default_channel(mirror: &str) -> String {
    let base = mirror.strip_suffix(":lock").unwrap_or(mirror);
    format!("{base}:released")
}

use std::time::Duration;

use lockcore::{Capabilities, LockName, OwnerToken, Result, WaitKind};

use crate::conn::Conn;
use crate::grant::NodeAttempt;
use crate::keys::Keys;
use crate::script::{LuaScript, run};

/// The lock client whose on-server layout and protocol a backend follows (`interop=` in the URL,
/// `interop` in a config file). Without it, locksmith keeps its own layout
/// (`<namespace>:{<name>}:lock` plus a fencing counter), which no other client reads. A mode's
/// holder also writes the default layout's lock key of the name (same namespace), and checks
/// it and the name's shares first: locksmith clients on the default layout and on a mode
/// exclude each other (a fleet can move from one to the other a service at a time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize)]
#[non_exhaustive]
pub enum Interop {
    /// redis-py's `redis.lock.Lock` (followed from redis-py 4.3.4, `redis/lock.py`, the Debian
    /// `python3-redis` package): a string at the exact lock name whose value is the owner's
    /// token, taken with `SET name token NX PX ttl`, released and extended by scripts that
    /// compare the token first.
    #[serde(rename = "redis-py")]
    RedisPy,
    /// Redisson's `RLock` (followed from Redisson 4.7.0, `RedissonLock.java`,
    /// `RedissonBaseLock.java`, `renewal/LockTask.java`, `pubsub/LockPubSub.java`): a hash at the
    /// exact lock name, one field `<client id>:<thread id>` holding a reentrancy count, with a
    /// `PEXPIRE`; an unlock publishes `0` on `redisson_lock__channel:{<name>}`.
    #[serde(rename = "redisson")]
    Redisson,
}

impl Interop {
    /// The value of `interop=` that names this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Interop::RedisPy => "redis-py",
            Interop::Redisson => "redisson",
        }
    }

    /// The keys and channel of `name` in this mode.
    pub(crate) fn keys(self, namespace: &str, name: &LockName) -> Keys {
        match self {
            Interop::RedisPy => redis_py::keys(namespace, name),
            Interop::Redisson => redisson::keys(namespace, name),
        }
    }

    /// What this mode stores as the owner of an acquisition with `token`.
    pub(crate) fn owner(self, token: &OwnerToken) -> String {
        match self {
            Interop::RedisPy => token.to_hex(),
            Interop::Redisson => redisson::field(token),
        }
    }

    /// One acquire script (idempotent for one owner).
    pub(crate) async fn acquire(
        self,
        conn: &mut Conn,
        keys: &Keys,
        owner: &str,
        ttl: Duration,
    ) -> Result<NodeAttempt> {
        match self {
            Interop::RedisPy => redis_py::acquire(conn, keys, owner, ttl).await,
            Interop::Redisson => redisson::acquire(conn, keys, owner, ttl).await,
        }
    }

    /// Owner-checked `PEXPIRE`; whether the owner still held the lock.
    pub(crate) async fn extend(
        self,
        conn: &mut Conn,
        keys: &Keys,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool> {
        match self {
            Interop::RedisPy => redis_py::extend(conn, keys, owner, ttl).await,
            Interop::Redisson => redisson::extend(conn, keys, owner, ttl).await,
        }
    }

    /// Owner-checked delete that wakes the waiters the peer and locksmith have.
    pub(crate) async fn release(self, conn: &mut Conn, keys: &Keys, owner: &str) -> Result<bool> {
        match self {
            Interop::RedisPy => redis_py::release(conn, keys, owner).await,
            Interop::Redisson => redisson::release(conn, keys, owner).await,
        }
    }

    /// Deletes the lock whoever holds it (an operator's override), waking the waiters.
    pub(crate) async fn revoke(self, conn: &mut Conn, keys: &Keys) -> Result<bool> {
        match self {
            Interop::RedisPy => redis_py::revoke(conn, keys).await,
            Interop::Redisson => redisson::revoke(conn, keys).await,
        }
    }

    /// Whether renewals of this mode may go through the batched compare-and-`PEXPIRE` of a
    /// string key ([`crate::exclusive::extend_many`]): no mode's may, since each renewal checks the
    /// default layout's lock key too (see [`default_layout_check_lua`]).
    pub(crate) fn batched_renewals(self) -> bool {
        false
    }

    /// The capabilities in this mode, from the default mode's.
    pub(crate) fn capabilities(self, mut c: Capabilities) -> Capabilities {
        // The peer keeps no counter: a token handed out here would not order the peer's
        // holders, so none is handed out.
        c.fencing = false;
        c.fair = false;
        c.reentrant = false;
        c.expiry_after_ttl = true;
        c.force_release = true;
        // The peer writes no holder metadata, and inspect reads locksmith's own keys.
        c.inspect = false;
        let why = format!(
            "interop={}: the peer's layout is a plain lock key; it has no shared holders or \
             permits to agree on",
            self.as_str()
        );
        c.shared = lockcore::Support::no(why.clone());
        c.permits = lockcore::Support::no(why);
        c.notes = vec![
            "asynchronous replication: a failover right after an acquire can lose the lock \
             (no fencing token to reject the old holder's writes in this mode)"
                .into(),
            "a restart without persistence loses every lock: another client (either side) can \
             win as soon as the server answers again, while the holder learns of the loss only \
             at its next renewal (within ttl/3 by default) or when its validity ends"
                .into(),
            "lost leases are detected by the contract (renewal refused, validity deadline), not \
             by the backend"
                .into(),
        ];
        match self {
            Interop::RedisPy => {
                // redis-py announces nothing on release: a waiter here sees a peer's release at
                // its next poll (locksmith's own releases still wake it at once).
                c.wait = WaitKind::Poll;
                c.notes.extend([
                    "interop=redis-py: the lock is a string at the exact lock name holding the \
                     owner's token (redis-py 4.3.4 Lock: SET NX PX, token-checked release and \
                     extend); no namespace, no fencing tokens (redis-py keeps no counter)"
                        .to_owned(),
                    "interop=redis-py: redis-py publishes nothing on release and polls (every \
                     0.1 s by default): locksmith's waiters see a redis-py release at their next \
                     poll (poll_ms, jittered), a locksmith release at once (locksmith's own \
                     channel), an expiry at the holder's PTTL"
                        .to_owned(),
                    "interop=redis-py: a redis-py Lock without timeout holds its key with no TTL: \
                     if that process dies, the lock stays until someone deletes the key"
                        .to_owned(),
                    "not fair: neither side queues waiters".to_owned(),
                ]);
            }
            Interop::Redisson => {
                c.wait = WaitKind::Notify;
                c.notes.extend([
                    "interop=redisson: the lock is Redisson 4.7.0's RLock layout: a hash at the \
                     exact lock name, field <owner uuid>:1 with count 1, PEXPIRE; release \
                     deletes it and publishes 0 on redisson_lock__channel:{name} (Redisson's \
                     waiters wake); waiters here subscribe to that channel (Redisson's releases \
                     wake them); no fencing tokens (RLock keeps no counter)"
                        .to_owned(),
                    "interop=redisson: not reentrant on this side; Redisson's own reentrancy \
                     (its count) is untouched; Redisson's NameMapper must be the identity (the \
                     default), and Redisson on a cluster with sharded pub/sub is not supported \
                     (single node or sentinel only)"
                        .to_owned(),
                    "not fair: Redisson's RLock is not fair either (RFairLock is another layout)"
                        .to_owned(),
                ]);
            }
        }
        c
    }
}

impl std::fmt::Display for Interop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
