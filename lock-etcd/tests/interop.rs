//! locksmith and etcd's own `concurrency.Mutex` on one lock, through `etcdctl lock` (Debian's
//! etcd-client) as a real process: `etcdctl lock <prefix>/<name>` and locksmith's lock `<name>`
//! share the key prefix `<prefix>/<name>/`, and both take the key with the lowest create
//! revision under it as the holder's. Each direction and a contention loop with no overlap.
//! Then etcd's `concurrency.Election` through `etcdctl elect` on the same layout: an observer
//! (`etcdctl elect -l`) sees locksmith's leaders and their values, and locksmith and `etcdctl
//! elect` candidates never lead at once, in either direction.
//! Needs `LOCK_TEST_ETCD_URL`; a missing `etcdctl` fails (never skips).

use std::time::Duration;

use conformance::interop::{
    contend_with_peer, eventually, peer_holds_after, scaled_secs as scaled, spawn_timed_lock,
    unique,
};
use faultkit::{PeerCommand, PeerProcess, now_unix_micros, unix_micros_at};
use lock_etcd::EtcdBackend;
use lockcore::{CampaignOptions, LockOptions, Locker};

fn url() -> Option<String> {
    conformance::require_env("LOCK_TEST_ETCD_URL")
}

fn opts() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_timeout(scaled(60))
}

/// How long the contention loop runs.
const LOOP: Duration = Duration::from_secs(4);

/// `etcdctl --endpoints=... lock <pfx> [-- CMD...]` on the servers of `url`, `pfx` the lock's
/// key prefix without its trailing `/` (the Mutex adds it).
fn etcdctl_args(url: &str, pfx: &str) -> Vec<String> {
    vec![
        endpoints(url),
        "lock".to_owned(),
        pfx.trim_end_matches('/').to_owned(),
    ]
}

/// `--endpoints=...` for the servers of `url`.
fn endpoints(url: &str) -> String {
    let config = lock_etcd::Config::parse(url).unwrap();
    assert!(
        !config.tls && config.user.is_none(),
        "these tests run etcdctl against a plain etcd"
    );
    format!("--endpoints={}", config.hosts.join(","))
}

fn etcdctl(args: Vec<String>) -> PeerProcess {
    PeerCommand::new("etcdctl lock", "etcdctl")
        .args(args)
        // etcdctl 3.4 speaks v3 by default; the variable pins it.
        .env("ETCDCTL_API", "3")
        .package("etcd-client")
        .spawn()
        .unwrap()
}

async fn keys_under(backend: &EtcdBackend, prefix: &str) -> usize {
    let opts = lock_etcd::etcd_client::GetOptions::new()
        .with_prefix()
        .with_keys_only();
    backend
        .client()
        .clone()
        .get(prefix, Some(opts))
        .await
        .map(|r| r.kvs().len())
        .unwrap_or(0)
}

/// Asserts that `n` keys come to be under `prefix` within `within` (a client queued behind
/// another, or the keys gone).
async fn keys_come_to(backend: &EtcdBackend, prefix: &str, n: usize, within: Duration, what: &str) {
    assert!(
        eventually(within, || async { keys_under(backend, prefix).await == n }).await,
        "{what}"
    );
}

/// Sends `signal` (`-INT`: unlock or resign and exit; `-KILL`) to an etcdctl peer.
fn signal(peer: &PeerProcess, signal: &str) {
    let pid = peer.id().expect("etcdctl runs").to_string();
    let status = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}: {status}");
}

/// `etcdctl lock <pfx> -- sh -c 'echo HELD <µs>'`: queues, prints when it holds, unlocks.
fn etcdctl_held_stamp(url: &str, prefix: &str) -> PeerProcess {
    let mut args = etcdctl_args(url, prefix);
    args.extend(["--", "sh", "-c", "echo HELD $(date +%s%6N)"].map(str::to_owned));
    etcdctl(args)
}

/// `etcdctl lock` holds (it prints its key once it holds, and unlocks on SIGINT); locksmith's
/// `try_lock` sees the lock held and its `lock` wins only after etcdctl unlocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_holds_locksmith_waits() {
    let Some(url) = url() else { return };
    let backend = EtcdBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone());
    let name = unique("interop-etcdctl-holds");
    let prefix = backend.lock_prefix(name.as_str()).unwrap();
    let mut holder = etcdctl(etcdctl_args(&url, &prefix));
    let key = holder.expect(&prefix, scaled(30)).await.unwrap();
    assert_eq!(holder.seen(), [key], "etcdctl's first line is the held key");
    assert!(
        locker.try_lock(&name, &opts()).await.unwrap().is_none(),
        "locksmith's try_lock took a lock etcdctl holds"
    );
    let waiter = spawn_timed_lock(&locker, &name, &opts());
    keys_come_to(
        &backend,
        &prefix,
        2,
        scaled(20),
        "locksmith did not queue behind etcdctl",
    )
    .await;
    assert!(!waiter.is_finished(), "locksmith took a lock etcdctl holds");
    let unlock_sent = now_unix_micros();
    signal(&holder, "-INT");
    let (guard, won_at) = tokio::time::timeout(scaled(20), waiter)
        .await
        .expect("locksmith was not woken by etcdctl's unlock")
        .unwrap();
    assert!(
        won_at > unlock_sent,
        "locksmith won at {won_at} µs, before etcdctl was told to unlock at {unlock_sent} µs"
    );
    guard.release().await.unwrap();
    holder.wait(scaled(20)).await.unwrap();
}

/// A set taken in one transaction and `etcdctl lock` on one of its members: an etcdctl holder
/// of the middle name makes `try_lock_all` lose with no key left under any member (nothing
/// written), and a waiting `lock_all` holds no member while it waits and takes the set once
/// etcdctl unlocked; then, the set held, `etcdctl lock` on a member queues behind it and holds
/// only after the set's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_and_an_atomic_set_exclude_each_other() {
    let Some(url) = url() else { return };
    let backend = EtcdBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone());
    assert!(locker.capabilities().atomic_multi.is_yes());
    let base = unique("interop-set");
    let names: Vec<String> = ["a", "b", "c"].map(|m| format!("{base}-{m}")).into();
    let prefixes: Vec<String> = names
        .iter()
        .map(|n| backend.lock_prefix(n.as_str()).unwrap())
        .collect();
    let mut holder = etcdctl(etcdctl_args(&url, &prefixes[1]));
    holder.expect(&prefixes[1], scaled(30)).await.unwrap();
    assert!(
        locker
            .try_lock_all(names.clone(), &opts())
            .await
            .unwrap()
            .is_none(),
        "try_lock_all took a set with a member etcdctl holds"
    );
    for (i, p) in prefixes.iter().enumerate() {
        let expected = usize::from(i == 1);
        assert_eq!(keys_under(&backend, p).await, expected, "keys under {p}");
    }
    let waiter = {
        let (locker, names) = (locker.clone(), names.clone());
        tokio::spawn(async move { locker.lock_all(names, &opts()).await.unwrap() })
    };
    // The set waits on the busy member's queue: its key behind etcdctl's, none elsewhere.
    keys_come_to(
        &backend,
        &prefixes[1],
        2,
        scaled(20),
        "lock_all did not queue behind etcdctl",
    )
    .await;
    for p in [&prefixes[0], &prefixes[2]] {
        assert_eq!(
            keys_under(&backend, p).await,
            0,
            "a member held while the set waits"
        );
    }
    assert!(
        !waiter.is_finished(),
        "lock_all took a member etcdctl holds"
    );
    signal(&holder, "-INT");
    let set = tokio::time::timeout(scaled(20), waiter)
        .await
        .expect("lock_all was not woken by etcdctl's unlock")
        .unwrap();
    holder.wait(scaled(20)).await.unwrap();
    let mut waiter = etcdctl_held_stamp(&url, &prefixes[2]);
    keys_come_to(
        &backend,
        &prefixes[2],
        2,
        scaled(30),
        "etcdctl did not queue behind the set",
    )
    .await;
    peer_holds_after(&mut waiter, "etcdctl behind the set", async {
        set.release().await.unwrap()
    })
    .await;
    waiter.wait(scaled(20)).await.unwrap();
}

/// locksmith holds; `etcdctl lock -- CMD` queues (its key appears behind ours) and runs CMD
/// only after locksmith released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locksmith_holds_etcdctl_waits() {
    let Some(url) = url() else { return };
    let backend = EtcdBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone());
    let name = unique("interop-locksmith-holds");
    let prefix = backend.lock_prefix(name.as_str()).unwrap();
    let guard = locker.lock(&name, &opts()).await.unwrap();
    let mut waiter = etcdctl_held_stamp(&url, &prefix);
    keys_come_to(
        &backend,
        &prefix,
        2,
        scaled(30),
        "etcdctl did not queue behind locksmith",
    )
    .await;
    peer_holds_after(&mut waiter, "etcdctl behind locksmith", async {
        guard.release().await.unwrap()
    })
    .await;
    waiter.wait(scaled(20)).await.unwrap();
}

/// Both sides loop acquire / critical section / release while a shell loop of `etcdctl lock`
/// runs: no two critical sections overlap, and both sides get the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_and_locksmith_contend_without_overlap() {
    let Some(url) = url() else { return };
    let backend = EtcdBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone());
    let name = unique("interop-contention");
    let prefix = backend.lock_prefix(name.as_str()).unwrap();
    let lock = etcdctl_args(&url, &prefix).join(" ");
    let script = format!(
        "end=$(( $(date +%s) + {secs} )); n=0; \
         while [ $(date +%s) -lt $end ]; do \
           ETCDCTL_API=3 etcdctl {lock} -- sh -c 's=$(date +%s%6N); sleep 0.002; echo WINDOW $s $(date +%s%6N)' || exit 1; \
           n=$((n+1)); \
         done; echo DONE $n",
        secs = LOOP.as_secs()
    );
    let mut other = PeerCommand::new("etcdctl lock loop", "sh")
        .args(["-c".to_owned(), script])
        .package("etcd-client")
        .spawn()
        .unwrap();
    let (ours, theirs) = contend_with_peer(
        &locker,
        &name,
        &opts(),
        &mut other,
        "etcdctl lock",
        LOOP + scaled(60),
    )
    .await;
    eprintln!("contention on {prefix}: locksmith {ours} critical sections, etcdctl {theirs}");
}

/// The election `NAME` of etcd's side for locksmith's election `name`: the lock's key prefix
/// without its trailing `/` (the Election adds it).
fn election(backend: &EtcdBackend, name: &str) -> String {
    backend
        .lock_prefix(name)
        .unwrap()
        .trim_end_matches('/')
        .to_owned()
}

/// `etcdctl elect <election> <args...>` as a process whose pid is etcdctl's (signals reach it)
/// and whose every output line carries the Unix time in microseconds it was printed at, as
/// its last word (bash hands etcdctl's output through a line stamper, then execs etcdctl).
fn etcdctl_elect(url: &str, election: &str, args: &[&str]) -> PeerProcess {
    let mut cmd = vec![
        "etcdctl".to_owned(),
        endpoints(url),
        "elect".to_owned(),
        election.to_owned(),
    ];
    cmd.extend(args.iter().map(|a| (*a).to_owned()));
    let script = r#"exec "$@" > >(while IFS= read -r l; do echo "$l $(date +%s%6N)"; done)"#;
    PeerCommand::new("etcdctl elect", "bash")
        .args(["-c", script, "etcdctl-elect"].map(str::to_owned))
        .args(cmd)
        .env("ETCDCTL_API", "3")
        .package("etcd-client")
        .spawn()
        .unwrap()
}

/// A stamped line's text (all but its last word, the time).
fn text(line: &str) -> &str {
    line.rsplit_once(' ').map_or(line, |(t, _)| t)
}

/// The printed time of a stamped line, in Unix microseconds.
fn stamp(line: &str) -> u64 {
    line.rsplit_once(' ')
        .and_then(|(_, t)| t.parse().ok())
        .unwrap_or_else(|| panic!("no time stamp on {line:?}"))
}

/// Reads an `etcdctl elect` leader line pair (the leader's key, then its value: etcdctl's
/// simple output of a key-value), within `within`.
async fn leader_lines(
    peer: &mut PeerProcess,
    election: &str,
    within: Duration,
) -> (String, String) {
    let key = peer.expect(&format!("{election}/"), within).await.unwrap();
    let value = peer.expect("", within).await.unwrap();
    (key, value)
}

/// The create revision and lease of `key` (it must exist).
/// One election test's client and names: the backend, a locker on it, a fresh lock name
/// tagged `tag` and its election prefix as etcdctl names it.
async fn election_case(url: &str, tag: &str) -> (EtcdBackend, Locker, String, String) {
    let backend = EtcdBackend::connect(url).await.unwrap();
    let locker = Locker::new(backend.clone());
    let name = unique(tag);
    let election = election(&backend, &name);
    (backend, locker, name, election)
}

/// The leader `Locker::leader` reports now, which must campaign with `value`.
async fn leader_with(locker: &Locker, name: &str, value: &str) -> lockcore::Leader {
    let seen = locker.leader(name).await.unwrap().expect("a leader");
    assert_eq!(seen.value.as_deref(), Some(value), "leader() saw {seen:?}");
    seen
}

async fn created(backend: &EtcdBackend, key: &str) -> (u64, i64) {
    let resp = backend.client().clone().get(key, None).await.unwrap();
    let kv = resp.kvs().first().unwrap_or_else(|| panic!("no key {key}"));
    (u64::try_from(kv.create_revision()).unwrap(), kv.lease())
}

fn elect_opts() -> CampaignOptions {
    CampaignOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_timeout(scaled(60))
}

/// A locksmith leader is what `etcdctl elect -l` (etcd's `Election::Observe`) prints: its key,
/// whose create revision is the leader's term, and its campaign value as is; when it resigns
/// and another locksmith candidate is elected, the observer prints the new leader's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_observer_sees_locksmith_leaders() {
    let Some(url) = url() else { return };
    let (backend, locker, name, election) = election_case(&url, "interop-elect-observed").await;
    let leader = locker
        .campaign(&name, "10.0.0.1:8080", &elect_opts())
        .await
        .unwrap();
    let mut observer = etcdctl_elect(&url, &election, &["-l"]);
    let (key, value) = leader_lines(&mut observer, &election, scaled(30)).await;
    assert_eq!(
        text(&value),
        "10.0.0.1:8080",
        "etcdctl elect -l printed {value:?}"
    );
    let (revision, _) = created(&backend, text(&key)).await;
    assert_eq!(
        Some(revision),
        leader.term(),
        "the leader key's create revision is not the term"
    );
    leader.resign().await.unwrap();
    let next = locker
        .campaign(&name, "10.0.0.2:8080", &elect_opts())
        .await
        .unwrap();
    let (key, value) = leader_lines(&mut observer, &election, scaled(30)).await;
    assert_eq!(
        text(&value),
        "10.0.0.2:8080",
        "etcdctl elect -l printed {value:?} after the change of leader"
    );
    let (revision, _) = created(&backend, text(&key)).await;
    assert_eq!(Some(revision), next.term());
    next.resign().await.unwrap();
}

/// An `etcdctl elect` leader (etcd's `Election::Campaign`) holds a locksmith campaign off:
/// `Locker::leader` reports its proposal and term meanwhile; killed (SIGKILL: no resignation),
/// its key lives on with its session lease, which is then revoked as its expiry would end it,
/// and only then is the locksmith candidate elected, with a later term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_leader_holds_off_a_locksmith_campaign() {
    let Some(url) = url() else { return };
    let (backend, locker, name, election) =
        election_case(&url, "interop-elect-etcdctl-leads").await;
    let prefix = backend.lock_prefix(name.as_str()).unwrap();
    let mut other = etcdctl_elect(&url, &election, &["other"]);
    let (key, value) = leader_lines(&mut other, &election, scaled(30)).await;
    assert_eq!(text(&value), "other");
    let (their_term, their_lease) = created(&backend, text(&key)).await;
    let seen = leader_with(&locker, &name, "other").await;
    assert_eq!(seen.term, Some(their_term), "leader() saw {seen:?}");
    let candidate = {
        let (locker, name) = (locker.clone(), name.clone());
        tokio::spawn(async move {
            let l = locker
                .campaign(&name, "10.0.0.1:8080", &elect_opts())
                .await
                .unwrap();
            (l, now_unix_micros())
        })
    };
    keys_come_to(
        &backend,
        &prefix,
        2,
        scaled(20),
        "the locksmith candidate did not queue behind etcdctl's leader",
    )
    .await;
    signal(&other, "-KILL");
    // Killed, it did not resign: its key stays with its lease.
    leader_with(&locker, &name, "other").await;
    assert!(
        !candidate.is_finished(),
        "locksmith was elected while etcdctl's leader key lived"
    );
    let revoked = now_unix_micros();
    backend
        .client()
        .clone()
        .lease_revoke(their_lease)
        .await
        .unwrap();
    let (leadership, elected_at) = tokio::time::timeout(scaled(20), candidate)
        .await
        .expect("the locksmith candidate was not elected after the etcdctl leader's lease ended")
        .unwrap();
    assert!(
        elected_at > revoked,
        "locksmith was elected at {elected_at} µs, before the etcdctl leader's lease was revoked at {revoked} µs"
    );
    assert!(
        leadership.term() > Some(their_term),
        "terms did not increase"
    );
    let seen = leader_with(&locker, &name, "10.0.0.1:8080").await;
    assert_eq!(seen.term, leadership.term());
    leadership.resign().await.unwrap();
}

/// A locksmith leader holds off an `etcdctl elect` candidate (its key queued behind ours, the
/// candidate silent: etcdctl prints the leader key once elected), which is elected only after
/// the locksmith leader resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locksmith_leader_holds_off_an_etcdctl_campaign() {
    let Some(url) = url() else { return };
    let (backend, locker, name, election) =
        election_case(&url, "interop-elect-locksmith-leads").await;
    let prefix = backend.lock_prefix(name.as_str()).unwrap();
    let leadership = locker
        .campaign(&name, "10.0.0.1:8080", &elect_opts())
        .await
        .unwrap();
    let mut candidate = etcdctl_elect(&url, &election, &["x"]);
    keys_come_to(
        &backend,
        &prefix,
        2,
        scaled(30),
        "etcdctl's candidate did not queue behind locksmith's leader",
    )
    .await;
    leader_with(&locker, &name, "10.0.0.1:8080").await;
    assert!(
        !candidate.has_output(),
        "etcdctl was elected while locksmith led: {:?}",
        candidate.seen()
    );
    let resigned = now_unix_micros();
    leadership.resign().await.unwrap();
    let (key, value) = leader_lines(&mut candidate, &election, scaled(20)).await;
    assert!(
        stamp(&key) > resigned,
        "etcdctl printed its leadership at {} µs, before locksmith resigned at {resigned} µs",
        stamp(&key)
    );
    assert_eq!(text(&value), "x");
    leader_with(&locker, &name, "x").await;
    signal(&candidate, "-INT");
    candidate.wait(scaled(20)).await.unwrap();
    keys_come_to(
        &backend,
        &prefix,
        0,
        scaled(20),
        "etcdctl did not resign on SIGINT",
    )
    .await;
}

/// Issue 35: locksmith waiters that give up (one at its wait timeout, one dropped while
/// waiting), each in a client whose runtime then ends as a process exits, leave no key ahead of
/// an `etcdctl lock` queued behind them: etcdctl holds within 1 s (scaled) of the holder's
/// release, not when the waiters' leases run out (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locksmith_waiters_that_exit_leave_nothing_ahead_of_etcdctl() {
    let Some(url) = url() else { return };
    let backend = EtcdBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone());
    let name = unique("interop-gave-up");
    let prefix = backend.lock_prefix(name.as_str()).unwrap();
    let guard = locker.lock(&name, &opts()).await.unwrap();
    let keys = |n: usize| {
        let (backend, prefix) = (&backend, &prefix);
        async move { keys_under(backend, prefix).await == n }
    };
    let wait = scaled(8);
    let waiters = [false, true].map(|dropped| {
        let url = url.clone();
        let connect = move || async move { Ok(Locker::new(EtcdBackend::connect(&url).await?)) };
        conformance::exiting_waiter(connect, name.as_str().to_owned(), opts(), wait, dropped)
    });
    assert!(
        eventually(scaled(20), || keys(3)).await,
        "the two locksmith waiters did not queue behind the holder"
    );
    let mut args = etcdctl_args(&url, &prefix);
    args.extend(["--", "sh", "-c", "echo HELD $(date +%s%6N)"].map(str::to_owned));
    let mut peer = etcdctl(args);
    assert!(
        eventually(scaled(30), || keys(4)).await,
        "etcdctl did not queue behind the locksmith waiters"
    );
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "a locksmith waiter stopped waiting before etcdctl queued behind it"
    );
    for w in waiters {
        tokio::task::spawn_blocking(move || w.join())
            .await
            .unwrap()
            .expect("a locksmith waiter");
    }
    assert!(
        keys(2).await,
        "a locksmith waiter that gave up and exited left its key behind"
    );
    let released = now_unix_micros();
    guard.release().await.unwrap();
    let held = unix_micros_at(&peer.expect("HELD", scaled(20)).await.unwrap(), 1).unwrap();
    let bound = scaled(1).as_micros() as u64;
    assert!(
        held > released && held - released < bound,
        "etcdctl held {} ms after the holder's release (bound {} ms)",
        (held as i64 - released as i64) / 1000,
        bound / 1000
    );
    peer.wait(scaled(20)).await.unwrap();
}
