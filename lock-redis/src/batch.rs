//! Renewals that fall due together go out as one script call: with many leases on one client,
//! one compare-and-`PEXPIRE` per lease per renewal costs a script call and a reply each; a batch
//! costs one. One batch is in flight at a time and the next one takes whatever queued meanwhile
//! (up to [`MAX_BATCH`]), so a lone renewal goes out at once and waits for no timer. Batches go
//! out [`MIN_GAP`] apart at least: renewals that fall due spread over time (leases taken one
//! after the other) would otherwise go out a few per call, a round trip apart (issue 38:
//! 100,000 leases renewed every 10 s cost the server 209 calls a second without the gap, 69
//! with it, by `INFO commandstats`; the gap caps a client at 500).
//!
//! A queued renewal is the lease's name (a reference count), its token and TTL: the batch
//! derives the keys and the owner text into one reused buffer as it writes the call, so a
//! renewal allocates nothing here but its reply channel (issue 24: 100,000 leases renewed every
//! 10 s spent about half the client's CPU in `malloc` and `free`).

use std::fmt::Write as _;
use std::time::Duration;

use lockcore::backend::OwnerToken;
use lockcore::{Error, ErrorKind, LockName, Result};
use tokio::sync::{mpsc, oneshot};

use crate::conn::Conn;
use crate::exclusive::ExtendMany;
use crate::interop::Interop;
use crate::keys::push_key;

/// Leases per script call at most: keeps one call's time on the server short (Redis runs one
/// script at a time).
const MAX_BATCH: usize = 512;

/// The least time between two batches' sends: a renewal that falls due right after a batch
/// went out waits this long at most for others to join it. Only batches whose leases all have
/// a TTL of [`GAP_MIN_TTL`] or more wait: 2 ms is then at most 0.2 % of the TTL, far inside a
/// renewal interval and the drift margin; shorter leases go out at once.
const MIN_GAP: Duration = Duration::from_millis(2);

/// See [`MIN_GAP`].
const GAP_MIN_TTL: Duration = Duration::from_secs(1);

struct Renewal {
    name: LockName,
    token: OwnerToken,
    ttl: Duration,
    reply: oneshot::Sender<Result<bool>>,
}

/// Where a lease's lock and holder keys are: locksmith's layout under the namespace, or
/// redis-py's (the lock key is the name itself), the only peer whose renewals are batched
/// ([`Interop::batched_renewals`]).
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub(crate) namespace: String,
    pub(crate) interop: Option<Interop>,
}

impl Layout {
    /// Appends the lock key of `name` to `out` (as `Inner::keys(name).lock`).
    fn push_lock_key(&self, out: &mut String, name: &LockName) {
        match self.interop {
            Some(Interop::RedisPy) => out.push_str(name.as_str()),
            _ => push_key(out, &self.namespace, name, "lock"),
        }
    }

    /// Appends the holder-metadata key of `name` to `out` (as `Inner::keys(name).holder`).
    fn push_holder_key(&self, out: &mut String, name: &LockName) {
        // Under `interop=redis-py` the second key is the default layout's lock key, which the
        // mode writes beside the peer's (no mode batches its renewals now: each checks that
        // key too, see `Interop::batched_renewals`).
        let suffix = match self.interop {
            Some(Interop::RedisPy) => "lock",
            _ => "holder",
        };
        push_key(out, &self.namespace, name, suffix);
    }

    /// Appends what the lock records as the owner of `token` (as `RedisLease::owner`: the
    /// token's hex, in locksmith's layout and redis-py's alike).
    fn push_owner(out: &mut String, token: &OwnerToken) {
        let _ = write!(out, "{token}");
    }
}

/// A client's renewal queue (single node only: the keys of one script call must live on one
/// server). Dropping the last handle ends its task.
#[derive(Clone)]
pub(crate) struct Renewals {
    tx: mpsc::UnboundedSender<Renewal>,
}

fn stopped() -> Error {
    Error::new(ErrorKind::Unavailable, "the renewal task stopped")
}

impl Renewals {
    pub(crate) fn start(conn: Conn, layout: Layout) -> Renewals {
        debug_assert!(layout.interop.is_none_or(Interop::batched_renewals));
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(conn, layout, rx));
        Renewals { tx }
    }

    /// Compare-and-`PEXPIRE` of the lock `name`, in the next batch: whether `token` still held
    /// it.
    ///
    /// Cancel safety: dropping the future leaves the renewal in its batch, which may or may not
    /// have extended the lock.
    pub(crate) async fn extend(
        &self,
        name: &LockName,
        token: OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Renewal {
                name: name.clone(),
                token,
                ttl,
                reply,
            })
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

async fn run(mut conn: Conn, layout: Layout, mut rx: mpsc::UnboundedReceiver<Renewal>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut call = ExtendMany::default();
    let mut buf = String::new();
    let mut last_sent: Option<tokio::time::Instant> = None;
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        if let Some(next) = last_sent.map(|at| at + MIN_GAP)
            && batch.len() < MAX_BATCH
            && batch.iter().all(|r| r.ttl >= GAP_MIN_TTL)
            && tokio::time::Instant::now() < next
        {
            tokio::time::sleep_until(next).await;
            while batch.len() < MAX_BATCH
                && let Ok(r) = rx.try_recv()
            {
                batch.push(r);
            }
        }
        last_sent = Some(tokio::time::Instant::now());
        write_call(&mut call, &mut buf, &layout, &batch);
        match call.query(&mut conn).await {
            Ok(held) if held.len() == batch.len() => {
                for (r, h) in batch.drain(..).zip(held) {
                    let _ = r.reply.send(Ok(h));
                }
            }
            Ok(held) => {
                let e = format!(
                    "a batched extend answered {} of {}",
                    held.len(),
                    batch.len()
                );
                for r in batch.drain(..) {
                    let _ = r.reply.send(Err(Error::new(ErrorKind::Backend, e.clone())));
                }
            }
            Err(e) => {
                for r in batch.drain(..) {
                    let _ = r.reply.send(Err(Error::new(e.kind(), e.to_string())));
                }
            }
        }
    }
}

/// Writes the call for `batch`: every lease's two keys, then every lease's owner and TTL, each
/// derived into `buf` and copied into the call.
fn write_call(call: &mut ExtendMany, buf: &mut String, layout: &Layout, batch: &[Renewal]) {
    call.start(batch.len());
    for r in batch {
        buf.clear();
        layout.push_lock_key(buf, &r.name);
        call.key(buf);
        buf.clear();
        layout.push_holder_key(buf, &r.name);
        call.key(buf);
    }
    for r in batch {
        buf.clear();
        Layout::push_owner(buf, &r.token);
        call.arg(buf, r.ttl);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_derives_the_keys_and_owner_of_the_lease() {
        for interop in [None, Some(Interop::RedisPy)] {
            let layout = Layout {
                namespace: "ns".into(),
                interop,
            };
            for name in ["a", "jobs/nightly {x} 100%", "é"] {
                let name = LockName::new(name).unwrap();
                let keys = match interop {
                    Some(peer) => peer.keys(&layout.namespace, &name),
                    None => crate::keys::Keys::new(&layout.namespace, &name),
                };
                let mut buf = String::new();
                layout.push_lock_key(&mut buf, &name);
                assert_eq!(buf, keys.lock);
                buf.clear();
                layout.push_holder_key(&mut buf, &name);
                assert_eq!(buf, keys.holder);
                let token = OwnerToken::random();
                let owner = match interop {
                    Some(peer) => peer.owner(&token),
                    None => token.to_hex(),
                };
                buf.clear();
                Layout::push_owner(&mut buf, &token);
                assert_eq!(buf, owner);
            }
        }
    }
}
