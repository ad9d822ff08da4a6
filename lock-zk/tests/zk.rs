//! ZooKeeper-specific tests beyond the conformance suite (need `LOCK_TEST_ZK_URL`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use conformance::interop::{eventually, held_by_one_client_only, taken_and_released, unique};
use conformance::url_with_param;
use faultkit::{Proxy, ProxyMode};
use lock_zk::ZkBackend;
use lockcore::backend::{AcquireRequest, Backend};
use lockcore::{ErrorKind, Instant, LockOptions, Locker, LostReason};
use tokio::sync::mpsc;
use zookeeper_client as zk;

fn url() -> Option<String> {
    conformance::require_env("LOCK_TEST_ZK_URL")
}

fn opts() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(60))
        .wait_timeout(Duration::from_secs(60))
}

/// After the session expires, the backend opens a new session (as Curator does): the old
/// session's lease reports lost, and a later `lock()` on the same backend works without
/// rebuilding it (before, every later call returned `Unavailable` for good). The expiry is made
/// on the shared server without stopping it: the holder is partitioned by its proxy and an
/// operator's second handle on the same session closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_session_is_replaced_and_locks_work_again() {
    let Some(url) = url() else { return };
    let url = url_with_param(&url, "session_timeout_ms", "6000");
    let (proxy, through) = support::proxy(&url).await;
    let upstream = proxy.upstream().to_string();
    let holder_backend = ZkBackend::connect(&through).await.unwrap();
    let session = holder_backend.client().session().clone();
    let first_session = holder_backend.session_id();
    let holder = Locker::new(holder_backend.clone());
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

    // Partition the holder: a disconnection is a lost lock at once (Curator's policy).
    proxy.set_mode(ProxyMode::Reset);
    let reason = tokio::time::timeout(scaled(5), lost.lost())
        .await
        .expect("the lost signal fired on the disconnection");
    assert_eq!(reason, LostReason::ConnectionLost);
    // Then close its session from a second handle.
    let hijack = zk::Client::connector()
        .with_session(session)
        .with_session_timeout(Duration::from_secs(6))
        .connect(&upstream)
        .await
        .expect("a second handle on the holder's session");
    drop(hijack); // not detached: sends closeSession, the server deletes the ephemeral node

    let g2 = tokio::time::timeout(scaled(10), waiting)
        .await
        .expect("the waiter got the lock after the session ended")
        .unwrap()
        .unwrap();
    let t2 = g2.fencing_token().unwrap();
    assert!(
        t2 > t1,
        "fencing token {t2} is not larger than the expired holder's {t1}"
    );

    // The holder reconnects, learns that its session is gone, and opens a new one.
    proxy.set_mode(ProxyMode::Pass);
    assert!(!g1.is_valid());
    let err = g1.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    let other = unique("after-expiry");
    let g3 = tokio::time::timeout(scaled(15), holder.lock(&other, &opts()))
        .await
        .expect("lock() after the expiry finished")
        .expect("lock() works on a new session after the old one expired");
    assert_ne!(holder_backend.session_id(), first_session);
    assert_eq!(holder_backend.stats().sessions, 2);
    g3.release().await.unwrap();
    g2.release().await.unwrap();
    // The expired holder's name works again too, from the same backend.
    let g4 = holder
        .try_lock(&name, &opts())
        .await
        .unwrap()
        .expect("free");
    assert!(g4.fencing_token().unwrap() > t2);
    g4.release().await.unwrap();
}

fn scaled(secs: u64) -> Duration {
    Duration::from_secs(secs).mul_f64(conformance::time_scale())
}

/// Runs `locker.lock(name)` in a task that reports when it won.
fn contend(locker: &Locker, name: &str) -> tokio::task::JoinHandle<(lockcore::LockGuard, Instant)> {
    let (locker, name) = (locker.clone(), name.to_owned());
    tokio::spawn(async move {
        let g = locker.lock(&name, &opts()).await.unwrap();
        (g, Instant::now())
    })
}

/// Runs a task that reports when the guard's lost signal fired.
fn lost_at(g: &lockcore::LockGuard) -> tokio::task::JoinHandle<(LostReason, Instant)> {
    let lost = g.lost();
    tokio::spawn(async move {
        let reason = lost.lost().await;
        (reason, Instant::now())
    })
}

/// A holder cut off the way a follower cut off from the leader cuts its clients off: the
/// connection stays up and pings are answered (the client's own dead-connection check sees
/// nothing wrong), but nothing reaches the leader, which expires the session and lets another
/// client in. The holder's lost signal must fire before that client wins: the backend's sync
/// to the leader goes unanswered. (Before: no signal at all until the follower dropped the
/// connection.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_follower_holder_is_lost_before_another_wins() {
    let Some(url) = url() else { return };
    cut_off_holder_is_lost_before_another_wins(
        &url,
        |p| p.set_mode(ProxyMode::AnswerKeepalives),
        0.0,
    )
    .await;
}

/// A holder behind a black hole (connection open, nothing passes, no reset): the client's
/// read timeout declares the connection dead and the lease is lost at once, before the
/// session can expire and another client win.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_holder_is_lost_before_another_wins() {
    let Some(url) = url() else { return };
    cut_off_holder_is_lost_before_another_wins(&url, |p| p.set_mode(ProxyMode::Blackhole), 0.0)
        .await;
}

/// The same with the grace set in code: `lost_after_disconnect` = 0.25 of the session
/// timeout still reports the loss before another client wins, and not at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_after_disconnect_grace_still_precedes_takeover() {
    let Some(url) = url() else { return };
    cut_off_holder_is_lost_before_another_wins(&url, |p| p.set_mode(ProxyMode::Reset), 0.25).await;
}

async fn cut_off_holder_is_lost_before_another_wins(
    url: &str,
    cut: impl FnOnce(&Proxy),
    grace: f64,
) {
    let url = url_with_param(url, "session_timeout_ms", "2000");
    let (proxy, through) = support::proxy(&url).await;
    let backend = ZkBackend::builder(&through)
        .unwrap()
        .lost_after_disconnect(grace)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let timeout = backend.session_timeout();
    assert_eq!(backend.lost_after_disconnect(), timeout.mul_f64(grace));
    let holder = Locker::new(backend);
    let other = Locker::new(ZkBackend::connect(&url).await.unwrap());
    let name = unique("cut-off");
    let g = holder
        .try_lock(&name, &opts())
        .await
        .unwrap()
        .expect("free");
    let lost = lost_at(&g);
    let winner = contend(&other, &name);
    let cut_at = Instant::now();
    cut(&proxy);
    let (g2, won_at) = tokio::time::timeout(timeout * 3 + scaled(10), winner)
        .await
        .expect("the session expired and the other client got the lock")
        .unwrap();
    assert!(
        won_at - cut_at >= timeout * 3 / 4,
        "taken over {:?} after the cut, session timeout {timeout:?}",
        won_at - cut_at
    );
    let (reason, lost_time) = tokio::time::timeout(timeout * 3, lost)
        .await
        .expect("the holder's lost signal never fired")
        .unwrap();
    assert_eq!(reason, LostReason::ConnectionLost);
    assert!(
        lost_time < won_at,
        "lost fired {:?} after the cut, the other client won at {:?}",
        lost_time - cut_at,
        won_at - cut_at
    );
    if grace > 0.0 {
        assert!(
            lost_time - cut_at >= timeout.mul_f64(grace),
            "lost fired {:?} after the cut, before the grace",
            lost_time - cut_at
        );
    }
    drop(g);
    g2.release().await.unwrap();
}

/// A partitioned holder (connection reset, reconnections refused): lost at once, long before
/// the server expires the session and lets the other client in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_holder_is_lost_before_another_wins() {
    let Some(url) = url() else { return };
    cut_off_holder_is_lost_before_another_wins(&url, |p| p.set_mode(ProxyMode::Reset), 0.0).await;
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
        waiter_backend
            .queued_waiters(&lockcore::LockName::new(&name).unwrap())
            .await
            .unwrap()
            == WAITERS
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
    let alice_url = url_with_param(
        &url_with_param(&url, "namespace", &ns),
        "digest",
        "alice:alice-pw%3Ax",
    );
    let mallory_url = url_with_param(
        &url_with_param(&url, "namespace", &ns),
        "digest",
        "mallory:mallory-pw",
    );
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
    let mallory_locker = Locker::new(mallory.clone());
    // Held: the children say so (world-read), nothing is written.
    let busy = mallory_locker.try_lock(&name, &opts()).await.unwrap();
    assert!(busy.is_none());
    assert!(g.is_valid());
    g.release().await.unwrap();
    // Free: mallory may not queue under alice's lock node: refused credentials, the kind every
    // backend gives them (issue 37: it was Backend here).
    let err = mallory_locker.try_lock(&name, &opts()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(!err.to_string().contains("pw"), "{err}");
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
    let url = url_with_param(&url, "session_timeout_ms", "2000");
    let (proxy, through) = support::proxy(&url).await;
    let backend = ZkBackend::connect(&through).await.unwrap();
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
    proxy.set_mode(ProxyMode::Reset);
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

/// A create whose reply was lost, retried, made a second node of the same contender: the first
/// node (lower) must not become the second one's predecessor. Every child with the caller's
/// owner prefix is its own: the lowest is kept and the rest deleted, and the contender holds the
/// lock. (Before: it waited on its own node until its deadline.) The first node is made by hand
/// with the contender's owner token, as the lost create would have made it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_create_reply_second_node_does_not_deadlock() {
    let Some(url) = url() else { return };
    let backend = ZkBackend::connect(&url).await.unwrap();
    let name = lockcore::LockName::new(unique("own-twice")).unwrap();
    let parent = backend.lock_path(&name).unwrap();
    let client = backend.client();
    // The lock node, as the first attempt made it (a container needs a child at once).
    client
        .mkdir(
            &parent,
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let req = AcquireRequest::new(
        name,
        lockcore::OwnerToken::random(),
        Duration::from_secs(60),
    );
    let (stat, seq) = client
        .create(
            &format!("{parent}/_c_{}-lock-", req.token.to_hex()),
            &[],
            &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let first = format!("_c_{}-lock-{seq}", req.token.to_hex());
    let deadline = Instant::now() + scaled(5);
    let acquired = backend
        .acquire(&req, Some(deadline))
        .await
        .unwrap()
        .expect("the contender holds the lock instead of waiting on its own node");
    assert_eq!(acquired.lease.fencing_token(), Some(stat.czxid as u64));
    assert_eq!(backend.stats().duplicates_removed, 1);
    let gone = eventually(scaled(5), || async {
        client.list_children(&parent).await.unwrap() == [first.clone()]
    })
    .await;
    assert!(gone, "the second node was not deleted");
    acquired.lease.release().await.unwrap();
    client.delete(&parent, None).await.unwrap();
}

/// Forged nodes of Curator's shape (`...lock-<seq>`, which Curator, go-zookeeper and locksmith
/// only make ephemeral) that no session owns never block the lock: a waiter skips them. (Before
/// that rule: they sorted first and a waiter waited on them forever.) Without credentials any
/// client may create them: nodes are world-writable. (A persistent node of kazoo's shape is a
/// live holder and is waited for: tests/interop.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_nodes_matching_the_pattern_do_not_block() {
    let Some(url) = url() else { return };
    let backend = ZkBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone());
    let name = unique("foreign");
    let parent = backend.lock_path(name.as_str()).unwrap();
    let intruder = ZkBackend::connect(&url).await.unwrap().client();
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    intruder.mkdir(&parent, &persistent).await.unwrap();
    let loose = format!("{parent}/_c_intruder-lock-0000000000");
    let forged = format!("{parent}/_c_{}-lock-0000000001", "f".repeat(32));
    for path in [&loose, &forged] {
        intruder.create(path, &[], &persistent).await.unwrap();
    }
    let g = tokio::time::timeout(scaled(10), locker.lock(&name, &opts()))
        .await
        .expect("the lock was blocked by foreign nodes")
        .unwrap();
    assert_eq!(backend.stats().foreign_ignored, 2);
    g.release().await.unwrap();
    // Once known, the forged nodes do not make try_lock see the lock as held either.
    let g = locker
        .try_lock(&name, &opts())
        .await
        .unwrap()
        .expect("free");
    g.release().await.unwrap();
    for path in [&loose, &forged, &parent] {
        intruder.delete(path, None).await.unwrap();
    }
}

/// A node made after a waiter's own yet named with a lower sequence was numbered by its creator,
/// not by the server (which numbers sequential children in creation order): the waiter skips it,
/// even in kazoo's shape, whose persistent nodes are otherwise live holders. Queue: holder A,
/// waiter C, waiter B; the forged node is named with C's sequence (sorting right after C) and C
/// gives up, so B lists again and finds the forged node right ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_numbered_out_of_creation_order_does_not_block() {
    let Some(url) = url() else { return };
    let holder = Locker::new(ZkBackend::connect(&url).await.unwrap());
    let middle = ZkBackend::connect(&url).await.unwrap();
    let backend = ZkBackend::connect(&url).await.unwrap();
    let waiter = Locker::new(backend.clone());
    let name = unique("renumbered");
    let parent = backend.lock_path(name.as_str()).unwrap();
    let g = holder.lock(&name, &opts()).await.unwrap();
    let c = {
        let (locker, name) = (Locker::new(middle.clone()), name.clone());
        tokio::spawn(async move { locker.lock(&name, &opts()).await })
    };
    assert!(eventually(scaled(20), || async { middle.stats().waiting == 1 }).await);
    let queued = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(&name, &opts()).await.unwrap() })
    };
    assert!(eventually(scaled(20), || async { backend.stats().waiting == 1 }).await);
    let intruder = ZkBackend::connect(&url).await.unwrap().client();
    let mut kids = intruder.list_children(&parent).await.unwrap();
    kids.sort_by_key(|k| k[k.len() - 10..].to_owned());
    assert_eq!(kids.len(), 3, "{kids:?}");
    let middle_seq = &kids[1][kids[1].len() - 10..];
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let forged = format!("{parent}/{}__lock__{middle_seq}", "e".repeat(32));
    intruder.create(&forged, &[], &persistent).await.unwrap();
    c.abort();
    assert!(
        eventually(scaled(20), || async {
            backend.stats().foreign_ignored == 1
        })
        .await,
        "the waiter did not skip the renumbered node"
    );
    assert!(
        !queued.is_finished(),
        "the waiter won while the holder holds"
    );
    g.release().await.unwrap();
    let g = tokio::time::timeout(scaled(20), queued)
        .await
        .expect("the waiter was blocked by a renumbered node")
        .unwrap();
    g.release().await.unwrap();
    intruder.delete(&forged, None).await.unwrap();
}

/// `try_lock` on a held lock sends one request (a listing) and writes nothing: the lock node's
/// child version does not move. (Before: a create, a list and a delete, two of them quorum
/// writes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_on_a_held_lock_is_one_read() {
    let Some(url) = url() else { return };
    let holder = Locker::new(ZkBackend::connect(&url).await.unwrap());
    let (proxy, through) = support::proxy(&url).await;
    let backend = ZkBackend::connect(&through).await.unwrap();
    let contender = Locker::new(backend.clone());
    let name = unique("held");
    let parent = backend.lock_path(name.as_str()).unwrap();
    let g = holder
        .try_lock(&name, &opts())
        .await
        .unwrap()
        .expect("free");
    let (_, before) = backend.client().get_children(&parent).await.unwrap();
    let sent = proxy.requests();
    for _ in 0..10 {
        assert!(contender.try_lock(&name, &opts()).await.unwrap().is_none());
    }
    assert_eq!(
        proxy.requests() - sent,
        10,
        "try_lock on a held lock is one request"
    );
    let (_, after) = backend.client().get_children(&parent).await.unwrap();
    assert_eq!(
        after.cversion, before.cversion,
        "try_lock on a held lock wrote"
    );
    g.release().await.unwrap();
}

/// What holding leases costs: an uncontended `lock()` is one round trip of two pipelined
/// requests (create + list); then one `exists` that watches the holder's own node (so that a
/// force release is noticed at once, issue 35), sent by one task per lease after the grant,
/// which the caller does not wait for (lockcore's watchdog is one task per client, started by
/// the warm-up). (Issue 24 had taken the watch out: 2 requests and no task per lease.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_leases_cost_one_watch_each() {
    const LEASES: usize = 20;
    let Some(url) = url() else { return };
    let (proxy, through) = support::proxy(&url).await;
    let backend = ZkBackend::connect(&through).await.unwrap();
    let locker = Locker::new(backend.clone());
    let prefix = unique("many");
    // Warm the lock nodes up so that their creation is not counted.
    for i in 0..LEASES {
        locker
            .lock(format!("{prefix}-{i}"), &opts())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    // The warm-up's own-node watches go out from their tasks, which a loaded machine may
    // run after the warm-up's releases: wait until each had its answer, so that none is
    // counted below (one was, in a fresh-clone run: 61 requests).
    assert!(
        eventually(scaled(20), || async { backend.stats().node_watches == 0 }).await,
        "the warm-up's watches never ended: {:?}",
        backend.stats()
    );
    let metrics = tokio::runtime::Handle::current().metrics();
    let tasks = metrics.num_alive_tasks();
    let sent = proxy.requests();
    let mut guards = Vec::new();
    for i in 0..LEASES {
        guards.push(locker.lock(format!("{prefix}-{i}"), &opts()).await.unwrap());
    }
    assert_eq!(backend.stats().node_watches, LEASES as u64);
    // The watches go out from their tasks: wait (bounded) until they have.
    let expected = 3 * LEASES as u64;
    proxy.wait_requests(sent + expected, scaled(20)).await;
    let requests = proxy.requests() - sent;
    assert_eq!(
        requests, expected,
        "{requests} requests for {LEASES} leases"
    );
    let extra_tasks = metrics.num_alive_tasks() - tasks;
    assert!(
        extra_tasks <= LEASES,
        "{extra_tasks} tasks for {LEASES} leases"
    );
    assert_eq!(backend.stats().held, LEASES as u64);
    for g in guards {
        g.release().await.unwrap();
    }
    assert_eq!(backend.stats().held, 0);
}

/// The bare primitive (create ephemeral-sequential + delete) leaves nothing behind, and the
/// server's own request counter (mntr zk_packets_received) sees its two requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_cycle_and_server_requests() {
    let Some(url) = url() else { return };
    let backend = ZkBackend::connect(&url).await.unwrap();
    let name = lockcore::LockName::new(unique("bare")).unwrap();
    let before = backend.server_requests().await.unwrap();
    backend.bare_cycle(&name).await.unwrap();
    backend.bare_cycle(&name).await.unwrap();
    let after = backend.server_requests().await.unwrap();
    assert!(
        after >= before + 4,
        "mntr counted {} requests",
        after - before
    );
    let parent = backend.lock_path(&name).unwrap();
    assert_eq!(
        backend.client().list_children(&parent).await.unwrap(),
        Vec::<String>::new()
    );
}

trait DescribeForTest {
    fn describe_for_test(&self) -> String;
}

impl DescribeForTest for ZkBackend {
    fn describe_for_test(&self) -> String {
        lockcore::backend::Backend::describe(self)
    }
}

/// A backend on the application's own session (`from_client`): its locks exclude those of a
/// backend from a URL on the same namespace, its nodes live in that session, and a namespace
/// that tries to escape is refused.
#[tokio::test]
async fn from_client_uses_the_applications_session() {
    let Some(url) = url() else { return };
    let hosts = url
        .trim_start_matches("zk://")
        .split(['/', '?'])
        .next()
        .unwrap();
    let client = zookeeper_client::Client::connect(hosts).await.unwrap();
    let ns = unique("app");
    let mine = lock_zk::ZkBackend::from_client(client.clone(), &ns)
        .await
        .unwrap();
    assert_eq!(mine.session_id(), client.session_id().0);
    let mine = Locker::new(mine);
    let by_url = Locker::new(
        lock_zk::ZkBackend::connect(&format!("zk://{hosts}?namespace={ns}"))
            .await
            .unwrap(),
    );
    let name = unique("shared");
    let opts = LockOptions::new().ttl(Duration::from_secs(5));
    let g = held_by_one_client_only(&mine, &by_url, &name, &opts).await;
    g.release().await.unwrap();
    taken_and_released(&by_url, &name, &opts).await;
    for bad in ["../x", "a/b", "ns\n"] {
        let err = lock_zk::ZkBackend::from_client(client.clone(), bad)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{bad:?}: {err}");
    }
}

/// How many acquisitions of `name` queue without holding, as the backend counts them.
async fn waiters(locker: &Locker, name: &str) -> usize {
    let name = lockcore::LockName::new(name).unwrap();
    locker.backend().queued_waiters(&name).await.unwrap()
}

/// Whether `n` acquisitions of `name` come to queue (polled: a queued waiter sends no event).
async fn queued(locker: &Locker, name: &str, n: usize) -> bool {
    eventually(Duration::from_secs(10), || async move {
        waiters(locker, name).await == n
    })
    .await
}

/// A permit freed by a holder other than the one nearest the head still admits the first
/// waiter at once: a waiter watching only the node `limit` places before it would sleep on,
/// with a permit free, until that particular holder left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_freed_out_of_order_admits_the_waiter() {
    let Some(url) = url() else { return };
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(Locker::new(ZkBackend::connect(&url).await.unwrap()));
    }
    let name = unique("sem-order");
    let two = opts().permits(2);
    let first = clients[0].try_lock(name.as_str(), &two).await.unwrap();
    let second = clients[1].try_lock(name.as_str(), &two).await.unwrap();
    let (first, second) = (first.expect("a permit"), second.expect("a permit"));
    let waiter = {
        let (c, name, two) = (clients[2].clone(), name.clone(), two.clone());
        tokio::spawn(async move { c.lock(name.as_str(), &two).await })
    };
    assert!(
        queued(&clients[0], &name, 1).await,
        "the third client never queued"
    );
    // The second holder (not the head) leaves; the first keeps its permit.
    second.release().await.unwrap();
    let third = tokio::time::timeout(
        Duration::from_secs(10).mul_f64(conformance::time_scale()),
        waiter,
    )
    .await
    .expect("the waiter was not admitted while a permit was free")
    .unwrap()
    .unwrap();
    let info = clients[0].inspect(name.as_str()).await.unwrap();
    assert_eq!(info.mode, Some(lockcore::LockMode::Permit { limit: 2 }));
    assert_eq!(info.shares.len(), 2, "{info:?}");
    assert_eq!(info.waiters, Some(0));
    let tokens: Vec<_> = info.shares.iter().map(|s| s.fencing_token).collect();
    assert_eq!(tokens, [first.fencing_token(), third.fencing_token()]);
    first.release().await.unwrap();
    third.release().await.unwrap();
}

/// inspect lists every reader holding, with its token and metadata; the writer waiting behind
/// them and the reader queued behind the writer are the waiters; a dropped waiter's node goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_lists_every_reader_and_counts_the_queue() {
    let Some(url) = url() else { return };
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(Locker::new(ZkBackend::connect(&url).await.unwrap()));
    }
    let name = unique("rw-inspect");
    let read = opts().shared().label("reader");
    let r1 = clients[0].try_lock(name.as_str(), &read).await.unwrap();
    let r2 = clients[1].try_lock(name.as_str(), &read).await.unwrap();
    let (r1, r2) = (r1.expect("a share"), r2.expect("a share"));
    let writer = {
        let (c, name) = (clients[2].clone(), name.clone());
        tokio::spawn(async move { c.lock(name.as_str(), &opts()).await })
    };
    assert!(queued(&clients[0], &name, 1).await);
    let reader = {
        let (c, name, read) = (clients[3].clone(), name.clone(), read.clone());
        tokio::spawn(async move { c.lock(name.as_str(), &read).await })
    };
    assert!(queued(&clients[0], &name, 2).await);
    let info = clients[0].inspect(name.as_str()).await.unwrap();
    assert!(info.held);
    assert_eq!(info.mode, Some(lockcore::LockMode::Shared));
    assert_eq!(info.waiters, Some(2));
    let tokens: Vec<_> = info.shares.iter().map(|s| s.fencing_token).collect();
    assert_eq!(tokens, [r1.fencing_token(), r2.fencing_token()]);
    for share in &info.shares {
        let holder = share.holder.as_ref().expect("each reader's metadata");
        assert_eq!(holder.label.as_deref(), Some("reader"));
    }
    // The queued reader gives up: its node goes, and the writer is still first in line.
    reader.abort();
    assert!(
        queued(&clients[0], &name, 1).await,
        "a dropped waiter's node stayed"
    );
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = writer.await.unwrap().unwrap();
    let info = clients[0].inspect(name.as_str()).await.unwrap();
    assert_eq!(info.mode, Some(lockcore::LockMode::Exclusive));
    assert_eq!(info.fencing_token, w.fencing_token());
    assert!(info.shares.is_empty());
    w.release().await.unwrap();
}

/// A name held one way refuses another at once (not as contention): permits beside a reader
/// or a writer, a reader or writer beside permits.
#[tokio::test]
async fn another_use_of_a_held_name_is_a_conflict() {
    let Some(url) = url() else { return };
    let a = Locker::new(ZkBackend::connect(&url).await.unwrap());
    let b = Locker::new(ZkBackend::connect(&url).await.unwrap());
    let name = unique("uses");
    let reader = a.try_lock(name.as_str(), &opts().shared()).await.unwrap();
    let err = b.lock(name.as_str(), &opts().permits(2)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    reader.expect("a share").release().await.unwrap();
    let permit = a.try_lock(name.as_str(), &opts().permits(2)).await.unwrap();
    for mode in [opts(), opts().shared()] {
        let err = b.lock(name.as_str(), &mode).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
        let err = b.try_lock(name.as_str(), &mode).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    }
    // The refused acquisitions left no node behind.
    assert_eq!(waiters(&a, &name).await, 0);
    permit.expect("a permit").release().await.unwrap();
}

/// With `interop=kazoo` a reader's node has kazoo's `ReadLock` name, and permits (which kazoo's
/// layout cannot name) are refused before any I/O.
#[tokio::test]
async fn kazoo_layout_names_readers_and_refuses_permits() {
    let Some(url) = url() else { return };
    let backend = ZkBackend::connect(&format!("{url}?interop=kazoo"))
        .await
        .unwrap();
    assert!(backend.capabilities().shared.is_yes());
    assert!(!backend.capabilities().permits.is_yes());
    let locker = Locker::new(backend.clone());
    let name = unique("kazoo-rw");
    let g = locker
        .try_lock(name.as_str(), &opts().shared())
        .await
        .unwrap()
        .expect("a share");
    let kids = backend
        .client()
        .list_children(&backend.lock_path(name.as_str()).unwrap())
        .await
        .unwrap();
    assert_eq!(kids.len(), 1);
    assert!(kids[0].contains("__rlock__"), "{kids:?}");
    g.release().await.unwrap();
    let err = locker
        .try_lock(name.as_str(), &opts().permits(2))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
}
