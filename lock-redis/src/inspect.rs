//! `inspect` on one Redis node: one read-only script returning the lock's owner token, its
//! PTTL, the holder metadata written beside it at acquire, and the fencing counter.
//!
//! Shared with Redlock, which reads each master with it.

use std::time::Duration;

use lockcore::{Holder, Result};
use redis::Script;

use crate::node::{Conn, Keys, map_err};

/// `{owner token or false, pttl, metadata or false, fence or false}`; the metadata only when
/// its token prefix is the owner's (a value left by another acquisition is not reported).
const INSPECT_LUA: &str = r"
local owner = redis.call('GET', KEYS[1])
if not owner then return {false, -2, false, false} end
local h = redis.call('GET', KEYS[2])
local meta = false
if h and string.sub(h, 1, #owner + 1) == owner .. ' ' then meta = string.sub(h, #owner + 2) end
return {owner, redis.call('PTTL', KEYS[1]), meta, redis.call('GET', KEYS[3])}
";

/// What one node has for a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    /// The owner token of the holder.
    pub owner: String,
    /// Its remaining TTL (`None`: no expiry set, which this library never does).
    pub ttl_left: Option<Duration>,
    /// Its metadata, when written by a client that stores it.
    pub holder: Option<Holder>,
    /// The fencing counter (the last value handed out: the holder's token when it acquired
    /// with fencing).
    pub fence: Option<u64>,
}

fn script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(INSPECT_LUA))
}

/// Reads the lock of `keys` on `conn`, atomically; `None` when free. One round trip.
///
/// Cancel safe (reads only).
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn read(conn: &mut Conn, keys: &Keys) -> Result<Option<NodeView>> {
    let (owner, pttl, meta, fence): (Option<String>, i64, Option<String>, Option<String>) =
        script()
            .key(&keys.lock)
            .key(&keys.holder)
            .key(&keys.fence)
            .invoke_async(conn)
            .await
            .map_err(|e| map_err("inspect script failed", e))?;
    Ok(owner.map(|owner| NodeView {
        owner,
        ttl_left: u64::try_from(pttl).ok().map(Duration::from_millis),
        holder: meta.as_deref().and_then(Holder::decode),
        fence: fence.and_then(|f| f.parse().ok()),
    }))
}
