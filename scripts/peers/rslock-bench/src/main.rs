//! rslock's figures for `scripts/bench-peers.sh`, through rslock's own client and defaults
//! (3 tries, a random retry delay below 200 ms, `acquire` looping `lock` until it wins).
//!
//! The Redis URLs come from `RSLOCK_BENCH_URLS` (comma-separated; one URL: a single Redis, five:
//! Redlock over five masters), never from argv, which any user can read.
//!
//!     rslock-bench p50 SECS             uncontended lock + unlock by one client:
//!                                       `p50_us X p99_us Y samples N`
//!     rslock-bench contend PROCS SECS   PROCS processes loop acquire + unlock on one name:
//!                                       `per_sec X counts N N ... spread S`
//!     rslock-bench worker START_MS SECS NAME   (internal) one process of `contend`
//!     rslock-bench pubsub SECS          the floor of any hand-over by message: a `PUBLISH`
//!                                       sent by this process until another process's task
//!                                       has it (system-clock stamps, as `locksmith bench`'s
//!                                       hand-over column), beside a `PING` round trip:
//!                                       `p50_us X p99_us Y rtt_us R samples N`
//!     rslock-bench subscriber CHANNEL   (internal) the receiving process of `pubsub`
//!
//! Lock names start with `peers-rslock-` and a random suffix, so runs keep apart on shared
//! servers.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use rslock::LockManager;

/// The lease each acquisition asks for (the holds last microseconds).
const TTL: Duration = Duration::from_secs(10);

fn urls() -> Vec<String> {
    let urls: Vec<String> = std::env::var("RSLOCK_BENCH_URLS")
        .unwrap_or_default()
        .split(',')
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        fail("RSLOCK_BENCH_URLS is not set");
    }
    urls
}

fn fail(why: &str) -> ! {
    eprintln!("rslock-bench: {why}");
    std::process::exit(2)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn fresh_name(what: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("peers-rslock-{what}-{}-{nanos:08x}", std::process::id())
}

fn number<T: std::str::FromStr>(arg: Option<&String>, what: &str) -> T {
    arg.and_then(|a| a.parse().ok())
        .unwrap_or_else(|| fail(&format!("expected {what}")))
}

/// On a multi-thread runtime, the work in a task of its own (on a worker thread, as a
/// service's tasks run): the runtime `locksmith bench` measures on.
#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = async move {
        match args.first().map(String::as_str) {
            Some("p50") => p50(Duration::from_secs(number(args.get(1), "SECS"))).await,
            Some("contend") => contend(number(args.get(1), "PROCS"), number(args.get(2), "SECS")),
            Some("worker") => {
                let name = args.get(3).unwrap_or_else(|| fail("expected NAME"));
                worker(
                    number(args.get(1), "START_MS"),
                    number(args.get(2), "SECS"),
                    name,
                )
                .await
            }
            Some("pubsub") => pubsub(Duration::from_secs(number(args.get(1), "SECS"))).await,
            Some("subscriber") => {
                subscriber(args.get(1).unwrap_or_else(|| fail("expected CHANNEL"))).await
            }
            _ => fail("usage: rslock-bench p50 SECS | contend PROCS SECS | pubsub SECS"),
        }
    };
    if let Err(e) = tokio::spawn(run).await {
        fail(&format!("the run failed: {e}"));
    }
}

/// Uncontended lock + unlock by one client for `secs` (after 100 to warm up).
async fn p50(secs: Duration) {
    let manager = LockManager::new(urls());
    let name = fresh_name("p50");
    let mut samples = Vec::new();
    let mut warm = 0;
    let mut until = None;
    loop {
        let start = Instant::now();
        let lock = match manager.lock(name.as_bytes(), TTL).await {
            Ok(l) => l,
            Err(e) => fail(&format!("uncontended lock failed: {e:?}")),
        };
        manager.unlock(&lock).await;
        let took = start.elapsed();
        if warm < 100 {
            warm += 1;
            continue;
        }
        let until = *until.get_or_insert_with(|| Instant::now() + secs);
        samples.push(took);
        if Instant::now() >= until {
            break;
        }
    }
    samples.sort();
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    println!(
        "p50_us {:.1} p99_us {:.1} samples {}",
        at(0.5).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6,
        samples.len()
    );
}

/// `procs` copies of this binary loop `acquire` + `unlock` on one name for `secs`, started
/// together at one moment of the system clock (after each has connected).
fn contend(procs: usize, secs: u64) {
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(&format!("own binary: {e}")));
    let name = fresh_name("contend");
    let start_ms = unix_ms() + 1500;
    let children: Vec<_> = (0..procs)
        .map(|_| {
            Command::new(&exe)
                .args(["worker", &start_ms.to_string(), &secs.to_string(), &name])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| fail(&format!("starting a worker: {e}")))
        })
        .collect();
    let mut counts = Vec::new();
    for child in children {
        let out = child
            .wait_with_output()
            .unwrap_or_else(|e| fail(&format!("waiting for a worker: {e}")));
        let text = String::from_utf8_lossy(&out.stdout);
        let count: u64 = text
            .trim()
            .strip_prefix("count ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| fail(&format!("a worker printed {text:?}")));
        counts.push(count);
    }
    let total: u64 = counts.iter().sum();
    let (min, max) = (
        counts.iter().copied().min().unwrap_or(0),
        counts.iter().copied().max().unwrap_or(0),
    );
    let shown: Vec<String> = counts.iter().map(u64::to_string).collect();
    println!(
        "per_sec {:.0} counts {} spread {:.2} min_share {:.2}",
        total as f64 / secs as f64,
        shown.join(" "),
        max as f64 / min.max(1) as f64,
        min as f64 / (total as f64 / counts.len().max(1) as f64).max(1.0)
    );
}

/// One process of [`contend`]: connects, waits for `start_ms`, loops for `secs`, prints its
/// count.
async fn worker(start_ms: u64, secs: u64, name: &str) {
    let manager = LockManager::new(urls());
    // Connect before the start: one lock + unlock on a name of its own.
    let warm = fresh_name("warm");
    match manager.lock(warm.as_bytes(), TTL).await {
        Ok(l) => manager.unlock(&l).await,
        Err(e) => fail(&format!("connecting: {e:?}")),
    }
    tokio::time::sleep(Duration::from_millis(start_ms.saturating_sub(unix_ms()))).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    let mut count = 0u64;
    while let Ok(got) =
        tokio::time::timeout_at(deadline, manager.acquire(name.as_bytes(), TTL)).await
    {
        let guard = got.unwrap_or_else(|e| fail(&format!("acquire failed: {e:?}")));
        count += 1;
        guard.release().await;
        if tokio::time::Instant::now() >= deadline {
            break;
        }
    }
    println!("count {count}");
}

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort();
    samples[((samples.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e6
}

/// The floor of a hand-over by message, with no lock at all: this process `PUBLISH`es its
/// send time about once a millisecond (paced, so no message queues behind another) to a
/// subscriber in another process, which reports the p50 / p99 of "received minus sent".
async fn pubsub(secs: Duration) {
    use std::io::BufRead;
    let url = urls().remove(0);
    let channel = fresh_name("pubsub");
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(&format!("own binary: {e}")));
    let mut child = Command::new(&exe)
        .args(["subscriber", &channel])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| fail(&format!("starting the subscriber: {e}")));
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    match lines.next() {
        Some(Ok(l)) if l == "ready" => {}
        other => fail(&format!("the subscriber said {other:?}")),
    }
    let client = redis::Client::open(url.as_str()).unwrap_or_else(|e| fail(&format!("{e}")));
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| fail(&format!("connecting: {e}")));
    let mut rtts = Vec::new();
    for _ in 0..2000 {
        let start = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut con)
            .await
            .unwrap_or_else(|e| fail(&format!("PING: {e}")));
        rtts.push(start.elapsed());
    }
    let until = Instant::now() + secs;
    while Instant::now() < until {
        let _: i64 = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg(unix_nanos().to_string())
            .query_async(&mut con)
            .await
            .unwrap_or_else(|e| fail(&format!("PUBLISH: {e}")));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let _: i64 = redis::cmd("PUBLISH")
        .arg(&channel)
        .arg("end")
        .query_async(&mut con)
        .await
        .unwrap_or_else(|e| fail(&format!("PUBLISH: {e}")));
    let result = match lines.next() {
        Some(Ok(l)) => l,
        other => fail(&format!("the subscriber said {other:?}")),
    };
    let _ = child.wait();
    println!("{result} rtt_us {:.1}", percentile(&mut rtts, 0.5));
}

/// The receiving process of [`pubsub`]: says `ready` once subscribed, then reads send times
/// until `end` and prints `p50_us X p99_us Y samples N`.
async fn subscriber(channel: &str) {
    let url = urls().remove(0);
    let client = redis::Client::open(url.as_str()).unwrap_or_else(|e| fail(&format!("{e}")));
    let mut sub = client
        .get_async_pubsub()
        .await
        .unwrap_or_else(|e| fail(&format!("connecting: {e}")));
    sub.subscribe(channel)
        .await
        .unwrap_or_else(|e| fail(&format!("SUBSCRIBE: {e}")));
    println!("ready");
    let mut samples = Vec::new();
    let mut messages = sub.on_message();
    while let Some(m) = messages.next().await {
        let now = unix_nanos();
        let payload: String = m.get_payload().unwrap_or_default();
        if payload == "end" {
            break;
        }
        if let Ok(sent) = payload.parse::<u128>() {
            samples.push(Duration::from_nanos(now.saturating_sub(sent) as u64));
        }
    }
    if samples.is_empty() {
        fail("no message arrived");
    }
    let n = samples.len();
    println!(
        "p50_us {:.1} p99_us {:.1} samples {n}",
        percentile(&mut samples, 0.5),
        percentile(&mut samples, 0.99)
    );
}
