//! Redlock's hand-over by grants (`handover=grant`, the default; see the crate docs, "Waiting"),
//! on five redis-server processes of its own (started here on free ports, killed on drop): a
//! majority of grants holds without a vote, a waiter that crashed once granted costs the next
//! one the claim TTL (never the lock's TTL), a grant lost on one master is made up by the
//! others, grants whose messages were all lost are found by the safety poll, and a minority
//! of grants is given back at once.

use std::time::Duration;

use conformance::interop::{eventually, poll_until};
use conformance::time_scale;
use faultkit::RedisServer;
use lock_redlock::RedlockBackend;
use lockcore::{Instant, LockName, LockOptions, Locker};

/// Five masters of this test's own (faultkit kills them on drop, also on panic).
struct Cluster {
    masters: Vec<RedisServer>,
}

impl Cluster {
    async fn start() -> Cluster {
        let masters = futures::future::try_join_all((0..5).map(|_| RedisServer::start()))
            .await
            .expect("five redis-server processes (Debian package redis-server)");
        Cluster { masters }
    }

    /// The URL of the five masters with `params` (`poll_ms=...`) and a generous node timeout
    /// (a loaded 2-core machine can take well over 100 ms to answer).
    fn url(&self, params: &str) -> String {
        let hosts: Vec<String> = self
            .masters
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port()))
            .collect();
        let node_timeout = scaled(Duration::from_millis(250)).as_millis();
        format!(
            "redlock://{}?node_timeout_ms={node_timeout}&{params}",
            hosts.join(",")
        )
    }

    /// A client with every script already loaded on every master (a script's first call
    /// counts twice: EVALSHA refused, then EVAL).
    async fn client(&self, params: &str) -> Locker {
        let locker = Locker::new(
            RedlockBackend::connect(&self.url(params))
                .await
                .expect("connect"),
        );
        let warm = LockOptions::new().ttl(Duration::from_secs(5));
        locker
            .lock(&name("warm"), &warm)
            .await
            .expect("warm-up lock")
            .release()
            .await
            .expect("warm-up release");
        locker.flush().await;
        locker
    }

    /// Script calls (`EVAL`/`EVALSHA`) all five masters have run.
    async fn script_calls(&self) -> u64 {
        self.calls(|c| c == "evalsha" || c == "eval").await
    }

    /// Calls of the commands `pick` chooses that all five masters have run.
    async fn calls(&self, pick: impl Fn(&str) -> bool + Copy) -> u64 {
        let mut calls = 0;
        for m in &self.masters {
            let info = m.cli(&["INFO", "commandstats"]).await.expect("INFO");
            calls += lock_redis::node::command_calls(&info, pick);
        }
        calls
    }

    /// Waits (bounded) until the masters have run `count` script calls, and returns how many
    /// they ran.
    async fn script_calls_reach(&self, count: u64, what: &str) -> u64 {
        poll_until(scaled(Duration::from_secs(20)), || async {
            let calls = self.script_calls().await;
            (calls >= count).then_some(calls)
        })
        .await
        .unwrap_or_else(|| panic!("{what}: fewer than {count} script calls"))
    }

    /// The value of `key` on master `i` (empty when it has none).
    async fn key_on(&self, i: usize, key: &str) -> String {
        let value = self.masters[i].cli(&["GET", key]).await.expect("GET");
        value.trim().to_owned()
    }

    /// Waits (bounded) until the value of `key` on master `i` is one `done` accepts, and
    /// returns it.
    async fn await_key(
        &self,
        i: usize,
        key: &str,
        what: &str,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let done = &done;
        let found = poll_until(scaled(Duration::from_secs(20)), || async move {
            let value = self.key_on(i, key).await;
            done(&value).then_some(value)
        })
        .await;
        match found {
            Some(value) => value,
            None => panic!("{what}: master {i} holds {:?}", self.key_on(i, key).await),
        }
    }

    /// Waits (bounded) until every master has run the vote that set `key` (a `lock()` returns
    /// once a majority did; the rest may still be on their way), so that later script counts
    /// do not include it. Returns the key's owner token on each master.
    async fn key_everywhere(&self, key: &str) -> Vec<String> {
        let mut tokens = Vec::with_capacity(self.masters.len());
        for i in 0..self.masters.len() {
            let token = self.await_key(i, key, "the key never came", |v| !v.is_empty());
            tokens.push(token.await);
        }
        tokens
    }

    /// Waits (bounded) until every master has `count` entries in the queue of `key`.
    async fn queued_everywhere(&self, key: &str, count: usize) {
        let queue = key.replace(":lock", ":queue");
        for (i, m) in self.masters.iter().enumerate() {
            let queued = eventually(scaled(Duration::from_secs(20)), || async {
                let n = m.cli(&["ZCARD", &queue]).await.expect("ZCARD");
                n.trim().parse::<usize>().expect("a count") >= count
            });
            assert!(queued.await, "{count} waiter(s) never queued on master {i}");
        }
    }

    /// Whether master `i` published a grant of the lock to `token` among the commands its
    /// `monitor` saw (scripts' commands included).
    async fn granted(&self, monitor: &faultkit::RedisMonitor, token: &str) -> bool {
        let seen = monitor
            .sync(scaled(Duration::from_secs(10)))
            .await
            .expect("MONITOR catches up");
        let grant = format!(" g:{token} ");
        monitor.commands_from(0)[..seen]
            .iter()
            .any(|c| c.len() == 3 && c[0].eq_ignore_ascii_case("publish") && c[2].contains(&grant))
    }

    /// The owner token at the head of master `i`'s queue of `key`.
    async fn head(&self, i: usize, key: &str) -> String {
        let queue = key.replace(":lock", ":queue");
        let head = self.masters[i]
            .cli(&["ZRANGE", &queue, "0", "0"])
            .await
            .expect("ZRANGE");
        head.trim().to_owned()
    }
}

fn scaled(d: Duration) -> Duration {
    d.mul_f64(time_scale())
}

/// The lock key of `n` on every master.
async fn lock_key(cluster: &Cluster, n: &LockName) -> String {
    let backend = RedlockBackend::connect(&cluster.url("")).await;
    backend.expect("connect").lock_key(n)
}

/// The keys of `n` on every master: the lock, its queue, the queue's expiries, the grants.
async fn keys_of(cluster: &Cluster, n: &LockName) -> (String, String, String, String) {
    let key = lock_key(cluster, n).await;
    let of = |suffix: &str| key.replace(":lock", suffix);
    let (queue, queue_exp, grants) = (of(":queue"), of(":queuexp"), of(":grants"));
    (key, queue, queue_exp, grants)
}

fn name(tag: &str) -> LockName {
    LockName::new(format!("grant-{tag}-{:08x}", fastrand::u32(..))).expect("name")
}

/// A lock whose first renewal comes long after each test's checks (a third of a minute at the
/// soonest): the claim is the TTL's when the safety poll is 10 minutes (`poll_ms=600000`).
fn long() -> LockOptions {
    LockOptions::new()
        .ttl(scaled(Duration::from_secs(60)))
        .wait_timeout(scaled(Duration::from_secs(60)))
}

type Won = tokio::sync::oneshot::Receiver<lockcore::Result<lockcore::LockGuard>>;

/// A waiter of `locker` for `n`, its result sent back when it returns.
fn waiter(locker: &Locker, n: &LockName, opts: LockOptions) -> Won {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (locker, n) = (locker.clone(), n.clone());
    tokio::spawn(async move {
        let _ = tx.send(locker.lock(&n, &opts).await);
    });
    rx
}

async fn won(rx: Won, within: Duration, what: &str) -> lockcore::LockGuard {
    tokio::time::timeout(within, rx)
        .await
        .unwrap_or_else(|_| panic!("{what}: the waiter did not get the lock within {within:?}"))
        .expect("the waiter's result")
        .expect("the waiter's lock")
}

/// The holder's release grants the lock on every master to the one queued waiter, which holds
/// it as the grants arrive: the hand-over costs the release's five scripts and no vote (the
/// waiter's safety poll is 10 minutes away; its renewal tens of seconds). Its key is on every
/// master, with the waiter's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_of_grants_holds_without_a_vote() {
    let cluster = Cluster::start().await;
    let holder = cluster.client("poll_ms=600000").await;
    let waiters = cluster.client("poll_ms=600000").await;
    let n = name("majority");
    let key = lock_key(&cluster, &n).await;
    let held = holder.lock(&n, &long()).await.expect("holder locks");
    cluster.key_everywhere(&key).await;
    let start = cluster.script_calls().await;
    let rx = waiter(&waiters, &n, long());
    // Its vote before subscribing and its vote once subscribed, both refused on every master:
    // a release that overtook the second vote on some master would leave that vote's outcome,
    // not the grants, to decide the hand-over (seen once in 22 runs: the key gone on master 4).
    cluster
        .script_calls_reach(start + 10, "the waiter's two votes")
        .await;
    cluster.queued_everywhere(&key, 1).await;
    let token = cluster.head(0, &key).await;
    let monitor = cluster.masters[0].monitor().await.expect("MONITOR");
    let before = cluster.script_calls().await;
    assert_eq!(before, start + 10, "the waiter voted twice, no more");
    held.release().await.expect("release");
    let g = won(rx, scaled(Duration::from_secs(10)), "a granted hand-over").await;
    cluster
        .script_calls_reach(before + 5, "the release did not reach every master")
        .await;
    for (i, m) in cluster.masters.iter().enumerate() {
        assert_eq!(
            m.cli(&["GET", &key]).await.expect("GET").trim(),
            token,
            "master {i} holds the granted waiter's key"
        );
    }
    assert!(
        cluster.granted(&monitor, &token).await,
        "master 0's release granted the lock to the waiter"
    );
    assert!(g.is_valid());
    // No window to wait out: a vote of the waiter's lock() was sent before it returned, so on
    // each master it runs before the guard's release, sent after on the same connection. Once
    // every master has run that release (the key is gone everywhere), any vote is counted.
    g.release().await.expect("release");
    for i in 0..cluster.masters.len() {
        let what = "the guard's release never ran";
        cluster.await_key(i, &key, what, str::is_empty).await;
    }
    assert_eq!(
        cluster.script_calls().await - before,
        10,
        "a hand-over by grants costs the release on each master and nothing else (then the \
         granted guard's own release on each)"
    );
}

/// Requests per hand-over in a small scripted queue, so that the count cannot grow unnoticed:
/// a holder and three waiters (a client each, queued one after another so every master orders
/// them alike; safety polls and renewals far away). Each waiter that gets the lock releases it
/// when told and, the first time, waits again at once, as a looping worker does (its
/// subscriptions linger: the new wait sends no `SUBSCRIBE` and begins with its one vote,
/// which brings a ticket, so it queues at the tail of every master). Six hand-overs: each
/// costs the release on every master (5 scripts) and, after a waiter that waits again, that
/// waiter's vote (5), nothing else: no waiter votes for a lock it was granted.
///
/// No window to wait out: a vote of a holder's `lock()` was sent before it returned, so on
/// each master it runs before that holder's release, sent after on the same connection. Each
/// hand-over's count is taken once every master has run the release that made it (the key
/// there moved from the releaser's token to the next holder's, or is gone after the last), so
/// any vote of the releaser is in it; the vote of a releaser that waits again is awaited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_costs_the_release_and_the_requeued_vote_only() {
    let cluster = Cluster::start().await;
    let holder = cluster.client("poll_ms=600000").await;
    let n = name("count");
    let key = lock_key(&cluster, &n).await;
    let held = holder.lock(&n, &long()).await.expect("holder locks");
    cluster.key_everywhere(&key).await;
    type Got = (usize, tokio::sync::oneshot::Sender<()>);
    let (got_tx, mut got_rx) = tokio::sync::mpsc::unbounded_channel::<Got>();
    let mut tasks = Vec::new();
    for w in 0..3 {
        let locker = cluster.client("poll_ms=600000").await;
        let before = cluster.script_calls().await;
        let (n, got_tx) = (n.clone(), got_tx.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..2 {
                let g = locker.lock(&n, &long()).await.expect("the waiter's lock");
                let (tx, rx) = tokio::sync::oneshot::channel();
                got_tx.send((w, tx)).expect("the test listens");
                rx.await.expect("told to release");
                g.release().await.expect("the waiter's release");
            }
        }));
        // Its vote before subscribing and its first vote once subscribed.
        cluster
            .script_calls_reach(before + 10, "a new waiter's two votes")
            .await;
        cluster.queued_everywhere(&key, w + 1).await;
    }
    // The key on each master: the holder's token, then each holder's in turn.
    let mut tokens = cluster.key_everywhere(&key).await;
    // Waits (bounded) until every master has run the release of the holder whose token
    // `tokens` has: its key there moved on (granted to the next holder, or gone).
    let key_moved_on = |tokens: Vec<String>, what: String| {
        let (cluster, key) = (&cluster, &key);
        async move {
            let mut moved = Vec::with_capacity(tokens.len());
            for (i, token) in tokens.into_iter().enumerate() {
                let now = cluster.await_key(i, key, &what, |v| v != token).await;
                moved.push(now);
            }
            moved
        }
    };
    let subscribes = || cluster.calls(|c| c == "subscribe");
    let subscribed = subscribes().await;
    let mut before = cluster.script_calls().await;
    held.release().await.expect("release");
    let mut expected = 5;
    let mut rounds = [0; 3];
    for (hand, want) in [0, 1, 2, 0, 1, 2].into_iter().enumerate() {
        let (w, release) = tokio::time::timeout(scaled(Duration::from_secs(20)), got_rx.recv())
            .await
            .unwrap_or_else(|_| panic!("hand-over {hand}: nobody got the lock"))
            .expect("a waiter");
        assert_eq!(w, want, "hand-over {hand} went to the head of the queues");
        tokens = key_moved_on(tokens, format!("hand-over {hand}")).await;
        for (i, t) in tokens.iter().enumerate() {
            assert!(!t.is_empty(), "hand-over {hand}: master {i} granted nobody");
        }
        let sent = cluster
            .script_calls_reach(before + expected, &format!("hand-over {hand}"))
            .await
            - before;
        assert_eq!(
            sent, expected,
            "hand-over {hand} (to waiter {w}) cost {sent} scripts, {expected} expected: the \
             release on each master, and the vote of a releaser that waits again (a vote of the \
             releaser's lock() ran before its release; a vote of the new holder's may be in)"
        );
        before += sent;
        rounds[w] += 1;
        // Its release, and its vote when it waits again.
        expected = if rounds[w] == 1 { 10 } else { 5 };
        release.send(()).expect("the waiter listens");
    }
    for t in tasks {
        t.await.expect("a waiter's task");
    }
    let gone = key_moved_on(tokens, "the last release".to_owned()).await;
    assert!(
        gone.iter().all(String::is_empty),
        "the key is gone everywhere: {gone:?}"
    );
    assert_eq!(
        cluster.script_calls().await - before,
        5,
        "the last hand-over's holder released on each master and sent no vote"
    );
    assert_eq!(
        subscribes().await,
        subscribed,
        "a waiter that waits again uses its lingering subscriptions"
    );
}

/// A waiter that asked for grants and crashed (its queue entry and grant details are on every
/// master, nobody acts on them: written here by hand, as the dead waiter's last vote left
/// them, with a 2 s claim) is granted the lock by the holder's release. The next waiter gets it
/// once the claim runs out, plus its safety poll and slack: never after the lock's TTL (60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_granted_waiter_costs_the_next_at_most_the_claim() {
    let cluster = Cluster::start().await;
    let holder = cluster.client("poll_ms=500").await;
    let waiters = cluster.client("poll_ms=500").await;
    let n = name("crashed");
    let (key, queue, queue_exp, grants) = keys_of(&cluster, &n).await;
    let held = holder.lock(&n, &long()).await.expect("holder locks");
    let claim = Duration::from_secs(2);
    let ghost = "00000000000000000000000000dead00";
    for m in &cluster.masters {
        // First in line (the earliest place), its entry live for a minute.
        m.cli(&["ZADD", &queue, "1", ghost]).await.expect("ZADD");
        let now_ms = m.cli(&["TIME"]).await.expect("TIME");
        let secs: u64 = now_ms.split_whitespace().next().unwrap().parse().unwrap();
        let until = (secs + 60) * 1000;
        m.cli(&["ZADD", &queue_exp, &until.to_string(), ghost])
            .await
            .expect("ZADD");
        let details = format!("7 {} 0 dead-waiter", claim.as_millis());
        m.cli(&["HSET", &grants, ghost, &details])
            .await
            .expect("HSET");
    }
    let rx = waiter(&waiters, &n, long());
    cluster.queued_everywhere(&key, 2).await;
    let released = Instant::now();
    held.release().await.expect("release");
    let what = "the dead waiter was never granted the lock";
    cluster.await_key(0, &key, what, |v| v == ghost).await;
    let ttl = cluster.masters[0].cli(&["PTTL", &key]).await.expect("PTTL");
    let ttl: i64 = ttl.trim().parse().expect("a PTTL");
    assert!(
        (0..=claim.as_millis() as i64).contains(&ttl),
        "the dead waiter was granted the lock for its claim, not {ttl} ms"
    );
    let bound = claim + scaled(Duration::from_millis(500) + Duration::from_secs(3));
    let g = won(rx, bound, "behind a crashed granted waiter").await;
    let waited = released.elapsed();
    assert!(
        waited >= claim.saturating_sub(Duration::from_millis(100)),
        "the next waiter got the lock {waited:?} after the release, inside the dead waiter's \
         claim"
    );
    g.release().await.expect("release");
}

/// One master's release is held up (the master paused): the other four grant the waiter, a
/// majority, and it holds without a vote while the fifth is still stopped. Resumed, the fifth
/// master's release grants it there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_lost_on_one_master_is_made_up_by_the_majority() {
    let mut cluster = Cluster::start().await;
    let holder = cluster.client("poll_ms=600000").await;
    let waiters = cluster.client("poll_ms=600000").await;
    let n = name("one-lost");
    let key = lock_key(&cluster, &n).await;
    let held = holder.lock(&n, &long()).await.expect("holder locks");
    let rx = waiter(&waiters, &n, long());
    cluster.queued_everywhere(&key, 1).await;
    let token = cluster.head(0, &key).await;
    cluster.masters[4]
        .process()
        .pause()
        .expect("SIGSTOP master 4");
    held.release().await.expect("released on a majority");
    let g = won(rx, scaled(Duration::from_secs(10)), "four grants of five").await;
    for (i, m) in cluster.masters[..4].iter().enumerate() {
        assert_eq!(
            m.cli(&["GET", &key]).await.expect("GET").trim(),
            token,
            "{i}"
        );
    }
    cluster.masters[4].process().resume().expect("SIGCONT");
    let what = "the late release did not grant the waiter";
    cluster.await_key(4, &key, what, |v| v == token).await;
    assert!(g.is_valid());
    g.release().await.expect("release");
}

/// Every grant message is lost (the grants are made by hand here, as the release script makes
/// them, without publishing): the waiter's safety poll finds its own token holding the lock
/// on every master and holds, one vote later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_whose_messages_were_lost_are_found_by_the_safety_poll() {
    let cluster = Cluster::start().await;
    let holder = cluster.client("poll_ms=500").await;
    let waiters = cluster.client("poll_ms=500").await;
    let n = name("all-lost");
    let (key, queue, queue_exp, grants) = keys_of(&cluster, &n).await;
    let held = holder.lock(&n, &long()).await.expect("holder locks");
    let rx = waiter(&waiters, &n, long());
    cluster.queued_everywhere(&key, 1).await;
    let token = cluster.head(0, &key).await;
    for m in &cluster.masters {
        // The release script's grant, silently: the key to the head for its claim, out of line.
        m.cli(&["SET", &key, &token, "PX", "5000"])
            .await
            .expect("SET");
        m.cli(&["ZREM", &queue, &token]).await.expect("ZREM");
        m.cli(&["ZREM", &queue_exp, &token]).await.expect("ZREM");
        m.cli(&["HDEL", &grants, &token]).await.expect("HDEL");
    }
    let granted = Instant::now();
    let g = won(
        rx,
        scaled(Duration::from_millis(500) + Duration::from_secs(3)),
        "grants without their messages",
    )
    .await;
    assert!(
        g.is_valid(),
        "held {:?} after the grants",
        granted.elapsed()
    );
    drop(held);
    g.release().await.expect("release");
}

/// The holder's release reaches masters 0 and 1 only (on 2 to 4 a contender's key stands in
/// for it): two grants, a minority. The waiter waits a node timeout for more, then votes,
/// loses on 2 to 4 and gives the two grants back at once: its keys on masters 0 and 1 are gone
/// within seconds, not left for the claim (here the whole 60 s TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_of_grants_is_given_back() {
    let cluster = Cluster::start().await;
    let holder = cluster.client("poll_ms=600000").await;
    let waiters = cluster.client("poll_ms=600000").await;
    let n = name("minority");
    let key = lock_key(&cluster, &n).await;
    let held = holder.lock(&n, &long()).await.expect("holder locks");
    let rx = waiter(&waiters, &n, long());
    cluster.queued_everywhere(&key, 1).await;
    let token = cluster.head(0, &key).await;
    let monitor = cluster.masters[0].monitor().await.expect("MONITOR");
    for m in &cluster.masters[2..] {
        m.cli(&["SET", &key, "contender", "PX", "60000"])
            .await
            .expect("SET");
    }
    // Refused by a majority (2-4 hold the contender's key): an error, granted on 0 and 1.
    let _ = held.release().await;
    for i in 0..2 {
        let what = "the minority grant was not given back";
        cluster.await_key(i, &key, what, str::is_empty).await;
    }
    assert!(
        cluster.granted(&monitor, &token).await,
        "master 0's release granted the lock to the waiter"
    );
    for m in &cluster.masters[2..] {
        assert_eq!(
            m.cli(&["GET", &key]).await.expect("GET").trim(),
            "contender"
        );
    }
    drop(rx);
}
