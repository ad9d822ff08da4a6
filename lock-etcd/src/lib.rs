//! locksmith backend for etcd v3 (`etcd://`, `etcds://`): the recipe of etcd's own mutex, done
//! so that fencing, fairness, cancellation and the lost signal follow the locksmith contract.
//!
//! # URL
//!
//! `etcd[s]://[user:password@]host1:port1[,host2:port2...][/prefix][?params]` (port defaults to
//! 2379; `etcds` is TLS with certificate verification). Every listed member is an endpoint; a
//! dead one does not stop [`EtcdBackend::connect`] while another answers.
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `ca` | none | PEM file of the CA that signed the servers' certificates (`etcds://`) |
//! | `domain` | the host | the name to verify in the server certificate (`etcds://`) |
//! | `timeout_ms` | 5000 | how long one request may take before it is `Unavailable` |
//!
//! `user:password` authenticates with etcd's RBAC (the user needs read-write permission on the
//! prefix). The password never appears in `Debug`, [`Backend::describe`], logs or errors.
//!
//! # The recipe
//!
//! A lock `name` owns the keys under `<prefix>/<name.escaped()>/` (the escaping has no `/`, so
//! no name's keys are a prefix of another's). Each acquisition attempt puts its own key
//! `<dir><lease id in hex>` (etcd's `concurrency.Mutex` layout; a shared or permit key adds its
//! mode, see below), attached to that lease, in one transaction; the key with the lowest create
//! revision holds the lock. A lease is reused only once its key is deleted, so a client locking
//! one name again and again reuses one key name, and etcd's index keeps one deleted key for it
//! until compaction instead of one per acquisition (the queue's prefix reads walk them all). A
//! waiter wakes only for the deletions of the keys ahead of it (the keys with a lower create
//! revision, which only ever go), so one release wakes one waiter: FIFO, no herd; when its
//! watch has seen every key ahead deleted it holds without another request. Ownership is always
//! checked by create revision, and renewal also by the lease carrying the key.
//!
//! * Uncontended `try_lock`/`lock`: one transaction ("if the directory is empty, put my key"),
//!   plus a keep-alive sent alongside it on the client's keep-alive stream when the lease is
//!   reused. Release: one transaction deleting the key only if its create revision is ours;
//!   re-sent at once, within the request timeout, when its connection breaks before the
//!   answer (the reply or the request may be what was lost; deleting by create revision twice
//!   removes nothing more), so a broken connection does not leave the lock held for its TTL.
//! * Waiting: one long-lived watch per client over the whole prefix, created once and so
//!   *synced* (etcd 3.4 delays events for watches created at a past revision by up to 100 ms,
//!   the reason Go's `concurrency.Mutex` hands over at ~40/s); waiters subscribe to it. Requests
//!   and the watch carry etcd's require-leader flag (a member cut off from the quorum cancels
//!   the watch and refuses requests, and the watch is re-opened elsewhere), and a waiter
//!   re-checks the queue at least once per lease TTL (1 to 10 s) even if its watch stays
//!   silent (a client from [`EtcdBackend::from_client`] keeps its own require-leader setting).
//! * Leases: one etcd lease per held lock (reused after a clean release), granted by the server
//!   (whole seconds, at least the server's minimum; the TTL granted is reported). The client
//!   keeps held and queued leases alive itself on one keep-alive stream (every TTL/3) until the
//!   guard is released or dropped; a crashed holder's lock frees when its lease expires, one TTL
//!   after its last keep-alive. A queued waiter's lease is kept alive through outages too (its
//!   place in the queue holds while the lease lives; a waiter whose lease did expire queues
//!   again at the end).
//! * Extend: with the TTL acquired with, one keep-alive (plus a read of the key, in parallel).
//!   etcd cannot change a lease's TTL, so another TTL moves the key to a new lease granted that
//!   TTL: a grant, then one transaction re-putting the key with the new lease if its create
//!   revision is still ours (a put keeps the create revision: same fencing token, same place in
//!   the queue, no waiter woken); the old lease is revoked in the background. If the answer to
//!   that transaction is lost (an error, or the future dropped), the new lease is kept alive
//!   too until the next `extend` or `release` reads which lease carries the key.
//! * A live holder whose lease ran out unrenewed deletes its key at the lease's end (the server
//!   itself expires leases only on a 500 ms sweep), so a lease ends at its TTL.
//! * Lost signal: the key deleted behind the holder (revoked, expired, admin delete) or a
//!   keep-alive of its lease refused ([`LostReason::RenewalRefused`](lockcore::LostReason::RenewalRefused)); the lease ran out
//!   unrenewed ([`LostReason::ValidityExpired`](lockcore::LostReason::ValidityExpired), as the contract's own validity deadline); and
//!   [`LostReason::ConnectionLost`](lockcore::LostReason::ConnectionLost) in one case only: after an extend to another TTL whose
//!   outcome is unknown, no keep-alive of the lease the key may have moved to was acknowledged
//!   before that lease may expire. (A held lease is renewed by the contract's `extend`, whose
//!   failures end the validity, not by a background keep-alive.) A deletion is matched to the
//!   held key by revision: a deletion of an earlier key of the same name never fires it.
//! * Fencing token: the key's create revision, which increases across holders, restarts and
//!   leader changes.
//! * Holder metadata ([`lockcore::Holder`]): the value of each contender's key, written by the
//!   acquiring put (a campaign's key holds its value instead: see *Leader election* below).
//!   `inspect` reads the queue (holders first, waiters behind) in one request and each holder
//!   lease's time to live in a second round trip.
//!
//! # Multi-locks
//!
//! An exclusive set ([`lockcore::Locker::try_lock_all`], [`lockcore::Locker::lock_all`]) is one
//! transaction: if the directory of every member is empty (no key at all under its prefix,
//! whatever the key's name: a holder, a waiter, an `etcdctl lock` key), put this set's key in
//! each, each on a lease of its own; else read the first key of each directory, which names
//! the busy member. A key put there is the only one of its directory, so it holds by the
//! recipe; everyone arriving later queues behind it. A set never jumps a queue, never holds
//! beside another client, and nobody sees part of it taken. Every member's key has the
//! transaction's revision as create revision (its fencing token, still above every earlier
//! token of its name). A dropped attempt revokes the leases, removing any key that landed.
//!
//! # Shared holders and permits
//!
//! Readers ([`LockMode::Shared`](lockcore::LockMode::Shared)) and semaphore permits
//! ([`LockMode::Permit`](lockcore::LockMode::Permit)) queue in the same directory, one key
//! each, with its own lease (TTL, renewal, lost signal as above) and its create revision as
//! fencing token (one counter across modes). The mode is a suffix of the key's name
//! (`:shared`, `:permit-<limit>`; none for exclusive, whose keys are named as before), so the
//! keys-only reads of the queue show it at no cost. By the keys ahead of it, as etcd's
//! `recipes.RWMutex` and a counting semaphore over the mutex's queue: an exclusive key holds
//! when none is ahead; a shared key when no exclusive one is (so a waiting writer holds up the
//! readers behind it, and readers cannot starve writers); a permit key when fewer than `limit`
//! are. A waiter waits only for the deletions that can let it in (a reader for the last writer
//! ahead, a permit for as many of the keys ahead as it is places over the limit, counted on the
//! client's watch), then looks once: one release wakes one waiter. A shared or permit
//! `try_lock` that may join the holders puts its key only if no key was created since it looked
//! (two transactions). A request that finds a semaphore with another limit ahead of it, or a
//! semaphore beside a mutex or read-write lock, fails at once with
//! [`ErrorKind::Conflict`](lockcore::ErrorKind::Conflict) (a waiting one withdraws its key
//! first). An etcd `concurrency.Mutex` sees readers and permit holders as holders (it waits for
//! every key ahead: safe), and its key reads as exclusive here (a permit request beside it is a
//! conflict).
//!
//! # Interoperating with other lock clients
//!
//! etcd's own `concurrency.Mutex` (Go; `etcdctl lock`, and the etcd `v3lock` service's `Lock`
//! RPC, which runs the same Mutex) shares a lock with locksmith with the default settings, no
//! setting needed: `etcdctl lock locksmith/NAME -- CMD` and locksmith's lock `NAME` (default
//! prefix `locksmith`) exclude each other. The Mutex puts the key `<pfx>/<lease id in hex>`
//! and holds when its key has the lowest create revision of all keys under `<pfx>/`
//! (`client/v3/concurrency/mutex.go`), whatever their names; locksmith does the same over the
//! same keys. So both order one queue by create revision, and each wakes the other by deleting
//! its key (the Mutex waits with a watch on the last key created before its own, locksmith on
//! its whole-prefix watch). What holds: mutual exclusion, FIFO fairness, notification both ways,
//! fencing (one counter for both: the key's create revision, which `etcdctl lock -- CMD` passes
//! to CMD as `ETCD_LOCK_REV`, and which is locksmith's fencing token), renewal (each side keeps
//! its own lease alive). What the peer lacks: locksmith's lost signal (the Mutex's holder
//! learns a loss only from its session's `Done` channel) and an unrenewed end (an `etcdctl
//! lock` holder that crashed frees the lock when its session lease expires, 60 s by default).
//! Give the Mutex the prefix [`EtcdBackend::lock_prefix`] reports, without its trailing `/`:
//! names outside `[A-Za-z0-9_-]` are percent-encoded (`a.b` is `locksmith/a%2Eb`).
//!
//! # Leader election
//!
//! [`Locker::campaign`](lockcore::Locker::campaign) is lockcore's election (the leader holds
//! the name's lock) on the layout of etcd's own `concurrency.Election` (Go; `etcdctl elect
//! NAME PROPOSAL`, `etcdctl elect -l NAME`, and the etcd `v3election` service, which runs the
//! same Election), no setting needed: the election `NAME` of etcd's side is locksmith's
//! [`EtcdBackend::lock_prefix`] without its trailing `/` (`locksmith/NAME` by default), as for
//! the Mutex. The Election puts `<pfx>/<lease id in hex>` with the proposal as the key's value
//! and leads when every key created before its own under `<pfx>/` is gone; its `Leader` and
//! `Observe` read the key with the lowest create revision (`client/v3/concurrency/election.go`).
//! A campaign's key is locksmith's queue key (named as every acquisition's, see *The recipe*),
//! and its value is the campaign value alone, as raw bytes, in place of the holder metadata
//! ([`AcquireRequest::campaign`](lockcore::backend::AcquireRequest::campaign)). So:
//!
//! * one leader across both: both order one queue by create revision, and each wakes the other
//!   by deleting its key (resign, or the leader's lease ending);
//! * the value: `etcdctl elect -l` prints a locksmith leader's value (after its key), and
//!   [`Locker::leader`](lockcore::Locker::leader) and
//!   [`Locker::watch_leader`](lockcore::Locker::watch_leader) report an `etcdctl elect`
//!   leader's proposal as its value ([`LockInfo::value`](lockcore::LockInfo::value));
//! * the term: one counter for both, the leader key's create revision (the Election's `Rev()`,
//!   locksmith's fencing token and [`Leadership::term`](lockcore::Leadership::term)).
//!
//! What differs: a locksmith leader's [`Leader::holder`](lockcore::Leader::holder) is `None`
//! on etcd (host and process id would have to share the key's value with the proposal); an
//! empty campaign value reads back as no value (an empty value is a
//! Mutex key's), and a value that is itself holder metadata (`{"v":1,...}`) as that
//! metadata's label; the peer lacks locksmith's lost signal, and an `etcdctl elect` leader
//! that crashed is replaced only when its session lease expires (60 s by default; on SIGINT or
//! SIGTERM it resigns at once). The Election's `Proclaim` (a new value without a new term) has
//! no locksmith counterpart: a locksmith leader keeps the value it campaigned with (a peer
//! leader's proclaimed value is what [`Locker::leader`](lockcore::Locker::leader) reads).
#![deny(missing_docs)]

mod admin;
mod backend;
mod compat;
mod config;
mod connect;
mod errors;
mod inspect;
mod keeper;
mod lease;
mod members;
mod metrics;
mod modes;
mod pool;
mod queue;
mod registration;
mod set;
mod watch;

use lockcore::backend::{AcquireRequest, Acquired, Backend, SetAttempt, async_trait};
use lockcore::{Capabilities, Instant, LockInfo, LockName, Result};

pub use crate::backend::{EtcdBackend, EtcdStats};
pub use crate::config::Config;
pub use crate::registration::REGISTRATION;
/// The etcd client this backend speaks through (etcd-client 0.21.1 with its gRPC code checked in,
/// so it builds without `protoc`: `vendor/etcd-client/README.md`). Build the client you pass to
/// [`EtcdBackend::from_client`] with it.
pub use etcd_client;

#[async_trait]
impl Backend for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    /// One transaction: put this acquisition's key only if the lock has no key at all. A shared
    /// or permit request that finds holders it may join puts its key in a second one, only if
    /// no key was created since it looked.
    ///
    /// Cancel safety: a dropped attempt revokes its lease in the background (which removes a
    /// key that may have landed); at worst the key dies with the lease after the TTL.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        self.run(req, false).await
    }

    /// Queues (one transaction) and waits on the client's watch for the deletions that let it
    /// in (an exclusive waiter's predecessor's; see the crate docs for shares and permits). A
    /// request whose mode conflicts with a key ahead withdraws its key and fails at once.
    ///
    /// Cancel safety: a dropped or timed-out wait deletes its queue key in the background
    /// (covered by [`lockcore::Locker::flush`]); at worst the key dies with its lease.
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        lockcore::acquire_within(deadline, |wait, _| self.run(req, wait)).await
    }

    /// One transaction for the whole set: if every member's directory is empty, put one key
    /// in each (each on its own lease), else read the first key of each (see the crate docs).
    ///
    /// Cancel safety: a dropped attempt revokes every member's lease in the background (which
    /// removes a key that may have landed); at worst the keys die with their leases after the
    /// TTL.
    async fn try_acquire_all(&self, reqs: &[AcquireRequest]) -> Result<SetAttempt> {
        self.try_set(reqs).await
    }

    /// Deletes every key of the lock (admin delete).
    ///
    /// Cancel safety: dropping the future may or may not have freed the lock.
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        EtcdBackend::force_release(self, name).await.map(|n| n > 0)
    }

    /// The queue in one read, then each holder's lease; a holder's key value is its metadata,
    /// its name's suffix its mode.
    ///
    /// Cancel safe.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        self.inspect_lock(name).await
    }

    /// A linearizable read of one key: the cheapest request that goes through the leader.
    ///
    /// Cancel safe.
    async fn round_trip(&self) -> Result<()> {
        self.read_one_key().await
    }

    /// `Txn(if create_revision(key) == 0 then put(key, lease))`, then `Delete(key)`, with a
    /// long-lived lease granted once.
    ///
    /// Cancel safety: dropping the future may leave the key until the lease expires (60 s).
    async fn bare_cycle(&self, name: &LockName) -> Result<()> {
        self.bare_put_delete(name).await
    }

    /// The keys under the lock's prefix that do not hold (one keys-only read).
    ///
    /// Cancel safe.
    async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        self.count_waiters(name).await
    }

    /// The sum of `grpc_server_msg_received_total` from the first member's `/metrics`: every
    /// unary request and every message on a stream (keep-alives, watch requests).
    ///
    /// Cancel safe.
    async fn server_requests(&self) -> Result<u64> {
        metrics::requests(&self.inner.config).await
    }

    fn describe(&self) -> String {
        self.inner.config.redacted()
    }
}
