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
//!
//! This module gathers what other crates use; the protocol lives in one file per concern: the
//! key layout (`keys`), the script calls (`script`), how a grant is judged (`grant`), the Lua
//! pieces every mode shares (`lua`), the exclusive lock (`exclusive`), its waiters' queue
//! (`queue`), shares (`shares`), questions to the server (`server`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::LostNotifier;
use lockcore::{LockName, Result};

pub use crate::config::Config;
pub use crate::conn::Conn;
use crate::conn::{Factory, PubSubOpener};
pub use crate::error::map_err;
pub use crate::exclusive::{
    AcquireWith, GrantAsk, acquire, acquire_replicated, bare_cycle, extend, extend_many,
    extend_replicated, revoke, revoke_with_shares,
};
pub use crate::grant::NodeAttempt;
pub use crate::keys::Keys;
pub use crate::queue::{
    QueuePlace, WaitingVote, acquire_waiting, leave_queue, queue_entry_ttl, release_announced,
    release_announced_granting, release_plain as release,
};
pub use crate::revoked::channel as revocation_channel;
pub use crate::script::{Replicas, ttl_ms};
pub use crate::server::{command_calls, ping, server_requests, server_run_id, server_version};
pub use crate::shares::{
    acquire_share, extend_share, inspect_shares, release_share_announced, writer_mark_ttl,
};
pub use crate::subs::RELEASED;
pub use crate::subs::{Channel, ExpiryWatch, Granted, QueuedWake, Subscriptions, Waiting};

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
