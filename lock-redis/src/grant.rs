//! How an acquire script's reply is judged, the same way for every mode (the exclusive lock,
//! its queued and Redlock forms, shares and permits): every acquire script answers
//! `{verdict, value, ...}`, verdict 1 won (value: the fencing counter, 0 when none moved), 0
//! held (value: ms until the lock or a place may free; negative when unknown), -1 the name is
//! used in another way (a conflict, which each mode words for itself).

use std::time::Duration;

use lockcore::{Error, ErrorKind, Result};

/// What one acquire script reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeAttempt {
    /// This token now holds the lock on the node.
    Won {
        /// The new value of the fencing counter, when the counter was asked for.
        fence: Option<u64>,
    },
    /// Another token holds it.
    Held {
        /// The holder's remaining TTL, when it has one.
        pttl: Option<Duration>,
    },
}

/// What a queued waiter leaves for a release to grant it the lock (`handover=grant`): on a single node
/// (`queue`'s acquire) or on each master of a Redlock (`acquire_waiting`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantAsk {
    /// The number of this attempt of the waiter (the grant names it back).
    pub attempt: u64,
    /// The TTL the release gives the granted lock, until the waiter's renewal extends it.
    pub claim: Duration,
}

/// An acquire script's verdict (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Grant {
    /// Taken, with the fencing counter's value (0 when none moved).
    Won(i64),
    /// Held: how long until it may free (see [`Grant::wait`]).
    Held(i64),
    /// The name is used in another way.
    Conflict,
}

impl Grant {
    /// Reads the verdict at the head of `reply`.
    ///
    /// # Errors
    /// `Backend` when the reply has fewer than two values.
    pub(crate) fn judge(reply: &[i64]) -> Result<Grant> {
        match reply {
            [1, fence, ..] => Ok(Grant::Won(*fence)),
            [-1, _, ..] => Ok(Grant::Conflict),
            [_, wait, ..] => Ok(Grant::Held(*wait)),
            _ => Err(Error::new(
                ErrorKind::Backend,
                "the acquire script's reply is malformed",
            )),
        }
    }

    /// A held verdict's wait: PTTL -1 (no expiry), -2 (gone) or -3 (free, another waiter's
    /// turn) give no useful wake-up time.
    pub(crate) fn wait(value: i64) -> Option<Duration> {
        u64::try_from(value).ok().map(Duration::from_millis)
    }

    /// A won verdict's fencing token.
    ///
    /// # Errors
    /// `Backend` for a negative counter.
    pub(crate) fn fence(value: i64) -> Result<u64> {
        u64::try_from(value).map_err(|_| Error::new(ErrorKind::Backend, "negative fencing counter"))
    }

    /// The attempt this verdict is on one node, `counted` when a fencing token was asked for;
    /// a conflict is `conflict()`.
    pub(crate) fn attempt(
        self,
        counted: bool,
        conflict: impl FnOnce() -> Error,
    ) -> Result<NodeAttempt> {
        match self {
            Grant::Won(_) if !counted => Ok(NodeAttempt::Won { fence: None }),
            Grant::Won(v) => Ok(NodeAttempt::Won {
                fence: Some(Grant::fence(v)?),
            }),
            Grant::Held(v) => Ok(NodeAttempt::Held {
                pttl: Grant::wait(v),
            }),
            Grant::Conflict => Err(conflict()),
        }
    }
}

/// The conflict of an exclusive request on a name held as a semaphore.
pub(crate) fn semaphore_conflict() -> Error {
    Error::conflict("the lock is held as a semaphore, and this acquisition asks for it exclusively")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_read_the_same_for_every_mode() {
        assert_eq!(Grant::judge(&[1, 7, 0]).unwrap(), Grant::Won(7));
        assert_eq!(Grant::judge(&[0, -3, 2]).unwrap(), Grant::Held(-3));
        assert_eq!(Grant::judge(&[-1, 0]).unwrap(), Grant::Conflict);
        assert!(Grant::judge(&[1]).is_err());
        assert_eq!(Grant::wait(-2), None);
        assert_eq!(Grant::wait(5), Some(Duration::from_millis(5)));
        assert!(Grant::fence(-1).is_err());
    }
}
