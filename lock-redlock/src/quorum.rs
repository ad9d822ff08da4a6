//! The quorum machinery: one request on every master at once, answers counted until a
//! majority is reached or out of reach, late answers drained in the background, an attempt
//! undone on the masters that may hold its key.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lock_redis::node::{self, Conn, Keys};
use lockcore::backend::Background;
use lockcore::{Error, ErrorKind, Result};

use crate::backend::Inner;
use crate::subscriptions::release_message;

pub(crate) type NodeFuture<T> = Pin<Box<dyn Future<Output = (usize, Result<T>)> + Send>>;

/// How a failed attempt undoes its keys.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undo {
    /// Owner-checked delete that publishes (waiters re-check).
    Release,
    /// Owner-checked `PEXPIRE 1` (a share: its expiry set 1 ms ahead): gone within a
    /// millisecond, wakes nobody.
    Silent,
}

impl Inner {
    /// Runs `op` on every node at once (told the node's index), each bounded by `timeout`; a
    /// node that is not connected answers `Unavailable` at once.
    pub(crate) fn per_node<T, F, Fut>(
        &self,
        timeout: Duration,
        op: F,
    ) -> FuturesUnordered<NodeFuture<T>>
    where
        T: Send + 'static,
        F: Fn(usize, Conn) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, slot)| -> NodeFuture<T> {
                match slot.get() {
                    Some(node) => {
                        let fut = op(i, node.conn());
                        Box::pin(async move {
                            let r = match tokio::time::timeout(timeout, fut).await {
                                Ok(r) => r,
                                Err(_) => Err(Error::new(
                                    ErrorKind::Unavailable,
                                    format!("a Redis master did not answer within {timeout:?}"),
                                )),
                            };
                            (i, r)
                        })
                    }
                    None => Box::pin(async move {
                        (
                            i,
                            Err(Error::new(
                                ErrorKind::Unavailable,
                                "a Redis master is not connected (reconnecting)",
                            )),
                        )
                    }),
                }
            })
            .collect()
    }

    /// Lets the answers still in flight finish in the background.
    pub(crate) fn drain<T: Send + 'static>(
        &self,
        pending: FuturesUnordered<NodeFuture<T>>,
        background: &Background,
    ) {
        if !pending.is_empty() {
            background.spawn(async move {
                pending.for_each(|_| async {}).await;
            });
        }
    }

    /// Undoes an attempt's keys on `targets`: its lock key, or with `shared` its reader's
    /// share (owner-checked either way).
    pub(crate) async fn undo(
        self: Arc<Self>,
        keys: Arc<Keys>,
        token: Arc<str>,
        targets: Vec<usize>,
        (how, shared): (Undo, bool),
        ttl: Duration,
    ) {
        let message: Arc<str> = release_message().into();
        let futs: FuturesUnordered<_> = targets
            .into_iter()
            .filter_map(|i| self.slots[i].get())
            .map(|node| {
                let (keys, token, message) = (keys.clone(), token.clone(), message.clone());
                // Bounded, but longer than one vote: an undo lost here leaves a key until its
                // TTL.
                let timeout = self.cfg.node_timeout(ttl) * 4;
                async move {
                    let mut c = node.conn();
                    let op = async {
                        let gone = Duration::from_millis(1);
                        match (how, shared) {
                            (Undo::Release, false) => {
                                node::release_announced(&mut c, &keys, &token, &message).await
                            }
                            (Undo::Release, true) => {
                                node::release_share_announced(&mut c, &keys, &token, &message).await
                            }
                            (Undo::Silent, false) => {
                                node::extend(&mut c, &keys, &token, gone).await
                            }
                            (Undo::Silent, true) => {
                                node::extend_share(&mut c, &keys, &token, gone).await
                            }
                        }
                    };
                    if let Ok(Err(e)) = tokio::time::timeout(timeout, op).await {
                        tracing::debug!(error = %e, "undoing a redlock attempt on a master failed");
                    }
                }
            })
            .collect();
        futs.for_each(|_| async {}).await;
    }

    pub(crate) fn no_majority<T>(
        &self,
        answered: usize,
        results: impl Iterator<Item = (usize, Result<T>)>,
    ) -> Error {
        let msg = format!(
            "only {answered} of {} Redis masters answered, a majority ({}) is needed",
            self.slots.len(),
            self.quorum
        );
        match results.filter_map(|(_, r)| r.err()).last() {
            Some(e) => Error::unavailable(msg, e),
            None => Error::new(ErrorKind::Unavailable, msg),
        }
    }
}

/// Counts per-node answers of an owner-checked script until a majority said yes or can no
/// longer say it; the rest finish in the background.
pub(crate) async fn majority(
    inner: &Inner,
    mut pending: FuturesUnordered<NodeFuture<bool>>,
    background: &Background,
) -> std::result::Result<(), (usize, usize, Vec<(usize, Result<bool>)>)> {
    let n = inner.slots.len();
    let (mut yes, mut no) = (0, 0);
    let mut errors = Vec::new();
    while let Some((i, r)) = pending.next().await {
        match r {
            Ok(true) => yes += 1,
            Ok(false) => no += 1,
            Err(e) => errors.push((i, Err(e))),
        }
        if yes >= inner.quorum || no + errors.len() > n - inner.quorum {
            break;
        }
    }
    inner.drain(pending, background);
    if yes >= inner.quorum {
        Ok(())
    } else {
        Err((yes, no, errors))
    }
}

/// Neither a majority confirmed nor a majority refused: too many masters did not answer.
pub(crate) fn unconfirmed(
    inner: &Inner,
    yes: usize,
    no: usize,
    errors: Vec<(usize, Result<bool>)>,
) -> Error {
    let msg = format!(
        "{yes} of {} Redis masters confirmed, {no} no longer held the lease and {} did not \
         answer in time: a majority ({}) is needed",
        inner.slots.len(),
        errors.len(),
        inner.quorum
    );
    match errors.into_iter().filter_map(|(_, r)| r.err()).last() {
        Some(e) => Error::unavailable(msg, e),
        None => Error::new(ErrorKind::Unavailable, msg),
    }
}
