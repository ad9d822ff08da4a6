//! `locksmith bench --renewals N URL`: the cost of holding many auto-renewed leases on one
//! client, measured from outside the process that holds them (issue 24: 100,000 leases on one
//! Redis client within 64 MiB RSS and 10 % of a core).
//!
//! A worker process (this binary as `locksmith __renew-worker`, the URL in its environment,
//! never in argv) connects one client, takes N auto-renewed leases on distinct names and holds
//! them. Once all are taken and one renewal interval has passed (every lease is then in its
//! renewal rhythm), the parent reads the worker's `/proc/PID/stat` (utime + stime) and
//! `/proc/PID/status` (`VmRSS`, sampled every second) over the window, and on Redis the
//! server's `INFO commandstats` (`PEXPIRE` calls: two per renewal, the lock key and its holder
//! key), so the renewal rate is checked against what the server saw. The worker then reports
//! how many leases it lost.

use std::time::Duration;

use locksmith::{AutoRenew, ErrorKind, LockGuard, LockOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::Instant;

/// The goal of issue 24 for 100,000 leases, printed beside the figures.
const GOAL_RSS_MIB: f64 = 64.0;
const GOAL_CPU_PERCENT: f64 = 10.0;

/// Acquisitions in flight at once while the worker takes its leases (only to get there sooner;
/// the measurement starts after).
const ACQUIRE_TASKS: usize = 64;

/// What `bench --renewals` measures.
#[derive(Clone, Copy, Debug)]
pub struct RenewPlan {
    /// Leases held by the worker's one client.
    pub leases: usize,
    /// Their TTL (renewed every third of it).
    pub ttl: Duration,
    /// The measurement window.
    pub window: Duration,
}

/// Runs the measurement against `url` and prints it. Returns 0, or 1 if it failed or the
/// worker lost a lease.
pub async fn bench(url: &str, plan: RenewPlan) -> u8 {
    match measure(url, plan).await {
        Ok(m) => {
            print!("{}", m.render(plan));
            u8::from(m.lost != 0)
        }
        Err(e) => {
            eprintln!("[bench] renewals: {e}");
            1
        }
    }
}

/// What the parent saw.
struct Measured {
    pid: u32,
    acquire: Duration,
    settle: Duration,
    wall: Duration,
    cpu: Duration,
    rss_end_mib: f64,
    rss_max_mib: f64,
    /// Renewals the server applied in the window, where it can be asked (Redis).
    server_renewals: Result<u64, String>,
    lost: u64,
}

impl Measured {
    fn render(&self, plan: RenewPlan) -> String {
        let interval = plan.ttl / 3;
        let secs = self.wall.as_secs_f64();
        let cpu = 100.0 * self.cpu.as_secs_f64() / secs;
        let expected = plan.leases as f64 / interval.as_secs_f64();
        let verdict = |ok: bool| if ok { "met" } else { "missed" };
        let server = match &self.server_renewals {
            Ok(n) => format!(
                "{n} ({:.0}/s; expected {expected:.0}/s: {} leases every {:?})",
                *n as f64 / secs,
                plan.leases,
                interval
            ),
            Err(why) => format!("- ({why}; expected {expected:.0}/s)"),
        };
        format!(
            "renewals: {} auto-renewed leases on one client, TTL {:?} (renewed every {:?}); worker pid {}\n\
             \x20 taken in {:.1} s; measured from outside over {:.1} s after {:.1} s settling\n\
             \x20 RSS       {:.1} MiB at the end, {:.1} MiB max in the window   (goal for 100,000 leases: {GOAL_RSS_MIB} MiB: {})\n\
             \x20 CPU       {:.1} % of one core ({:.2} s)                  (goal for 100,000 leases: {GOAL_CPU_PERCENT} %: {})\n\
             \x20 renewals the server applied in the window (INFO commandstats PEXPIRE / 2, server-wide): {}\n\
             \x20 leases lost: {}\n",
            plan.leases,
            plan.ttl,
            interval,
            self.pid,
            self.acquire.as_secs_f64(),
            secs,
            self.settle.as_secs_f64(),
            self.rss_end_mib,
            self.rss_max_mib,
            verdict(self.rss_max_mib <= GOAL_RSS_MIB),
            cpu,
            self.cpu.as_secs_f64(),
            verdict(cpu <= GOAL_CPU_PERCENT),
            server,
            self.lost,
        )
    }
}

async fn measure(url: &str, plan: RenewPlan) -> Result<Measured, String> {
    let mut child = crate::bench::spawn_worker(url, |c| {
        c.arg("__renew-worker")
            .args(["--leases", &plan.leases.to_string()])
            .args(["--ttl-ms", &plan.ttl.as_millis().to_string()]);
    })?;
    let pid = child.id().ok_or("the worker has no pid")?;
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("the worker has no pipes".into());
    };
    let mut lines = BufReader::new(stdout).lines();
    let mut line =
        async |limit: Duration| match tokio::time::timeout(limit, lines.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => Err("the worker ended without answering".to_owned()),
            Ok(Err(e)) => Err(format!("reading the worker: {e}")),
            Err(_) => Err(format!("the worker did not answer within {limit:?}")),
        };
    // Generous: 100,000 acquisitions on a loaded machine.
    let ready = line(Duration::from_secs(600)).await?;
    let acquire = ready
        .strip_prefix("ready ")
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis)
        .ok_or_else(|| format!("the worker could not take its leases: {ready}"))?;
    // Settle for one renewal interval: by then every lease has been renewed once, so the window
    // sees the steady rhythm and not the acquisition burst.
    let settle = plan.ttl / 3;
    tokio::time::sleep(settle).await;
    let mut server = ServerCounter::connect(url).await;
    let pexpire_before = server.pexpires().await;
    let (cpu_before, started) = (cpu_time(pid)?, Instant::now());
    let mut rss_max_mib: f64 = 0.0;
    let end = started + plan.window;
    loop {
        rss_max_mib = rss_max_mib.max(rss_mib(pid)?);
        let now = Instant::now();
        if now >= end {
            break;
        }
        tokio::time::sleep_until(end.min(now + Duration::from_secs(1))).await;
    }
    let (cpu, wall, rss_end_mib) = (
        cpu_time(pid)? - cpu_before,
        started.elapsed(),
        rss_mib(pid)?,
    );
    let server_renewals = match (pexpire_before, server.pexpires().await) {
        (Ok(before), Ok(after)) => Ok(after.saturating_sub(before) / 2),
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    stdin
        .write_all(b"stop\n")
        .await
        .map_err(|e| format!("stopping the worker: {e}"))?;
    let report = line(Duration::from_secs(600)).await?;
    let lost = report
        .strip_prefix("lost ")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("the worker failed: {report}"))?;
    let _ = child.wait().await;
    Ok(Measured {
        pid,
        acquire,
        settle,
        wall,
        cpu,
        rss_end_mib,
        rss_max_mib,
        server_renewals,
        lost,
    })
}

/// The server's `PEXPIRE` count, on a plain Redis URL (the renewal script's two `PEXPIRE`s per
/// lease are counted by `INFO commandstats` like any other call).
struct ServerCounter(Result<redis::aio::MultiplexedConnection, String>);

impl ServerCounter {
    async fn connect(url: &str) -> Self {
        if !matches!(locksmith::scheme_of(url).as_deref(), Ok("redis" | "rediss")) {
            return ServerCounter(Err("not a single Redis server".into()));
        }
        let conn = match redis::Client::open(url) {
            Ok(c) => c
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| format!("connecting to count renewals: {e}")),
            Err(e) => Err(format!("connecting to count renewals: {e}")),
        };
        ServerCounter(conn)
    }

    async fn pexpires(&mut self) -> Result<u64, String> {
        let conn = self.0.as_mut().map_err(|e| e.clone())?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await
            .map_err(|e| format!("INFO commandstats: {e}"))?;
        Ok(locksmith::lock_redis::node::command_calls(&info, |c| {
            c == "pexpire"
        }))
    }
}

/// utime + stime of `pid` from `/proc/PID/stat`. The fields are counted after the closing
/// parenthesis of the command name (which may hold spaces or parentheses): the first one after
/// it is field 3, so utime (14) and stime (15) are at indices 11 and 12 of the rest.
fn cpu_time(pid: u32) -> Result<Duration, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("reading /proc/{pid}/stat (did the worker die?): {e}"))?;
    let rest = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or("an unreadable /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Result<u64, String> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| "an unreadable /proc/PID/stat".to_owned())
    };
    let ticks = field(11)? + field(12)?;
    let per_sec = rustix::param::clock_ticks_per_second();
    Ok(Duration::from_secs_f64(ticks as f64 / per_sec as f64))
}

/// `VmRSS` of `pid` in MiB, from `/proc/PID/status`.
fn rss_mib(pid: u32) -> Result<f64, String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("reading /proc/{pid}/status (did the worker die?): {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
        .ok_or_else(|| "no VmRSS in /proc/PID/status".to_owned())
}

/// `locksmith __renew-worker`: takes `leases` auto-renewed leases with `ttl` on one client of
/// the URL in its environment, prints `ready <ms it took>`, holds them until a line on stdin,
/// prints `lost <n>` (the leases lost meanwhile), releases them. Returns the exit code.
pub async fn worker(leases: usize, ttl: Duration) -> u8 {
    match worker_inner(leases, ttl).await {
        Ok(lost) => {
            println!("lost {lost}");
            0
        }
        Err(e) => {
            // One line: the parent reads it as the failure.
            println!("error {}", e.to_string().replace('\n', " "));
            1
        }
    }
}

async fn worker_inner(leases: usize, ttl: Duration) -> locksmith::Result<usize> {
    let url = crate::bench::worker_url()?;
    let locker = locksmith::connect(&url).await?;
    // Renewed every third of the TTL (the default) for longer than any run.
    let opts = LockOptions::new()
        .ttl(ttl)
        .auto_renew(AutoRenew::until(Duration::from_secs(24 * 3600)));
    let prefix = format!("lsbench-renew-{:08x}", fastrand::u32(..));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..ACQUIRE_TASKS.min(leases.max(1)) {
        let (locker, opts, prefix) = (locker.clone(), opts.clone(), prefix.clone());
        tasks.spawn(async move {
            let mut guards = Vec::new();
            for i in (t..leases).step_by(ACQUIRE_TASKS) {
                match locker.try_lock(format!("{prefix}-{i}"), &opts).await? {
                    Some(g) => guards.push(g),
                    None => {
                        return Err(locksmith::Error::new(
                            ErrorKind::Backend,
                            format!("the fresh name {prefix}-{i} is held"),
                        ));
                    }
                }
            }
            Ok::<Vec<LockGuard>, locksmith::Error>(guards)
        });
    }
    let mut guards = Vec::with_capacity(leases);
    while let Some(done) = tasks.join_next().await {
        let taken = done.map_err(|e| locksmith::Error::new(ErrorKind::Backend, e.to_string()))?;
        guards.extend(taken?);
    }
    println!("ready {}", started.elapsed().as_millis());
    let mut stop = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut stop)
        .await
        .map_err(|e| locksmith::Error::new(ErrorKind::Backend, format!("reading stdin: {e}")))?;
    let lost = guards.iter().filter(|g| !g.is_valid()).count();
    drop(guards);
    // The drops hand the releases to the background: wait for them, so the names are freed
    // now and not at their TTL.
    locker.flush().await;
    Ok(lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_shows_the_goal_and_the_server_view() {
        let m = Measured {
            pid: 42,
            acquire: Duration::from_secs(12),
            settle: Duration::from_secs(10),
            wall: Duration::from_secs(20),
            cpu: Duration::from_secs(1),
            rss_end_mib: 40.0,
            rss_max_mib: 41.0,
            server_renewals: Ok(200_000),
            lost: 0,
        };
        let plan = RenewPlan {
            leases: 100_000,
            ttl: Duration::from_secs(30),
            window: Duration::from_secs(20),
        };
        let out = m.render(plan);
        assert!(out.contains("5.0 % of one core"), "{out}");
        assert!(out.contains("64 MiB: met"), "{out}");
        assert!(out.contains("10 %: met"), "{out}");
        assert!(out.contains("200000 (10000/s; expected 10000/s"), "{out}");
        let slow = Measured {
            cpu: Duration::from_secs(5),
            server_renewals: Err("not a single Redis server".into()),
            ..m
        };
        let out = slow.render(plan);
        assert!(out.contains("10 %: missed"), "{out}");
        assert!(out.contains("- (not a single Redis server"), "{out}");
    }
}
