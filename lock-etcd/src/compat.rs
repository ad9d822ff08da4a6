//! The compatibility table's cells of etcd (see [`lockcore::compatibility`]): locksmith's
//! layout is etcd's own `concurrency` recipes' (one queue of keys under the name's prefix,
//! ordered by create revision), so the peers need no setting.

use lockcore::compatibility::ways::{CAMPAIGN, EXCLUSIVE, MULTI, PERMITS, SHARED};
use lockcore::{Compatibility, Relation, WayKind};

const MUTEX: &str = "peer: etcdctl lock / Go concurrency.Mutex";
const ELECTION: &str = "peer: etcdctl elect / Go concurrency.Election";

/// etcd's own ways and cells beyond the contract's.
pub(crate) fn table() -> Compatibility {
    let tests = "lock-etcd tests/interop.rs";
    let own = [EXCLUSIVE, SHARED, PERMITS, MULTI, CAMPAIGN];
    let mut t = Compatibility::default()
        .way(
            MUTEX,
            WayKind::Peer,
            "<pfx>/<lease id>, holds when its key is the oldest under the prefix",
        )
        .way(
            ELECTION,
            WayKind::Peer,
            "<pfx>/<lease id> with the proposal, leads when its key is the oldest",
        );
    for peer in [MUTEX, ELECTION] {
        // The peer waits for every older key whatever it is; locksmith sees the peer's key as
        // an exclusive holder (a permit asked for beside it is a Conflict).
        t = t.cells_with(peer, &own, Relation::Exclude);
    }
    t = t
        .cell_tested_by(EXCLUSIVE, MUTEX, Relation::Exclude, tests)
        .cell_tested_by(CAMPAIGN, ELECTION, Relation::Exclude, tests)
        .cells_among(&[MUTEX, ELECTION], Relation::Exclude);
    t
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_has_every_cell() {
        super::table().assert_complete();
    }
}
