//! How the suite reaches a backend: a [`Harness`] makes independent clients.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::{LockGuard, LockName, Locker, Result};

/// A boxed future, for closures that connect clients.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Reads how many requests one client has sent to its server so far.
#[derive(Clone)]
pub struct RequestCount(Arc<dyn Fn() -> u64 + Send + Sync>);

impl RequestCount {
    /// A count read by `read`.
    pub fn new(read: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        RequestCount(Arc::new(read))
    }

    /// The requests sent so far.
    pub fn get(&self) -> u64 {
        (self.0)()
    }
}

impl std::fmt::Debug for RequestCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RequestCount({})", self.get())
    }
}

/// Loses a client's replies: the server applies a request, the client never hears back (its
/// connection is reset instead), the "indeterminate" outcome of a request.
pub trait ReplyLoser: Send + Sync {
    /// Arms: the reply to the client's next request that carries `pattern` (a lock's name, which
    /// every backend's acquire and release carry in clear) is lost.
    fn lose_next_reply(&self, pattern: &[u8]);

    /// Disarms; how many replies the client lost so far.
    fn disarm(&self) -> u64;

    /// `true`: from now on the server answers nothing to this client, as a paused server or
    /// a cut network (every byte either way is dropped, connections stay open); `false`: it
    /// answers again. Returns whether the loser can do it (the default cannot).
    fn silence(&self, on: bool) -> bool {
        let _ = on;
        false
    }
}

/// A holder process that holds a lock (see [`Harness::skewed_holder_process`]): dropping it
/// kills the process.
pub type HolderProcess = Box<dyn std::any::Any + Send>;

/// What a holder process whose wall clock runs ahead asks for (see
/// [`Harness::skewed_holder_process`]).
#[derive(Clone, Debug)]
pub struct SkewedHolder<'a> {
    /// The lock's name.
    pub name: &'a LockName,
    /// The TTL it asks for.
    pub ttl: Duration,
    /// How far its wall clock runs ahead (libfaketime).
    pub ahead: Duration,
    /// How long it waits for the lock.
    pub wait: Duration,
    /// One of this many semaphore permits instead of the exclusive lock.
    pub permits: Option<u32>,
}

/// Gives the suite independent clients of one backend instance.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A label for test names and reports, with secrets redacted (for example `redis-tls`).
    fn label(&self) -> String;

    /// A new client with its own connection or session: two clients never share one, so their
    /// locks exclude each other as two processes' would.
    ///
    /// Cancel safe: a dropped connect leaves nothing behind.
    async fn client(&self) -> Result<Locker>;

    /// A new client for a holder that a scenario will [`Harness::crash`]: the default is
    /// [`Harness::client`]; a harness whose crash needs the client set up for it (behind a
    /// proxy it can reset) overrides it.
    ///
    /// Cancel safe: a dropped connect leaves nothing behind.
    async fn crashable_client(&self) -> Result<Locker> {
        self.client().await
    }

    /// Plays a crash of the holder of `guard` (a client from [`Harness::crashable_client`]): the lease is neither renewed nor released, and the
    /// client goes away as a killed process's would. The default abandons the guard and drops
    /// the client; session-bound backends override it so the session dies without a goodbye.
    ///
    /// Cancel safety: a dropped crash may leave the holder alive; its lock then frees after
    /// its TTL.
    async fn crash(&self, guard: LockGuard, client: Locker) {
        guard.abandon();
        drop(client);
    }

    /// Whether [`Harness::killed_holder_process`] works; `crash_frees_lock` plays the crash in
    /// process ([`Harness::crash`]) otherwise.
    fn can_kill_holder_process(&self) -> bool {
        false
    }

    /// Takes `name` with `ttl` in a holder process of its own (its lease renewed, as a
    /// service's guard is) and kills it with SIGKILL once it holds the lock: no release, no
    /// goodbye, its connections closed by the kernel. Returns the moment of the kill.
    ///
    /// Cancel safety: a dropped call kills the process (if it was started).
    async fn killed_holder_process(
        &self,
        name: &LockName,
        ttl: Duration,
    ) -> Result<lockcore::Instant> {
        let _ = (name, ttl);
        Err(lockcore::Error::unsupported(
            "this harness runs no holder processes",
        ))
    }

    /// Whether [`Harness::revoke`] works; scenarios that need it are unsupported otherwise.
    /// The default is false; harnesses of backends that declare
    /// [`Capabilities::force_release`](lockcore::Capabilities::force_release) say true.
    fn can_revoke(&self) -> bool {
        false
    }

    /// Deletes the lock `name` behind its holder's back, as an operator (or a failover) would.
    /// The default uses [`Locker::force_release`] from a new client.
    ///
    /// Cancel safety: dropping the future may or may not have revoked the lock.
    async fn revoke(&self, name: &LockName) -> Result<()> {
        self.client().await?.force_release(name).await.map(drop)
    }

    /// Whether [`Harness::client_with_reply_delay`] works; scenarios that need it are
    /// unsupported otherwise. The default is false.
    fn can_delay_replies(&self) -> bool {
        false
    }

    /// A new client whose replies from the server arrive `delay` late: each request takes
    /// effect on the server when sent, its reply comes back `delay` later (latency injected on
    /// the reply path, by a proxy for real servers, in-process for `memory://`). Used to check
    /// that validity is counted from when a request was sent. Unsupported by default.
    ///
    /// Cancel safe: a dropped connect leaves nothing behind.
    async fn client_with_reply_delay(&self, delay: Duration) -> Result<Locker> {
        let _ = delay;
        Err(lockcore::Error::unsupported(
            "this harness cannot delay a client's replies",
        ))
    }

    /// Whether [`Harness::client_with_clock_skew`] works; scenarios that need it are
    /// unsupported otherwise. The default is false.
    fn can_skew_clock(&self) -> bool {
        false
    }

    /// A new client whose wall clock runs `ahead` of everyone else's (as on a machine whose
    /// clock is off). Backends that decide expiry by the server's clock are unaffected; ones
    /// that trust clients' clocks let such a client steal locks. Unsupported by default.
    ///
    /// Cancel safe: a dropped connect leaves nothing behind.
    async fn client_with_clock_skew(&self, ahead: Duration) -> Result<Locker> {
        let _ = ahead;
        Err(lockcore::Error::unsupported(
            "this harness cannot skew a client's clock",
        ))
    }

    /// Whether [`Harness::skewed_holder_process`] works: `skewed_clock_cannot_steal` runs its
    /// skewed client as a process where the harness cannot skew an in-process client.
    fn can_run_skewed_process(&self) -> bool {
        false
    }

    /// Runs a holder process whose wall clock runs `holder.ahead` (libfaketime), asking for
    /// `holder.name` (a permit of it where `holder.permits` says) with `holder.ttl` and waiting
    /// at most `holder.wait`. `None` when it did not get the lock in that time; otherwise it
    /// holds the lock until the returned handle is dropped, which kills it (SIGKILL: its lock
    /// then frees by its TTL, or with its session).
    ///
    /// Cancel safety: a dropped call kills the process.
    async fn skewed_holder_process(
        &self,
        holder: &SkewedHolder<'_>,
    ) -> Result<Option<HolderProcess>> {
        let _ = holder;
        Err(lockcore::Error::unsupported(
            "this harness runs no holder processes",
        ))
    }

    /// The longest name, in bytes, the target accepts: [`lockcore::MAX_NAME_LEN`] unless the
    /// backend follows a peer that limits names (`interop=get_lock`: 64), which must refuse a
    /// longer one with `InvalidName`. The name scenarios keep to it.
    fn max_name_len(&self) -> usize {
        lockcore::MAX_NAME_LEN
    }

    /// Whether [`Harness::client_in_other_namespace`] works; scenarios that need it are
    /// unsupported otherwise. The default is false.
    fn can_open_other_namespace(&self) -> bool {
        false
    }

    /// A new client of the same server whose locks live in another namespace (a Redis key
    /// namespace, a SQL table, a ZooKeeper namespace node, an etcd key prefix, another memory
    /// store): the same name there is another lock. Unsupported by default.
    ///
    /// Cancel safe: a dropped connect leaves nothing behind.
    async fn client_in_other_namespace(&self) -> Result<Locker> {
        Err(lockcore::Error::unsupported(
            "this harness cannot open a client in another namespace",
        ))
    }

    /// Whether [`Harness::client_counting_requests`] works; scenarios that need it are
    /// unsupported otherwise. The default is false.
    fn can_count_requests(&self) -> bool {
        false
    }

    /// A new client with the count of the requests it sends to the server (through a proxy
    /// for real servers, in-process for `memory://`), to judge the server work of a hand-over
    /// among many waiters. Unsupported by default.
    ///
    /// Cancel safe: a dropped connect leaves nothing behind.
    async fn client_counting_requests(&self) -> Result<(Locker, RequestCount)> {
        Err(lockcore::Error::unsupported(
            "this harness cannot count a client's requests",
        ))
    }

    /// Whether [`Harness::client_losing_replies`] works; scenarios that need it are
    /// unsupported otherwise. The default is false.
    fn can_lose_replies(&self) -> bool {
        false
    }

    /// A new client whose replies a scenario can lose ([`ReplyLoser`]: through a proxy for real
    /// servers, in-process for `memory://`). Unsupported by default.
    ///
    /// Cancel safe: a dropped connect leaves nothing behind.
    async fn client_losing_replies(&self) -> Result<(Locker, Arc<dyn ReplyLoser>)> {
        Err(lockcore::Error::unsupported(
            "this harness cannot lose a client's replies",
        ))
    }

    /// A new client whose safety-net poll (the periodic re-check a notified waiter makes in
    /// case a notification was lost) is as long as the backend allows up to 10 s (`poll_ms=10000`
    /// where the URL has it), so that a waiter its notification missed shows as a late grant,
    /// not one hidden by the next poll. The default is [`Harness::client`]: a backend without
    /// such a setting waits on its notification alone.
    ///
    /// Cancel safe: a dropped connect leaves nothing behind.
    async fn client_with_long_poll(&self) -> Result<Locker> {
        self.client().await
    }

    /// The shortest TTL the scenarios should use with this backend (its timing floor, for
    /// example ZooKeeper's minimum session timeout). Scenario TTLs are at least this.
    fn min_scenario_ttl(&self) -> Duration {
        Duration::from_millis(300)
    }
}

/// A harness from a label and a connect closure.
pub struct FnHarness<F> {
    label: String,
    connect: F,
    min_ttl: Duration,
}

impl<F> FnHarness<F>
where
    F: Fn() -> BoxFuture<'static, Result<Locker>> + Send + Sync + 'static,
{
    /// `connect` is called once per client.
    pub fn new(label: impl Into<String>, connect: F) -> Self {
        FnHarness {
            label: label.into(),
            connect,
            min_ttl: Duration::from_millis(300),
        }
    }

    /// Sets [`Harness::min_scenario_ttl`].
    pub fn min_scenario_ttl(mut self, ttl: Duration) -> Self {
        self.min_ttl = ttl;
        self
    }

    /// Boxes it.
    pub fn arc(self) -> Arc<dyn Harness> {
        Arc::new(self)
    }
}

#[async_trait]
impl<F> Harness for FnHarness<F>
where
    F: Fn() -> BoxFuture<'static, Result<Locker>> + Send + Sync + 'static,
{
    fn label(&self) -> String {
        self.label.clone()
    }

    async fn client(&self) -> Result<Locker> {
        (self.connect)().await
    }

    fn min_scenario_ttl(&self) -> Duration {
        self.min_ttl
    }
}

/// `url` with the query parameter `key=value` added (after `?` or `&`): for harnesses that
/// open clients with another setting, such as another namespace.
pub fn url_with_param(url: &str, key: &str, value: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{key}={value}")
}

/// `url` with `path` (starting with `/`) put after its hosts, before any query: for backends
/// whose URL path names the namespace (etcd). A path the URL already has is replaced.
pub fn url_with_path(url: &str, path: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let hosts_from = base.find("://").map_or(0, |i| i + 3);
    let hosts_end = base[hosts_from..]
        .find('/')
        .map_or(base.len(), |i| hosts_from + i);
    let mut out = format!("{}{path}", &base[..hosts_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_get_a_param_or_a_path() {
        assert_eq!(
            url_with_param("zk://h:1", "namespace", "x"),
            "zk://h:1?namespace=x"
        );
        assert_eq!(url_with_param("zk://h:1?a=b", "n", "x"), "zk://h:1?a=b&n=x");
        assert_eq!(url_with_path("etcd://h:1", "/a/b"), "etcd://h:1/a/b");
        assert_eq!(
            url_with_path("etcds://u:p@h:1,h:2/old?ca=/c.pem", "/a"),
            "etcds://u:p@h:1,h:2/a?ca=/c.pem"
        );
    }
}
