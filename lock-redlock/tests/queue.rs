//! The masters' queues of waiters (see the crate docs, "Waiting"): a waiting lock() is queued
//! on every master that refused its vote, a release wakes the queue's head only, and a waiter
//! that gives up or is dropped leaves every queue (its entry does not wait for its TTL). Runs
//! on the shared test masters (`LOCK_TEST_REDLOCK_URL`, `LOCK_TEST_REDLOCK_URLS`).

use std::time::Duration;

use conformance::require_env;
use lock_redlock::RedlockBackend;
use lockcore::{Instant, LockName, LockOptions, Locker};

/// The test Redlock's URL and its masters' URLs (`None`, after saying so, when not set).
fn test_masters() -> Option<(String, Vec<String>)> {
    let (Some(url), Some(urls)) = (
        require_env("LOCK_TEST_REDLOCK_URL"),
        require_env("LOCK_TEST_REDLOCK_URLS"),
    ) else {
        return None;
    };
    Some((url, urls.split(',').map(str::to_owned).collect()))
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", fastrand::u64(..))
}

/// The entries of the queue of `key` (the lock key) on every master.
async fn queued_per_master(urls: &[String], lock_key: &str) -> Vec<i64> {
    let key = lock_key.replace(":lock", ":queuexp");
    let mut out = Vec::new();
    for u in urls {
        let mut c = redis::Client::open(u.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        out.push(
            redis::cmd("ZCARD")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap(),
        );
    }
    out
}

/// Polls `cond` (faultkit's poll, every 50 ms) until it holds, failing after a generous bound.
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    faultkit::wait_until(what, Duration::from_secs(10), || {
        let c = cond();
        async move { Ok(c.await) }
    })
    .await
    .unwrap();
}

/// Two clients queue behind a holder; the first gives up (a timeout), the second is dropped:
/// both leave every master's queue at once. A third then waits and is handed the lock by the
/// holder's release (woken as the head, well before its 10 s safety poll), and no entry is
/// left once it released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_leave_every_queue_and_the_head_is_woken() {
    let Some((url, urls)) = test_masters() else {
        return;
    };
    // A safety poll of 10 s: a hand-over within a few seconds comes from the release message.
    let url = format!("{url}?poll_ms=10000");
    let backend = RedlockBackend::connect(&url).await.unwrap();
    let name = LockName::new(unique("rl-queue")).unwrap();
    let key = backend.lock_key(&name);
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_timeout(Duration::from_secs(20));
    let holder = Locker::new(backend);
    let g = holder.try_lock(&name, &opts).await.unwrap().unwrap();

    let gives_up = Locker::new(RedlockBackend::connect(&url).await.unwrap());
    let short = opts.clone().wait_timeout(Duration::from_millis(300));
    assert!(gives_up.lock(&name, &short).await.is_err());
    gives_up.flush().await;
    assert_eq!(queued_per_master(&urls, &key).await, vec![0; urls.len()]);

    let dropped = Locker::new(RedlockBackend::connect(&url).await.unwrap());
    let task = {
        let (dropped, name, opts) = (dropped.clone(), name.clone(), opts.clone());
        tokio::spawn(async move { dropped.lock(&name, &opts).await })
    };
    eventually("the waiter is queued on every master", || async {
        queued_per_master(&urls, &key).await.iter().all(|n| *n == 1)
    })
    .await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    dropped.flush().await;
    assert_eq!(queued_per_master(&urls, &key).await, vec![0; urls.len()]);

    let next = Locker::new(RedlockBackend::connect(&url).await.unwrap());
    let task = {
        let (next, name, opts) = (next.clone(), name.clone(), opts.clone());
        tokio::spawn(async move { next.lock(&name, &opts).await })
    };
    eventually("the next waiter is queued on every master", || async {
        queued_per_master(&urls, &key).await.iter().all(|n| *n == 1)
    })
    .await;
    let released = Instant::now();
    g.release().await.unwrap();
    let g2 = tokio::time::timeout(Duration::from_secs(8), task)
        .await
        .expect("the queued waiter was not woken by the release")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(5));
    // Out of the queue of every master its vote won; a master the vote reached before the
    // holder's release refused it and keeps its entry, which the winner's own release takes out.
    g2.release().await.unwrap();
    next.flush().await;
    assert_eq!(queued_per_master(&urls, &key).await, vec![0; urls.len()]);
}

/// The queue of `lock_key` on the master at `url`, head first.
async fn queue_order(url: &str, lock_key: &str) -> Vec<String> {
    let key = lock_key.replace(":lock", ":queue");
    let mut c = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("ZRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .query_async(&mut c)
        .await
        .unwrap()
}

/// Two waiters whose votes reach two masters in opposite orders stand in opposite orders
/// there; once each brings its ticket (its place on the first master) to both, they stand in
/// the first master's order on both, and a newcomer without a ticket queues last on each
/// master, whatever the time on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_puts_a_waiter_at_one_place_on_every_master() {
    use lock_redis::node::{self, Config, Keys, Node, NodeAttempt, QueuePlace, WaitingVote};
    let Some((_, urls)) = test_masters() else {
        return;
    };
    let mut masters = Vec::new();
    for u in &urls[..2] {
        masters.push(
            Node::connect(&Config::parse(u).unwrap())
                .await
                .unwrap()
                .conn(),
        );
    }
    let name = LockName::new(unique("rl-ticket")).unwrap();
    let keys = Keys::new("locksmith", &name);
    let ttl = Duration::from_secs(30);
    let waiting = |ticket| WaitingVote {
        mark: Duration::from_secs(5),
        entry: Duration::from_secs(30),
        ticket,
        grant: None,
    };
    for m in &mut masters {
        let (won, _) = node::acquire_waiting(m, &keys, "holder", "h", ttl, WaitingVote::default())
            .await
            .unwrap();
        assert!(matches!(won, NodeAttempt::Won { .. }));
    }
    let mut vote = async |m: usize, token: &str, ticket: Option<u64>| {
        let (attempt, place) =
            node::acquire_waiting(&mut masters[m], &keys, token, "w", ttl, waiting(ticket))
                .await
                .unwrap();
        assert!(matches!(attempt, NodeAttempt::Held { .. }));
        place.expect("a refused waiting vote is queued")
    };
    let a0 = vote(0, "a", None).await.at;
    vote(1, "b", None).await;
    let b0 = vote(0, "b", None).await;
    assert_eq!(b0.ahead, 1);
    let b0 = b0.at;
    assert_eq!(vote(1, "a", None).await.ahead, 1);
    assert!(a0 < b0);
    assert_eq!(queue_order(&urls[0], &keys.lock).await, ["a", "b"]);
    assert_eq!(queue_order(&urls[1], &keys.lock).await, ["b", "a"]);

    assert_eq!(vote(1, "b", Some(b0)).await.at, b0);
    assert_eq!(
        vote(1, "a", Some(a0)).await,
        QueuePlace { at: a0, ahead: 0 }
    );
    assert_eq!(
        vote(0, "a", Some(a0)).await.at,
        a0,
        "the ticket's own master keeps it"
    );
    assert_eq!(queue_order(&urls[1], &keys.lock).await, ["a", "b"]);

    // A newcomer without a ticket goes last even where its time would come before the tail:
    // a ticket far in the future stands for a master whose clock runs ahead of this one.
    vote(1, "late", Some(u64::MAX / 4096)).await;
    let c1 = vote(1, "c", None).await;
    assert!(c1.at > u64::MAX / 4096);
    assert_eq!(c1.ahead, 3);
    assert_eq!(
        queue_order(&urls[1], &keys.lock).await,
        ["a", "b", "late", "c"]
    );
    for (m, token) in [
        (0, "a"),
        (0, "b"),
        (1, "a"),
        (1, "b"),
        (1, "late"),
        (1, "c"),
    ] {
        node::leave_queue(&mut masters[m], &keys, token)
            .await
            .unwrap();
    }
    for m in &mut masters {
        node::release(m, &keys, "holder").await.unwrap();
    }
}

/// Waiters that join at once (their first votes reaching the masters in different orders)
/// stand in one order on every master after their next vote, so that a release names the same
/// head everywhere; each then gets the lock in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_join_at_once_stand_in_one_order_everywhere() {
    let Some((url, urls)) = test_masters() else {
        return;
    };
    // Votes every 0.5-1 s besides the one right after subscribing.
    let url = format!("{url}?poll_ms=1000");
    let name = LockName::new(unique("rl-order")).unwrap();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_timeout(Duration::from_secs(60));
    let backend = RedlockBackend::connect(&url).await.unwrap();
    let key = backend.lock_key(&name);
    let holder = Locker::new(backend);
    let g = holder.try_lock(&name, &opts).await.unwrap().unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let client = Locker::new(RedlockBackend::connect(&url).await.unwrap());
        for _ in 0..4 {
            let (client, name, opts) = (client.clone(), name.clone(), opts.clone());
            tasks.push(tokio::spawn(async move {
                let g = client.lock(&name, &opts).await?;
                g.release().await
            }));
        }
    }
    eventually("16 waiters stand in one order on every master", || async {
        let mut orders = Vec::new();
        for u in &urls {
            orders.push(queue_order(u, &key).await);
        }
        orders[0].len() == 16 && orders.iter().all(|o| *o == orders[0])
    })
    .await;
    g.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("every waiter gets the lock in turn")
            .unwrap()
            .unwrap();
    }
}
