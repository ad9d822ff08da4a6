//! locksmith backend for Redis: a single node (`redis://`, `rediss://`) or a Redis Cluster
//! (`redis+cluster://h1:p1,h2:p2`, `rediss+cluster://...`).
//!
//! # How a lock is kept
//!
//! * **Acquire** is one Lua script (sent with `EVALSHA`, loaded on `NOSCRIPT`): `SET lock token
//!   PX ttl` if the lock is free and, only then, the fencing counter moves to
//!   `max(last + 1, server TIME in µs)`, the fencing token (so tokens keep increasing after a
//!   restart that lost the counter, or a failover to a replica that missed increments, as long
//!   as the servers' clocks do not step back). When the lock is held, the script returns the
//!   holder's `PTTL` so a waiter can wake when the lease runs out; when it is held by the very
//!   same token (a re-sent script after a dropped connection) it resets the TTL and reports
//!   success. There is never a window with a lock key without TTL.
//! * **Release** is a compare-and-delete script that also `PUBLISH`es on the lock's channel
//!   (on a cluster `SPUBLISH`, sharded pub/sub on the lock's slot);
//!   **extend** is a compare-and-`PEXPIRE` script. Both change nothing and return
//!   [`ErrorKind::NotHeld`](lockcore::ErrorKind::NotHeld) when the token no longer matches.
//! * **Keys**: `<namespace>:{<escaped name>}:lock` and `<namespace>:{<escaped name>}:fence`, and
//!   the channel `<namespace>:{<escaped name>}:released`. The hash tag is
//!   [`LockName::escaped`](lockcore::LockName::escaped), which never contains `{` or `}`: a user's `{...}` in a name cannot pick
//!   the slot, and both keys of a name share one slot, so the scripts are legal on a cluster.
//!   The fencing counter key has no TTL: it must outlive every lease to stay increasing.
//! * **Holder metadata** ([`lockcore::Holder`]): `<namespace>:{<escaped name>}:holder` holds
//!   `"<owner token> <metadata>"`, set by the acquire script beside the lock key with the same
//!   TTL; extend, release and revoke treat the two together. [`Locker::inspect`](lockcore::Locker::inspect)
//!   reads the owner, its `PTTL`, the metadata and the fencing counter in one read-only script
//!   ([`inspect`]); the queued waiters are counted by [`Backend::queued_waiters`](lockcore::backend::Backend::queued_waiters).
//! * **Queue** (exclusive waiters, not under `interop=`): `<namespace>:{<escaped name>}:queue`
//!   and `:queuexp`, two sorted sets of owner tokens (arrival order; expiry of the entry on the
//!   server's `TIME`, a little past the waiter's next attempt). The acquire script gives a free
//!   lock only to the queue's live head (anyone while it is empty: a `try_lock` is refused
//!   while waiters queue), and a waiting `lock()` that loses joins or refreshes its entry in
//!   the same script. A release grants the lock to the head (below), or with
//!   `handover=wake` publishes `q:<head token>`: only the head acts, so a hand-over costs the
//!   release (and with `wake` one attempt) however many clients wait (see `queue` in the source).
//! * **Hand-over by grant** (`handover=grant`, the default; locksmith's layout, not under `interop=` or
//!   with `min_replicas`): a queued waiter's attempts also leave, in `…:grants`, its attempt's
//!   number, a claim TTL (`min(ttl, poll_ms + 2 s)`), whether it wants a fencing token and its
//!   holder metadata. The release script then gives the lock to the queue's live head as the
//!   acquire script would (lock and holder keys with the claim TTL, the fencing counter moved),
//!   takes it out of the queue and publishes `g:<head> <attempt> <fence>`: the head holds as
//!   soon as the message arrives, one trip instead of a wake-up and an attempt. Its validity
//!   counts from the send of the refused attempt the grant names (the grant ran after that
//!   attempt reached the server; no clock agreement), and its first renewal (within a third of
//!   the claim) extends it to the TTL. A grant naming an earlier attempt than the waiter's
//!   last refused one is stale and ignored; a grant too old to hold on (or for a lease without
//!   auto-renewal) is turned into an attempt, which wins on the waiter's own token. A lost
//!   grant message is found the same way by the safety poll; a waiter that crashed while
//!   queued or once granted holds the name for the claim TTL at most; a waiter that gives up
//!   after a grant gives it back. `tests/handover_model.rs` model-checks the rule (stateright).
//! * **Waiting** (`lock()`): one attempt; if held, subscribe to the lock's channel, attempt again
//!   (so a release between the first attempt and the subscription is not missed), then sleep
//!   until a release message naming this waiter as the queue's head (shares: any release
//!   message, which wakes every reader of every client at once, and one permit waiter per
//!   client), the holder's `PTTL` (expiry publishes nothing; only the queue's head, or for
//!   shares one waiter per client and name, sleeps until it: no herd at expiry), the
//!   safety-net poll (`poll_ms`, jittered; it also keeps the queue entry alive) or the
//!   deadline, whichever comes first. Each client has one RESP3 pub/sub connection (opened at
//!   connect on a single node, where it subscribes to the namespace's revocation notices, see
//!   [`Capabilities::revoke_detection`](lockcore::Capabilities::revoke_detection); on a cluster on the first wait; resubscribing after
//!   reconnects) shared by all its waiters; waiters of one name share one subscription.
//!   A name's subscription lingers a second after a wait ends (`linger`): a client that waits
//!   for it again meanwhile (a worker looping on a busy lock) sends no `SUBSCRIBE` /
//!   `UNSUBSCRIBE` pair, and starts its wait with the subscribed attempt alone.
//!
//! # URL
//!
//! `redis[s][+cluster]://[[user]:password@]host[:port][,host[:port]...][/db][?params]`.
//! User name and password are percent-decoded (`redis://:pw@h` for `requirepass`,
//! `redis://user:pw@h` for an ACL user). Query parameters (anything else is refused with
//! [`ErrorKind::InvalidConfig`](lockcore::ErrorKind::InvalidConfig)):
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `namespace` | `locksmith` | key prefix, `[A-Za-z0-9_.:-]{1,64}` |
//! | `min_replicas` | `0` | after winning or extending, `WAIT` for this many replicas; too few: release (or do not extend) and fail with `Unavailable` |
//! | `replica_timeout_ms` | `100` | the `WAIT` timeout |
//! | `tls_ca` | system roots | PEM file of the CA that signed the server certificate (`rediss` only) |
//! | `poll_ms` | `1000` | safety-net poll of a notified waiter (jittered in `[poll/2, poll]`) |
//! | `connect_timeout_ms` | `2000` | connection timeout |
//! | `response_timeout_ms` | `2000` | per-command response timeout |
//! | `interop` | none | `redis-py` or `redisson`: keep locks on that client's layout (below) |
//! | `handover` | `grant` | `grant`: a release gives the lock to the next exclusive waiter itself (below); `wake`: it wakes that waiter, which then attempts |
//!
//! # Sharing locks with redis-py or Redisson (`interop=`)
//!
//! With `interop=redis-py` a lock is what redis-py's `Lock` (4.3.4) keeps: a string at the
//! exact lock name (no namespace) holding the owner's token, with a TTL. With
//! `interop=redisson` it is Redisson's `RLock` (4.7.0): a hash at the exact name, one field
//! `<uuid>:1` with count 1, a `PEXPIRE`; a release publishes `0` on
//! `redisson_lock__channel:{<name>}` (Redisson's waiters wake), and waiters here subscribe to
//! that channel (Redisson's releases wake them). In both, acquire, extend and release check
//! the peer's own record in one script, so each side excludes the other; the guard has **no
//! fencing token** (the peer keeps no counter: a token would not order its holders). redis-py
//! announces nothing on release: waiters here see a redis-py release at their next poll
//! (`poll_ms`). Single node or sentinel only (a cluster is refused), without `min_replicas`.
//! [`Interop`] and the capabilities' notes say what holds in each mode.
//!
//! **The default layout and the modes on one name exclude each other**, in both orders: a
//! mode's acquire script first checks the name's key on locksmith's default layout
//! (`<namespace>:{<name>}:lock`, same `namespace`) and its shares and permits, and writes that
//! key (its owner, its TTL) beside the peer's record; extend and release keep the two together.
//! So a fleet can move between the default layout and `interop=` one service at a time without
//! two holders, and the two modes exclude each other too. The real peers read only their own
//! key: a redis-py or Redisson client and a locksmith client on the default layout do not see
//! each other (a declared limit of the compatibility table: locksmith clients that share names
//! with a peer use its mode). See [`lockcore::Capabilities::compatibility_table`].
//!
//! `min_replicas` narrows the failover window of Redis's asynchronous replication but does not
//! close it: `WAIT` only says that replicas received the write, not that a failover will promote
//! one of them. A failover can therefore lose a fresh lock (two holders); the fencing counter
//! stays increasing through it because it never falls below the server clock. With
//! `min_replicas`, acquisitions and extensions both send their script and `WAIT` as one pipeline
//! (one round trip) over a connection of their own (`WAIT` blocks the connection it runs on);
//! an extension that too few replicas acknowledged fails with `Unavailable` and does not move
//! the lease's validity.
//!
//! # Failure modes
//!
//! * **Server restart without persistence** (`save ""`, no AOF; also a crash of a node with
//!   persistence that had not written the key yet): the restarted server has no lock keys, so
//!   **another client can win the lock as soon as the server answers again, while the holder
//!   still believes it holds** (two holders). The holder learns of the loss only at its next
//!   renewal (auto-renew: every `ttl / 3` by default, refused with `NotHeld`, which fires its
//!   lost signal) or, without renewal, when its validity ends: the window is at most one
//!   renewal interval plus a round trip after the restart, never more than the lease's
//!   validity. Fencing tokens stay increasing through it (see the acquire script), so a fenced
//!   resource rejects the old holder's writes. Run Redis with `appendonly yes` and
//!   `appendfsync always` to keep locks across a restart, or use fencing.
//! * **A server clock jumping forward** (or a key expired early by anything else): the key
//!   expires before the holder's validity ends, and another client can win while the holder
//!   believes it holds, until its next renewal is refused (or its validity ends). Keep server
//!   clocks NTP-slewed, not stepped; fence writes.
//! * **Failover** to a replica that missed the write: the same, see `min_replicas` above.
//! * **Holder process killed or paused**: the lock frees when its TTL runs out (never before);
//!   a paused holder learns of the loss when it resumes (its validity deadline has passed).
//!
//! Passwords never appear in `Debug`, [`Backend::describe`](lockcore::backend::Backend::describe), logs or error messages.
//!
//! The single-node protocol (scripts, key layout, connection setup, subscriptions) is the public
//! [`node`] module, shared with `lock-redlock`.
//!
//! # Where things are
//!
//! * The backend: `backend` (connecting, the `Backend` contract), `client` (the state a backend
//!   and its leases share), `attempt` (one acquire attempt), `wait` (a waiting `lock()`),
//!   `lease` (renewal, release), `capabilities`, `batch` (renewals in one script call).
//! * The protocol on one server: `keys` (the layout of a name), `script` (how a script call
//!   goes out), `grant` (how an acquire script's reply is judged, for every mode), `lua` (the
//!   Lua pieces every mode shares: the read-write check, taking a lock, waiters' entries, whom
//!   a release wakes), then one file per mode giving only its scripts: `exclusive`, `queue`
//!   (the exclusive waiters' queue), `shares` (readers and permits); `inspect`, `server`.
//! * Connections: `conn` (reconnecting command connections, sentinels, clusters), `subs`
//!   (pub/sub, one subscription per name per client), `linger` (a subscription kept a moment
//!   after a wait), `revoked` (revocation notices).
//! * `interop`: the peer layouts (`interop=redis-py`, `interop=redisson`).
#![deny(missing_docs)]

mod attempt;
mod backend;
mod batch;
mod capabilities;
mod client;
mod config;
mod conn;
mod error;
mod exclusive;
mod grant;
pub mod inspect;
mod interop;
mod keys;
mod lease;
mod linger;
mod lua;
pub mod node;
mod queue;
mod registration;
mod revoked;
mod script;
mod server;
mod shares;
mod subs;
mod wait;

pub use crate::backend::RedisBackend;
pub use crate::capabilities::script_family;
pub use crate::config::{Config, Handover};
pub use crate::interop::Interop;
pub use crate::registration::REGISTRATION;
