//! The backend's one background task: watches each session in turn, reports held leases lost
//! (see the crate docs), and opens a new session after one ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use lockcore::{Instant, LostReason};
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::backend::Inner;
use crate::errors::ZkResult;
use crate::session::{Session, open_client};
use crate::stats::bump;

/// The backend's one background task: watches each session in turn, reports held leases lost
/// (see the crate docs), and opens a new session after one ends. Ends with the backend.
pub(crate) async fn supervise(weak: Weak<Inner>, mut shutdown: watch::Receiver<()>) {
    let mut sessions = match weak.upgrade() {
        Some(inner) => inner.session.subscribe(),
        None => return,
    };
    loop {
        let session = sessions.borrow_and_update().clone();
        let Some((grace, config, reopen)) = weak
            .upgrade()
            .map(|i| (i.lost_after_disconnect, i.config.clone(), i.reopen))
        else {
            return;
        };
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = watch_session(&session, grace, &weak) => {}
        }
        drop(session);
        if !reopen {
            // The application's session: it opens the next one.
            return;
        }
        // The session ended: open a new one, with a bounded back-off while no server answers.
        let mut pause = Duration::from_millis(50);
        loop {
            let opened = tokio::select! {
                _ = shutdown.changed() => return,
                r = open_client(&config) => r,
            };
            match opened {
                Ok(client) => {
                    let Some(inner) = weak.upgrade() else { return };
                    bump(&inner.stats.sessions);
                    tracing::info!(
                        session = client.session_id().0,
                        "opened a new zookeeper session after the last one ended"
                    );
                    inner.session.send_replace(Session::new(client));
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "opening a new zookeeper session failed; retrying");
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

pub(crate) type SyncFuture = Pin<Box<dyn Future<Output = ZkResult<()>> + Send>>;

/// Watches one session until it ends, reporting held leases lost on a disconnection (after
/// `grace`), on a `sync` to the leader unanswered for a third of the session timeout, and on
/// the end of the session.
pub(crate) async fn watch_session(session: &Arc<Session>, grace: Duration, weak: &Weak<Inner>) {
    let client = session.client.clone();
    let mut states = client.state_watcher();
    let beat_every = client.session_timeout() / 3;
    let suspend = |reason: LostReason| {
        if let Some(inner) = weak.upgrade() {
            session.suspend(reason, &inner.stats);
        }
    };
    let mut disconnected_since: Option<Instant> = None;
    let mut next_beat = Instant::now() + beat_every;
    // The sync in flight and when it was sent.
    let mut beat: Option<(Instant, SyncFuture)> = None;
    let mut beat_late = false;
    loop {
        let state = states.peek_state();
        if state.is_terminated() {
            suspend(reason_for(state));
            return;
        }
        let grace_end = disconnected_since.map(|t| t + grace);
        let beat_deadline = beat
            .as_ref()
            .filter(|_| !beat_late)
            .map(|(sent, _)| *sent + beat_every);
        tokio::select! {
            state = states.changed() => {
                if state.is_terminated() {
                    continue;
                }
                if state == zk::SessionState::SyncConnected {
                    disconnected_since = None;
                    session.resume();
                } else if disconnected_since.is_none() {
                    if grace.is_zero() {
                        suspend(LostReason::ConnectionLost);
                    } else {
                        disconnected_since = Some(Instant::now());
                    }
                }
            }
            _ = sleep_until_opt(grace_end) => {
                disconnected_since = None;
                suspend(LostReason::ConnectionLost);
            }
            result = async { beat.as_mut().expect("guarded").1.as_mut().await }, if beat.is_some() => {
                beat = None;
                next_beat = Instant::now() + beat_every;
                if beat_late && result.is_ok() && states.peek_state() == zk::SessionState::SyncConnected {
                    // The leader answers again: new leases need not be reported lost.
                    session.resume();
                }
                beat_late = false;
            }
            _ = sleep_until_opt(beat_deadline) => {
                // Connected, but the leader does not answer: the session may be expiring.
                beat_late = true;
                tracing::warn!(session = session.id, "a sync to the zookeeper leader went unanswered for 1/3 of the session timeout; reporting held locks lost");
                suspend(LostReason::ConnectionLost);
            }
            _ = tokio::time::sleep_until(next_beat), if beat.is_none() => {
                next_beat = Instant::now() + beat_every;
                // Only while leases are held: an idle client sends nothing.
                if session.held() > 0 && states.peek_state() == zk::SessionState::SyncConnected {
                    let c = client.clone();
                    beat = Some((Instant::now(), Box::pin(async move { c.sync("/").await })));
                }
            }
        }
    }
}

pub(crate) async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub(crate) fn reason_for(state: zk::SessionState) -> LostReason {
    if state == zk::SessionState::Expired {
        LostReason::SessionExpired
    } else {
        LostReason::ConnectionLost
    }
}
