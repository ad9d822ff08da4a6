//! ZooKeeper client errors in the contract's terms, which of them a request is retried after,
//! and the retry loop.

use std::future::Future;
use std::time::Duration;

use lockcore::Error;
use zookeeper_client as zk;

pub(crate) type ZkResult<T> = std::result::Result<T, zk::Error>;

/// Pause between retries of an idempotent request after a connection loss (the client queues
/// requests until it has reconnected, so this only avoids a hot loop on a flapping link).
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(20);

pub(crate) fn map_err(what: impl Into<String>, e: zk::Error) -> Error {
    use zk::Error as E;
    match e {
        E::ConnectionLoss
        | E::Timeout
        | E::NoHosts
        | E::SessionExpired
        | E::SessionMoved
        | E::ClientClosed
        | E::Throttled => Error::unavailable(what, e),
        // The client reports a broken connection (reset, refused, a read that timed out) as a
        // custom error around the I/O error: the request may not have reached the server, as
        // with ConnectionLoss, so it is Unavailable (lock() retries it within its deadline, a
        // server restart must not end a wait with an error).
        E::Custom(_) if is_connection_failure(&e) => Error::unavailable(what, e),
        // Credentials refused (SASL), or none that a node's ACL asks for (digest auth is taken
        // as given at connect; a wrong password shows as NoAuth on the first protected node).
        E::AuthFailed | E::NoAuth => Error::auth(what, e),
        _ => Error::backend(what, e),
    }
}

pub(crate) fn is_connection_failure(e: &zk::Error) -> bool {
    // The client wraps the I/O error in an `Arc<dyn Error>` (downcasting cannot see through it)
    // or says "no response from connection in N ms"; its only other custom errors are SASL's.
    !e.to_string().to_ascii_lowercase().contains("sasl")
}

/// The request may or may not have been applied and the session lives on: retry it (every
/// retried request here is idempotent or recovers by owner token). A broken connection counts,
/// whichever way the client reports it: a release that gave up on a reset connection left its
/// node behind for the whole session, and every contender waited on it (the zk-ensemble
/// `leader_loss` stall).
pub(crate) fn is_retryable(e: &zk::Error) -> bool {
    match e {
        zk::Error::ConnectionLoss => true,
        zk::Error::Custom(_) => is_connection_failure(e),
        _ => false,
    }
}

/// The session of a request is gone (expired, closed): the request is retried on the next one.
pub(crate) fn is_session_end(e: &zk::Error) -> bool {
    matches!(e, zk::Error::SessionExpired | zk::Error::ClientClosed)
}

pub(crate) async fn retry<T, F, Fut>(f: F) -> ZkResult<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ZkResult<T>>,
{
    loop {
        match f().await {
            Err(e) if is_retryable(&e) => tokio::time::sleep(RETRY_PAUSE).await,
            other => return other,
        }
    }
}
