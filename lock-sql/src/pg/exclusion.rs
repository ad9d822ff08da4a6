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
//!   (`pg_advisory_xact_lock`; `_shared` for a reader, whom row-lock readers hold beside),
//!   before it touches the lock row, waiting [`KEY_WAIT`] at most: other lease attempts hold
//!   it for their statement only (a set for its few), as they held the row before; a row-lock
//!   holder or a transaction lock holds it for as long as it has the name, and the attempt is
//!   then busy (it never waits on the row a transaction lock may have locked). Held until the
//!   attempt commits, the key keeps any row lock or transaction lock out while the lease is
//!   written.
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
//! holders. An `interop=sqlx` row lock holds sqlx's key and then this one
//! ([`interop_takes_name_key`]): it takes part as a row lock does; sqlx's own lock does not.

use super::names::table_seed;

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
/// the name (in SQL parameter `param`), in which case the lock is given back (`unlock`, a SQL
/// boolean expression that unlocks it) and the answer is false.
pub(crate) fn unless_leased(t: &str, param: &str, got: &str, unlock: &str, reader: bool) -> String {
    format!(
        "CASE WHEN {got} THEN CASE WHEN {} THEN NOT {unlock} ELSE true END ELSE false END",
        lease_holds(t, param, reader)
    )
}

/// `interop=sqlx`'s row lock, once it holds sqlx's key (`got`, a SQL boolean; `peer_unlock`
/// gives sqlx's key back): the default layout's key of the name (in `param`) too, tried, not
/// waited for (the peer's key is held meanwhile), and, holding both, no live lease of the
/// name; else both keys are given back and the answer is false. So an `interop=sqlx` holder
/// and the default layout's row locks, transaction locks and leases exclude each other as
/// default-layout holders do. (sqlx's own `PgAdvisoryLock` takes only its key.)
pub(crate) fn interop_takes_name_key(t: &str, param: &str, got: &str, peer_unlock: &str) -> String {
    let key = name_key(param, t);
    let both = format!("(pg_advisory_unlock({key})::int + {peer_unlock}::int = 2)");
    let own = format!("CASE WHEN pg_try_advisory_lock({key}) THEN true ELSE NOT {peer_unlock} END");
    let held = unless_leased(t, param, "true", &both, false);
    format!("CASE WHEN {got} THEN CASE WHEN {own} THEN {held} ELSE false END ELSE false END")
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

/// How long a lease attempt waits for the name's advisory key: another lease attempt's
/// transaction holds it for a statement (a set's, for a few), which the attempt waits for as it
/// waited for the lock row before; a row lock or a transaction lock holds it for as long as it
/// holds the name, and the attempt is busy once this runs out (SQLSTATE 55P03, read as busy).
pub(crate) const KEY_WAIT: &str = "500ms";

/// SQLSTATE lock_not_available: the wait for the key ran out (a row lock or a transaction lock
/// holds the name).
pub(crate) const KEY_BUSY: &str = "55P03";

/// Whether a lease attempt's error is the wait for the key running out: the name is busy.
pub(crate) fn key_busy(e: &sqlx::Error) -> bool {
    crate::sql_errors::db_code(e).as_deref() == Some(KEY_BUSY)
}

/// The lease side, as CTEs of the exclusive attempt's statement (ending with `,`): `k(got)`,
/// true once the name's key (`$1`) is held for the transaction, waited for up to [`KEY_WAIT`]
/// (the setting put back afterwards: the row's lock is waited for as before).
pub(crate) fn lease_key_ctes(t: &str) -> String {
    let key = name_key("$1", t);
    format!(
        "ko AS MATERIALIZED (SELECT current_setting('lock_timeout') AS old), \
         ks AS MATERIALIZED (SELECT set_config('lock_timeout', '{KEY_WAIT}', true) AS t FROM ko), \
         kl AS MATERIALIZED (SELECT pg_advisory_xact_lock({key}) IS NULL AS x FROM ks), \
         k AS MATERIALIZED (SELECT set_config('lock_timeout', ko.old, true) IS NOT NULL AS got \
           FROM kl, ko),"
    )
}

/// The share function's first statements (PL/pgSQL, `v_old text` declared): the name's key
/// held for the transaction, shared for a reader (`$5 IS NULL`), waited for as
/// [`lease_key_ctes`] does.
pub(crate) fn share_takes_key(t: &str) -> String {
    let key = name_key("$1", t);
    format!(
        "v_old := current_setting('lock_timeout'); \
         PERFORM set_config('lock_timeout', '{KEY_WAIT}', true); \
         IF $5 IS NULL THEN PERFORM pg_advisory_xact_lock_shared({key}); \
         ELSE PERFORM pg_advisory_xact_lock({key}); END IF; \
         PERFORM set_config('lock_timeout', v_old, true);"
    )
}
