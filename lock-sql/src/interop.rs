//! `interop=...`: session locks shared with another client of the same database, on the peer's
//! own lock key (its name-to-key mapping), with the row-lock strategy's machinery (a connection
//! of its own per holder, the server's queue, health checks, the idle guard).
//!
//! * `interop=sqlx` (PostgreSQL): sqlx's `PgAdvisoryLock::new(name)` key, a `bigint` derived
//!   from the name by HKDF-SHA256 (no salt, info `SQLx (Rust) Postgres advisory lock`, 8
//!   bytes, little-endian; `sqlx-postgres` 0.9 `src/advisory_lock.rs`), taken with the
//!   session-level `pg_advisory_lock(bigint)` sqlx's `acquire` uses. The key is computed by
//!   sqlx's own function, the sqlx version this crate is built with.
//! * `interop=get_lock` (MariaDB/MySQL): `GET_LOCK(name, timeout)` with the exact name, as
//!   scripts and many tools call it.
//!
//! What holds and what does not is in [`Interop::notes`] (and the backend's capabilities). A
//! mode never weakens mutual exclusion: both sides take the very same server lock. It refuses,
//! before any I/O, names the peer would map differently ([`Interop::check_name`]).

use lockcore::{Capabilities, Error, LockName, Result};

/// The client whose lock keys an SQL backend follows (`interop=` in the URL, `interop` in a
/// config file). Needs `strategy=row-lock` (both peers hold session locks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize)]
#[non_exhaustive]
pub enum Interop {
    /// sqlx's `PgAdvisoryLock::new(name)` (PostgreSQL).
    #[serde(rename = "sqlx")]
    Sqlx,
    /// `GET_LOCK(name, timeout)` with the exact name (MariaDB, MySQL).
    #[serde(rename = "get_lock", alias = "get-lock")]
    GetLock,
}

/// The longest name `GET_LOCK` takes on MySQL 5.7+ (64 characters); MariaDB 10.11 takes up to
/// 192 bytes, but a name a MySQL peer cannot lock is refused here too.
pub const MAX_GET_LOCK_CHARS: usize = 64;

/// MariaDB's limit in bytes (`NAME_LEN`: 64 characters of up to 3 bytes), measured on 10.11:
/// 193 bytes fail with error 1059.
pub const MAX_GET_LOCK_BYTES: usize = 192;

impl Interop {
    /// The value of `interop=` that names this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Interop::Sqlx => "sqlx",
            Interop::GetLock => "get_lock",
        }
    }

    /// Refuses names the peer would map differently or not at all (before any I/O).
    ///
    /// # Errors
    /// `InvalidName`: under `get_lock`, a name longer than [`MAX_GET_LOCK_CHARS`] characters or
    /// [`MAX_GET_LOCK_BYTES`] bytes (the server would refuse it or a MySQL peer could not lock
    /// it). sqlx maps every string to a key: no name is refused.
    pub fn check_name(self, name: &LockName) -> Result<()> {
        match self {
            Interop::Sqlx => Ok(()),
            Interop::GetLock => {
                let chars = name.as_str().chars().count();
                let bytes = name.as_str().len();
                if chars > MAX_GET_LOCK_CHARS || bytes > MAX_GET_LOCK_BYTES {
                    return Err(Error::invalid_name(format!(
                        "interop=get_lock: GET_LOCK takes names of at most \
                         {MAX_GET_LOCK_CHARS} characters ({MAX_GET_LOCK_BYTES} bytes on MariaDB); \
                         this one has {chars} characters, {bytes} bytes"
                    )));
                }
                Ok(())
            }
        }
    }

    /// The capabilities in this mode, from the row-lock strategy's.
    pub(crate) fn capabilities(self, mut c: Capabilities) -> Capabilities {
        // The peer bumps no counter: a token from this side would not order the peer's holders.
        c.fencing = false;
        // The peer writes no lock row (no holder metadata), and the row-lock inspect names
        // locksmith's own key.
        c.inspect = false;
        c.notes.retain(|n| !n.contains("fencing"));
        if self == Interop::Sqlx {
            // The key is sqlx's, whose PgAdvisoryLock takes it exclusively only: shared
            // holders would have no counterpart on the peer's side.
            c.shared = lockcore::Support::no(
                "interop=sqlx: sqlx's PgAdvisoryLock is exclusive only; readers need \
                 strategy=row-lock without interop (pg_advisory_lock_shared on locksmith's key)",
            );
            c.notes.retain(|n| !n.contains("pg_advisory_lock_shared"));
        }
        c.notes.extend(self.notes().iter().map(|n| (*n).to_owned()));
        c
    }

    /// What of the contract holds in this mode, and what the peer lacks.
    pub fn notes(self) -> &'static [&'static str] {
        match self {
            Interop::Sqlx => &[
                "interop=sqlx: the session advisory lock on sqlx's PgAdvisoryLock::new(name) key \
                 (HKDF-SHA256 of the name, 8 bytes little-endian, pg_advisory_lock(bigint)): a \
                 sqlx PgAdvisoryLock of the same name and this backend exclude each other",
                "interop=sqlx: a holder also takes the default layout's key of the name and backs \
                 off from a live lease of it: default-layout row locks, PgXactLock and leases of \
                 the same table exclude it, in both orders (sqlx's own lock sees neither)",
                "interop=sqlx: fair (PostgreSQL queues advisory-lock waiters of both sides in \
                 arrival order) and notified (the server wakes the next waiter); no fencing \
                 tokens (sqlx keeps no counter); the lock lives as long as the holder's session, \
                 on both sides",
                "interop=sqlx: sqlx's own lock has no TTL, idle guard or health check: a wedged \
                 sqlx holder keeps the lock as long as its connection lives",
            ],
            Interop::GetLock => &[
                "interop=get_lock: GET_LOCK(name, timeout) with the exact name (at most 64 \
                 characters): any session that calls GET_LOCK with the same name excludes this \
                 backend and is excluded by it",
                "interop=get_lock: a holder also takes the default layout's key of the name and \
                 backs off from a live lease of it: default-layout row locks and leases of the \
                 same table exclude it, in both orders (a plain GET_LOCK peer sees neither)",
                "interop=get_lock: not fair (MariaDB promises no order among GET_LOCK waiters) \
                 but notified (the server wakes a waiter on RELEASE_LOCK); no fencing tokens (a \
                 peer bumps no counter); the lock lives as long as the holder's session, on both \
                 sides",
                "interop=get_lock: lock names compare as the server compares them (MariaDB 10.11: \
                 byte for byte, case-sensitive, trailing spaces significant; both sides must use \
                 the same connection character set, utf8mb4 here)",
                "interop=get_lock: a peer's GET_LOCK has no TTL or health check: a wedged peer \
                 keeps the lock as long as its session lives (its wait_timeout)",
            ],
        }
    }
}

impl std::fmt::Display for Interop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// sqlx's advisory-lock key of `name`, computed by sqlx's own `PgAdvisoryLock::new` (always a
/// `bigint` key: sqlx documents it, and the unit test below checks sqlx's own example).
#[cfg(feature = "postgres")]
pub(crate) fn sqlx_key(name: &LockName) -> i64 {
    sqlx::postgres::PgAdvisoryLock::new(name.as_str())
        .key()
        .as_bigint()
        .expect("PgAdvisoryLock::new derives a bigint key")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The derivation is the one sqlx documents, checked with its own example, and the
    /// published algorithm (HKDF-SHA256, no salt, sqlx's info string, little-endian).
    #[cfg(feature = "postgres")]
    #[test]
    fn sqlx_key_is_sqlx_own() {
        let name = LockName::new("my first Postgres advisory lock!").unwrap();
        assert_eq!(sqlx_key(&name), -5560419505042474287);
    }

    /// PostgreSQL's row lock gives readers, but not on sqlx's key (sqlx's lock is exclusive
    /// only), nor on MariaDB's `GET_LOCK`; permits nowhere on row-lock. Each "no" says why.
    #[test]
    fn readers_on_the_postgres_row_lock_but_not_under_interop() {
        use crate::config::{Dialect, Strategy};
        let pg = crate::capabilities::strategy_capabilities(Dialect::Postgres, Strategy::RowLock);
        assert!(pg.shared.is_yes());
        assert!(pg.fair, "a waiting writer holds back later readers");
        let sqlx = Interop::Sqlx.capabilities(pg.clone());
        let why = sqlx
            .shared
            .why_not()
            .expect("no readers under interop=sqlx");
        assert!(why.contains("exclusive only"), "{why}");
        assert!(
            !sqlx
                .notes
                .iter()
                .any(|n| n.contains("pg_advisory_lock_shared")),
            "{:?}",
            sqlx.notes
        );
        let my = crate::capabilities::strategy_capabilities(Dialect::MySql, Strategy::RowLock);
        let my = Interop::GetLock.capabilities(my);
        for caps in [&pg, &sqlx, &my] {
            assert!(caps.permits.why_not().is_some());
        }
        assert!(my.shared.why_not().unwrap().contains("GET_LOCK"));
    }

    #[test]
    fn get_lock_names_are_bounded() {
        let ok = LockName::new("a".repeat(64)).unwrap();
        Interop::GetLock.check_name(&ok).unwrap();
        let e = Interop::GetLock
            .check_name(&LockName::new("a".repeat(65)).unwrap())
            .unwrap_err();
        assert_eq!(e.kind(), lockcore::ErrorKind::InvalidName);
        // 49 characters, but 196 bytes: MariaDB refuses it (error 1059 above 192 bytes).
        let wide = LockName::new("\u{1F512}".repeat(49)).unwrap();
        assert!(Interop::GetLock.check_name(&wide).is_err());
        Interop::Sqlx
            .check_name(&LockName::new("a".repeat(255)).unwrap())
            .unwrap();
    }
}
