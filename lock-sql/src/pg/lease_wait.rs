//! PostgreSQL lease waiters: woken by LISTEN/NOTIFY (a release names the exclusive queue's
//! head, or the name for shared and permit waiters who announced themselves), or granted the
//! lock by the release itself (`handover=grant`, see `handover`), with a safety poll; a queued
//! waiter whose wait ends without the lock leaves the queue (and gives back a grant).

use std::sync::atomic::{AtomicU64, Ordering};

use super::handover::{self, Grant};
use super::lease::Ask;
use super::*;
use crate::config::Handover;
use crate::lease::SqlLease;

impl PgBackend {
    /// The release notifications (and revocation notices), started at connect under the lease
    /// strategy or else on first use; while LISTEN fails (the database is unreachable),
    /// waiters poll and the next wait tries again.
    pub(super) async fn wakeups(&self, bound: Instant) -> Option<Arc<Wakeups>> {
        let started = self
            .wakeups
            .get_or_try_init(|| async {
                match tokio::time::timeout_at(bound, self.start_listener()).await {
                    Ok(Ok(w)) => Ok(Arc::new(w)),
                    Ok(Err(e)) => Err(self.config.scrub(e.to_string())),
                    Err(_) => Err("timed out".to_owned()),
                }
            })
            .await;
        match started {
            Ok(w) => Some(w.clone()),
            Err(e) => {
                tracing::warn!(error = %e, "LISTEN failed; lease waiters poll for now");
                None
            }
        }
    }

    pub(super) async fn start_listener(&self) -> sqlx::Result<Wakeups> {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(self.config.op_timeout)
            .connect_lazy_with(self.listen_opts.clone());
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.listen(&self.config.table).await?;
        let revocations = self.held.revocations.clone();
        revocations.listen();
        let (tx, _) = broadcast::channel(256);
        let (stop, mut stopped) = oneshot::channel::<()>();
        let fanout = tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    r = listener.try_recv() => match r {
                        Ok(Some(n)) => match revocation::revoked_tokens(n.payload()) {
                            Some(tokens) => { revocations.revoked(tokens); }
                            None => { let _ = fanout.send(Some(Arc::from(n.payload()))); }
                        },
                        // Reconnected: notifications may have been missed.
                        Ok(None) => { let _ = fanout.send(None); }
                        Err(_) => {
                            let _ = fanout.send(None);
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                }
            }
        });
        Ok(Wakeups { tx, _stop: stop })
    }

    /// Announces a shared or permit waiter on `name` until `until` (releases then notify the
    /// name), with a queue entry as long (counted by `queued_waiters`).
    pub(super) async fn mark_waiting(
        &self,
        req: &AcquireRequest,
        until: Duration,
        bound: Instant,
    ) -> Result<()> {
        let sql = self.sql.lease_wait_mark.clone();
        let name = req.name.as_str().to_owned();
        let token = req.token.to_hex();
        let us = until.as_micros() as f64;
        self.conns
            .run(bound, "announcing a lease waiter", move |c| {
                sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(name.clone())
                    .bind(us)
                    .bind(token.clone())
                    .execute(c)
                    .map(|r| r.map(|_| ()))
                    .boxed()
            })
            .await
    }

    /// Waits for a lease: tries, then sleeps until a release NOTIFY for this name, the holder's
    /// expiry (as the database computed it), a capped safety poll, or the deadline. Every
    /// statement is bounded by the deadline and the operation timeout.
    pub(super) async fn lease_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        // Uncontended fast path: a free lock is taken before the listener is set up (its own
        // connection and LISTEN cost round trips, and on a busy machine a first wait's whole
        // deadline: a report's process client once timed out on a free lock).
        // Only while the listener is not up: once it is, the attempt after subscribing is the
        // first and only one (no extra round trip for a contended wait).
        if self.wakeups.get().is_none() {
            match self
                .lease_attempt(req, self.conns.bound_by(deadline), true, false, None, None)
                .await
            {
                Ok((Some(acquired), _, _)) => return Ok(Some(acquired)),
                Ok((None, _, _)) => {}
                Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        let wakeups = self.wakeups(self.conns.bound_by(deadline)).await;
        // Subscribed before the first attempt, so a release between an attempt and the sleep
        // is not missed.
        let mut rx = wakeups.as_ref().map(|w| w.tx.subscribe());
        // Exclusive waiters queue on the server (FIFO): a release notifies the head alone, by
        // its token. The entry is removed when this wait ends without the lock (a deadline, an
        // error, a dropped future), in the background; an exclusive attempt that wins removes
        // it itself. A shared or permit waiter's entry (made with its mark) goes in the
        // background whichever way its wait ends.
        let queued = req.mode == LockMode::Exclusive;
        // handover=grant: each queued attempt leaves its number in the entry, and a release
        // may grant this waiter the lock, naming the attempt (only to a renewed lease: the
        // claim alone would be its validity). Numbers from `first_ask` on are this wait's.
        let grants =
            queued && rx.is_some() && req.renewed && self.config.handover == Handover::Grant;
        let claim = handover::claim(req.ttl);
        // A grant gives this token the lock before its lease exists: a revocation notice naming
        // it meanwhile (the listener handles it before this waiter hears of the grant) fires
        // this request's lost signal. Handed on to the lease once won; dropped (unregistered)
        // when the wait ends without it.
        let mut revocable = if grants {
            self.held
                .revocations
                .watch_until_dropped(req.token.uuid().as_u128(), req.lost.reporter())
        } else {
            None
        };
        let first_ask = handover::next_ask();
        let last_ask = Arc::new(AtomicU64::new(first_ask));
        // The number of the last refused attempt and when it was sent.
        let mut refused: Option<(u64, Instant)>;
        let in_flight = Arc::new(tokio::sync::Mutex::new(()));
        let dequeue = CleanUpIfCancelled::arm(
            Dequeue {
                in_flight: in_flight.clone(),
                conns: self.conns.clone(),
                sql: self.sql.clone(),
                table: self.config.table.clone(),
                name: req.name.as_str().to_owned(),
                token: req.token.to_hex(),
                asks: (first_ask, last_ask.clone()),
            },
            &req.background,
        );
        let called_token = req.token.to_hex();
        let called = format!("{WAITER_PREFIX}{called_token}");
        let backoff = lockcore::backend::Backoff::for_ttl(req.ttl);
        let mut attempt = 0u32;
        let mut marked_until: Option<Instant> = None;
        let mut entered = false;
        loop {
            let bound = self.conns.bound_by(deadline);
            let ask = grants.then(|| Ask {
                number: handover::next_ask(),
                claim,
            });
            if let Some(a) = ask {
                last_ask.store(a.number, Ordering::Release);
            }
            let sent = Instant::now();
            let (acquired, remaining, behind) = match self
                .lease_attempt(req, bound, true, queued, ask, Some(&in_flight))
                .await
            {
                Ok(r) => r,
                Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
                Err(e) => return Err(e),
            };
            if acquired.is_some() {
                if queued {
                    dequeue.disarm();
                }
                if let Some(w) = revocable.take() {
                    w.hand_on();
                }
                return Ok(acquired);
            }
            refused = ask.map(|a| (a.number, sent));
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            // An attempt that entered the queue counted every entry as ahead of it; waiters
            // entering at once would each wait for the others, and a release that came before
            // the entry named nobody: look again, now in the queue (the head then takes a
            // free lock).
            if queued && !entered {
                entered = true;
                continue;
            }
            // Shared and permit waiters announce themselves (releases then notify the name);
            // an exclusive waiter's queue entry is its announcement.
            if !queued && rx.is_some() && marked_until.is_none_or(|m| m <= now + SAFETY_POLL) {
                let horizon = deadline.map_or(WAIT_MARK, |d| (d - now).min(WAIT_MARK))
                    + Duration::from_secs(1);
                match self
                    .mark_waiting(req, horizon, self.conns.bound_by(deadline))
                    .await
                {
                    Ok(()) => marked_until = Some(now + horizon),
                    Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
                    Err(e) => return Err(e),
                }
                // A release between the attempt and the mark sent no notification.
                continue;
            }
            // Seen held after subscribing and marking: a release from now on wakes this waiter.
            req.waiting.mark();
            // Behind another waiter: only a safety net (the head is told); the head itself
            // polls as before, since a release racing its entry may have named nobody.
            let cap = if rx.is_some() && queued && behind {
                QUEUE_POLL
            } else if rx.is_some() {
                SAFETY_POLL
            } else {
                backoff.delay(attempt)
            };
            let mut wake = now + remaining.map_or(cap, |r| (r + Duration::from_millis(1)).min(cap));
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            attempt = attempt.saturating_add(1);
            match rx.as_mut() {
                None => tokio::time::sleep_until(wake).await,
                Some(rx) => loop {
                    tokio::select! {
                        m = rx.recv() => match m {
                            Ok(Some(n)) if n.starts_with(handover::GRANT_PREFIX) => {
                                match handover::grant_of(&n) {
                                    Some(g) if g.token == called_token => {
                                        if let Some(a) = self.granted(req, &g, refused) {
                                            dequeue.disarm();
                                            if let Some(w) = revocable.take() {
                                                w.hand_on();
                                            }
                                            return Ok(Some(a));
                                        }
                                        // An earlier attempt's grant, or too old to hold on:
                                        // the next attempt wins the row if it is still ours.
                                        break;
                                    }
                                    _ => continue,
                                }
                            }
                            Ok(Some(n)) if &*n == req.name.as_str() || *n == *called => break,
                            Ok(Some(_)) => continue,
                            Ok(None) | Err(broadcast::error::RecvError::Lagged(_)) => break,
                            Err(broadcast::error::RecvError::Closed) => {
                                tokio::time::sleep_until(wake).await;
                                break;
                            }
                        },
                        _ = tokio::time::sleep_until(wake) => break,
                    }
                },
            }
        }
    }
}

impl PgBackend {
    /// The lease a grant gives (`handover=grant`): the release that granted it read the entry
    /// the waiter's last refused attempt `refused` (its number, its send) left, so it ran
    /// after that attempt reached the server, and the claim's validity counts from that send
    /// (see `handover`). `None` when the grant names another attempt (a later one was refused
    /// since, so the claim may be gone), or when less than a third of the claim is left (the
    /// waiter then attempts again, which wins the row if it is still its own).
    fn granted(
        &self,
        req: &AcquireRequest,
        grant: &Grant<'_>,
        refused: Option<(u64, Instant)>,
    ) -> Option<Acquired> {
        let (number, sent) = refused?;
        if grant.ask != number {
            return None;
        }
        let claim = handover::claim(req.ttl);
        crate::capabilities::capabilities(&self.config).granted_until(sent, claim)?;
        let lease = SqlLease::of(&self.held, req).with_fencing(grant.fence);
        Some(Acquired::new(lease, sent).with_granted_ttl(claim))
    }
}

/// The clean-up of a queued exclusive lease waiter whose wait ended without the lock: its
/// queue entry removed, the lock given back if a release granted it to this wait meanwhile
/// (to the next head), and otherwise the next waiter named if the lock is free (this one may
/// have been woken as the head and gone).
struct Dequeue {
    /// Locked by each attempt until it is answered: a cancelled wait's attempt runs on
    /// detached and may still enter the queue, so the removal waits for it.
    in_flight: Arc<tokio::sync::Mutex<()>>,
    conns: Arc<PgConns>,
    sql: Arc<Sql>,
    table: String,
    name: String,
    token: String,
    /// The numbers of this wait's attempts: from the first, to the last one's (read once the
    /// attempts are done). A grant answering another (a later wait of the same request) is
    /// not this wait's to give back.
    asks: (u64, Arc<AtomicU64>),
}

impl CancelCleanUp for Dequeue {
    fn start(self) -> Option<CleanUpTask> {
        Some(Box::pin(async move {
            let Dequeue {
                in_flight,
                conns,
                sql,
                table,
                name,
                token,
                asks,
            } = self;
            let _after = in_flight.lock_owned().await;
            let (first, last) = (asks.0 as i64, asks.1.load(Ordering::Acquire) as i64);
            let stmt = sql.lease_dequeue.clone();
            let done: Result<i64> = conns
                .run(conns.bound(), "leaving the lease queue", move |c| {
                    sqlx::query_scalar(AssertSqlSafe(stmt.clone()))
                        .bind(name.clone())
                        .bind(token.clone())
                        .bind(table.clone())
                        .bind(first)
                        .bind(last)
                        .fetch_one(c)
                        .boxed()
                })
                .await;
            if let Err(e) = done {
                tracing::debug!(error = %e, "removing a lease waiter's queue entry failed; it expires on its own");
            }
        }))
    }
}
