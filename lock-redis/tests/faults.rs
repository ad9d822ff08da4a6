//! Restarts, outages and failovers, each on redis-server processes the test starts itself
//! (never the shared test servers).

use std::time::Duration;

use faultkit::{RedisServer, wait_until};
use lock_redis::RedisBackend;
use lockcore::{Instant, LockName, LockOptions, Locker};

fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", fastrand::u64(..))
}

fn scaled(secs: f64) -> Duration {
    Duration::from_secs_f64(secs * conformance::time_scale())
}

/// A plain connection to `server`, for inspection.
async fn raw(server: &RedisServer) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await
}

async fn numsub(server: &RedisServer, channel: &str) -> i64 {
    let Ok(mut c) = raw(server).await else {
        return 0;
    };
    redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async::<(String, i64)>(&mut c)
        .await
        .map(|(_, n)| n)
        .unwrap_or(0)
}

/// An outage of 2.5 s (well past the ~1 s after which the old connection wrapper gave up): the
/// holder's first command after it succeeds (no cached error), and a waiter, whose safety-net
/// poll is a minute away, is woken by the release because its subscription was restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_wakes_on_release_after_an_outage() {
    let mut server = RedisServer::start_persistent().await.unwrap();
    let url = format!("{}?poll_ms=60000", server.url());
    let holder = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let waiter_backend = RedisBackend::connect(&url).await.unwrap();
    let waiter = Locker::new(waiter_backend.clone());
    let name = LockName::new(unique("outage")).unwrap();
    let channel = waiter_backend.channel(&name);

    let long = LockOptions::new().ttl(Duration::from_secs(120));
    let g = holder.try_lock(&name, &long).await.unwrap().unwrap();
    let task = {
        let (waiter, name) = (waiter.clone(), name.clone());
        let opts = long.clone().wait_timeout(Duration::from_secs(100));
        tokio::spawn(async move { waiter.lock(&name, &opts).await })
    };
    wait_until("the waiter is subscribed", scaled(15.0), || async {
        Ok(numsub(&server, &channel).await >= 1)
    })
    .await
    .unwrap();

    server.process().kill();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.restart().await.unwrap();
    // The append-only file brought the lock back: the holder still holds it.
    wait_until("the waiter subscribed again", scaled(15.0), || async {
        Ok(numsub(&server, &channel).await >= 1)
    })
    .await
    .unwrap();
    assert!(
        !task.is_finished(),
        "the waiter got a lock that is still held"
    );

    let released = Instant::now();
    g.release()
        .await
        .expect("the first command after the outage succeeds");
    let g2 = tokio::time::timeout(scaled(20.0), task)
        .await
        .expect("the waiter slept through the release: its subscription was not restored")
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(
        took < scaled(5.0),
        "the waiter took {took:?} after the release (its poll is 60 s away)"
    );
    g2.release().await.unwrap();
}

/// `try_lock` fails with `Unavailable` while the server is down, and works as soon as it is
/// back, on the very first try: the connection wrapper never caps its retries or hands out a
/// cached failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_try_after_an_outage_succeeds() {
    let mut server = RedisServer::start().await.unwrap();
    let locker = Locker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    locker
        .try_lock(unique("before"), &opts)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();

    server.process().kill();
    let err = locker.try_lock(unique("down"), &opts).await.unwrap_err();
    assert_eq!(err.kind(), lockcore::ErrorKind::Unavailable, "{err}");
    // Longer than the old wrapper's whole retry budget (3 retries, ~1.4 s).
    tokio::time::sleep(Duration::from_millis(2500)).await;

    server.restart().await.unwrap();
    let g = locker
        .try_lock(unique("after"), &opts)
        .await
        .expect("the first try after the restart")
        .expect("a fresh name is free");
    g.release().await.unwrap();
}

/// `lock()` with a deadline rides out an outage that ends before the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_rides_out_an_outage_within_its_deadline() {
    let mut server = RedisServer::start().await.unwrap();
    let locker = Locker::new(RedisBackend::connect(&server.url()).await.unwrap());
    server.process().kill();
    let task = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(10))
                .wait_timeout(Duration::from_secs(30));
            locker.lock(unique("outage-lock"), &opts).await
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!task.is_finished(), "lock() gave up during the outage");
    server.restart().await.unwrap();
    let g = tokio::time::timeout(scaled(20.0), task)
        .await
        .expect("lock() did not come back after the server did")
        .unwrap()
        .expect("lock() succeeds once the server is back");
    g.release().await.unwrap();
}

/// Fencing tokens keep increasing across a restart that lost every key (no persistence): the
/// counter restarts from the server clock, past every token handed out before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_a_restart() {
    let mut server = RedisServer::start().await.unwrap();
    let a = Locker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let name = LockName::new(unique("fence-restart")).unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let first = a.try_lock(&name, &opts).await.unwrap().unwrap();
    let second_token = {
        first.release().await.unwrap();
        let g = a.try_lock(&name, &opts).await.unwrap().unwrap();
        let t = g.fencing_token().unwrap();
        g.abandon();
        t
    };

    server.restart().await.unwrap();
    let c = Locker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let g = c
        .try_lock(&name, &opts)
        .await
        .unwrap()
        .expect("the restart emptied the server");
    let after = g.fencing_token().unwrap();
    assert!(
        after > second_token,
        "token {after} after the restart is not above {second_token} handed out before it"
    );
    g.release().await.unwrap();
}

async fn evalsha_calls(server: &RedisServer) -> u64 {
    let mut c = raw(server).await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A lock that expires (its holder gone without releasing) wakes one waiter per client at the
/// holder's TTL, not every waiter: counted by the acquire scripts the server ran between the
/// waiters' settling and the first one's win.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_wakes_one_waiter_per_client() {
    const WAITERS: u64 = 10;
    let server = RedisServer::start().await.unwrap();
    let url = format!("{}?poll_ms=60000", server.url());
    let holder = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let waiters = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let name = LockName::new(unique("herd")).unwrap();
    let base = evalsha_calls(&server).await;
    let ttl = scaled(1.5);
    holder
        .try_lock(&name, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .unwrap()
        .abandon();
    let (won_tx, mut won_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let (waiters, name, won_tx) = (waiters.clone(), name.clone(), won_tx.clone());
        tasks.push(tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(60))
                .wait_timeout(Duration::from_secs(100));
            let g = waiters.lock(&name, &opts).await.unwrap();
            let _ = won_tx.send(());
            // Hold it: the others stay asleep.
            std::future::pending::<()>().await;
            drop(g);
        }));
    }
    // Each waiter runs two attempts before it sleeps (before and after subscribing).
    wait_until("every waiter sleeps", scaled(15.0), || async {
        Ok(evalsha_calls(&server).await >= base + 1 + 2 * WAITERS)
    })
    .await
    .unwrap();
    let settled = evalsha_calls(&server).await;
    tokio::time::timeout(scaled(20.0), won_rx.recv())
        .await
        .expect("no waiter woke at the expiry");
    // A quiet window after the win: a herd's attempts (all due within 5 ms of the expiry) would
    // land in it; nothing else is due (the safety-net poll is a minute away).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let at_win = evalsha_calls(&server).await;
    assert!(
        at_win - settled <= 2,
        "{} acquire attempts at the expiry for {WAITERS} waiters of one client (a herd)",
        at_win - settled
    );
    for t in tasks {
        t.abort();
    }
}

/// `redis+sentinel://` follows a failover: with the primary stopped (SIGSTOP), the sentinels
/// promote the replica and the same client, without reconnecting by hand, takes locks on the new
/// primary; fencing tokens of a name keep increasing across the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_url_follows_a_failover() {
    let mut topo = faultkit::RedisFailover::start()
        .await
        .expect("primary + replica + 3 sentinels");
    let sentinels: Vec<String> = topo
        .sentinel_ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let url = format!(
        "redis+sentinel://{}/faultkit?connect_timeout_ms=500&response_timeout_ms=500",
        sentinels.join(",")
    );
    let locker = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let name = LockName::new(unique("failover")).unwrap();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_timeout(scaled(30.0));
    let g = locker.lock(&name, &opts).await.unwrap();
    let before = g.fencing_token().unwrap();
    g.release().await.unwrap();

    let old = topo.primary().await.unwrap();
    topo.node(old).pause().unwrap();
    let new = topo
        .wait_failover(old, scaled(30.0))
        .await
        .expect("the sentinels promote the replica");

    // The client finds the new primary by itself (lock() rides out the errors meanwhile).
    let g = locker
        .lock(&name, &opts)
        .await
        .expect("a lock on the new primary");
    let after = g.fencing_token().unwrap();
    assert!(
        after > before,
        "token {after} after the failover, {before} before"
    );
    let holder = topo
        .cli(new, &["GET", &locker_key(&url, &name).await])
        .await
        .unwrap();
    assert_eq!(
        holder.trim(),
        g.token().to_hex(),
        "the lock is on the new primary"
    );
    g.release().await.unwrap();
    topo.node(old).resume().unwrap();
}

async fn locker_key(url: &str, name: &LockName) -> String {
    lock_redis::node::Keys::new(
        &lock_redis::node::Config::parse(url).unwrap().namespace,
        name,
    )
    .lock
}

/// With `min_replicas`, an extension is `WAIT`ed like an acquisition: with the only replica
/// stopped, extending fails with `Unavailable` (a promoted replica would hold the old TTL) and
/// the lease's validity does not move; with the replica back, it succeeds again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_waits_for_extensions() {
    let mut topo = faultkit::RedisFailover::start()
        .await
        .expect("primary + replica + 3 sentinels");
    let primary = topo.primary().await.unwrap();
    let replica = 1 - primary;
    // Long enough for a replica on a loaded machine to acknowledge (200 ms was not, once in a
    // full run); only the one extension refused below waits it out.
    let url = format!(
        "{}?min_replicas=1&replica_timeout_ms={}",
        topo.node_url(primary),
        scaled(1.5).as_millis()
    );
    let locker = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let g = locker
        .try_lock(
            unique("wait-extend"),
            // Extended by hand only: no renewal moves the validity under the test.
            &LockOptions::new()
                .ttl(Duration::from_secs(30))
                .no_auto_renew(),
        )
        .await
        .expect("the replica acknowledges the acquisition")
        .unwrap();
    g.extend(Duration::from_secs(30))
        .await
        .expect("acknowledged");

    topo.node(replica).pause().unwrap();
    let valid_until = g.valid_until();
    let err = g.extend(Duration::from_secs(60)).await.unwrap_err();
    topo.node(replica).resume().unwrap();
    assert_eq!(err.kind(), lockcore::ErrorKind::Unavailable, "{err}");
    assert_eq!(
        g.valid_until(),
        valid_until,
        "an unacknowledged extension moved the validity"
    );
    assert!(g.is_valid());
    g.release().await.unwrap();
}
