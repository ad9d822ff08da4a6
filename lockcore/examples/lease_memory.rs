//! Memory per held lease on the in-memory backend: the contract's own cost (guard, shared
//! state, and with auto-renewal the lease's record in its client's watchdog), without any
//! client library.
//!
//! `cargo run --release -p lockcore --example lease_memory -- [N] [norenew]` holds N leases
//! (default 100,000; TTL 30 s, auto-renewed unless `norenew`) and prints the growth of this
//! process's RSS (`/proc/self/status`) divided by N.

use std::time::Duration;

use lockcore::memory::MemoryBackend;
use lockcore::{AutoRenew, LockOptions, Locker};

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> lockcore::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(100_000, |s| s.parse().expect("N"));
    let renew = args.next().as_deref() != Some("norenew");
    let locker = Locker::new(MemoryBackend::connect("lease-memory"));
    let mut opts = LockOptions::new().ttl(Duration::from_secs(30));
    opts = if renew {
        opts.auto_renew(AutoRenew::until(Duration::from_secs(600)))
    } else {
        opts.no_auto_renew()
    };
    let names: Vec<String> = (0..n).map(|i| format!("lease-{i}")).collect();
    let before = rss_kib();
    let mut guards = Vec::with_capacity(n);
    for name in &names {
        match locker.try_lock(name.as_str(), &opts).await? {
            Some(g) => guards.push(g),
            None => panic!("{name} is held"),
        }
    }
    let after = rss_kib();
    println!(
        "{n} leases ({}): RSS {before} KiB -> {after} KiB: {:.0} bytes per lease",
        if renew { "auto-renewed" } else { "not renewed" },
        after.saturating_sub(before) as f64 * 1024.0 / n as f64
    );
    Ok(())
}
