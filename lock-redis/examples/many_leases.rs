//! How renewal scales with many held leases on one client, measured from outside the process.
//!
//! `cargo run -p lock-redis --release --example many_leases -- [URL] [LEASES] [SECONDS] [TTL_SECS]`
//! (default: `$LOCK_TEST_REDIS_URL`, 1000 leases, 10 s, TTL 3 s). The example starts itself again
//! as a child process that takes the leases with auto-renewal (renewed every third of the TTL) and
//! holds them; the parent reads the child's `/proc/PID/stat` (utime + stime) and
//! `/proc/PID/status` (`VmRSS`) before and after the hold window, and the server's
//! `INFO commandstats` (script calls), and prints CPU as a share of one core, RSS, and
//! renewals per second. The child then reports how many leases it lost.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use lock_redis::RedisBackend;
use lockcore::{AutoRenew, Instant, LockOptions, Locker};

/// Clock ticks per second of `/proc/PID/stat` times (`getconf CLK_TCK`; 100 on Linux).
const CLK_TCK: u64 = 100;

/// utime + stime of `pid`, from `/proc/PID/stat`. The fields are counted after the closing
/// parenthesis of the command name (which may itself hold spaces or parentheses): the first
/// one after it is field 3 (`state`), so utime (field 14) and stime (field 15) are at indices
/// 11 and 12 of the rest.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    let rest = &stat[stat.rfind(')').expect("(comm)") + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 1000 / CLK_TCK)
}

/// Resident set size of `pid` in MiB, from `/proc/PID/status`.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

async fn script_calls(admin: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn main() -> lockcore::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .or_else(|| std::env::var("LOCK_TEST_REDIS_URL").ok())
        .expect("pass a redis URL or set LOCK_TEST_REDIS_URL");
    let leases: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(1000);
    let secs: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(10);
    let ttl = Duration::from_secs(args.next().and_then(|n| n.parse().ok()).unwrap_or(3));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    if std::env::var_os("MANY_LEASES_CHILD").is_some() {
        rt.block_on(hold(&url, leases, ttl))
    } else {
        rt.block_on(measure(&url, leases, secs, ttl));
        Ok(())
    }
}

/// The child: takes the leases, says `holding`, waits for a line on stdin, reports losses.
async fn hold(url: &str, leases: usize, ttl: Duration) -> lockcore::Result<()> {
    let locker = Locker::new(RedisBackend::connect(url).await?);
    let opts = LockOptions::new()
        .ttl(ttl)
        .auto_renew(AutoRenew::until(Duration::from_secs(3600)));
    let prefix = format!("many-{:08x}", fastrand::u32(..));
    let mut guards = Vec::with_capacity(leases);
    for i in 0..leases {
        let g = locker.try_lock(format!("{prefix}-{i}"), &opts).await?;
        guards.push(g.expect("fresh names are free"));
    }
    println!("holding");
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    })
    .await
    .expect("stdin reader");
    let lost = guards.iter().filter(|g| !g.is_valid()).count();
    println!("lost {lost}");
    for g in guards {
        g.release().await?;
    }
    Ok(())
}

/// The parent: measures the child from outside.
async fn measure(url: &str, leases: usize, secs: u64, ttl: Duration) {
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .args([url, &leases.to_string(), "0", &ttl.as_secs().to_string()])
        .env("MANY_LEASES_CHILD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the holder child");
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).expect("child output");
    assert_eq!(
        line.trim(),
        "holding",
        "the child failed to take its leases"
    );
    let mut admin = redis::Client::open(url)
        .expect("a plain redis:// URL")
        .get_multiplexed_async_connection()
        .await
        .expect("an admin connection");
    // Let the acquisition burst settle into the renewal rhythm first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (calls0, cpu0, start) = (
        script_calls(&mut admin).await,
        cpu_time(pid),
        Instant::now(),
    );
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (calls, cpu, wall, rss) = (
        script_calls(&mut admin).await - calls0,
        cpu_time(pid) - cpu0,
        start.elapsed(),
        rss_mib(pid),
    );
    writeln!(child.stdin.as_mut().unwrap()).expect("tell the child to stop");
    line.clear();
    out.read_line(&mut line).expect("child output");
    let _ = child.wait();
    println!(
        "{leases} leases held {wall:.1?} (pid {pid}, measured from outside): {calls} script calls \
         ({:.0}/s; unbatched renewal would be ~{:.0}/s), {}, CPU {cpu:?} = {:.1}% of one core, \
         RSS {rss:.0} MiB (TTL {ttl:?})",
        calls as f64 / wall.as_secs_f64(),
        leases as f64 * 3.0 / ttl.as_secs_f64(),
        line.trim(),
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
    );
}
