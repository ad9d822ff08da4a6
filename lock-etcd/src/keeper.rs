//! Lease keep-alive on one stream per client.
//!
//! etcd-client's `LeaseKeeper` is bound to one lease; the stream itself takes keep-alive
//! requests for any lease, so the keeper task multiplexes every lease of the client over one
//! stream (a `LeaseKeeper` per id sharing the stream's sender). The server answers a stream's
//! requests in order, so the responses for one lease match its requests first in, first out.
//!
//! Nothing in the client reconnects a stream: when it ends or fails, the task opens a new one
//! (with any lease it still keeps) and sends a keep-alive for every kept lease at once.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{LeaseClient, LeaseKeepAliveStream, LeaseKeeper};
use lockcore::backend::LostNotifier;
use lockcore::{Instant, LostReason};
use tokio::sync::{mpsc, oneshot};

/// What the server said about one keep-alive: the lease lives `ttl` from `sent` (at least), or it
/// is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    Alive { sent: Instant, ttl: Duration },
    Gone,
}

/// A lease's last known expiry (the send time of the last acknowledged keep-alive or grant plus
/// its TTL), shared between the keeper, the lease pool and the lock that uses the lease.
#[derive(Debug)]
pub(crate) struct LeaseCell {
    pub(crate) id: i64,
    /// The TTL the server granted.
    pub(crate) ttl: Duration,
    expires: Mutex<Instant>,
    /// Set while the keeper may keep the lease alive periodically (see [`Keeper::release_cell`]).
    kept: AtomicBool,
}

impl LeaseCell {
    pub(crate) fn new(id: i64, ttl: Duration, sent: Instant) -> Arc<Self> {
        Arc::new(LeaseCell {
            id,
            ttl,
            expires: Mutex::new(sent + ttl),
            kept: AtomicBool::new(false),
        })
    }

    pub(crate) fn expires(&self) -> Instant {
        *self.expires.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        let mut e = self.expires.lock().unwrap_or_else(|e| e.into_inner());
        *e = (*e).max(sent + ttl);
    }
}

enum Cmd {
    /// Keep `lease` alive (every ttl/3) until `Release`; fire `lost` when the server refuses a
    /// keep-alive or no acknowledgement came before the lease may have expired. Keep-alives go
    /// on after an outage either way: a queued waiter whose lease outlived the outage keeps
    /// its place in the queue (a lease that did expire is refused, and its waiter re-queues).
    Keep {
        lease: Arc<LeaseCell>,
        lost: Option<LostNotifier>,
    },
    Release {
        id: i64,
    },
    /// One keep-alive now; the reply says what the server answered.
    Refresh {
        lease: Arc<LeaseCell>,
        reply: oneshot::Sender<Result<Renewal, String>>,
    },
}

/// The handle to one client's keeper task. The task ends when every handle is gone.
#[derive(Clone)]
pub(crate) struct Keeper {
    tx: mpsc::UnboundedSender<Cmd>,
}

impl Keeper {
    pub(crate) fn start(client: LeaseClient, margin: fn(Duration) -> Duration) -> Keeper {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(client, rx, margin));
        Keeper { tx }
    }

    pub(crate) fn keep(&self, lease: Arc<LeaseCell>, lost: Option<LostNotifier>) {
        lease.kept.store(true, Ordering::Relaxed);
        let _ = self.tx.send(Cmd::Keep { lease, lost });
    }

    pub(crate) fn release(&self, id: i64) {
        let _ = self.tx.send(Cmd::Release { id });
    }

    /// [`Keeper::release`], sent only if the lease was given to [`Keeper::keep`] since it was
    /// last released this way: a lease that was never kept (an uncontended lock's, taken from
    /// the pool) costs no message, so no wake-up of the keeper task on the acquisition's path.
    /// (A lease the keeper only refreshed on demand needs no release: its entry goes with the
    /// last answer.)
    pub(crate) fn release_cell(&self, lease: &LeaseCell) {
        if lease.kept.swap(false, Ordering::Relaxed) {
            self.release(lease.id);
        }
    }

    /// Sends one keep-alive for `lease` at once (the send time is taken by the task just before
    /// it writes to the stream) and returns a receiver for the server's answer.
    pub(crate) fn refresh(
        &self,
        lease: Arc<LeaseCell>,
    ) -> oneshot::Receiver<Result<Renewal, String>> {
        let (reply, rx) = oneshot::channel();
        if let Err(mpsc::error::SendError(Cmd::Refresh { reply, .. })) =
            self.tx.send(Cmd::Refresh { lease, reply })
        {
            let _ = reply.send(Err("the lease keeper has stopped".into()));
        }
        rx
    }
}

/// Who waits for the answer to one keep-alive.
type Reply = oneshot::Sender<Result<Renewal, String>>;

struct Entry {
    lease: Arc<LeaseCell>,
    /// Kept alive periodically (held locks and queued waiters), not just refreshed on demand.
    kept: bool,
    lost: Option<LostNotifier>,
    /// Send times of the requests not answered yet, with who waits for each answer.
    inflight: VecDeque<(Instant, Option<Reply>)>,
    last_sent: Option<Instant>,
}

impl Entry {
    fn next_due(&self) -> Instant {
        let period = self.lease.ttl / 3;
        let from_ack = self.lease.expires() - self.lease.ttl + period;
        match self.last_sent {
            // Re-send when an answer is overdue by a period too (a lost or stuck request).
            Some(s) => from_ack.max(s + period),
            None => from_ack,
        }
    }
}

type Opening = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = (
                    i64,
                    Result<(LeaseKeeper, LeaseKeepAliveStream), etcd_client::Error>,
                ),
            > + Send,
    >,
>;

async fn run(
    client: LeaseClient,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    margin: fn(Duration) -> Duration,
) {
    let mut entries: HashMap<i64, Entry> = HashMap::new();
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    let mut opening: Option<Opening> = None;
    let mut retry_at: Option<Instant> = None;
    loop {
        // Open a stream when one is needed and none is being opened.
        if stream.is_none()
            && opening.is_none()
            && retry_at.is_none_or(|t| t <= Instant::now())
            && let Some(id) = entries
                .values()
                .filter(|e| e.kept || !e.inflight.is_empty())
                .map(|e| e.lease.id)
                .next()
        {
            retry_at = None;
            let mut client = client.clone();
            let sent = Instant::now();
            if let Some(e) = entries.get_mut(&id) {
                e.inflight.push_back((sent, None));
                e.last_sent = Some(sent);
            }
            opening = Some(Box::pin(async move { (id, client.keep_alive(id).await) }));
        }
        let now = Instant::now();
        let mut wake = retry_at;
        for e in entries.values() {
            if e.kept {
                // The moment to report a possible expiry matters only while someone is to be
                // told (it is past for a lease whose acknowledgements are late).
                let lost_at = e
                    .lost
                    .is_some()
                    .then(|| e.lease.expires() - margin(e.lease.ttl));
                let due = stream.is_some().then(|| e.next_due());
                if let Some(t) = lost_at.into_iter().chain(due).min() {
                    wake = Some(wake.map_or(t, |w| w.min(t)));
                }
            }
        }
        let sleep = async {
            match wake {
                Some(t) => tokio::time::sleep_until(t.max(now)).await,
                None => std::future::pending().await,
            }
        };
        let message = async {
            match stream.as_mut() {
                Some((_, s)) => s.message().await,
                None => std::future::pending().await,
            }
        };
        let opened = async {
            match opening.as_mut() {
                Some(f) => f.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            cmd = rx.recv() => {
                let Some(cmd) = cmd else { return };
                match cmd {
                    Cmd::Keep { lease, lost } => {
                        let e = entries.entry(lease.id).or_insert_with(|| Entry {
                            lease: lease.clone(),
                            kept: false,
                            lost: None,
                            inflight: VecDeque::new(),
                            last_sent: None,
                        });
                        e.kept = true;
                        if lost.is_some() {
                            e.lost = lost;
                        }
                    }
                    Cmd::Release { id } => {
                        if let Some(e) = entries.get_mut(&id) {
                            e.kept = false;
                            e.lost = None;
                            if e.inflight.is_empty() {
                                entries.remove(&id);
                            }
                        }
                    }
                    Cmd::Refresh { lease, reply } => {
                        let id = lease.id;
                        let e = entries.entry(id).or_insert_with(|| Entry {
                            lease,
                            kept: false,
                            lost: None,
                            inflight: VecDeque::new(),
                            last_sent: None,
                        });
                        match stream.as_mut() {
                            Some((keeper, _)) => {
                                let sent = Instant::now();
                                if send(keeper, id).await {
                                    e.inflight.push_back((sent, Some(reply)));
                                    e.last_sent = Some(sent);
                                } else {
                                    let _ = reply.send(Err("the keep-alive stream is closed".into()));
                                    stream = None;
                                }
                            }
                            // The stream is (re)opening: the answer to its first request is
                            // this lease's, or the request goes out once it is open.
                            None => e.inflight.push_back((Instant::now(), Some(reply))),
                        }
                    }
                }
            }
            (id, result) = opened => {
                opening = None;
                match result {
                    Ok((keeper, s)) => {
                        // The opening request for `id` was answered inside keep_alive.
                        if let Some(e) = entries.get_mut(&id)
                            && let Some((sent, reply)) = e.inflight.pop_front()
                        {
                            e.lease.renewed(sent, e.lease.ttl);
                            if let Some(r) = reply {
                                let _ = r.send(Ok(Renewal::Alive { sent, ttl: e.lease.ttl }));
                            }
                        }
                        stream = Some((keeper, s));
                        // Everything else that waits goes out now.
                        let (keeper, _) = stream.as_mut().expect("just set");
                        let mut broken = false;
                        for e in entries.values_mut() {
                            let pending = e.inflight.len();
                            if pending > 0 || e.kept {
                                let sent = Instant::now();
                                // Re-time the waiting requests: they go out now.
                                for r in e.inflight.iter_mut() {
                                    r.0 = sent;
                                }
                                if pending == 0 {
                                    e.inflight.push_back((sent, None));
                                }
                                e.last_sent = Some(sent);
                                for _ in 0..pending.max(1) {
                                    broken |= !send(keeper, e.lease.id).await;
                                }
                            }
                        }
                        if broken {
                            fail_inflight(&mut entries, "the keep-alive stream closed");
                            stream = None;
                        }
                        entries.retain(|_, e| e.kept || !e.inflight.is_empty());
                    }
                    Err(e) => {
                        let gone = e.to_string().contains("lease not found");
                        if gone {
                            lease_gone(&mut entries, id);
                        } else {
                            tracing::debug!(error = %e, "opening the etcd keep-alive stream failed; retrying");
                            fail_inflight(&mut entries, &format!("opening the keep-alive stream failed: {e}"));
                            retry_at = Some(Instant::now() + Duration::from_millis(100));
                        }
                    }
                }
            }
            msg = message => {
                match msg {
                    Ok(Some(resp)) => {
                        let id = resp.id();
                        if resp.ttl() <= 0 {
                            lease_gone(&mut entries, id);
                        } else if let Some(e) = entries.get_mut(&id) {
                            let ttl = Duration::from_secs(resp.ttl() as u64);
                            if let Some((sent, reply)) = e.inflight.pop_front() {
                                e.lease.renewed(sent, ttl);
                                if let Some(r) = reply {
                                    let _ = r.send(Ok(Renewal::Alive { sent, ttl }));
                                }
                            }
                            if !e.kept && e.inflight.is_empty() {
                                entries.remove(&id);
                            }
                        }
                    }
                    Ok(None) | Err(_) => {
                        tracing::debug!(result = ?msg.err(), "the etcd keep-alive stream ended; reopening");
                        stream = None;
                        fail_inflight(&mut entries, "the keep-alive stream ended");
                        retry_at = Some(Instant::now() + Duration::from_millis(20));
                    }
                }
            }
            _ = sleep => {
                let now = Instant::now();
                let mut lost = Vec::new();
                let mut due = Vec::new();
                for e in entries.values() {
                    if !e.kept {
                        continue;
                    }
                    if e.lost.is_some() && now >= e.lease.expires() - margin(e.lease.ttl) {
                        lost.push(e.lease.id);
                    }
                    if now >= e.next_due() {
                        due.push(e.lease.id);
                    }
                }
                for id in lost {
                    if let Some(e) = entries.get_mut(&id) {
                        tracing::debug!(lease = id, "no keep-alive acknowledged before the lease may expire");
                        if let Some(l) = e.lost.take() {
                            l.fire(LostReason::ConnectionLost);
                        }
                        // Still kept: the lease may well live (the server may have renewed it
                        // and only the answers be late), and whatever it carries keeps its
                        // place only if it is renewed. The answers to what was sent may still
                        // come on this stream: keep the send times (nobody waits for them any
                        // more), so that a later request for this lease is not matched with an
                        // earlier one's answer, which would overstate the lease's life.
                        for (_, reply) in e.inflight.iter_mut() {
                            if let Some(r) = reply.take() {
                                let _ = r.send(Err("no keep-alive was acknowledged in time".into()));
                            }
                        }
                    }
                }
                if let Some((keeper, _)) = stream.as_mut() {
                    let mut broken = false;
                    for id in due {
                        if let Some(e) = entries.get_mut(&id) {
                            let sent = Instant::now();
                            if send(keeper, id).await {
                                e.inflight.push_back((sent, None));
                                e.last_sent = Some(sent);
                            } else {
                                broken = true;
                            }
                        }
                    }
                    if broken {
                        stream = None;
                        fail_inflight(&mut entries, "the keep-alive stream closed");
                    }
                }
                if retry_at.is_some_and(|t| t <= now) {
                    retry_at = None;
                }
            }
        }
    }
}

async fn send(keeper: &LeaseKeeper, id: i64) -> bool {
    let mut k = LeaseKeeper {
        id,
        sender: keeper.sender.clone(),
    };
    k.keep_alive().await.is_ok()
}

fn fail(e: &mut Entry, why: &str) {
    for (_, reply) in e.inflight.drain(..) {
        if let Some(r) = reply {
            let _ = r.send(Err(why.to_owned()));
        }
    }
}

/// The stream is gone: nobody gets an answer to what was sent on it.
fn fail_inflight(entries: &mut HashMap<i64, Entry>, why: &str) {
    entries.retain(|_, e| {
        fail(e, why);
        e.kept
    });
}

/// The server says the lease does not exist (expired or revoked).
fn lease_gone(entries: &mut HashMap<i64, Entry>, id: i64) {
    if let Some(mut e) = entries.remove(&id) {
        for (_, reply) in e.inflight.drain(..) {
            if let Some(r) = reply {
                let _ = r.send(Ok(Renewal::Gone));
            }
        }
        if let Some(l) = e.lost.take() {
            tracing::debug!(
                lease = id,
                "the server refused a keep-alive: the lease is gone"
            );
            l.fire(LostReason::RenewalRefused);
        }
    }
}
