//! A member of a ZooKeeper ensemble and of an etcd cluster cut off from its peers (faultkit's
//! peer links): it loses the quorum and says so on its client port, which stays reachable; the
//! others go on (electing a new leader when the cut member led); healed, it rejoins.

use std::time::Duration;

use faultkit::{Etcd, ZooKeeper, wait_until, zk_mode};

fn scaled(d: Duration) -> Duration {
    let scale = std::env::var("LOCK_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0)
        .unwrap_or(1.0);
    d.mul_f64(scale)
}

/// Whether ZooKeeper member `port` serves as leader or follower.
async fn zk_serves(port: u16) -> bool {
    zk_mode(port)
        .await
        .ok()
        .flatten()
        .is_some_and(|m| m == "leader" || m == "follower")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zookeeper_member_cut_off_from_its_peers_stops_serving_and_rejoins() {
    let zk = ZooKeeper::ensemble_with_peer_links().await.unwrap();
    // The leader first (the others must elect without it), then a follower.
    let leader = zk.leader().await.unwrap();
    let follower = (leader + 1) % 3;
    let started = std::time::Instant::now();
    let step = |what: &str| eprintln!("{:>6.1} s  {what}", started.elapsed().as_secs_f64());
    for cut in [leader, follower] {
        step(&format!("cutting member {cut}"));
        let port = zk.client_port(cut);
        zk.cut_member(cut).unwrap();
        assert!(zk.is_cut(cut));
        // Cut off: it stops serving (a member without a quorum answers `srvr` without a mode),
        // while its client port still answers.
        wait_until(
            "the cut member stops serving",
            scaled(Duration::from_secs(20)),
            || async move { Ok(!zk_serves(port).await) },
        )
        .await
        .unwrap();
        step("the cut member stopped serving");
        assert!(
            faultkit::zk_four_letter(port, "ruok")
                .await
                .unwrap()
                .contains("imok")
        );
        // The two others serve, one of them leading. Cutting the leader makes them elect a new
        // one after their sync timeout, which on a loaded 2-core machine (JVMs of three test
        // binaries at once) took over 20 s in the full run: the bound is generous.
        for i in (0..3).filter(|&i| i != cut) {
            let port = zk.client_port(i);
            wait_until(
                "the others serve",
                scaled(Duration::from_secs(60)),
                || async move { Ok(zk_serves(port).await) },
            )
            .await
            .unwrap();
            step(&format!("member {i} serves"));
        }
        // A member may serve before the new leader answers as one.
        let z = &zk;
        wait_until(
            "a member other than the cut one says it leads",
            scaled(Duration::from_secs(20)),
            || async move { Ok(z.leader().await.is_ok_and(|l| l != cut)) },
        )
        .await
        .unwrap();
        // The cut member does not come back while cut (it cannot reach a quorum).
        assert!(!zk_serves(port).await);
        step("a member other than the cut one leads");
        zk.heal_member(cut).unwrap();
        wait_until(
            "the healed member serves again",
            scaled(Duration::from_secs(30)),
            || async move { Ok(zk_serves(port).await) },
        )
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_member_cut_off_from_its_peers_loses_its_leader_and_rejoins() {
    let etcd = Etcd::cluster_with_peer_links().await.unwrap();
    let leader = etcd.leader().await.unwrap();
    let follower = (leader + 1) % 3;
    for cut in [leader, follower] {
        etcd.cut_member(cut).unwrap();
        let e = &etcd;
        wait_until(
            "the cut member has no leader",
            scaled(Duration::from_secs(20)),
            || async move { Ok(!e.has_leader(cut).await?) },
        )
        .await
        .unwrap();
        // The others have a leader, not the cut member; the cut member still answers its client
        // port (its metrics).
        for i in (0..3).filter(|&i| i != cut) {
            wait_until(
                "the others have a leader",
                scaled(Duration::from_secs(20)),
                || async move { e.has_leader(i).await },
            )
            .await
            .unwrap();
        }
        // A member that has a leader may answer before the leader itself reports as one.
        wait_until(
            "a member other than the cut one says it leads",
            scaled(Duration::from_secs(20)),
            || async move { Ok(e.leader().await.is_ok_and(|l| l != cut)) },
        )
        .await
        .unwrap();
        assert!(!etcd.has_leader(cut).await.unwrap());
        etcd.heal_member(cut).unwrap();
        wait_until(
            "the healed member has a leader",
            scaled(Duration::from_secs(20)),
            || async move { e.has_leader(cut).await },
        )
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn a_cluster_started_without_links_refuses_a_cut() {
    let etcd = Etcd::single().await.unwrap();
    assert!(etcd.cut_member(0).is_err());
}
