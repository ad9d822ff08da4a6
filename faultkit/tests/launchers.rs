//! Every launcher starts its topology, names its leader/primary, and kills it on drop. They
//! start concurrently (a few seconds in all).

use std::time::Duration;

use faultkit::{Etcd, MariaDb, Postgres, RedisFailover, ZooKeeper};
use tokio::net::TcpStream;

async fn closed(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).await.is_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_topology_starts_names_its_leader_and_dies_on_drop() {
    let (pg, my, zk, etcd, sentinel) = tokio::join!(
        Postgres::start(),
        MariaDb::start(),
        ZooKeeper::ensemble(),
        Etcd::cluster(),
        RedisFailover::start(),
    );
    let (mut pg, my, zk, etcd, sentinel) = (
        pg.unwrap(),
        my.unwrap(),
        zk.unwrap(),
        etcd.unwrap(),
        sentinel.unwrap(),
    );
    assert!(pg.url().starts_with("postgres://"));
    assert!(my.url().starts_with("mysql://"));
    assert_eq!(zk.url().matches("127.0.0.1:").count(), 3);
    assert!(zk.leader().await.unwrap() < 3);
    assert!(etcd.leader().await.unwrap() < 3);
    assert_eq!(sentinel.primary().await.unwrap(), 0);
    assert_eq!(sentinel.role(1).await.unwrap(), "slave");

    // A restart keeping the data, of a server that was killed.
    pg.restart(true).await.unwrap();

    let ports = [
        pg.port(),
        my.port(),
        zk.client_port(0),
        etcd.client_port(2),
        sentinel.node_port(0),
        sentinel.sentinel_ports()[0],
    ];
    drop((pg, my, zk, etcd, sentinel));
    tokio::time::sleep(Duration::from_millis(100)).await;
    for p in ports {
        assert!(closed(p).await, "port {p} still open after drop");
    }
}
