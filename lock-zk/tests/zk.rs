//! ZooKeeper-specific tests beyond the conformance suite (need `LOCK_TEST_ZK_URL`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use lock_zk::ZkBackend;
use lockcore::{ErrorKind, Instant, LockOptions, Locker, LostReason};
use support::Proxy;
use tokio::sync::mpsc;
use zookeeper_client as zk;

fn url() -> Option<String> {
    conformance::require_env("LOCK_TEST_ZK_URL")
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", fastrand_u64())
}

fn fastrand_u64() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
}

fn opts() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(60))
        .wait_timeout(Duration::from_secs(60))
}

/// Polls `f` until it is true or `within` passes (for server-side state with no event).
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

/// (1) The holder's session expires on the server (an operator's second handle on the same
/// session closes it while the holder is partitioned): its lost signal fires with
/// SessionExpired once it reconnects, and the waiter gets the lock with a larger fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_fires_lost_and_hands_over_with_larger_token() {
    let Some(url) = url() else { return };
    // A longer session makes the ConnectionLost bound (4/15 of it) outlast the steps below, so
    // the reason seen is the server's verdict.
    let url = support::with_param(&url, "session_timeout_ms=6000");
    let (upstream, _) = support::split_url(&url);
    let proxy = Proxy::start(upstream.clone()).await.unwrap();
    let holder_backend = ZkBackend::connect(&support::via(&url, proxy.addr()))
        .await
        .unwrap();
    let session = holder_backend.client().session().clone();
    let holder = Locker::new(holder_backend);
    let waiter = Locker::new(ZkBackend::connect(&url).await.unwrap());
    let name = unique("expiry");

    let g1 = holder
        .try_lock(&name, &opts())
        .await
        .unwrap()
        .expect("free");
    let t1 = g1.fencing_token().unwrap();
    let lost = g1.lost();
    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(&name, &opts()).await })
    };

    // Partition the holder, then close its session from a second handle.
    proxy.pause();
    let hijack = zk::Client::connector()
        .with_session(session)
        .with_session_timeout(Duration::from_secs(6))
        .connect(&upstream)
        .await
        .expect("a second handle on the holder's session");
    drop(hijack); // not detached: sends closeSession, the server deletes the ephemeral node

    let g2 = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter got the lock after the session ended")
        .unwrap()
        .unwrap();
    let t2 = g2.fencing_token().unwrap();
    assert!(
        t2 > t1,
        "fencing token {t2} is not larger than the expired holder's {t1}"
    );
    assert!(!lost.is_lost(), "lost fired before the holder could know");

    // The holder reconnects and learns from the server that its session is gone.
    proxy.resume();
    let reason = tokio::time::timeout(Duration::from_secs(10), lost.lost())
        .await
        .expect("the lost signal fired");
    assert_eq!(reason, LostReason::SessionExpired);
    assert!(!g1.is_valid());
    let err = g1.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    g2.release().await.unwrap();
}

/// A partitioned holder's lost signal fires with ConnectionLost within 2/3 of the session
/// timeout, before the server expires the session and lets anyone else in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_fires_connection_lost_before_takeover() {
    let Some(url) = url() else { return };
    let url = support::with_param(&url, "session_timeout_ms=2000");
    let (upstream, _) = support::split_url(&url);
    let proxy = Proxy::start(upstream).await.unwrap();
    let backend = ZkBackend::connect(&support::via(&url, proxy.addr()))
        .await
        .unwrap();
    let timeout = backend.session_timeout();
    let holder = Locker::new(backend);
    let other = Locker::new(ZkBackend::connect(&url).await.unwrap());
    let name = unique("partition");
    let g = holder
        .try_lock(&name, &opts())
        .await
        .unwrap()
        .expect("free");
    let lost = g.lost();
    let waiting = {
        let (other, name) = (other.clone(), name.clone());
        tokio::spawn(async move { other.lock(&name, &opts()).await })
    };
    let cut = Instant::now();
    proxy.pause();
    let reason = tokio::time::timeout(timeout * 2, lost.lost())
        .await
        .expect("lost fired");
    let lost_after = cut.elapsed();
    assert_eq!(reason, LostReason::ConnectionLost);
    assert!(
        lost_after < timeout * 2 / 3 + Duration::from_millis(200),
        "lost after {lost_after:?}"
    );
    let g2 = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the session expired and the waiter got the lock")
        .unwrap()
        .unwrap();
    let taken = cut.elapsed();
    assert!(
        taken >= timeout * 3 / 4,
        "taken over {taken:?} after the cut, session timeout {timeout:?}"
    );
    assert!(taken > lost_after, "taken over before the holder was told");
    drop(g);
    g2.release().await.unwrap();
}

/// (2) 50 waiters on one name: each release wakes exactly one waiter (the successor), not the
/// whole queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter() {
    const WAITERS: usize = 50;
    let Some(url) = url() else { return };
    let holder_backend = ZkBackend::connect(&url).await.unwrap();
    let waiter_backend = ZkBackend::connect(&url).await.unwrap();
    let name = unique("herd");
    let parent = holder_backend.lock_path(name.as_str()).unwrap();
    let admin = holder_backend.client().clone();
    let holder = Locker::new(holder_backend);
    let waiters = Locker::new(waiter_backend.clone());

    let g = holder
        .try_lock(&name, &opts())
        .await
        .unwrap()
        .expect("free");
    let (acquired_tx, mut acquired_rx) = mpsc::unbounded_channel();
    let mut releases = Vec::new();
    for i in 0..WAITERS {
        let (release_tx, mut release_rx) = mpsc::unbounded_channel::<()>();
        releases.push(release_tx);
        let (waiters, name, acquired_tx) = (waiters.clone(), name.clone(), acquired_tx.clone());
        tokio::spawn(async move {
            let g = waiters.lock(&name, &opts().wait_forever()).await.unwrap();
            acquired_tx.send(i).unwrap();
            let _ = release_rx.recv().await;
            g.release().await.unwrap();
        });
    }
    let queued = eventually(Duration::from_secs(20), || async {
        admin
            .list_children(&parent)
            .await
            .map(|c| c.len())
            .unwrap_or(0)
            == WAITERS + 1
            && waiter_backend.stats().waiting == WAITERS as u64
    })
    .await;
    assert!(
        queued,
        "the waiters did not all queue and set their watches"
    );
    assert_eq!(waiter_backend.stats().watch_wakeups, 0);

    g.release().await.unwrap();
    let mut order = Vec::new();
    for round in 0..WAITERS {
        let i = tokio::time::timeout(Duration::from_secs(10), acquired_rx.recv())
            .await
            .expect("a waiter got the lock")
            .unwrap();
        order.push(i);
        if round < 5 {
            // Absence of extra wake-ups can only be shown by waiting a little.
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(acquired_rx.try_recv().is_err(), "two waiters hold the lock");
            assert_eq!(
                waiter_backend.stats().watch_wakeups,
                round as u64 + 1,
                "release {round} woke more than one waiter"
            );
        }
        releases[i].send(()).unwrap();
    }
    let wakeups = waiter_backend.stats().watch_wakeups;
    assert_eq!(
        wakeups, WAITERS as u64,
        "{WAITERS} hand-overs caused {wakeups} wake-ups"
    );
    // (Arrival order among concurrently spawned tasks is not spawn order; fifo_order in the
    // conformance suite checks FIFO with spaced arrivals.)
    order.sort_unstable();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "some waiter never got the lock"
    );
}

/// (4) With digest auth, lock nodes carry creator-all + world-read: another identity can see
/// but neither delete a held lock node nor queue, while the holder can release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_acl_protects_lock_nodes() {
    let Some(url) = url() else { return };
    let ns = unique("acl");
    let alice_url = support::with_param(&url, &format!("namespace={ns}&digest=alice:alice-pw%3Ax"));
    let mallory_url =
        support::with_param(&url, &format!("namespace={ns}&digest=mallory:mallory-pw"));
    let alice = ZkBackend::connect(&alice_url).await.unwrap();
    let mallory = ZkBackend::connect(&mallory_url).await.unwrap();
    for shown in [alice.describe_for_test(), format!("{alice:?}")] {
        assert!(!shown.contains("alice-pw"), "{shown}");
    }
    let holder = Locker::new(alice.clone());
    let name = unique("held");
    let g = holder
        .try_lock(&name, &opts())
        .await
        .unwrap()
        .expect("free");
    let parent = alice.lock_path(name.as_str()).unwrap();
    let children = mallory
        .client()
        .list_children(&parent)
        .await
        .expect("world may read");
    assert_eq!(children.len(), 1);
    let node = format!("{parent}/{}", children[0]);
    let (acl, _) = alice.client().get_acl(&node).await.unwrap();
    assert!(
        acl.iter()
            .any(|a| a.scheme() == "digest" && a.id().starts_with("alice:")),
        "{acl:?}"
    );
    assert!(
        acl.iter()
            .any(|a| a.scheme() == "world" && a.permission() == zk::Permission::READ),
        "{acl:?}"
    );

    let r = mallory.client().delete(&node, None).await;
    assert!(matches!(r, Err(zk::Error::NoAuth)), "{r:?}");
    let r = mallory.client().delete(&parent, None).await;
    assert!(matches!(r, Err(zk::Error::NoAuth)), "{r:?}");
    let err = Locker::new(mallory.clone())
        .try_lock(&name, &opts())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(!err.to_string().contains("pw"), "{err}");
    assert!(g.is_valid());
    g.release().await.unwrap();
}

/// (5) Bad URLs are InvalidConfig and never show the digest password.
#[tokio::test]
async fn bad_urls_are_invalid_config_without_the_password() {
    let pw = "s3cr3t-pw";
    for url in [
        format!("zk://127.0.0.1:1?digest=u:{pw}&bogus=1"),
        format!("zk://127.0.0.1:1?digest={pw}"),
        format!("zk://u:{pw}@127.0.0.1:1"),
        format!("zk://127.0.0.1:1/a//b?digest=u:{pw}"),
        format!("zk://127.0.0.1:notaport?digest=u:{pw}"),
        format!("zk://127.0.0.1:1?digest=u:{pw}&session_timeout_ms=x"),
        format!("zk://127.0.0.1:1?{pw}"),
        format!("zookeeper://127.0.0.1:1?digest=u:{pw}"),
    ] {
        let err = ZkBackend::connect(&url).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(pw), "{url} leaked: {shown}");
    }
    // Unreachable server: Unavailable, still without the password.
    let err = ZkBackend::connect(&format!(
        "zk://127.0.0.1:1?digest=u:{pw}&session_timeout_ms=1000"
    ))
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(!format!("{err} {err:?}").contains(pw));
}

/// Fencing tokens keep increasing when the lock's parent node is deleted and re-created
/// (sequence numbers restart; creation zxids do not). The parent is a CONTAINER node.
#[tokio::test]
async fn fencing_survives_parent_recreation() {
    let Some(url) = url() else { return };
    let backend = ZkBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone());
    let name = unique("fence");
    let parent = backend.lock_path(name.as_str()).unwrap();
    let g = locker
        .try_lock(&name, &opts())
        .await
        .unwrap()
        .expect("free");
    let t1 = g.fencing_token().unwrap();
    // (Clients see ephemeralOwner 0 for containers; the backend says what the server took.)
    assert!(
        backend.uses_containers(),
        "the server refused CONTAINER lock nodes"
    );
    g.release().await.unwrap();
    backend.client().delete(&parent, None).await.unwrap();
    let g = locker
        .try_lock(&name, &opts())
        .await
        .unwrap()
        .expect("free");
    let t2 = g.fencing_token().unwrap();
    assert!(t2 > t1, "{t2} <= {t1}");
    g.release().await.unwrap();
}

/// A crashed holder (no goodbye, session left to expire) keeps the lock about one session
/// timeout, not less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_holder_frees_after_session_timeout() {
    let Some(url) = url() else { return };
    let url = support::with_param(&url, "session_timeout_ms=2000");
    let (upstream, _) = support::split_url(&url);
    let proxy = Proxy::start(upstream).await.unwrap();
    let backend = ZkBackend::connect(&support::via(&url, proxy.addr()))
        .await
        .unwrap();
    let timeout = backend.session_timeout();
    let holder = Locker::new(backend);
    let other = Locker::new(ZkBackend::connect(&url).await.unwrap());
    let name = unique("crash");
    let g = holder
        .try_lock(&name, &opts())
        .await
        .unwrap()
        .expect("free");
    g.abandon();
    let crashed = Instant::now();
    proxy.pause();
    drop(holder);
    let g2 = other.lock(&name, &opts()).await.unwrap();
    let took = crashed.elapsed();
    assert!(
        took >= timeout * 3 / 4,
        "freed {took:?} after the crash, session timeout {timeout:?}"
    );
    assert!(
        took <= timeout * 2 + Duration::from_secs(2),
        "freed only {took:?} after the crash"
    );
    g2.release().await.unwrap();
    drop(Arc::new(proxy));
}

trait DescribeForTest {
    fn describe_for_test(&self) -> String;
}

impl DescribeForTest for ZkBackend {
    fn describe_for_test(&self) -> String {
        lockcore::backend::Backend::describe(self)
    }
}
