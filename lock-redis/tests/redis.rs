//! Redis-specific tests beyond the conformance suite. Each needs a test server URL (see
//! `scripts/servers.sh env`) and is skipped when it is unset (failing under
//! `LOCK_TEST_REQUIRE_ALL`).

use std::time::Duration;

use conformance::require_env;
use lock_redis::RedisBackend;
use lockcore::backend::Backend;
use lockcore::{ErrorKind, Instant, LockMode, LockName, LockOptions, Locker};

/// Two `#[tokio::test]`s running `$run(&url)`: `$single` on the single node
/// (`LOCK_TEST_REDIS_URL`), `$cluster` on the cluster (`LOCK_TEST_REDIS_CLUSTER_URL`), each
/// skipped when its URL is unset.
macro_rules! on_single_and_cluster {
    ($single:ident, $cluster:ident, $run:ident) => {
        on_single_and_cluster!(
            #[tokio::test]
            $single,
            $cluster,
            $run
        );
    };
    (#[$test:meta] $single:ident, $cluster:ident, $run:ident) => {
        #[$test]
        async fn $single() {
            if let Some(url) = require_env("LOCK_TEST_REDIS_URL") {
                $run(&url).await;
            }
        }

        #[$test]
        async fn $cluster() {
            if let Some(url) = require_env("LOCK_TEST_REDIS_CLUSTER_URL") {
                $run(&url).await;
            }
        }
    };
}

/// A new client of `url` behind a `Locker`.
async fn client_of(url: &str) -> Locker {
    Locker::new(RedisBackend::connect(url).await.unwrap())
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", fastrand::u64(..))
}

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::new()
        .ttl(ttl)
        .wait_timeout(Duration::from_secs(20))
}

fn with_query(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// A raw connection per node of the URL (plain `redis://` URLs only), to inspect the server.
async fn raw_nodes(url: &str) -> Vec<redis::aio::MultiplexedConnection> {
    let (scheme, rest) = url.split_once("://").unwrap();
    let scheme = scheme.trim_end_matches("+cluster");
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), rest),
    };
    let hosts = hosts.split(['/', '?']).next().unwrap();
    let mut out = Vec::new();
    for h in hosts.split(',') {
        let client = redis::Client::open(format!("{scheme}://{userinfo}{h}")).unwrap();
        out.push(client.get_multiplexed_async_connection().await.unwrap());
    }
    out
}

/// Subscribers of `channel` over all nodes, classic (`NUMSUB`) or sharded (`SHARDNUMSUB`).
async fn numsub_of(
    nodes: &mut [redis::aio::MultiplexedConnection],
    channel: &str,
    kind: &str,
) -> i64 {
    let mut total = 0;
    for c in nodes.iter_mut() {
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg(kind)
            .arg(channel)
            .query_async(c)
            .await
            .unwrap();
        total += n;
    }
    total
}

/// Subscribers of `channel` over all nodes, classic or sharded.
async fn numsub(nodes: &mut [redis::aio::MultiplexedConnection], channel: &str) -> i64 {
    numsub_of(nodes, channel, "NUMSUB").await + numsub_of(nodes, channel, "SHARDNUMSUB").await
}

/// A lock held by one client and waited for by another's `lock()` calls, with raw connections
/// to the server(s) to watch the subscriptions of its release channel.
struct Contended {
    waiter_backend: RedisBackend,
    waiter: Locker,
    name: LockName,
    channel: String,
    nodes: Vec<redis::aio::MultiplexedConnection>,
}

impl Contended {
    /// A name from `prefix`, held by a client of `url` (its guard beside).
    async fn new(url: &str, prefix: &str) -> (Contended, lockcore::LockGuard) {
        let holder = client_of(url).await;
        let waiter_backend = RedisBackend::connect(url).await.unwrap();
        let waiter = Locker::new(waiter_backend.clone());
        let name = LockName::new(unique(prefix)).unwrap();
        let channel = waiter_backend.channel(&name);
        let nodes = raw_nodes(url).await;
        let held = holder
            .try_lock(&name, &opts(Duration::from_secs(30)))
            .await
            .unwrap()
            .unwrap();
        let contended = Contended {
            waiter_backend,
            waiter,
            name,
            channel,
            nodes,
        };
        (contended, held)
    }

    /// A waiter's `lock()` in a task of its own.
    fn spawn_waiter(&self) -> tokio::task::JoinHandle<lockcore::Result<lockcore::LockGuard>> {
        spawn_lock(&self.waiter, &self.name, opts(Duration::from_secs(30)))
    }

    /// Waits (bounded) until the channel's subscriber count of the `kinds` (`NUMSUB`,
    /// `SHARDNUMSUB`) satisfies `count`.
    async fn until_subscribers(&self, what: &str, kinds: &[&str], count: fn(i64) -> bool) {
        eventually(what, || {
            let mut nodes = self.nodes.clone();
            async move {
                let mut n = 0;
                for kind in kinds {
                    n += numsub_of(&mut nodes, &self.channel, kind).await;
                }
                count(n)
            }
        })
        .await;
    }

    /// Waits (bounded) until neither the server nor the waiting client holds a subscription.
    async fn until_unsubscribed(&self) {
        eventually("the subscription is gone", || {
            let mut nodes = self.nodes.clone();
            async move {
                numsub(&mut nodes, &self.channel).await == 0
                    && self.waiter_backend.waited_names() == 0
            }
        })
        .await;
    }
}

/// `locker.lock(name)` in a task of its own.
fn spawn_lock(
    locker: &Locker,
    name: &LockName,
    options: LockOptions,
) -> tokio::task::JoinHandle<lockcore::Result<lockcore::LockGuard>> {
    let (locker, name) = (locker.clone(), name.clone());
    tokio::spawn(async move { locker.lock(&name, &options).await })
}

/// Waits (bounded) until the server's queue of `name` has `n` live waiters.
async fn until_queued(what: &str, backend: &RedisBackend, name: &LockName, n: usize) {
    eventually(what, || async {
        backend.queued_waiters(name).await.unwrap() == n
    })
    .await;
}

/// Classic and sharded subscriptions.
const BOTH: &[&str] = &["NUMSUB", "SHARDNUMSUB"];

/// Waits (bounded) until `cond` holds, checking every few ms: an observable condition on the
/// server, not a sleep standing in for one.
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + Duration::from_secs(10);
    while !cond().await {
        assert!(Instant::now() < end, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn woken_by_release(url: &str) {
    // Safety-net poll of 2 s: it fires 1 to 2 s after the waiter's last attempt, so a hand-over
    // within well under a second of the release can only come from the notification.
    let url = with_query(url, "poll_ms=2000");
    let (c, held) = Contended::new(&url, "{notify}/x").await;
    let task = c.spawn_waiter();
    c.until_subscribers("the waiter is subscribed", BOTH, |n| n >= 1)
        .await;
    assert!(!task.is_finished());
    let released = Instant::now();
    held.release().await.unwrap();
    let g2 = task.await.unwrap().unwrap();
    let took = released.elapsed();
    assert!(
        took < Duration::from_millis(800),
        "the waiter took {took:?} after the release: not woken by the notification"
    );
    g2.release().await.unwrap();
    // The last waiter gone, the subscription goes too.
    c.until_unsubscribed().await;
}

on_single_and_cluster!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    waiter_is_woken_by_release_not_poll,
    cluster_waiter_is_woken_by_release_not_poll,
    woken_by_release
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waits_leave_no_subscription() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let (c, held) = Contended::new(&url, "cancel").await;
    // Three waiters of one client share one subscription; all are dropped mid-wait.
    let tasks: Vec<_> = (0..3).map(|_| c.spawn_waiter()).collect();
    c.until_subscribers("the waiters are subscribed", BOTH, |n| n == 1)
        .await;
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        assert!(t.await.unwrap_err().is_cancelled());
    }
    c.until_unsubscribed().await;
    held.release().await.unwrap();
}

#[tokio::test]
async fn bad_urls_are_invalid_config_and_never_show_the_password() {
    const PW: &str = "hunter2-very-secret";
    for url in [
        format!("redis://:{PW}@127.0.0.1:notaport"),
        format!("redis://user:{PW}@127.0.0.1:6379?bogus=1"),
        format!("redis://user:{PW}@127.0.0.1:6379?min_replicas=lots"),
        format!("redis://user:{PW}@127.0.0.1:6379?namespace=%7Bx%7D"),
        format!("redis://user:{PW}@a,b"),
        format!("http://user:{PW}@127.0.0.1"),
        format!("rediss://user:{PW}@127.0.0.1?tls_ca=/nonexistent/ca.pem"),
        format!("redis://user:{PW}@127.0.0.1#insecure"),
        format!("redis://user:{PW}@127.0.0.1/notadb"),
    ] {
        let e = RedisBackend::connect(&url).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
        assert!(!format!("{e}").contains(PW), "{e}");
        assert!(!format!("{e:?}").contains(PW), "{e:?}");
    }
    // Unreachable server: a connection error, still without the password.
    let e = RedisBackend::connect(&format!("redis://:{PW}@127.0.0.1:1?connect_timeout_ms=500"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(!format!("{e} {e:?}").contains(PW));
    // Issue 37: `{:#}` printed the client's cause twice ("Connection refused: Connection
    // refused"), the client's error echoing its own source.
    let chain = format!("{e:#}");
    assert_eq!(chain.matches("refused").count(), 1, "{chain}");

    if let Some(url) = require_env("LOCK_TEST_REDIS_AUTH_URL") {
        // A wrong password is refused, and not echoed either.
        let wrong = url.replacen("://:", &format!("://:{PW}"), 1);
        let e = RedisBackend::connect(&wrong).await.unwrap_err();
        assert!(!format!("{e} {e:?}").contains(PW), "{e:?}");
        // Refused credentials: the kind every backend gives them (issue 37: Backend here).
        assert_eq!(e.kind(), ErrorKind::Auth, "{e:#}");
    }
    for var in ["LOCK_TEST_REDIS_AUTH_URL", "LOCK_TEST_REDIS_ACL_URL"] {
        let Some(url) = require_env(var) else {
            continue;
        };
        let authority = url.split_once("://").unwrap().1.rsplit_once('@').unwrap().0;
        let raw_pw = authority.split_once(':').unwrap().1;
        let decoded = percent_encoding::percent_decode_str(raw_pw)
            .decode_utf8()
            .unwrap();
        let b = RedisBackend::connect(&url).await.unwrap();
        let locker = Locker::new(b.clone());
        for shown in [b.describe(), format!("{b:?}"), format!("{locker:?}")] {
            assert!(
                !shown.contains(raw_pw) && !shown.contains(&*decoded),
                "{shown}"
            );
            assert!(shown.contains("***"), "{shown}");
        }
        // And the credentials work.
        let name = LockName::new(unique("auth")).unwrap();
        let g = locker
            .try_lock(&name, &opts(Duration::from_secs(5)))
            .await
            .unwrap()
            .unwrap();
        g.release().await.unwrap();
    }
}

on_single_and_cluster!(
    min_replicas_without_replicas_is_unavailable_and_leaves_the_lock_free,
    cluster_min_replicas_without_replicas_is_unavailable,
    min_replicas_unavailable
);

async fn min_replicas_unavailable(url: &str) {
    let strict = Locker::new(
        RedisBackend::connect(&with_query(url, "min_replicas=1&replica_timeout_ms=100"))
            .await
            .unwrap(),
    );
    let plain = client_of(url).await;
    let name = LockName::new(unique("replicas")).unwrap();
    let t0 = Instant::now();
    let e = strict
        .try_lock(&name, &opts(Duration::from_secs(30)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(
        t0.elapsed() >= Duration::from_millis(90),
        "WAIT did not wait"
    );
    let e = strict
        .lock(&name, &opts(Duration::from_secs(30)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    // Left free: another client takes it at once.
    let g = plain
        .try_lock(&name, &opts(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the under-replicated lock was released");
    g.release().await.unwrap();
    // A share and a permit too: refused, and released (one permit of one is free after).
    for mode in [LockMode::Shared, LockMode::Permit { limit: 1 }] {
        let o = opts(Duration::from_secs(30)).mode(mode);
        let e = strict.try_lock(&name, &o).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{mode}: {e}");
        let g = plain
            .try_lock(&name, &o)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("the under-replicated {mode} was left held"));
        g.release().await.unwrap();
    }
}

async fn hash_tags_are_ours(url: &str) {
    let b = RedisBackend::connect(url).await.unwrap();
    let locker = Locker::new(b.clone());
    let nodes = raw_nodes(url).await;
    let base = unique("t");
    let names: Vec<LockName> = [format!("{{{base}}}x"), format!("{{{base}}}y"), base.clone()]
        .iter()
        .map(|n| LockName::new(n).unwrap())
        .collect();
    let o = opts(Duration::from_secs(10));
    // All three are held at once: independent locks.
    let mut guards = Vec::new();
    for n in &names {
        guards.push(
            locker
                .try_lock(n, &o)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{n:?} is not independent")),
        );
    }
    for n in &names {
        let key = b.lock_key(n);
        // The hash tag is the escaped name: no user brace inside it, and the fencing counter
        // shares the slot.
        let tag = &key[key.find('{').unwrap() + 1..key.find('}').unwrap()];
        assert_eq!(tag, n.escaped(), "{key}");
        assert_eq!(key.matches('{').count(), 1, "{key}");
        assert_eq!(key.matches('}').count(), 1, "{key}");
        let slot = |k: String| {
            let mut c = nodes[0].clone();
            async move {
                redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(k)
                    .query_async::<i64>(&mut c)
                    .await
                    .ok()
            }
        };
        if url.contains("+cluster") {
            assert_eq!(slot(key.clone()).await, slot(b.fence_key(n)).await);
        }
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

on_single_and_cluster!(
    hash_tag_names_are_independent,
    cluster_hash_tag_names_are_independent,
    hash_tags_are_ours
);

#[tokio::test]
async fn acquire_sets_the_ttl_atomically() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let b = RedisBackend::connect(&url).await.unwrap();
    let locker = Locker::new(b.clone());
    let mut raw = raw_nodes(&url).await.remove(0);
    let ttl = Duration::from_millis(5000);
    let name = LockName::new(unique("pttl")).unwrap();
    let before: Option<i64> = redis::cmd("GET")
        .arg(b.fence_key(&name))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(before, None);
    let mut last_token = 0;
    for _ in 1..=2u64 {
        let g = locker.try_lock(&name, &opts(ttl)).await.unwrap().unwrap();
        let pttl: i64 = redis::cmd("PTTL")
            .arg(b.lock_key(&name))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(pttl > 0 && pttl <= ttl.as_millis() as i64, "PTTL {pttl}");
        // The fencing token is the counter, advanced in the same script: above the last one and
        // never below the server clock in microseconds.
        let token = g.fencing_token().unwrap();
        let stored: u64 = redis::cmd("GET")
            .arg(b.fence_key(&name))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(token, stored);
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
        assert!(
            token > last_token && token <= secs * 1_000_000 + micros,
            "{token}"
        );
        assert!(
            token + 10_000_000 > secs * 1_000_000 + micros,
            "{token} far below TIME"
        );
        last_token = token;
        let owner: String = redis::cmd("GET")
            .arg(b.lock_key(&name))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(owner, g.token().to_hex());
        g.release().await.unwrap();
    }
    // extend resets the TTL, one round trip, owner-checked.
    let g = locker
        .try_lock(&name, &opts(Duration::from_millis(500)))
        .await
        .unwrap()
        .unwrap();
    g.extend(Duration::from_secs(20)).await.unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(b.lock_key(&name))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(pttl > 10_000, "PTTL after extend {pttl}");
    g.release().await.unwrap();
}

#[tokio::test]
async fn separate_connects_are_independent_clients() {
    // A server of this test's own: on the shared one, other tests' connections come and go
    // between the two counts.
    let server = faultkit::RedisServer::start()
        .await
        .expect("a redis-server of its own (Debian package redis-server)");
    let url = server.url();
    let a = RedisBackend::connect(&url).await.unwrap();
    let b = RedisBackend::connect(&url).await.unwrap();
    let mut raw = raw_nodes(&url).await.remove(0);
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut raw)
        .await
        .unwrap();
    let before = list.lines().count();
    let c = RedisBackend::connect(&url).await.unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut raw)
        .await
        .unwrap();
    // Its command connection, and its pub/sub connection (opened at connect on a single
    // node, for the namespace's revocation notices).
    assert_eq!(
        list.lines().count(),
        before + 2,
        "one command and one pub/sub connection per client"
    );
    drop((a, b, c));
}

/// The acquire script run twice with one token (as the cluster client does when it re-sends a
/// script after a dropped connection, the first copy having run) reports success both times
/// with the same fencing token, not its own token as another holder; another token is refused.
async fn acquire_is_idempotent(url: &str) {
    use lock_redis::node::{self, Config, Node, NodeAttempt};
    let node = Node::connect(&Config::parse(url).unwrap()).await.unwrap();
    let keys = node.keys(&LockName::new(unique("idempotent")).unwrap());
    let mut conn = node.conn();
    let ttl = Duration::from_secs(30);
    let first = node::acquire(&mut conn, &keys, "token-a", "", ttl, true)
        .await
        .unwrap();
    let again = node::acquire(&mut conn, &keys, "token-a", "", ttl, true)
        .await
        .unwrap();
    assert!(
        matches!(first, NodeAttempt::Won { fence: Some(_) }),
        "{first:?}"
    );
    assert_eq!(first, again, "a re-sent acquire must report the same win");
    let other = node::acquire(&mut conn, &keys, "token-b", "", ttl, true)
        .await
        .unwrap();
    assert!(matches!(other, NodeAttempt::Held { .. }), "{other:?}");
    assert!(node::release(&mut conn, &keys, "token-a").await.unwrap());
}

on_single_and_cluster!(
    acquire_is_idempotent_for_its_token,
    cluster_acquire_is_idempotent_for_its_token,
    acquire_is_idempotent
);

async fn bare_cycle_and_server_requests(url: &str) {
    let backend = RedisBackend::connect(url).await.unwrap();
    let before = backend.server_requests().await.unwrap();
    let name = LockName::new(unique("bare")).unwrap();
    for _ in 0..10 {
        backend.bare_cycle(&name).await.unwrap();
    }
    let after = backend.server_requests().await.unwrap();
    // 2 commands per cycle plus the first INFO itself (shared servers see other traffic too).
    assert!(after >= before + 20, "{before} -> {after}");
    // The name is free again.
    let locker = Locker::new(backend);
    let g = locker
        .try_lock(&name, &opts(Duration::from_secs(5)))
        .await
        .unwrap();
    g.unwrap().release().await.unwrap();
}

on_single_and_cluster!(
    bare_cycle_and_server_requests_work,
    cluster_bare_cycle_and_server_requests_work,
    bare_cycle_and_server_requests
);

/// On a cluster, waiters subscribe with sharded pub/sub (`SSUBSCRIBE`) on the lock's slot: no
/// classic subscription, whose messages the cluster bus would broadcast to every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waiters_use_sharded_pubsub() {
    let Some(url) = require_env("LOCK_TEST_REDIS_CLUSTER_URL") else {
        return;
    };
    let (c, held) = Contended::new(&url, "sharded").await;
    let task = c.spawn_waiter();
    c.until_subscribers(
        "the waiter is subscribed (sharded)",
        &["SHARDNUMSUB"],
        |n| n >= 1,
    )
    .await;
    let mut n = c.nodes.clone();
    assert_eq!(numsub_of(&mut n, &c.channel, "NUMSUB").await, 0);
    held.release().await.unwrap();
    task.await.unwrap().unwrap().release().await.unwrap();
}

/// A backend on the settings of the application's own `redis::Client` (here an ACL user's:
/// the credentials come from the client, never shown): its locks exclude those of a backend
/// from the URL on the same namespace; a bad namespace is refused.
#[tokio::test]
async fn from_client_takes_the_applications_settings() {
    let Some(url) = require_env("LOCK_TEST_REDIS_ACL_URL") else {
        return;
    };
    let password = url::Url::parse(&url)
        .unwrap()
        .password()
        .unwrap()
        .to_owned();
    let client = redis::Client::open(url.as_str()).unwrap();
    let ns = unique("app").replace('-', "_");
    let mine = Locker::new(RedisBackend::from_client(&client, &ns).await.unwrap());
    assert!(!mine.describe().contains(&password), "{}", mine.describe());
    assert!(!format!("{mine:?}").contains(&password));
    let by_url = Locker::new(
        RedisBackend::connect(&with_query(&url, &format!("namespace={ns}")))
            .await
            .unwrap(),
    );
    let name = unique("shared");
    let o = opts(Duration::from_secs(5));
    let g = mine
        .try_lock(name.as_str(), &o)
        .await
        .unwrap()
        .expect("free");
    assert!(by_url.try_lock(name.as_str(), &o).await.unwrap().is_none());
    g.release().await.unwrap();
    by_url
        .lock(
            name.as_str(),
            &o.clone()
                .wait_timeout(Duration::from_secs(5).mul_f64(conformance::time_scale())),
        )
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for bad in ["{tag}", "a b", "ns\n"] {
        let err = RedisBackend::from_client(&client, bad).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{bad:?}: {err}");
    }
}

/// Extends that fall due together go out as one script call, still owner-checked per lock: of
/// 50 held leases extended at once, the one whose key another owner took is refused (`NotHeld`,
/// its key untouched) and the 49 others get their new TTL; the server saw fewer script calls
/// than extends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_extends_are_owner_checked_per_lock() {
    // A server of this test's own: on the shared one, other tests' script calls would land
    // between the two counts.
    let server = faultkit::RedisServer::start()
        .await
        .expect("a redis-server of its own (Debian package redis-server)");
    let url = server.url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone());
    let prefix = unique("batch");
    let mut guards = Vec::new();
    for i in 0..50 {
        let g = locker
            .try_lock(format!("{prefix}-{i}"), &opts(Duration::from_secs(5)))
            .await
            .unwrap()
            .expect("fresh names are free");
        guards.push(g);
    }
    let mut raw = raw_nodes(&url).await.remove(0);
    let stolen = backend.lock_key(&LockName::new(format!("{prefix}-7")).unwrap());
    let _: () = redis::cmd("SET")
        .arg(&stolen)
        .arg("someone-else")
        .arg("PX")
        .arg(5000)
        .query_async(&mut raw)
        .await
        .unwrap();
    let calls = |info: String| -> u64 {
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    let info = |raw: &mut redis::aio::MultiplexedConnection| {
        let mut raw = raw.clone();
        async move {
            redis::cmd("INFO")
                .arg("commandstats")
                .query_async::<String>(&mut raw)
                .await
                .unwrap()
        }
    };
    let before = calls(info(&mut raw).await);
    let results =
        futures::future::join_all(guards.iter().map(|g| g.extend(Duration::from_secs(60)))).await;
    let after = calls(info(&mut raw).await);
    for (i, r) in results.iter().enumerate() {
        if i == 7 {
            assert_eq!(r.as_ref().unwrap_err().kind(), ErrorKind::NotHeld);
        } else {
            assert!(r.is_ok(), "lock {i}: {r:?}");
        }
    }
    let value: String = redis::cmd("GET")
        .arg(&stolen)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(value, "someone-else", "the foreign key was left alone");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(backend.lock_key(&LockName::new(format!("{prefix}-3")).unwrap()))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(pttl > 5_000, "extended to 60 s: {pttl} ms left");
    assert!(
        after - before < 50,
        "50 extends took {} script calls",
        after - before
    );
    let _: () = redis::cmd("DEL")
        .arg(&stolen)
        .query_async(&mut raw)
        .await
        .unwrap();
    for (i, g) in guards.into_iter().enumerate() {
        if i != 7 {
            g.release().await.unwrap();
        }
    }
}

/// The live entries of the waiters' queue of `name` and the server's clock, read on the server:
/// `(expiry scores in ms, TIME in ms)`.
async fn queue_expiries(
    raw: &mut redis::aio::MultiplexedConnection,
    backend: &RedisBackend,
    name: &LockName,
) -> (Vec<f64>, f64) {
    let key = backend.lock_key(name).replace(":lock", ":queuexp");
    let entries: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(raw)
        .await
        .unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(raw).await.unwrap();
    let now = (secs * 1000 + micros / 1000) as f64;
    (entries.into_iter().map(|(_, s)| s).collect(), now)
}

/// A waiter whose process dies while it is queued (its runtime shut down: no clean-up runs)
/// leaves an entry that expires by its own TTL on the server's clock (`poll_ms + 2 s` past its
/// last attempt, scored from the server's `TIME`, not the client's), and holds the lock back
/// meanwhile (FIFO: the head's turn, a `try_lock` is refused); then the next waiter gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_waiters_entry_expires_on_the_server_clock_then_the_next_waiter_wins() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let backend = RedisBackend::connect(&url).await.unwrap();
    let holder = Locker::new(backend.clone());
    let name = LockName::new(unique("queue-crash")).unwrap();
    let ttl = Duration::from_secs(30);
    let mut raw = raw_nodes(&url).await.remove(0);
    let g = holder.try_lock(&name, &opts(ttl)).await.unwrap().unwrap();

    // The doomed waiter: its own runtime on its own thread, shut down once it is queued.
    let dead_url = with_query(&url, "poll_ms=3000");
    // Awaited, not received blockingly: this test's runtime workers stay free meanwhile.
    let (queued_tx, queued_rx) = tokio::sync::oneshot::channel::<()>();
    let (crash_tx, crash_rx) = std::sync::mpsc::channel::<()>();
    let dead = {
        let name = name.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let locker =
                rt.block_on(async { Locker::new(RedisBackend::connect(&dead_url).await.unwrap()) });
            rt.spawn(async move { locker.lock(&name, &opts(ttl)).await });
            queued_tx.send(()).unwrap();
            crash_rx.recv().unwrap();
            // Every task dropped, clean-up spawned after this never runs: a crash as far as
            // the server can tell.
            rt.shutdown_background();
        })
    };
    queued_rx.await.unwrap();
    until_queued("the doomed waiter is queued", &backend, &name, 1).await;
    let (scores, now) = queue_expiries(&mut raw, &backend, &name).await;
    assert_eq!(scores.len(), 1);
    let left = scores[0] - now;
    assert!(
        left > 0.0 && left <= 5_000.0 + 50.0,
        "the entry expires {left} ms from the server's now; expected within poll_ms + 2 s"
    );
    crash_tx.send(()).unwrap();
    tokio::task::spawn_blocking(move || dead.join().unwrap())
        .await
        .unwrap();

    let next_url = with_query(&url, "poll_ms=200");
    let next = Locker::new(RedisBackend::connect(&next_url).await.unwrap());
    let task = spawn_lock(&next, &name, opts(ttl));
    until_queued("the next waiter is queued behind it", &backend, &name, 2).await;
    let released = Instant::now();
    g.release().await.unwrap();
    // The dead head's turn: nobody else, not even a try_lock, takes the free lock.
    let other = client_of(&url).await;
    assert!(other.try_lock(&name, &opts(ttl)).await.unwrap().is_none());
    let g2 = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the next waiter never got the lock after the dead head's entry expired")
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "{took:?} after the release: more than the dead entry's TTL and a safety poll"
    );
    assert_eq!(backend.queued_waiters(&name).await.unwrap(), 0);
    g2.release().await.unwrap();
}

/// A waiter that times out or is dropped while queued leaves the queue at once (in the
/// background: `flush` waits for it), and when it was the head of a free lock, the next waiter
/// is told: the hand-over does not wait for the leaver's entry to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_head_leaves_the_queue_and_the_next_waiter_is_told() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    // A safety poll of 10 s: a hand-over within a few seconds can only come from a message.
    let url = with_query(&url, "poll_ms=10000");
    let backend = RedisBackend::connect(&url).await.unwrap();
    let holder = Locker::new(backend.clone());
    let name = LockName::new(unique("queue-cancel")).unwrap();
    let ttl = Duration::from_secs(30);
    let g = holder.try_lock(&name, &opts(ttl)).await.unwrap().unwrap();
    let first = client_of(&url).await;
    let head = spawn_lock(&first, &name, opts(ttl));
    until_queued("the first waiter is queued", &backend, &name, 1).await;
    let second = client_of(&url).await;
    let next = spawn_lock(&second, &name, opts(ttl));
    until_queued("the second waiter is queued", &backend, &name, 2).await;
    // A third waiter that gives up: it leaves the queue when its wait times out.
    let third = client_of(&url).await;
    let short = opts(ttl).wait_timeout(Duration::from_millis(300));
    assert!(third.lock(&name, &short).await.is_err());
    third.flush().await;
    assert_eq!(backend.queued_waiters(&name).await.unwrap(), 2);
    // The release names the first waiter, which is dropped before (or while) it acts.
    g.release().await.unwrap();
    head.abort();
    let _ = head.await;
    first.flush().await;
    let released = Instant::now();
    let g2 = tokio::time::timeout(Duration::from_secs(8), next)
        .await
        .expect("the second waiter was not told that the head left")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(5));
    assert_eq!(backend.queued_waiters(&name).await.unwrap(), 0);
    g2.release().await.unwrap();
}

/// With `min_replicas`, an attempt's script and `WAIT` go over a connection of their own. A
/// cancelled attempt's clean-up (release what the script may have won) must reach the server
/// after the script: sent over the command connection it could overtake it, find nothing,
/// and leave the lock the script then took held for its whole TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_min_replicas_attempts_leave_nothing() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let strict = Locker::new(
        RedisBackend::connect(&with_query(&url, "min_replicas=1&replica_timeout_ms=20"))
            .await
            .unwrap(),
    );
    let plain = client_of(&url).await;
    for round in 0..150 {
        let name = LockName::new(unique("replicas-cancel")).unwrap();
        let mode = [LockMode::Exclusive, LockMode::Shared][round % 2];
        let o = opts(Duration::from_secs(30)).mode(mode);
        // Dropped 0..600 µs in: before, while or after the pipeline is sent and applied (a
        // round trip here is about 100 µs; WAIT then holds the reply 20 ms).
        let after = Duration::from_micros((round as u64 * 4) % 600);
        let t0 = std::time::Instant::now();
        tokio::select! {
            biased;
            _ = async {
                while t0.elapsed() < after {
                    tokio::task::yield_now().await;
                }
            } => {}
            r = strict.try_lock(&name, &o) => {
                // No replica acknowledges: refused (and released by the attempt itself).
                let e = r.expect_err("granted without a replica");
                assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
            }
        }
        strict.flush().await;
        let g = plain
            .try_lock(&name, &o)
            .await
            .unwrap()
            .unwrap_or_else(|| {
                panic!("round {round} ({mode}, dropped after {after:?}): the cancelled attempt's lock was left held")
            });
        g.release().await.unwrap();
    }
}

/// An acquisition that asks for no fencing token leaves the counter alone (the script skips
/// `TIME` and the counter's read and write) and still excludes; a token asked for after it is
/// the next one, and `inspect` shows the counter as the last fenced holder left it. The
/// uncontended try_lock and a waiting lock() (queued script) alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fencing_the_counter_is_left_alone() {
    let Some(url) = require_env("LOCK_TEST_REDIS_URL") else {
        return;
    };
    let (a, b) = (client_of(&url).await, client_of(&url).await);
    let name = unique("nofence");
    let fenced = opts(Duration::from_secs(10)).require_fencing(true);
    let unfenced = fenced.clone().no_fencing();
    let g = a.lock(name.as_str(), &fenced).await.unwrap();
    let first = g.fencing_token().expect("a token asked for");
    g.release().await.unwrap();
    for round in 0..3 {
        let g = if round == 0 {
            a.try_lock(name.as_str(), &unfenced).await.unwrap().unwrap()
        } else {
            a.lock(name.as_str(), &unfenced).await.unwrap()
        };
        assert_eq!(g.fencing_token(), None, "round {round}");
        assert!(
            b.try_lock(name.as_str(), &fenced).await.unwrap().is_none(),
            "round {round}: a lock held without a token did not exclude"
        );
        let info = b.inspect(name.as_str()).await.unwrap();
        assert!(info.held, "round {round}");
        assert_eq!(info.fencing_token, Some(first), "round {round}");
        g.release().await.unwrap();
    }
    let g = b.lock(name.as_str(), &fenced).await.unwrap();
    let next = g.fencing_token().expect("a token asked for");
    assert!(next > first, "{next} after {first}");
    g.release().await.unwrap();
}
