//! How the Redis client's errors map onto lockcore's kinds.

use lockcore::Error;
use redis::RedisError;

/// Maps a client error: refused credentials (`WRONGPASS`, `NOAUTH`, a user without the rights,
/// `NOPERM`) are `Auth`; connection, I/O and timeouts are `Unavailable`; the rest `Backend`.
pub fn map_err(msg: &str, e: RedisError) -> Error {
    use redis::{ErrorKind as K, ServerErrorKind as S};
    if e.kind() == K::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
    {
        return Error::auth(msg.to_owned(), e);
    }
    // Transient states of a server or cluster (loading, failover, resharding) are Unavailable too.
    let transient = matches!(
        e.kind(),
        K::ClusterConnectionNotFound
            | K::Server(S::BusyLoading | S::MasterDown | S::ReadOnly | S::TryAgain)
    );
    if transient
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
    {
        Error::unavailable(msg.to_owned(), e)
    } else {
        Error::backend(msg.to_owned(), e)
    }
}

/// As [`map_err`], for connection setup.
pub(crate) fn map_err_connect(msg: &str, e: RedisError) -> Error {
    map_err(msg, e)
}
