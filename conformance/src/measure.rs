//! The benchmark behind the report's figures: uncontended latency (with the backend's round
//! trip and bare primitive as floors) and contended hand-over rate of tasks. `locksmith bench`
//! adds what needs separate processes ([`ProcessHandover`], [`ServerRequests`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lockcore::{Fencing, Instant, LockName, LockOptions};
use serde::Serialize;

use crate::harness::Harness;

/// Measured figures for one backend.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Figures {
    /// Uncontended try_lock + release, median, microseconds.
    pub uncontended_p50_us: f64,
    /// Uncontended try_lock + release, 99th percentile, microseconds.
    pub uncontended_p99_us: f64,
    /// The backend's cheapest round trip (`PING`, `SELECT 1`, `exists`), median, microseconds,
    /// measured interleaved with the uncontended pairs; `None` where there is no server.
    pub round_trip_p50_us: Option<f64>,
    /// The same round trip by a client on a current-thread runtime of its own (measured by
    /// `locksmith bench`, whose clients otherwise run on a multi-thread runtime, as most
    /// services do): what the multi-thread runtime's wake-ups across threads add shows as the
    /// difference; `None` where not measured.
    pub round_trip_one_thread_p50_us: Option<f64>,
    /// The backend's bare lock primitive ([`Backend::bare_cycle`](lockcore::backend::Backend::bare_cycle):
    /// acquire + release without the library), median, microseconds, measured interleaved
    /// with the uncontended pairs by the same client; `None` where the backend has none.
    pub bare_cycle_p50_us: Option<f64>,
    /// Uncontended shared (read-write lock reader) try_lock + release, median, microseconds,
    /// measured interleaved with the exclusive pairs; `None` where the backend gives none.
    pub shared_p50_us: Option<f64>,
    /// Uncontended semaphore permit (one of 3) try_lock + release, median, microseconds,
    /// interleaved likewise; `None` where the backend gives none.
    pub permit_p50_us: Option<f64>,
    /// How many uncontended samples.
    pub samples: usize,
    /// Acquisitions per second with `holders` clients looping lock/release on one name.
    pub handover_per_sec: f64,
    /// How many contending clients.
    pub holders: usize,
    /// How long the contended run lasted, in seconds.
    pub contended_secs: f64,
    /// Hand-over across separate OS processes (measured by `locksmith bench`, which spawns
    /// them); `None` when not measured.
    pub processes: Option<ProcessHandover>,
    /// The same processes looping the backend's bare primitive instead
    /// ([`Backend::bare_cycle`](lockcore::backend::Backend::bare_cycle), where it waits:
    /// [`bare_cycle_waits`](lockcore::backend::Backend::bare_cycle_waits)), measured by
    /// `locksmith bench` right after [`processes`](Self::processes): the hand-over floor of the
    /// mechanism; `None` where the bare primitive does not wait or was not measured.
    pub bare_processes: Option<ProcessHandover>,
    /// Fairness over a longer run with more processes (by default 8 processes for 10 s,
    /// measured by `locksmith bench`): the fewest acquisitions of one process as a share of a
    /// fair share ([`ProcessHandover::min_fair_share`]) shows a process starved by split votes
    /// or by another process re-grabbing the lock; `None` when not measured.
    pub fairness: Option<ProcessHandover>,
    /// Server requests per hand-over with many waiters (measured by `locksmith bench`);
    /// `None` when not measured.
    pub server_requests: Option<ServerRequests>,
    /// Hand-over latency across processes (measured by `locksmith bench` in the
    /// [`processes`](Self::processes) run): from a holder's release being sent to the next
    /// holder's `lock()` returning in another process; `None` when not measured.
    pub handover_latency: Option<HandoverLatency>,
}

impl Figures {
    /// A shared acquisition's uncontended p50 as a multiple of an exclusive one's.
    pub fn shared_ratio(&self) -> Option<f64> {
        self.shared_p50_us
            .filter(|_| self.uncontended_p50_us > 0.0)
            .map(|s| s / self.uncontended_p50_us)
    }

    /// A permit's uncontended p50 as a multiple of an exclusive acquisition's.
    pub fn permit_ratio(&self) -> Option<f64> {
        self.permit_p50_us
            .filter(|_| self.uncontended_p50_us > 0.0)
            .map(|p| p / self.uncontended_p50_us)
    }

    /// The processes' hand-over rate as a multiple of the bare primitive's, where both were
    /// measured.
    pub fn bare_handover_ratio(&self) -> Option<f64> {
        let (lib, bare) = (self.processes.as_ref()?, self.bare_processes.as_ref()?);
        (bare.handover_per_sec > 0.0).then(|| lib.handover_per_sec / bare.handover_per_sec)
    }

    /// The hand-over latency's median as a multiple of the round trip's, where both were
    /// measured.
    pub fn handover_latency_ratio(&self) -> Option<f64> {
        let latency = self.handover_latency.as_ref()?;
        self.round_trip_p50_us
            .filter(|rtt| *rtt > 0.0)
            .map(|rtt| latency.p50_us / rtt)
    }

    /// The uncontended p50 as a multiple of the bare primitive's, where it has one.
    pub fn bare_ratio(&self) -> Option<f64> {
        self.bare_cycle_p50_us
            .filter(|b| *b > 0.0)
            .map(|b| self.uncontended_p50_us / b)
    }
}

/// The time from a holder's release being sent to the next holder's `lock()` returning in
/// another process, over the hand-overs of one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HandoverLatency {
    /// How many hand-overs between two processes were timed.
    pub handovers: usize,
    /// Median, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
}

/// Hand-over rate of separate OS processes, each with one client, looping `lock` + `release`
/// on one name for a fixed time.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProcessHandover {
    /// How many processes contended.
    pub processes: usize,
    /// How long they contended, in seconds.
    pub secs: f64,
    /// Acquisitions per process.
    pub per_process: Vec<u64>,
    /// All acquisitions per second.
    pub handover_per_sec: f64,
}

impl ProcessHandover {
    /// The most acquisitions of one process divided by the fewest (1.0 is perfectly even;
    /// infinite when a process never got the lock).
    pub fn spread(&self) -> f64 {
        let max = self.per_process.iter().copied().max().unwrap_or(0);
        let min = self.per_process.iter().copied().min().unwrap_or(0);
        if min == 0 {
            if max == 0 { 1.0 } else { f64::INFINITY }
        } else {
            max as f64 / min as f64
        }
    }

    /// The fewest acquisitions of one process divided by a fair share (all acquisitions / the
    /// number of processes): 1.0 is perfectly even, 0.0 when a process never got the lock (or
    /// nobody did).
    pub fn min_fair_share(&self) -> f64 {
        let total: u64 = self.per_process.iter().sum();
        let min = self.per_process.iter().copied().min().unwrap_or(0);
        if total == 0 || self.per_process.is_empty() {
            0.0
        } else {
            min as f64 / (total as f64 / self.per_process.len() as f64)
        }
    }
}

/// How many requests the server handled per hand-over while many waiters (spread over
/// several processes) contended for one name, from the server's own counter
/// ([`Backend::server_requests`](lockcore::backend::Backend::server_requests)).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerRequests {
    /// How many waiting clients in all.
    pub waiters: usize,
    /// Over how many processes.
    pub processes: usize,
    /// Hand-overs during the run.
    pub handovers: u64,
    /// Growth of the server's request counter during the run; `None` when unsupported.
    pub requests: Option<u64>,
    /// Requests per hand-over; `None` when unsupported.
    pub per_handover: Option<f64>,
    /// Why there is no count (the backend's `Unsupported` message), if there is none.
    pub unsupported: Option<String>,
    /// The requests the waiting clients sent during the run, counted by proxies in front of
    /// them (over every connection each opens); `None` where no proxy can stand before the
    /// server (an embedded database, a cluster that redirects to its nodes).
    pub client_requests: Option<u64>,
    /// Client requests per hand-over (the goal's measure: what the clients send, whatever a
    /// server script does inside); `None` as for `client_requests`.
    pub client_per_handover: Option<f64>,
}

/// How long the uncontended loop runs at most, and the contended run lasts.
pub const MEASURE_TIME: Duration = Duration::from_secs(2);

/// Measures `harness`: up to 2000 uncontended acquire+release pairs (at most two seconds), then
/// four clients handing one lock around for two seconds.
///
/// Cancel safety: dropping the future stops the measurement; its clients' locks are released
/// in the background (or expire after their TTL).
pub async fn measure(harness: &dyn Harness) -> lockcore::Result<Figures> {
    measure_with(harness, Fencing::IfAvailable).await
}

/// [`measure`] with the acquisitions asking for a fencing token as `fencing` says
/// ([`Fencing::NotWanted`]: what a holder that fences nothing pays where tokens cost extra).
///
/// Cancel safety: as [`measure`].
pub async fn measure_with(harness: &dyn Harness, fencing: Fencing) -> lockcore::Result<Figures> {
    let name = LockName::new(format!("lsbench-{:08x}", fastrand::u32(..)))?;
    // The default options, auto-renewal on (each guard is handed to the client's watchdog and
    // taken back), as a user who sets nothing pays them (issue 38: measured without renewal,
    // the figures left the watchdog's cost out).
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10).max(harness.min_scenario_ttl()))
        .wait_timeout(Duration::from_secs(30))
        .fencing(fencing);
    let client = harness.client().await?;
    for _ in 0..20 {
        if let Some(g) = client.try_lock(&name, &opts).await? {
            g.release().await?;
        }
    }
    let backend = client.backend().clone();
    let has_round_trip = backend.round_trip().await.is_ok();
    let bare_name = LockName::new(format!("{name}-bare"))?;
    let has_bare = backend.bare_cycle(&bare_name).await.is_ok();
    let caps = client.capabilities().clone();
    let shared_name = LockName::new(format!("{name}-shared"))?;
    let permit_name = LockName::new(format!("{name}-permit"))?;
    let shared_opts = caps.shared.is_yes().then(|| opts.clone().shared());
    let permit_opts = caps.permits.is_yes().then(|| opts.clone().permits(3));
    let mut samples = Vec::with_capacity(2000);
    let mut round_trips = Vec::with_capacity(2000);
    let mut bare_cycles = Vec::with_capacity(2000);
    let mut shared_cycles = Vec::with_capacity(2000);
    let mut permit_cycles = Vec::with_capacity(2000);
    let until = Instant::now() + MEASURE_TIME;
    while samples.len() < 2000 && Instant::now() < until {
        // Interleaved, so that machine noise hits both alike.
        if has_round_trip {
            let start = Instant::now();
            backend.round_trip().await?;
            round_trips.push(start.elapsed());
        }
        if has_bare {
            let start = Instant::now();
            backend.bare_cycle(&bare_name).await?;
            bare_cycles.push(start.elapsed());
        }
        let start = Instant::now();
        let g = client.try_lock(&name, &opts).await?.ok_or_else(|| {
            lockcore::Error::new(lockcore::ErrorKind::Backend, "benchmark lock was held")
        })?;
        g.release().await?;
        samples.push(start.elapsed());
        for (mode_opts, mode_name, cycles) in [
            (&shared_opts, &shared_name, &mut shared_cycles),
            (&permit_opts, &permit_name, &mut permit_cycles),
        ] {
            if let Some(mode_opts) = mode_opts {
                let start = Instant::now();
                let g = client
                    .try_lock(mode_name, mode_opts)
                    .await?
                    .ok_or_else(|| {
                        lockcore::Error::new(
                            lockcore::ErrorKind::Backend,
                            "benchmark lock was held",
                        )
                    })?;
                g.release().await?;
                cycles.push(start.elapsed());
            }
        }
    }
    let (p50, p99) = (
        percentile(&mut samples, 0.5),
        percentile(&mut samples, 0.99),
    );
    let round_trip_p50 =
        has_round_trip.then(|| percentile(&mut round_trips, 0.5).as_secs_f64() * 1e6);
    let bare_cycle_p50 = has_bare.then(|| percentile(&mut bare_cycles, 0.5).as_secs_f64() * 1e6);
    let shared_p50 = (!shared_cycles.is_empty())
        .then(|| percentile(&mut shared_cycles, 0.5).as_secs_f64() * 1e6);
    let permit_p50 = (!permit_cycles.is_empty())
        .then(|| percentile(&mut permit_cycles, 0.5).as_secs_f64() * 1e6);

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
        round_trip_one_thread_p50_us: None,
        bare_cycle_p50_us: bare_cycle_p50,
        shared_p50_us: shared_p50,
        permit_p50_us: permit_p50,
        samples: samples.len(),
        handover_per_sec: handovers as f64 / secs,
        holders: HOLDERS,
        contended_secs: secs,
        processes: None,
        bare_processes: None,
        fairness: None,
        server_requests: None,
        handover_latency: None,
    })
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}
