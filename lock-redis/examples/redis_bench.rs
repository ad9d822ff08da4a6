//! Small latency / throughput check for the Redis backend.
//!
//! `cargo run -p lock-redis --release --example redis_bench -- [URL]` (default: `$LOCK_TEST_REDIS_URL`).
//! Prints PING p50/p99, uncontended `lock()`+`release()` p50/p99 (and their ratio to PING p50)
//! over 2000 iterations, and the hand-over rate of 4 clients contending for one name for 3 s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_redis::RedisBackend;
use lockcore::{Instant, LockName, LockOptions, Locker};

const ITERATIONS: usize = 2000;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn summary(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

fn main() -> lockcore::Result<()> {
    // BENCH_RT=current for a current-thread runtime (no cross-thread wake-ups), BENCH_RT=one
    // for a multi-thread runtime with one worker (no other worker to wake and steal); default:
    // two worker threads, as an application would run.
    let rt = match std::env::var("BENCH_RT").as_deref() {
        Ok("current") => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Ok("one") => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
    }
    .expect("a tokio runtime");
    // BENCH_SPAWN=1: the measuring loop runs as a task on the runtime's workers (as a service's
    // handlers do), not on the thread that blocks on the runtime.
    if std::env::var("BENCH_SPAWN").is_ok_and(|v| v == "1") {
        return rt.block_on(async { tokio::spawn(run()).await.expect("the bench task") });
    }
    rt.block_on(run())
}

async fn run() -> lockcore::Result<()> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("LOCK_TEST_REDIS_URL").ok())
        .expect("pass a redis URL or set LOCK_TEST_REDIS_URL");
    let backend = RedisBackend::connect(&url).await?;
    println!(
        "backend: {}",
        lockcore::backend::Backend::describe(&backend)
    );
    let locker = Locker::new(backend.clone());
    let name = LockName::new(format!("bench-{:08x}", fastrand::u32(..)))?;
    let opts = LockOptions::new().ttl(Duration::from_secs(10));

    // Warm up the connection and the script cache.
    for _ in 0..200 {
        backend.ping().await?;
        locker.lock(&name, &opts).await?.release().await?;
    }

    // Interleave the two measurements so machine noise hits both alike.
    let mut ping = Vec::with_capacity(ITERATIONS);
    let mut lock = Vec::with_capacity(ITERATIONS);
    let mut raw = Vec::with_capacity(ITERATIONS);
    let (mut acquire, mut release) = (Vec::new(), Vec::new());
    for _ in 0..ITERATIONS {
        // The backend alone, without the Locker's guard and watchdog task.
        let req = lockcore::backend::AcquireRequest::new(
            name.clone(),
            lockcore::OwnerToken::random(),
            Duration::from_secs(10),
        );
        let t = Instant::now();
        let a = lockcore::backend::Backend::try_acquire(&backend, &req)
            .await?
            .expect("free");
        let t2 = Instant::now();
        a.lease.release().await?;
        raw.push(t.elapsed());
        acquire.push(t2 - t);
        release.push(t2.elapsed());
        let t = Instant::now();
        backend.ping().await?;
        ping.push(t.elapsed());
        let t = Instant::now();
        let g = locker.lock(&name, &opts).await?;
        g.release().await?;
        lock.push(t.elapsed());
    }
    let (ping50, ping99) = summary(ping);
    let (lock50, lock99) = summary(lock);
    let (raw50, raw99) = summary(raw);
    println!("PING                  p50 {ping50:>10.1?}  p99 {ping99:>10.1?}");
    println!(
        "lock+release          p50 {lock50:>10.1?}  p99 {lock99:>10.1?}  ({:.2} x PING p50)",
        lock50.as_secs_f64() / ping50.as_secs_f64()
    );

    println!(
        "backend-only          p50 {raw50:>10.1?}  p99 {raw99:>10.1?}  ({:.2} x PING p50)",
        raw50.as_secs_f64() / ping50.as_secs_f64()
    );
    let ((acq50, _), (rel50, _)) = (summary(acquire), summary(release));
    println!(
        "  of which             acquire script p50 {acq50:.1?} ({:.2} x PING), release script p50 {rel50:.1?} ({:.2} x PING)",
        acq50.as_secs_f64() / ping50.as_secs_f64(),
        rel50.as_secs_f64() / ping50.as_secs_f64()
    );

    // 4 independent clients hand one lock over as fast as they can.
    let contended = LockName::new(format!("bench-contended-{:08x}", fastrand::u32(..)))?;
    let count = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let client = Locker::new(RedisBackend::connect(&url).await?);
        let (name, count) = (contended.clone(), count.clone());
        let opts = opts.clone().wait_timeout(Duration::from_secs(10));
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let g = client.lock(&name, &opts).await?;
                count.fetch_add(1, Ordering::Relaxed);
                g.release().await?;
            }
            Ok::<(), lockcore::Error>(())
        }));
    }
    let started = Instant::now();
    for t in tasks {
        t.await.expect("bench task")?;
    }
    let secs = started.elapsed().as_secs_f64();
    let n = count.load(Ordering::Relaxed);
    println!(
        "4-client contention   {n} acquisitions in {secs:.2} s = {:.0} /s",
        n as f64 / secs
    );
    Ok(())
}
