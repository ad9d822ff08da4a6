//! Faults on a throw-away 3-member etcd cluster (faultkit): the leader killed during contention,
//! a holder cut off past its lease TTL, a holder process killed, a waiter watching a member cut
//! off from its peers. Each test starts its own
//! cluster (killed when the test ends, also on panic) and needs only the `etcd` binary.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use faultkit::{Direction, Etcd, Pick, Proxy, ProxyMode, ReplyLoss, require_installed};
use lock_etcd::EtcdBackend;
use lockcore::{AutoRenew, ErrorKind, Instant, LockOptions, Locker};

fn scaled(d: Duration) -> Duration {
    d.mul_f64(conformance::time_scale())
}

/// `etcd://` over every member of `cluster` (or over the given ports).
fn url_of(ports: &[u16]) -> String {
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!("etcd://{}", hosts.join(","))
}

fn ports(cluster: &Etcd) -> Vec<u16> {
    (0..cluster.len()).map(|i| cluster.client_port(i)).collect()
}

/// A private single node (its lease list is this test's alone), with a proxy in front of it.
async fn single_behind_proxy() -> Option<(Etcd, Proxy)> {
    if !require_installed("etcd") {
        return None;
    }
    let server = Etcd::single().await.expect("an etcd node");
    let proxy = Proxy::start(
        format!("127.0.0.1:{}", server.client_port(0))
            .parse()
            .unwrap(),
    )
    .await
    .unwrap();
    Some((server, proxy))
}

/// The holder's locker, through the proxy (with `query`), and an admin backend and its
/// locker straight to the server.
async fn holder_and_admin(
    server: &Etcd,
    proxy: &Proxy,
    query: &str,
) -> (Locker, EtcdBackend, Locker) {
    let holder_url = format!("etcd://127.0.0.1:{}{query}", proxy.port());
    let holder = Locker::new(EtcdBackend::connect(&holder_url).await.unwrap());
    let admin = EtcdBackend::connect(&url_of(&[server.client_port(0)]))
        .await
        .unwrap();
    (holder, admin.clone(), Locker::new(admin))
}

/// The lock's only key: (key, create revision, lease).
async fn held_key(admin: &EtcdBackend, name: &str) -> Option<(String, i64, i64)> {
    let resp = admin
        .client()
        .kv_client()
        .get(
            admin.lock_prefix(name).unwrap(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert!(resp.kvs().len() <= 1, "one holder, no waiter");
    resp.kvs().first().map(|kv| {
        (
            kv.key_str().unwrap().to_owned(),
            kv.create_revision(),
            kv.lease(),
        )
    })
}

/// Polls (every 2 ms, bounded) until `f` gives a value.
async fn poll<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> F,
) -> T {
    let end = Instant::now() + scaled(within);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// An extend to another TTL whose transaction moves the key to the new lease but whose answer
/// comes after the client's timeout (the request itself was slow): the extend fails
/// `Unavailable`, and the lock is not freed behind the holder (the new lease, which carries the
/// key, is not revoked: the key stays, nobody else gets the lock, the lost signal stays quiet);
/// the next extend settles on the new lease and revokes the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_with_a_lost_answer_does_not_free_the_lock() {
    let Some((server, proxy)) = single_behind_proxy().await else {
        return;
    };
    let timeout = scaled(Duration::from_millis(1500));
    let query = format!("?timeout_ms={}", timeout.as_millis());
    let (holder, admin, other) = holder_and_admin(&server, &proxy, &query).await;
    let name = format!("ambiguous-{:08x}", fastrand::u32(..));
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let g = holder.try_lock(&name, &opts).await.unwrap().expect("free");
    let lost = g.lost();
    let (key, revision, old_lease) = held_key(&admin, &name).await.unwrap();
    let leases = || async {
        let list = admin.client().lease_client().leases().await.unwrap();
        list.leases().iter().map(|l| l.id()).collect::<Vec<i64>>()
    };
    let before = leases().await;
    // Requests reach the server late but within the timeout: the grant is answered in time.
    // Once the new lease exists, later requests (the move's transaction) arrive only after
    // the client gave up on them.
    proxy.set_latency(Direction::ToServer, scaled(Duration::from_millis(400)));
    let slow_down = async {
        let new = poll("the new lease granted", Duration::from_secs(5), || async {
            leases().await.into_iter().find(|id| !before.contains(id))
        })
        .await;
        proxy.set_latency(
            Direction::ToServer,
            timeout + scaled(Duration::from_secs(1)),
        );
        new
    };
    let (extended, new_lease) = tokio::join!(g.extend(Duration::from_secs(10)), slow_down);
    let err = extended.expect_err("the move's answer came in time");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // The transaction lands after all: the key moved to the new lease.
    poll("the late move lands", Duration::from_secs(10), || async {
        (held_key(&admin, &name).await == Some((key.clone(), revision, new_lease))).then_some(())
    })
    .await;
    proxy.set_latency(Direction::ToServer, Duration::ZERO);
    holder.flush().await;
    assert_eq!(
        held_key(&admin, &name).await,
        Some((key.clone(), revision, new_lease)),
        "the lock was freed behind its holder"
    );
    assert!(other.try_lock(&name, &opts).await.unwrap().is_none());
    assert!(!lost.is_lost(), "{:?}", lost.reason());
    // The next extend finds the key on the new lease and renews that one.
    g.extend(Duration::from_secs(10)).await.unwrap();
    holder.flush().await;
    assert_eq!(
        held_key(&admin, &name).await,
        Some((key, revision, new_lease))
    );
    let ttl_of = |id: i64| {
        let mut leases = admin.client().lease_client();
        async move { leases.time_to_live(id, None).await.unwrap().ttl() }
    };
    assert!(ttl_of(new_lease).await >= 8, "the new lease was renewed");
    assert_eq!(ttl_of(old_lease).await, -1, "the old lease was revoked");
    g.release().await.unwrap();
}

/// An extend to another TTL dropped after its transaction moved the key to the new lease,
/// before its answer came: the key is not left on a lease nobody renews. The holder's next
/// extends (with the TTL it acquired with) keep the lock held well past the new lease's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_dropped_after_its_move_leaves_the_key_renewed() {
    let Some((server, proxy)) = single_behind_proxy().await else {
        return;
    };
    let (holder, admin, other) = holder_and_admin(&server, &proxy, "").await;
    let name = format!("dropped-{:08x}", fastrand::u32(..));
    let ttl = Duration::from_secs(4);
    let opts = LockOptions::new().ttl(ttl);
    let g = holder.try_lock(&name, &opts).await.unwrap().expect("free");
    let (key, revision, old_lease) = held_key(&admin, &name).await.unwrap();
    // Answers come late: the test sees the move land before the extend sees its answer, and
    // drops the extend then.
    proxy.set_latency(Direction::ToClient, scaled(Duration::from_millis(500)));
    let short = Duration::from_secs(2);
    tokio::select! {
        r = g.extend(short) => panic!("the extend's answer came before its move was seen: {r:?}"),
        () = poll("the move lands", Duration::from_secs(10), || async {
            held_key(&admin, &name)
                .await
                .is_some_and(|(_, _, lease)| lease != old_lease)
                .then_some(())
        }) => {}
    }
    proxy.set_latency(Direction::ToClient, Duration::ZERO);
    // Renewed by the holder past the new lease's TTL (and the server's 500 ms expiry sweep).
    let end = Instant::now() + short + scaled(Duration::from_secs(1));
    while Instant::now() < end {
        g.extend(ttl).await.unwrap();
        let (k, rev, _) = held_key(&admin, &name).await.expect("the key was deleted");
        assert_eq!((k.as_str(), rev), (key.as_str(), revision));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(other.try_lock(&name, &opts).await.unwrap().is_none());
    assert!(g.is_valid());
    g.release().await.unwrap();
}

/// A release whose connection is reset before it hears its answer, whether the server applied
/// the delete (its reply was lost) or never saw it (the request was lost): the client cannot
/// tell, re-sends the delete at once (deleting by create revision removes nothing twice), and
/// the lock is free when `release` returns, long before its lease's TTL. A release that gave
/// up on the reset left a lost request's key held for the whole TTL (the conformance flake
/// `etcd::lost_release_reply_frees_the_lock`, whose proxy could reset before it had sent the
/// request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cut_off_by_a_reset_frees_the_lock_at_once() {
    let Some((server, proxy)) = single_behind_proxy().await else {
        return;
    };
    let (holder, admin, other) = holder_and_admin(&server, &proxy, "").await;
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    for (round, how) in [ReplyLoss::Unsent, ReplyLoss::Reset]
        .into_iter()
        .enumerate()
    {
        let name = format!("cut-release-{how:?}-{:08x}", fastrand::u32(..));
        let g = holder.try_lock(&name, &opts).await.unwrap().expect("free");
        proxy.lose_reply(Pick::Matching(name.as_bytes().to_vec()), how);
        let released = g.release().await;
        assert!(
            proxy
                .wait_replies_lost(round + 1, scaled(Duration::from_secs(5)))
                .await
        );
        assert!(
            !proxy.armed(),
            "{how:?}: the release did not carry the name"
        );
        released.unwrap_or_else(|e| panic!("{how:?}: the release failed: {e}"));
        assert_eq!(
            held_key(&admin, &name).await,
            None,
            "{how:?}: the key is left"
        );
        let g2 = other.try_lock(&name, &opts).await.unwrap();
        assert!(g2.is_some(), "{how:?}: the lock is still held");
        g2.unwrap().release().await.unwrap();
    }
}

async fn cluster() -> Option<Etcd> {
    if !require_installed("etcd") {
        return None;
    }
    Some(Etcd::cluster().await.expect("a 3-member etcd cluster"))
}

/// Three clients with two tasks each contend for one lock while the leader is killed: never two
/// holders inside the critical section, fencing tokens increase in critical-section order, and
/// the lock keeps changing hands under the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_during_contention_no_double_holders() {
    let Some(mut cluster) = cluster().await else {
        return;
    };
    let url = url_of(&ports(&cluster));
    let name = format!("leader-kill-{:08x}", fastrand::u32(..));
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .wait_timeout(scaled(Duration::from_secs(30)));
    let inside = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let entries = Arc::new(std::sync::Mutex::new(Vec::<(Instant, u64)>::new()));
    let errors = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let locker = Locker::new(EtcdBackend::connect(&url).await.unwrap());
        for _ in 0..2 {
            let (locker, name, opts) = (locker.clone(), name.clone(), opts.clone());
            let (inside, violations, entries, errors, stop) = (
                inside.clone(),
                violations.clone(),
                entries.clone(),
                errors.clone(),
                stop.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let g = match locker.lock(&name, &opts).await {
                        Ok(g) => g,
                        Err(_) => {
                            errors.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                    };
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    entries
                        .lock()
                        .unwrap()
                        .push((Instant::now(), g.fencing_token().unwrap()));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    if g.release().await.is_err() {
                        errors.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
    }
    // Contention is under way: some critical sections done.
    let sections = |since: Option<Instant>| {
        entries
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| since.is_none_or(|s| *t > s))
            .count()
    };
    let t0 = Instant::now();
    while sections(None) < 20 {
        assert!(
            t0.elapsed() < scaled(Duration::from_secs(20)),
            "no contention before the kill"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let leader = cluster.leader().await.unwrap();
    let killed_at = Instant::now();
    cluster.member(leader).kill();
    let new = cluster
        .wait_new_leader(leader, scaled(Duration::from_secs(10)))
        .await
        .unwrap();
    // The clients drop the dead member and go on: progress under the new leader.
    let t0 = Instant::now();
    while sections(Some(killed_at)) < 10 && t0.elapsed() < scaled(Duration::from_secs(20)) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let progress_after = t0.elapsed();
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        tokio::time::timeout(scaled(Duration::from_secs(40)), t)
            .await
            .expect("a contender hung")
            .unwrap();
    }
    let entries = entries.lock().unwrap().clone();
    let before = entries.iter().filter(|(t, _)| *t < killed_at).count();
    let after = entries.len() - before;
    eprintln!(
        "leader m{leader} killed, m{new} leads; {before} critical sections before, {after} after (10 within {progress_after:?} of the election); {} errors; {} overlaps",
        errors.load(Ordering::SeqCst),
        violations.load(Ordering::SeqCst)
    );
    assert_eq!(violations.load(Ordering::SeqCst), 0, "two holders at once");
    assert!(
        entries.windows(2).all(|w| w[0].1 < w[1].1),
        "fencing tokens did not increase in critical-section order"
    );
    assert!(
        before > 0 && after >= 10,
        "{before} before, {after} after the kill (progress stalled under the new leader)"
    );
}

/// A holder whose every connection is cut (held, auto-renewing) learns it lost the lock before
/// another client wins it: its lost signal fires first, and the other client's winning request
/// was sent only after the holder's lease expired. Once the network heals, the same client
/// locks and waits again (its watch and keep-alive stream reconnect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_cut_off_past_ttl_fires_lost_before_another_wins() {
    let Some(cluster) = cluster().await else {
        return;
    };
    let direct = ports(&cluster);
    let mut proxies = Vec::new();
    for p in &direct {
        proxies.push(
            Proxy::start(format!("127.0.0.1:{p}").parse().unwrap())
                .await
                .unwrap(),
        );
    }
    let via: Vec<u16> = proxies.iter().map(|p| p.port()).collect();
    let holder = Locker::new(EtcdBackend::connect(&url_of(&via)).await.unwrap());
    let admin = EtcdBackend::connect(&url_of(&direct)).await.unwrap();
    let other = Locker::new(admin.clone());
    let name = format!("cut-{:08x}", fastrand::u32(..));
    let ttl = Duration::from_secs(2);
    let opts = LockOptions::new()
        .ttl(ttl)
        .wait_timeout(scaled(Duration::from_secs(30)))
        .auto_renew(AutoRenew::until(Duration::from_secs(600)));
    let g = holder.try_lock(&name, &opts).await.unwrap().expect("free");
    let lost = g.lost();
    let token = g.fencing_token().unwrap();
    let waiter = {
        let (other, name, opts) = (other.clone(), name.clone(), opts.clone());
        tokio::spawn(async move { other.lock(&name, &opts).await })
    };
    // Held across renewals while connected: past its first deadline, renewed beyond it by
    // more than a TTL, the waiter still waiting.
    let first_deadline = g.valid_until();
    poll("renewals past the first deadline", ttl * 10, || async {
        (Instant::now() > first_deadline && g.valid_until() > first_deadline + ttl).then_some(())
    })
    .await;
    assert!(
        !waiter.is_finished(),
        "the lock changed hands while its holder was connected"
    );
    assert!(!lost.is_lost());
    let cut_at = Instant::now();
    for p in &proxies {
        p.set_mode(ProxyMode::Blackhole);
    }
    let holder_lost = async {
        let reason = lost.lost().await;
        (Instant::now(), reason)
    };
    let (lost_at, reason) = tokio::time::timeout(ttl + scaled(Duration::from_secs(3)), holder_lost)
        .await
        .expect("the cut-off holder's lost signal fired");
    let g2 = waiter
        .await
        .unwrap()
        .expect("the other client gets the lock");
    eprintln!(
        "cut at 0; lost ({reason}) after {:?}; the other client's winning request sent after {:?}",
        lost_at - cut_at,
        g2.acquired_at() - cut_at
    );
    assert!(
        lost_at < g2.acquired_at(),
        "another client won the lock before the holder knew it lost it"
    );
    assert!(g2.fencing_token().unwrap() > token);
    // Heal: the cut-off client works again, waiting included.
    for p in &proxies {
        p.set_mode(ProxyMode::Pass);
    }
    assert_eq!(g.release().await.unwrap_err().kind(), ErrorKind::NotHeld);
    let short = opts.clone().wait_timeout(scaled(Duration::from_secs(15)));
    let waiting = {
        let (holder, name, short) = (holder.clone(), name.clone(), short.clone());
        tokio::spawn(async move { holder.lock(&name, &short).await })
    };
    let lock_name = lockcore::LockName::new(name.clone()).unwrap();
    poll(
        "the healed client queued",
        Duration::from_secs(10),
        || async {
            (lockcore::backend::Backend::queued_waiters(&admin, &lock_name)
                .await
                .unwrap()
                >= 1)
                .then_some(())
        },
    )
    .await;
    g2.release().await.unwrap();
    let g3 = waiting
        .await
        .unwrap()
        .expect("the healed client is woken by the release");
    g3.release().await.unwrap();
}

/// The child side of `holder_process_killed_frees_after_lease_ttl`: takes the lock, prints its
/// fencing token and holds it (renewing) until killed.
#[tokio::test]
#[ignore = "helper: the holder process of holder_process_killed_frees_after_lease_ttl"]
async fn child_holder() {
    let (Ok(url), Ok(name)) = (
        std::env::var("LOCK_ETCD_CHILD_URL"),
        std::env::var("LOCK_ETCD_CHILD_NAME"),
    ) else {
        return;
    };
    let locker = Locker::new(EtcdBackend::connect(&url).await.unwrap());
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .auto_renew(AutoRenew::until(Duration::from_secs(600)));
    let g = locker.lock(&name, &opts).await.unwrap();
    println!("ACQUIRED {}", g.fencing_token().unwrap());
    tokio::time::sleep(Duration::from_secs(600)).await;
}

/// A holder process killed with SIGKILL (no release, no goodbye) blocks the lock until its lease
/// expires, one TTL after its last keep-alive, and not much longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_process_killed_frees_after_lease_ttl() {
    use tokio::io::AsyncBufReadExt;
    let Some(cluster) = cluster().await else {
        return;
    };
    let url = url_of(&ports(&cluster));
    let name = format!("killed-{:08x}", fastrand::u32(..));
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_holder", "--nocapture"])
        .env("LOCK_ETCD_CHILD_URL", &url)
        .env("LOCK_ETCD_CHILD_NAME", &name)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let token: u64 = tokio::time::timeout(scaled(Duration::from_secs(20)), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(t) = line.strip_prefix("ACQUIRED ") {
                return t.trim().parse().unwrap();
            }
        }
        panic!("the holder process ended without the lock");
    })
    .await
    .expect("the holder process took the lock");
    let other = Locker::new(EtcdBackend::connect(&url).await.unwrap());
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .wait_timeout(scaled(Duration::from_secs(20)));
    // Renewed by the live holder past its TTL.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        other.try_lock(&name, &opts).await.unwrap().is_none(),
        "held while the holder lives"
    );
    child.kill().await.unwrap();
    let killed_at = Instant::now();
    assert!(
        other.try_lock(&name, &opts).await.unwrap().is_none(),
        "held right after the kill"
    );
    let g = other
        .lock(&name, &opts)
        .await
        .expect("free after the lease TTL");
    let took = g.acquired_at() - killed_at;
    eprintln!("killed holder's lock taken over {took:?} after the kill (TTL 2 s)");
    assert!(g.fencing_token().unwrap() > token);
    // The lease expires one TTL after the last keep-alive (at most TTL/3 before the kill),
    // checked by the server every 500 ms.
    assert!(
        took >= Duration::from_millis(1200),
        "freed {took:?} after the kill: before the TTL"
    );
    assert!(
        took <= Duration::from_secs(2) + scaled(Duration::from_secs(2)),
        "freed only {took:?} after the kill"
    );
    g.release().await.unwrap();
}

/// A waiter whose watch sits on a member cut off from its peers (faultkit's peer links: its
/// client port still answers) gets the lock released through a healthy member within a few
/// election timeouts: require-leader cancels the watch of the leaderless member, and requests
/// refused by it go to the other endpoint; the re-check timer alone would take 10 s (the
/// waiter's lease TTL is 30 s). The waiter's client knows the cut member and a healthy one,
/// which refuses connections until the cut (so its watch is on the cut member).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_watching_a_member_cut_off_from_the_quorum_gets_the_free_lock() {
    if !require_installed("etcd") {
        return;
    }
    let cluster = Etcd::cluster_with_peer_links()
        .await
        .expect("a 3-member etcd cluster with peer links");
    let cut = (cluster.leader().await.unwrap() + 1) % 3;
    let healthy: Vec<u16> = (0..3)
        .filter(|&i| i != cut)
        .map(|i| cluster.client_port(i))
        .collect();
    let holder_backend = EtcdBackend::connect(&url_of(&healthy)).await.unwrap();
    let holder = Locker::new(holder_backend.clone());
    let to_cut = Proxy::start(
        format!("127.0.0.1:{}", cluster.client_port(cut))
            .parse()
            .unwrap(),
    )
    .await
    .unwrap();
    let fallback = Proxy::start(format!("127.0.0.1:{}", healthy[0]).parse().unwrap())
        .await
        .unwrap();
    fallback.set_mode(ProxyMode::Reset);
    // The connection may first pick the refusing endpoint and fail: connect again (bounded).
    let waiter_url = url_of(&[to_cut.port(), fallback.port()]);
    let waiter = Locker::new(
        poll(
            "the waiter's client connected",
            Duration::from_secs(20),
            || async { EtcdBackend::connect(&waiter_url).await.ok() },
        )
        .await,
    );
    let name = format!("cut-member-{:08x}", fastrand::u32(..));
    let lock_name = lockcore::LockName::new(name.clone()).unwrap();
    let g = holder
        .try_lock(&name, &LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("free");
    // TTL 30 s: the waiter's re-check timer (its TTL, at most 10 s) is not what ends the wait.
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_timeout(scaled(Duration::from_secs(60)));
    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(&name, &opts).await })
    };
    poll("the waiter queued", Duration::from_secs(10), || async {
        (lockcore::backend::Backend::queued_waiters(&holder_backend, &lock_name)
            .await
            .unwrap()
            >= 1)
            .then_some(())
    })
    .await;
    cluster.cut_member(cut).unwrap();
    let cut_at = Instant::now();
    // The cut member has no leader any more (it says so itself, on its client port).
    poll(
        "the cut member loses its leader",
        Duration::from_secs(10),
        || async { (!cluster.has_leader(cut).await.unwrap()).then_some(()) },
    )
    .await;
    let leaderless = cut_at.elapsed();
    fallback.set_mode(ProxyMode::Pass);
    g.release().await.unwrap();
    let released = Instant::now();
    // Within 8 s of the release: less than the 10 s re-check period, so this is the watch
    // cancelled by the leaderless member (require-leader), and requests refused by it going to
    // the other member.
    let g2 = tokio::time::timeout(scaled(Duration::from_secs(8)), waiting)
        .await
        .expect("the waiter got the free lock within a few election timeouts")
        .unwrap()
        .unwrap();
    eprintln!(
        "member {cut} cut at 0, leaderless after {leaderless:?}; released after {:?}; the waiter got the lock after {:?}",
        released - cut_at,
        cut_at.elapsed()
    );
    // Its release may go to the cut member, which refuses it; the cluster goes away anyway.
    drop(g2);
}
