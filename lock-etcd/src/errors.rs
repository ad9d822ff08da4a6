//! etcd client errors in the contract's terms, and which of them a request may be sent again
//! after.

use std::time::Duration;

use lockcore::{Error, ErrorKind};

/// The etcd client error in the contract's terms.
pub(crate) fn map_err(what: impl Into<String>, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    let what = what.into();
    match &e {
        // gRPC codes: 1 cancelled, 3 invalid argument, 4 deadline exceeded, 14 unavailable.
        E::GRpcStatus(s) => match s.code() as i32 {
            1 | 4 | 14 => Error::unavailable(what, e),
            // 7 permission denied (a user without the role), 16 unauthenticated (no or an
            // invalid token); a wrong user or password is code 3 with this message.
            7 | 16 => Error::auth(what, e),
            3 if s.message().contains("authentication failed") => Error::auth(what, e),
            // tonic reports a connection reset mid-request (a member killed or restarted) as
            // code 2 "transport error": transient, as 14 is (the faults matrix's server_restart).
            2 if s.message() == "transport error" => Error::unavailable(what, e),
            3 => Error::new(ErrorKind::InvalidConfig, what).with_source(e),
            _ => Error::backend(what, e),
        },
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => {
            Error::unavailable(what, e)
        }
        E::InvalidArgs(_) | E::InvalidUri(_) | E::InvalidMetadataValue(_) => {
            Error::new(ErrorKind::InvalidConfig, what).with_source(e)
        }
        _ => Error::backend(what, e),
    }
}

/// Whether a failed request failed because its lease does not exist (expired or revoked).
pub(crate) fn lease_not_found(e: &Error) -> bool {
    e.to_string().contains("lease not found")
}

/// Whether a request failed without being applied, so that sending it again cannot apply it
/// twice: it was not sent (its member refused the connection), or its member has no leader
/// (require-leader makes such a member refuse requests before executing them, and one
/// waiting for a leader refuses with the same error; the channel then picks a member again).
pub(crate) fn not_applied(e: &etcd_client::Error) -> bool {
    let msg = e.to_string();
    msg.contains("tcp connect error")
        || msg.contains("Connection refused")
        || msg.contains("etcdserver: no leader")
}

/// Whether a request failed in a way that leaves open whether it was applied: its connection
/// broke once it may have been sent (reset, closed, refused mid-stream). Its reply may be what
/// was lost, or the request itself: only a request that may be applied twice (a read, or a
/// delete or revoke that only removes what it names) can be sent again after it.
pub(crate) fn maybe_applied(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        // tonic reports a connection reset mid-request as code 2 "transport error"; a channel
        // that lost its connection as 14.
        E::GRpcStatus(s) => match s.code() as i32 {
            14 => true,
            2 => s.message() == "transport error",
            _ => false,
        },
        E::TransportError(_) | E::IoError(_) => true,
        _ => false,
    }
}

pub(crate) fn timed_out(what: &str, after: Duration) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("{what}: no answer from etcd within {after:?}"),
    )
}
