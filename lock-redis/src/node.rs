//! The single-node lock protocol, public so that other backends (`lock-redlock`, which runs it on
//! N independent masters) use the very same scripts, key layout and connection setup.
//!
//! * [`Keys`]: the key layout and name escaping of one lock name.
//! * [`acquire`], [`extend`], [`release`], [`revoke`]: one script each, one round trip each.
//! * [`Node`]: a connected client of one server (or cluster) from a parsed [`Config`]: a
//!   multiplexed reconnecting command connection plus lazily opened pub/sub [`Subscriptions`]
//!   for the release channel.
//!
//! [`RedisBackend`](crate::RedisBackend) is built on this module and adds waiting, replicas
//! (`WAIT`) and the `Backend` contract.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{Error, LockName, Result};
use redis::{RedisError, Script};

pub use crate::config::Config;
pub use crate::conn::Conn;
use crate::conn::{Factory, PubSubOpener};
pub use crate::subs::{Channel, Subscriptions, Waiting};

/// `SET NX PX` and, on success and when a fencing counter key (`KEYS[2]`) is given, `INCR` of
/// it, atomically. Returns `{1, fence}` (`{1, 0}` without a counter key) or
/// `{0, pttl of the holder}`.
const ACQUIRE_LUA: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if KEYS[2] then return {1, redis.call('INCR', KEYS[2])} end
  return {1, 0}
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// Compare-and-delete, then tell the waiters.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
";

/// Compare-and-pexpire.
const EXTEND_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Delete whoever holds it (an administrator's override), and tell the waiters.
const REVOKE_LUA: &str = r"
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], 'revoked')
  return 1
end
return 0
";

struct Scripts {
    acquire: Script,
    release: Script,
    extend: Script,
    revoke: Script,
}

fn scripts() -> &'static Scripts {
    static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        acquire: Script::new(ACQUIRE_LUA),
        release: Script::new(RELEASE_LUA),
        extend: Script::new(EXTEND_LUA),
        revoke: Script::new(REVOKE_LUA),
    })
}

/// Maps a client error: connection, I/O and timeouts are `Unavailable`, the rest `Backend`.
pub fn map_err(msg: &str, e: RedisError) -> Error {
    use redis::{ErrorKind as K, ServerErrorKind as S};
    // Transient states of a server or cluster (loading, failover, resharding) are Unavailable too.
    let transient = matches!(
        e.kind(),
        K::ClusterConnectionNotFound
            | K::Server(S::BusyLoading | S::MasterDown | S::ReadOnly | S::TryAgain)
    );
    if transient
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
    {
        Error::unavailable(msg.to_owned(), e)
    } else {
        Error::backend(msg.to_owned(), e)
    }
}

/// As [`map_err`], for connection setup.
pub(crate) fn map_err_connect(msg: &str, e: RedisError) -> Error {
    map_err(msg, e)
}

/// The keys and channel of one lock name: `<namespace>:{<escaped name>}:lock`,
/// `<namespace>:{<escaped name>}:fence` and the channel `<namespace>:{<escaped name>}:released`.
/// The hash tag is [`LockName::escaped`], which never contains `{` or `}`.
#[derive(Clone, Debug)]
pub struct Keys {
    /// The lock key (value: the owner token; TTL: the lease).
    pub lock: String,
    /// The fencing counter key (no TTL).
    pub fence: String,
    /// The pub/sub channel a release publishes on.
    pub channel: String,
    /// The hash tag (the escaped name), for routing `WAIT` on a cluster.
    pub tag: String,
}

impl Keys {
    /// The keys of `name` under `namespace`.
    pub fn new(namespace: &str, name: &LockName) -> Keys {
        let tag = name.escaped();
        Keys {
            lock: format!("{namespace}:{{{tag}}}:lock"),
            fence: format!("{namespace}:{{{tag}}}:fence"),
            channel: format!("{namespace}:{{{tag}}}:released"),
            tag,
        }
    }
}

/// Redis Cluster's key slot of a hash tag: CRC16/XMODEM modulo 16384.
pub(crate) fn slot_of(tag: &str) -> u16 {
    let mut crc: u16 = 0;
    for &b in tag.as_bytes() {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
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

/// Runs the acquire script on `conn`: `SET lock token NX PX ttl`, and with `fencing` the
/// `INCR` of the fencing counter in the same script. One round trip.
///
/// Cancel safety: a dropped call may have taken the lock; it then frees after `ttl`.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn acquire(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    ttl: Duration,
    fencing: bool,
) -> Result<NodeAttempt> {
    let mut inv = scripts().acquire.key(&keys.lock);
    if fencing {
        inv.key(&keys.fence);
    }
    let (won, value): (i64, i64) = inv
        .arg(token)
        .arg(ttl_ms(ttl))
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("acquire script failed", e))?;
    if won == 1 {
        if !fencing {
            return Ok(NodeAttempt::Won { fence: None });
        }
        let fence = u64::try_from(value)
            .map_err(|_| Error::new(lockcore::ErrorKind::Backend, "negative fencing counter"))?;
        return Ok(NodeAttempt::Won { fence: Some(fence) });
    }
    // PTTL: -1 (no expiry, not ours) or -2 (gone) give no useful wake-up time.
    Ok(NodeAttempt::Held {
        pttl: u64::try_from(value).ok().map(Duration::from_millis),
    })
}

/// Compare-and-`PEXPIRE`: resets the lock's TTL to `ttl` if `token` still holds it. Returns
/// whether it did.
///
/// Cancel safety: dropping the future may or may not have extended the lock.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn extend(conn: &mut Conn, keys: &Keys, token: &str, ttl: Duration) -> Result<bool> {
    let n: i64 = scripts()
        .extend
        .key(&keys.lock)
        .arg(token)
        .arg(ttl_ms(ttl))
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("extend script failed", e))?;
    Ok(n == 1)
}

/// Compare-and-delete that also publishes on the release channel. Returns whether `token` held
/// the lock (and it is now deleted).
///
/// Cancel safety: dropping the future may or may not have released the lock.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn release(conn: &mut Conn, keys: &Keys, token: &str) -> Result<bool> {
    let n: i64 = scripts()
        .release
        .key(&keys.lock)
        .arg(token)
        .arg(&keys.channel)
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("release script failed", e))?;
    Ok(n == 1)
}

/// Deletes the lock whoever holds it and publishes on the release channel. Returns whether it
/// was held.
///
/// Cancel safety: dropping the future may or may not have deleted the lock.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn revoke(conn: &mut Conn, keys: &Keys) -> Result<bool> {
    let n: i64 = scripts()
        .revoke
        .key(&keys.lock)
        .arg(&keys.channel)
        .invoke_async(conn)
        .await
        .map_err(|e| map_err("revoke failed", e))?;
    Ok(n == 1)
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

/// The number of commands the server has run since its start: the sum of `calls=` over
/// `INFO commandstats` (on a cluster, of the node the command is routed to).
///
/// Cancel safe.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn server_requests(conn: &mut Conn) -> Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .map_err(|e| map_err("INFO commandstats failed", e))?;
    Ok(info
        .lines()
        .filter_map(|l| {
            l.split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum())
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
    /// the server cannot be reached; `Backend` when it refuses the connection (wrong password).
    pub async fn connect(cfg: &Config) -> Result<Node> {
        let factory = Factory::new(cfg)?;
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
    fn crc16_slot_matches_redis() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("bar"), 5061);
        assert_eq!(slot_of(""), 0);
    }

    #[test]
    fn ttl_rounds_up() {
        assert_eq!(ttl_ms(Duration::from_micros(1500)), 2);
        assert_eq!(ttl_ms(Duration::from_millis(30)), 30);
        assert_eq!(ttl_ms(Duration::from_nanos(1)), 1);
    }
}
