//! A server that answers nothing (paused, or cut off by the network, connections left open):
//! a wait with a deadline returns by it, plus the slack `lock()` states, with `Unavailable`;
//! a wait without one gives up after its `retry_unavailable_for`, as against a server that
//! refuses. An attempt that waits for a reply that never comes must not stretch either bound.

use std::time::Duration;

use lockcore::{ErrorKind, Instant, LockGuard, LockName, LockOptions, Locker, WAIT_DEADLINE_SLACK};

use super::context::{Ctx, Outcome};
use super::support::{check, must_be_held, must_try, ok_or};

pub(super) async fn wait_deadline_against_a_silent_server(ctx: &Ctx) -> Outcome {
    let (b, silencer) = ok_or(
        ctx.harness.client_losing_replies().await,
        "connecting a client that can be cut off",
    )?;
    let a = ctx.client().await?;
    let name = ctx.name("silent");
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(30)));
    let g = must_try(&a, &name, &opts, "holder").await?;
    // The client hears the server (connections open, the lock busy to it) before the silence.
    must_be_held(&b, &name, &opts, "before the silence").await?;
    if !silencer.silence(true) {
        ctx.observe("the harness cannot cut a client off".into());
        return ok_or(g.release().await, "release");
    }
    let waited = waits_against_silence(ctx, &b, &name, &opts).await;
    silencer.silence(false);
    finish(g, &b, ctx).await?;
    let (with_deadline, without) = waited?;
    ctx.observe(format!(
        "Unavailable after {with_deadline:?} (wait timeout {:?}); without a deadline after \
         {without:?} (retry_unavailable_for {:?})",
        ctx.bound(Duration::from_secs(2)),
        ctx.bound(Duration::from_secs(2))
    ));
    Ok(())
}

/// The holder's release, and the silenced client's clean-up (what its cut-off attempts left)
/// once it hears the server again.
async fn finish(g: LockGuard, b: &Locker, ctx: &Ctx) -> Outcome {
    ok_or(g.release().await, "release")?;
    ok_or(
        b.shutdown(ctx.bound(Duration::from_secs(10))).await,
        "the cut-off client's clean-up after the silence",
    )
}

/// The two waits of the scenario against the silent server: how long each took.
async fn waits_against_silence(
    ctx: &Ctx,
    b: &Locker,
    name: &LockName,
    opts: &LockOptions,
) -> Result<(Duration, Duration), String> {
    // The slack lock() states, and the scheduling of a loaded machine.
    let slack = WAIT_DEADLINE_SLACK + ctx.bound(Duration::from_millis(250));
    let wait = ctx.bound(Duration::from_secs(2));
    let start = Instant::now();
    let r = b.lock(name, &opts.clone().wait_timeout(wait)).await;
    let with_deadline = start.elapsed();
    check!(
        with_deadline <= wait + slack,
        "lock() with a wait timeout of {wait:?} against a server that answers nothing returned \
         after {with_deadline:?} (bound {:?}): {:?}",
        wait + slack,
        r.as_ref().map(|g| g.name().clone())
    );
    match r {
        Err(e) if e.kind() == ErrorKind::Unavailable => {}
        other => {
            return Err(format!(
                "lock() with a wait timeout against a server that answers nothing: expected \
                 Unavailable, got {:?}",
                other.map(|g| g.name().clone())
            ));
        }
    }
    let limit = ctx.bound(Duration::from_secs(2));
    let start = Instant::now();
    let r = b
        .lock(
            name,
            &opts.clone().wait_forever().retry_unavailable_for(limit),
        )
        .await;
    let without = start.elapsed();
    check!(
        without <= limit + slack,
        "lock() without a deadline (retry_unavailable_for {limit:?}) against a server that \
         answers nothing returned after {without:?} (bound {:?}): {:?}",
        limit + slack,
        r.as_ref().map(|g| g.name().clone())
    );
    match r {
        Err(e) if e.kind() == ErrorKind::Unavailable => Ok((with_deadline, without)),
        other => Err(format!(
            "lock() without a deadline against a server that answers nothing: expected \
             Unavailable, got {:?}",
            other.map(|g| g.name().clone())
        )),
    }
}
