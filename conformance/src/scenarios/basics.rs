//! Ownership basics: take, release, take again; contention; reentrancy; mutual exclusion; release on drop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::Instant;

use super::context::{Ctx, Failure, Outcome};
use super::support::{check, must_be_held, must_try, ok_or};

pub(super) async fn acquire_release_reacquire(ctx: &Ctx) -> Outcome {
    let a = ctx.client().await?;
    let name = ctx.name("x");
    let opts = ctx.fenced_opts(ctx.ttl(Duration::from_secs(10)));
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

pub(super) async fn try_lock_contended_returns_none(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
    let name = ctx.name("x");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(10)));
    let g = must_try(&a, &name, &opts, "holder").await?;
    must_be_held(&b, &name, &opts, "second client").await?;
    ok_or(g.release().await, "release")?;
    let g = must_try(&b, &name, &opts, "second client after release").await?;
    ok_or(g.release().await, "release")
}

pub(super) async fn independent_names(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
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

pub(super) async fn reentrancy_as_declared(ctx: &Ctx) -> Outcome {
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

/// Records who is inside the critical section; any overlap is a violation.
#[derive(Default)]
pub(super) struct OverlapDetector {
    inside: AtomicUsize,
    pub(super) violations: AtomicUsize,
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

pub(super) async fn mutual_exclusion_under_contention(ctx: &Ctx) -> Outcome {
    const CLIENTS: usize = 3;
    const TASKS: usize = 4;
    const ROUNDS: usize = 5;
    let name = ctx.name("x");
    let opts = ctx
        .fenced_opts(ctx.ttl(Duration::from_secs(20)))
        .wait_timeout(ctx.bound(Duration::from_secs(120)));
    let detector = contend(ctx, &name, &opts, CLIENTS, TASKS, ROUNDS).await?;
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

/// `clients` clients of `tasks` tasks each loop `rounds` times: `lock()`, a critical section
/// that yields (so that another holder would run inside it), release. Who was inside, and when,
/// is in the returned detector.
pub(super) async fn contend(
    ctx: &Ctx,
    name: &lockcore::LockName,
    opts: &lockcore::LockOptions,
    clients: usize,
    tasks: usize,
    rounds: usize,
) -> Result<Arc<OverlapDetector>, Failure> {
    let detector = Arc::new(OverlapDetector::default());
    let mut running = Vec::new();
    for _ in 0..clients {
        let client = ctx.client().await?;
        for _ in 0..tasks {
            let (client, name, opts, detector) =
                (client.clone(), name.clone(), opts.clone(), detector.clone());
            running.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let g = client
                        .lock(&name, &opts)
                        .await
                        .map_err(|e| format!("lock(): {e}"))?;
                    detector.enter(g.fencing_token());
                    for _ in 0..1 + fastrand::usize(..8) {
                        tokio::task::yield_now().await;
                    }
                    detector.exit();
                    g.release().await.map_err(|e| format!("release: {e}"))?;
                }
                Ok::<_, Failure>(())
            }));
        }
    }
    for t in running {
        ok_or(t.await, "task")??;
    }
    Ok(detector)
}

pub(super) async fn drop_releases_promptly(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
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
