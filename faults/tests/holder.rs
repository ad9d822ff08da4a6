//! The holder process reports its lock, its token and its loss, and obeys SIGSTOP/SIGKILL.

use std::time::Duration;

use faultkit::{FencedResource, Holder, HolderSpec, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_reports_lock_writes_fenced_and_dies_on_sigkill() {
    let redis = RedisServer::start().await.unwrap();
    let resource = FencedResource::new();
    let (addr, _serve) = resource.serve().await.unwrap();
    let mut spec = HolderSpec::new(
        faults::holder_program(),
        &redis.url(),
        "holder-smoke",
        Duration::from_secs(5),
    );
    spec.resource = Some(addr);
    spec.id = "a".into();
    let mut h = Holder::spawn(&spec).unwrap();
    let t = Duration::from_secs(20);
    let acquired = h.wait_for("acquired", t).await.unwrap();
    assert!(acquired.fence.is_some(), "redis gives fencing tokens");
    resource.set_holder("a");
    let w = h.wait_for("write", t).await.unwrap();
    assert_eq!(w.accepted, Some(true));
    h.pause().unwrap();
    h.resume().unwrap();
    h.wait_for("checked", t).await.unwrap();
    h.kill().await.unwrap();
    assert!(
        h.next(Duration::from_secs(5)).await.is_err(),
        "no events after SIGKILL"
    );
    assert_eq!(resource.stats().stale_accepted, 0);
}
