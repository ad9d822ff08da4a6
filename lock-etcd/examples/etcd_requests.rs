//! Server requests per lock operation, by gRPC method, from etcd's own counters
//! (`grpc_server_msg_received_total` on the member's `/metrics`: one per unary request and one
//! per message on a stream, keep-alives and watch requests included), read before and after:
//!
//! 1. `cycles` uncontended `try_lock` + `release` by one client (the bench's options: 10 s TTL,
//!    no renewal);
//! 2. hand-overs between two clients (each loops `lock` + `release` on one name).
//!
//! The counters are server-wide: run it on a quiet server, or read the idle line it prints
//! first (the counters' growth over one idle second) as the noise.
//!
//! ```text
//! cargo run --release -p lock-etcd --example etcd_requests -- [etcd://127.0.0.1:12379] [cycles]
//! ```
//! (the URL defaults to `LOCK_TEST_ETCD_URL`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_etcd::EtcdBackend;
use lockcore::{Instant, LockName, LockOptions, Locker};

type Counts = BTreeMap<String, f64>;

/// The per-method message counts of the member at `host:port`.
fn counters(host: &str) -> Counts {
    let mut s = std::net::TcpStream::connect(host).expect("connecting for /metrics");
    write!(
        s,
        "GET /metrics HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .expect("asking for /metrics");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("reading /metrics");
    let mut out = Counts::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("grpc_server_msg_received_total{") else {
            continue;
        };
        let method = rest
            .split("grpc_method=\"")
            .nth(1)
            .and_then(|m| m.split('"').next())
            .unwrap_or("?")
            .to_owned();
        let v: f64 = rest
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *out.entry(method).or_default() += v;
    }
    out
}

fn report(what: &str, before: &Counts, after: &Counts, per: u64) {
    let mut total = 0.0;
    let mut parts = Vec::new();
    for (m, a) in after {
        let d = a - before.get(m).copied().unwrap_or(0.0);
        if d > 0.0 {
            total += d;
            parts.push(format!("{m} {:.3}", d / per as f64));
        }
    }
    println!(
        "{what}: {:.3} requests each over {per} ({})",
        total / per as f64,
        parts.join(", ")
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .or_else(|| std::env::var("LOCK_TEST_ETCD_URL").ok())
        .expect("an etcd:// URL");
    let cycles: u64 = args.next().map_or(2000, |n| n.parse().expect("a count"));
    let host = url
        .trim_start_matches("etcd://")
        .split(['/', ','])
        .next()
        .unwrap()
        .to_owned();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_timeout(Duration::from_secs(30))
        .no_auto_renew();

    let before = counters(&host);
    tokio::time::sleep(Duration::from_secs(1)).await;
    report("idle (noise), per second", &before, &counters(&host), 1);

    let backend = EtcdBackend::connect(&url).await.expect("connect");
    let locker = Locker::new(backend.clone());
    let name = LockName::new(format!("lsbench-requests-{:08x}", fastrand::u32(..))).unwrap();
    for _ in 0..20 {
        let g = locker.try_lock(&name, &opts).await.unwrap().expect("free");
        g.release().await.unwrap();
    }
    let before = counters(&host);
    let t = Instant::now();
    for _ in 0..cycles {
        let g = locker.try_lock(&name, &opts).await.unwrap().expect("free");
        g.release().await.unwrap();
    }
    let took = t.elapsed();
    locker.flush().await;
    report(
        "uncontended try_lock + release",
        &before,
        &counters(&host),
        cycles,
    );
    println!(
        "  ({:.0} us per cycle on average)",
        took.as_secs_f64() * 1e6 / cycles as f64
    );

    let a = Locker::new(EtcdBackend::connect(&url).await.expect("connect"));
    let b = Locker::new(EtcdBackend::connect(&url).await.expect("connect"));
    let name = LockName::new(format!(
        "lsbench-requests-handover-{:08x}",
        fastrand::u32(..)
    ))
    .unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let before = counters(&host);
    let t = Instant::now();
    let tasks: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|l| {
            let (name, opts, count) = (name.clone(), opts.clone(), count.clone());
            tokio::spawn(async move {
                while count.fetch_add(1, Ordering::SeqCst) < cycles {
                    let g = l.lock(&name, &opts).await.unwrap();
                    g.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let took = t.elapsed();
    a.flush().await;
    b.flush().await;
    report(
        "two clients, lock + release each (per acquisition)",
        &before,
        &counters(&host),
        cycles,
    );
    println!(
        "  ({:.0} acquisitions/s)",
        cycles as f64 / took.as_secs_f64()
    );
}
