//! Slow but healthy masters: a reply later than the acquire's per-node timeout must not fail a
//! release or an extend that a majority confirmed, and the default per-node timeout (derived
//! from the TTL) must count a vote that takes longer than the old fixed 50 ms.
//!
//! Five redis-server processes of this test's own (faultkit, killed on drop); master 0 is
//! reached through faultkit's TCP proxy, which delays its replies. Masters 3 and 4 hold the
//! lock's key for another token, so a lock of this test sits on exactly masters 0, 1 and 2:
//! every one of the three must confirm, the slow one included.

use std::time::Duration;

use conformance::time_scale;
use faultkit::{Direction, Proxy, RedisServer};
use lock_redlock::RedlockBackend;
use lockcore::{Instant, LockName, LockOptions, Locker};

/// How late master 0's replies come: well past the 50 ms node timeout the URL sets below.
const LATE: Duration = Duration::from_millis(300);

fn scaled(d: Duration) -> Duration {
    d.mul_f64(time_scale())
}

struct Masters {
    servers: Vec<RedisServer>,
    /// In front of master 0.
    proxy: Proxy,
}

impl Masters {
    async fn start() -> Masters {
        let servers = futures::future::try_join_all((0..5).map(|_| RedisServer::start()))
            .await
            .expect("five redis-server processes (Debian package redis-server)");
        let upstream = format!("127.0.0.1:{}", servers[0].port())
            .parse()
            .expect("address");
        let proxy = Proxy::start(upstream).await.expect("proxy");
        Masters { servers, proxy }
    }

    /// The URL: master 0 through the proxy, `query` appended.
    fn url(&self, query: &str) -> String {
        let mut hosts = vec![format!("127.0.0.1:{}", self.proxy.port())];
        hosts.extend(
            self.servers[1..]
                .iter()
                .map(|s| format!("127.0.0.1:{}", s.port())),
        );
        format!("redlock://{}{query}", hosts.join(","))
    }

    /// Makes another token hold `key` on masters 3 and 4 for a minute.
    async fn hold_elsewhere(&self, key: &str) {
        for s in &self.servers[3..] {
            let out = s
                .cli(&["SET", key, "someone-else", "PX", "60000"])
                .await
                .expect("SET");
            assert_eq!(out.trim(), "OK");
        }
    }

    async fn exists(&self, i: usize, key: &str) -> bool {
        self.servers[i]
            .cli(&["EXISTS", key])
            .await
            .expect("EXISTS")
            .trim()
            == "1"
    }
}

fn name(tag: &str) -> LockName {
    LockName::new(format!("slow-{tag}-{:08x}", fastrand::u32(..))).expect("name")
}

fn opts() -> LockOptions {
    LockOptions::new()
        .ttl(scaled(Duration::from_secs(10)))
        .wait_timeout(scaled(Duration::from_secs(10)))
}

/// Bounds every await on the servers: a hang fails the test instead of stalling CI.
async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(scaled(Duration::from_secs(30)), fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish in time"))
}

/// The defect: with the lock on exactly 3 of 5 masters, a release (or extend) failed with
/// `Unavailable` when one of the three answered after `node_timeout_ms`, although it had
/// reached every master and all three confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_third_confirmation_still_extends_and_releases() {
    let masters = Masters::start().await;
    // A short node timeout on purpose: the acquire's per-node timeout must not bound the
    // release and extend.
    let backend = RedlockBackend::connect(&masters.url("?node_timeout_ms=50"))
        .await
        .expect("connect");
    let n = name("release");
    let key = backend.lock_key(&n);
    let a = Locker::new(backend);
    masters.hold_elsewhere(&key).await;
    // lock(), not try_lock(): on a loaded machine one vote may take longer than 50 ms.
    let g = bounded("lock", a.lock(&n, &opts()))
        .await
        .expect("lock on masters 0, 1, 2");
    for i in 0..3 {
        assert!(masters.exists(i, &key).await, "master {i} holds the key");
    }

    masters.proxy.set_latency(Direction::ToClient, LATE);
    let started = Instant::now();
    bounded("extend", g.extend(scaled(Duration::from_secs(10))))
        .await
        .expect("extend confirmed by 3 of 5, one of them late");
    assert!(
        started.elapsed() >= LATE,
        "the extend did not wait for the slow master"
    );
    assert!(g.is_valid());

    let started = Instant::now();
    bounded("release", g.release())
        .await
        .expect("release confirmed by 3 of 5, one of them late");
    assert!(
        started.elapsed() >= LATE,
        "the release did not wait for the slow master"
    );
    for i in 0..3 {
        assert!(!masters.exists(i, &key).await, "master {i} still holds it");
    }
    masters
        .proxy
        .set_latency(Direction::ToClient, Duration::ZERO);
    a.flush().await;
}

/// Without `node_timeout_ms` the per-node timeout is a tenth of the TTL (1 s for 10 s): a vote
/// that takes 150 ms (past the old fixed 50 ms) still counts, so a lock that only a majority
/// including the slow master can give is won.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_node_timeout_counts_a_slow_vote() {
    let masters = Masters::start().await;
    let backend = RedlockBackend::connect(&masters.url(""))
        .await
        .expect("connect");
    let n = name("acquire");
    let key = backend.lock_key(&n);
    let a = Locker::new(backend);
    masters.hold_elsewhere(&key).await;
    masters
        .proxy
        .set_latency(Direction::ToClient, Duration::from_millis(150));
    let g = bounded("lock", a.lock(&n, &opts()))
        .await
        .expect("won with the slow master's vote");
    assert!(masters.exists(0, &key).await, "the slow master voted");
    bounded("release", g.release()).await.expect("release");
    masters
        .proxy
        .set_latency(Direction::ToClient, Duration::ZERO);
    a.flush().await;
}
