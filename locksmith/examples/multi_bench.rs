//! Uncontended `try_lock_all` of 4 names on any backend that declares
//! [`Capabilities::atomic_multi`](lockcore::Capabilities::atomic_multi): one request (the
//! backend's atomic path: an etcd transaction, a SQL lease transaction) against the sequence of
//! single acquisitions (the same backend with `atomic_multi` hidden), interleaved by the same
//! client so both see the same server. Prints the median and p90 of `try_lock_all` alone and of
//! `try_lock_all` + `release`, and the machine's load average before and after (the figures are
//! only comparable under a like load).
//!
//! ```text
//! cargo run --release -p locksmith --features etcd --example multi_bench -- etcd://127.0.0.1:12379 [--rounds 500]
//! cargo run --release -p locksmith --features postgres --example multi_bench -- 'postgres://...?strategy=lease'
//! ```

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{AcquireRequest, Acquired, Backend, async_trait};
use lockcore::{Capabilities, Instant, LockInfo, LockName, LockOptions, Locker, Result, Support};

/// A backend with its atomic sets hidden: `Locker` then takes a set one member at a time.
#[derive(Debug)]
struct Sequence {
    inner: Arc<dyn Backend>,
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

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut url = None;
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
    let url = url.expect("a backend URL");
    let atomic = locksmith::connect(&url).await.expect("connect");
    assert!(
        atomic.capabilities().atomic_multi.is_yes(),
        "{} takes no set in one request: nothing to compare",
        atomic.describe()
    );
    let mut caps = atomic.capabilities().clone();
    caps.atomic_multi = Support::no("hidden by the benchmark");
    let sequence = Locker::from_arc(Arc::new(Sequence {
        inner: atomic.backend().clone(),
        caps,
    }));
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let run = std::process::id();
    let names: Vec<String> = (0..4).map(|i| format!("multi-bench-{run}-{i}")).collect();
    let mut took = [Vec::new(), Vec::new()];
    let mut cycle = [Vec::new(), Vec::new()];
    // Warm-up: connections open, lease pools fill (nothing set up on the measured path).
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
    let load_before = load();
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
    println!("{}", atomic.describe());
    println!(
        "load average (1, 5, 15 min): before {load_before}; after {}",
        load()
    );
    for (i, what) in ["atomic (try_acquire_all)", "sequence (4 try_acquire)"]
        .iter()
        .enumerate()
    {
        println!(
            "{what}: try_lock_all of 4 median {:?} p90 {:?}; with release median {:?} ({} rounds)",
            quantile(&mut took[i], 0.5),
            quantile(&mut took[i], 0.9),
            quantile(&mut cycle[i], 0.5),
            rounds
        );
    }
}
