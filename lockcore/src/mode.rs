//! What an acquisition asks for: the lock alone, a share of it beside other readers, or one of
//! N permits; and whether a backend can give each.

use std::fmt;

use serde::Serialize;

use crate::Error;

/// The most permits a semaphore may have: a limit is part of every acquisition, and a backend
/// keeps one entry per permit held.
pub const MAX_PERMITS: u32 = 10_000;

/// What an acquisition asks for. Every client of one name must use it the same way: as a mutex
/// or read-write lock ([`Exclusive`](LockMode::Exclusive) and [`Shared`](LockMode::Shared)
/// together), or as a semaphore with one limit ([`Permit`](LockMode::Permit)); a backend
/// refuses the other use with [`ErrorKind::Conflict`](crate::ErrorKind::Conflict) while the
/// name is held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LockMode {
    /// The lock alone: no other holder of any mode (a mutex, a read-write lock's writer).
    #[default]
    Exclusive,
    /// Beside other shared holders, never beside an exclusive one (a read-write lock's reader).
    /// A waiting exclusive acquisition is served before shared ones that came after it, so a
    /// stream of readers cannot starve a writer.
    Shared,
    /// One of `limit` permits: at most `limit` holders at once (a counting semaphore). Each
    /// permit is a lease of its own (TTL, renewal, lost signal, fencing token).
    Permit {
        /// How many holders at most; the same for every client of the name.
        limit: u32,
    },
}

impl LockMode {
    /// Whether this mode can be asked of a backend with `caps`: `Err(why)` when it cannot.
    pub fn supported_by(&self, caps: &crate::Capabilities) -> Result<(), String> {
        let (support, what) = match self {
            LockMode::Exclusive => return Ok(()),
            LockMode::Shared => (&caps.shared, "shared (read-write) locks"),
            LockMode::Permit { .. } => (&caps.permits, "semaphore permits"),
        };
        match support {
            Support::Yes => Ok(()),
            Support::No(why) => Err(format!("this backend gives no {what}: {why}")),
        }
    }

    /// Whether two holders in these modes may hold one name together.
    pub fn compatible(&self, other: &LockMode) -> bool {
        matches!((self, other), (LockMode::Shared, LockMode::Shared))
            || matches!(
                (self, other),
                (LockMode::Permit { limit: a }, LockMode::Permit { limit: b }) if a == b
            )
    }

    /// Whether a name in use as `self` cannot be taken as `other` at all, not even in turn: a
    /// semaphore with another limit, or a semaphore beside a mutex or read-write lock. (An
    /// exclusive and a shared acquisition contend; they do not conflict.)
    pub fn conflicts_with(&self, other: &LockMode) -> bool {
        match (self, other) {
            (LockMode::Permit { limit: a }, LockMode::Permit { limit: b }) => a != b,
            (LockMode::Permit { .. }, _) | (_, LockMode::Permit { .. }) => true,
            _ => false,
        }
    }

    /// The [`ErrorKind::Conflict`](crate::ErrorKind::Conflict) error of an acquisition asking
    /// for `self` of a name in use in these modes (its holders', its waiters'), naming the
    /// first use it conflicts with; `None` when there is none. Every backend refuses so, with
    /// the same message.
    pub fn conflict_among(&self, uses: impl IntoIterator<Item = LockMode>) -> Option<Error> {
        let other = uses.into_iter().find(|other| other.conflicts_with(self))?;
        Some(Error::conflict(format!(
            "the lock is in use as {other}, and this acquisition asks for {self}"
        )))
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockMode::Exclusive => f.write_str("exclusive"),
            LockMode::Shared => f.write_str("shared"),
            LockMode::Permit { limit } => write!(f, "one of {limit} permits"),
        }
    }
}

/// Whether a backend gives a primitive, and why not where it does not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Support {
    /// It does, with the qualities of its exclusive locks (TTL, renewal, lost signal, fencing).
    Yes,
    /// It does not; the reason, for the report and the error.
    No(String),
}

impl Support {
    /// A "no" with its reason.
    pub fn no(why: impl Into<String>) -> Self {
        Support::No(why.into())
    }

    /// Whether it does.
    pub fn is_yes(&self) -> bool {
        matches!(self, Support::Yes)
    }

    /// Why not, where it does not.
    pub fn why_not(&self) -> Option<&str> {
        match self {
            Support::Yes => None,
            Support::No(why) => Some(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_shared_with_shared_and_permits_of_one_limit_go_together() {
        let p3 = LockMode::Permit { limit: 3 };
        let p5 = LockMode::Permit { limit: 5 };
        assert!(LockMode::Shared.compatible(&LockMode::Shared));
        assert!(p3.compatible(&p3));
        assert!(!p3.compatible(&p5));
        for m in [LockMode::Exclusive, LockMode::Shared, p3] {
            assert!(!LockMode::Exclusive.compatible(&m));
            assert!(!m.compatible(&LockMode::Exclusive));
        }
        assert!(!LockMode::Shared.compatible(&p3));
    }

    #[test]
    fn a_mode_the_backend_does_not_give_is_refused_with_its_reason() {
        let mut caps = crate::Capabilities {
            permits: Support::no("a majority does not keep a count"),
            ..Default::default()
        };
        let err = LockMode::Permit { limit: 2 }
            .supported_by(&caps)
            .unwrap_err();
        assert!(err.contains("semaphore permits: a majority"), "{err}");
        assert!(LockMode::Exclusive.supported_by(&caps).is_ok());
        caps.shared = Support::Yes;
        assert!(LockMode::Shared.supported_by(&caps).is_ok());
    }

    #[test]
    fn a_semaphore_of_another_limit_or_beside_a_lock_is_a_conflict() {
        let p3 = LockMode::Permit { limit: 3 };
        let p5 = LockMode::Permit { limit: 5 };
        assert!(p3.conflicts_with(&p5));
        assert!(!p3.conflicts_with(&p3));
        for lock in [LockMode::Exclusive, LockMode::Shared] {
            assert!(p3.conflicts_with(&lock) && lock.conflicts_with(&p3));
            assert!(
                lock.conflict_among([LockMode::Exclusive, LockMode::Shared])
                    .is_none()
            );
        }
        let err = p5.conflict_among([p5, LockMode::Shared]).unwrap();
        assert_eq!(err.kind(), crate::ErrorKind::Conflict);
        assert!(
            err.to_string()
                .contains("in use as shared, and this acquisition asks for one of 5 permits"),
            "{err}"
        );
    }
}
