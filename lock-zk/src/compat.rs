//! The compatibility table's cells of ZooKeeper's layouts (see [`lockcore::compatibility`]):
//! locksmith's default (Curator-named) nodes, `interop=kazoo`'s kazoo-named ones, and the
//! peers' recipes on one lock node. The limits are the peers' own recipes' (each reads only the
//! names it knows); the crate docs say the same.

use lockcore::compatibility::ways::{CAMPAIGN, EXCLUSIVE, MULTI, PERMITS, SHARED};
use lockcore::{Compatibility, Relation, WayKind};

const KAZOO_MODE: &str = "interop=kazoo";
const KAZOO_MODE_SHARED: &str = "interop=kazoo, shared";
const CURATOR_MUTEX: &str = "peer: Curator InterProcessMutex";
const CURATOR_RW_READ: &str = "peer: Curator read-write lock, reader";
const CURATOR_RW_WRITE: &str = "peer: Curator read-write lock, writer";
const GOZK: &str = "peer: go-zookeeper Lock";
const KAZOO_LOCK: &str = "peer: kazoo Lock";
const KAZOO_READ: &str = "peer: kazoo ReadLock";
const KAZOO_WRITE: &str = "peer: kazoo WriteLock";

/// The default layout's writer-like ways (one exclusive node each).
const WRITERS: [&str; 3] = [EXCLUSIVE, MULTI, CAMPAIGN];

const TESTS: &str = "lock-zk tests/interop.rs";

/// ZooKeeper's own ways and cells beyond the contract's.
pub(crate) fn table() -> Compatibility {
    let not_ours = Relation::Limit(
        "two peers' recipes on one node: each reads only the names it knows; locksmith does not \
         stand between them (see the crate docs: Curator and kazoo do not exclude each other)"
            .into(),
    );
    let kazoo_ignores_curator_names = Relation::Limit(
        "kazoo's recipes read only kazoo's names (__lock__, __rlock__): locksmith clients that \
         share a node with kazoo use interop=kazoo (or kazoo's extra_lock_patterns=[\"-lock-\"])"
            .into(),
    );
    let curator_ignores_kazoo_names = Relation::Limit(
        "Curator and go-zookeeper order kazoo-named nodes by their whole text, not their \
         sequence: a node used with interop=kazoo is not used by Curator or go-zookeeper"
            .into(),
    );
    let curator_rw_sorts_writers_after = Relation::Limit(
        "Curator's read-write lock sorts locksmith's exclusive and permit nodes (-lock-) after \
         its own and does not wait for them: on a node shared with Curator's read-write lock, \
         take it only in shared mode from locksmith"
            .into(),
    );
    let mutex_ignores_readers = Relation::Limit(
        "a plain mutex recipe (Curator's InterProcessMutex, kazoo's Lock) does not see readers' \
         nodes, the peer's own readers' included: on a node with readers, peers take the \
         read-write lock's writer"
            .into(),
    );
    let mut t = Compatibility::default()
        .way(
            KAZOO_MODE,
            WayKind::Setting,
            "an exclusive lock of a client with interop=kazoo: <token>__lock__<seq>",
        )
        .way(
            KAZOO_MODE_SHARED,
            WayKind::Setting,
            "a shared lock of a client with interop=kazoo: <token>__rlock__<seq>",
        )
        .way(CURATOR_MUTEX, WayKind::Peer, "_c_<id>-lock-<seq>")
        .way(CURATOR_RW_READ, WayKind::Peer, "_c_<id>-__READ__<seq>")
        .way(CURATOR_RW_WRITE, WayKind::Peer, "_c_<id>-__WRIT__<seq>")
        .way(
            GOZK,
            WayKind::Peer,
            "_c_<id>-lock-<seq>, every child a contender",
        )
        .way(KAZOO_LOCK, WayKind::Peer, "<id>__lock__<seq>")
        .way(KAZOO_READ, WayKind::Peer, "<id>__rlock__<seq>")
        .way(
            KAZOO_WRITE,
            WayKind::Peer,
            "<id>__lock__<seq>, waits for readers too",
        );
    // locksmith's two layouts: every locksmith client orders every recipe's nodes by sequence.
    let all_default = [EXCLUSIVE, SHARED, PERMITS, MULTI, CAMPAIGN];
    t = t
        .cells_with(KAZOO_MODE, &all_default, Relation::Exclude)
        .cells_among(&[KAZOO_MODE], Relation::Exclude)
        .cells_with(
            KAZOO_MODE_SHARED,
            &[EXCLUSIVE, PERMITS, MULTI, CAMPAIGN, KAZOO_MODE],
            Relation::Exclude,
        )
        .cells_with(
            KAZOO_MODE_SHARED,
            &[SHARED, KAZOO_MODE_SHARED],
            Relation::Share,
        );
    // Curator's mutex and go-zookeeper: every child with `lock-` (go-zookeeper: every child)
    // ordered by sequence; locksmith's permit nodes end in `lock-<seq>` for them.
    for peer in [CURATOR_MUTEX, GOZK] {
        for way in WRITERS {
            t = t.cell_tested_by(way, peer, Relation::Exclude, TESTS);
        }
        t = t.cell_tested_by(PERMITS, peer, Relation::Exclude, TESTS);
        t = t.cells_with(
            peer,
            &[KAZOO_MODE, KAZOO_MODE_SHARED],
            curator_ignores_kazoo_names.clone(),
        );
    }
    t = t
        .cell(SHARED, CURATOR_MUTEX, mutex_ignores_readers.clone())
        .cell(SHARED, GOZK, Relation::Exclude);
    // Curator's read-write lock.
    for peer in [CURATOR_RW_READ, CURATOR_RW_WRITE] {
        for way in [EXCLUSIVE, PERMITS, MULTI, CAMPAIGN] {
            t = t.cell(way, peer, curator_rw_sorts_writers_after.clone());
        }
        t = t.cells_with(
            peer,
            &[KAZOO_MODE, KAZOO_MODE_SHARED],
            curator_ignores_kazoo_names.clone(),
        );
    }
    t = t
        .cell_tested_by(SHARED, CURATOR_RW_READ, Relation::Share, TESTS)
        .cell_tested_by(SHARED, CURATOR_RW_WRITE, Relation::Exclude, TESTS);
    // kazoo: its recipes see only kazoo's names.
    for peer in [KAZOO_LOCK, KAZOO_READ, KAZOO_WRITE] {
        t = t.cells_with(peer, &all_default, kazoo_ignores_curator_names.clone());
        t = t.cell_tested_by(KAZOO_MODE, peer, Relation::Exclude, TESTS);
    }
    t = t
        .cell(KAZOO_MODE_SHARED, KAZOO_LOCK, mutex_ignores_readers.clone())
        .cell_tested_by(KAZOO_MODE_SHARED, KAZOO_READ, Relation::Share, TESTS)
        .cell_tested_by(KAZOO_MODE_SHARED, KAZOO_WRITE, Relation::Exclude, TESTS);
    // The peers among themselves: their own recipes' business.
    let curator_family = [CURATOR_MUTEX, CURATOR_RW_READ, CURATOR_RW_WRITE, GOZK];
    let kazoo_family = [KAZOO_LOCK, KAZOO_READ, KAZOO_WRITE];
    for a in curator_family {
        for b in kazoo_family {
            t = t.cell(a, b, not_ours.clone());
        }
    }
    t = t
        .cells_among(&[CURATOR_MUTEX, GOZK], Relation::Exclude)
        .cell(
            CURATOR_MUTEX,
            CURATOR_RW_READ,
            mutex_ignores_readers.clone(),
        )
        .cell(CURATOR_MUTEX, CURATOR_RW_WRITE, not_ours.clone())
        .cell(GOZK, CURATOR_RW_READ, not_ours.clone())
        .cell(GOZK, CURATOR_RW_WRITE, not_ours.clone())
        .cell(CURATOR_RW_READ, CURATOR_RW_READ, Relation::Share)
        .cell(CURATOR_RW_READ, CURATOR_RW_WRITE, Relation::Exclude)
        .cell(CURATOR_RW_WRITE, CURATOR_RW_WRITE, Relation::Exclude)
        .cells_among(&[KAZOO_LOCK, KAZOO_WRITE], Relation::Exclude)
        .cell(KAZOO_LOCK, KAZOO_READ, mutex_ignores_readers)
        .cell(KAZOO_READ, KAZOO_READ, Relation::Share)
        .cell(KAZOO_READ, KAZOO_WRITE, Relation::Exclude);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_every_cell() {
        let t = table().assert_complete();
        // The issue-33 cells: Curator's mutex waits for permit holders; kazoo's plain Lock and
        // readers are a declared limit, not a silent one.
        assert_eq!(t.relation(PERMITS, CURATOR_MUTEX), Some(&Relation::Exclude));
        assert_eq!(
            t.relation(KAZOO_MODE_SHARED, KAZOO_LOCK)
                .map(Relation::as_str),
            Some("limit")
        );
    }
}
