//! What the row-lock strategy shares between PostgreSQL and MySQL: the held lease (a connection
//! holding a session lock, watched by a health check: [`HealthChecks`]) and the per-name queue
//! that keeps this client's waiters for one name to a single server-side waiter.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use lockcore::backend::{Lease, LostNotifier};
use lockcore::{Error, Instant, LockName, LostReason, Result};
use tokio::sync::Mutex;

/// The connection that holds a lock, as the lease drives it.
#[lockcore::backend::async_trait]
pub(crate) trait Holding: Send + 'static {
    /// A round trip on the holding connection.
    async fn ping(&mut self) -> sqlx::Result<()>;
    /// Moves the server-side idle guard to `ttl + 1 s` (also proves the connection alive).
    async fn set_guard(&mut self, ttl: Duration) -> sqlx::Result<()>;
    /// Releases the lock; `Ok(false)` if the session did not hold it.
    async fn unlock(&mut self) -> sqlx::Result<bool>;
    /// The lock is released and the session clean: keep the connection for reuse.
    fn recycle(self: Box<Self>);
}

/// How long the server-side guard of a row-lock holder waits: the TTL plus one second.
pub(crate) fn guard_timeout(ttl: Duration) -> Duration {
    ttl + Duration::from_secs(1)
}

/// The state of a held row lock shared by the lease and its health check.
struct Held {
    /// The holding connection; `None` once released or lost.
    conn: Mutex<Option<Box<dyn Holding>>>,
    lost: LostNotifier,
    /// The TTL in force (the server-side guard is this + 1 s).
    ttl: std::sync::Mutex<Duration>,
    label: &'static str,
}

/// How often the health check pings a holding connection: the longest a holder takes to learn
/// that the server ended its session (an administrator's kill, a restart). A silent network
/// adds [`check_timeout`](crate::conns::check_timeout).
pub(crate) fn check_interval(ttl: Duration) -> Duration {
    (ttl / 4).clamp(Duration::from_millis(20), Duration::from_millis(500))
}

impl Held {
    fn ttl(&self) -> Duration {
        *self.ttl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pings the holding connection; on failure the lock is gone with it.
    async fn check(&self) -> bool {
        let mut slot = self.conn.lock().await;
        let Some(conn) = slot.as_mut() else {
            return false;
        };
        let limit = crate::conns::check_timeout(self.ttl());
        match tokio::time::timeout(limit, conn.ping()).await {
            Ok(Ok(())) => true,
            outcome => {
                tracing::warn!(
                    backend = self.label,
                    failed = ?outcome.map(|r| r.map_err(|e| e.to_string())),
                    "row-lock holding connection failed its health check; the lock is lost"
                );
                self.lost.fire(LostReason::ConnectionLost);
                // Dropped: the connection closes.
                slot.take();
                false
            }
        }
    }
}

/// A held row lock.
pub(crate) struct RowLease {
    held: Arc<Held>,
    name: LockName,
    /// `None` under `interop=` (the peer keeps no counter).
    fencing: Option<u64>,
}

impl fmt::Debug for RowLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowLease")
            .field("backend", &self.held.label)
            .field("name", &self.name)
            .field("fencing", &self.fencing)
            .finish()
    }
}

impl RowLease {
    /// Wraps the holding connection and hands it to the client's health checks, which ping it
    /// every [`check_interval`] until it is released (or dropped), and fire `ConnectionLost`
    /// when it fails.
    pub(crate) fn start(
        conn: Box<dyn Holding>,
        name: LockName,
        fencing: Option<u64>,
        ttl: Duration,
        lost: LostNotifier,
        (checks, label): (&Arc<HealthChecks>, &'static str),
    ) -> Self {
        let held = Arc::new(Held {
            conn: Mutex::new(Some(conn)),
            lost,
            ttl: std::sync::Mutex::new(ttl),
            label,
        });
        checks.watch(&held);
        RowLease {
            held,
            name,
            fencing,
        }
    }

    fn failed(&self, why: String) -> Error {
        Error::not_held(format!(
            "the row lock's connection failed ({why}); the server released the lock"
        ))
    }
}

#[lockcore::backend::async_trait]
impl Lease for RowLease {
    fn fencing_token(&self) -> Option<u64> {
        self.fencing
    }

    /// The lock lives as long as the connection: extending checks it is alive (a statement on
    /// it) and moves the server-side idle guard to `ttl + 1 s`.
    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        let mut slot = self.held.conn.lock().await;
        let Some(conn) = slot.as_mut() else {
            return Err(Error::not_held(
                "the row lock was released or its connection was lost",
            ));
        };
        let limit = crate::conns::check_timeout(ttl.max(self.held.ttl()));
        match tokio::time::timeout(limit, conn.set_guard(ttl)).await {
            Ok(Ok(())) => {
                *self.held.ttl.lock().unwrap_or_else(|e| e.into_inner()) = ttl;
                Ok(ttl)
            }
            outcome => {
                self.held.lost.fire(LostReason::ConnectionLost);
                slot.take();
                Err(self.failed(match outcome {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_owned(),
                }))
            }
        }
    }

    async fn release(&self) -> Result<()> {
        let Some(mut conn) = self.held.conn.lock().await.take() else {
            return Err(Error::not_held(
                "the row lock was released or its connection was lost",
            ));
        };
        let limit = crate::conns::check_timeout(self.held.ttl()) * 3;
        match tokio::time::timeout(limit, conn.unlock()).await {
            Ok(Ok(true)) => {
                conn.recycle();
                Ok(())
            }
            // Not ours on this session (cannot happen while the session lives): close it.
            Ok(Ok(false)) => Err(Error::not_held(
                "the session no longer held the lock; the server released it",
            )),
            outcome => Err(self.failed(match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => "timed out".to_owned(),
            })),
        }
    }
}

impl Drop for RowLease {
    /// Dropped without release (an abandoned guard, as a wedged process would leave it): the
    /// connection is kept open but silent, so the server-side guard ends the session after
    /// `ttl + 1 s`. A client-side backstop closes it well after that in any case.
    fn drop(&mut self) {
        let held = self.held.clone();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            let Some(conn) = held.conn.lock().await.take() else {
                return;
            };
            let guard = guard_timeout(held.ttl());
            tokio::time::sleep(guard * 2 + Duration::from_secs(10)).await;
            drop(conn);
        });
    }
}

/// The health checks of one client's held row locks: one task with a timer heap, which pings
/// each holding connection every [`check_interval`] (each ping a task of its own, so that a
/// silent connection delays no other). A task per lease cost every acquisition a spawn and
/// every release a wake-up; here an acquisition pushes onto the heap and wakes the task only
/// when its check falls due before the task's next wake-up (the first lease after an idle
/// spell). A released lease's entry stays until it falls due and is then dropped (its
/// connection is gone from it); the task ends when the heap is empty.
#[derive(Default)]
pub(crate) struct HealthChecks {
    state: std::sync::Mutex<ChecksState>,
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct ChecksState {
    due: BinaryHeap<Reverse<Due>>,
    seq: u64,
    /// The task is running (it ends when `due` is empty).
    running: bool,
    /// When the running task wakes up next by itself (`None`: only when notified).
    armed: Option<Instant>,
    /// What the due times are counted from (the first check queued), to round them.
    epoch: Option<Instant>,
}

/// A check that falls due at `at`.
struct Due {
    at: Instant,
    seq: u64,
    held: Weak<Held>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl HealthChecks {
    /// Checks `held` one [`check_interval`] from now (and after each check that passes).
    fn watch(self: &Arc<Self>, held: &Arc<Held>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let at = s.push(held);
        if !s.running {
            s.running = true;
            s.armed = None;
            drop(s);
            tokio::spawn(self.clone().run());
        } else if s.armed.is_none_or(|armed| at < armed) {
            drop(s);
            self.wake.notify_one();
        }
    }

    /// The task: pings what falls due (the pings run together, in this task), and ends when
    /// nothing is due and no ping is in flight.
    async fn run(self: Arc<Self>) {
        let mut checking = FuturesUnordered::new();
        loop {
            let next = {
                let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                let now = Instant::now();
                while s.due.peek().is_some_and(|Reverse(d)| d.at <= now) {
                    let Some(Reverse(d)) = s.due.pop() else { break };
                    // Released and dropped, or lost: nothing to check any more.
                    if let Some(held) = d.held.upgrade().filter(|h| !h.lost.is_fired()) {
                        checking.push(async move {
                            let alive = held.check().await;
                            (held, alive)
                        });
                    }
                }
                let next = s.due.peek().map(|Reverse(d)| d.at);
                if next.is_none() && checking.is_empty() {
                    s.running = false;
                    return;
                }
                s.armed = next;
                next
            };
            tokio::select! {
                () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {}
                () = self.wake.notified() => {}
                Some((held, alive)) = checking.next(), if !checking.is_empty() => {
                    if alive {
                        self.state.lock().unwrap_or_else(|e| e.into_inner()).push(&held);
                    }
                }
            }
        }
    }
}

impl ChecksState {
    /// Queues the next check of `held`; returns when it falls due: one [`check_interval`] from
    /// now, rounded down to a tenth of it, so that the checks of leases taken close together
    /// fall due together. Every lease leaves an entry that falls due once more after its
    /// release (and is then dropped): without the rounding a client taking thousands of
    /// locks a second woke the task (another thread) once per lock, about a futex and an
    /// eventfd write per hand-over in the 4-process bench.
    fn push(&mut self, held: &Arc<Held>) -> Instant {
        let now = Instant::now();
        let interval = check_interval(held.ttl());
        let epoch = *self.epoch.get_or_insert(now);
        let step = (interval / 10).max(Duration::from_millis(1)).as_nanos();
        let due = now + interval;
        // Less than a step: fits in u64 nanoseconds.
        let past_step = (due.duration_since(epoch).as_nanos() % step) as u64;
        let at = due - Duration::from_nanos(past_step);
        self.seq += 1;
        let seq = self.seq;
        self.due.push(Reverse(Due {
            at,
            seq,
            held: Arc::downgrade(held),
        }));
        at
    }
}

/// This client's waiters per name: only the first waits in the server's queue (on a connection
/// of its own), the others wait here in arrival order. So many waiters on one busy name take
/// one connection, not one each, and cannot use up the server's connections for other names.
#[derive(Default)]
pub(crate) struct Queues {
    names: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

/// The turn of the waiter at the head of its name's queue.
pub(crate) struct Turn {
    queues: Arc<Queues>,
    name: String,
    slot: Arc<Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Queues {
    /// The turn a row-lock acquisition on `name` needs: none for a try (`nowait`: it waits
    /// nowhere), this client's queue's head for a wait, by `deadline`; `None` when that ran
    /// out first.
    ///
    /// Cancel safe: a dropped wait leaves the queue.
    pub(crate) async fn turn(
        self: &Arc<Self>,
        name: &str,
        deadline: Option<Instant>,
        nowait: bool,
    ) -> Option<Option<Turn>> {
        if nowait {
            return Some(None);
        }
        self.enter(name, deadline).await.map(Some)
    }

    /// Waits for this caller's turn on `name` until `deadline`; `None` when it ran out.
    ///
    /// Cancel safe: a dropped wait leaves the queue.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        name: &str,
        deadline: Option<Instant>,
    ) -> Option<Turn> {
        let slot = self
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_owned())
            .or_default()
            .clone();
        let mut turn = Turn {
            queues: self.clone(),
            name: name.to_owned(),
            slot: slot.clone(),
            guard: None,
        };
        let lock = slot.lock_owned();
        let guard = match deadline {
            Some(d) => tokio::time::timeout_at(d, lock).await.ok()?,
            None => lock.await,
        };
        turn.guard = Some(guard);
        Some(turn)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.guard.take();
        let mut names = self.queues.names.lock().unwrap_or_else(|e| e.into_inner());
        // Ours and the map's: nobody else waits or holds the turn.
        if Arc::strong_count(&self.slot) == 2 {
            names.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    use lockcore::backend::LostNotifier;

    use super::*;

    /// A holding connection whose pings succeed while `ok` is set.
    struct Fake {
        ok: Arc<AtomicBool>,
        pings: Arc<AtomicUsize>,
    }

    #[lockcore::backend::async_trait]
    impl Holding for Fake {
        async fn ping(&mut self) -> sqlx::Result<()> {
            self.pings.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.ok.load(std::sync::atomic::Ordering::SeqCst) {
                Ok(())
            } else {
                Err(sqlx::Error::PoolClosed)
            }
        }
        async fn set_guard(&mut self, _ttl: Duration) -> sqlx::Result<()> {
            Ok(())
        }
        async fn unlock(&mut self) -> sqlx::Result<bool> {
            Ok(true)
        }
        fn recycle(self: Box<Self>) {}
    }

    fn lease(
        checks: &Arc<HealthChecks>,
        ok: bool,
    ) -> (
        RowLease,
        lockcore::LostSignal,
        Arc<AtomicBool>,
        Arc<AtomicUsize>,
    ) {
        let (ok, pings) = (Arc::new(AtomicBool::new(ok)), Arc::default());
        let conn = Fake {
            ok: ok.clone(),
            pings: Arc::clone(&pings),
        };
        let (notifier, signal) = LostNotifier::new();
        let lease = RowLease::start(
            Box::new(conn),
            LockName::new("health").expect("a valid name"),
            None,
            Duration::from_secs(1),
            notifier,
            (checks, "test"),
        );
        (lease, signal, ok, pings)
    }

    fn running(checks: &HealthChecks) -> bool {
        checks.state.lock().expect("not poisoned").running
    }

    fn seen(pings: &AtomicUsize) -> usize {
        pings.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Advances the paused clock 1 ms at a time until `cond` holds, for at most `limit` of
    /// virtual time (the spawned checks run at every step); panics past it. Returns how much
    /// virtual time passed.
    async fn until(what: &str, limit: Duration, cond: impl Fn() -> bool) -> Duration {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < limit, "{what} within {limit:?}");
            tokio::time::advance(Duration::from_millis(1)).await;
            tokio::task::yield_now().await;
        }
        start.elapsed()
    }

    /// One task checks every held connection of the client, fires the lost signal of the one
    /// that fails (and checks it no more), stops checking a released one, and ends when
    /// nothing is held. Virtual time: the checks fall due every 250 ms (a quarter of the TTL).
    #[tokio::test(start_paused = true)]
    async fn one_task_checks_every_held_connection_until_none_is_held() {
        let checks = Arc::new(HealthChecks::default());
        let (a, a_lost, _, a_pings) = lease(&checks, true);
        let (b, b_lost, b_ok, b_pings) = lease(&checks, true);
        assert!(running(&checks));
        let took = until("four pings each", Duration::from_millis(1_100), || {
            seen(&a_pings) >= 4 && seen(&b_pings) >= 4
        })
        .await;
        assert_eq!((seen(&a_pings), seen(&b_pings)), (4, 4), "both, together");
        assert!(
            took >= Duration::from_millis(1_000),
            "a ping every 250 ms, not sooner: {took:?}"
        );
        b_ok.store(false, std::sync::atomic::Ordering::SeqCst);
        let reason = tokio::time::timeout(Duration::from_millis(300), b_lost.lost())
            .await
            .expect("the failed check fires the lost signal within one interval");
        assert_eq!(reason, LostReason::ConnectionLost);
        assert!(!a_lost.is_lost(), "the healthy lease is not lost");
        let b_after = seen(&b_pings);
        a.release().await.expect("released");
        let a_after = seen(&a_pings);
        // Their entries fall due once more (within 250 ms) and are dropped: the task ends.
        until("the task's end", Duration::from_millis(300), || {
            !running(&checks)
        })
        .await;
        assert_eq!(
            seen(&b_pings),
            b_after,
            "a lost connection is checked no more"
        );
        assert_eq!(
            seen(&a_pings),
            a_after,
            "a released connection is checked no more"
        );
        // A lease after that starts the task again.
        let (c, _c_lost, _, c_pings) = lease(&checks, true);
        assert!(running(&checks));
        until(
            "the new lease's first ping",
            Duration::from_millis(300),
            || seen(&c_pings) == 1,
        )
        .await;
        drop((b, c));
    }
}
