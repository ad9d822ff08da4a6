//! The lock recipe (Curator's protected-mode lock, its read-write lock's readers, permits): an
//! EPHEMERAL_SEQUENTIAL contender node named by the owner token and the mode; a writer holds
//! at the lowest sequence and watches its immediate predecessor, a reader holds with no writer
//! lower and watches the last lower one, a permit holds with fewer than its limit lower and
//! watches the `limit` nodes before it (see `contenders::standing`); a create whose reply was
//! lost is found again by the owner token; an acquisition that ends without the lock deletes
//! its node (in the background when the call is dropped).

use std::sync::Arc;

use lockcore::backend::{
    AcquireRequest, Acquired, Background, CancelCleanUp, CleanUpIfCancelled, CleanUpTask,
};
use lockcore::{Error, Instant, Result};
use zookeeper_client as zk;

use crate::backend::{MAX_FOREIGN, ZkBackend, queue};
use crate::contenders::{self, Role, Standing};
use crate::errors::{RETRY_PAUSE, ZkResult, is_retryable, is_session_end, map_err, retry};
use crate::lease::ZkLease;
use crate::session::Session;
use crate::stats::{GaugeUnit, bump};

impl ZkBackend {
    /// The recipe, retried on a new session when the session ends (the caller bounds the
    /// wait by dropping the future; the contender clean-up then deletes the node).
    pub(crate) async fn run(
        &self,
        req: &AcquireRequest,
        wait: bool,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        self.check_name(&req.name)?;
        loop {
            let session = self.live_session(deadline).await?;
            match self.attempt(&session, req, wait).await? {
                Attempt::Won(a) => return Ok(Some(a)),
                Attempt::Busy => return Ok(None),
                Attempt::SessionEnded => {
                    tracing::debug!(
                        "zookeeper session ended during an acquisition; retrying on the next one"
                    );
                }
            }
        }
    }

    /// One acquisition on one session. `wait == false`: one attempt (the node is deleted
    /// again if not lowest).
    pub(crate) async fn attempt(
        &self,
        session: &Arc<Session>,
        req: &AcquireRequest,
        wait: bool,
    ) -> Result<Attempt> {
        let parent = self.parent_path(&req.name);
        let client = &session.client;
        let interop = self.inner.config.interop;
        let name_prefix = interop
            .node_prefix(&req.token.to_hex(), req.mode)
            .ok_or_else(|| {
                Error::unsupported(format!(
                    "interop={} has no node name for {}",
                    interop.as_str(),
                    req.mode
                ))
            })?;
        let mut contender = CleanUpIfCancelled::arm(
            ContenderCleanUp {
                client: client.clone(),
                parent: parent.clone(),
                name_prefix,
                state: ContenderState::Creating,
            },
            &req.background,
        );
        // Children first: on a held lock, one read and no write. Skipped where this client's
        // last acquisition won (it mostly finds the lock free again: create at once).
        if !wait && !self.recent_wins().contains(&parent) {
            match client.list_children(&parent).await {
                Ok(children) => {
                    let ahead: Vec<Role> = {
                        let foreign = self.foreign();
                        queue(&children, &parent, &foreign)
                            .iter()
                            .map(|(_, n)| contenders::role(n))
                            .collect()
                    };
                    match contenders::standing(&ahead, req.mode) {
                        Standing::Holds => {}
                        Standing::Conflict(why) => {
                            contender.disarm();
                            return Err(Error::conflict(why));
                        }
                        Standing::Waits(_) => {
                            contender.disarm();
                            return Ok(Attempt::Busy);
                        }
                    }
                }
                Err(zk::Error::NoNode) => {}
                Err(e) if is_retryable(&e) => {}
                Err(e) if is_session_end(&e) => return Ok(Attempt::SessionEnded),
                Err(e) => return Err(map_err(format!("listing {parent}"), e)),
            }
        }
        'create: loop {
            // Taken before the requests that may prove us the holder.
            let mut sent_at = Instant::now();
            let (created, listed) = self
                .create_and_list(client, &parent, &contender, req.holder.encode().as_bytes())
                .await;
            let mut mine: Option<(String, Option<i64>)> = None;
            match created {
                Ok((stat, seq)) => {
                    bump(&self.inner.stats.nodes_created);
                    let name = format!("{}{seq}", contender.name_prefix);
                    contender.state = ContenderState::Created(format!("{parent}/{name}"));
                    mine = Some((name, Some(stat.czxid)));
                }
                Err(zk::Error::NoNode) => {
                    self.ensure_parent(client, &parent).await?;
                    continue 'create;
                }
                // Applied or not: the listing below finds the node by the owner token.
                Err(e) if is_retryable(&e) => {}
                Err(e) if is_session_end(&e) => return Ok(Attempt::SessionEnded),
                Err(e) => {
                    return Err(map_err(
                        format!("creating a contender node under {parent}"),
                        e,
                    ));
                }
            }
            let mut listed = Some(listed);
            loop {
                let listing = match listed.take() {
                    Some(Err(e)) if is_retryable(&e) => {
                        sent_at = Instant::now();
                        retry(|| client.list_children(&parent)).await
                    }
                    Some(r) => r,
                    None => {
                        sent_at = Instant::now();
                        retry(|| client.list_children(&parent)).await
                    }
                };
                let children = match listing {
                    Ok(c) => c,
                    // The parent is gone (a container the server removed once it was empty,
                    // e.g. while our create's reply was lost): no node of ours can be under it,
                    // since an ephemeral child keeps its parent. Queue again under a new one.
                    Err(zk::Error::NoNode) => {
                        if session.ended() {
                            return Ok(Attempt::SessionEnded);
                        }
                        contender.state = ContenderState::Creating;
                        self.ensure_parent(client, &parent).await?;
                        continue 'create;
                    }
                    Err(e) => return self.list_failed(&parent, e),
                };
                let (node, q) = {
                    let foreign = self.foreign();
                    let q: Vec<(i64, String)> = queue(&children, &parent, &foreign)
                        .into_iter()
                        .map(|(s, n)| (s, n.to_owned()))
                        .collect();
                    (self.own_node(&q, &contender, &req.background, &mut mine), q)
                };
                let Some(node_name) = node else {
                    // No node of ours: the create was not applied, or the node vanished
                    // (revoked by an operator, or the session expired). Queue again.
                    if session.ended() {
                        return Ok(Attempt::SessionEnded);
                    }
                    contender.state = ContenderState::Creating;
                    continue 'create;
                };
                let path = format!("{parent}/{node_name}");
                contender.state = ContenderState::Created(path.clone());
                let pos = q
                    .iter()
                    .position(|(_, n)| *n == node_name)
                    .expect("own node is in the queue");
                let ahead: Vec<Role> = q[..pos].iter().map(|(_, n)| contenders::role(n)).collect();
                let targets = match contenders::standing(&ahead, req.mode) {
                    // The guard deletes the node.
                    Standing::Conflict(why) => return Err(Error::conflict(why)),
                    Standing::Holds => {
                        let czxid = match &mine {
                            Some((_, Some(czxid))) => *czxid,
                            // Recovered after a lost reply: read its creation zxid.
                            _ => match retry(|| client.check_stat(&path)).await {
                                Ok(Some(stat)) => stat.czxid,
                                Ok(None) => continue,
                                Err(e) if is_session_end(&e) => {
                                    return Ok(Attempt::SessionEnded);
                                }
                                Err(e) => return Err(map_err(format!("reading {path}"), e)),
                            },
                        };
                        contender.disarm();
                        return Ok(Attempt::Won(self.won(session, req, path, czxid, sent_at)));
                    }
                    Standing::Waits(targets) => targets,
                };
                if !wait {
                    // The guard deletes the node (sent at once, retried in the background).
                    self.note_outcome(&parent, false);
                    return Ok(Attempt::Busy);
                }
                // Every watch is sent before any reply is awaited: one round trip for all.
                let watched: Vec<String> = targets
                    .iter()
                    .map(|&i| format!("{parent}/{}", q[i].1))
                    .collect();
                let replies = futures::future::join_all(
                    watched.iter().map(|p| client.check_and_watch_stat(p)),
                )
                .await;
                let mut watchers = Vec::with_capacity(replies.len());
                // A node gone or a lost reply: list again. Only forged nodes skipped: the
                // listing in hand still serves.
                let (mut relist, mut forged, mut pause) = (false, false, false);
                for ((reply, &i), predecessor) in replies.into_iter().zip(&targets).zip(&watched) {
                    match reply {
                        // Gone before the watch was set: look again.
                        Ok((None, _)) => relist = true,
                        Ok((Some(stat), _))
                            if contenders::cannot_hold(
                                &q[i].1,
                                stat.ephemeral_owner,
                                stat.czxid,
                                mine.as_ref().and_then(|(_, czxid)| *czxid),
                            ) =>
                        {
                            // Not a contender: someone made a node with a contender's name (see
                            // `cannot_hold`). Never wait on it (it would never go away).
                            tracing::warn!(path = %predecessor, "ignoring a forged node with a contender's name");
                            bump(&self.inner.stats.foreign_ignored);
                            let mut foreign = self.foreign();
                            if foreign.len() >= MAX_FOREIGN {
                                foreign.clear();
                            }
                            foreign.insert(predecessor.clone());
                            forged = true;
                        }
                        Ok((Some(_), watcher)) => watchers.push((i, watcher)),
                        Err(e) if is_retryable(&e) => (relist, pause) = (true, true),
                        Err(e) if is_session_end(&e) => return Ok(Attempt::SessionEnded),
                        Err(e) => return Err(map_err(format!("watching {predecessor}"), e)),
                    }
                }
                if pause {
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                if relist || forged {
                    if !relist {
                        listed = Some(Ok(children));
                    }
                    continue;
                }
                // Queued and watching: the going of a node it waits for wakes this waiter.
                req.waiting.mark();
                let waiting = GaugeUnit::new(&self.inner.stats.waiting);
                let (gone, event) = futures::future::select_all(
                    watchers
                        .into_iter()
                        .map(|(i, w)| Box::pin(async move { (i, w.changed().await) })),
                )
                .await
                .0;
                drop(waiting);
                bump(&self.inner.stats.watch_wakeups);
                match event.event_type {
                    zk::EventType::NodeDeleted => {
                        // Nodes created later sort after ours, and fewer ahead never makes a
                        // contender wait longer: when the queue without the node gone lets it
                        // hold, the lock is ours without listing again. The TTL counts from
                        // now (the server keeps the node for the session, so no server-side
                        // clock runs on it).
                        let mut rest = ahead;
                        rest.remove(gone);
                        if contenders::standing(&rest, req.mode) == Standing::Holds
                            && let Some((_, Some(czxid))) = mine
                        {
                            contender.disarm();
                            return Ok(Attempt::Won(self.won(
                                session,
                                req,
                                path,
                                czxid,
                                Instant::now(),
                            )));
                        }
                    }
                    zk::EventType::Session if event.session_state.is_terminated() => {
                        return Ok(Attempt::SessionEnded);
                    }
                    // Another event (a reconnection, a data change): look again.
                    _ => {}
                }
            }
        }
    }

    pub(crate) fn list_failed(&self, parent: &str, e: zk::Error) -> Result<Attempt> {
        if is_session_end(&e) {
            Ok(Attempt::SessionEnded)
        } else {
            Err(map_err(format!("listing {parent}"), e))
        }
    }

    /// Sends the create and, right behind it, the listing of the parent: the server handles
    /// a session's requests in order, so the listing sees the new node, and both cost one
    /// round trip.
    pub(crate) async fn create_and_list(
        &self,
        client: &zk::Client,
        parent: &str,
        contender: &ContenderCleanUp,
        data: &[u8],
    ) -> (
        ZkResult<(zk::Stat, zk::CreateSequence)>,
        ZkResult<Vec<String>>,
    ) {
        let prefix = format!("{parent}/{}", contender.name_prefix);
        let opts = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        // The node's data is the holder's metadata, read by `inspect`.
        let create = client.create(&prefix, data, &opts);
        let list = client.list_children(parent);
        let (created, listed) = tokio::join!(create, list);
        #[cfg(test)]
        let created = match created {
            Ok(_)
                if self
                    .inner
                    .drop_next_create_reply
                    .swap(false, std::sync::atomic::Ordering::SeqCst) =>
            {
                Err(zk::Error::ConnectionLoss)
            }
            other => other,
        };
        (created, listed)
    }

    /// This contender's node in the queue `q`: every child with the caller's owner prefix is
    /// its own (a retried create may have made a second one after a lost reply); the lowest is
    /// kept and the others deleted, so the contender never waits on its own node. `mine` is
    /// the node known to be ours (name, creation zxid when known); it becomes the one kept.
    pub(crate) fn own_node(
        &self,
        q: &[(i64, String)],
        contender: &ContenderCleanUp,
        background: &Background,
        mine: &mut Option<(String, Option<i64>)>,
    ) -> Option<String> {
        let mut own = q
            .iter()
            .filter(|(_, n)| n.starts_with(&contender.name_prefix));
        let (_, keep) = own.next()?;
        for (_, extra) in own {
            bump(&self.inner.stats.duplicates_removed);
            tracing::debug!(node = %extra, "deleting a second node of one contender");
            let path = format!("{}/{extra}", contender.parent);
            let client = contender.client.clone();
            let delete = client.delete(&path, None);
            background.spawn(async move {
                if let Err(e) = delete.await
                    && is_retryable(&e)
                {
                    let _ = retry(|| client.delete(&path, None)).await;
                }
            });
        }
        if !matches!(mine, Some((name, _)) if name == keep) {
            bump(&self.inner.stats.creates_recovered);
            tracing::debug!(node = %keep, "recovered a create whose reply was lost");
            *mine = Some((keep.clone(), None));
        }
        Some(keep.clone())
    }

    pub(crate) fn won(
        &self,
        session: &Arc<Session>,
        req: &AcquireRequest,
        path: String,
        czxid: i64,
        sent_at: Instant,
    ) -> Acquired {
        let id = session.register(req.lost.clone(), &self.inner.stats);
        self.watch_own_node(session, &path, id);
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.note_outcome(parent, true);
        }
        let lease = ZkLease {
            backend: self.clone(),
            session: session.clone(),
            id,
            path,
            czxid,
        };
        Acquired::new(lease, sent_at)
    }
}

impl ZkBackend {
    /// Watches the node of held lease `id`: deleted behind its holder (an operator's force
    /// release), the lease's lost signal fires when the server tells, not at the next renewal.
    /// One request (the watch rides on an `exists`), and a task that ends when the node goes
    /// (the holder's own release included, which has unregistered the lease first) or the
    /// session ends (the session task reports that).
    fn watch_own_node(&self, session: &Arc<Session>, path: &str, id: u64) {
        let (session, backend, path) = (session.clone(), self.clone(), path.to_owned());
        // Counted before the task starts: a caller that sees the grant sees the watch.
        bump(&self.inner.stats.node_watches);
        tokio::spawn(async move {
            let _watch = GaugeUnit::adopt(&backend.inner.stats.node_watches);
            let gone = match session.client.check_and_watch_stat(&path).await {
                Ok((Some(_), watcher)) => {
                    watcher.changed().await.event_type == zk::EventType::NodeDeleted
                }
                // Already gone: revoked at once, or released (then no longer registered).
                Ok((None, _)) => true,
                // The session's trouble: its task reports the loss; renewals check the node.
                Err(_) => false,
            };
            if gone {
                session.revoked(id, &backend.inner.stats);
            }
        });
    }
}

pub(crate) enum Attempt {
    Won(Acquired),
    Busy,
    SessionEnded,
}

/// Where a contender stands, for the clean-up when its acquisition ends without the lock.
#[derive(Debug)]
pub(crate) enum ContenderState {
    /// A create may be in flight: clean up by owner token.
    Creating,
    /// Our node exists at this path.
    Created(String),
}

/// Deletes the contender's node when an acquisition ends without the lock (cancelled, timed
/// out, failed, busy): armed in a [`CleanUpIfCancelled`], disarmed when the lock is won. The
/// delete is sent from `drop` (the client sends requests in call order); its retries run on
/// the request's [`Background`], which `Locker::flush` waits for.
pub(crate) struct ContenderCleanUp {
    pub(crate) client: zk::Client,
    pub(crate) parent: String,
    pub(crate) name_prefix: String,
    pub(crate) state: ContenderState,
}

impl CancelCleanUp for ContenderCleanUp {
    fn start(self) -> Option<CleanUpTask> {
        let client = self.client;
        match self.state {
            ContenderState::Created(path) => {
                let first = client.delete(&path, None);
                Some(Box::pin(async move {
                    if let Err(e) = first.await
                        && is_retryable(&e)
                    {
                        let _ = retry(|| client.delete(&path, None)).await;
                    }
                }))
            }
            ContenderState::Creating => {
                let (parent, prefix) = (self.parent, self.name_prefix);
                // Listed after the create was sent, so the list sees its node if it was made.
                // (get_children's future owns its request; list_children's borrows the client.)
                let list = client.get_children(&parent);
                Some(Box::pin(async move {
                    let children = match list.await {
                        Ok((c, _)) => c,
                        Err(e) if is_retryable(&e) => {
                            match retry(|| client.list_children(&parent)).await {
                                Ok(c) => c,
                                Err(_) => return,
                            }
                        }
                        Err(_) => return,
                    };
                    for child in children.iter().filter(|c| c.starts_with(&prefix)) {
                        let path = format!("{parent}/{child}");
                        let _ = retry(|| client.delete(&path, None)).await;
                    }
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use lockcore::backend::Backend;

    use super::*;

    /// Protection mode: a create applied by the server whose reply is lost is found again by
    /// the owner token, leaving exactly one node.
    #[tokio::test]
    async fn lost_create_reply_is_recovered() {
        let Some(url) = conformance::require_env("LOCK_TEST_ZK_URL") else {
            return;
        };
        let backend = ZkBackend::connect(&url).await.unwrap();
        let name = lockcore::LockName::new(format!("protect-{}", fastrand_suffix())).unwrap();
        let req = AcquireRequest::new(
            name.clone(),
            lockcore::OwnerToken::random(),
            Duration::from_secs(10),
        );
        backend
            .inner
            .drop_next_create_reply
            .store(true, Ordering::SeqCst);
        let acquired = backend.try_acquire(&req).await.unwrap().expect("free lock");
        assert_eq!(backend.stats().creates_recovered, 1);
        let parent = backend.parent_path(&name);
        let kids = backend.client().list_children(&parent).await.unwrap();
        assert_eq!(kids.len(), 1, "{kids:?}");
        assert!(kids[0].contains(&req.token.to_hex()));
        acquired.lease.release().await.unwrap();
    }

    fn fastrand_suffix() -> String {
        format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        )
    }
}
