//! Which children of a lock node are contenders, in which order, and what this client names its
//! own: the rules of the ZooKeeper lock recipes that may share a lock node with locksmith.
//!
//! * Curator's `InterProcessMutex` (`StandardLockInternalsDriver`): every child is a contender,
//!   sorted by the text after the last `lock-` in its name (`fixForSorting`); its own nodes are
//!   `_c_<uuid>-lock-<seq>` (protected mode) or `lock-<seq>`.
//! * go-zookeeper's `Lock`: `_c_<32 hex digits>-lock-<seq>`, sorted by the number after the last
//!   `-`.
//! * kazoo's `Lock` / `WriteLock` / `ReadLock` (`kazoo/recipe/lock.py`): `<uuid hex>__lock__<seq>`
//!   (`__rlock__` for a reader); a contender is a child matching `(__lock__|__rlock__)\d{10}$`
//!   (a plain `Lock` only `__lock__`, unless given `extra_lock_patterns`), sorted by sequence.
//!
//! * Curator's `InterProcessReadWriteLock`: `_c_<uuid>-__READ__<seq>` (reader) and
//!   `_c_<uuid>-__WRIT__<seq>` (writer), sorted by the text after either marker.
//! * locksmith's semaphore permits: `_c_<token>-__PERMIT__<limit>-<seq>` (no other client makes
//!   them; the limit is in the name so that one listing shows every holder's limit).
//!
//! Each contender has a [`Role`]: a writer holds when it is the lowest of all, a reader when no
//! writer is lower, a permit when fewer than its limit are lower.
//!
//! The sequence is the server's 10-digit counter of the lock node, shared by every sequential
//! child whoever made it: ordering every recipe's nodes by it is the one order all of them agree
//! on (Curator's text order of 10 digits is the numeric order), which makes a mixed queue fair.
//! A child with none of these markers right before its sequence is made by no lock client, so
//! nobody holds a lock through it: it is not a contender (Curator sorts such a child by its whole
//! name, and waits on it only if that text sorts before its own sequence).

use lockcore::LockMode;

/// The ZooKeeper lock client whose node names locksmith uses (`interop` in the URL or config).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Interop {
    /// `_c_<token>-lock-<seq>`: the layout of Curator's `InterProcessMutex` in protected mode and
    /// of go-zookeeper's `Lock`, which both see these nodes as contenders.
    #[default]
    Curator,
    /// `<token>__lock__<seq>`: kazoo's `Lock` names, which a kazoo `Lock`, `WriteLock` and
    /// `ReadLock` see as a writer. Curator and go-zookeeper cannot share the lock then (see the
    /// crate docs).
    Kazoo,
}

impl Interop {
    /// The URL's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Interop::Curator => "curator",
            Interop::Kazoo => "kazoo",
        }
    }

    /// The name of this client's node before the sequence the server appends, for an
    /// acquisition in `mode`: the owner token (32 hex digits) comes first in every layout, so a
    /// create whose reply was lost is found again by it (Curator's protection mode). `None`
    /// where the layout has no name for the mode (permits under kazoo's).
    pub(crate) fn node_prefix(self, owner_hex: &str, mode: LockMode) -> Option<String> {
        Some(match (self, mode) {
            (Interop::Curator, LockMode::Exclusive) => format!("_c_{owner_hex}-{CURATOR_MARK}"),
            (Interop::Curator, LockMode::Shared) => format!("_c_{owner_hex}-{CURATOR_READ_MARK}"),
            // Ends in Curator's `lock-`, so that Curator's `InterProcessMutex` (which sorts
            // every child by the text after the last `lock-`) queues behind a permit holder by
            // sequence instead of sorting it after its own node and holding beside it.
            (Interop::Curator, LockMode::Permit { limit }) => {
                format!("_c_{owner_hex}-{PERMIT_MARK}{limit}-{CURATOR_MARK}")
            }
            (Interop::Kazoo, LockMode::Exclusive) => format!("{owner_hex}{KAZOO_MARK}"),
            (Interop::Kazoo, LockMode::Shared) => format!("{owner_hex}{KAZOO_READ_MARK}"),
            (Interop::Kazoo, LockMode::Permit { .. }) => return None,
        })
    }
}

/// Curator's `lock-` (`InterProcessMutex`'s lock name), also go-zookeeper's.
const CURATOR_MARK: &str = "lock-";
/// kazoo's `Lock._NODE_NAME` (writers).
const KAZOO_MARK: &str = "__lock__";
/// kazoo's `ReadLock._NODE_NAME`: a reader holds against writers, and locksmith is a writer.
const KAZOO_READ_MARK: &str = "__rlock__";
/// Curator's `InterProcessReadWriteLock` reader (`READ_LOCK_NAME`).
const CURATOR_READ_MARK: &str = "__READ__";
/// Curator's `InterProcessReadWriteLock` writer (`WRITE_LOCK_NAME`).
const CURATOR_WRITE_MARK: &str = "__WRIT__";
/// locksmith's permits: `__PERMIT__<limit>-` before the sequence.
const PERMIT_MARK: &str = "__PERMIT__";
/// Digits of a server-assigned sequence number (`%010d`).
const SEQ_LEN: usize = 10;

/// How a contender holds: what it waits for, and what it lets hold beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Holds alone, once it is the lowest contender: locksmith's exclusive lock, Curator's
    /// mutex and read-write writer, go-zookeeper's and kazoo's locks.
    Writer,
    /// Holds once no writer is lower, beside other readers: locksmith's shared lock, Curator's
    /// and kazoo's readers.
    Reader,
    /// Holds once fewer than `limit` contenders are lower: one of `limit` permits.
    Permit(u32),
}

impl Role {
    /// The mode a holder in this role has.
    pub(crate) fn mode(self) -> LockMode {
        match self {
            Role::Writer => LockMode::Exclusive,
            Role::Reader => LockMode::Shared,
            Role::Permit(limit) => LockMode::Permit { limit },
        }
    }

    fn of(mode: LockMode) -> Role {
        match mode {
            LockMode::Exclusive => Role::Writer,
            LockMode::Shared => Role::Reader,
            LockMode::Permit { limit } => Role::Permit(limit),
        }
    }
}

/// Which recipe's rule makes a child a contender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `...lock-<seq>`: Curator, go-zookeeper, locksmith's default layout.
    Curator,
    /// `...__lock__<seq>` or `...__rlock__<seq>`: kazoo, locksmith's `interop=kazoo`.
    Kazoo,
}

/// `(sequence, shape, role)` of a contender's node name; `None` for a child no lock client
/// makes.
pub(crate) fn parse(name: &str) -> Option<(i64, Shape, Role)> {
    let cut = name.len().checked_sub(SEQ_LEN)?;
    let (head, seq) = (name.get(..cut)?, &name[cut..]);
    if !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // A permit's node: `…__PERMIT__<limit>-lock-` (or, from releases before Curator's mutex
    // was made to see permits, `…__PERMIT__<limit>-`).
    let permit = permit_limit(head.strip_suffix(CURATOR_MARK).unwrap_or(head))
        .or_else(|| permit_limit(head));
    let (shape, role) = if let Some(limit) = permit {
        (Shape::Curator, Role::Permit(limit))
    } else if head.ends_with(CURATOR_MARK) || head.ends_with(CURATOR_WRITE_MARK) {
        (Shape::Curator, Role::Writer)
    } else if head.ends_with(CURATOR_READ_MARK) {
        (Shape::Curator, Role::Reader)
    } else if head.ends_with(KAZOO_MARK) {
        (Shape::Kazoo, Role::Writer)
    } else if head.ends_with(KAZOO_READ_MARK) {
        (Shape::Kazoo, Role::Reader)
    } else {
        return None;
    };
    Some((seq.parse().ok()?, shape, role))
}

/// The limit of a permit node's name before its sequence (`…__PERMIT__<limit>-`).
fn permit_limit(head: &str) -> Option<u32> {
    let limit = head.strip_suffix('-')?.rsplit_once(PERMIT_MARK)?.1;
    if limit.is_empty() || !limit.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    limit.parse().ok()
}

/// The role of a contender's node name (one [`queue`] returned).
pub(crate) fn role(name: &str) -> Role {
    parse(name).map_or(Role::Writer, |(_, _, r)| r)
}

/// Where an acquisition stands in the queue (see [`standing`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// The name is used another way: a semaphore with another limit, or a semaphore beside a
    /// mutex or read-write lock (see [`LockMode`]).
    Conflict(String),
    /// It holds.
    Holds,
    /// It waits for one of these contenders (indexes into `ahead`) to leave: the immediate
    /// predecessor for a writer, the last writer ahead for a reader, the `limit` nearest for a
    /// permit. Any of them leaving may let it hold; none of the others can.
    Waits(Vec<usize>),
}

/// Where an acquisition in `mode` stands behind the contenders `ahead` (in queue order). A
/// conflict is judged against those ahead only (holders and waiters alike): a contender of
/// another use that came later sees this one and refuses itself, so the earlier use keeps the
/// name.
pub(crate) fn standing(ahead: &[Role], mode: LockMode) -> Standing {
    let me = Role::of(mode);
    let clash = ahead.iter().find(|other| match (other, me) {
        (Role::Permit(a), Role::Permit(b)) => *a != b,
        (Role::Permit(_), _) | (_, Role::Permit(_)) => true,
        _ => false,
    });
    if let Some(other) = clash {
        return Standing::Conflict(format!(
            "the lock is in use as {}, and this acquisition asks for {mode}",
            other.mode()
        ));
    }
    match me {
        Role::Writer if ahead.is_empty() => Standing::Holds,
        Role::Writer => Standing::Waits(vec![ahead.len() - 1]),
        Role::Reader => match ahead.iter().rposition(|r| *r == Role::Writer) {
            None => Standing::Holds,
            Some(i) => Standing::Waits(vec![i]),
        },
        Role::Permit(limit) => {
            let limit = limit as usize;
            if ahead.len() < limit {
                Standing::Holds
            } else {
                // Fewer than `limit` ahead means one of the `limit` nearest left: ahead of those
                // the places only shift, so a waiter watching them misses no release (watching
                // one node only would: a permit freed beside it would not wake it).
                Standing::Waits((ahead.len() - limit..ahead.len()).collect())
            }
        }
    }
}

/// How many of the contenders (in queue order) hold: a prefix of the queue, since every role
/// holds only when what is ahead of it lets it.
pub(crate) fn holders(roles: &[Role]) -> usize {
    roles
        .iter()
        .enumerate()
        .take_while(|(i, role)| match role {
            Role::Writer => *i == 0,
            Role::Reader => !roles[..*i].contains(&Role::Writer),
            Role::Permit(limit) => *i < *limit as usize,
        })
        .count()
}

/// The contenders among `children` in queue order (by sequence), leaving out those `skip`
/// says are not (forged nodes found earlier).
pub(crate) fn queue(children: &[String], skip: impl Fn(&str) -> bool) -> Vec<(i64, &str)> {
    let mut q: Vec<(i64, &str)> = children
        .iter()
        .filter_map(|c| parse(c).map(|(s, _, _)| (s, c.as_str())))
        .filter(|(_, c)| !skip(c))
        .collect();
    q.sort_unstable();
    q
}

/// Whether a node ahead of ours in the queue, with this name and stat, cannot be a live lock
/// client's node, so that waiting on it would wait forever (a node someone forged by hand):
///
/// * it was created after ours (`czxid`) yet numbered before it: the server numbers sequential
///   children in creation order, so its creator chose the number (no recipe does);
/// * it has Curator's shape and no session owns it: Curator, go-zookeeper and locksmith only
///   make ephemeral nodes. A persistent node of kazoo's shape is a live peer (kazoo's
///   `acquire(ephemeral=False)`) and is waited on.
///
/// Ignoring such a node never lets two clients hold: no peer holds through it either (a peer
/// queued behind it waits on it, a peer ahead of it is ahead of us too).
pub(crate) fn cannot_hold(name: &str, ephemeral_owner: i64, czxid: i64, ours: Option<i64>) -> bool {
    if ours.is_some_and(|ours| czxid > ours) {
        return true;
    }
    ephemeral_owner == 0 && matches!(parse(name), Some((_, Shape::Curator, _)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recipe_is_a_contender_in_sequence_order() {
        let kids: Vec<String> = [
            "_c_b2f1e0a4-59d6-4c1e-9f0e-2f4e7c1d8a90-lock-0000000010", // Curator, protected
            "lock-0000000007",                                         // Curator, plain
            "_c_0123456789abcdef0123456789abcdef-lock-0000000002",     // go-zookeeper, locksmith
            "0123456789abcdef0123456789abcdef__lock__0000000004",      // kazoo
            "0123456789abcdef0123456789abcdef__rlock__0000000005",     // kazoo reader
            "foreign",
            "_bare-0000000001",
            "lock-000000003",
            "lock-x000000003",
            "__lock__-000000001",
            "ba__lock-0000000009", // Curator's rule: the text after the last `lock-`
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let q: Vec<i64> = queue(&kids, |_| false).iter().map(|(s, _)| *s).collect();
        assert_eq!(q, [2, 4, 5, 7, 9, 10]);
        let q = queue(&kids, |c| c == "lock-0000000007");
        assert_eq!(q.len(), 5);
        assert_eq!(parse(&kids[3]), Some((4, Shape::Kazoo, Role::Writer)));
        assert_eq!(parse(&kids[4]), Some((5, Shape::Kazoo, Role::Reader)));
        assert_eq!(parse(&kids[0]), Some((10, Shape::Curator, Role::Writer)));
    }

    #[test]
    fn own_names_are_contenders_of_their_shape() {
        let t = "0123456789abcdef0123456789abcdef";
        let name = |interop: Interop, mode| {
            interop
                .node_prefix(t, mode)
                .map(|p| format!("{p}0000000001"))
        };
        let curator = name(Interop::Curator, LockMode::Exclusive).unwrap();
        let kazoo = name(Interop::Kazoo, LockMode::Exclusive).unwrap();
        assert_eq!(curator, format!("_c_{t}-lock-0000000001"));
        assert_eq!(parse(&curator), Some((1, Shape::Curator, Role::Writer)));
        assert_eq!(parse(&kazoo), Some((1, Shape::Kazoo, Role::Writer)));
        let reader = name(Interop::Curator, LockMode::Shared).unwrap();
        assert_eq!(reader, format!("_c_{t}-__READ__0000000001"));
        assert_eq!(parse(&reader), Some((1, Shape::Curator, Role::Reader)));
        let kazoo_reader = name(Interop::Kazoo, LockMode::Shared).unwrap();
        assert_eq!(kazoo_reader, format!("{t}__rlock__0000000001"));
        assert_eq!(parse(&kazoo_reader), Some((1, Shape::Kazoo, Role::Reader)));
        let permit = name(Interop::Curator, LockMode::Permit { limit: 12 }).unwrap();
        assert_eq!(permit, format!("_c_{t}-__PERMIT__12-lock-0000000001"));
        assert_eq!(parse(&permit), Some((1, Shape::Curator, Role::Permit(12))));
        // Curator's mutex sorts by the text after the last `lock-`: the sequence.
        let curator_sort = |n: &str| n.rsplit_once("lock-").map_or(n, |(_, s)| s).to_owned();
        assert_eq!(curator_sort(&permit), "0000000001");
        // A permit node of an earlier release is still a permit.
        assert_eq!(
            parse(&format!("_c_{t}-__PERMIT__12-0000000002")),
            Some((2, Shape::Curator, Role::Permit(12)))
        );
        assert_eq!(name(Interop::Kazoo, LockMode::Permit { limit: 12 }), None);
    }

    #[test]
    fn curator_read_write_names_and_malformed_permits() {
        assert_eq!(
            parse("_c_5e2b-__WRIT__0000000003"),
            Some((3, Shape::Curator, Role::Writer))
        );
        assert_eq!(
            parse("_c_5e2b-__READ__0000000004"),
            Some((4, Shape::Curator, Role::Reader))
        );
        for bad in [
            "_c_x-__PERMIT__-0000000001",
            "_c_x-__PERMIT__3x-0000000001",
            "_c_x-__PERMIT__3_0000000001",
            "_c_x-__PERMIT__99999999999-0000000001",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn writers_wait_for_all_readers_for_writers_permits_for_a_place() {
        use Role::{Permit, Reader, Writer};
        let ex = LockMode::Exclusive;
        let sh = LockMode::Shared;
        let p2 = LockMode::Permit { limit: 2 };
        assert_eq!(standing(&[], ex), Standing::Holds);
        assert_eq!(standing(&[Reader, Reader], ex), Standing::Waits(vec![1]));
        assert_eq!(standing(&[Reader, Reader], sh), Standing::Holds);
        // A waiting writer queues later readers; the reader waits for the last writer ahead.
        assert_eq!(
            standing(&[Reader, Writer, Reader, Writer, Reader], sh),
            Standing::Waits(vec![3])
        );
        assert_eq!(standing(&[Permit(2)], p2), Standing::Holds);
        // Behind a full semaphore: the `limit` nearest, so any release wakes the first waiter.
        assert_eq!(
            standing(&[Permit(2), Permit(2), Permit(2)], p2),
            Standing::Waits(vec![1, 2])
        );
        for (ahead, mode) in [
            (vec![Permit(3)], p2),
            (vec![Reader], p2),
            (vec![Writer], p2),
            (vec![Permit(2)], sh),
            (vec![Permit(2)], ex),
        ] {
            assert!(
                matches!(standing(&ahead, mode), Standing::Conflict(_)),
                "{ahead:?} {mode}"
            );
        }
    }

    #[test]
    fn holders_are_the_prefix_that_may_hold() {
        use Role::{Permit, Reader, Writer};
        assert_eq!(holders(&[]), 0);
        assert_eq!(holders(&[Writer, Reader, Writer]), 1);
        assert_eq!(holders(&[Reader, Reader, Writer, Reader]), 2);
        assert_eq!(holders(&[Permit(2), Permit(2), Permit(2)]), 2);
        assert_eq!(holders(&[Permit(5), Permit(5)]), 2);
    }

    #[test]
    fn only_unnumbered_or_sessionless_curator_nodes_cannot_hold() {
        let curator = "_c_x-lock-0000000001";
        let kazoo = "x__lock__0000000001";
        // Created after ours but numbered before: forged, whatever its shape.
        assert!(cannot_hold(kazoo, 7, 200, Some(100)));
        // Persistent: forged for Curator's shape, a live kazoo (ephemeral=False) otherwise.
        assert!(cannot_hold(curator, 0, 50, Some(100)));
        assert!(!cannot_hold(kazoo, 0, 50, Some(100)));
        assert!(!cannot_hold(curator, 7, 50, Some(100)));
        assert!(!cannot_hold(curator, 7, 200, None));
    }
}
