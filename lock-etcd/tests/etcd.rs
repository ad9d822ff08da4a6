//! etcd-specific tests beyond the conformance suite (need `LOCK_TEST_ETCD_URL`; the secrets test
//! also `LOCK_TEST_ETCD_TLS_URL`).

use std::time::Duration;

use conformance::interop::{held_by_one_client_only, taken_and_released};
use faultkit::{Direction, Proxy};
use lock_etcd::EtcdBackend;
use lockcore::backend::{AcquireRequest, Backend, Background, LostNotifier};
use lockcore::{ErrorKind, Instant, LockName, LockOptions, Locker, LostReason, OwnerToken};

fn url() -> Option<String> {
    conformance::require_env("LOCK_TEST_ETCD_URL")
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", fastrand::u32(..))
}

fn scaled(d: Duration) -> Duration {
    d.mul_f64(conformance::time_scale())
}

/// etcd grants whole seconds: 1.2 s and 300 ms are rounded up and the grant is reported.
#[tokio::test]
async fn ttl_is_granted_in_whole_seconds_and_reported() {
    let Some(url) = url() else { return };
    let backend = EtcdBackend::connect(&url).await.unwrap();
    let name = LockName::new(unique("ttl")).unwrap();
    let req = AcquireRequest::new(
        name.clone(),
        OwnerToken::random(),
        Duration::from_millis(1200),
    );
    let acquired = backend.try_acquire(&req).await.unwrap().expect("free");
    let granted = acquired.granted_ttl.expect("the grant is reported");
    assert!(granted >= Duration::from_secs(2), "{granted:?}");
    assert_eq!(
        acquired.lease.extend(Duration::from_secs(2)).await.unwrap(),
        granted
    );
    acquired.lease.release().await.unwrap();

    // Below a second: the lease is a whole second (or the server's minimum), and the guard's
    // validity counts the TTL granted.
    let locker = Locker::new(backend);
    let g = locker
        .try_lock(&name, &LockOptions::new().ttl(Duration::from_millis(300)))
        .await
        .unwrap()
        .expect("free");
    assert!(g.valid_until() >= g.acquired_at() + Duration::from_millis(900));
    g.release().await.unwrap();
}

/// One release wakes one waiter: with five queued waiters of one client, the hand-over costs one
/// wake-up and no re-check (the first in line knows from its watch that every key ahead of it is
/// gone), and the next holder is the first in line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter() {
    let Some(url) = url() else { return };
    let backend = EtcdBackend::connect(&url).await.unwrap();
    let holder = Locker::new(EtcdBackend::connect(&url).await.unwrap());
    let waiters = Locker::new(backend.clone());
    let name = unique("herd");
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let g = holder.try_lock(&name, &opts).await.unwrap().expect("free");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    let prefix = backend.lock_prefix(&name).unwrap();
    for i in 0..5 {
        let (w, name, opts, tx) = (waiters.clone(), name.clone(), opts.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let g = w.lock(&name, &opts).await.unwrap();
            tx.send((i, g)).unwrap();
        }));
        // Queue them in order: each waiter's key is in place before the next one starts.
        let mut kv = backend.client().kv_client();
        let end = Instant::now() + scaled(Duration::from_secs(10));
        loop {
            let n = kv
                .get(
                    prefix.as_str(),
                    Some(
                        etcd_client::GetOptions::new()
                            .with_prefix()
                            .with_count_only(),
                    ),
                )
                .await
                .unwrap()
                .count();
            if n == i + 2 {
                break;
            }
            assert!(Instant::now() < end, "waiter {i} did not queue");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let before = backend.stats();
    g.release().await.unwrap();
    let (first, g1) = rx.recv().await.unwrap();
    assert_eq!(first, 0, "FIFO: the first waiter holds the lock");
    // Let any herd show itself.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = backend.stats();
    assert_eq!(after.wakeups - before.wakeups, 1, "{before:?} -> {after:?}");
    assert_eq!(
        after.rechecks - before.rechecks,
        0,
        "{before:?} -> {after:?}"
    );
    assert!(rx.try_recv().is_err(), "a second waiter got the lock");
    drop(g1);
    for _ in 1..5 {
        let (_, g) = rx.recv().await.unwrap();
        drop(g);
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Revoking the holder's lease (an operator's `etcdctl lease revoke`) deletes its key: the lost
/// signal fires and the lock is free for others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_revoke_fires_lost() {
    let Some(url) = url() else { return };
    let backend = EtcdBackend::connect(&url).await.unwrap();
    let admin = EtcdBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone());
    let name = unique("revoke");
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let g = locker.try_lock(&name, &opts).await.unwrap().expect("free");
    let lost = g.lost();
    let prefix = backend.lock_prefix(&name).unwrap();
    let mut kv = admin.client().kv_client();
    let resp = kv
        .get(
            prefix.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let lease = resp.kvs()[0].lease();
    assert_ne!(lease, 0, "the lock key is attached to a lease");
    assert_eq!(
        g.fencing_token(),
        Some(resp.kvs()[0].create_revision() as u64),
        "the fencing token is the key's create revision"
    );
    admin.client().lease_client().revoke(lease).await.unwrap();
    let reason = tokio::time::timeout(scaled(Duration::from_secs(5)), lost.lost())
        .await
        .expect("the lost signal fired");
    assert_eq!(reason, LostReason::RenewalRefused);
    let other = Locker::new(admin);
    let g2 = other
        .try_lock(&name, &opts)
        .await
        .unwrap()
        .expect("free after the revoke");
    assert!(g2.fencing_token() > g.fencing_token());
    assert_eq!(g.release().await.unwrap_err().kind(), ErrorKind::NotHeld);
    g2.release().await.unwrap();
}

/// The lock's keys (key, create revision, lease), first in line first.
async fn queue(admin: &EtcdBackend, name: &str) -> Vec<(String, i64, i64)> {
    let resp = admin
        .client()
        .kv_client()
        .get(
            admin.lock_prefix(name).unwrap(),
            Some(etcd_client::GetOptions::new().with_prefix().with_sort(
                etcd_client::SortTarget::Create,
                etcd_client::SortOrder::Ascend,
            )),
        )
        .await
        .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_owned(),
                kv.create_revision(),
                kv.lease(),
            )
        })
        .collect()
}

/// Waits (scaled bound) until the lock has `n` keys (holder and waiters).
async fn until_queued(admin: &EtcdBackend, name: &str, n: usize) {
    let end = Instant::now() + scaled(Duration::from_secs(10));
    while queue(admin, name).await.len() < n {
        assert!(Instant::now() < end, "{n} keys did not queue");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A retried acquisition (the same owner token, as `Locker::lock` retries one that failed
/// `Unavailable`) wins while the clean-up of its abandoned first attempt has not run yet; that
/// clean-up, running late, deletes nothing of the retry's: the retry keeps the lock (its key
/// stays, nobody else gets the lock, its lost signal stays quiet, it extends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_cleanup_of_an_abandoned_attempt_leaves_the_retry_held() {
    let Some(url) = url() else { return };
    let backend = EtcdBackend::connect(&url).await.unwrap();
    let admin = EtcdBackend::connect(&url).await.unwrap();
    let other = Locker::new(admin.clone());
    let name = unique("retry");
    let lock_name = LockName::new(name.clone()).unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let g = other.try_lock(&name, &opts).await.unwrap().expect("free");
    // Clean-ups go to a runtime that nobody drives until the test runs it: "late".
    let late = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let background = Background::on(late.handle().clone());
    let (notifier, lost) = LostNotifier::new();
    let req = AcquireRequest::new(lock_name, OwnerToken::random(), Duration::from_secs(1))
        .with_lost(notifier)
        .with_background(background.clone());
    let first = {
        let (b, r) = (backend.clone(), req.clone());
        tokio::spawn(async move { b.acquire(&r, None).await })
    };
    until_queued(&admin, &name, 2).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    assert_eq!(
        background.pending(),
        1,
        "the first attempt's clean-up waits"
    );
    g.release().await.unwrap();
    let won = tokio::time::timeout(scaled(Duration::from_secs(10)), backend.acquire(&req, None))
        .await
        .expect("the retry got the lock")
        .unwrap()
        .expect("acquired");
    let token = won.lease.fencing_token().unwrap() as i64;
    // Now the first attempt's clean-up runs, to its end.
    tokio::task::spawn_blocking(move || late.block_on(background.idle()))
        .await
        .unwrap();
    let keys = queue(&admin, &name).await;
    assert!(
        keys.first().is_some_and(|k| k.1 == token),
        "the retry's key was deleted by the first attempt's clean-up: {keys:?}"
    );
    assert!(other.try_lock(&name, &opts).await.unwrap().is_none());
    assert!(won.lease.extend(Duration::from_secs(1)).await.is_ok());
    assert!(!lost.is_lost(), "{:?}", lost.reason());
    won.lease.release().await.unwrap();
}

/// A queued waiter keeps its place through an outage longer than its lease TTL in which its
/// client gets no answers in time (they come late; the keep-alives reach the server, which
/// renews the lease): the client goes on renewing, so the waiter's key outlives the TTL by
/// far, and at the release it is served before the waiter queued behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_keeps_its_place_through_an_outage() {
    let Some(url) = url() else { return };
    let port: u16 = url
        .trim_start_matches("etcd://")
        .split(['/', '?', ','])
        .next()
        .and_then(|h| h.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .expect("LOCK_TEST_ETCD_URL names 127.0.0.1:PORT");
    let proxy = Proxy::start(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .unwrap();
    let slow_url = faultkit::rewrite_url(&url, port, proxy.port());
    let admin = EtcdBackend::connect(&url).await.unwrap();
    let holder = Locker::new(admin.clone());
    let first = Locker::new(EtcdBackend::connect(&slow_url).await.unwrap());
    let second = Locker::new(EtcdBackend::connect(&url).await.unwrap());
    let name = unique("outage");
    let ttl = Duration::from_secs(2);
    let wait = LockOptions::new()
        .ttl(ttl)
        .wait_timeout(scaled(Duration::from_secs(60)));
    let g = holder
        .try_lock(&name, &LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("free");
    let spawn = |locker: Locker| {
        let (name, wait) = (name.clone(), wait.clone());
        tokio::spawn(async move { locker.lock(&name, &wait).await })
    };
    let first_waiting = spawn(first);
    until_queued(&admin, &name, 2).await;
    let second_waiting = spawn(second);
    until_queued(&admin, &name, 3).await;
    let (key, revision, lease) = queue(&admin, &name).await.remove(1);

    // The outage: answers to the first waiter's client come later than its lease TTL. It ends
    // once the server shows the waiter's lease alive more than a TTL (and the server's 500 ms
    // expiry sweep) after it began: renewed by keep-alives whose answers the client had not
    // seen, so the client went a whole TTL without an acknowledged keep-alive and kept renewing.
    let outage = Instant::now();
    proxy.set_latency(Direction::ToClient, ttl + scaled(Duration::from_secs(1)));
    let mut leases = admin.client().lease_client();
    let end = outage + ttl * 3 + scaled(Duration::from_secs(5));
    while outage.elapsed() <= ttl + Duration::from_millis(500) {
        let left = leases.time_to_live(lease, None).await.unwrap().ttl();
        assert!(
            left > 0,
            "the first waiter's lease expired during the outage"
        );
        assert!(Instant::now() < end, "the outage did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.set_latency(Direction::ToClient, Duration::ZERO);
    // Well past a TTL after the outage, the waiter's key is still in place, on its lease: it
    // was renewed all along.
    let end = Instant::now() + ttl + scaled(Duration::from_secs(1));
    while Instant::now() < end {
        let keys = queue(&admin, &name).await;
        assert!(
            keys.iter().any(|k| *k == (key.clone(), revision, lease)),
            "the first waiter lost its place (its lease expired): {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    g.release().await.unwrap();
    let g1 = tokio::time::timeout(scaled(Duration::from_secs(10)), first_waiting)
        .await
        .expect("the first waiter is served first")
        .unwrap()
        .unwrap();
    assert!(!second_waiting.is_finished(), "two holders");
    let first_token = g1.fencing_token();
    g1.release().await.unwrap();
    let g2 = tokio::time::timeout(scaled(Duration::from_secs(10)), second_waiting)
        .await
        .expect("then the second")
        .unwrap()
        .unwrap();
    assert!(g2.fencing_token() > first_token);
    g2.release().await.unwrap();
}

/// A key's lease id and create revision, read by another client.
async fn key_of(admin: &EtcdBackend, key: &str) -> (i64, i64) {
    let resp = admin.client().kv_client().get(key, None).await.unwrap();
    let kv = &resp.kvs()[0];
    (kv.lease(), kv.create_revision())
}

/// A lease's (remaining, granted) TTL in seconds; remaining -1 when the lease is gone.
async fn lease_ttls(admin: &EtcdBackend, lease: i64) -> (i64, i64) {
    let r = admin
        .client()
        .lease_client()
        .time_to_live(lease, None)
        .await
        .unwrap();
    (r.ttl(), r.granted_ttl())
}

/// Extend to another TTL than acquired with moves the key to a new lease granted that TTL: the
/// key keeps its create revision (fencing token) and its place ahead of a queued waiter (no
/// wake-up), the old lease is revoked in the background (done once `flush` returns), the lock
/// outlives the old lease's TTL, renewal then keeps the new lease alive, and the lost signal
/// still fires when the key is deleted behind the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_to_another_ttl_moves_the_key_to_a_new_lease() {
    let Some(url) = url() else { return };
    let backend = EtcdBackend::connect(&url).await.unwrap();
    let admin = EtcdBackend::connect(&url).await.unwrap();
    let waiter_backend = EtcdBackend::connect(&url).await.unwrap();
    let locker = Locker::new(backend.clone());
    let name = unique("extend-moves");
    let lock_name = LockName::new(name.clone()).unwrap();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait_timeout(scaled(Duration::from_secs(30)));
    let g = locker.try_lock(&name, &opts).await.unwrap().expect("free");
    let lost = g.lost();
    // The holder's key: the first under the lock's prefix.
    let key = queue(&admin, &name).await.remove(0).0;
    let (old_lease, revision) = key_of(&admin, &key).await;
    assert_eq!(g.fencing_token(), Some(revision as u64));
    assert_eq!(lease_ttls(&admin, old_lease).await.1, 1);

    let waiting = {
        let (w, name, opts) = (
            Locker::new(waiter_backend.clone()),
            name.clone(),
            opts.clone(),
        );
        tokio::spawn(async move { w.lock(&name, &opts).await })
    };
    let end = Instant::now() + scaled(Duration::from_secs(10));
    while admin.queued_waiters(&lock_name).await.unwrap() < 1 {
        assert!(Instant::now() < end, "the waiter did not queue");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wakeups = waiter_backend.stats().wakeups;

    g.extend(Duration::from_secs(3)).await.unwrap();
    let (new_lease, same_revision) = key_of(&admin, &key).await;
    assert_eq!(same_revision, revision, "the key kept its create revision");
    assert_ne!(new_lease, old_lease, "the key is on a new lease");
    assert_eq!(lease_ttls(&admin, new_lease).await.1, 3);
    locker.flush().await;
    assert_eq!(
        lease_ttls(&admin, old_lease).await.0,
        -1,
        "the old lease was revoked"
    );
    assert_eq!(g.fencing_token(), Some(revision as u64));

    // Revoking the old lease left the key (on the new one) in place; nobody was woken.
    assert_eq!(key_of(&admin, &key).await, (new_lease, revision));
    assert!(!waiting.is_finished(), "the waiter got the lock");
    assert_eq!(
        waiter_backend.stats().wakeups,
        wakeups,
        "the move woke the waiter"
    );
    assert!(g.is_valid());
    // Renewal with the new TTL is a keep-alive of the new lease.
    g.extend(Duration::from_secs(3)).await.unwrap();
    assert_eq!(key_of(&admin, &key).await, (new_lease, revision));
    assert!(
        lease_ttls(&admin, new_lease).await.0 >= 2,
        "the new lease was kept alive"
    );

    // Deleted behind the holder: the lost signal fires, the waiter gets the lock.
    assert!(admin.force_release(&lock_name).await.unwrap() >= 1);
    let reason = tokio::time::timeout(scaled(Duration::from_secs(5)), lost.lost())
        .await
        .expect("the lost signal fired");
    assert_eq!(reason, LostReason::RenewalRefused);
    let g2 = tokio::time::timeout(scaled(Duration::from_secs(10)), waiting)
        .await
        .expect("the waiter got the lock")
        .unwrap()
        .unwrap();
    assert!(g2.fencing_token() > g.fencing_token());
    assert_eq!(g.release().await.unwrap_err().kind(), ErrorKind::NotHeld);
    g2.release().await.unwrap();
}

/// A listed member that is down does not stop `connect` while another answers.
#[tokio::test]
async fn dead_endpoint_does_not_stop_connect() {
    let Some(url) = url() else { return };
    // A port nothing listens on (bound, then closed).
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let rest = url.strip_prefix("etcd://").expect("an etcd:// URL");
    let url = format!("etcd://{dead},{rest}");
    let locker = Locker::new(
        tokio::time::timeout(scaled(Duration::from_secs(20)), EtcdBackend::connect(&url))
            .await
            .expect("connect returned")
            .unwrap(),
    );
    for _ in 0..5 {
        let g = locker
            .try_lock(
                unique("dead").as_str(),
                &LockOptions::new().ttl(Duration::from_secs(5)),
            )
            .await
            .unwrap()
            .expect("free");
        g.release().await.unwrap();
    }
}

/// Names never share keys: no lock's key prefix is a prefix of another's.
#[tokio::test]
async fn hostile_names_have_disjoint_prefixes() {
    let Some(url) = url() else { return };
    let backend = EtcdBackend::connect(&url).await.unwrap();
    let names = [
        "a", "a/b", "a%2Fb", "a_2Fb", "..", "../a", "a/", "/a", "a b", "{a}", "a*", "锁",
    ];
    let prefixes: Vec<String> = names
        .iter()
        .map(|n| backend.lock_prefix(*n).unwrap())
        .collect();
    for (i, p) in prefixes.iter().enumerate() {
        assert!(p.ends_with('/') && p.starts_with("locksmith/"), "{p}");
        assert_eq!(p.matches('/').count(), 2, "{p}: the name adds one segment");
        for (j, q) in prefixes.iter().enumerate() {
            assert!(
                i == j || !q.starts_with(p.as_str()),
                "{p} is a prefix of {q}"
            );
        }
    }
}

/// The measurement hooks: a round trip, the bare put-if-absent + delete, and the server's own
/// request counter, which grows by at least the requests just made.
#[tokio::test]
async fn measurement_hooks_work() {
    let Some(url) = url() else { return };
    let backend = EtcdBackend::connect(&url).await.unwrap();
    let before = backend.server_requests().await.unwrap();
    backend.round_trip().await.unwrap();
    let name = LockName::new(unique("bare")).unwrap();
    for _ in 0..3 {
        backend.bare_cycle(&name).await.unwrap();
    }
    let after = backend.server_requests().await.unwrap();
    assert!(after >= before + 7, "{before} -> {after}");
}

/// Secrets never show: not in `Debug`, `describe()`, nor in the error of a wrong password.
#[tokio::test]
async fn password_never_shows() {
    let Some(tls) = conformance::require_env("LOCK_TEST_ETCD_TLS_URL") else {
        return;
    };
    let backend = EtcdBackend::connect(&tls).await.unwrap();
    let shown = format!("{backend:?} {}", backend.describe());
    let (userinfo, _) = tls.split_once('@').unwrap();
    let password = userinfo.rsplit(':').next().unwrap();
    assert!(!shown.contains(password), "{shown}");
    assert!(shown.contains(":***@"), "{shown}");
    let marker = "Wr0ng-pa55-marker";
    let wrong = tls.replacen(password, marker, 1);
    let err = EtcdBackend::connect(&wrong).await.unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains(marker), "{shown}");
    // Refused credentials: the kind every backend gives them (issue 37: InvalidConfig here).
    assert_eq!(err.kind(), ErrorKind::Auth, "{shown}");
    // Plain text against the TLS port, and TLS without the CA, fail without leaking either.
    let no_ca = wrong.split('?').next().unwrap().to_owned();
    match EtcdBackend::connect(&no_ca).await {
        Ok(_) => panic!("TLS without the test CA must not verify"),
        Err(e) => assert!(!format!("{e} {e:?}").contains(marker)),
    }
}

/// A backend on the application's own client (`from_client`): its locks exclude those of a
/// backend from a URL on the same namespace, its keys are there for the application's client to
/// see, and a namespace that tries to escape is refused.
#[tokio::test]
async fn from_client_shares_the_applications_client() {
    let Some(url) = url() else { return };
    let hosts: Vec<String> = url
        .trim_start_matches("etcd://")
        .split(['/', '?'])
        .next()
        .unwrap()
        .split(',')
        .map(str::to_owned)
        .collect();
    let client = etcd_client::Client::connect(&hosts, None).await.unwrap();
    let ns = unique("app");
    let mine = Locker::new(EtcdBackend::from_client(client.clone(), &ns).await.unwrap());
    let other = Locker::new(
        EtcdBackend::connect(&format!("etcd://{}/{ns}", hosts.join(",")))
            .await
            .unwrap(),
    );
    let name = unique("shared");
    let opts = LockOptions::new().ttl(Duration::from_secs(5));
    let g = held_by_one_client_only(&mine, &other, &name, &opts).await;
    let held = client
        .kv_client()
        .get(
            format!("{ns}/"),
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(held.kvs().len(), 1, "one lock key under the namespace");
    g.release().await.unwrap();
    taken_and_released(&other, &name, &opts).await;
    for bad in ["../x", "a//b", "ns\n"] {
        let err = EtcdBackend::from_client(client.clone(), bad)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{bad:?}: {err}");
    }
}

/// Permits hand over without a herd: with two of two permits held and three permit waiters
/// queued on one client, each release (in any order) lets in the first waiter only, at one
/// wake-up and one look at the queue each (the others count the deletion on the watch and stay put); inspect
/// shows both permit holders, their mode and the waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_wakes_only_the_waiter_it_lets_in() {
    let Some(url) = url() else { return };
    let backend = EtcdBackend::connect(&url).await.unwrap();
    let waiters = Locker::new(backend.clone());
    let holders = [
        Locker::new(EtcdBackend::connect(&url).await.unwrap()),
        Locker::new(EtcdBackend::connect(&url).await.unwrap()),
    ];
    let name = unique("sem-herd");
    let opts = LockOptions::new().ttl(Duration::from_secs(30)).permits(2);
    let mut held = Vec::new();
    for h in &holders {
        held.push(
            h.try_lock(&name, &opts)
                .await
                .unwrap()
                .expect("a free permit"),
        );
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let (w, n, o, tx) = (waiters.clone(), name.clone(), opts.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let g = w.lock(&n, &o).await.unwrap();
            tx.send((i, g)).unwrap();
        }));
        // Queue them in order: each waiter's key is in place before the next one starts.
        until_queued(&backend, &name, i + 3).await;
    }
    let lock_name = LockName::new(name.clone()).unwrap();
    let info = waiters.inspect(&lock_name).await.unwrap();
    assert_eq!(info.mode, Some(lockcore::LockMode::Permit { limit: 2 }));
    let tokens: Vec<_> = info.shares.iter().map(|s| s.fencing_token).collect();
    let held_tokens: Vec<_> = held.iter().map(|g| g.fencing_token()).collect();
    assert_eq!(tokens, held_tokens, "every permit holder, in grant order");
    assert!(info.shares.iter().all(|s| s.ttl_left.is_some()));
    assert_eq!(info.waiters, Some(3));
    assert_eq!(backend.queued_waiters(&lock_name).await.unwrap(), 3);

    let before = backend.stats();
    let mut handed = Vec::new();
    // Released last holder first: a permit waiter must not wait on one particular holder (the
    // first in line would then sit out the other's release until its re-check timer).
    for (i, g) in held.into_iter().rev().enumerate() {
        g.release().await.unwrap();
        let (first, g) = rx.recv().await.unwrap();
        assert_eq!(first, i, "FIFO: the first waiter in line gets the permit");
        handed.push(g);
    }
    // A herd would have sent a look at the queue per waiter per release, the first release's
    // before the second hand-over was done.
    let after = backend.stats();
    assert_eq!(after.wakeups - before.wakeups, 2, "{before:?} -> {after:?}");
    assert_eq!(
        after.rechecks - before.rechecks,
        2,
        "{before:?} -> {after:?}"
    );
    assert!(rx.try_recv().is_err(), "a third permit was handed out");
    for g in handed {
        g.release().await.unwrap();
    }
    let (_, g) = rx.recv().await.unwrap();
    g.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
}

/// Readers' keys carry their mode in their name (an etcd `concurrency.Mutex` sees them as keys
/// ahead of it), inspect shows each reader; a writer queued behind them is the one waiter, and
/// holding alone it shows as exclusive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_every_reader_then_the_writer() {
    let Some(url) = url() else { return };
    let admin = EtcdBackend::connect(&url).await.unwrap();
    let clients = [
        Locker::new(EtcdBackend::connect(&url).await.unwrap()),
        Locker::new(EtcdBackend::connect(&url).await.unwrap()),
        Locker::new(EtcdBackend::connect(&url).await.unwrap()),
    ];
    let name = unique("rw-inspect");
    let lock_name = LockName::new(name.clone()).unwrap();
    let write = LockOptions::new().ttl(Duration::from_secs(30));
    let read = write.clone().shared();
    let r1 = clients[0]
        .try_lock(&name, &read)
        .await
        .unwrap()
        .expect("free");
    let r2 = clients[1]
        .try_lock(&name, &read)
        .await
        .unwrap()
        .expect("shared");
    let writer = {
        let (w, name, write) = (clients[2].clone(), name.clone(), write.clone());
        tokio::spawn(async move { w.lock(&name, &write).await.unwrap() })
    };
    until_queued(&admin, &name, 3).await;
    let keys = queue(&admin, &name).await;
    assert!(keys[0].0.ends_with(":shared") && keys[1].0.ends_with(":shared"));
    assert!(
        !keys[2].0.contains(':'),
        "an exclusive key is named as before"
    );
    let info = Locker::new(admin.clone())
        .inspect(&lock_name)
        .await
        .unwrap();
    assert!(info.held);
    assert_eq!(info.mode, Some(lockcore::LockMode::Shared));
    let tokens: Vec<_> = info.shares.iter().map(|s| s.fencing_token).collect();
    assert_eq!(tokens, [r1.fencing_token(), r2.fencing_token()]);
    assert_eq!(info.waiters, Some(1));
    assert_eq!(admin.queued_waiters(&lock_name).await.unwrap(), 1);
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = writer.await.unwrap();
    let info = Locker::new(admin.clone())
        .inspect(&lock_name)
        .await
        .unwrap();
    assert_eq!(info.mode, Some(lockcore::LockMode::Exclusive));
    assert!(info.shares.is_empty());
    assert_eq!(info.fencing_token, w.fencing_token());
    assert_eq!(info.waiters, Some(0));
    w.release().await.unwrap();
}
