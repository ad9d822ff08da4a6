//! Uncontended `try_lock_all` of 4 names on etcd: one transaction (the backend's declared
//! atomic path) against the sequence of single acquisitions (the same backend with
//! `atomic_multi` hidden), interleaved by the same client so both see the same server. Prints
//! the median and p90 of `try_lock_all` alone and of `try_lock_all` + `release`.
//!
//! ```text
//! cargo run --release -p lock-etcd --example multi_bench -- [etcd://127.0.0.1:12379] [--rounds 500]
//! ```
//! (the URL defaults to `LOCK_TEST_ETCD_URL`).

use std::sync::Arc;
use std::time::Duration;

use lock_etcd::EtcdBackend;
use lockcore::backend::{AcquireRequest, Acquired, Backend, async_trait};
use lockcore::{Capabilities, Instant, LockInfo, LockName, LockOptions, Locker, Result, Support};

/// The backend with its atomic sets hidden: `Locker` then takes a set one member at a time.
#[derive(Debug)]
struct Sequence {
    inner: EtcdBackend,
    caps: Capabilities,
}

#[async_trait]
impl Backend for Sequence {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        self.inner.try_acquire(req).await
    }
    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        self.inner.acquire(req, deadline).await
    }
    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        self.inner.inspect(name).await
    }
    fn describe(&self) -> String {
        format!("{} (sequence)", self.inner.describe())
    }
}

fn quantile(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * q).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut url = std::env::var("LOCK_TEST_ETCD_URL").ok();
    let mut rounds = 500usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--rounds N")
            }
            u => url = Some(u.to_owned()),
        }
    }
    let url = url.expect("an etcd URL (or LOCK_TEST_ETCD_URL)");
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    let mut caps = backend.capabilities().clone();
    caps.atomic_multi = Support::no("hidden by the benchmark");
    let atomic = Locker::new(backend.clone());
    let sequence = Locker::from_arc(Arc::new(Sequence {
        inner: backend,
        caps,
    }));
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let run = std::process::id();
    let names: Vec<String> = (0..4).map(|i| format!("multi-bench-{run}-{i}")).collect();
    let mut took = [Vec::new(), Vec::new()];
    let mut cycle = [Vec::new(), Vec::new()];
    // Warm-up: the lease pool fills (no grant on the measured path).
    for locker in [&atomic, &sequence] {
        for _ in 0..20 {
            let set = locker
                .try_lock_all(names.clone(), &opts)
                .await
                .unwrap()
                .unwrap();
            set.release().await.unwrap();
        }
    }
    for round in 0..rounds {
        // Alternate which goes first.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let locker = [&atomic, &sequence][i];
            let start = Instant::now();
            let set = locker
                .try_lock_all(names.clone(), &opts)
                .await
                .unwrap()
                .expect("uncontended");
            took[i].push(start.elapsed());
            set.release().await.unwrap();
            cycle[i].push(start.elapsed());
        }
    }
    for (i, what) in ["atomic (one txn)", "sequence (4 txns)"].iter().enumerate() {
        println!(
            "{what}: try_lock_all of 4 median {:?} p90 {:?}; with release median {:?} ({} rounds)",
            quantile(&mut took[i], 0.5),
            quantile(&mut took[i], 0.9),
            quantile(&mut cycle[i], 0.5),
            rounds
        );
    }
}
