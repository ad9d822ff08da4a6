use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::*;
use crate::{LockName, Result};

/// Records what a clean-up did: its synchronous start, then its background task.
struct Recorded(Arc<std::sync::Mutex<Vec<&'static str>>>);

impl CancelCleanUp for Recorded {
    fn start(self) -> Option<CleanUpTask> {
        self.0.lock().unwrap().push("started");
        let log = self.0;
        Some(Box::pin(async move {
            tokio::task::yield_now().await;
            log.lock().unwrap().push("ran");
        }))
    }
}

#[tokio::test]
async fn a_dropped_guard_starts_its_clean_up_at_once_and_runs_the_rest_in_the_background() {
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let background = Background::new();
    let guard = CleanUpIfCancelled::arm(Recorded(log.clone()), &background);
    assert!(log.lock().unwrap().is_empty(), "armed, nothing runs");
    drop(guard);
    assert_eq!(*log.lock().unwrap(), ["started"], "started from drop");
    background.idle().await;
    assert_eq!(*log.lock().unwrap(), ["started", "ran"]);
}

#[tokio::test]
async fn a_disarmed_guard_cleans_up_nothing() {
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let background = Background::new();
    let guard = CleanUpIfCancelled::arm(Recorded(log.clone()), &background);
    guard.disarm();
    assert_eq!(background.pending(), 0);
    assert!(log.lock().unwrap().is_empty());
}

/// A lease that counts its releases.
#[derive(Debug)]
struct CountedLease(Arc<std::sync::atomic::AtomicUsize>);

#[async_trait]
impl Lease for CountedLease {
    fn fencing_token(&self) -> Option<u64> {
        None
    }
    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        Ok(ttl)
    }
    async fn release(&self) -> Result<()> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

/// The window between the caller's last poll and its drop: the attempt wins and hands its
/// lease over (the send succeeds, the caller is still there), then the caller is dropped
/// without having looked. The lease must be released, not dropped with the channel.
#[tokio::test]
async fn a_lease_sent_to_a_caller_dropped_before_it_looked_is_released() {
    use std::future::Future;
    let released = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let background = Background::new();
    let lease = CountedLease(released.clone());
    let mut caller = Box::pin(acquire_detached(
        &background,
        None,
        move |_gone| async move { Ok(Some(lease)) },
    ));
    let waker = std::task::Waker::noop();
    let polled = caller
        .as_mut()
        .poll(&mut std::task::Context::from_waker(waker));
    assert!(polled.is_pending(), "the attempt runs in the background");
    // The attempt's task runs to its end: its send succeeded, the caller has not looked.
    background.idle().await;
    assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 0);
    drop(caller);
    background.idle().await;
    assert_eq!(
        released.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the lease sent to a caller that was dropped without looking was left held"
    );
}

/// The other order: the caller is dropped first, the attempt's send fails, and the attempt
/// releases what it won, once.
#[tokio::test]
async fn a_lease_won_after_its_caller_left_is_released_once() {
    assert_eq!(
        releases_of_an_outcome_won_after_its_caller_left(Some).await,
        1
    );
}

/// An outcome carrying more than the lease (a SQL attempt's "holder has this long left")
/// is released the same way when its caller is gone.
#[tokio::test]
async fn a_lease_with_a_hint_won_after_its_caller_left_is_released() {
    let with_hint = |lease| (Some(lease), Some(Duration::from_secs(1)));
    assert_eq!(
        releases_of_an_outcome_won_after_its_caller_left(with_hint).await,
        1
    );
}

/// A set taken in one transaction (the leases of every member) whose caller left before
/// the reply: every member is released, each once.
#[tokio::test]
async fn a_set_won_after_its_caller_left_releases_every_member() {
    let set = |lease: CountedLease| {
        let mut set: Vec<_> = (0..2).map(|_| CountedLease(lease.0.clone())).collect();
        set.insert(0, lease);
        (set, None::<usize>)
    };
    assert_eq!(
        releases_of_an_outcome_won_after_its_caller_left(set).await,
        3
    );
}

/// A set sent to a caller dropped before it looked (the window of
/// `a_lease_sent_to_a_caller_dropped_before_it_looked_is_released`): every member is
/// released.
#[tokio::test]
async fn a_set_sent_to_a_caller_dropped_before_it_looked_is_released() {
    use std::future::Future;
    let released = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let background = Background::new();
    let leases: Vec<_> = (0..4).map(|_| CountedLease(released.clone())).collect();
    let mut caller = Box::pin(acquire_detached(
        &background,
        None,
        move |_gone| async move { Ok(leases) },
    ));
    let waker = std::task::Waker::noop();
    assert!(
        caller
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
            .is_pending()
    );
    background.idle().await;
    assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 0);
    drop(caller);
    background.idle().await;
    assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 4);
}

/// The caller's bound passes while the attempt is in flight: the caller gets Unavailable
/// at once, the attempt runs on, and the lease it wins afterwards is released, once.
#[tokio::test]
async fn a_caller_past_its_bound_returns_and_the_late_win_is_released() {
    let released = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let background = Background::new();
    let lease = CountedLease(released.clone());
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let bound = crate::Instant::now() + Duration::from_millis(20);
    let outcome = acquire_detached(&background, Some(bound), move |_gone| async move {
        let _ = wait.await;
        Ok(Some(lease))
    })
    .await;
    let Err(err) = outcome else {
        panic!("the caller returns at its bound")
    };
    assert_eq!(err.kind(), crate::ErrorKind::Unavailable);
    assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 0);
    go.send(()).unwrap();
    background.idle().await;
    assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// Runs an attempt that returns `outcome(lease)` once its caller is gone (the attempt is
/// on its way, a statement sent, then the caller drops); the releases of the lease.
async fn releases_of_an_outcome_won_after_its_caller_left<T: AttemptOutcome>(
    outcome: impl FnOnce(CountedLease) -> T + Send + 'static,
) -> usize {
    use std::future::Future;
    let released = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let background = Background::new();
    let lease = CountedLease(released.clone());
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let (sent, started) = tokio::sync::oneshot::channel::<()>();
    let mut caller = Box::pin(acquire_detached(
        &background,
        None,
        move |_gone| async move {
            let _ = sent.send(());
            let _ = wait.await;
            Ok(outcome(lease))
        },
    ));
    let waker = std::task::Waker::noop();
    assert!(
        caller
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
            .is_pending()
    );
    started.await.unwrap();
    drop(caller);
    go.send(()).unwrap();
    background.idle().await;
    released.load(std::sync::atomic::Ordering::SeqCst)
}

#[test]
fn backoff_is_full_jitter_and_capped() {
    let b = Backoff::for_ttl(Duration::from_secs(2));
    assert_eq!(b.max, Duration::from_millis(500));
    for attempt in 0..40 {
        let ceiling = (b.initial * 2u32.pow(attempt.min(20))).min(b.max);
        for _ in 0..50 {
            assert!(b.delay(attempt) <= ceiling);
        }
    }
    // Full jitter: delays spread over the whole range, not around the ceiling.
    let small = (0..200).filter(|_| b.delay(30) < b.max / 4).count();
    assert!(
        small > 10,
        "{small} of 200 delays fell in the lowest quarter"
    );
    assert_eq!(
        Backoff::for_ttl(Duration::from_millis(1)).max,
        Duration::from_millis(10)
    );
}

/// A first attempt of `reqs` answered after its caller's bound (its caller got
/// `Unavailable`): [`LateAttempt::win`] lets it answer a win, a lease counted in
/// [`LateAttempt::released`] when released. Its background is the first request's.
async fn late_attempt(reqs: &[AcquireRequest]) -> LateAttempt {
    let released = Arc::new(AtomicUsize::new(0));
    let (answer, answered) = tokio::sync::oneshot::channel::<()>();
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    let late = CountedLease(released.clone());
    let first = acquire_detached_for(
        reqs,
        Some(Instant::now() + Duration::from_millis(20)),
        move |_gone| async move {
            let _ = answered.await;
            let _ = done.send(());
            Ok(Some(late))
        },
    )
    .await;
    assert_eq!(
        first.unwrap_err().kind(),
        crate::ErrorKind::Unavailable,
        "no answer within the caller's bound"
    );
    LateAttempt {
        answer: Some(answer),
        finished: Some(finished),
        released,
        background: reqs[0].background.clone(),
    }
}

/// The attempt of [`late_attempt`], still waiting to answer.
struct LateAttempt {
    /// Lets it answer (taken by [`LateAttempt::win`]).
    answer: Option<tokio::sync::oneshot::Sender<()>>,
    /// Fires once it has answered.
    finished: Option<tokio::sync::oneshot::Receiver<()>>,
    /// How many times its lease (or another counted here) was released.
    released: Arc<AtomicUsize>,
    background: Background,
}

impl LateAttempt {
    /// The late answer, a win: returns once the attempt has handed it back.
    async fn win(&mut self) {
        self.answer.take().expect("answers once").send(()).unwrap();
        self.finished.take().expect("answers once").await.unwrap();
    }

    /// The late win's release is still held back (a guard of its request lives): nothing is
    /// released within a while.
    async fn assert_held(&self, why: &str) {
        let idle = tokio::time::timeout(Duration::from_millis(300), self.background.idle());
        assert!(idle.await.is_err(), "{why}");
        assert_eq!(self.released.load(Ordering::SeqCst), 0, "{why}");
    }

    /// The late win is released, once, within `within`.
    async fn assert_released_within(&self, within: Duration) {
        tokio::time::timeout(within, self.background.idle())
            .await
            .expect("released within the bound");
        assert_eq!(self.released.load(Ordering::SeqCst), 1);
    }
}

fn request(name: &str) -> AcquireRequest {
    AcquireRequest::new(
        LockName::new(name).unwrap(),
        OwnerToken::random(),
        Duration::from_secs(60),
    )
}

/// A late win of one request is never released under the guard of its retry: the first
/// attempt is answered (a win) after its caller's bound, while the caller's retry with the
/// same owner token has won and is held. Its background release (by token: the same row
/// as the retry's) waits until the guard ends, then runs; a request over without a guard
/// has it released at once. Regression: it was released at once, freeing the row the
/// retry's guard held (SQL leases: the caller held a guard on nothing).
#[tokio::test]
async fn a_late_win_is_not_released_under_the_retry_that_holds_its_row() {
    let req = request("late-win");
    let mut late = late_attempt(std::slice::from_ref(&req)).await;
    // The retry, same request and token, wins and is claimed: its guard keeps the
    // request's lost notifier (as a LockGuard does).
    let retry = CountedLease(late.released.clone());
    let won = acquire_detached_for(std::slice::from_ref(&req), None, move |_gone| async move {
        Ok(Some(retry))
    })
    .await
    .unwrap();
    assert!(won.is_some());
    let guard = req.lost.clone();
    drop(req);
    // The first attempt's late answer: a win.
    late.win().await;
    late.assert_held("a late win was released while its request's guard held the same row")
        .await;
    // The guard ends: the late win is released then.
    drop(guard);
    late.assert_released_within(Duration::from_secs(10)).await;
}

/// A set's late win waits for every member's request: released only once the last
/// member's guard of the set's retry ended. Regression: sets went through the plain
/// `acquire_detached`, which released a late win at once under the retry's guards.
#[tokio::test]
async fn a_late_set_win_waits_for_every_member_of_the_retry() {
    let reqs = [request("late-set-a"), request("late-set-b")];
    let mut late = late_attempt(&reqs).await;
    // The retry's guards: one per member, keeping each request's notifier.
    let (a, b) = (reqs[0].lost.clone(), reqs[1].lost.clone());
    drop(reqs);
    late.win().await;
    drop(a);
    late.assert_held("released while member b's guard held")
        .await;
    drop(b);
    late.assert_released_within(Duration::from_secs(10)).await;
}

/// A late win of a request over without a guard (the caller gave up) is released at once.
#[tokio::test]
async fn a_late_win_of_a_request_given_up_is_released() {
    let req = request("late-win-given-up");
    let mut late = late_attempt(std::slice::from_ref(&req)).await;
    drop(req);
    late.win().await;
    late.assert_released_within(Duration::from_secs(10)).await;
}

/// A revocation notice fires the lost signal of the leases it names (and only those), once;
/// nothing is registered before the client listens, and a dropped registration ends it.
#[test]
fn a_revocation_notice_fires_the_named_leases_only() {
    let revocations = Arc::new(Revocations::default());
    let (early, early_signal) = LostNotifier::new();
    revocations.watch(1, early.reporter());
    assert!(revocations.is_empty(), "registered before listening");
    revocations.listen();
    let (a, a_signal) = LostNotifier::new();
    let (b, b_signal) = LostNotifier::new();
    let (c, c_signal) = LostNotifier::new();
    let a_token = OwnerToken::random().uuid().as_u128();
    let b_token = OwnerToken::random().uuid().as_u128();
    let c_token = OwnerToken::random().uuid().as_u128();
    revocations.watch(a_token, a.reporter());
    let b_watch = revocations
        .watch_until_dropped(b_token, b.reporter())
        .expect("listening");
    let c_watch = revocations
        .watch_until_dropped(c_token, c.reporter())
        .expect("listening");
    assert_eq!(revocations.len(), 3);
    drop(c_watch);
    assert_eq!(revocations.len(), 2, "a dropped registration is gone");
    let notice = format!("{a_token:032x} not-a-token {c_token:032x} {:032x}", 1u128);
    assert_eq!(revocations.revoked(&notice), 1, "only a is named and held");
    assert_eq!(a_signal.reason(), Some(crate::LostReason::RenewalRefused));
    assert_eq!(b_signal.reason(), None);
    assert_eq!(c_signal.reason(), None, "unregistered before the notice");
    assert_eq!(early_signal.reason(), None);
    assert_eq!(
        revocations.revoked(&format!("{a_token:032x}")),
        0,
        "fired once"
    );
    revocations.unwatch(a_token);
    drop(b_watch);
    assert!(revocations.is_empty());
    // A waiting request's watch handed on to the lease it won (the same token): the lease's
    // registration stays until the lease's own is dropped.
    let waiting = revocations
        .watch_until_dropped(b_token, b.reporter())
        .expect("listening");
    let won = revocations
        .watch_until_dropped(b_token, b.reporter())
        .expect("listening");
    waiting.hand_on();
    assert_eq!(revocations.len(), 1, "handing on unregistered the lease");
    drop(won);
    assert!(revocations.is_empty());
}

/// A lease registered for revocation notices does not keep its request alive: the late win of
/// a cancelled attempt is released once the request is over, not left to its TTL (a registry
/// that kept a notifier left `grant_at_drop_leaves_nothing`'s lock held for its whole TTL).
#[tokio::test]
async fn a_registered_lease_does_not_keep_its_request_alive() {
    let revocations = Arc::new(Revocations::default());
    revocations.listen();
    let (notifier, _signal) = LostNotifier::new();
    let over = notifier.watch();
    let token = OwnerToken::random().uuid().as_u128();
    let _registered = revocations.watch_until_dropped(token, notifier.reporter());
    revocations.watch(token + 1, notifier.reporter());
    drop(notifier);
    assert!(over.over_within(Duration::from_secs(5)).await);
}
