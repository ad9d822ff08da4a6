//! Latency and hand-over figures against a ZooKeeper server:
//! `cargo run --release -p lock-zk --example zk_bench -- zk://127.0.0.1:12181 [PROCS] [SECS]`
//! (or LOCK_TEST_ZK_URL).
//!
//! 1. Uncontended `try_lock` + release against the bare primitive (create ephemeral-sequential
//!    + delete, [`Backend::bare_cycle`]), interleaved on one client so both see the same noise.
//! 2. Hand-over rate: PROCS (default 4) separate OS processes (this binary re-run as workers),
//!    each one client looping `lock()` + release on one name for SECS (default 10) seconds,
//!    with the server's request count (`mntr` zk_packets_received) per hand-over.

use std::process::Stdio;
use std::time::Duration;

use conformance::print_latencies as show;
use lock_zk::ZkBackend;
use lockcore::backend::Backend;
use lockcore::{Instant, LockName, LockOptions, Locker};
use tokio::io::{AsyncBufReadExt, BufReader};

fn opts() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(30))
}

/// A worker process: waits for "go" on stdin, loops lock/release until the end, prints its
/// count.
async fn worker(url: &str, name: &str, secs: f64) -> lockcore::Result<()> {
    let locker = Locker::new(ZkBackend::connect(url).await?);
    println!("ready");
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).expect("stdin");
    })
    .await
    .expect("stdin");
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    while Instant::now() < end {
        let g = locker.lock(name, &opts()).await?;
        g.release().await?;
        n += 1;
    }
    println!("{n}");
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> lockcore::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--worker") {
        return worker(&args[2], &args[3], args[4].parse().expect("secs")).await;
    }
    let url = args
        .get(1)
        .cloned()
        .or_else(|| std::env::var("LOCK_TEST_ZK_URL").ok())
        .expect("pass a zk:// URL or set LOCK_TEST_ZK_URL");
    let procs: usize = args.get(2).map_or(4, |s| s.parse().expect("PROCS"));
    let secs: f64 = args.get(3).map_or(10.0, |s| s.parse().expect("SECS"));
    const N: usize = 1000;
    let backend = ZkBackend::connect(&url).await?;
    println!("{}", backend.describe());
    let locker = Locker::new(backend.clone());
    let name = format!("bench-{}", std::process::id());
    let bare_name = LockName::new(format!("bench-bare-{}", std::process::id()))?;
    // Warm up (and create the lock nodes).
    let has_bare = backend.bare_cycle(&bare_name).await.is_ok();
    for _ in 0..50 {
        locker
            .try_lock(&name, &opts())
            .await?
            .unwrap()
            .release()
            .await?;
        if has_bare {
            backend.bare_cycle(&bare_name).await?;
        }
    }
    let mut bare = Vec::with_capacity(N);
    let mut cycle = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        if has_bare {
            backend.bare_cycle(&bare_name).await?;
        }
        bare.push(t.elapsed());
        let t = Instant::now();
        let g = locker.try_lock(&name, &opts()).await?.expect("uncontended");
        g.release().await?;
        cycle.push(t.elapsed());
    }
    let c = show("uncontended try_lock+release", cycle);
    if has_bare {
        let b = show("bare create-ES + delete", bare);
        println!(
            "try_lock+release / bare primitive p50 = {:.2}x",
            c.as_secs_f64() / b.as_secs_f64()
        );
    }
    let mut lock_cycle = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        let g = locker.lock(&name, &opts()).await?;
        g.release().await?;
        lock_cycle.push(t.elapsed());
    }
    show("uncontended lock()+release", lock_cycle);

    // Hand-over across OS processes.
    let exe = std::env::current_exe().expect("own path");
    let mut children = Vec::new();
    for _ in 0..procs {
        let mut child = tokio::process::Command::new(&exe)
            .args(["--worker", &url, &name, &secs.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn worker");
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = out.next_line().await.expect("worker output");
        assert_eq!(ready.as_deref(), Some("ready"), "worker failed to start");
        children.push((child, out));
    }
    let before = backend.server_requests().await.ok();
    for (child, _) in &mut children {
        use tokio::io::AsyncWriteExt;
        child
            .stdin
            .as_mut()
            .unwrap()
            .write_all(b"go\n")
            .await
            .expect("go");
    }
    let mut counts = Vec::new();
    for (mut child, mut out) in children {
        let line = out.next_line().await.expect("count").expect("count line");
        counts.push(line.trim().parse::<u64>().expect("a count"));
        let _ = child.wait().await;
    }
    let after = backend.server_requests().await.ok();
    let total: u64 = counts.iter().sum();
    println!(
        "{procs}-process hand-over: {total} acquisitions in {secs} s = {:.0}/s (per process {counts:?}, min/max {:.2})",
        total as f64 / secs,
        *counts.iter().min().unwrap() as f64 / (*counts.iter().max().unwrap()).max(1) as f64
    );
    if let (Some(b), Some(a)) = (before, after) {
        println!(
            "server requests per hand-over (mntr zk_packets_received, pings included): {:.2}",
            (a - b) as f64 / total.max(1) as f64
        );
    }
    Ok(())
}
