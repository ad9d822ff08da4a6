//! Renewals that fall due together go out as one script call: with many leases on one client,
//! one compare-and-`PEXPIRE` per lease per renewal costs a script call and a reply each; a batch
//! costs one. One batch is in flight at a time and the next one takes whatever queued meanwhile
//! (up to [`MAX_BATCH`]), so a lone renewal goes out at once and waits for no timer.

use std::time::Duration;

use lockcore::{Error, ErrorKind, Result};
use tokio::sync::{mpsc, oneshot};

use crate::conn::Conn;
use crate::node::{self, Keys};

/// Leases per script call at most: keeps one call's time on the server short (Redis runs one
/// script at a time).
const MAX_BATCH: usize = 512;

struct Renewal {
    /// The lock key and its holder-metadata key (extended together).
    key: String,
    holder: String,
    token: String,
    ttl: Duration,
    reply: oneshot::Sender<Result<bool>>,
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
    pub(crate) fn start(conn: Conn) -> Renewals {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(conn, rx));
        Renewals { tx }
    }

    /// Compare-and-`PEXPIRE` of one lock, in the next batch: whether `token` still held it.
    ///
    /// Cancel safety: dropping the future leaves the renewal in its batch, which may or may not
    /// have extended the lock.
    pub(crate) async fn extend(&self, keys: Keys, token: String, ttl: Duration) -> Result<bool> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Renewal {
                key: keys.lock,
                holder: keys.holder,
                token,
                ttl,
                reply,
            })
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

async fn run(mut conn: Conn, mut rx: mpsc::UnboundedReceiver<Renewal>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let items: Vec<(&str, &str, &str, Duration)> = batch
            .iter()
            .map(|r| (r.key.as_str(), r.holder.as_str(), r.token.as_str(), r.ttl))
            .collect();
        match node::extend_many(&mut conn, &items).await {
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
