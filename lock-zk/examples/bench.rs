//! Latency and hand-over figures against a ZooKeeper server:
//! `cargo run --release -p lock-zk --example bench -- zk://127.0.0.1:12181`
//! (or LOCK_TEST_ZK_URL).

use std::time::Duration;

use lock_zk::ZkBackend;
use lockcore::{Instant, LockOptions, Locker};

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn show(what: &str, mut v: Vec<Duration>) -> Duration {
    v.sort();
    let (p50, p99) = (pct(&v, 0.5), pct(&v, 0.99));
    println!(
        "{what:<34} n={:<5} p50={p50:>10.1?} p99={p99:>10.1?}",
        v.len()
    );
    p50
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> lockcore::Result<()> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("LOCK_TEST_ZK_URL").ok())
        .expect("pass a zk:// URL or set LOCK_TEST_ZK_URL");
    const N: usize = 1000;
    let backend = ZkBackend::connect(&url).await?;
    println!("{}", lockcore::backend::Backend::describe(&backend));
    let locker = Locker::new(backend.clone());
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let name = format!("bench-{}", std::process::id());
    let path = backend.lock_path(name.as_str())?;
    // Warm up (and create the lock node).
    for _ in 0..50 {
        locker
            .try_lock(&name, &opts)
            .await?
            .unwrap()
            .release()
            .await?;
    }
    let mut exists = Vec::with_capacity(N);
    let mut cycle = Vec::with_capacity(N);
    // Interleaved so both see the same machine noise.
    for _ in 0..N {
        let t = Instant::now();
        backend.client().check_stat(&path).await.expect("exists");
        exists.push(t.elapsed());
        let t = Instant::now();
        let g = locker.try_lock(&name, &opts).await?.expect("uncontended");
        g.release().await?;
        cycle.push(t.elapsed());
    }
    let e = show("exists round trip", exists);
    let c = show("uncontended try_lock+release", cycle);
    println!(
        "acquire+release / exists p50 = {:.1}x",
        c.as_secs_f64() / e.as_secs_f64()
    );

    let mut lock_cycle = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        let g = locker.lock(&name, &opts).await?;
        g.release().await?;
        lock_cycle.push(t.elapsed());
    }
    show("uncontended lock()+release", lock_cycle);

    // Hand-over rate: 4 independent clients (sessions) looping lock/release on one name.
    let secs = 3.0;
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let l = Locker::new(ZkBackend::connect(&url).await?);
        let (name, opts) = (name.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < end {
                let g = l.lock(&name, &opts).await?;
                g.release().await?;
                n += 1;
            }
            Ok::<_, lockcore::Error>(n)
        }));
    }
    let mut counts = Vec::new();
    for t in tasks {
        counts.push(t.await.expect("task")?);
    }
    let total: u64 = counts.iter().sum();
    println!(
        "4-holder hand-over: {total} acquisitions in {secs} s = {:.0}/s (per client {counts:?})",
        total as f64 / secs
    );
    println!(
        "watch wake-ups on the bench client: {}",
        backend.stats().watch_wakeups
    );
    Ok(())
}
