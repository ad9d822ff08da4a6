//! locksmith backend for Apache ZooKeeper (`zk://`): the Curator `InterProcessMutex` recipe
//! (with its read-write lock's readers, and semaphore permits), written against [`zookeeper_client`] so that fencing, cancellation and the lost signal follow
//! the locksmith contract.
//!
//! # URL
//!
//! `zk://host1:port1[,host2:port2...][/chroot][?params]` (port defaults to 2181). Parameters:
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `session_timeout_ms` | 10000 | session timeout asked of the server (it clamps it to its `[minSessionTimeout, maxSessionTimeout]`) |
//! | `namespace` | `locksmith` | top-level node (under the chroot) holding every lock |
//! | `digest` | none | `user:password` for ZooKeeper `digest` auth; every node this backend creates then gets the ACL creator-all + world-read |
//! | `lost_after_disconnect` | `0` | how long a disconnection may last before held leases are reported lost, as a fraction (0 to 0.5) of the session timeout; 0 is Curator's standard policy (a suspended connection is a lost lock) |
//! | `interop` | `curator` | whose node names this client makes: `curator` (Curator's protected-mode names, which Curator and go-zookeeper see) or `kazoo` (kazoo's names); see [Interoperating](#interoperating-with-other-lock-clients) |
//!
//! Unknown or malformed parameters are [`ErrorKind::InvalidConfig`](lockcore::ErrorKind) errors.
//! The digest password never appears in `Debug`, [`Backend::describe`], logs or errors. The
//! factor can also be set in code: [`ZkBackend::builder`].
//!
//! # ACLs
//!
//! With `digest` credentials the namespace node, every lock node and every contender node carry
//! the ACL *creator-all + world-read*: other identities can list and read them (to see who
//! waits), but cannot create contenders under a lock node, nor delete a holder's node (ZooKeeper
//! checks a delete against the parent's ACL). Give every client of one lock the same digest
//! identity. **Without credentials every node is world-writable** (`world:anyone` all): any
//! client of the ensemble can delete a holder's node and take the lock. Use `digest` wherever
//! the ensemble is shared.
//!
//! TLS: not wired yet; `zk://` connections are plain TCP. The `zookeeper-client` crate (0.11.2)
//! has TLS behind its `tls` feature, which depends on rustls and futures-rustls with their
//! default features: those compile the aws-lc-rs provider (the aws-lc-sys C library) beside
//! the ring provider every other backend here uses, and a dependent cannot turn a dependency's
//! default features off. With both providers compiled in, rustls has no default provider, and
//! `rustls::ClientConfig::builder()`, which zookeeper-client's TLS connect calls, panics unless
//! the application installs one (checked with zookeeper-client 0.11.2, rustls 0.23.48). Wiring
//! TLS needs a zookeeper-client whose rustls dependencies leave the provider to its user (a
//! patched copy, as `vendor/etcd-client` is for etcd), or this crate installing ring as the
//! process's default provider, a global choice a library should not make for its application.
//!
//! # The recipe
//!
//! A lock `name` is the node `<chroot>/<namespace>/<name.escaped()>` (a CONTAINER node, so the
//! server removes it once empty; persistent plus a best-effort delete on servers without
//! containers). Each contender creates an EPHEMERAL_SEQUENTIAL child
//! `_c_<owner-token>-lock-<seq>` (32 lowercase hex digits of token, 10 digits of sequence;
//! `<owner-token>__lock__<seq>` with `interop=kazoo`), lists the children (the list is sent
//! right behind the create, so both take one round trip) and holds the lock when its sequence is
//! the lowest among the contenders; otherwise it sets a one-shot watch on its immediate
//! predecessor only (one release wakes one waiter). When the predecessor was the only node
//! ahead, its deletion makes the waiter the holder without listing again. A contender is every
//! child that Curator, go-zookeeper or kazoo treats as one, whoever made it: a name ending in
//! `lock-`, `__lock__`, `__rlock__`, `__READ__` or `__WRIT__` (or locksmith's permit marker,
//! see [below](#shared-holders-and-permits)) and the 10-digit sequence, ordered by that sequence
//! (the lock node's one counter, shared by all its sequential children). A child with none of
//! these markers is made by no lock client and is not a contender.
//!
//! * `try_lock` lists the children first: on a held lock it costs one read and writes nothing.
//!   Where this client's last acquisition of the lock won, it creates at once instead (a client
//!   that just held a lock mostly finds it free): the first `try_lock` after that on a lock
//!   someone else took costs the create, the listing and a delete, and the next ones one read.
//! * A create whose reply was lost (connection loss) is recovered by the owner token in the
//!   name (Curator's protection mode); when a retry made a second node, every child with the
//!   caller's owner prefix is the caller's: the lowest is kept, the rest deleted, so a contender
//!   never waits on its own node.
//! * A predecessor that no live client can hold through (a node someone forged with a
//!   contender's name) is ignored for the rest of the backend's life, so it cannot block a lock
//!   forever: one created after this contender's node yet numbered before it (the server
//!   numbers sequential children in creation order, so its creator chose the number), or one
//!   of Curator's shape that is not ephemeral (Curator, go-zookeeper and locksmith only make
//!   ephemeral nodes). A persistent node of kazoo's shape is waited for: kazoo's
//!   `acquire(ephemeral=False)` holds through one. Any other forged contender blocks the lock
//!   as it blocks Curator and kazoo, until an operator deletes it (`force_release`); with
//!   `digest` credentials nobody else can create one.
//! * Fencing token: the creation zxid of the holder's node, which increases across successive
//!   holders even when the parent node was deleted and re-created.
//! * Holder metadata ([`lockcore::Holder`]): each contender node's data, written by its create;
//!   `inspect` lists the contenders and reads the head's data and stat (acquired at = the node's
//!   `ctime`, on the server's clock). A lock has no TTL of its own (it lives with the session).
//! * The lease is the ZooKeeper session: the server keeps the node while the session lives;
//!   the TTL is enforced by lockcore's validity watchdog, and `extend` sends a `sync` (to reach
//!   the leader) followed by one `exists` of the node, in one round trip.
//!
//! # Shared holders and permits
//!
//! Both are contender nodes in the same lock node, in the one queue ordered by sequence, with
//! the owner token, cancellation, renewal (the session), the lost signal and the fencing token
//! (the creation zxid, one counter across every mode) of the exclusive lock:
//!
//! * **Shared** ([`LockMode::Shared`](lockcore::LockMode)), Curator's
//!   `InterProcessReadWriteLock` layout: a reader's node is `_c_<owner-token>-__READ__<seq>`
//!   (`<owner-token>__rlock__<seq>` with `interop=kazoo`, kazoo's `ReadLock` name). A reader
//!   holds when no writer's node is lower and watches the last lower writer's node; a writer (a
//!   locksmith exclusive node, Curator's `__WRIT__`, any mutex node above) holds when it is the
//!   lowest node of any kind and watches its predecessor. So a waiting writer queues the readers
//!   that come after it (no writer starves), and locksmith's exclusive and shared locks on one
//!   name exclude each other.
//! * **Permits** ([`LockMode::Permit`](lockcore::LockMode)): a permit's node is
//!   `_c_<owner-token>-__PERMIT__<limit>-lock-<seq>` (the limit in the name: one listing shows
//!   every holder's limit; the `lock-` before the sequence makes Curator's `InterProcessMutex`,
//!   which sorts children by the text after the last `lock-`, queue behind permit holders
//!   instead of holding beside them; nodes of earlier releases, without it, still count). It holds when fewer than `limit` nodes are lower; otherwise it watches the
//!   `limit` nodes right before it (a release frees a place for the first waiter whichever
//!   holder leaves, and wakes at most the `limit` waiters right behind the node that left, never
//!   the whole queue). Not available with `interop=kazoo` (kazoo has no semaphore of this
//!   layout).
//! * A node of another use ahead in the queue, a permit of another limit or a permit beside a
//!   reader or writer, makes the acquisition fail with
//!   [`ErrorKind::Conflict`](lockcore::ErrorKind) at once (its node is deleted); the earlier
//!   use keeps the name. `inspect` lists every holder (each with its node's data, creation
//!   time and zxid), and a waiter is every node that does not hold yet.
//! * Other clients: Curator's read-write readers and writers and locksmith's readers exclude
//!   each other both ways, but Curator's read-write lock sorts locksmith's exclusive nodes
//!   (`-lock-`) after its own and does not wait for them, and Curator's `InterProcessMutex` does
//!   not see `__READ__` nodes: on a name shared with Curator's read-write lock, take the lock
//!   only in shared mode from locksmith. With `interop=kazoo`, kazoo's `ReadLock`, `WriteLock`
//!   exclude locksmith's readers and writers as kazoo's own, and kazoo's plain `Lock` excludes
//!   locksmith's writers; kazoo's plain `Lock` does not see readers (`__rlock__`), locksmith's
//!   or kazoo's own `ReadLock`'s (a limit of kazoo's recipe: on a name with readers, kazoo
//!   clients take a `WriteLock`, never a plain `Lock`). Curator's `InterProcessMutex` waits for
//!   locksmith's permit holders (their nodes end in `lock-<seq>`), and a locksmith permit asked
//!   for while a Curator mutex node is ahead is refused with `Conflict` (a name is a mutex or a
//!   semaphore). Curator's and kazoo's semaphores use other layouts and do not see locksmith's
//!   permits. The compatibility table ([`lockcore::Capabilities::compatibility_table`]) lists
//!   every pair. locksmith releases
//!   before these modes existed do not see readers or permits: upgrade every client of a name
//!   before using them on it.
//!
//! # Interoperating with other lock clients
//!
//! A lock `name` is the node `<chroot>/<namespace>/<name>` (names of `[A-Za-z0-9_-]` are not
//! escaped): give that path to the other clients. With the default settings, locksmith never
//! holds a lock that a Curator or go-zookeeper client holds on the same node, and they never
//! hold one locksmith holds:
//!
//! * **Curator** `InterProcessMutex` (`new InterProcessMutex(client, "/locksmith/NAME")`):
//!   Curator treats every child of the lock node as a contender, sorted by the text after the
//!   last `lock-` in its name (`StandardLockInternalsDriver.fixForSorting`), and waits on the
//!   child right before its own with a watch. locksmith's names have Curator's protected-mode
//!   shape (`_c_<id>-lock-<seq>`) by design, so both order one queue by the server's sequence
//!   and each wakes the other by deleting its node. What holds: mutual exclusion, FIFO
//!   fairness across both, notification both ways, locksmith's fencing token (the creation
//!   zxid of its node; Curator has none) and renewal (the ZooKeeper session, on both sides).
//!   Curator lacks fencing tokens and locksmith's lost signal (a Curator holder learns a loss
//!   from its connection-state listener). Curator's `InterProcessReadWriteLock` and
//!   semaphores: see [Shared holders and permits](#shared-holders-and-permits).
//! * **go-zookeeper** `zk.NewLock(conn, "/locksmith/NAME", acl)`: the same node names as
//!   Curator's protected mode, every child a contender ordered by its sequence (go-zookeeper
//!   `lock.go`, `parseSeq`); what holds and what it lacks as for Curator. Tested with Debian's
//!   2018 client, which fails with a parse error (rather than overlapping) on a child without
//!   `-` before its sequence, such as kazoo's names; later releases parse those too.
//! * **kazoo** `Lock` (`client.Lock("/locksmith/NAME")`) only sees children named
//!   `...__lock__<seq>` (and `__rlock__` for a `WriteLock`): it would not wait for locksmith's
//!   default nodes. Two ways: `interop=kazoo` (locksmith then names its nodes
//!   `<owner-token>__lock__<seq>`, which kazoo's `Lock`, `WriteLock` and `ReadLock` see as a
//!   writer), or, without changing locksmith, `client.Lock(path,
//!   extra_lock_patterns=["-lock-"])` on the kazoo side (kazoo 2.7.1 and later). In both,
//!   locksmith waits for kazoo's readers and writers (persistent ones from
//!   `acquire(ephemeral=False)` included), the queue is one FIFO by sequence, and each side
//!   wakes the other (kazoo watches its predecessor too). kazoo lacks fencing tokens and a lost
//!   signal beyond its connection listener. With `interop=kazoo` a name outside
//!   `[A-Za-z0-9_-]` is refused ([`ErrorKind::InvalidName`](lockcore::ErrorKind)): kazoo
//!   would lock the unescaped path.
//! * **Curator and kazoo do not exclude each other** on one node (kazoo ignores Curator's
//!   names; Curator orders kazoo's by their whole text, not by sequence), so a lock node that
//!   Curator clients use must not be used with `interop=kazoo`, nor by kazoo clients: locksmith
//!   in either mode waits for every peer's node, but it cannot make Curator see a kazoo-named
//!   node in sequence order. locksmith clients of both modes exclude each other.
//!
//! # Sessions and the lost signal
//!
//! One task per backend watches the session and keeps the registry of held leases; each held
//! lease also watches its own node (one `exists` and one task per lease). Held leases are
//! reported lost:
//! * at once when the connection drops ([`LostReason::ConnectionLost`](lockcore::LostReason::ConnectionLost); Curator's standard
//!   policy: a suspended connection is a lost lock, since the session may be expiring on the
//!   server), or after `lost_after_disconnect` x the session timeout when that is set;
//! * when a `sync` sent every third of the session timeout while leases are held is not
//!   answered within a third of the session timeout ([`LostReason::ConnectionLost`](lockcore::LostReason::ConnectionLost)): the
//!   connection looks alive but the server cannot reach the leader (a follower cut off from the
//!   quorum keeps answering pings while the leader expires the session);
//! * when the session expires ([`LostReason::SessionExpired`](lockcore::LostReason::SessionExpired)). The backend then opens a new
//!   session, as Curator does: later acquisitions work without rebuilding the backend, and
//!   waiters of the old session queue again on the new one within their deadline;
//! * when the node was deleted by someone else (an operator's force release, Curator's or
//!   kazoo's tools included): at once, when the server reports the lease's watch on its own
//!   node ([`LostReason::RenewalRefused`](lockcore::LostReason::RenewalRefused); `Capabilities::revoke_detection`), and in any case
//!   at the next `extend` (auto-renewal), which is refused.
//!
//! The remaining window: the lost signal comes at most 2/3 of the session timeout after the
//! holder last reached the leader, before the server can expire the session; a holder paused
//! (GC, SIGSTOP) across that point learns it only after it runs again, when another holder may
//! already work: only the fencing token protects the resource then.
//!
//! Each [`ZkBackend::connect`] opens its own session; clones of a `Locker` share it.
#![deny(missing_docs)]

mod admin;
mod backend;
mod compat;
mod config;
mod connect;
mod contenders;
mod errors;
mod inspect;
mod lease;
mod recipe;
mod registration;
mod session;
mod stats;
mod supervisor;

use lockcore::backend::{AcquireRequest, Acquired, Backend, async_trait};
use lockcore::{Capabilities, Instant, Result};

pub use crate::backend::ZkBackend;
pub use crate::config::{Config, Digest};
pub use crate::connect::ZkBuilder;
pub use crate::contenders::Interop;
pub use crate::registration::REGISTRATION;
pub use crate::stats::ZkStats;

#[async_trait]
impl Backend for ZkBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    /// One attempt: list the children (a held lock costs this one read); if free, create a
    /// contender node and keep it only if it holds (the lowest for a writer, no writer lower
    /// for a reader, fewer than the limit lower for a permit).
    ///
    /// Cancel safety: a dropped attempt deletes its node in the background (found by owner
    /// token if the create was still in flight).
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        self.run(req, false, None).await
    }

    /// Queues behind the current holders and waits on a watch of what it waits for (the
    /// immediate predecessor for a writer, the last lower writer for a reader, the `limit`
    /// nodes before it for a permit);
    /// after a session expiry, queues again on the new session.
    ///
    /// Cancel safety: a dropped or timed-out wait deletes its node in the background.
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        // A dropped attempt's guard deletes the node.
        lockcore::acquire_within(deadline, |wait, until| self.run(req, wait, until)).await
    }

    async fn force_release(&self, name: &lockcore::LockName) -> Result<bool> {
        ZkBackend::force_release(self, name)
            .await
            .map(|deleted| deleted > 0)
    }

    async fn round_trip(&self) -> Result<()> {
        self.exists_root().await
    }

    /// The bare primitive: create an EPHEMERAL_SEQUENTIAL node under the lock's node, then
    /// delete it (two requests), without listing or watching.
    ///
    /// Cancel safety: a dropped cycle may leave its node until the session ends.
    async fn bare_cycle(&self, name: &lockcore::LockName) -> Result<()> {
        self.bare_create_delete(name).await
    }

    /// The sum of `zk_packets_received` from the `mntr` four-letter command of every listed
    /// server (the server must whitelist `mntr`).
    ///
    /// Cancel safe.
    async fn server_requests(&self) -> Result<u64> {
        self.packets_received().await
    }

    /// Every holder's node (the head's for a writer; each reader's or permit's): its data
    /// (the holder's metadata), creation time and zxid.
    ///
    /// Cancel safe.
    async fn inspect(&self, name: &lockcore::LockName) -> Result<lockcore::LockInfo> {
        self.inspect_lock(name).await
    }

    /// The contender nodes that do not hold yet (one listing): behind a writer, behind the
    /// first writer after readers, or past the limit of a semaphore.
    ///
    /// Cancel safe.
    async fn queued_waiters(&self, name: &lockcore::LockName) -> Result<usize> {
        self.count_waiters(name).await
    }

    fn describe(&self) -> String {
        self.redacted_url()
    }
}
