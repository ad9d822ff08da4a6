//! locksmith backend for Redlock: one lock over N independent Redis masters (`redlock://`,
//! `redlocks://` with TLS), won by a majority of them.
//!
//! Every node runs the single-node protocol of `lock-redis` ([`lock_redis::node`]: the same
//! acquire, extend and release scripts, key layout, name escaping and connection setup); this
//! crate adds the quorum on top.
//!
//! # The algorithm
//!
//! * **Acquire**: the acquire script (`SET lock token NX PX ttl`, no fencing counter) is sent to
//!   every node at once, each answer awaited at most `node_timeout_ms`. The lock is won when a
//!   majority (`N/2 + 1`) answered "won" and the validity `ttl - elapsed - drift` is still
//!   positive (drift: 1 % of the TTL + 2 ms, declared in [`Capabilities::drift_ppm`] and
//!   [`Capabilities::drift_fixed`]; the lease's validity deadline is `sent_at + ttl - drift`,
//!   with `sent_at` taken before the first request went out). A won call returns as soon as a
//!   majority said "won": a slow or dead node costs nothing while the others answer. A lost
//!   call reads every answer (each bounded by the node timeout), so that only the nodes that
//!   may hold its key are undone.
//! * **On failure** the attempt is undone on every node that may hold its key — the nodes that
//!   said "won" *and* those whose answer was lost or late — before anything else happens, so no
//!   partial key is left to split later votes. Inside a waiting `lock()` the undo is an
//!   owner-checked `PEXPIRE 1` (silent: waking every waiter for a key that was never a lock
//!   would make waiters storm), for `try_lock` and cancelled calls it is the owner-checked
//!   delete that also publishes. A cancelled call's undo runs in the request's background
//!   (`Locker::flush` waits for it).
//! * **Retry**: an attempt that won some nodes but not a majority was a split vote; it retries
//!   after a random delay that grows with consecutive splits (exponential backoff with full
//!   jitter), so contenders spread out instead of colliding again (no split-vote livelock). An
//!   attempt that won nothing waits for a notification.
//! * **Waiting** by notification: a release publishes on each node's release channel; a waiter
//!   subscribes on every node (lock-redis's pub/sub subscriptions, one connection per node per
//!   client) and wakes on the first message that concerns it. Each master keeps a queue of the
//!   waiters whose vote it refused (`…:queue` / `…:queuexp` beside the lock key, entries
//!   refreshed by every vote and expiring on that master's clock `poll_ms + 2 s` after it, or
//!   `k * poll_ms + 2 s` for a waiter whose safety vote comes every `k` polls: below), and
//!   a release's message names the head of that master's queue (`<release> q:<token>`): only
//!   that waiter wakes, not one waiter per client, so a hand-over costs the release and about
//!   one vote however many clients wait (`handover=wake`; by default the release grants the
//!   lock instead, and the hand-over costs the release alone: see **Hand-over by grants**). A waiter's place is the same on every master: its
//!   first vote learns its place on the lowest-numbered master that answered (that master's
//!   `TIME`), and its later votes bring that place (its ticket) to every master, so waiters
//!   that joined at once stand in one order everywhere and a release names the same head on
//!   every master; a newcomer without a ticket queues behind the tail. The queues grant
//!   nothing (a master may still disagree about the head for a vote; the first vote to win a
//!   majority wins: not strictly fair); a dropped or timed-out wait
//!   leaves every master's queue in the background. A release names itself in its message, the same
//!   on every master, so the copies from the other masters wake no second vote of that client
//!   once a vote won after it; a copy arriving while a vote is in flight makes that vote run
//!   again if it loses (the release may have reached that master after the vote did),
//!   or, for one waiter per client (expiry publishes nothing; one waiter, not all, comes back),
//!   at the moment the holder's keys expire on a majority (from the `PTTL`s the failed attempt
//!   saw), or at a jittered safety-net poll
//!   (`poll_ms`; a waiter with many ahead of it in the queue polls every `k` polls, `k = 1 +
//!   ahead / 16`, at most 8: 60 idle waiters send a master 44 scripts a second where they sent
//!   94). Subscriptions linger a few seconds after a wait, so a busy lock does not pay
//!   `SUBSCRIBE`/`UNSUBSCRIBE` on every wait, and a wait that finds them lingering begins
//!   with its subscribed vote, whose entries last the `k` polls of where this client's last
//!   wait joined the queues (a looping worker queues at the tail again: with 100 waiters,
//!   its safety vote after one poll was most of a hand-over's extra requests). Readers (shared waiters) are woken apart: every
//!   release message that names no queue head wakes all of them, in every client, and each
//!   votes (a writer's release lets them all in; one reader's vote covers no other's).
//! * **Hand-over by grants** (`handover=grant`, the default): a waiting writer numbers its
//!   votes (one number for all masters) and each vote it loses leaves, on every master that
//!   refused it, what a release needs to grant it the lock: the vote's number and a short claim
//!   TTL (`min(ttl, poll_ms + 2 s)`, as long as a dead queue entry lasts). Each master's
//!   release (the same script as a single node's grant, with the release named in the
//!   message) gives the lock to its own queue's head at once (its token, the claim TTL) and
//!   publishes `<release> g:<token> <vote>`. The waiter counts the grants for its last refused
//!   vote, from masters that refused that vote (a master whose answer was lost or late is
//!   undone, and its undo may come after the grant); **a majority of grants for one vote means
//!   held**, without a vote: valid from that vote's send for the claim minus the drift (each
//!   granting release ran after the vote reached its master), until the first renewal extends
//!   it to the TTL on every master (`Acquired::with_granted_ttl`). A grant naming an older
//!   vote is ignored. A minority of grants is waited on for two round trips of the refused vote
//!   (at most a node timeout: the rest of that release's grants are on their way, or lost, or
//!   went to another waiter), then the waiter votes: it wins on its granted masters
//!   (its own key there), or loses and its undo gives the grants back at once (an owner-checked
//!   `PEXPIRE 1`), so the other waiters are not held up for a claim. A grant whose message is
//!   lost is found by the next vote (the safety poll): its own key holds. A waiter that gives
//!   up or is cancelled leaves every queue and gives its grants back; one that crashed once
//!   granted holds the name for the claim, never the lock's TTL. Too little claim left (under
//!   a third): the waiter votes instead (it wins on its own keys, which the vote extends to
//!   the TTL). A lease that is not renewed in the background (`no_auto_renew`) asks for no
//!   grants: its validity would stay the claim's, so it is woken to vote as with `wake`. Readers are not granted (a
//!   reader's release wakes as before). Model-checked in `tests/handover_model.rs` (three
//!   masters: mutual exclusion, and every believed hold backed by its key on a majority).
//!   `handover=wake` keeps the wake-up path above.
//! * **Extend**: owner-checked compare-and-`PEXPIRE` on every node; it succeeds only when a
//!   majority confirmed within the validity, which is recomputed from the moment the renewal was
//!   sent (confirmations are awaited that long, not only one node timeout). When a majority refuses, the lease is reported `NotHeld` (the guard's lost signal
//!   fires); when too few nodes answer, the renewal fails and the contract fires the lost signal
//!   at the validity deadline. Each renewal also **repairs the hold**: on a master where the
//!   acquire did not place the key (a split vote under contention leaves a lock on exactly a
//!   majority) and the name is free, it takes the key now, so a lock spreads to every master
//!   that answers and one master lost later does not end it. A master that had the key and
//!   lost it (revoked, expired early, restarted empty) is never taken back: the never-placed
//!   masters are a minority, so a repair alone never makes a majority, and a `force_release`
//!   stays final. A renewal that fails undoes the repairs of its round (also one landing
//!   after the failure), so a renewal in flight at a `force_release` leaves no key behind.
//! * **Release**: owner-checked compare-and-delete (publishing on the node's channel) sent to
//!   every node at once; released when a majority confirmed (the rest finish in the
//!   background). Confirmations are awaited until the lease's validity ends (at least one node
//!   timeout), so a lock that sits on exactly a majority is not reported unreleased because one
//!   of its masters answered late.
//! * **Revocation**: a `force_release` deletes the lock on every master and publishes the owner
//!   tokens it took away on each master's revocation channel (`<namespace>:revoked`), which
//!   every client subscribes to on every master at connect (and again after a reconnection);
//!   the holder's lost signal fires on the first notice, not at its next renewal
//!   ([`Capabilities::revoke_detection`](lockcore::Capabilities::revoke_detection)).
//! * **Nodes down**: with a minority down, locks work as before (a held lock too, once a
//!   renewal has repaired it onto every master that answers: a lock standing on exactly a
//!   majority survives one of them going down only after that renewal); with a majority down, attempts
//!   fail with `Unavailable` at once (a node's failure counts when its connection errs or its
//!   per-node timeout passes). Nodes that were down at connect time, or later, are reconnected
//!   in the background; `connect` itself needs a majority reachable.
//!
//! # Read-write locks
//!
//! [`LockMode::Shared`](lockcore::LockMode::Shared) (readers together, a writer alone) runs
//! the read-write protocol of a single Redis node ([`lock_redis::node::acquire_share`] and
//! the share-aware [`lock_redis::node::acquire_waiting`]: the same scripts and keys) on every
//! master, with the quorum of the exclusive lock on top:
//!
//! * **A reader** holds a share (an entry of a sorted set beside the lock key, expiring on the
//!   master's clock) on a majority of the masters. A master grants it unless a writer holds
//!   the lock key there or a waiting writer's mark is there. The vote, the validity
//!   (`ttl - elapsed - drift`, measured from before the first request), the undo of a failed
//!   attempt on every master that may hold its share (owner-checked; a waiting reader's undo
//!   is silent, a `try_lock`'s or a cancelled call's publishes), the split-vote back-off, the
//!   waiting by notification, the renewal (granted when a majority confirmed within the
//!   validity recomputed from its send) and the release (owner-checked on every master,
//!   released when a majority confirmed) are the exclusive lock's, as is the cancellation
//!   clean-up (the same background undo, `Locker::flush` waits for it).
//! * **A writer** holds the lock key on a majority, as an exclusive lock does; a master
//!   refuses it while live shares are there.
//! * **Safety**: any two majorities of the N masters share at least one master, and that
//!   master grants a reader and a writer of one name never at once (one script decides, the
//!   share set and the lock key are checked together). So while a reader holds a majority no
//!   writer can win one, and the other way round. This holds under the assumptions the
//!   exclusive lock needs, and fails where it fails (see below): a master that restarts
//!   without persistence before the leases end forgets the shares and the lock key it
//!   granted, and counts again for the other side (a writer beside readers: the fault test
//!   `restarted_empty_master_lets_a_writer_beside_a_reader` shows it), as does a master whose
//!   clock jumps forward and expires them early. Run the masters with `appendonly yes` +
//!   `appendfsync always`, or delay restarts by one max TTL.
//! * **A waiting writer is not starved by readers**: each of its votes marks it as the waiting
//!   writer (`…:writer`, for `poll_ms` + 1 s past that vote, renewed by every vote) on every
//!   master where it found live shares, and joins that master's queue of waiters, so the last
//!   reader's release there wakes it. A reader is refused on a master with the mark.
//!   * **Marks on a majority** (the readers it waits for hold a majority, so after one vote
//!     that reached them the writer's marks are on at least that majority): no new reader can
//!     win a majority, since every majority includes a marked master. The readers holding
//!     leave or expire, and the writer wins at its next vote.
//!   * **Marks on a minority** (masters that did not answer the writer's vote, or that held no
//!     share when it arrived): a new reader can still win a majority of unmarked masters and
//!     join the readers, and the writer waits for it too. Its next vote marks every master
//!     where it then finds shares, which includes the new reader's majority: readers keep
//!     overtaking the writer only while its votes do not reach a majority of the masters
//!     holding shares. Not fair beyond that: readers and writers are not ordered among
//!     themselves.
//!   * **A writer that gives up** (timed out, cancelled, crashed) leaves every master's queue
//!     (in the background), and its marks expire within `poll_ms` + 1 s of its last vote:
//!     readers are held back that long at most, never for the readers' TTL.
//! * **No fencing tokens** in either mode (see below); the masters keep no counter for shares
//!   either.
//!
//! # What Redlock does not give you
//!
//! Read this before choosing Redlock: it is a lock for efficiency (avoiding duplicate work), not
//! for correctness. Where two holders at once would corrupt data, use a backend with fencing
//! tokens and have the resource check them.
//!
//! * **No fencing tokens.** A master that restarts without persistence forgets both the lock
//!   keys and any counter, so no per-node counter stays monotonic; the capability is declared
//!   absent. Where a paused or slow holder must not corrupt a resource, use a backend with
//!   fencing (ZooKeeper, etcd, PostgreSQL/MySQL lease, single Redis).
//! * **Two holders after a node restarts empty** before the TTL ends: the node votes again, and
//!   a new client can win a majority with it while the old holder still believes it holds the
//!   lock. The fault test `restarted_empty_master_allows_a_second_holder` (`tests/faults.rs`)
//!   shows it. Run the masters
//!   with `appendonly yes` + `appendfsync always`, or keep a restarted master out of service for
//!   one max TTL ("delayed restart"), to avoid it.
//! * **Two holders after a clock jump** on a node: a node whose clock runs fast expires the key
//!   early (simulated with `PEXPIRE`, as a forward jump would). The fault test
//!   `early_expiry_on_a_master_allows_a_second_holder` (`tests/faults.rs`) shows it; the same
//!   test shows that with the key on all five masters one early expiry is not enough.
//! * **The node timeout is a trade-off** (see the URL section): short, a hung master costs
//!   little but a healthy master on a busy machine loses its vote (uncontended acquisitions
//!   refused); long, more of the validity can go to waiting. The default (a tenth of the TTL,
//!   50 ms..1 s) keeps at least 90 % of the validity.
//! * Timing assumptions: the validity is computed on the client's monotonic clock with the
//!   declared drift margin; a GC pause or a stopped process can outlive the validity without
//!   the holder noticing (no fencing, see above).
//!
//! # URL
//!
//! `redlock[s]://[[user]:password@]host[:port],[[user]:password@]host[:port],...[/db][?params]`:
//! each comma-separated node has its own user name and password (percent-encoded; a `,` in a
//! password is `%2C`). The path (database) and the query parameters apply to every node and are
//! those of the Redis backend (`namespace`, `tls_ca`, `poll_ms`, `connect_timeout_ms`,
//! `response_timeout_ms`, `handover`: `grant`, the default, or `wake`, see **Hand-over by
//! grants**; every master hands over the same way), plus:
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `node_timeout_ms` | a tenth of the TTL, within 50 ms..1 s | how long one node may take to answer an acquire before its vote counts as lost |
//!
//! **The node timeout.** The Redlock specification asks for a per-node timeout that is small
//! compared with the TTL: a dead or stopped node then costs an attempt little, and the validity
//! left after the vote stays close to the TTL. Without `node_timeout_ms` it is a tenth of each
//! lock's TTL, at least 50 ms and at most 1 s (100 ms for a 1 s TTL, 1 s for 10 s and more):
//! at most 10 % of the validity goes to waiting for votes, and a healthy master on a busy
//! machine (where a reply can take tens of milliseconds) does not lose its vote. A fixed short
//! timeout (the earlier default was 50 ms) loses votes under load and turns uncontended
//! acquisitions into refusals; set `node_timeout_ms` only to trade that for a faster give-up on
//! hung masters. The node timeout bounds votes only: an extend waits for a majority of
//! confirmations until its new validity would end, and a release until the lease's validity
//! ends (both at least one node timeout), because there a late confirmation is still good.
//!
//! `min_replicas` is refused (masters of a Redlock have no replicas to wait for). A node listed
//! twice is refused (each master votes once), also under another name (`localhost` and
//! `127.0.0.1`, two DNS names): masters are told apart by the `run_id` their server reports
//! (`INFO server`, random per redis-server process). Two nodes on one server fail `connect` with
//! `InvalidConfig`; found when a master unreachable at connect time connects later, the late
//! node never votes and every attempt of the client fails with `InvalidConfig` (held locks
//! still renew and release). A master whose user may not run `INFO` is not checked (a warning
//! says so). Passwords never appear in `Debug`,
//! [`Backend::describe`], logs or errors.
#![deny(missing_docs)]

mod acquire;
mod admin;
mod backend;
mod config;
mod inspect;
mod lease;
mod quorum;
mod registration;
mod slots;
mod subscriptions;
mod sync;
mod ticket;

use lockcore::backend::{AcquireRequest, Acquired, Backend, async_trait};
use lockcore::{Capabilities, Instant, LockInfo, LockName, Result};

pub use crate::backend::RedlockBackend;
pub use crate::config::Config;
pub use crate::registration::REGISTRATION;

#[async_trait]
impl Backend for RedlockBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    /// One attempt on every master at once; a failed attempt is undone (owner-checked delete
    /// that publishes) on every master that may hold its key before this returns.
    ///
    /// Cancel safety: a dropped attempt is undone on every master in the request's background
    /// (`Locker::flush` waits for it).
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        self.try_once(req).await
    }

    /// Waits by notification, retrying split votes after random delays (see the crate docs).
    ///
    /// Cancel safety: a dropped wait undoes its attempt in flight on every master in the
    /// request's background (`Locker::flush` waits for it) and leaves its subscriptions to
    /// linger a few seconds; nothing is left on the servers beyond that.
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        self.wait_for(req, deadline).await
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        RedlockBackend::force_release(self, name).await
    }

    /// One read per master in parallel; held when a majority has the same owner.
    ///
    /// Cancel safe.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        self.inspect_lock(name).await
    }

    /// `PING` on every master at once, until all answered.
    async fn round_trip(&self) -> Result<()> {
        self.ping().await
    }

    /// The bare Redlock primitive, as a plain client would run it: `SET NX PX` on every master
    /// at once, awaiting all answers, then the compare-and-delete script on every master at
    /// once, awaiting all answers.
    async fn bare_cycle(&self, name: &LockName) -> Result<()> {
        self.bare_redlock_cycle(name).await
    }

    /// The sum of `INFO commandstats` calls over every master.
    async fn server_requests(&self) -> Result<u64> {
        self.commands_served().await
    }

    fn describe(&self) -> String {
        self.inner.cfg.redacted.clone()
    }
}
