//! The compatibility table's cells of the SQL backend (see [`lockcore::compatibility`]): its
//! strategies on one table, PostgreSQL's transaction lock, the `interop=` modes and the peers
//! they follow, on one name.
//!
//! On PostgreSQL the lease, the row lock and [`PgXactLock`](crate::PgXactLock) on one table
//! exclude each other (`pg::exclusion`); on MariaDB the lease and the row lock do
//! (`mysql/exclusion.rs`). An `interop=` holder takes the default layout's key beside the peer's
//! and looks at the leases: it excludes the default layout too. A peer takes only its own key,
//! which locksmith's default layout does not take: a declared limit (give every locksmith
//! client of a name shared with the peer the interop mode), not a silent one.

use lockcore::compatibility::ways::{CAMPAIGN, EXCLUSIVE, MULTI, PERMITS, SHARED};
use lockcore::{Compatibility, Relation, WayKind};

use crate::config::Dialect;

const LEASE: &str = "strategy=lease";
const ROW_LOCK: &str = "strategy=row-lock";
const XACT: &str = "PgXactLock";
const SQLX_MODE: &str = "interop=sqlx";
const GET_LOCK_MODE: &str = "interop=get_lock";
const SQLX_PEER: &str = "peer: sqlx PgAdvisoryLock";
const GET_LOCK_PEER: &str = "peer: GET_LOCK(name)";

/// The ways of the client's own strategy (the contract's ways, whichever strategy it runs).
const OWN: [&str; 5] = [EXCLUSIVE, SHARED, PERMITS, MULTI, CAMPAIGN];

/// The SQL backend's own ways and cells beyond the contract's, for `dialect`.
pub(crate) fn table(dialect: Dialect) -> Compatibility {
    let strategies = "lock-sql tests/one_name.rs";
    let mut t = Compatibility::default();
    let (mode, peer, peer_about) = match dialect {
        Dialect::Postgres => (
            SQLX_MODE,
            SQLX_PEER,
            "sqlx's PgAdvisoryLock::new(name): pg_advisory_lock on sqlx's key",
        ),
        Dialect::MySql => (
            GET_LOCK_MODE,
            GET_LOCK_PEER,
            "GET_LOCK(name, timeout) with the exact name",
        ),
        // SQLite: one strategy, no peers.
        _ => return t,
    };
    t = t
        .way(
            LEASE,
            WayKind::Setting,
            "a client with strategy=lease on the same table",
        )
        .way(
            ROW_LOCK,
            WayKind::Setting,
            "a client with strategy=row-lock on the same table",
        )
        .way(mode, WayKind::Setting, "a client following the peer's key")
        .way(peer, WayKind::Peer, peer_about);
    let mut own_strategies = vec![LEASE, ROW_LOCK];
    if dialect == Dialect::Postgres {
        t = t.way(
            XACT,
            WayKind::Setting,
            "PgXactLock on the same table: a transaction-scoped lock",
        );
        own_strategies.push(XACT);
    }
    for s in &own_strategies {
        t = t.cells_with(s, &OWN, Relation::Exclude);
        for s2 in &own_strategies {
            t = t.cell_tested_by(s, s2, Relation::Exclude, strategies);
        }
    }
    // An interop holder takes the peer's key and then the default layout's, and looks at the
    // leases as a default-layout row lock does (`mysql::exclusion::interop_acquire`,
    // `pg::exclusion::interop_takes_name_key`).
    let peer_only = Relation::Limit(format!(
        "{peer} takes only its own key: locksmith clients that share names with it use {mode}"
    ));
    let mut own_ways: Vec<&str> = OWN.to_vec();
    own_ways.extend(&own_strategies);
    for w in &own_ways {
        t = t.cell_tested_by(mode, w, Relation::Exclude, strategies);
    }
    t = t
        .cells_with(peer, &own_ways, peer_only)
        .cell(mode, mode, Relation::Exclude)
        .cell(peer, peer, Relation::Exclude)
        .cell_tested_by(
            mode,
            peer,
            Relation::Exclude,
            "lock-sql tests/interop.rs (the peer's own lock, both orders)",
        );
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_have_every_cell() {
        for dialect in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
            let t = table(dialect).beside_every_mode();
            assert!(t.missing().is_empty(), "{dialect:?}: {:?}", t.missing());
        }
        let my = table(Dialect::MySql);
        assert_eq!(my.relation(ROW_LOCK, LEASE), Some(&Relation::Exclude));
        assert_eq!(my.relation(LEASE, ROW_LOCK), Some(&Relation::Exclude));
        assert_eq!(my.relation(GET_LOCK_MODE, LEASE), Some(&Relation::Exclude));
        assert_eq!(
            my.relation(ROW_LOCK, GET_LOCK_MODE),
            Some(&Relation::Exclude)
        );
        assert_eq!(
            my.relation(GET_LOCK_PEER, LEASE).map(Relation::as_str),
            Some("limit")
        );
        let pg = table(Dialect::Postgres);
        assert_eq!(pg.relation(SQLX_MODE, XACT), Some(&Relation::Exclude));
        assert_eq!(pg.relation(LEASE, SQLX_MODE), Some(&Relation::Exclude));
        assert_eq!(
            pg.relation(SQLX_PEER, ROW_LOCK).map(Relation::as_str),
            Some("limit")
        );
        assert_eq!(pg.relation(XACT, LEASE), Some(&Relation::Exclude));
        assert_eq!(pg.relation(ROW_LOCK, XACT), Some(&Relation::Exclude));
    }
}
