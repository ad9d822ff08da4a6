//! `interop=redis-py`: redis-py's `Lock`, as redis-py 4.3.4 (`redis/lock.py`, the Debian
//! `python3-redis` package) keeps it.
//!
//! * The key is the lock name itself, no prefix (`Lock(r, name)` uses `name` as the key).
//! * Acquire: redis-py sends `SET name token NX PX timeout` (`do_acquire`). Ours is the same
//!   test and write in one script (the default mode's acquire script without its fencing
//!   counter): the key is set only when absent; when it already holds our own token (a re-sent
//!   script) its TTL is reset; otherwise the holder's `PTTL` comes back.
//! * Release: redis-py's `LUA_RELEASE_SCRIPT` deletes the key only if it holds the caller's
//!   token; ours does the same and then publishes on locksmith's own channel (which redis-py
//!   does not read) so that locksmith's waiters wake at once.
//! * Extend: redis-py's `LUA_REACQUIRE_SCRIPT` (token-checked `PEXPIRE`); ours is the same.
//!
//! The token is the owner token's 32 hex digits: redis-py's own are `uuid1().hex`, the same
//! shape, and it compares them as opaque bytes.

use std::time::Duration;

use lockcore::{LockName, Result};

use crate::conn::Conn;
use crate::node::{self, Keys, NodeAttempt};

/// The key is the exact name; the channel is locksmith's own (`<namespace>:{<name>}:released`,
/// as in the default mode), for wake-ups among locksmith clients only.
pub(crate) fn keys(namespace: &str, name: &LockName) -> Keys {
    let default = Keys::new(namespace, name);
    Keys {
        lock: name.as_str().to_owned(),
        fence: String::new(),
        ..default
    }
}

pub(crate) async fn acquire(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    ttl: Duration,
) -> Result<NodeAttempt> {
    // Without the fencing counter the script sets KEYS[1] as redis-py's `SET NX PX` does
    // (`SET KEYS[1] token PX ttl` when the key is absent), and the metadata key in locksmith's
    // own namespace (no holder metadata: `inspect` is not offered in this mode).
    node::acquire(conn, keys, token, "", ttl, false).await
}

pub(crate) async fn extend(
    conn: &mut Conn,
    keys: &Keys,
    token: &str,
    ttl: Duration,
) -> Result<bool> {
    node::extend(conn, keys, token, ttl).await
}

pub(crate) async fn release(conn: &mut Conn, keys: &Keys, token: &str) -> Result<bool> {
    node::release(conn, keys, token).await
}

pub(crate) async fn revoke(conn: &mut Conn, keys: &Keys) -> Result<bool> {
    node::revoke(conn, keys).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_the_exact_name() {
        let name = LockName::new("jobs:{nightly} 42/é").unwrap();
        let k = keys("locksmith", &name);
        assert_eq!(k.lock, "jobs:{nightly} 42/é");
        assert_eq!(k.channel, Keys::new("locksmith", &name).channel);
    }
}
