//! `inspect` on one Redis node: one read-only script returning the lock's owner token, its
//! PTTL, the holder metadata written beside it at acquire, and the fencing counter.
//!
//! Shared with Redlock, which reads each master with it.

use std::time::Duration;

use lockcore::{Holder, Result};

use crate::conn::Conn;
use crate::keys::Keys;
use crate::script::{LuaScript, run};

/// `{owner token or false, pttl, metadata or false, fence or false}`; the metadata only when
/// its token prefix is the owner's (a value left by another acquisition is not reported).
static INSPECT: LuaScript = LuaScript::new(
    r"
local owner = redis.call('GET', KEYS[1])
if not owner then return {false, -2, false, false} end
local h = redis.call('GET', KEYS[2])
local meta = false
if h and string.sub(h, 1, #owner + 1) == owner .. ' ' then meta = string.sub(h, #owner + 2) end
return {owner, redis.call('PTTL', KEYS[1]), meta, redis.call('GET', KEYS[3])}
",
);

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

/// Reads the lock of `keys` on `conn`, atomically; `None` when free. One round trip.
///
/// Cancel safe (reads only).
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn read(conn: &mut Conn, keys: &Keys) -> Result<Option<NodeView>> {
    let key_list = [keys.lock.as_str(), &keys.holder, &keys.fence];
    let (owner, pttl, meta, fence): (Option<String>, i64, Option<String>, Option<String>) =
        run(conn, &INSPECT, &key_list, &[], "inspect script failed").await?;
    Ok(owner.map(|owner| NodeView {
        owner,
        ttl_left: u64::try_from(pttl).ok().map(Duration::from_millis),
        holder: meta.as_deref().and_then(Holder::decode),
        fence: fence.and_then(|f| f.parse().ok()),
    }))
}
