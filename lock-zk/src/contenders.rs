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
//! The sequence is the server's 10-digit counter of the lock node, shared by every sequential
//! child whoever made it: ordering every recipe's nodes by it is the one order all of them agree
//! on (Curator's text order of 10 digits is the numeric order), which makes a mixed queue fair.
//! A child with none of these markers right before its sequence is made by no lock client, so
//! nobody holds a lock through it: it is not a contender (Curator sorts such a child by its whole
//! name, and waits on it only if that text sorts before its own sequence).

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

    /// The name of this client's node before the sequence the server appends: the owner token
    /// (32 hex digits) comes first in both layouts, so a create whose reply was lost is found
    /// again by it (Curator's protection mode).
    pub(crate) fn node_prefix(self, owner_hex: &str) -> String {
        match self {
            Interop::Curator => format!("_c_{owner_hex}-{CURATOR_MARK}"),
            Interop::Kazoo => format!("{owner_hex}{KAZOO_MARK}"),
        }
    }
}

/// Curator's `lock-` (`InterProcessMutex`'s lock name), also go-zookeeper's.
const CURATOR_MARK: &str = "lock-";
/// kazoo's `Lock._NODE_NAME` (writers).
const KAZOO_MARK: &str = "__lock__";
/// kazoo's `ReadLock._NODE_NAME`: a reader holds against writers, and locksmith is a writer.
const KAZOO_READ_MARK: &str = "__rlock__";
/// Digits of a server-assigned sequence number (`%010d`).
const SEQ_LEN: usize = 10;

/// Which recipe's rule makes a child a contender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `...lock-<seq>`: Curator, go-zookeeper, locksmith's default layout.
    Curator,
    /// `...__lock__<seq>` or `...__rlock__<seq>`: kazoo, locksmith's `interop=kazoo`.
    Kazoo,
}

/// `(sequence, shape)` of a contender's node name; `None` for a child no lock client makes.
pub(crate) fn parse(name: &str) -> Option<(i64, Shape)> {
    let cut = name.len().checked_sub(SEQ_LEN)?;
    let (head, seq) = (name.get(..cut)?, &name[cut..]);
    if !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let shape = if head.ends_with(CURATOR_MARK) {
        Shape::Curator
    } else if head.ends_with(KAZOO_MARK) || head.ends_with(KAZOO_READ_MARK) {
        Shape::Kazoo
    } else {
        return None;
    };
    Some((seq.parse().ok()?, shape))
}

/// The contenders among `children` in queue order (by sequence), leaving out those `skip`
/// says are not (forged nodes found earlier).
pub(crate) fn queue(children: &[String], skip: impl Fn(&str) -> bool) -> Vec<(i64, &str)> {
    let mut q: Vec<(i64, &str)> = children
        .iter()
        .filter_map(|c| parse(c).map(|(s, _)| (s, c.as_str())))
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
    ephemeral_owner == 0 && matches!(parse(name), Some((_, Shape::Curator)))
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
        assert_eq!(parse(&kids[3]), Some((4, Shape::Kazoo)));
        assert_eq!(parse(&kids[0]), Some((10, Shape::Curator)));
    }

    #[test]
    fn own_names_are_contenders_of_their_shape() {
        let t = "0123456789abcdef0123456789abcdef";
        let curator = format!("{}0000000001", Interop::Curator.node_prefix(t));
        let kazoo = format!("{}0000000001", Interop::Kazoo.node_prefix(t));
        assert_eq!(curator, format!("_c_{t}-lock-0000000001"));
        assert_eq!(parse(&curator), Some((1, Shape::Curator)));
        assert_eq!(parse(&kazoo), Some((1, Shape::Kazoo)));
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
