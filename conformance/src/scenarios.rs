//! Every scenario, written once.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::backend::{AcquireRequest, BoxLease};
use lockcore::{
    AutoRenew, Capabilities, ErrorKind, Instant, LockGuard, LockName, LockOptions, Locker,
    LostReason, OwnerToken,
};

use crate::harness::{BoxFuture, Harness};

/// Why a scenario did not pass.
pub type Failure = String;

/// The outcome of a scenario body.
pub type Outcome = std::result::Result<(), Failure>;

/// One scenario: a name, what it proves, when it applies, and its body.
#[derive(Clone, Copy)]
pub struct Scenario {
    /// A stable identifier (also the test name).
    pub name: &'static str,
    /// One line: what it proves.
    pub summary: &'static str,
    /// `Err(reason)` when the backend (or harness) cannot support it: reported unsupported.
    pub applies: fn(&Capabilities, &dyn Harness) -> Result<(), &'static str>,
    /// The body.
    pub run: for<'a> fn(&'a Ctx) -> BoxFuture<'a, Outcome>,
}

/// What a scenario body gets: the harness, the capabilities and helpers for names and time.
pub struct Ctx {
    pub(crate) harness: Arc<dyn Harness>,
    pub(crate) caps: Capabilities,
    pub(crate) prefix: String,
    pub(crate) scale: f64,
}

impl Ctx {
    /// Makes a context; `scale` stretches every time bound (>= 1 on slow machines).
    pub fn new(harness: Arc<dyn Harness>, caps: Capabilities, scenario: &str, scale: f64) -> Self {
        Ctx {
            harness,
            caps,
            prefix: format!("lsc-{:08x}-{scenario}-", fastrand::u32(..)),
            scale: scale.max(0.1),
        }
    }

    /// A lock name unique to this run and scenario.
    pub fn name(&self, suffix: &str) -> LockName {
        LockName::new(format!("{}{suffix}", self.prefix)).expect("scenario names are valid")
    }

    /// A new independent client.
    ///
    /// Cancel safe.
    pub async fn client(&self) -> Result<Locker, Failure> {
        self.harness
            .client()
            .await
            .map_err(|e| format!("connecting a client failed: {e}"))
    }

    /// The scenario TTL: `base` scaled, and at least the harness's floor.
    pub fn ttl(&self, base: Duration) -> Duration {
        base.mul_f64(self.scale)
            .max(self.harness.min_scenario_ttl())
    }

    /// A generous time bound (scaled) for "happens promptly" assertions.
    pub fn bound(&self, base: Duration) -> Duration {
        base.mul_f64(self.scale)
    }

    fn opts(&self, ttl: Duration) -> LockOptions {
        LockOptions::new()
            .ttl(ttl)
            .wait_timeout(self.bound(Duration::from_secs(30)))
    }
}

macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        let holds: bool = $cond;
        if !holds {
            return Err(format!($($fmt)+));
        }
    };
}

fn always(_: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    Ok(())
}

fn needs_fencing(c: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if c.fencing {
        Ok(())
    } else {
        Err("the backend declares no fencing tokens")
    }
}

fn needs_fair(c: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if c.fair {
        Ok(())
    } else {
        Err("the backend does not declare FIFO fairness")
    }
}

fn needs_ttl_expiry(c: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if c.expiry_after_ttl {
        Ok(())
    } else {
        Err(
            "leases are bound to a connection or session: a crashed holder's lock ends with it, not exactly after the TTL",
        )
    }
}

fn needs_revoke(_: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    if h.can_revoke() {
        Ok(())
    } else {
        Err("the harness cannot delete a lock behind its holder")
    }
}

fn boxed<'a, F: Future<Output = Outcome> + Send + 'a>(f: F) -> BoxFuture<'a, Outcome> {
    Box::pin(f)
}

macro_rules! scenario {
    ($name:ident, $applies:expr, $summary:expr) => {
        Scenario {
            name: stringify!($name),
            summary: $summary,
            applies: $applies,
            run: |ctx| boxed($name(ctx)),
        }
    };
}

/// Every scenario, in report order.
pub fn all() -> Vec<Scenario> {
    vec![
        scenario!(
            acquire_release_reacquire,
            always,
            "a lock can be taken, released and taken again"
        ),
        scenario!(
            try_lock_contended_returns_none,
            always,
            "try_lock on a held lock returns Ok(None), not an error"
        ),
        scenario!(
            independent_names,
            always,
            "locks with different names do not interfere"
        ),
        scenario!(
            reentrancy_as_declared,
            always,
            "a holder taking its own lock again is refused unless reentrancy is declared"
        ),
        scenario!(
            wait_deadline_honoured,
            always,
            "lock() on a held lock returns Timeout at its deadline, within a bound"
        ),
        scenario!(
            waiter_does_not_spin,
            needs_thread_cpu_clock,
            "a waiting lock() sleeps until notified or its next poll; it does not spin"
        ),
        scenario!(
            wait_succeeds_on_release,
            always,
            "a waiting lock() gets the lock soon after the holder releases"
        ),
        scenario!(
            cancelled_wait_leaves_nothing,
            always,
            "dropping a pending lock() leaves no lock and no queue entry behind"
        ),
        scenario!(
            cancelled_acquire_leaves_nothing,
            always,
            "an acquire cancelled at any point leaves the lock free within the TTL"
        ),
        scenario!(
            mutual_exclusion_under_contention,
            always,
            "N clients x M tasks never overlap inside the critical section"
        ),
        scenario!(
            expiry_frees_crashed_holder_after_ttl,
            needs_ttl_expiry,
            "a crashed holder's lock frees after the TTL, and not before"
        ),
        scenario!(
            crash_frees_lock,
            always,
            "a crashed holder's lock becomes free within its TTL plus a bound"
        ),
        scenario!(
            extend_after_expiry_not_held,
            needs_lease_loss,
            "extending a lease that ran out returns NotHeld and changes nothing"
        ),
        scenario!(
            stale_release_keeps_new_holder,
            needs_lease_loss,
            "a stale holder's release does not free the new holder's lock"
        ),
        scenario!(
            release_racing_expiry_keeps_next_holder,
            needs_ttl_expiry,
            "a release sent as the lease runs out never frees the next holder's lock"
        ),
        scenario!(
            fencing_tokens_increase,
            needs_fencing,
            "fencing tokens strictly increase across holders, expiry takeover included"
        ),
        scenario!(
            auto_renew_keeps_lock,
            always,
            "auto-renewal keeps the lock past several TTLs"
        ),
        scenario!(
            auto_renew_stops_at_max_hold,
            always,
            "auto-renewal stops at the maximum hold time and the lock frees"
        ),
        scenario!(
            lost_signal_on_expiry,
            always,
            "the lost signal fires when the lease runs out, before anyone else can take it"
        ),
        scenario!(
            lost_signal_on_revoke,
            needs_revoke,
            "the lost signal fires when the lock is taken away behind the holder"
        ),
        scenario!(
            fifo_order,
            needs_fair,
            "waiters are served in arrival order where fairness is declared"
        ),
        scenario!(
            drop_releases_promptly,
            always,
            "dropping a guard releases the lock within a bound, long before its TTL"
        ),
        scenario!(
            hostile_names,
            always,
            "hostile names work as independent locks or get InvalidName, never collide"
        ),
        scenario!(
            invalid_input_rejected,
            always,
            "bad names and TTLs get typed errors before any I/O and change nothing"
        ),
        scenario!(
            unsupported_options_refused,
            always,
            "options the backend cannot honour are refused with Unsupported"
        ),
    ]
}

fn ok_or<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> Result<T, Failure> {
    r.map_err(|e| format!("{what}: {e}"))
}

async fn must_try(
    locker: &Locker,
    name: &LockName,
    opts: &LockOptions,
    who: &str,
) -> Result<LockGuard, Failure> {
    match locker.try_lock(name, opts).await {
        Ok(Some(g)) => Ok(g),
        Ok(None) => Err(format!(
            "{who}: try_lock found the lock held, expected it free"
        )),
        Err(e) => Err(format!("{who}: try_lock failed: {e}")),
    }
}

async fn must_be_held(locker: &Locker, name: &LockName, opts: &LockOptions, when: &str) -> Outcome {
    match locker.try_lock(name, opts).await {
        Ok(None) => Ok(()),
        Ok(Some(_g)) => Err(format!(
            "{when}: another client took the lock while it should be held"
        )),
        Err(e) => Err(format!("{when}: try_lock failed: {e}")),
    }
}

async fn acquire_release_reacquire(ctx: &Ctx) -> Outcome {
    let a = ctx.client().await?;
    let name = ctx.name("x");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(10)));
    for round in 0..3 {
        let g = must_try(&a, &name, &opts, &format!("round {round}")).await?;
        check!(
            g.name() == &name,
            "guard names {:?}, expected {:?}",
            g.name(),
            name
        );
        check!(g.is_valid(), "a fresh guard is not valid");
        check!(
            g.fencing_token().is_some() == ctx.caps.fencing,
            "fencing token presence {:?} disagrees with the declared capability",
            g.fencing_token()
        );
        ok_or(g.release().await, "release")?;
    }
    let g = ok_or(a.lock(&name, &opts).await, "lock() on a free lock")?;
    ok_or(g.release().await, "release after lock()")
}

async fn try_lock_contended_returns_none(ctx: &Ctx) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("x");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(10)));
    let g = must_try(&a, &name, &opts, "holder").await?;
    must_be_held(&b, &name, &opts, "second client").await?;
    ok_or(g.release().await, "release")?;
    let g = must_try(&b, &name, &opts, "second client after release").await?;
    ok_or(g.release().await, "release")
}

async fn independent_names(ctx: &Ctx) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(10)));
    let (n1, n2) = (ctx.name("one"), ctx.name("two"));
    let g1 = must_try(&a, &n1, &opts, "a on one").await?;
    let g2 = must_try(&b, &n2, &opts, "b on two").await?;
    must_be_held(&b, &n1, &opts, "b on one").await?;
    must_be_held(&a, &n2, &opts, "a on two").await?;
    ok_or(g1.release().await, "release one")?;
    must_be_held(&a, &n2, &opts, "two after one's release").await?;
    ok_or(g2.release().await, "release two")
}

async fn reentrancy_as_declared(ctx: &Ctx) -> Outcome {
    let a = ctx.client().await?;
    let name = ctx.name("x");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(10)));
    let g = must_try(&a, &name, &opts, "first").await?;
    let again = ok_or(
        a.try_lock(&name, &opts).await,
        "second try_lock by the same client",
    )?;
    match (again, ctx.caps.reentrant) {
        (None, false) => {}
        (Some(g2), true) => ok_or(g2.release().await, "inner release")?,
        (Some(_), false) => {
            return Err(
                "the same client took a lock it already holds, but reentrancy is not declared"
                    .into(),
            );
        }
        (None, true) => {
            return Err(
                "reentrancy is declared but the holder could not take its lock again".into(),
            );
        }
    }
    ok_or(g.release().await, "release")
}

async fn wait_deadline_honoured(ctx: &Ctx) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("x");
    let hold = ctx.opts(ctx.ttl(Duration::from_secs(30)));
    let g = must_try(&a, &name, &hold, "holder").await?;
    let wait = ctx.bound(Duration::from_millis(400));
    let start = Instant::now();
    let r = b.lock(&name, &hold.clone().wait_timeout(wait)).await;
    let took = start.elapsed();
    match r {
        Err(e) if e.kind() == ErrorKind::Timeout => {}
        Err(e) => return Err(format!("expected a Timeout error, got {e}")),
        Ok(_) => return Err("the waiter got a lock that is held".into()),
    }
    check!(
        took >= wait.mul_f64(0.95),
        "Timeout after {took:?}, before the {wait:?} deadline"
    );
    let late = wait + ctx.bound(Duration::from_millis(750));
    check!(
        took <= late,
        "Timeout after {took:?}, deadline {wait:?} (allowed up to {late:?})"
    );
    ok_or(g.release().await, "release")
}

/// CPU time used by the calling thread so far, from `/proc/thread-self/stat` (10 ms ticks).
fn thread_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

fn needs_thread_cpu_clock(_: &Capabilities, _: &dyn Harness) -> Result<(), &'static str> {
    if thread_cpu_time().is_some() {
        Ok(())
    } else {
        Err("no per-thread CPU clock (/proc) on this machine")
    }
}

async fn waiter_does_not_spin(ctx: &Ctx) -> Outcome {
    let a = ctx.client().await?;
    let name = ctx.name("x");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(30)));
    let g = must_try(&a, &name, &opts, "holder").await?;
    let wait = ctx.bound(Duration::from_millis(1500));
    // The waiter, its client and the client's background tasks all run on one thread of their
    // own, whose CPU time is then the waiter's alone.
    let harness = ctx.harness.clone();
    let (name2, opts2) = (name.clone(), opts.clone().wait_timeout(wait));
    let measured = tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let c = harness.client().await.map_err(|e| format!("client: {e}"))?;
            let cpu0 = thread_cpu_time().ok_or("no thread CPU clock")?;
            let start = Instant::now();
            let r = c.lock(&name2, &opts2).await;
            let (cpu, wall) = (
                thread_cpu_time().ok_or("no thread CPU clock")? - cpu0,
                start.elapsed(),
            );
            match r {
                Err(e) if e.kind() == ErrorKind::Timeout => Ok((cpu, wall)),
                Err(e) => Err(format!("the waiter failed: {e}")),
                Ok(_) => Err("the waiter got a held lock".to_string()),
            }
        })
    })
    .await;
    let (cpu, wall) = ok_or(measured, "waiter thread")??;
    ok_or(g.release().await, "release")?;
    check!(
        cpu.as_secs_f64() <= wall.as_secs_f64() * 0.25,
        "the waiter burned {cpu:?} of CPU in {wall:?} of waiting: it spins"
    );
    Ok(())
}

async fn wait_succeeds_on_release(ctx: &Ctx) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("x");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(30)));
    let g = must_try(&a, &name, &opts, "holder").await?;
    let waiter = {
        let (b, name, opts) = (b.clone(), name.clone(), opts.clone().wait_forever());
        tokio::spawn(async move { b.lock(&name, &opts).await })
    };
    // Give the waiter time to start waiting; the assertion below does not depend on it.
    tokio::time::sleep(ctx.bound(Duration::from_millis(100))).await;
    check!(
        !waiter.is_finished(),
        "the waiter returned while the lock was held"
    );
    let released = Instant::now();
    ok_or(g.release().await, "release")?;
    let g2 = ok_or(ok_or(waiter.await, "waiter task")?, "waiter's lock()")?;
    let took = released.elapsed();
    let bound = ctx.bound(Duration::from_secs(3));
    check!(
        took <= bound,
        "the waiter got the lock {took:?} after the release (bound {bound:?})"
    );
    ok_or(g2.release().await, "waiter's release")
}

async fn cancelled_wait_leaves_nothing(ctx: &Ctx) -> Outcome {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_secs(30));
    let opts = ctx.opts(ttl);
    let g = must_try(&a, &name, &opts, "holder").await?;
    // Two waiters give up by being dropped (not by their own deadline).
    for _ in 0..2 {
        let pending = tokio::time::timeout(
            ctx.bound(Duration::from_millis(150)),
            b.lock(&name, &opts.clone().wait_forever()),
        )
        .await;
        check!(
            pending.is_err(),
            "a waiter finished while the lock was held: {:?}",
            pending.map(|r| r.map(|g| g.name().clone()))
        );
    }
    ok_or(g.release().await, "release")?;
    // A queue entry or lock left by the dropped waiters would make this wait for a TTL.
    let start = Instant::now();
    let g = ok_or(
        c.lock(
            &name,
            &opts.clone().wait_timeout(ctx.bound(Duration::from_secs(5))),
        )
        .await,
        "a new client after the cancelled waiters",
    )?;
    let took = start.elapsed();
    check!(
        took < ttl / 2,
        "the lock was free only {took:?} after the cancelled waits"
    );
    ok_or(g.release().await, "release")
}

async fn cancelled_acquire_leaves_nothing(ctx: &Ctx) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let ttl = ctx.ttl(Duration::from_millis(600));
    let opts = ctx.opts(ttl);
    // The typical acquire latency sets where the cancellation points fall.
    let probe = ctx.name("probe");
    let mut lat = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let g = must_try(&a, &probe, &opts, "probe").await?;
        lat.push(start.elapsed());
        ok_or(g.release().await, "probe release")?;
    }
    lat.sort();
    let typical = lat[2].max(Duration::from_micros(200));
    for (i, frac) in [0.0, 0.25, 0.5, 0.75, 1.0, 1.5].into_iter().enumerate() {
        let name = ctx.name(&format!("c{i}"));
        let cut = typical.mul_f64(frac);
        if let Ok(r) = tokio::time::timeout(cut, a.lock(&name, &opts)).await {
            ok_or(
                ok_or(r, "an uncancelled acquire")?.release().await,
                "release",
            )?;
        }
        let wait = ttl + ctx.bound(Duration::from_secs(2));
        let start = Instant::now();
        match b.lock(&name, &opts.clone().wait_timeout(wait)).await {
            Ok(g) => ok_or(g.release().await, "release")?,
            Err(e) => {
                return Err(format!(
                    "after an acquire cancelled at {cut:?}, the lock was still not free {:?} later (TTL {ttl:?}): {e}",
                    start.elapsed()
                ));
            }
        }
    }
    Ok(())
}

/// Records who is inside the critical section; any overlap is a violation.
#[derive(Default)]
struct OverlapDetector {
    inside: AtomicUsize,
    violations: AtomicUsize,
    fences: Mutex<Vec<Option<u64>>>,
}

impl OverlapDetector {
    fn enter(&self, fence: Option<u64>) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.fences.lock().unwrap().push(fence);
    }
    fn exit(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn mutual_exclusion_under_contention(ctx: &Ctx) -> Outcome {
    const CLIENTS: usize = 3;
    const TASKS: usize = 4;
    const ROUNDS: usize = 5;
    let name = ctx.name("x");
    let opts = ctx
        .opts(ctx.ttl(Duration::from_secs(20)))
        .wait_timeout(ctx.bound(Duration::from_secs(120)));
    let detector = Arc::new(OverlapDetector::default());
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = ctx.client().await?;
        for _ in 0..TASKS {
            let (client, name, opts, detector) =
                (client.clone(), name.clone(), opts.clone(), detector.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let g = client
                        .lock(&name, &opts)
                        .await
                        .map_err(|e| format!("lock(): {e}"))?;
                    detector.enter(g.fencing_token());
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    tokio::task::yield_now().await;
                    detector.exit();
                    g.release().await.map_err(|e| format!("release: {e}"))?;
                }
                Ok::<_, Failure>(())
            }));
        }
    }
    for t in tasks {
        ok_or(t.await, "task")??;
    }
    let violations = detector.violations.load(Ordering::SeqCst);
    check!(
        violations == 0,
        "{violations} times two holders were inside the critical section at once"
    );
    let fences = detector.fences.lock().unwrap().clone();
    check!(
        fences.len() == CLIENTS * TASKS * ROUNDS,
        "{} critical sections ran, expected {}",
        fences.len(),
        CLIENTS * TASKS * ROUNDS
    );
    if ctx.caps.fencing {
        let tokens: Vec<u64> = fences.iter().map(|f| f.unwrap_or(0)).collect();
        check!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "fencing tokens did not increase in critical-section order: {tokens:?}"
        );
    }
    Ok(())
}

async fn expiry_frees_crashed_holder_after_ttl(ctx: &Ctx) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(1000));
    let opts = ctx.opts(ttl);
    let g = must_try(&a, &name, &opts, "holder").await?;
    let acquired = g.acquired_at();
    ctx.harness.crash(g, a).await;
    must_be_held(&b, &name, &opts, "right after the crash").await?;
    tokio::time::sleep_until(acquired + ttl / 2).await;
    must_be_held(&b, &name, &opts, "half a TTL after acquiring").await?;
    let g2 = ok_or(
        b.lock(
            &name,
            &opts
                .clone()
                .wait_timeout(ttl * 2 + ctx.bound(Duration::from_secs(3))),
        )
        .await,
        "lock() after the crash",
    )?;
    let at = g2.acquired_at().saturating_duration_since(acquired);
    // The new holder's request was sent before it won; allow for a little timer slack.
    check!(
        at + Duration::from_millis(20) >= ttl.mul_f64(0.9),
        "the lock was taken over {at:?} after acquiring, before the TTL of {ttl:?}"
    );
    let late = ttl + ctx.bound(Duration::from_secs(3));
    check!(
        at <= late,
        "the lock was taken over only {at:?} after acquiring (TTL {ttl:?}, bound {late:?})"
    );
    ok_or(g2.release().await, "release")
}

async fn crash_frees_lock(ctx: &Ctx) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(1000));
    let opts = ctx.opts(ttl);
    let g = must_try(&a, &name, &opts, "holder").await?;
    let acquired = g.acquired_at();
    ctx.harness.crash(g, a).await;
    let g2 = ok_or(
        b.lock(
            &name,
            &opts
                .clone()
                .wait_timeout(ttl * 2 + ctx.bound(Duration::from_secs(5))),
        )
        .await,
        "lock() after the crash",
    )?;
    let at = g2.acquired_at().saturating_duration_since(acquired);
    let late = ttl + ctx.bound(Duration::from_secs(3));
    check!(
        at <= late,
        "the crashed holder's lock was free only {at:?} after acquiring (TTL {ttl:?})"
    );
    ok_or(g2.release().await, "release")
}

/// Takes a lease straight from the backend, bypassing the guard's watchdog and bookkeeping, so
/// that the backend's own owner checks are what is tested.
async fn raw_lease(
    locker: &Locker,
    name: &LockName,
    ttl: Duration,
) -> Result<(BoxLease, Instant), Failure> {
    let req = AcquireRequest::new(name.clone(), OwnerToken::random(), ttl);
    match locker.backend().try_acquire(&req).await {
        Ok(Some(a)) => Ok((a.lease, a.sent_at)),
        Ok(None) => Err("raw try_acquire found the lock held, expected it free".into()),
        Err(e) => Err(format!("raw try_acquire failed: {e}")),
    }
}

/// Makes a raw lease stop being its holder's: by waiting out its TTL where leases expire, else
/// by revoking it. The caller then lets another client take the lock.
async fn lose_lease(ctx: &Ctx, name: &LockName) -> Outcome {
    if ctx.caps.expiry_after_ttl {
        return Ok(());
    }
    ok_or(ctx.harness.revoke(name).await, "revoke")
}

fn needs_lease_loss(c: &Capabilities, h: &dyn Harness) -> Result<(), &'static str> {
    if c.expiry_after_ttl || h.can_revoke() {
        Ok(())
    } else {
        Err("leases neither expire by time nor can be revoked by the harness")
    }
}

async fn extend_after_expiry_not_held(ctx: &Ctx) -> Outcome {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let ttl = ctx.ttl(Duration::from_millis(400));
    let opts = ctx.opts(ttl);
    let takeover = opts
        .clone()
        .ttl(ttl * 20)
        .wait_timeout(ttl * 2 + ctx.bound(Duration::from_secs(5)));
    // The backend's own check: a lease that ran out cannot be extended.
    let name = ctx.name("raw");
    let (lease, _) = raw_lease(&a, &name, ttl).await?;
    lose_lease(ctx, &name).await?;
    let g2 = ok_or(b.lock(&name, &takeover).await, "takeover")?;
    match lease.extend(ttl * 10).await {
        Err(e) if e.kind() == ErrorKind::NotHeld => {}
        Err(e) => {
            return Err(format!(
                "backend extend after expiry: expected NotHeld, got {e}"
            ));
        }
        Ok(_) => {
            return Err("the backend extended a lease that had run out and been taken over".into());
        }
    }
    must_be_held(&c, &name, &opts, "after the stale extend").await?;
    ok_or(g2.extend(ttl * 20).await, "the new holder's extend")?;
    ok_or(g2.release().await, "release")?;
    // The guard's: once its validity passed, extend is refused.
    let name = ctx.name("guard");
    let g = must_try(&a, &name, &opts, "holder").await?;
    lose_lease(ctx, &name).await?;
    let g2 = ok_or(b.lock(&name, &takeover).await, "takeover")?;
    match g.extend(ttl * 10).await {
        Err(e) if e.kind() == ErrorKind::NotHeld => {}
        Err(e) => {
            return Err(format!(
                "guard extend after expiry: expected NotHeld, got {e}"
            ));
        }
        Ok(()) => {
            return Err("the guard extended a lease that had run out and been taken over".into());
        }
    }
    check!(!g.is_valid(), "the expired guard still says it is valid");
    must_be_held(&c, &name, &opts, "after the stale guard extend").await?;
    ok_or(g2.release().await, "release")?;
    drop(g);
    Ok(())
}

async fn stale_release_keeps_new_holder(ctx: &Ctx) -> Outcome {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(400));
    let opts = ctx.opts(ttl);
    let (stale, _) = raw_lease(&a, &name, ttl).await?;
    lose_lease(ctx, &name).await?;
    let g2 = ok_or(
        b.lock(
            &name,
            &opts
                .clone()
                .ttl(ttl * 20)
                .wait_timeout(ttl * 2 + ctx.bound(Duration::from_secs(5))),
        )
        .await,
        "takeover",
    )?;
    match stale.release().await {
        Err(e) if e.kind() == ErrorKind::NotHeld => {}
        Err(e) => return Err(format!("stale release: expected NotHeld, got {e}")),
        Ok(()) => return Err("a stale holder's release reported success".into()),
    }
    must_be_held(&c, &name, &opts, "after the stale release").await?;
    ok_or(g2.release().await, "the new holder's release")
}

async fn release_racing_expiry_keeps_next_holder(ctx: &Ctx) -> Outcome {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let ttl = ctx.ttl(Duration::from_millis(500));
    let opts = ctx.opts(ttl);
    // Release at several points around the moment the lease runs out (the last one after it),
    // with a waiter ready to take over.
    for (i, before_ms) in [40i64, 20, 10, 5, 0, -30].into_iter().enumerate() {
        let name = ctx.name(&format!("r{i}"));
        let (lease, sent) = raw_lease(&a, &name, ttl).await?;
        let waiter = {
            let (b, name, opts) = (
                b.clone(),
                name.clone(),
                opts.clone()
                    .ttl(ttl * 20)
                    .wait_timeout(ttl * 3 + ctx.bound(Duration::from_secs(5))),
            );
            tokio::spawn(async move { b.lock(&name, &opts).await })
        };
        let at = if before_ms >= 0 {
            sent + ttl - Duration::from_millis(before_ms as u64)
        } else {
            sent + ttl + Duration::from_millis(before_ms.unsigned_abs())
        };
        tokio::time::sleep_until(at).await;
        let _ = lease.release().await;
        let g2 = ok_or(ok_or(waiter.await, "waiter task")?, "the waiter's lock()")?;
        must_be_held(
            &c,
            &name,
            &opts,
            &format!("while the next holder holds it (release sent {before_ms} ms before expiry)"),
        )
        .await?;
        ok_or(g2.release().await, "next holder's release")?;
    }
    Ok(())
}

async fn fencing_tokens_increase(ctx: &Ctx) -> Outcome {
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(600));
    let opts = ctx
        .opts(ttl)
        .wait_timeout(ttl * 3 + ctx.bound(Duration::from_secs(5)));
    let mut tokens = Vec::new();
    for round in 0..3 {
        let c = ctx.client().await?;
        let g = ok_or(c.lock(&name, &opts).await, "lock()")?;
        tokens.push(g.fencing_token().ok_or("no fencing token")?);
        if round == 1 {
            // A crashed holder: the next one takes over after expiry.
            ctx.harness.crash(g, c).await;
        } else {
            ok_or(g.release().await, "release")?;
        }
    }
    let c = ctx.client().await?;
    let g = ok_or(c.lock(&name, &opts).await, "lock() after the crash")?;
    tokens.push(g.fencing_token().ok_or("no fencing token")?);
    ok_or(g.release().await, "release")?;
    check!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens are not strictly increasing: {tokens:?}"
    );
    Ok(())
}

async fn auto_renew_keeps_lock(ctx: &Ctx) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(500));
    let opts = ctx.opts(ttl).auto_renew(AutoRenew::until(ttl * 20));
    let g = must_try(&a, &name, &opts, "holder").await?;
    let start = g.acquired_at();
    for k in 1..=7u32 {
        tokio::time::sleep_until(start + ttl / 2 * k).await;
        must_be_held(
            &b,
            &name,
            &ctx.opts(ttl),
            &format!("{:?} into a {ttl:?} lease with auto-renew", ttl / 2 * k),
        )
        .await?;
    }
    check!(
        g.is_valid(),
        "the renewed guard is not valid: lost = {:?}",
        g.lost().reason()
    );
    ok_or(g.release().await, "release")
}

async fn auto_renew_stops_at_max_hold(ctx: &Ctx) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(400));
    let max_hold = ttl * 3;
    let opts = ctx.opts(ttl).auto_renew(AutoRenew::until(max_hold));
    let g = must_try(&a, &name, &opts, "holder").await?;
    let start = g.acquired_at();
    let lost = g.lost();
    tokio::time::sleep_until(start + max_hold / 2).await;
    must_be_held(
        &b,
        &name,
        &ctx.opts(ttl),
        "half way to the maximum hold time",
    )
    .await?;
    let g2 = ok_or(
        b.lock(
            &name,
            &ctx.opts(ttl)
                .wait_timeout(max_hold + ttl * 2 + ctx.bound(Duration::from_secs(5))),
        )
        .await,
        "lock() after the maximum hold time",
    )?;
    let at = g2.acquired_at().saturating_duration_since(start);
    check!(
        at + Duration::from_millis(20) >= max_hold.mul_f64(0.9),
        "taken over {at:?} after acquiring, before the maximum hold time {max_hold:?}"
    );
    check!(
        at <= max_hold + ttl + ctx.bound(Duration::from_secs(3)),
        "renewal ran on: taken over only {at:?} after acquiring (max hold {max_hold:?}, TTL {ttl:?})"
    );
    check!(
        lost.is_lost(),
        "the first holder's lost signal did not fire although another client holds the lock"
    );
    drop_lost_guard_then_release_new(ctx, &a, g, g2).await
}

/// Drops a guard whose lease was lost (its release runs in the background), waits for that
/// release, checks it did not free the new holder's lock, then releases the new holder.
async fn drop_lost_guard_then_release_new(
    ctx: &Ctx,
    old_client: &Locker,
    lost: LockGuard,
    new: LockGuard,
) -> Outcome {
    let name = lost.name().clone();
    drop(lost);
    old_client.flush().await;
    let opts = ctx.opts(new.ttl());
    must_be_held(old_client, &name, &opts, "after the lost guard was dropped").await?;
    ok_or(new.release().await, "release")
}

async fn lost_signal_on_expiry(ctx: &Ctx) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(500));
    let g = must_try(&a, &name, &ctx.opts(ttl), "holder").await?;
    let lost = g.lost();
    check!(!lost.is_lost(), "the lost signal fired at once");
    let waited = tokio::time::timeout(ttl + ctx.bound(Duration::from_secs(3)), lost.lost()).await;
    let reason = ok_or(waited, "the lost signal did not fire after the TTL")?;
    let g2 = ok_or(b.lock(&name, &ctx.opts(ttl)).await, "lock() after expiry")?;
    check!(
        g2.acquired_at() >= g.valid_until(),
        "another client won the lock before the holder's validity deadline"
    );
    check!(
        !g.is_valid(),
        "the guard says valid after its lease was lost ({reason})"
    );
    drop_lost_guard_then_release_new(ctx, &a, g, g2).await
}

async fn lost_signal_on_revoke(ctx: &Ctx) -> Outcome {
    let a = ctx.client().await?;
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_millis(600));
    let g = must_try(
        &a,
        &name,
        &ctx.opts(ttl).auto_renew(AutoRenew::until(ttl * 50)),
        "holder",
    )
    .await?;
    let lost = g.lost();
    ok_or(ctx.harness.revoke(&name).await, "revoke")?;
    let reason = ok_or(
        tokio::time::timeout(ttl + ctx.bound(Duration::from_secs(3)), lost.lost()).await,
        "the lost signal did not fire after the lock was revoked",
    )?;
    check!(
        reason != LostReason::ValidityExpired || !g.is_valid(),
        "odd lost reason {reason}"
    );
    check!(
        !g.is_valid(),
        "the guard says valid after its lock was revoked"
    );
    Ok(())
}

async fn fifo_order(ctx: &Ctx) -> Outcome {
    const WAITERS: usize = 4;
    let name = ctx.name("x");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(30))).wait_forever();
    let holder = ctx.client().await?;
    let g = must_try(&holder, &name, &opts, "holder").await?;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let c = ctx.client().await?;
        let (name, opts, order) = (name.clone(), opts.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = c
                .lock(&name, &opts)
                .await
                .map_err(|e| format!("waiter {i}: {e}"))?;
            order.lock().unwrap().push(i);
            g.release()
                .await
                .map_err(|e| format!("waiter {i} release: {e}"))
        }));
        // Nothing observable says "queued"; leave each waiter time to enqueue.
        tokio::time::sleep(ctx.bound(Duration::from_millis(150))).await;
    }
    ok_or(g.release().await, "release")?;
    for t in tasks {
        ok_or(t.await, "waiter task")??;
    }
    let order = order.lock().unwrap().clone();
    check!(
        order == (0..WAITERS).collect::<Vec<_>>(),
        "waiters were served in order {order:?}, not in arrival order"
    );
    Ok(())
}

async fn drop_releases_promptly(ctx: &Ctx) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("x");
    let ttl = ctx.ttl(Duration::from_secs(60));
    let opts = ctx.opts(ttl);
    let g = must_try(&a, &name, &opts, "holder").await?;
    let dropped = Instant::now();
    drop(g);
    let bound = ctx.bound(Duration::from_secs(3));
    let g2 = ok_or(
        b.lock(&name, &opts.clone().wait_timeout(bound)).await,
        "lock() after the guard was dropped",
    )?;
    check!(
        dropped.elapsed() <= bound,
        "free only {:?} after the drop",
        dropped.elapsed()
    );
    ok_or(g2.release().await, "release")?;
    a.flush().await;
    Ok(())
}

/// Names that naive key, path or SQL building gets wrong; pairs that collide under naive
/// escaping sit side by side.
const HOSTILE: &[&str] = &[
    "../x",
    "..",
    ".",
    "a/b",
    "a%2Fb",
    "a_2Fb",
    "/",
    "'",
    "\"",
    "'; DROP TABLE locks; --",
    "{tag}",
    "{tag}x",
    "x{tag}",
    "*",
    "?",
    "[a]",
    "%",
    "%%",
    "\\",
    "a b",
    "lock:1",
    "lock",
    "ünïcødé",
    "锁",
    "🔒",
    "NULL",
    "x-y",
    "x_y",
    "X",
];

async fn hostile_names(ctx: &Ctx) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(20)));
    let long = "n".repeat(lockcore::MAX_NAME_LEN - ctx.prefix.len());
    let mut held = Vec::new();
    for suffix in HOSTILE.iter().copied().chain([long.as_str()]) {
        let name = format!("{}{suffix}", ctx.prefix);
        match a.try_lock(name.as_str(), &opts).await {
            // All held at once: each new one getting its own lock shows no two collide.
            Ok(Some(g)) => held.push((name, g)),
            Ok(None) => return Err(format!("{suffix:?} collided with a name held before it")),
            Err(e) if e.kind() == ErrorKind::InvalidName => {}
            Err(e) => {
                return Err(format!(
                    "{suffix:?}: expected success or InvalidName, got {e}"
                ));
            }
        }
    }
    check!(
        held.len() >= HOSTILE.len() / 2,
        "only {} of {} hostile names were accepted",
        held.len(),
        HOSTILE.len() + 1
    );
    for (name, _) in &held {
        must_be_held(
            &b,
            &LockName::new(name).unwrap(),
            &opts,
            &format!("{name:?} from another client"),
        )
        .await?;
    }
    for (name, g) in held {
        ok_or(g.release().await, &format!("release of {name:?}"))?;
    }
    Ok(())
}

async fn invalid_input_rejected(ctx: &Ctx) -> Outcome {
    let a = ctx.client().await?;
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(10)));
    let too_long = "x".repeat(lockcore::MAX_NAME_LEN + 1);
    for bad in ["", "nul\0byte", "new\nline", "esc\u{1b}", too_long.as_str()] {
        match a.try_lock(bad, &opts).await {
            Err(e) if e.kind() == ErrorKind::InvalidName => {}
            other => {
                return Err(format!(
                    "name {bad:?}: expected InvalidName, got {:?}",
                    other.map(|g| g.is_some())
                ));
            }
        }
    }
    let name = ctx.name("x");
    for (what, bad) in [
        ("zero", LockOptions::new().ttl(Duration::ZERO)),
        ("huge", LockOptions::new().ttl(Duration::MAX)),
        (
            "bad renew",
            opts.clone().auto_renew(AutoRenew::until(Duration::ZERO)),
        ),
    ] {
        match a.try_lock(&name, &bad).await {
            Err(e) if e.kind() == ErrorKind::InvalidConfig => {}
            other => {
                return Err(format!(
                    "{what} options: expected InvalidConfig, got {:?}",
                    other.map(|g| g.is_some())
                ));
            }
        }
    }
    let g = must_try(&a, &name, &opts, "after the rejected attempts").await?;
    ok_or(g.release().await, "release")
}

async fn unsupported_options_refused(ctx: &Ctx) -> Outcome {
    let a = ctx.client().await?;
    let name = ctx.name("x");
    let base = ctx.opts(ctx.ttl(Duration::from_secs(10)));
    let cases = [
        (
            "reentrant",
            base.clone().reentrant(true),
            ctx.caps.reentrant,
        ),
        (
            "require_fencing",
            base.clone().require_fencing(true),
            ctx.caps.fencing,
        ),
        (
            "require_fair",
            base.clone().require_fair(true),
            ctx.caps.fair,
        ),
    ];
    for (what, opts, supported) in cases {
        match (a.try_lock(&name, &opts).await, supported) {
            (Err(e), false) if e.kind() == ErrorKind::Unsupported => {}
            (Ok(Some(g)), true) => ok_or(g.release().await, "release")?,
            (other, _) => {
                return Err(format!(
                    "{what} (supported: {supported}): got {:?}",
                    other.map(|g| g.is_some())
                ));
            }
        }
    }
    let g = must_try(&a, &name, &base, "after the refused attempts").await?;
    ok_or(g.release().await, "release")
}
