//! The compatibility table: for every pair of ways to take one name on a backend, whether the
//! second excludes the first, holds beside it, or is refused. Declared once per backend, beside
//! its capabilities ([`Capabilities::compatibility`]), shown in the conformance report with each
//! cell's result, and checked by the suite's `compat` family on the real servers.
//!
//! The ways every backend has (as far as its capabilities go) and their cells come from the
//! contract ([`Compatibility::core`]): an exclusive lock, a shared lock, one of N permits, a
//! member of a multi-lock and a campaign. A backend adds its own: its other settings on one
//! name (a SQL strategy, an `interop=` layout, PostgreSQL's transaction lock) and the peers
//! each layout follows (Curator, kazoo, etcdctl, redis-py, Redisson, sqlx, `GET_LOCK`), with
//! their cells.
//!
//! "The two ignore each other" is never a silent cell: where two ways cannot see each other,
//! the backend makes them exclude, refuses the second with a typed error
//! ([`Relation::Refuse`]), or, where neither is in its power (a peer that reads only its own
//! layout), declares the limit with its reason ([`Relation::Limit`]) and says it in its docs.

use std::fmt;

use serde::Serialize;

use crate::{Capabilities, Support};

/// How the suite (or a backend's own tests) takes a name in one way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WayKind {
    /// [`Locker::try_lock`](crate::Locker::try_lock) with the default options.
    Exclusive,
    /// [`LockOptions::shared`](crate::LockOptions::shared).
    Shared,
    /// [`LockOptions::permits`](crate::LockOptions::permits), every client with one limit.
    Permits,
    /// A member of [`Locker::try_lock_all`](crate::Locker::try_lock_all).
    MultiMember,
    /// [`Locker::campaign`](crate::Locker::campaign).
    Campaign,
    /// A locksmith client with another setting of the backend (a strategy, an `interop=`
    /// layout, a transaction lock): checked by the backend crate's tests.
    Setting,
    /// Another program (a peer library or tool): checked by the backend crate's interop tests.
    Peer,
}

impl WayKind {
    /// Whether the suite takes it through an ordinary client of the backend.
    pub fn is_client(self) -> bool {
        !matches!(self, WayKind::Setting | WayKind::Peer)
    }
}

/// One way to take a name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Way {
    /// Its identifier in the table (`exclusive`, `interop=redis-py`, `peer: redis-py Lock`).
    pub id: String,
    /// How it is taken.
    pub kind: WayKind,
    /// One line: what it is.
    pub about: String,
}

/// What happens when a name held one way is asked for another way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "relation", content = "reason", rename_all = "snake_case")]
pub enum Relation {
    /// The second is kept out while the first holds: contention (`Ok(None)`, a wait), or, where
    /// the backend notices the other use, a [`Conflict`](crate::ErrorKind::Conflict) refusal.
    Exclude,
    /// Both hold together (shared holders; permits up to their limit).
    Share,
    /// The second is refused with a typed error (`Conflict` or `InvalidConfig`) at or before
    /// its first request, whether or not the first holds; the reason says why.
    Refuse(String),
    /// A documented limit: the two do not see each other, and neither side is locksmith's to
    /// change (a peer reading only its own layout). The reason says what to do instead.
    Limit(String),
}

impl Relation {
    /// A short label: `exclude`, `share`, `refuse`, `limit`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Relation::Exclude => "exclude",
            Relation::Share => "share",
            Relation::Refuse(_) => "refuse",
            Relation::Limit(_) => "limit",
        }
    }

    /// The reason of a refusal or a limit.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Relation::Refuse(r) | Relation::Limit(r) => Some(r),
            _ => None,
        }
    }
}

impl fmt::Display for Relation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            Some(r) => write!(f, "{}: {r}", self.as_str()),
            None => f.write_str(self.as_str()),
        }
    }
}

/// One cell: the name held the `first` way, then asked for the `second` way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cell {
    /// The way the name is held ([`Way::id`]).
    pub first: String,
    /// The way it is then asked for.
    pub second: String,
    /// What happens.
    pub relation: Relation,
    /// The test that checks it, where it is not the suite's `compat` family (a backend crate's
    /// interop test).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tested_by: Option<String>,
}

/// A backend's compatibility table: its ways and a cell per ordered pair of them.
///
/// ```
/// use lockcore::{Capabilities, Compatibility, Relation, WayKind};
/// let table = Compatibility::core(&Capabilities::default())
///     .way("interop=x", WayKind::Setting, "another layout")
///     .cell("exclusive", "interop=x", Relation::Exclude);
/// assert_eq!(table.relation("interop=x", "exclusive"), Some(&Relation::Exclude));
/// assert!(table.missing().len() > 0); // interop=x against itself, multi-lock members, ...
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Compatibility {
    ways: Vec<Way>,
    cells: Vec<Cell>,
}

/// The core ways' identifiers.
pub mod ways {
    /// [`WayKind::Exclusive`](super::WayKind::Exclusive).
    pub const EXCLUSIVE: &str = "exclusive";
    /// [`WayKind::Shared`](super::WayKind::Shared).
    pub const SHARED: &str = "shared";
    /// [`WayKind::Permits`](super::WayKind::Permits).
    pub const PERMITS: &str = "permits";
    /// [`WayKind::MultiMember`](super::WayKind::MultiMember).
    pub const MULTI: &str = "multi-lock member";
    /// [`WayKind::Campaign`](super::WayKind::Campaign).
    pub const CAMPAIGN: &str = "campaign";
}

impl Compatibility {
    /// The contract's ways that `caps` allow (exclusive, multi-lock member and campaign always;
    /// shared and permits where declared) and their cells: every exclusive use (a lock, a
    /// multi-lock member, a campaign) excludes every other use; shared holders share; permit
    /// holders share up to their limit; a shared holder and a permit holder exclude each
    /// other (a name is a read-write lock or a semaphore, not both: a backend that notices
    /// refuses the second with `Conflict`).
    pub fn core(caps: &Capabilities) -> Compatibility {
        use ways::*;
        let mut t = Compatibility::default()
            .way(EXCLUSIVE, WayKind::Exclusive, "Locker::lock / try_lock")
            .way(
                MULTI,
                WayKind::MultiMember,
                "one name of Locker::lock_all / try_lock_all",
            )
            .way(
                CAMPAIGN,
                WayKind::Campaign,
                "Locker::campaign: the leader holds the name",
            );
        if caps.shared == Support::Yes {
            t = t.way(SHARED, WayKind::Shared, "LockOptions::shared: a reader");
        }
        if caps.permits == Support::Yes {
            t = t.way(
                PERMITS,
                WayKind::Permits,
                "LockOptions::permits(N): one of N permits, every client with the same N",
            );
        }
        let ids: Vec<String> = t.ways.iter().map(|w| w.id.clone()).collect();
        for a in &ids {
            for b in &ids {
                let relation = match (a.as_str(), b.as_str()) {
                    (SHARED, SHARED) | (PERMITS, PERMITS) => Relation::Share,
                    _ => Relation::Exclude,
                };
                t = t.cell_ordered(a, b, relation);
            }
        }
        t
    }

    /// Adds (or replaces) a way.
    pub fn way(mut self, id: &str, kind: WayKind, about: &str) -> Compatibility {
        self.ways.retain(|w| w.id != id);
        self.ways.push(Way {
            id: id.to_owned(),
            kind,
            about: about.to_owned(),
        });
        self
    }

    /// Sets the cells `first` then `second` and `second` then `first` to `relation`.
    pub fn cell(self, first: &str, second: &str, relation: Relation) -> Compatibility {
        self.cell_ordered(first, second, relation.clone())
            .cell_ordered(second, first, relation)
    }

    /// [`Compatibility::cell`], checked by `test` (a backend crate's test) rather than by the
    /// suite.
    pub fn cell_tested_by(
        self,
        first: &str,
        second: &str,
        relation: Relation,
        test: &str,
    ) -> Compatibility {
        let mut t = self.cell(first, second, relation);
        for c in &mut t.cells {
            if (c.first == first && c.second == second) || (c.first == second && c.second == first)
            {
                c.tested_by = Some(test.to_owned());
            }
        }
        t
    }

    /// Sets the one cell `first` then `second`.
    pub fn cell_ordered(mut self, first: &str, second: &str, relation: Relation) -> Compatibility {
        self.cells
            .retain(|c| !(c.first == first && c.second == second));
        self.cells.push(Cell {
            first: first.to_owned(),
            second: second.to_owned(),
            relation,
            tested_by: None,
        });
        self
    }

    /// Sets every cell between `way` and each way in `others` (both orders) to `relation`.
    pub fn cells_with(self, way: &str, others: &[&str], relation: Relation) -> Compatibility {
        others
            .iter()
            .fold(self, |t, o| t.cell(way, o, relation.clone()))
    }

    /// Sets every cell among `ways` (each pair in both orders, and each way beside itself) to
    /// `relation`: a family of peers that all exclude one another, say.
    pub fn cells_among(self, ways: &[&str], relation: Relation) -> Compatibility {
        ways.iter().enumerate().fold(self, |t, (i, w)| {
            t.cells_with(w, &ways[i..], relation.clone())
        })
    }

    /// The identifiers of the ways of `kind`s the suite takes through a client.
    pub fn client_ways(&self) -> Vec<&str> {
        self.ways
            .iter()
            .filter(|w| w.kind.is_client())
            .map(|w| w.id.as_str())
            .collect()
    }

    /// Every way, in declaration order.
    pub fn ways(&self) -> &[Way] {
        &self.ways
    }

    /// A way by its identifier.
    pub fn find(&self, id: &str) -> Option<&Way> {
        self.ways.iter().find(|w| w.id == id)
    }

    /// Every cell.
    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }

    /// The cell `first` then `second`.
    pub fn cell_of(&self, first: &str, second: &str) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.first == first && c.second == second)
    }

    /// What happens when the name is held `first` and asked for `second`.
    pub fn relation(&self, first: &str, second: &str) -> Option<&Relation> {
        self.cell_of(first, second).map(|c| &c.relation)
    }

    /// The ordered pairs of ways with no cell: a complete table has none.
    pub fn missing(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for a in &self.ways {
            for b in &self.ways {
                if self.cell_of(&a.id, &b.id).is_none() {
                    out.push((a.id.clone(), b.id.clone()));
                }
            }
        }
        out
    }

    /// A backend's own table (its settings and peers) as it stands beside every core way
    /// (exclusive, shared, permits, multi-lock member, campaign): the whole table a backend
    /// declaring every mode would show. Its tests check it has no [`Compatibility::missing`]
    /// cell.
    pub fn beside_every_mode(&self) -> Compatibility {
        Capabilities {
            shared: Support::Yes,
            permits: Support::Yes,
            compatibility: self.clone(),
            ..Capabilities::default()
        }
        .compatibility_table()
    }

    /// Panics naming the missing cells unless this backend table, beside every core way
    /// ([`Compatibility::beside_every_mode`]), has a cell for every ordered pair of ways: the
    /// check each backend's unit tests make of its table. Returns the whole table for further
    /// checks.
    pub fn assert_complete(&self) -> Compatibility {
        let whole = self.beside_every_mode();
        let missing = whole.missing();
        assert!(
            missing.is_empty(),
            "cells missing from the table: {missing:?}"
        );
        whole
    }

    /// This table with `other`'s ways and cells added (`other` wins where both have one).
    pub fn merged(mut self, other: &Compatibility) -> Compatibility {
        for w in &other.ways {
            self = self.way(&w.id, w.kind, &w.about);
        }
        for c in &other.cells {
            self = self.cell_ordered(&c.first, &c.second, c.relation.clone());
            if let Some(t) = &c.tested_by
                && let Some(last) = self.cells.last_mut()
            {
                last.tested_by = Some(t.clone());
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_core_table_is_complete_and_exclusive_uses_exclude() {
        let caps = Capabilities {
            shared: Support::Yes,
            permits: Support::Yes,
            ..Capabilities::default()
        };
        let t = Compatibility::core(&caps);
        assert_eq!(t.ways().len(), 5);
        assert!(t.missing().is_empty(), "{:?}", t.missing());
        use ways::*;
        for w in [EXCLUSIVE, MULTI, CAMPAIGN, SHARED, PERMITS] {
            assert_eq!(t.relation(CAMPAIGN, w), Some(&Relation::Exclude), "{w}");
            assert_eq!(t.relation(w, EXCLUSIVE), Some(&Relation::Exclude), "{w}");
        }
        assert_eq!(t.relation(SHARED, SHARED), Some(&Relation::Share));
        assert_eq!(t.relation(PERMITS, PERMITS), Some(&Relation::Share));
        assert_eq!(t.relation(SHARED, PERMITS), Some(&Relation::Exclude));
        // Without shared locks or permits, neither way is listed.
        let bare = Compatibility::core(&Capabilities::default());
        assert_eq!(bare.ways().len(), 3);
        assert!(bare.missing().is_empty());
    }

    #[test]
    fn a_backend_adds_its_ways_and_the_table_says_what_is_missing() {
        let t = Compatibility::core(&Capabilities::default())
            .way("interop=x", WayKind::Setting, "another layout")
            .cells_with(
                "interop=x",
                &[ways::EXCLUSIVE, ways::MULTI, ways::CAMPAIGN, "interop=x"],
                Relation::Exclude,
            );
        assert!(t.missing().is_empty(), "{:?}", t.missing());
        let extra = Compatibility::default().cell_tested_by(
            "interop=x",
            ways::EXCLUSIVE,
            Relation::Refuse("no".into()),
            "some_test",
        );
        let merged = t.merged(&extra);
        let c = merged.cell_of(ways::EXCLUSIVE, "interop=x").unwrap();
        assert_eq!(c.relation.as_str(), "refuse");
        assert_eq!(c.tested_by.as_deref(), Some("some_test"));
        assert_eq!(merged.client_ways().len(), 3);
    }
}
