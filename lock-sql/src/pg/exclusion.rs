//! PostgreSQL: the ways of taking one name on one lock table exclude each other: a lease
//! (exclusive, shared or a permit), a row lock (exclusive or shared) and a [`PgXactLock`]
//! (crate::PgXactLock).
//!
//! The row lock and the transaction lock are the advisory lock on the name's key
//! (`hashtextextended(name, seed of the table)`); a lease is the lock row's `owner` and
//! `expires_at`, and the rows of `<table>_shares`. Neither could see the other, so each side
//! now looks at the other's:
//!
//! * A lease attempt takes the same advisory key for its transaction
//!   (`pg_try_advisory_xact_lock`; `_shared` for a reader, whom row-lock readers hold beside),
//!   before it touches the lock row. If it cannot, a row-lock holder or a transaction lock has
//!   the name: the attempt is busy (no wait on the key, no wait on the row a transaction lock
//!   may have locked). Held until the attempt commits, the key keeps any row lock or
//!   transaction lock out while the lease is written.
//! * A row lock or transaction lock, once it holds the key, asks [`held_function`] whether a
//!   live lease holds the name (for a reader: a live exclusive lease or permits; lease readers
//!   hold beside it). That function is `VOLATILE` PL/pgSQL, so its query takes a new snapshot:
//!   it sees every lease committed before the key was granted, which the calling statement's
//!   own snapshot (taken before a wait on the key) would not. If one does, the row lock
//!   unlocks the key at once and is busy; a transaction lock's key cannot be unlocked before
//!   its transaction ends, so its `try_lock` is busy and keeps the key until then, and its
//!   waiting `lock()` rolls back a savepoint (which frees it) and looks again later.
//!
//! Either order, one of the two sees the other: no name is held by a lease and a row lock at
//! once, so a fleet moving from one strategy to the other a service at a time never gets two
//! holders. Not under `interop=sqlx`, whose row lock is on sqlx's key, which leases do not
//! take.

use super::table_seed;

/// The version of the lease check's protocol, part of its name (as for the share functions).
const HELD_FUNCTION_VERSION: u32 = 1;

/// The advisory-lock key of the name in SQL parameter `param` on lock table `t`: the row
/// lock's and the transaction lock's.
pub(crate) fn name_key(param: &str, t: &str) -> String {
    format!("hashtextextended({param}, {})", table_seed(t))
}

/// The function answering whether a live lease holds a name: `<t>_lheld1(name text, reader
/// bool) RETURNS bool`, beside the share functions.
pub(crate) fn held_function(t: &str) -> String {
    crate::shares::routine(t, "lheld", HELD_FUNCTION_VERSION)
}

/// A SQL boolean: whether a live lease holds the name in `param` against a taker in exclusive
/// mode (`reader` false: an owner or any share) or a reader (true: an owner or a permit).
pub(crate) fn lease_holds(t: &str, param: &str, reader: bool) -> String {
    format!("{}({param}, {reader})", held_function(t))
}

/// `got` (a SQL boolean: the session advisory lock was just taken) unless a live lease holds
/// the name, in which case the lock is given back (`unlock`, a SQL boolean expression that
/// unlocks it) and the answer is false.
pub(crate) fn unless_leased(t: &str, got: &str, unlock: &str, reader: bool) -> String {
    format!(
        "CASE WHEN {got} THEN CASE WHEN {} THEN NOT {unlock} ELSE true END ELSE false END",
        lease_holds(t, "$1", reader)
    )
}

/// The statement of a DO block that creates [`held_function`] of lock table `t` if missing
/// (run under the DDL's advisory lock, as the share functions are).
pub(crate) fn held_function_ddl(t: &str) -> String {
    let f = held_function(t);
    let s = crate::shares::table(t);
    format!(
        "IF to_regprocedure('{f}(text, bool)') IS NULL THEN \
         CREATE FUNCTION {f}(text, bool) RETURNS bool \
         LANGUAGE plpgsql VOLATILE AS $f$ \
         DECLARE v bool; \
         BEGIN \
           SELECT EXISTS (SELECT 1 FROM {t} WHERE name = $1 AND owner IS NOT NULL \
               AND expires_at > clock_timestamp()) \
             OR EXISTS (SELECT 1 FROM {s} WHERE name = $1 AND expires_at > clock_timestamp() \
               AND (NOT $2 OR mode <> 'shared')) \
             INTO v; \
           RETURN v; \
         END $f$; \
         END IF;"
    )
}

/// The lease side: a SQL boolean taking the name's key for the attempt's transaction
/// (`_shared` for a reader), true when taken.
pub(crate) fn lease_takes_key(t: &str, param: &str, reader: &str) -> String {
    let key = name_key(param, t);
    format!(
        "CASE WHEN {reader} THEN pg_try_advisory_xact_lock_shared({key}) \
         ELSE pg_try_advisory_xact_lock({key}) END"
    )
}
