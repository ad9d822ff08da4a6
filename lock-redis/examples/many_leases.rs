//! How renewal scales with many held leases on one client.
//!
//! `cargo run -p lock-redis --release --example many_leases -- [URL] [LEASES]` (default:
//! `$LOCK_TEST_REDIS_URL`, 1000 leases). Holds the leases with auto-renewal (TTL 3 s, renewed
//! every second) for ten seconds and prints how many renewals the server ran (`INFO
//! commandstats`), whether any lease was lost, and the CPU time the process used. Each guard's
//! renewal timer lives in tokio's shared timer wheel, and the renewals that fall due together
//! go out pipelined on the client's one multiplexed connection.

use std::time::Duration;

use lock_redis::RedisBackend;
use lockcore::{AutoRenew, Instant, LockOptions, Locker};

fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // utime and stime are fields 14 and 15 of the whole line: 12th and 13th after the name.
    Duration::from_millis((f.get(10).unwrap_or(&0) + f.get(11).unwrap_or(&0)) * 10)
}

async fn evalsha_calls(admin: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .expect("INFO commandstats");
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> lockcore::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .or_else(|| std::env::var("LOCK_TEST_REDIS_URL").ok())
        .expect("pass a redis URL or set LOCK_TEST_REDIS_URL");
    let leases: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(1000);
    let locker = Locker::new(RedisBackend::connect(&url).await?);
    let mut admin = redis::Client::open(url.as_str())
        .expect("a plain redis:// URL")
        .get_multiplexed_async_connection()
        .await
        .expect("an admin connection");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(3))
        .auto_renew(AutoRenew::until(Duration::from_secs(60)));
    let prefix = format!("many-{:08x}", fastrand::u32(..));
    let mut guards = Vec::with_capacity(leases);
    for i in 0..leases {
        let g = locker.try_lock(format!("{prefix}-{i}"), &opts).await?;
        guards.push(g.expect("fresh names are free"));
    }
    let (calls0, cpu0, start) = (evalsha_calls(&mut admin).await, cpu_time(), Instant::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (calls, cpu, wall) = (
        evalsha_calls(&mut admin).await - calls0,
        cpu_time() - cpu0,
        start.elapsed(),
    );
    let lost = guards.iter().filter(|g| !g.is_valid()).count();
    println!(
        "{leases} leases held {wall:.1?}: {calls} renewals ({:.0}/s, expected ~{leases}/s), {lost} lost, process CPU {cpu:?} ({:.1}% of one core)",
        calls as f64 / wall.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
    );
    for g in guards {
        g.release().await?;
    }
    Ok(())
}
