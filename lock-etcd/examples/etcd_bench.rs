//! The etcd figures, in one run against one server:
//!
//! 1. uncontended `try_lock` + `release` against the bare primitive (`Txn` put-if-absent with a
//!    lease, then `Delete`), interleaved, by the same client: medians and their ratio;
//! 2. hand-overs per second with 4 contending OS processes on one lock;
//! 3. server requests (etcd's `grpc_server_msg_received_total`) per hand-over with 4 and with 100
//!    waiters on one lock: constant when a release wakes one waiter (no herd).
//!
//! ```text
//! cargo run --release -p lock-etcd --example etcd_bench -- [etcd://127.0.0.1:12379] [--seconds 5]
//! ```
//! (the URL defaults to `LOCK_TEST_ETCD_URL`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_etcd::EtcdBackend;
use lockcore::backend::Backend;
use lockcore::{Instant, LockName, LockOptions, Locker};

fn usage() -> ! {
    eprintln!("usage: etcd_bench [etcd://host:port] [--seconds N]");
    std::process::exit(2)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child(&args[1..]).await;
    }
    let mut url = std::env::var("LOCK_TEST_ETCD_URL").ok();
    let mut seconds = 5u64;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_else(|| usage())
            }
            u if u.starts_with("etcd") => url = Some(u.to_owned()),
            _ => usage(),
        }
    }
    let Some(url) = url else { usage() };
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    println!("etcd figures against {}", backend.describe());

    // 1. Uncontended, interleaved with the bare primitive, same client.
    let locker = Locker::new(backend.clone());
    let name = LockName::new(format!("bench-uncontended-{:08x}", fastrand::u32(..))).unwrap();
    let bare = LockName::new(format!("bench-bare-{:08x}", fastrand::u32(..))).unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    for _ in 0..50 {
        locker
            .try_lock(&name, &opts)
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
        backend.bare_cycle(&bare).await.unwrap();
    }
    let (mut lib, mut raw) = (Vec::new(), Vec::new());
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        let t = Instant::now();
        let g = locker
            .try_lock(&name, &opts)
            .await
            .unwrap()
            .expect("uncontended");
        g.release().await.unwrap();
        lib.push(t.elapsed());
        let t = Instant::now();
        backend.bare_cycle(&bare).await.unwrap();
        raw.push(t.elapsed());
    }
    let (l50, l99) = percentiles(&mut lib);
    let (r50, r99) = percentiles(&mut raw);
    println!(
        "uncontended try_lock+release: p50 {} us, p99 {} us ({} cycles)",
        l50.as_micros(),
        l99.as_micros(),
        lib.len()
    );
    println!(
        "bare Txn(put-if-absent, lease) + Delete: p50 {} us, p99 {} us",
        r50.as_micros(),
        r99.as_micros()
    );
    println!("ratio (p50): {:.2}x", l50.as_secs_f64() / r50.as_secs_f64());

    // 2. Hand-overs with 4 contending OS processes.
    let name = format!("bench-handover-{:08x}", fastrand::u32(..));
    let (count, secs) = processes(&url, &name, 4, seconds).await;
    println!(
        "hand-overs, 4 OS processes on one lock: {:.0}/s ({count} in {secs:.1} s)",
        count as f64 / secs
    );

    // 3. Server requests per hand-over, 4 and 100 waiters.
    for waiters in [4usize, 100] {
        let (handovers, requests) = herd(&url, waiters, seconds).await;
        println!(
            "{waiters} waiters on one lock: {handovers} hand-overs, {:.2} server requests per hand-over",
            requests as f64 / handovers as f64
        );
    }
}

fn percentiles(v: &mut [Duration]) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[v.len() * 99 / 100])
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Runs `n` child processes contending for `name` for `seconds` from a common start; returns the
/// acquisitions counted and the seconds measured.
async fn processes(url: &str, name: &str, n: usize, seconds: u64) -> (u64, f64) {
    use tokio::io::AsyncBufReadExt;
    let start_ms = unix_ms() + 1500;
    let exe = std::env::current_exe().unwrap();
    let mut children = Vec::new();
    for _ in 0..n {
        children.push(
            tokio::process::Command::new(&exe)
                .args([
                    "--child",
                    url,
                    name,
                    &start_ms.to_string(),
                    &seconds.to_string(),
                ])
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("spawning a contender"),
        );
    }
    let mut total = 0;
    for mut c in children {
        let mut lines = tokio::io::BufReader::new(c.stdout.take().unwrap()).lines();
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(n) = line.strip_prefix("COUNT ") {
                total += n.trim().parse::<u64>().unwrap();
            }
        }
        c.wait().await.unwrap();
    }
    (total, seconds as f64)
}

/// One contending process: lock, release, count, from `start_ms` for `seconds`.
async fn child(args: &[String]) {
    let [url, name, start_ms, seconds] = args else {
        usage()
    };
    let start_ms: u64 = start_ms.parse().unwrap();
    let seconds: u64 = seconds.parse().unwrap();
    let locker = Locker::new(EtcdBackend::connect(url).await.expect("connect"));
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_timeout(Duration::from_secs(30));
    let now = unix_ms();
    tokio::time::sleep(Duration::from_millis(start_ms.saturating_sub(now))).await;
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut count = 0u64;
    while Instant::now() < end {
        let g = locker.lock(name.as_str(), &opts).await.expect("lock");
        count += 1;
        g.release().await.expect("release");
    }
    println!("COUNT {count}");
}

/// `waiters` tasks over 10 clients (or fewer) contend for one lock for `seconds`; returns the
/// hand-overs and the server requests counted meanwhile.
async fn herd(url: &str, waiters: usize, seconds: u64) -> (u64, u64) {
    let clients = waiters.min(10);
    let mut lockers = Vec::new();
    for _ in 0..clients {
        lockers.push(Locker::new(EtcdBackend::connect(url).await.unwrap()));
    }
    let probe = EtcdBackend::connect(url).await.unwrap();
    let name = format!("bench-herd-{waiters}-{:08x}", fastrand::u32(..));
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_timeout(Duration::from_secs(120));
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..waiters {
        let locker = lockers[i % clients].clone();
        let (name, opts, count, stop, measuring) = (
            name.clone(),
            opts.clone(),
            count.clone(),
            stop.clone(),
            measuring.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let g = locker.lock(name.as_str(), &opts).await.expect("lock");
                if measuring.load(Ordering::SeqCst) {
                    count.fetch_add(1, Ordering::SeqCst);
                }
                g.release().await.expect("release");
            }
        }));
    }
    // Let every waiter queue up before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = probe.server_requests().await.unwrap();
    measuring.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    measuring.store(false, Ordering::SeqCst);
    let after = probe.server_requests().await.unwrap();
    let handovers = count.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    for l in &lockers {
        l.flush().await;
    }
    (handovers, after - before)
}
