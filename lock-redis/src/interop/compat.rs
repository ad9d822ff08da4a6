//! The compatibility table's cells of Redis's layouts (see [`lockcore::compatibility`]): the
//! default layout, the `interop=` modes and the peers they follow, on one name.

use lockcore::compatibility::ways::{CAMPAIGN, EXCLUSIVE, MULTI, PERMITS, SHARED};
use lockcore::{Compatibility, Relation, WayKind};

const REDIS_PY: &str = "interop=redis-py";
const REDISSON: &str = "interop=redisson";
const PEER_REDIS_PY: &str = "peer: redis-py Lock";
const PEER_REDISSON: &str = "peer: Redisson RLock";

/// The default layout's ways (those a client of either layout may offer: the table lists
/// the ones its capabilities allow).
const DEFAULT_WAYS: [&str; 5] = [EXCLUSIVE, SHARED, PERMITS, MULTI, CAMPAIGN];

/// Redis's own ways and cells beyond the contract's, for a single node (the interop modes
/// are refused on a cluster, so a cluster client has no other layout to meet).
pub(crate) fn table() -> Compatibility {
    let layouts_test = "lock-redis tests/layouts.rs";
    let wrong_type = Relation::Limit(
        "two peers' layouts on one name (a string and a hash at the exact name): Redis answers \
         WRONGTYPE to the second, an error and never a second holder; give each peer its own \
         names"
            .into(),
    );
    let mut t = Compatibility::default()
        .way(
            REDIS_PY,
            WayKind::Setting,
            "a locksmith client with interop=redis-py: a string at the exact name",
        )
        .way(
            REDISSON,
            WayKind::Setting,
            "a locksmith client with interop=redisson: a hash at the exact name",
        )
        .way(
            PEER_REDIS_PY,
            WayKind::Peer,
            "redis-py's Lock (4.3.4): SET name token NX PX",
        )
        .way(
            PEER_REDISSON,
            WayKind::Peer,
            "Redisson's RLock (4.7.0): a hash at the name, its unlock channel",
        );
    for mode in [REDIS_PY, REDISSON] {
        // An interop holder writes the default layout's lock key and checks it and the shares
        // first: both layouts see every holder.
        for way in DEFAULT_WAYS {
            t = t.cell_tested_by(way, mode, Relation::Exclude, layouts_test);
        }
    }
    t = t
        .cell_tested_by(REDIS_PY, REDIS_PY, Relation::Exclude, layouts_test)
        .cell_tested_by(REDISSON, REDISSON, Relation::Exclude, layouts_test)
        .cell_tested_by(REDIS_PY, REDISSON, Relation::Exclude, layouts_test)
        .cell_tested_by(
            PEER_REDIS_PY,
            REDIS_PY,
            Relation::Exclude,
            "lock-redis tests/interop.rs redis_py_*",
        )
        .cell_tested_by(
            PEER_REDISSON,
            REDISSON,
            Relation::Exclude,
            "lock-redis tests/interop.rs redisson_*",
        )
        .cell(PEER_REDIS_PY, PEER_REDIS_PY, Relation::Exclude)
        .cell(PEER_REDISSON, PEER_REDISSON, Relation::Exclude)
        .cell(PEER_REDIS_PY, PEER_REDISSON, wrong_type.clone())
        .cell(PEER_REDIS_PY, REDISSON, wrong_type.clone())
        .cell(PEER_REDISSON, REDIS_PY, wrong_type);
    for (peer, mode) in [(PEER_REDIS_PY, "redis-py"), (PEER_REDISSON, "redisson")] {
        let limit = Relation::Limit(format!(
            "{peer} reads only its own key at the exact name, which the default layout does not \
             write: locksmith clients that share names with it use interop={mode} (which both \
             the peer and locksmith's default layout see)"
        ));
        for way in DEFAULT_WAYS {
            t = t.cell(way, peer, limit.clone());
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_every_cell_and_no_silent_one() {
        let t = table().assert_complete();
        // The two layouts of locksmith itself always exclude each other.
        for way in DEFAULT_WAYS {
            assert_eq!(t.relation(way, REDIS_PY), Some(&Relation::Exclude));
            assert_eq!(t.relation(REDISSON, way), Some(&Relation::Exclude));
        }
    }
}
