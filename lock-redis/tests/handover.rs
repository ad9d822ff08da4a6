//! The server-side hand-over (`handover=grant`) on the shared single node: a release grants the
//! lock to the queue's head, and the crash cases cost the next waiter the claim TTL at most,
//! never the lock's TTL. A "crashed" waiter is a token queued through the node API that never
//! acts again (what the server sees of a process killed while queued, or killed after its grant
//! was published). Skipped when `LOCK_TEST_REDIS_URL` is unset.

use std::time::Duration;

use conformance::require_env;
use lock_redis::RedisBackend;
use lock_redis::node::{self, AcquireWith, GrantAsk, NodeAttempt};
use lockcore::backend::Backend;
use lockcore::{Instant, LockName, LockOptions, Locker};

const POLL_MS: u64 = 500;
const LOCK_TTL: Duration = Duration::from_secs(30);

fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", fastrand::u64(..))
}

fn scaled(secs: f64) -> Duration {
    Duration::from_secs_f64(secs * conformance::time_scale())
}

fn grant_url(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}handover=grant&poll_ms={POLL_MS}")
}

/// The claim TTL a release gives (`min(ttl, poll + 2 s)`).
fn claim() -> Duration {
    Duration::from_millis(POLL_MS) + Duration::from_secs(2)
}

/// Queues `token` as a waiting attempt that asks for a grant, as a waiter's attempt does, and
/// never comes back (a crashed waiter).
async fn queue_dead_waiter(url: &str, name: &LockName, token: &str) {
    let cfg = node::Config::parse(url).unwrap();
    let n = node::Node::connect(&cfg).await.unwrap();
    let keys = n.keys(name);
    let with = AcquireWith {
        fencing: true,
        replicas: None,
        beside_shares: Some(Duration::ZERO),
        queue: Some(node::queue_entry_ttl(Duration::from_millis(POLL_MS))),
        grant: Some(GrantAsk {
            attempt: 1,
            claim: claim(),
        }),
    };
    let (attempt, _) =
        node::acquire_replicated(&mut n.conn(), &keys, token, "dead", LOCK_TTL, with)
            .await
            .unwrap();
    assert!(matches!(attempt, NodeAttempt::Held { .. }), "{attempt:?}");
}

/// Starts `waiter`'s `lock()` on `name` and returns it once the server's queue holds `queued`
/// entries (the server announces no queue entry, so its length is polled, with a deadline).
async fn spawn_queued_waiter(
    backend: &RedisBackend,
    waiter: &Locker,
    name: &LockName,
    opts: &LockOptions,
    queued: usize,
) -> tokio::task::JoinHandle<lockcore::Result<lockcore::LockGuard>> {
    let task = {
        let (waiter, name, opts) = (waiter.clone(), name.clone(), opts.clone());
        tokio::spawn(async move { waiter.lock(&name, &opts).await })
    };
    let end = Instant::now() + scaled(10.0);
    while backend.queued_waiters(name).await.unwrap() < queued {
        assert!(Instant::now() < end, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A release hands the lock over by a grant: the waiter holds with a fencing token above the
/// holder's, the lock key holds the waiter's token, and its renewal takes the claim to the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_grants_the_lock_to_the_waiting_head() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let url = grant_url(&url);
    let backend = RedisBackend::connect(&url).await.unwrap();
    let holder = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let waiter = Locker::new(backend.clone());
    let name = LockName::new(unique("grant")).unwrap();
    let opts = LockOptions::new().ttl(LOCK_TTL).wait_timeout(scaled(20.0));
    let g = holder.lock(&name, &opts).await.unwrap();
    let first = g.fencing_token().unwrap();
    let task = spawn_queued_waiter(&backend, &waiter, &name, &opts, 1).await;
    g.release().await.unwrap();
    let w = tokio::time::timeout(scaled(10.0), task)
        .await
        .expect("the grant did not reach the waiter")
        .unwrap()
        .unwrap();
    assert!(w.fencing_token().unwrap() > first);
    let mut conn = raw(&url).await;
    let owner: String = redis::cmd("GET")
        .arg(backend.lock_key(&name))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(owner, w.token().to_hex());
    // The first renewal (a third of the claim after the attempt's send) takes it to the TTL.
    let end = Instant::now() + scaled(10.0);
    loop {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(backend.lock_key(&name))
            .query_async(&mut conn)
            .await
            .unwrap();
        if pttl > i64::try_from(claim().as_millis()).unwrap() {
            break;
        }
        assert!(
            Instant::now() < end,
            "the claim was never extended ({pttl} ms)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(w.is_valid());
    w.release().await.unwrap();
}

/// A waiter that crashed while queued (or once granted: the server sees the same) costs the
/// next waiter the claim TTL at most, not the lock's TTL: the release grants the dead head a
/// claim, which runs out, and the next waiter (now the head) takes the lock at its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_head_costs_the_next_waiter_the_claim_at_most() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let url = grant_url(&url);
    let holder = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let backend = RedisBackend::connect(&url).await.unwrap();
    let waiter = Locker::new(backend.clone());
    let name = LockName::new(unique("grant-crash")).unwrap();
    let opts = LockOptions::new().ttl(LOCK_TTL).wait_timeout(scaled(25.0));
    let g = holder.lock(&name, &opts).await.unwrap();
    queue_dead_waiter(&url, &name, "0123456789abcdef0123456789abcdef").await;
    let task = spawn_queued_waiter(&backend, &waiter, &name, &opts, 2).await;
    let released = Instant::now();
    g.release().await.unwrap();
    let w = tokio::time::timeout(scaled(20.0), task)
        .await
        .expect("the next waiter never got the lock")
        .unwrap()
        .unwrap();
    let waited = released.elapsed();
    // The claim, then the head's wake at its expiry (or its safety poll), with room for a busy
    // machine; far below the lock's TTL.
    let bound = claim() + Duration::from_millis(POLL_MS) + scaled(1.5);
    assert!(waited <= bound, "waited {waited:?} (claim {:?})", claim());
    assert!(waited < LOCK_TTL / 3);
    assert!(
        waited >= claim() / 2,
        "the dead head's claim was not honoured ({waited:?})"
    );
    w.release().await.unwrap();
}

/// A grant whose message is lost (here: made by hand, no message at all, as when the waiter's
/// pub/sub connection dropped) is found by the waiter's safety poll: its next attempt finds
/// its own token holding, a win, with the grant's fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_grant_is_found_by_the_safety_poll() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let url = grant_url(&url);
    let backend = RedisBackend::connect(&url).await.unwrap();
    let holder = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let waiter = Locker::new(backend.clone());
    let name = LockName::new(unique("grant-lost")).unwrap();
    let opts = LockOptions::new().ttl(LOCK_TTL).wait_timeout(scaled(20.0));
    let g = holder.lock(&name, &opts).await.unwrap();
    let task = spawn_queued_waiter(&backend, &waiter, &name, &opts, 1).await;
    // The release script's grant, without its message.
    let lock = backend.lock_key(&name);
    let base = lock.strip_suffix(":lock").unwrap().to_owned();
    let mut conn = raw(&url).await;
    let head: Vec<String> = redis::cmd("ZRANGE")
        .arg(format!("{base}:queue"))
        .arg(0)
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    let head = head.into_iter().next().expect("a queued head");
    let fence: u64 = redis::cmd("INCR")
        .arg(backend.fence_key(&name))
        .query_async(&mut conn)
        .await
        .unwrap();
    let claim_ms = u64::try_from(claim().as_millis()).unwrap();
    let _: () = redis::pipe()
        .cmd("SET")
        .arg(&lock)
        .arg(&head)
        .arg("PX")
        .arg(claim_ms)
        .ignore()
        .cmd("ZREM")
        .arg(format!("{base}:queue"))
        .arg(&head)
        .ignore()
        .cmd("ZREM")
        .arg(format!("{base}:queuexp"))
        .arg(&head)
        .ignore()
        .cmd("HDEL")
        .arg(format!("{base}:grants"))
        .arg(&head)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let w = tokio::time::timeout(scaled(10.0), task)
        .await
        .expect("the safety poll never found the grant")
        .unwrap()
        .unwrap();
    assert_eq!(w.token().to_hex(), head);
    assert_eq!(w.fencing_token(), Some(fence));
    // Its attempt extended the claim to the lock's TTL.
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&lock)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pttl > i64::try_from(claim_ms).unwrap(), "{pttl}");
    w.release().await.unwrap();
    drop(g);
}

/// A waiter that leaves the queue (cancelled, timed out) after a release granted it the lock
/// gives the grant back: the lock is free at once for the next waiter, not after the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_leaving_after_its_grant_gives_it_back() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let url = grant_url(&url);
    let backend = RedisBackend::connect(&url).await.unwrap();
    let holder = Locker::new(backend.clone());
    let name = LockName::new(unique("grant-leave")).unwrap();
    let opts = LockOptions::new().ttl(LOCK_TTL);
    let g = holder.try_lock(&name, &opts).await.unwrap().unwrap();
    let token = "fedcba9876543210fedcba9876543210";
    queue_dead_waiter(&url, &name, token).await;
    g.release().await.unwrap();
    let mut conn = raw(&url).await;
    let owner: Option<String> = redis::cmd("GET")
        .arg(backend.lock_key(&name))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        owner.as_deref(),
        Some(token),
        "the release granted the head"
    );
    let n = node::Node::connect(&node::Config::parse(&url).unwrap())
        .await
        .unwrap();
    assert!(
        node::leave_queue(&mut n.conn(), &n.keys(&name), token)
            .await
            .unwrap()
    );
    let owner: Option<String> = redis::cmd("GET")
        .arg(backend.lock_key(&name))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(owner, None, "the grant was not given back");
    let again = holder.try_lock(&name, &opts).await.unwrap();
    assert!(again.is_some(), "the lock is not free after the leave");
}

/// A `force_release` that lands between the grant and the waiter taking it reaches the waiter
/// at once: its lost signal fires as the grant is taken, not at the first renewal (a third of
/// the claim, here 20 s). The waiter's client runs on a runtime of its own, stalled (its
/// thread blocked on a channel) from before the release to after the revocation, so both
/// messages wait in its pub/sub connection: the grant first, then the notice naming the
/// token it granted.
#[test]
fn a_revocation_between_grant_and_take_reaches_the_waiter_at_once() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    const TTL: Duration = Duration::from_secs(60);
    let sep = if url.contains('?') { '&' } else { '?' };
    // A long poll: the claim is the TTL, the first renewal 20 s away.
    let url = format!("{url}{sep}handover=grant&poll_ms=60000");
    let name = LockName::new(unique("grant-revoked")).unwrap();
    let opts = LockOptions::new().ttl(TTL).wait_timeout(scaled(30.0));
    let bound = scaled(3.0);
    assert!(
        bound < TTL / 3,
        "LOCK_TEST_TIME_SCALE too large for this test"
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Held before the waiter starts.
    let (backend, holder, g) = rt.block_on(async {
        let backend = RedisBackend::connect(&url).await.unwrap();
        let holder = Locker::new(backend.clone());
        let g = holder.lock(&name, &opts).await.unwrap();
        (backend, holder, g)
    });
    let (stall_tx, stall_rx) = tokio::sync::oneshot::channel::<()>();
    let (stalled_tx, stalled_rx) = tokio::sync::oneshot::channel::<()>();
    let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
    let waiter = {
        let (url, name, opts) = (url.clone(), name.clone(), opts.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let waiter = Locker::new(RedisBackend::connect(&url).await.unwrap());
                let task = tokio::spawn(async move { waiter.lock(&name, &opts).await });
                stall_rx.await.unwrap();
                stalled_tx.send(()).unwrap();
                // Blocks the runtime's one thread: no message is read until the test resumes it.
                resume_rx.recv().unwrap();
                let guard = task.await.unwrap().unwrap();
                let taken = Instant::now();
                let lost = tokio::time::timeout(bound, guard.lost().lost()).await;
                (lost.ok(), taken.elapsed())
            })
        })
    };

    rt.block_on(async {
        // Queued and subscribed to the name's channel (the server announces neither: polled,
        // with a deadline), so that the grant's message reaches the stalled client.
        let mut conn = raw(&url).await;
        let end = Instant::now() + scaled(10.0);
        loop {
            let (_, subscribed): (String, u64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(backend.channel(&name))
                .query_async(&mut conn)
                .await
                .unwrap();
            if subscribed > 0 && backend.queued_waiters(&name).await.unwrap() > 0 {
                break;
            }
            assert!(Instant::now() < end, "the waiter never queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stall_tx.send(()).unwrap();
        stalled_rx.await.unwrap();
        g.release().await.unwrap();
        assert!(
            holder.force_release(&name).await.unwrap(),
            "the release granted nothing to revoke"
        );
    });
    resume_tx.send(()).unwrap();
    let (lost, after) = waiter.join().unwrap();
    assert_eq!(
        lost,
        Some(lockcore::LostReason::RenewalRefused),
        "the revocation did not reach the waiter within {bound:?} of its lock() ({after:?})"
    );
}
