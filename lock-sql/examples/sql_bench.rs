//! Latency and hand-over figures for one SQL variant:
//! `cargo run --release -p lock-sql --example sql_bench -- URL [PROCS] [SECS]`, URL such as
//! `postgres://u:pw@127.0.0.1:15432/db?strategy=row-lock` or `mysql://...?strategy=row-lock`.
//!
//! 1. Uncontended `try_lock` + release against the bare primitive ([`Backend::bare_cycle`]:
//!    `pg_advisory_lock` + unlock, `GET_LOCK` + `RELEASE_LOCK`, or a row insert + delete),
//!    interleaved on one client so both see the same noise.
//! 2. Hand-over rate: PROCS (default 4) separate OS processes (this binary re-run as workers),
//!    each one client looping on one name for SECS (default 10) seconds: first the bare
//!    primitive, then `lock()` + release; with the server's request count per hand-over
//!    (`pg_stat_database` transactions, MariaDB `Questions`).
//!
//! `SQL_BENCH_FENCING=off` in the environment: the acquisitions ask for no fencing token
//! ([`LockOptions::no_fencing`]), which PostgreSQL's row lock answers without writing its
//! counter; otherwise they take the default options (a token).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use lock_sql::SqlBackend;
use lockcore::backend::Backend;
use lockcore::{Instant, LockName, LockOptions, Locker};

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn show(what: &str, mut v: Vec<Duration>) -> Duration {
    v.sort();
    let (p50, p99) = (pct(&v, 0.5), pct(&v, 0.99));
    println!(
        "{what:<38} n={:<5} p50={p50:>10.1?} p99={p99:>10.1?}",
        v.len()
    );
    p50
}

fn opts() -> LockOptions {
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    // The workers inherit the environment, so all of the run asks alike.
    if std::env::var("SQL_BENCH_FENCING").is_ok_and(|v| v == "off") {
        opts.no_fencing()
    } else {
        opts
    }
}

/// A worker process: waits for "go" on stdin, loops until the end, prints its count.
async fn worker(url: &str, name: &str, secs: f64, bare: bool) -> lockcore::Result<()> {
    let backend = SqlBackend::connect(url).await?;
    let lock_name = LockName::new(name)?;
    let locker = Locker::new(backend);
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
        if bare {
            locker.backend().bare_cycle(&lock_name).await?;
        } else {
            let g = locker.lock(name, &opts()).await?;
            g.release().await?;
        }
        n += 1;
    }
    println!("{n}");
    Ok(())
}

/// PROCS worker processes on one name; returns (total, per-process counts, server requests).
async fn handover(
    url: &str,
    name: &str,
    procs: usize,
    secs: f64,
    bare: bool,
    backend: &SqlBackend,
) -> (u64, Vec<u64>, Option<u64>) {
    let exe = std::env::current_exe().expect("own path");
    let mut children = Vec::new();
    for _ in 0..procs {
        let mode = if bare { "bare" } else { "lock" };
        let mut child = Command::new(&exe)
            .args(["--worker", url, name, &secs.to_string(), mode])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn worker");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut ready = String::new();
        out.read_line(&mut ready).expect("worker output");
        assert_eq!(ready.trim(), "ready", "worker failed to start");
        children.push((child, out));
    }
    // PostgreSQL sessions publish their statistics at most once a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = backend.server_requests().await.ok();
    for (child, _) in &mut children {
        child
            .stdin
            .as_mut()
            .unwrap()
            .write_all(b"go\n")
            .expect("go");
    }
    let counts = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|(mut child, mut out)| {
                let mut line = String::new();
                out.read_line(&mut line).expect("count");
                let _ = child.wait();
                line.trim().parse::<u64>().expect("a count")
            })
            .collect::<Vec<_>>()
    })
    .await
    .expect("workers");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = backend.server_requests().await.ok();
    let total = counts.iter().sum();
    (total, counts, before.zip(after).map(|(b, a)| a - b))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> lockcore::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--worker") {
        let secs = args[4].parse().expect("secs");
        return worker(&args[2], &args[3], secs, args[5] == "bare").await;
    }
    let url = args.get(1).cloned().expect("pass a database URL");
    let procs: usize = args.get(2).map_or(4, |s| s.parse().expect("PROCS"));
    let secs: f64 = args.get(3).map_or(10.0, |s| s.parse().expect("SECS"));
    const N: usize = 1000;
    let backend = SqlBackend::connect(&url).await?;
    println!(
        "{} (fencing {:?})",
        backend.describe(),
        opts().fencing_value()
    );
    let locker = Locker::new(SqlBackend::connect(&url).await?);
    let name = format!("bench-{}", std::process::id());
    let bare_name = LockName::new(format!("bench-bare-{}", std::process::id()))?;
    for _ in 0..50 {
        let g = locker.try_lock(&name, &opts()).await?.expect("uncontended");
        g.release().await?;
        locker.backend().bare_cycle(&bare_name).await?;
    }
    let (mut bare, mut cycle) = (Vec::with_capacity(N), Vec::with_capacity(N));
    for _ in 0..N {
        let t = Instant::now();
        locker.backend().bare_cycle(&bare_name).await?;
        bare.push(t.elapsed());
        let t = Instant::now();
        let g = locker.try_lock(&name, &opts()).await?.expect("uncontended");
        g.release().await?;
        cycle.push(t.elapsed());
    }
    let b = show("bare primitive (acquire+release)", bare);
    let c = show("uncontended try_lock+release", cycle);
    println!(
        "try_lock+release / bare primitive p50 = {:.2}x",
        c.as_secs_f64() / b.as_secs_f64()
    );
    for bare in [true, false] {
        let what = if bare {
            "bare primitive"
        } else {
            "lock()+release"
        };
        let (total, counts, requests) = handover(&url, &name, procs, secs, bare, &backend).await;
        println!(
            "{procs}-process hand-over, {what}: {total} in {secs} s = {:.0}/s (per process {counts:?}, min/max {:.2})",
            total as f64 / secs,
            *counts.iter().min().unwrap() as f64 / (*counts.iter().max().unwrap()).max(1) as f64
        );
        if let Some(r) = requests {
            println!(
                "  server requests per hand-over: {:.2} (includes the bench's own reads and other clients of the server)",
                r as f64 / total.max(1) as f64
            );
        }
    }
    Ok(())
}
