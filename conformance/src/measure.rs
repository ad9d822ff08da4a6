//! The benchmark behind the report's figures: uncontended latency and contended hand-over rate.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lockcore::{Instant, LockName, LockOptions};
use serde::Serialize;

use crate::harness::Harness;

/// Measured figures for one backend.
#[derive(Clone, Debug, Serialize)]
pub struct Figures {
    /// Uncontended try_lock + release, median, microseconds.
    pub uncontended_p50_us: f64,
    /// Uncontended try_lock + release, 99th percentile, microseconds.
    pub uncontended_p99_us: f64,
    /// The backend's cheapest round trip (`PING`, `SELECT 1`, `exists`), median, microseconds,
    /// measured interleaved with the uncontended pairs; `None` where there is no server.
    pub round_trip_p50_us: Option<f64>,
    /// How many uncontended samples.
    pub samples: usize,
    /// Acquisitions per second with `holders` clients looping lock/release on one name.
    pub handover_per_sec: f64,
    /// How many contending clients.
    pub holders: usize,
    /// How long the contended run lasted, in seconds.
    pub contended_secs: f64,
}

/// How long the uncontended loop runs at most, and the contended run lasts.
pub const MEASURE_TIME: Duration = Duration::from_secs(2);

/// Measures `harness`: up to 2000 uncontended acquire+release pairs (at most two seconds), then
/// four clients handing one lock around for two seconds.
///
/// Cancel safety: dropping the future stops the measurement; its clients' locks are released
/// in the background (or expire after their TTL).
pub async fn measure(harness: &dyn Harness) -> lockcore::Result<Figures> {
    let name = LockName::new(format!("lsbench-{:08x}", fastrand::u32(..)))?;
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10).max(harness.min_scenario_ttl()))
        .wait_timeout(Duration::from_secs(30));
    let client = harness.client().await?;
    for _ in 0..20 {
        if let Some(g) = client.try_lock(&name, &opts).await? {
            g.release().await?;
        }
    }
    let backend = client.backend().clone();
    let has_round_trip = backend.round_trip().await.is_ok();
    let mut samples = Vec::with_capacity(2000);
    let mut round_trips = Vec::with_capacity(2000);
    let until = Instant::now() + MEASURE_TIME;
    while samples.len() < 2000 && Instant::now() < until {
        // Interleaved, so that machine noise hits both alike.
        if has_round_trip {
            let start = Instant::now();
            backend.round_trip().await?;
            round_trips.push(start.elapsed());
        }
        let start = Instant::now();
        let g = client.try_lock(&name, &opts).await?.ok_or_else(|| {
            lockcore::Error::new(lockcore::ErrorKind::Backend, "benchmark lock was held")
        })?;
        g.release().await?;
        samples.push(start.elapsed());
    }
    let (p50, p99) = (
        percentile(&mut samples, 0.5),
        percentile(&mut samples, 0.99),
    );
    let round_trip_p50 =
        has_round_trip.then(|| percentile(&mut round_trips, 0.5).as_secs_f64() * 1e6);

    const HOLDERS: usize = 4;
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..HOLDERS {
        let c = harness.client().await?;
        let (name, opts, count, stop) = (name.clone(), opts.clone(), count.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let g = c.lock(&name, &opts).await?;
                count.fetch_add(1, Ordering::Relaxed);
                g.release().await?;
            }
            Ok::<_, lockcore::Error>(())
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(MEASURE_TIME).await;
    stop.store(true, Ordering::Relaxed);
    let handovers = count.load(Ordering::Relaxed);
    let secs = start.elapsed().as_secs_f64();
    for t in tasks {
        t.await
            .map_err(|e| lockcore::Error::new(lockcore::ErrorKind::Backend, e.to_string()))??;
    }
    Ok(Figures {
        uncontended_p50_us: p50.as_secs_f64() * 1e6,
        uncontended_p99_us: p99.as_secs_f64() * 1e6,
        round_trip_p50_us: round_trip_p50,
        samples: samples.len(),
        handover_per_sec: handovers as f64 / secs,
        holders: HOLDERS,
        contended_secs: secs,
    })
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}
