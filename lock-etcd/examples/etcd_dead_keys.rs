//! What deleted keys cost a lock's acquisition: the acquiring transaction's shape (put if no key
//! under the lock's prefix, else read the first) timed against a prefix with no deleted keys and
//! one under which N keys were put and deleted (not compacted yet), interleaved. etcd's index
//! walks every key of a prefix read, deleted ones included, until a compaction drops them: the
//! reason a client reuses its key names (one per lease) instead of one name per acquisition.
//!
//! ```text
//! cargo run --release -p lock-etcd --example etcd_dead_keys -- [N, default 5000]
//! ```
//! (against `LOCK_TEST_ETCD_URL`; the keys are under `lsbench-dead-*/` and `lsbench-fresh-*/`).
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use lockcore::Instant;

async fn cycle(c: &mut Client, dir: &str, lease: i64) -> std::time::Duration {
    let key = format!("{dir}live");
    let s = Instant::now();
    let txn = Txn::new()
        .when([Compare::create_revision(dir, CompareOp::Equal, 0).with_prefix()])
        .and_then([TxnOp::put(
            key.as_str(),
            "",
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(
            dir,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_limit(1),
            ),
        )]);
    c.txn(txn).await.unwrap();
    let t = s.elapsed();
    c.delete(key.as_str(), None).await.unwrap();
    t
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::var("LOCK_TEST_ETCD_URL").unwrap();
    let host = url.trim_start_matches("etcd://").to_owned();
    let mut c = Client::connect([host], None).await.unwrap();
    let lease = c.lease_grant(120, None).await.unwrap().id();
    let n: usize = std::env::args().nth(1).map_or(5000, |a| a.parse().unwrap());
    let fresh = format!("lsbench-fresh-{:08x}/", fastrand::u32(..));
    let dead = format!("lsbench-dead-{:08x}/", fastrand::u32(..));
    for i in 0..n {
        let k = format!("{dead}d{i}");
        c.put(k.as_str(), "", None).await.unwrap();
        c.delete(k.as_str(), None).await.unwrap();
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..1000 {
        a.push(cycle(&mut c, &fresh, lease).await);
        b.push(cycle(&mut c, &dead, lease).await);
    }
    a.sort();
    b.sort();
    println!(
        "acquire Txn, no dead keys: p50 {} us p90 {} us",
        a[500].as_micros(),
        a[900].as_micros()
    );
    println!(
        "acquire Txn, {n} dead keys: p50 {} us p90 {} us",
        b[500].as_micros(),
        b[900].as_micros()
    );
}
