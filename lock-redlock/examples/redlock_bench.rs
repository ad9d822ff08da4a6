//! Redlock figures: the uncontended cost against the bare primitive, and hand-overs between
//! contending OS processes.
//!
//! ```text
//! cargo run --release -p lock-redlock --example redlock_bench -- all [URL]
//! cargo run --release -p lock-redlock --example redlock_bench -- uncontended [URL]
//! cargo run --release -p lock-redlock --example redlock_bench -- contend PROCS SECS [URL]
//! ```
//! The URL defaults to `$LOCK_TEST_REDLOCK_URL`.
//!
//! * `uncontended`: 2000 rounds, each `Backend::bare_cycle` (parallel `SET NX PX` on every master,
//!   all answers awaited, then parallel compare-and-delete) and `Locker::try_lock` + `release`,
//!   interleaved on the same client; prints p50/p99 of both and the ratio of the medians.
//! * `contend`: starts PROCS copies of itself, each one client looping `lock()` + `release()` on
//!   one name for SECS seconds from a common start; prints each process's count, the total
//!   hand-overs per second, the max/min spread, the smallest count as a fraction of a fair share
//!   and the server requests (sum of `INFO commandstats` over the masters) per hand-over.
//! * `all`: the three figures of issue 12 with their targets: `uncontended` (ratio at most
//!   1.2x), `contend 4 10` (at least 4,700 hand-overs/s, spread at most 1.5x) and `contend 8 10`
//!   (every process at least a tenth of a fair share).

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_redlock::RedlockBackend;
use lockcore::backend::Backend;
use lockcore::{Instant, LockName, LockOptions, Locker};

fn url_arg(args: &[String], i: usize) -> String {
    args.get(i)
        .cloned()
        .or_else(|| std::env::var("LOCK_TEST_REDLOCK_URL").ok())
        .expect("pass a redlock:// URL or set LOCK_TEST_REDLOCK_URL")
}

fn main() -> lockcore::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match args.get(1).map(String::as_str) {
        Some("all") => rt.block_on(async {
            let url = url_arg(&args, 2);
            let ratio = uncontended(url.clone()).await?;
            println!(
                "target uncontended <= 1.20x bare: {}",
                verdict(ratio <= 1.2)
            );
            let four = contend(4, 10, url.clone()).await?;
            println!(
                "target 4 processes >= 4700/s, spread <= 1.5x: {}",
                verdict(four.rate >= 4700.0 && four.spread <= 1.5)
            );
            let eight = contend(8, 10, url).await?;
            println!(
                "target 8 processes, each >= 0.1 of a fair share: {}",
                verdict(eight.min_share >= 0.1)
            );
            Ok(())
        }),
        Some("uncontended") => rt.block_on(uncontended(url_arg(&args, 2))).map(drop),
        Some("contend") => {
            let procs: usize = args[2].parse().expect("PROCS");
            let secs: u64 = args[3].parse().expect("SECS");
            rt.block_on(contend(procs, secs, url_arg(&args, 4)))
                .map(drop)
        }
        Some("child") => {
            // child NAME START_UNIX_MS SECS URL
            let start_ms: u64 = args[3].parse().expect("start");
            let secs: u64 = args[4].parse().expect("secs");
            rt.block_on(child(&args[2], start_ms, secs, args[5].clone()))
        }
        _ => {
            eprintln!(
                "usage: redlock_bench all [URL] | uncontended [URL] | contend PROCS SECS [URL]"
            );
            std::process::exit(2);
        }
    }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// What a contended run gave.
struct Contended {
    rate: f64,
    spread: f64,
    min_share: f64,
}

/// The 1-minute load average, for the record (others share the machine).
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Returns the ratio of the medians.
async fn uncontended(url: String) -> lockcore::Result<f64> {
    let backend = RedlockBackend::connect(&url).await?;
    println!("backend: {}  load average {}", backend.describe(), load());
    let locker = Locker::new(backend.clone());
    let name = LockName::new(format!("bench-{:08x}", fastrand::u32(..)))?;
    let bare_name = LockName::new(format!("bench-bare-{:08x}", fastrand::u32(..)))?;
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    for _ in 0..200 {
        backend.bare_cycle(&bare_name).await?;
        locker
            .try_lock(&name, &opts)
            .await?
            .expect("free")
            .release()
            .await?;
    }
    let (mut bare, mut lib, mut rt) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..2000 {
        let t = Instant::now();
        backend.bare_cycle(&bare_name).await?;
        bare.push(t.elapsed());
        let t = Instant::now();
        let g = locker.try_lock(&name, &opts).await?.expect("free");
        g.release().await?;
        lib.push(t.elapsed());
        let t = Instant::now();
        backend.round_trip().await?;
        rt.push(t.elapsed());
    }
    for v in [&mut bare, &mut lib, &mut rt] {
        v.sort();
    }
    println!(
        "parallel PING (all masters)       p50 {:>9.1?}  p99 {:>9.1?}",
        pct(&rt, 0.5),
        pct(&rt, 0.99)
    );
    println!(
        "bare cycle (SET NX PX + CAD, all) p50 {:>9.1?}  p99 {:>9.1?}",
        pct(&bare, 0.5),
        pct(&bare, 0.99)
    );
    println!(
        "try_lock + release                p50 {:>9.1?}  p99 {:>9.1?}",
        pct(&lib, 0.5),
        pct(&lib, 0.99)
    );
    let ratio = pct(&lib, 0.5).as_secs_f64() / pct(&bare, 0.5).as_secs_f64();
    println!("ratio try_lock+release / bare (p50): {ratio:.2}x");
    Ok(ratio)
}

async fn contend(procs: usize, secs: u64, url: String) -> lockcore::Result<Contended> {
    let backend = RedlockBackend::connect(&url).await?;
    println!("backend: {}  load average {}", backend.describe(), load());
    let name = format!("bench-contend-{:08x}", fastrand::u32(..));
    let start_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
        + 1500;
    let exe = std::env::current_exe().expect("own path");
    let children: Vec<_> = (0..procs)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "child",
                    &name,
                    &start_ms.to_string(),
                    &secs.to_string(),
                    &url,
                ])
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a child")
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1400)).await;
    let before = backend.server_requests().await?;
    let mut counts = Vec::new();
    for c in children {
        let out = c.wait_with_output().expect("child output");
        let text = String::from_utf8_lossy(&out.stdout);
        let n: u64 = text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("child said {text:?}"));
        counts.push(n);
    }
    let after = backend.server_requests().await?;
    let total: u64 = counts.iter().sum();
    let (min, max) = (
        *counts.iter().min().expect("procs > 0"),
        *counts.iter().max().expect("procs > 0"),
    );
    let fair = total as f64 / procs as f64;
    println!("{procs} processes, {secs} s, counts {counts:?}");
    let result = Contended {
        rate: total as f64 / secs as f64,
        spread: max as f64 / (min.max(1)) as f64,
        min_share: min as f64 / fair,
    };
    println!(
        "hand-overs/s {:.0}  spread max/min {:.2}x  min/fair share {:.2}  server requests per hand-over {:.1}  (load average after: {})",
        result.rate,
        result.spread,
        result.min_share,
        (after - before) as f64 / total.max(1) as f64,
        load()
    );
    Ok(result)
}

async fn child(name: &str, start_ms: u64, secs: u64, url: String) -> lockcore::Result<()> {
    let locker = Locker::new(RedlockBackend::connect(&url).await?);
    let name = LockName::new(name)?;
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    tokio::time::sleep(Duration::from_millis(start_ms.saturating_sub(now_ms))).await;
    let end = Instant::now() + Duration::from_secs(secs);
    let mut n = 0u64;
    while Instant::now() < end {
        let g = locker.lock(&name, &opts).await?;
        n += 1;
        g.release().await?;
    }
    locker.flush().await;
    println!("{n}");
    Ok(())
}
