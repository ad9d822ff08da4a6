//! locksmith and the ZooKeeper lock clients users already run, on one lock node, as real
//! processes: Curator's `InterProcessMutex` (Java, compiled here against Debian's Curator jars)
//! and kazoo's `Lock` (Python, Debian's python3-kazoo). Each direction (the peer holds and
//! locksmith waits; locksmith holds and the peer waits) and a contention loop with no overlap;
//! locksmith's readers beside Curator's `InterProcessReadWriteLock` and kazoo's `ReadLock` /
//! `WriteLock` (readers share, writers of either side wait for them and are waited for).
//! Needs `LOCK_TEST_ZK_URL`; a missing peer program fails (never skips).
//! go-zookeeper's `Lock` (Go, Debian's golang-github-samuel-go-zookeeper-dev, built here) makes
//! the same node names as Curator's protected mode and orders every child by its sequence.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use conformance::interop::{
    contend_with_peer, eventually, peer_held, peer_holds_after, release_peer,
    scaled_secs as scaled, spawn_timed_lock, unique, wins_after_peer_releases,
};
use faultkit::{PeerCommand, PeerProcess, now_unix_micros};
use lock_zk::ZkBackend;
use lockcore::{ErrorKind, LockOptions, Locker};

fn url() -> Option<String> {
    conformance::require_env("LOCK_TEST_ZK_URL")
}

fn opts() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(60))
        .wait_timeout(scaled(60))
}

/// The connect string of the servers in `url` (peers connect without a chroot and are given
/// the lock node's full path).
fn connect_string(url: &str) -> String {
    lock_zk::Config::parse(url).unwrap().hosts.join(",")
}

/// How long a contention loop runs on each side.
const LOOP: Duration = Duration::from_secs(4);

// ------------------------------------------------------------------------------- the peers

/// Jars the Curator peer needs (Debian: libcurator-recipes-java and its dependencies).
const CURATOR_JARS: &[&str] = &[
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-nop",
];

/// The Curator peer's classpath, compiled once per test binary into the target's scratch
/// directory (rebuilt each run, reused in place).
fn curator_classpath() -> &'static str {
    static CP: OnceLock<String> = OnceLock::new();
    CP.get_or_init(|| {
        let jars: Vec<String> = CURATOR_JARS
            .iter()
            .map(|j| format!("/usr/share/java/{j}.jar"))
            .collect();
        for jar in &jars {
            assert!(
                std::path::Path::new(jar).exists(),
                "{jar} is missing: install libcurator-recipes-java (scripts/install-servers.sh)"
            );
        }
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("curator-peer");
        std::fs::create_dir_all(&out).unwrap();
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/CuratorPeer.java");
        let status = std::process::Command::new("javac")
            .arg("-d")
            .arg(&out)
            .arg("-cp")
            .arg(jars.join(":"))
            .arg(&source)
            .status()
            .unwrap_or_else(|e| {
                panic!("cannot run javac: {e}; install default-jdk-headless (scripts/install-servers.sh)")
            });
        assert!(status.success(), "javac {} failed: {status}", source.display());
        format!("{}:{}", out.display(), jars.join(":"))
    })
}

fn curator(url: &str, path: &str, mode: &[&str]) -> PeerProcess {
    PeerCommand::new("Curator", "java")
        .args(["-cp", curator_classpath(), "CuratorPeer"])
        .args([connect_string(url), path.to_owned()])
        .args(mode.iter().copied())
        .package("default-jdk-headless")
        .spawn()
        .unwrap()
}

/// The go-zookeeper peer, built once per test binary into the target's scratch directory
/// (GOPATH mode over Debian's Go sources: no module download).
fn gozk_binary() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        let gopath = "/usr/share/gocode";
        assert!(
            std::path::Path::new(gopath)
                .join("src/github.com/samuel/go-zookeeper/zk/lock.go")
                .exists(),
            "go-zookeeper's sources are missing: install golang-github-samuel-go-zookeeper-dev (scripts/install-servers.sh)"
        );
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gozk-peer");
        std::fs::create_dir_all(&out).unwrap();
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/gozk/main.go");
        let bin = out.join("gozk");
        let status = std::process::Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg(&source)
            .env("GOPATH", gopath)
            .env("GO111MODULE", "off")
            .env("GOFLAGS", "")
            .env("GOCACHE", out.join("cache"))
            .status()
            .unwrap_or_else(|e| {
                panic!("cannot run go: {e}; install golang-go (scripts/install-servers.sh)")
            });
        assert!(status.success(), "go build {} failed: {status}", source.display());
        bin.display().to_string()
    })
}

fn gozk(url: &str, path: &str, mode: &[&str]) -> PeerProcess {
    PeerCommand::new("go-zookeeper", gozk_binary())
        .args([connect_string(url), path.to_owned()])
        .args(mode.iter().copied())
        .package("golang-go")
        .spawn()
        .unwrap()
}

fn kazoo(url: &str, path: &str, mode: &[&str]) -> PeerProcess {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/kazoo_peer.py");
    // Debian's interpreter, where python3-kazoo is installed (not a virtualenv's python3).
    PeerCommand::new("kazoo", "/usr/bin/python3")
        .args([script.to_owned(), connect_string(url), path.to_owned()])
        .args(mode.iter().copied())
        .package("python3-kazoo")
        .spawn()
        .unwrap()
}

/// Waits for the peer's `HELD <t>` and returns `t`.
/// Asserts that the lock node at `path` gets `n` children within 60 scaled seconds (a peer
/// queued behind locksmith, or locksmith behind a peer).
async fn queued(backend: &ZkBackend, path: &str, n: usize, what: &str) {
    let client = backend.client();
    assert!(
        eventually(scaled(60), || async {
            client.list_children(path).await.is_ok_and(|c| c.len() == n)
        })
        .await,
        "{what}"
    );
}

/// A backend with node names of `interop`'s layout, its locker, a fresh lock name and its node.
async fn connect(url: &str, interop: &str, prefix: &str) -> (ZkBackend, Locker, String, String) {
    let backend = ZkBackend::connect(&format!("{url}?interop={interop}"))
        .await
        .unwrap();
    let locker = Locker::new(backend.clone());
    let name = unique(prefix);
    let path = backend.lock_path(name.as_str()).unwrap();
    (backend, locker, name, path)
}

// ------------------------------------------------------------------------------- scenarios

/// The peer holds; locksmith's `try_lock` sees the lock held, and its `lock` queues behind the
/// peer's node, waits on its watch (no poll) and wins only after the peer released.
async fn peer_holds_locksmith_waits(
    url: &str,
    interop: &str,
    mut peer: impl FnMut(&str) -> PeerProcess,
) {
    let (backend, locker, name, path) = connect(url, interop, "interop-peer-holds").await;
    let mut holder = peer(&path);
    peer_held(&mut holder, scaled(60)).await;
    assert!(
        locker.try_lock(&name, &opts()).await.unwrap().is_none(),
        "locksmith's try_lock took a lock the peer holds"
    );
    let wakeups = backend.stats().watch_wakeups;
    let waiter = spawn_timed_lock(&locker, &name, &opts());
    assert!(
        eventually(scaled(20), || async { backend.stats().waiting == 1 }).await,
        "locksmith did not wait on a watch behind the peer"
    );
    assert!(
        !waiter.is_finished(),
        "locksmith took a lock the peer holds"
    );
    let guard = wins_after_peer_releases(&mut holder, waiter, "locksmith").await;
    assert_eq!(
        backend.stats().watch_wakeups,
        wakeups + 1,
        "locksmith should be woken once, by its watch on the peer's node"
    );
    guard.release().await.unwrap();
    holder.wait(scaled(20)).await.unwrap();
}

/// locksmith holds; the peer queues (its node appears behind ours) and wins only after
/// locksmith released: the deletion of locksmith's node wakes it.
async fn locksmith_holds_peer_waits(
    url: &str,
    interop: &str,
    mut peer: impl FnMut(&str) -> PeerProcess,
) {
    let (backend, locker, name, path) = connect(url, interop, "interop-locksmith-holds").await;
    let guard = locker.lock(&name, &opts()).await.unwrap();
    let mut waiter = peer(&path);
    queued(
        &backend,
        &path,
        2,
        "the peer did not queue behind locksmith",
    )
    .await;
    peer_holds_after(&mut waiter, "the peer behind locksmith", async {
        guard.release().await.unwrap()
    })
    .await;
    release_peer(&mut waiter).await;
}

/// Both sides loop acquire / critical section / release on one lock while the peer's loop runs:
/// no two critical sections overlap, and both sides get the lock.
async fn contention_loop(
    url: &str,
    interop: &str,
    mut peer: impl FnMut(&str, &str) -> PeerProcess,
) {
    let label = interop.to_owned();
    let (_backend, locker, name, path) = connect(url, interop, "interop-contention").await;
    let mut other = peer(&path, &LOOP.as_millis().to_string());
    let (ours, theirs) = contend_with_peer(
        &locker,
        &name,
        &opts(),
        &mut other,
        "the peer",
        LOOP + scaled(60),
    )
    .await;
    eprintln!(
        "contention on {path} ({label} layout): locksmith {ours} critical sections, peer {theirs}"
    );
}

/// Read-write interop: the peer's reader holds beside locksmith's, a writer of either side is
/// refused beside them; the peer's writer queues behind locksmith's reader and holds only after
/// it left; locksmith's reader queues behind the peer's writer and holds only after it left.
async fn readers_and_writers_across_clients(
    url: &str,
    interop: &str,
    mut peer: impl FnMut(&str, &str) -> PeerProcess,
) {
    let (backend, locker, name, path) = connect(url, interop, "interop-rw").await;
    let read = opts().shared();
    let ours = locker.try_lock(&name, &read).await.unwrap().expect("free");
    let mut reader = peer(&path, "read");
    peer_held(&mut reader, scaled(60)).await;
    assert!(
        locker.try_lock(&name, &opts()).await.unwrap().is_none(),
        "locksmith's writer took the lock beside two readers"
    );
    release_peer(&mut reader).await;

    let mut writer = peer(&path, "write");
    queued(
        &backend,
        &path,
        2,
        "the peer's writer did not queue behind locksmith's reader",
    )
    .await;
    peer_holds_after(
        &mut writer,
        "the peer's writer behind locksmith's reader",
        async { ours.release().await.unwrap() },
    )
    .await;
    assert!(
        locker.try_lock(&name, &read).await.unwrap().is_none(),
        "locksmith's reader took the lock beside the peer's writer"
    );
    let waiter = spawn_timed_lock(&locker, &name, &read);
    assert!(
        eventually(scaled(20), || async { backend.stats().waiting == 1 }).await,
        "locksmith's reader did not wait on a watch behind the peer's writer"
    );
    let guard = wins_after_peer_releases(&mut writer, waiter, "locksmith's reader").await;
    guard.release().await.unwrap();
    writer.wait(scaled(20)).await.unwrap();
}

// ---------------------------------------------------------------------------------- Curator

/// Issue 33: Curator's `InterProcessMutex` sorted locksmith's permit nodes after its own (their
/// names had no `lock-`) and held beside a permit holder. It queues behind the permit now, and
/// holds only once the permit is released; a locksmith permit asked for while Curator's node
/// is ahead is refused (`Conflict`: a name is a mutex or a semaphore).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_mutex_waits_for_locksmith_permit_holders() {
    let Some(url) = url() else { return };
    let backend = ZkBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone());
    let name = unique("interop-permit-curator");
    let path = backend.lock_path(name.as_str()).unwrap();
    let permit = locker
        .try_lock(&name, &opts().permits(2))
        .await
        .unwrap()
        .expect("free");
    let mut mutex = curator(&url, &path, &["hold"]);
    queued(
        &backend,
        &path,
        2,
        "Curator's mutex did not queue behind locksmith's permit",
    )
    .await;
    match locker.try_lock(&name, &opts().permits(2)).await {
        Err(e) if e.kind() == lockcore::ErrorKind::Conflict => {}
        Ok(Some(_)) => panic!("a second permit was given beside Curator's mutex node"),
        other => panic!("a permit behind Curator's mutex: expected Conflict, got {other:?}"),
    }
    // Held before the release would be two holders.
    peer_holds_after(
        &mut mutex,
        "Curator's mutex behind locksmith's permit",
        async { permit.release().await.unwrap() },
    )
    .await;
    release_peer(&mut mutex).await;
}

/// The issue-23 defect: `locksmith run` started while Curator held the path ran at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_holds_locksmith_waits() {
    let Some(url) = url() else { return };
    peer_holds_locksmith_waits(&url, "curator", |p| curator(&url, p, &["hold"])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locksmith_holds_curator_waits() {
    let Some(url) = url() else { return };
    locksmith_holds_peer_waits(&url, "curator", |p| curator(&url, p, &["hold"])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_locksmith_contend_without_overlap() {
    let Some(url) = url() else { return };
    contention_loop(&url, "curator", |p, ms| curator(&url, p, &["loop", ms])).await;
}

// ----------------------------------------------------------------------------- go-zookeeper

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gozk_holds_locksmith_waits() {
    let Some(url) = url() else { return };
    peer_holds_locksmith_waits(&url, "curator", |p| gozk(&url, p, &["hold"])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locksmith_holds_gozk_waits() {
    let Some(url) = url() else { return };
    locksmith_holds_peer_waits(&url, "curator", |p| gozk(&url, p, &["hold"])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gozk_and_locksmith_contend_without_overlap() {
    let Some(url) = url() else { return };
    contention_loop(&url, "curator", |p, ms| gozk(&url, p, &["loop", ms])).await;
}

/// Curator's `InterProcessReadWriteLock` (`__READ__` / `__WRIT__`) and locksmith's readers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_read_write_lock_and_locksmith_readers() {
    let Some(url) = url() else { return };
    readers_and_writers_across_clients(&url, "curator", |p, role| {
        curator(&url, p, &[&format!("hold-{role}")])
    })
    .await;
}

// ------------------------------------------------------------------------------------ kazoo

/// kazoo's `ReadLock` and `WriteLock` and locksmith's readers with `interop=kazoo`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_read_write_locks_and_locksmith_readers() {
    let Some(url) = url() else { return };
    readers_and_writers_across_clients(&url, "kazoo", |p, role| {
        kazoo(&url, p, &["hold", &format!("--{role}")])
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_holds_locksmith_waits() {
    let Some(url) = url() else { return };
    peer_holds_locksmith_waits(&url, "kazoo", |p| kazoo(&url, p, &["hold"])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locksmith_holds_kazoo_waits() {
    let Some(url) = url() else { return };
    locksmith_holds_peer_waits(&url, "kazoo", |p| kazoo(&url, p, &["hold"])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_and_locksmith_contend_without_overlap() {
    let Some(url) = url() else { return };
    contention_loop(&url, "kazoo", |p, ms| kazoo(&url, p, &["loop", ms])).await;
}

/// kazoo's `acquire(ephemeral=False)` holds through a persistent node: a live holder, which
/// locksmith (default layout) waits for instead of ignoring it as forged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_persistent_holder_is_waited_for() {
    let Some(url) = url() else { return };
    peer_holds_locksmith_waits(&url, "curator", |p| {
        kazoo(&url, p, &["hold", "--persistent"])
    })
    .await;
}

/// Without `interop=kazoo`, a kazoo client told about Curator's marker
/// (`extra_lock_patterns=["-lock-"]`) shares the lock with locksmith's default layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_with_extra_lock_pattern_and_default_layout_contend_without_overlap() {
    let Some(url) = url() else { return };
    contention_loop(&url, "curator", |p, ms| {
        kazoo(&url, p, &["loop", ms, "--extra-lock-pattern", "-lock-"])
    })
    .await;
}

/// `interop=kazoo` refuses a name that locksmith would escape (a kazoo client would lock
/// another path), before any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_mode_refuses_names_kazoo_maps_elsewhere() {
    let Some(url) = url() else { return };
    let backend = ZkBackend::connect(&format!("{url}?interop=kazoo"))
        .await
        .unwrap();
    let locker = Locker::new(backend.clone());
    for name in ["a.b", "dir/name", "sp ace", "ü"] {
        let err = locker.try_lock(name, &opts()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidName, "{name}: {err}");
        assert_eq!(
            backend.lock_path(name).unwrap_err().kind(),
            ErrorKind::InvalidName
        );
    }
    assert_eq!(backend.stats().nodes_created, 0);
    let ok = locker
        .try_lock(unique("plain_Name-1").as_str(), &opts())
        .await
        .unwrap()
        .expect("free");
    ok.release().await.unwrap();
}

/// Issue 35: locksmith waiters that give up (one at its wait timeout, one dropped while
/// waiting), each in a client whose runtime then ends as a process exits, leave no node ahead
/// of a Curator `InterProcessMutex` queued behind them: Curator holds within 1 s (scaled) of
/// the holder's release, not when the waiters' sessions expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locksmith_waiters_that_exit_leave_nothing_ahead_of_curator() {
    let Some(url) = url() else { return };
    let url = format!("{url}?interop=curator");
    let backend = ZkBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone());
    let name = unique("interop-gave-up");
    let path = backend.lock_path(name.as_str()).unwrap();
    let guard = locker.lock(&name, &opts()).await.unwrap();
    let children = |n: usize| {
        let (client, path) = (backend.client(), path.clone());
        async move {
            client
                .list_children(&path)
                .await
                .is_ok_and(|c| c.len() == n)
        }
    };
    let wait = scaled(8);
    let waiters = [false, true].map(|dropped| {
        let url = url.clone();
        let connect = move || async move { Ok(Locker::new(ZkBackend::connect(&url).await?)) };
        conformance::exiting_waiter(connect, name.as_str().to_owned(), opts(), wait, dropped)
    });
    assert!(
        eventually(scaled(20), || children(3)).await,
        "the two locksmith waiters did not queue behind the holder"
    );
    let mut peer = curator(&url, &path, &["hold"]);
    assert!(
        eventually(scaled(60), || children(4)).await,
        "Curator did not queue behind the locksmith waiters"
    );
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "a locksmith waiter stopped waiting before Curator queued behind it"
    );
    for w in waiters {
        tokio::task::spawn_blocking(move || w.join())
            .await
            .unwrap()
            .expect("a locksmith waiter");
    }
    assert!(
        children(2).await,
        "a locksmith waiter that gave up and exited left its node behind"
    );
    let released = now_unix_micros();
    guard.release().await.unwrap();
    let held = peer_held(&mut peer, scaled(20)).await;
    let bound = scaled(1).as_micros() as u64;
    assert!(
        held > released && held - released < bound,
        "Curator held {} ms after the holder's release (bound {} ms)",
        (held as i64 - released as i64) / 1000,
        bound / 1000
    );
    peer.send("").await.unwrap();
    peer.expect("RELEASED", scaled(20)).await.unwrap();
    peer.wait(scaled(20)).await.unwrap();
}
