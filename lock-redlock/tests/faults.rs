//! Redlock under faults, on five redis-server processes of its own (started here on free
//! ports, killed on drop): masters down, slow, restarted empty, a key expiring early; and the
//! requests one release costs, counted on masters nobody else uses.
//!
//! Where the algorithm allows two holders (a master restarting empty, a master's clock jumping
//! forward), the test asserts that the second holder is observed: that is Redlock's documented
//! limit, not a bug of this crate.

use std::collections::BTreeMap;
use std::time::Duration;

use conformance::time_scale;
use faultkit::RedisServer;
use lock_redlock::RedlockBackend;
use lockcore::{ErrorKind, Instant, LockMode, LockName, LockOptions, Locker};

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

    fn kill(&mut self, i: usize) {
        self.masters[i].process().kill();
    }

    /// Starts master `i` again on its port, empty.
    async fn restart(&mut self, i: usize) {
        self.masters[i].restart().await.expect("restart a master");
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .masters
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port()))
            .collect();
        // Generous per-node timeout: a restarted master's first reply includes a reconnect and
        // a script load, which on a loaded 2-core machine can take well over 100 ms.
        let node_timeout = scaled(Duration::from_millis(250)).as_millis();
        format!(
            "redlock://{}?node_timeout_ms={node_timeout}",
            hosts.join(",")
        )
    }

    async fn client(&self) -> Locker {
        Locker::new(RedlockBackend::connect(&self.url()).await.expect("connect"))
    }
}

fn scaled(d: Duration) -> Duration {
    d.mul_f64(time_scale())
}

fn name(tag: &str) -> LockName {
    LockName::new(format!("fault-{tag}-{:08x}", fastrand::u32(..))).expect("name")
}

/// Without renewal (guards renew by default): a holder's keys stay as its acquisition left them,
/// so a renewal cannot repair or refuse what a test did to a master.
fn opts() -> LockOptions {
    LockOptions::new()
        .ttl(scaled(Duration::from_secs(10)))
        .wait_timeout(scaled(Duration::from_secs(2)))
        .no_auto_renew()
}

/// Options for a call whose success the test asserts: a deadline long enough that a vote lost
/// to the node timeout on a loaded machine is retried rather than failing the test.
fn patient() -> LockOptions {
    opts().wait_timeout(scaled(Duration::from_secs(15)))
}

/// Waits (bounded) until `key` has expired on `master`: the early expiry has happened.
async fn gone_from(master: &RedisServer, key: &str) {
    let deadline = Instant::now() + scaled(Duration::from_secs(5));
    while master.cli(&["EXISTS", key]).await.expect("EXISTS").trim() != "0" {
        assert!(
            Instant::now() < deadline,
            "{key} did not expire on the master"
        );
        tokio::task::yield_now().await;
    }
}

/// The second client of a known-limit test: it wins `n` while the first holder's lease still
/// runs. One-shot attempts (after warming the client's connections and script cache on another
/// name), retried until a bounded deadline well inside the holder's TTL: `lock()` would wait
/// for the holder's expiry after a miss, which is exactly the moment the test must not reach.
async fn second_holder(cluster: &Cluster, n: &LockName, why: &str) -> lockcore::LockGuard {
    let b = cluster.client().await;
    b.lock(&name("warm"), &patient())
        .await
        .expect("warm-up lock")
        .release()
        .await
        .expect("warm-up release");
    b.flush().await;
    let deadline = Instant::now() + scaled(Duration::from_secs(4));
    loop {
        if let Some(g) = b.try_lock(n, &opts()).await.expect("try_lock") {
            return g;
        }
        assert!(Instant::now() < deadline, "{why}");
        tokio::task::yield_now().await;
    }
}

/// Locks, contends, extends and releases; asserts exclusion between two clients.
async fn locks_and_excludes(a: &Locker, b: &Locker, name: &LockName) {
    let g = a
        .lock(name, &patient())
        .await
        .expect("lock with a majority up");
    assert!(
        b.try_lock(name, &opts()).await.expect("try_lock").is_none(),
        "a second holder while a majority is up"
    );
    g.extend(scaled(Duration::from_secs(10)))
        .await
        .expect("extend");
    g.release().await.expect("release");
    let g = b.lock(name, &opts()).await.expect("lock after release");
    g.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_or_two_masters_down_still_lock() {
    let mut cluster = Cluster::start().await;
    let (a, b) = (cluster.client().await, cluster.client().await);
    let n = name("minority");
    cluster.kill(0);
    locks_and_excludes(&a, &b, &n).await;
    cluster.kill(3);
    locks_and_excludes(&a, &b, &n).await;
    // A client connecting now reaches only 3 of 5: still a majority.
    let c = cluster.client().await;
    locks_and_excludes(&c, &a, &n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_masters_cost_no_more_than_the_node_timeout() {
    let mut cluster = Cluster::start().await;
    let a = cluster.client().await;
    let n = name("slow");
    // Warm up the connections and the script cache.
    a.lock(&n, &patient())
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    // Release returns once a majority confirmed; the rest of the masters finish in the
    // background, which flush waits for.
    a.flush().await;
    cluster.masters[1].process().pause().expect("SIGSTOP");
    cluster.masters[4].process().pause().expect("SIGSTOP");
    // One attempt, won or not (a vote lost to the node timeout on a loaded machine makes it a
    // miss), returns about one node timeout after it was sent: the connections' own response
    // timeout is 2 s, so waiting for the stopped masters would show.
    let started = Instant::now();
    let attempt = a.try_lock(&n, &opts()).await.expect("try_lock");
    let took = started.elapsed();
    assert!(
        took < scaled(Duration::from_millis(1000)),
        "one try_lock took {took:?} with two stopped masters"
    );
    let g = match attempt {
        Some(g) => g,
        None => a.lock(&n, &patient()).await.expect("lock with 3 of 5 up"),
    };
    let started = Instant::now();
    g.release().await.expect("release");
    let took = started.elapsed();
    assert!(
        took < scaled(Duration::from_millis(1000)),
        "release took {took:?} with two stopped masters"
    );
    cluster.masters[1].process().resume().expect("SIGCONT");
    cluster.masters[4].process().resume().expect("SIGCONT");
    a.flush().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_down_is_unavailable_then_recovers() {
    let mut cluster = Cluster::start().await;
    let a = cluster.client().await;
    let n = name("majority");
    for i in [0, 2, 4] {
        cluster.kill(i);
    }
    let wait = scaled(Duration::from_secs(2));
    let started = Instant::now();
    let r = a
        .lock(&n, &opts().wait_timeout(wait))
        .await
        .map(|_| ())
        .expect_err("locked with 3 of 5 masters down");
    let took = started.elapsed();
    assert_eq!(r.kind(), ErrorKind::Unavailable, "{r}");
    assert!(
        took < wait + scaled(Duration::from_millis(1500)),
        "lock() returned after {took:?}, its deadline was {wait:?}"
    );
    assert_eq!(
        a.try_lock(&n, &opts())
            .await
            .map(|_| ())
            .expect_err("try_lock with 3 of 5 down")
            .kind(),
        ErrorKind::Unavailable
    );
    // The masters come back (empty, on the same ports): the same client reconnects.
    for i in [0, 2, 4] {
        cluster.restart(i).await;
    }
    let g = a
        .lock(&n, &opts().wait_timeout(scaled(Duration::from_secs(10))))
        .await
        .expect("lock after the masters came back");
    g.release().await.expect("release");
}

/// The holder (a writer, or a reader with `how` shared) won exactly a majority (two masters
/// were down when it locked); then one of its masters loses the key: the other two masters
/// and that one form a new majority.
async fn bare_majority_holder(
    cluster: &mut Cluster,
    how: &LockOptions,
) -> (Locker, lockcore::LockGuard, LockName) {
    let a = cluster.client().await;
    let n = name("two-holders");
    cluster.kill(3);
    cluster.kill(4);
    // lock(), not one try_lock: with only three masters up, one vote lost to the node timeout
    // on a loaded machine must not fail the setup.
    let g = a
        .lock(&n, how)
        .await
        .expect("lock on the three masters that are up");
    // The votes sent to the two dead masters are still in flight (each waits, at most the node
    // timeout, for a reconnection): let them end before the masters come back, or a vote
    // delivered late puts the holder's key on a fourth master.
    a.flush().await;
    cluster.restart(3).await;
    cluster.restart(4).await;
    (a, g, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_empty_master_allows_a_second_holder() {
    let mut cluster = Cluster::start().await;
    let (_a, held, n) = bare_majority_holder(&mut cluster, &patient()).await;
    // Master 2 restarts without persistence before the TTL ends: it forgot the key.
    cluster.kill(2);
    cluster.restart(2).await;
    let second = second_holder(
        &cluster,
        &n,
        "Redlock's known limit: a master restarted empty lets a second client win",
    )
    .await;
    assert!(held.is_valid() && second.is_valid(), "two holders at once");
    second.release().await.expect("release");
}

/// The read-write lock's version of the known limit: a reader on exactly three masters, one
/// of them restarted empty, and a writer wins beside the reader (the two majorities now share
/// only the master that forgot the share).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_empty_master_lets_a_writer_beside_a_reader() {
    let mut cluster = Cluster::start().await;
    let (_a, reading, n) = bare_majority_holder(&mut cluster, &patient().shared()).await;
    cluster.kill(2);
    cluster.restart(2).await;
    let writing = second_holder(
        &cluster,
        &n,
        "Redlock's known limit: a master restarted empty lets a writer win beside a reader",
    )
    .await;
    assert!(
        reading.is_valid() && writing.is_valid(),
        "a reader and a writer at once"
    );
    writing.release().await.expect("release");
}

/// Readers on a majority while two of five masters are killed: a writer is still refused (the
/// shares on the three live masters answer for the readers), a second reader still joins, a
/// reader's renewal and release are granted by the three, `inspect` sees both readers; then
/// the writer wins on the three, and a reader is refused beside it. Readers and writers keep
/// excluding each other with a minority down, as exclusive holders do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_exclude_a_writer_with_two_masters_down() {
    let mut cluster = Cluster::start().await;
    let (r1, r2, w) = (
        cluster.client().await,
        cluster.client().await,
        cluster.client().await,
    );
    let n = name("readers");
    let read = patient().shared();
    let first = r1.lock(&n, &read).await.expect("a reader on five masters");
    cluster.kill(0);
    cluster.kill(3);
    assert!(
        w.try_lock(&n, &opts()).await.expect("try_lock").is_none(),
        "a writer beside a reader with two masters down"
    );
    let second = r2
        .lock(&n, &read)
        .await
        .expect("a second reader with 3 of 5 masters up");
    first
        .extend(scaled(Duration::from_secs(10)))
        .await
        .expect("a reader's renewal by 3 of 5 masters");
    // inspect sees both readers on the majority that is up.
    let info = w.inspect(&n).await.expect("inspect with 3 of 5 up");
    assert!(
        info.held && info.mode == Some(LockMode::Shared) && info.shares.len() == 2,
        "inspect beside two readers: {info:?}"
    );
    // A writer waiting behind both readers (lock(), its deadline short) is refused too.
    let waited = w
        .lock(&n, &opts().wait_timeout(scaled(Duration::from_millis(300))))
        .await
        .map(|_| ())
        .expect_err("a writer got the lock beside two readers");
    assert_eq!(waited.kind(), ErrorKind::Timeout, "{waited}");
    first.release().await.expect("a reader's release");
    assert!(
        w.try_lock(&n, &opts()).await.expect("try_lock").is_none(),
        "a writer beside the second reader"
    );
    second.release().await.expect("a reader's release");
    let writing = w
        .lock(&n, &patient())
        .await
        .expect("the writer once the readers left, on 3 of 5");
    assert!(
        r1.try_lock(&n, &opts().shared())
            .await
            .expect("try_lock")
            .is_none(),
        "a reader beside the writer with two masters down"
    );
    writing.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_expiry_on_a_master_allows_a_second_holder() {
    let mut cluster = Cluster::start().await;
    let (a, held, n) = bare_majority_holder(&mut cluster, &patient()).await;
    let key = RedlockBackend::connect(&cluster.url())
        .await
        .expect("connect")
        .lock_key(&n);
    // Master 2's clock jumps forward: its key expires now rather than at the TTL.
    cluster.masters[2]
        .cli(&["PEXPIRE", &key, "1"])
        .await
        .expect("PEXPIRE");
    let second = second_holder(
        &cluster,
        &n,
        "Redlock's known limit: an early expiry on one master lets a second client win",
    )
    .await;
    assert!(held.is_valid() && second.is_valid(), "two holders at once");
    second.release().await.expect("release");
    drop(held);
    a.flush().await;

    // With the lock on all five masters, one early expiry is not enough.
    let g = a.lock(&n, &patient()).await.expect("lock on five masters");
    cluster.masters[0]
        .cli(&["PEXPIRE", &key, "1"])
        .await
        .expect("PEXPIRE");
    gone_from(&cluster.masters[0], &key).await;
    let b = cluster.client().await;
    assert!(
        b.try_lock(&n, &opts()).await.expect("try_lock").is_none(),
        "one early expiry among five masters gave a second holder"
    );
    g.release().await.expect("release");
}

/// Script calls (`EVAL`/`EVALSHA`) all five masters have run.
async fn script_calls(cluster: &Cluster) -> u64 {
    let mut calls = 0;
    for m in &cluster.masters {
        let info = m.cli(&["INFO", "commandstats"]).await.expect("INFO");
        calls += lock_redis::node::command_calls(&info, |c| c == "evalsha" || c == "eval");
    }
    calls
}

/// Options of the vote-count tests: nothing expires or gives up during a test, and no renewal
/// adds script calls to the count.
fn long() -> LockOptions {
    LockOptions::new()
        .ttl(scaled(Duration::from_secs(60)))
        .wait_timeout(scaled(Duration::from_secs(60)))
        .no_auto_renew()
}

/// A client of `cluster` with no safety-net poll (only a release or an expiry wakes its
/// waiters), every script already loaded on every master (a script's first call counts twice:
/// EVALSHA refused, then EVAL).
async fn counted_client(cluster: &Cluster) -> Locker {
    let url = format!("{}&poll_ms=600000", cluster.url());
    let locker = Locker::new(RedlockBackend::connect(&url).await.expect("connect"));
    locker
        .lock(&name("warm"), &long())
        .await
        .expect("warm-up lock")
        .release()
        .await
        .expect("warm-up release");
    locker
}

/// Starts `count` waiters for `n` in `waiters`, one at a time, each until it has voted and
/// sleeps: the first votes twice (once, then again once subscribed), the others once (the
/// first one's subscriptions are in place before they arrive, so their first vote is already
/// covered by them, and no subscription confirmation wakes anybody during the count).
/// Returns where their results arrive.
async fn queue_waiters(
    cluster: &Cluster,
    waiters: &Locker,
    n: &LockName,
    count: u64,
) -> tokio::sync::mpsc::UnboundedReceiver<lockcore::Result<lockcore::LockGuard>> {
    let (won_tx, won_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut voted = script_calls(cluster).await;
    for i in 0..count {
        let (waiters, n, won_tx) = (waiters.clone(), n.clone(), won_tx.clone());
        tokio::spawn(async move {
            let _ = won_tx.send(waiters.lock(&n, &long()).await);
        });
        voted += if i == 0 { 2 * 5 } else { 5 };
        let deadline = Instant::now() + scaled(Duration::from_secs(20));
        while script_calls(cluster).await < voted {
            assert!(Instant::now() < deadline, "a waiter did not vote");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    won_rx
}

/// Waits for one of the queued waiters to win, lets the negative window pass (every copy of a
/// release and every waiter's timer would have arrived by then), asserts that no second waiter
/// won, and returns the owner tokens of the scripts master 0 ran from its `asleep`-th command
/// on, with how many scripts each sent.
async fn voters_until_one_winner(
    monitor: &faultkit::RedisMonitor,
    won_rx: &mut tokio::sync::mpsc::UnboundedReceiver<lockcore::Result<lockcore::LockGuard>>,
    asleep: usize,
) -> BTreeMap<String, usize> {
    let winner = tokio::time::timeout(scaled(Duration::from_secs(20)), won_rx.recv())
        .await
        .expect("a waiter wins")
        .expect("a waiter result")
        .expect("lock");
    tokio::time::sleep(scaled(Duration::from_millis(500))).await;
    let seen = caught_up(monitor).await;
    assert!(won_rx.try_recv().is_err(), "two waiters won");
    drop(winner);
    script_tokens(&monitor.commands_from(asleep)[..seen - asleep])
}

/// Waits for one queued waiter to win ([`voters_until_one_winner`]) and asserts that `what`
/// (a release, an expiry) woke only one of the client's waiters into votes on master 0; the
/// `holder`'s token, if given, must have sent exactly its release there.
async fn assert_one_client_vote(
    monitor: &faultkit::RedisMonitor,
    won_rx: &mut tokio::sync::mpsc::UnboundedReceiver<lockcore::Result<lockcore::LockGuard>>,
    asleep: usize,
    what: &str,
    holder: Option<&str>,
) {
    let mut voters = voters_until_one_winner(monitor, won_rx, asleep).await;
    if let Some(token) = holder {
        let released = voters.remove(token);
        assert_eq!(released, Some(1), "the holder's release on master 0");
    }
    assert_eq!(
        voters.len(),
        1,
        "{what} woke {} waiters of one client into votes (scripts per owner token on master 0: \
         {voters:?})",
        voters.len()
    );
}

/// How many commands `monitor` collected once it printed everything the server ran so far.
async fn caught_up(monitor: &faultkit::RedisMonitor) -> usize {
    monitor
        .sync(scaled(Duration::from_secs(10)))
        .await
        .expect("MONITOR catches up")
}

/// The owner token (`ARGV[1]`) of every script in `commands`, with how many scripts sent it.
fn script_tokens(commands: &[Vec<String>]) -> BTreeMap<String, usize> {
    let mut tokens = BTreeMap::new();
    for c in commands {
        if !matches!(c[0].as_str(), "evalsha" | "eval") {
            continue;
        }
        let keys: usize = c[2].parse().expect("numkeys");
        *tokens.entry(c[3 + keys].clone()).or_insert(0) += 1;
    }
    tokens
}

/// One release reaches every master and each master's copy of it wakes a waiter: one client's
/// waiters still vote once for it, not once per copy (five times the requests for nothing).
/// Judged by the owner tokens on master 0, not by counting scripts: the one waiter that acts
/// may vote twice, when its first vote reached a master before the release did (a split vote,
/// undone and retried), which a count cannot tell from two waiters voting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_vote_per_client() {
    let cluster = Cluster::start().await;
    let holder = counted_client(&cluster).await;
    let waiters = counted_client(&cluster).await;
    let n = name("copies");
    let monitor = cluster.masters[0].monitor().await.expect("MONITOR");
    let held = holder.lock(&n, &long()).await.expect("holder locks");
    let locked = caught_up(&monitor).await;
    let holder_tokens = script_tokens(&monitor.commands_from(0)[..locked]);
    assert_eq!(
        holder_tokens.len(),
        1,
        "the holder's acquisition: {holder_tokens:?}"
    );
    let holder_token = holder_tokens.into_keys().next().expect("one token");
    let mut won_rx = queue_waiters(&cluster, &waiters, &n, 4).await;
    let asleep = caught_up(&monitor).await;

    held.release().await.expect("release");
    let release = "one release";
    assert_one_client_vote(&monitor, &mut won_rx, asleep, release, Some(&holder_token)).await;
}

/// A release lands on the masters one after another, and a waiter's vote can reach a master
/// before the release does: the vote woken by the first copies loses, and the copies from the
/// other masters must wake a vote again (before the fix they were skipped as copies of a
/// release already acted on, and the waiter slept until its safety poll: 584 ms late in a full
/// run, here 10 minutes). Staged by hand: masters 0 and 1 publish the release while a contender
/// holds them (the waiter's vote finds the lock held everywhere), then masters 2 to 4 release
/// and the contender leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_lands_late_on_some_masters_still_wakes_the_waiter() {
    let cluster = Cluster::start().await;
    let holder = counted_client(&cluster).await;
    let waiters = counted_client(&cluster).await;
    let n = name("staggered");
    let plain = RedlockBackend::connect(&cluster.url())
        .await
        .expect("connect");
    let (key, channel) = (plain.lock_key(&n), plain.release_channel(&n));
    let _held = holder.lock(&n, &long()).await.expect("holder locks");
    let mut won_rx = queue_waiters(&cluster, &waiters, &n, 1).await;
    let message = format!("release:{:016x}", fastrand::u64(..));

    // Masters 0 and 1: released, and taken at once by a contender; their copies wake the
    // waiter, whose vote finds the lock held on every master.
    let before = script_calls(&cluster).await;
    for m in &cluster.masters[..2] {
        m.cli(&["SET", &key, "contender", "PX", "60000"])
            .await
            .expect("SET");
        m.cli(&["PUBLISH", &channel, &message])
            .await
            .expect("PUBLISH");
    }
    let deadline = Instant::now() + scaled(Duration::from_secs(20));
    while script_calls(&cluster).await < before + 5 {
        assert!(Instant::now() < deadline, "the first copies woke no vote");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(won_rx.try_recv().is_err(), "the waiter won a held lock");

    // The release reaches masters 2 to 4, and the contender leaves 0 and 1 quietly.
    for (i, m) in cluster.masters.iter().enumerate() {
        m.cli(&["DEL", &key]).await.expect("DEL");
        if i >= 2 {
            m.cli(&["PUBLISH", &channel, &message])
                .await
                .expect("PUBLISH");
        }
    }
    let released = Instant::now();
    let won = tokio::time::timeout(scaled(Duration::from_secs(5)), won_rx.recv())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the release's later copies woke nobody: the waiter still sleeps {:?} after them",
                released.elapsed()
            )
        })
        .expect("a waiter result");
    won.expect("the waiter's lock")
        .release()
        .await
        .expect("release");
}

/// A crashed holder's keys expire without a message: of one client's waiters, one comes back
/// at the expiry and takes the lock; the others sleep on (no herd at expiry). Judged by owner
/// tokens on master 0 (see `one_release_wakes_one_vote_per_client`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_wakes_one_vote_per_client() {
    let cluster = Cluster::start().await;
    let waiters = counted_client(&cluster).await;
    let n = name("expiry");
    // A holder that crashed: its key on every master, never released.
    let key = RedlockBackend::connect(&cluster.url())
        .await
        .expect("connect")
        .lock_key(&n);
    // Expiring at the same moment on every master (they share this machine's clock), so that
    // the vote at the expiry wins at once rather than splitting over masters whose keys are a
    // few milliseconds apart.
    let now_ms: u128 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    // Far enough ahead that the four waiters are queued and asleep before it.
    let expires_at = now_ms + scaled(Duration::from_secs(5)).as_millis();
    for m in &cluster.masters {
        m.cli(&[
            "SET",
            &key,
            "crashed-holder",
            "PXAT",
            &expires_at.to_string(),
        ])
        .await
        .expect("SET");
    }
    let monitor = cluster.masters[0].monitor().await.expect("MONITOR");
    let mut won_rx = queue_waiters(&cluster, &waiters, &n, 4).await;
    let asleep = caught_up(&monitor).await;
    assert_one_client_vote(&monitor, &mut won_rx, asleep, "the expiry", None).await;
}

/// The refusal of a master listed twice: `InvalidConfig` naming nodes 1 and 2 as one server.
fn assert_names_nodes_1_and_2_as_one_server(err: &lockcore::Error) {
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("nodes 1 (") && msg.contains(") and 2 (") && msg.contains("same Redis server"),
        "{msg}"
    );
}

/// Issue 19: one server listed under two names (`127.0.0.1` and `localhost`) would vote twice,
/// and a majority of the list would not be a majority of the servers. `connect` asks every
/// master which server it is (`run_id`) and refuses the list, naming both nodes. On the shared
/// test masters (this test kills nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_master_under_two_names_is_refused_at_connect() {
    let Some(url) = conformance::require_env("LOCK_TEST_REDLOCK_URL") else {
        return;
    };
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let hosts = rest.split(['/', '?']).next().expect("hosts");
    let tail = &rest[hosts.len()..];
    let first = hosts.split(',').next().expect("a master");
    let port = first.rsplit_once(':').expect("host:port").1;
    // The first master again as node 2, by another name; plus the others.
    let listed = format!("{scheme}://{first},localhost:{port},{}{tail}", {
        let others: Vec<&str> = hosts.split(',').skip(1).collect();
        others.join(",")
    });
    let err = RedlockBackend::connect(&listed)
        .await
        .map(|_| ())
        .expect_err("connected with one master listed twice");
    assert_names_nodes_1_and_2_as_one_server(&err);
}

/// The same, found later: the second name's server was down at connect (a majority was up), and
/// comes back. The node connected last must not vote: every attempt of the client then fails
/// with `InvalidConfig` naming both nodes, instead of counting the server twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_master_under_two_names_is_refused_when_it_comes_back() {
    let mut cluster = Cluster::start().await;
    let port = |i: usize| cluster.masters[i].port();
    // Five nodes (a majority is three): master 0 twice, masters 1 to 3 once.
    let url = format!(
        "redlock://127.0.0.1:{p0},localhost:{p0},127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}?node_timeout_ms={}",
        port(1),
        port(2),
        port(3),
        scaled(Duration::from_millis(250)).as_millis(),
        p0 = port(0),
    );
    cluster.kill(0);
    let client = Locker::new(RedlockBackend::connect(&url).await.expect("3 of 5 are up"));
    let n = name("two-names");
    let g = client
        .try_lock(&n, &opts())
        .await
        .expect("try_lock")
        .expect("three masters are free");
    g.release().await.expect("release");
    cluster.restart(0).await;
    // Each attempt asks the down nodes to reconnect; the check runs when they do.
    let deadline = Instant::now() + scaled(Duration::from_secs(15));
    let err = loop {
        match client.try_lock(&n, &opts()).await {
            Err(e) => break e,
            Ok(g) => {
                if let Some(g) = g {
                    g.release().await.expect("release");
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "master 0 came back under both names and was never refused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_names_nodes_1_and_2_as_one_server(&err);
}

/// The lock key of `n`, set on masters 3 and 4 by a contender (a split vote's leftovers, for 10
/// minutes), so that the next acquisition stands on exactly masters 0-2.
async fn contender_on_3_and_4(cluster: &Cluster, n: &LockName) -> String {
    let key = RedlockBackend::connect(&cluster.url())
        .await
        .expect("connect")
        .lock_key(n);
    for m in &cluster.masters[3..] {
        m.cli(&["SET", &key, "contender", "PX", "600000"])
            .await
            .expect("SET");
    }
    key
}

/// Issue 35: a lock standing on exactly 3 of the 5 masters (two votes lost to a contender's
/// keys, as a split vote under contention leaves it) is repaired onto the other two by its
/// next renewal once they are free, so one of its three masters paused afterwards does not
/// end it: it stays valid and exclusive for three TTLs, no lost signal. Before the repair, the
/// renewal found 2 confirmations, 2 refusals and a silent master, and the holder lost the lock
/// at its validity deadline ("at risk: no renewal landed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_master_paused_while_the_lock_stands_on_three() {
    let mut cluster = Cluster::start().await;
    let (a, b) = (cluster.client().await, cluster.client().await);
    let n = name("stands-on-three");
    let key = contender_on_3_and_4(&cluster, &n).await;
    let ttl = scaled(Duration::from_secs(3));
    let renewing = LockOptions::new()
        .ttl(ttl)
        .wait_timeout(scaled(Duration::from_secs(15)));
    let g = a.lock(&n, &renewing).await.expect("lock on masters 0-2");
    let lost = g.lost();
    // The contender's keys go (its undo); the holder's next renewal takes masters 3 and 4.
    for m in &cluster.masters[3..] {
        assert_eq!(
            m.cli(&["GET", &key]).await.expect("GET").trim(),
            "contender"
        );
        m.cli(&["DEL", &key]).await.expect("DEL");
    }
    let repaired_by = Instant::now() + ttl + scaled(Duration::from_secs(3));
    for (i, m) in cluster.masters.iter().enumerate().skip(3) {
        while m.cli(&["EXISTS", &key]).await.expect("EXISTS").trim() != "1" {
            assert!(
                Instant::now() < repaired_by,
                "the holder's renewals never put its key on master {i}: the lock still stands \
                 on exactly 3 of 5 masters"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    cluster.masters[0]
        .process()
        .pause()
        .expect("SIGSTOP master 0");
    let paused = Instant::now();
    while paused.elapsed() < ttl * 3 {
        assert!(
            !lost.is_lost(),
            "the lock was lost {:?} after one of its masters paused: {:?}",
            paused.elapsed(),
            lost.reason()
        );
        assert!(
            b.try_lock(&n, &opts()).await.expect("try_lock").is_none(),
            "another client won the lock while it was held"
        );
        tokio::time::sleep(scaled(Duration::from_millis(200))).await;
    }
    assert!(
        g.is_valid(),
        "the guard is invalid after a minority master paused"
    );
    cluster.masters[0].process().resume().expect("SIGCONT");
    g.release().await.expect("release");
}

/// Issue 35: a renewal that fails undoes the repairs it made. The lock stands on exactly masters
/// 0-2 (a contender's votes on 3 and 4 at the acquire, then gone); its key is then deleted on
/// 0-2 behind the holder, as a `force_release` landing just ahead of a renewal in flight does.
/// The renewal finds 2 of 5 (its repairs on 3 and 4, which never had the key) and fails; those
/// two repairs are undone at once, so the lost lease holds the name on no master. Before, they
/// stayed until the TTL (30 s here), where they held the name from other clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_renewal_undoes_its_repairs() {
    let cluster = Cluster::start().await;
    let a = cluster.client().await;
    let n = name("undo-repairs");
    let key = contender_on_3_and_4(&cluster, &n).await;
    let ttl = scaled(Duration::from_secs(30));
    let g = a
        .lock(&n, &patient().ttl(ttl))
        .await
        .expect("lock on masters 0-2");
    for m in &cluster.masters {
        m.cli(&["DEL", &key]).await.expect("DEL");
    }
    let err = g.extend(ttl).await.expect_err("a renewal finding 2 of 5");
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    let by = Instant::now() + scaled(Duration::from_secs(2));
    for (i, m) in cluster.masters.iter().enumerate() {
        while m.cli(&["EXISTS", &key]).await.expect("EXISTS").trim() != "0" {
            assert!(
                Instant::now() < by,
                "master {i} still has the key of a renewal that failed: its repair was not \
                 undone, and holds the name there until the TTL ({ttl:?})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    drop(g);
}
