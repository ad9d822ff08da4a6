//! What the fault scenarios share: names, bounds, clients, a lost signal's time, a waiting
//! client, holder processes, proxied clients.

use std::time::Duration;

use conformance::FaultCell;
use faultkit::{HolderSpec, Proxy, now_unix_micros as now, rewrite_url};
use locksmith::{AutoRenew, LockGuard, LockOptions, Locker, LostSignal};

use crate::target::Target;

pub(crate) type R = Result<(), String>;

pub(crate) fn scale() -> f64 {
    conformance::time_scale()
}

pub(crate) fn name(fault: &str) -> String {
    format!("fault-{fault}-{:08x}", fastrand::u32(..))
}

pub(crate) fn ms(from_us: u64, to_us: u64) -> f64 {
    (to_us as f64 - from_us as f64) / 1000.0
}

pub(crate) async fn connect_url(url: &str) -> Result<Locker, String> {
    locksmith::connect(url).await.map_err(|e| e.to_string())
}

pub(crate) async fn connect(t: &Target) -> Result<Locker, String> {
    connect_url(&t.url()).await
}

pub(crate) fn renewing(ttl: Duration) -> LockOptions {
    LockOptions::new()
        .ttl(ttl)
        .auto_renew(AutoRenew::until(Duration::from_secs(600)))
}

/// A bound generous enough for session ends, server-side guards (row-lock: TTL + 1 s) and a
/// noisy machine.
pub(crate) fn bound(t: &Target) -> Duration {
    bound_for(t.ttl)
}

pub(crate) fn bound_for(ttl: Duration) -> Duration {
    (ttl * 8 + Duration::from_secs(5)).mul_f64(scale())
}

/// When a lost signal fired (unix µs), awaitable.
pub(crate) struct LostAt(tokio::sync::watch::Receiver<Option<u64>>);

impl LostAt {
    /// When it fired, if it has.
    pub(crate) fn get(&self) -> Option<u64> {
        *self.0.borrow()
    }

    /// Waits up to `d` for it to fire; when it fired, if it has.
    pub(crate) async fn wait(&self, d: Duration) -> Option<u64> {
        let mut rx = self.0.clone();
        let _ = tokio::time::timeout(d, rx.wait_for(|v| v.is_some())).await;
        self.get()
    }
}

/// Records when a lost signal fires.
pub(crate) fn watch_lost(sig: LostSignal) -> LostAt {
    let (tx, rx) = tokio::sync::watch::channel(None);
    tokio::spawn(async move {
        sig.lost().await;
        let _ = tx.send(Some(now()));
    });
    LostAt(rx)
}

/// Awaits a spawned task for at most `d` (aborting it then): a scenario fails rather than
/// hangs.
pub(crate) async fn join<T>(
    what: &str,
    d: Duration,
    task: tokio::task::JoinHandle<T>,
) -> Result<T, String> {
    let abort = task.abort_handle();
    match tokio::time::timeout(d, task).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => {
            abort.abort();
            Err(format!("{what}: no result in {d:?}"))
        }
    }
}

/// A lock won by a waiting client: when and with which token.
pub(crate) struct Won {
    pub(crate) at: u64,
    pub(crate) fence: Option<u64>,
    pub(crate) guard: LockGuard,
}

/// A client waiting for a lock in a task of its own.
pub(crate) struct Waiter {
    task: tokio::task::JoinHandle<Result<Won, String>>,
    busy: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Waiter {
    /// Returns once the waiter has found the lock busy and started its `lock()` (or has
    /// already won or failed), at most after `d`: the fault that follows hits a waiting client.
    pub(crate) async fn waiting(&mut self, d: Duration) {
        if let Some(rx) = self.busy.take() {
            let _ = tokio::time::timeout(d, rx).await;
        }
    }

    /// Its result, within `d`.
    pub(crate) async fn result(self, d: Duration) -> Result<Result<Won, String>, String> {
        join("waiter", d, self.task).await
    }
}

/// Spawns a client that waits for `name` up to the options' wait timeout: one `try_lock`
/// (which must find it busy: that is the moment [`Waiter::waiting`] returns), then `lock()`.
pub(crate) fn waiter(locker: Locker, name: String, opts: LockOptions) -> Waiter {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let g = match locker.try_lock(name.as_str(), &opts).await {
            Ok(Some(g)) => g,
            _ => {
                let _ = tx.send(());
                locker
                    .lock(name.as_str(), &opts)
                    .await
                    .map_err(|e| format!("waiter: {e}"))?
            }
        };
        let at = now();
        Ok(Won {
            at,
            fence: g.fencing_token(),
            guard: g,
        })
    });
    Waiter {
        task,
        busy: Some(rx),
    }
}

pub(crate) fn check_token(cell: &mut FaultCell, before: Option<u64>, after: Option<u64>) {
    if let (Some(b), Some(a)) = (before, after)
        && a <= b
    {
        cell.count("token_regressions", 1);
        cell.note
            .push_str(&format!(" token {a} after {b} (not larger);"));
    }
}

pub(crate) fn holder_spec(t: &Target, name: &str, id: &str) -> HolderSpec {
    let (program, prefix) = crate::holder_process::holder_command();
    let mut s = HolderSpec::new(program, &t.url(), name, t.ttl);
    s.prefix = prefix;
    s.renew = true;
    s.id = id.to_string();
    s
}

/// One proxy per endpoint of the target, and the URL through them.
pub(crate) async fn proxies(t: &Target) -> Result<(Vec<Proxy>, String), String> {
    let mut url = t.url();
    let mut ps = Vec::new();
    for port in t.endpoints() {
        let p = Proxy::start(([127, 0, 0, 1], port).into())
            .await
            .map_err(|e| e.to_string())?;
        url = rewrite_url(&url, port, p.port());
        ps.push(p);
    }
    Ok((ps, url))
}
