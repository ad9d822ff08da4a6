//! locksmith and etcd's own `concurrency.Mutex` on one lock, through `etcdctl lock` (Debian's
//! etcd-client) as a real process: `etcdctl lock <prefix>/<name>` and locksmith's lock `<name>`
//! share the key prefix `<prefix>/<name>/`, and both take the key with the lowest create
//! revision under it as the holder's. Each direction and a contention loop with no overlap.
//! Needs `LOCK_TEST_ETCD_URL`; a missing `etcdctl` fails (never skips).

use std::time::Duration;

use faultkit::{PeerCommand, PeerProcess, Window, check_windows, now_unix_micros, unix_micros_at};
use lock_etcd::EtcdBackend;
use lockcore::{Instant, LockOptions, Locker};

fn url() -> Option<String> {
    conformance::require_env("LOCK_TEST_ETCD_URL")
}

fn unique(prefix: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    format!("{prefix}-{:x}-{}", t.as_nanos(), std::process::id())
}

fn scaled(secs: u64) -> Duration {
    Duration::from_secs(secs).mul_f64(conformance::time_scale())
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
    let config = lock_etcd::Config::parse(url).unwrap();
    assert!(
        !config.tls && config.user.is_none(),
        "these tests run etcdctl against a plain etcd"
    );
    vec![
        format!("--endpoints={}", config.hosts.join(",")),
        "lock".to_owned(),
        pfx.trim_end_matches('/').to_owned(),
    ]
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

/// Polls `f` until it is true or `within` passes (server-side state with no event to await).
async fn eventually<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + within;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
    let waiter = {
        let (locker, name) = (locker.clone(), name.clone());
        tokio::spawn(async move {
            let g = locker.lock(&name, &opts()).await.unwrap();
            (g, now_unix_micros())
        })
    };
    assert!(
        eventually(scaled(20), || {
            let (backend, prefix) = (&backend, &prefix);
            async move { keys_under(backend, prefix).await == 2 }
        })
        .await,
        "locksmith did not queue behind etcdctl"
    );
    assert!(!waiter.is_finished(), "locksmith took a lock etcdctl holds");
    let unlock_sent = now_unix_micros();
    let pid = holder.id().expect("etcdctl runs").to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(status.success());
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
    assert!(
        eventually(scaled(20), || {
            let (backend, prefix) = (&backend, &prefixes[1]);
            async move { keys_under(backend, prefix).await == 2 }
        })
        .await,
        "lock_all did not queue behind etcdctl"
    );
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
    let pid = holder.id().expect("etcdctl runs").to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let set = tokio::time::timeout(scaled(20), waiter)
        .await
        .expect("lock_all was not woken by etcdctl's unlock")
        .unwrap();
    holder.wait(scaled(20)).await.unwrap();
    let mut args = etcdctl_args(&url, &prefixes[2]);
    args.extend(["--", "sh", "-c", "echo HELD $(date +%s%6N)"].map(str::to_owned));
    let mut waiter = etcdctl(args);
    assert!(
        eventually(scaled(30), || {
            let (backend, prefix) = (&backend, &prefixes[2]);
            async move { keys_under(backend, prefix).await == 2 }
        })
        .await,
        "etcdctl did not queue behind the set"
    );
    let released = now_unix_micros();
    set.release().await.unwrap();
    let held = unix_micros_at(&waiter.expect("HELD", scaled(20)).await.unwrap(), 1).unwrap();
    assert!(
        held > released,
        "etcdctl held at {held} µs, before the set was released at {released} µs"
    );
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
    let mut args = etcdctl_args(&url, &prefix);
    args.extend(["--", "sh", "-c", "echo HELD $(date +%s%6N)"].map(str::to_owned));
    let mut waiter = etcdctl(args);
    assert!(
        eventually(scaled(30), || {
            let backend = &backend;
            let prefix = &prefix;
            async move { keys_under(backend, prefix).await == 2 }
        })
        .await,
        "etcdctl did not queue behind locksmith"
    );
    let released = now_unix_micros();
    guard.release().await.unwrap();
    let held = unix_micros_at(&waiter.expect("HELD", scaled(20)).await.unwrap(), 1).unwrap();
    assert!(
        held > released,
        "etcdctl held at {held} µs, before locksmith released at {released} µs"
    );
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
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ours = {
        let (locker, name, stop) = (locker.clone(), name.clone(), stop.clone());
        tokio::spawn(async move {
            let mut windows: Vec<Window> = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let g = locker.lock(&name, &opts()).await.unwrap();
                let start = now_unix_micros();
                tokio::time::sleep(Duration::from_millis(2)).await;
                let end = now_unix_micros();
                g.release().await.unwrap();
                windows.push(Window::new("locksmith", start, end));
            }
            windows
        })
    };
    let theirs = other
        .loop_windows("etcdctl lock", LOOP + scaled(60))
        .await
        .unwrap();
    other.wait(scaled(20)).await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let ours = ours.await.unwrap();
    eprintln!(
        "contention on {prefix}: locksmith {} critical sections, etcdctl {}",
        ours.len(),
        theirs.len()
    );
    check_windows(&[ours, theirs].concat(), &["locksmith", "etcdctl lock"], 1).unwrap();
}
