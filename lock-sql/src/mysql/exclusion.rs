//! MariaDB: a lease (exclusive, shared or a permit) and a row lock of one name on one lock
//! table exclude each other, in both orders (as PostgreSQL's do, see `pg::exclusion`).
//!
//! A row lock is the session user lock `GET_LOCK` on the name's key ([`name_key`]: a SHA-1 of
//! database, table and name); a lease is the lock row's `owner` and `expires_at`, and the rows
//! of `<table>_shares`. Neither could see the other, so each side now looks at the other's,
//! after making its own mark, the two marks ordered by the lock row's InnoDB lock:
//!
//! * A lease attempt, holding the lock row's lock (the exclusive upsert's update clause runs on
//!   the locked row; the share procedure and statements lock it first), takes the name only if
//!   the key is free ([`key_free`], `IS_USED_LOCK`: it never waits on the key, so a lease
//!   `try_lock` on a name a row lock holds is busy at once). The row's lock is held until the
//!   attempt commits.
//! * A row lock, once it holds the key, reads the lock row with a lock ([`leased`]; the fenced
//!   statement's own upsert, or a locking read when it wants no token): it waits for any
//!   lease attempt holding the row, then sees what that attempt committed. A live lease (an
//!   owner, or a live share: none may hold beside a MariaDB row lock, which is exclusive)
//!   makes it give the key back at once and be busy; a waiting `lock()` looks again after a
//!   backoff (a lease's release or expiry notifies nobody).
//!
//! One case has no row to lock: an exclusive lease attempt that creates the row (the first
//! use of a name on the table) evaluates its values before the row exists. Such an attempt
//! looks at the key once more after its commit ([`key_used`]) and, if a row lock holds it,
//! releases the lease it just wrote and is busy: the row lock could have read the row before
//! it existed. Its caller never held the name.
//!
//! Either order, one side sees the other: no name is held by a lease and a row lock at once,
//! so a fleet moving from one strategy to the other a service at a time never gets two
//! holders. Renewals (a lease's extend, a share's extend, a row lock's health check) never
//! look at the other side: a holder keeps what it holds. Clients of earlier releases (their
//! share procedures `_sacq1`/`_sext1`, their statements) take no part in this.

/// The user-lock key of the name in SQL expression `name` on lock table `t`: the row lock's
/// `GET_LOCK` key in the default layout (fits `GET_LOCK`'s 64 characters).
pub(crate) fn name_key(name: &str, t: &str) -> String {
    format!("SHA1(CONCAT(CAST(DATABASE() AS BINARY), _binary'.{t}.', CAST({name} AS BINARY)))")
}

/// A SQL boolean: no session holds the row-lock key of the name in `name` on table `t`.
pub(crate) fn key_free(name: &str, t: &str) -> String {
    format!("IS_USED_LOCK({}) IS NULL", name_key(name, t))
}

/// A statement answering whether a session holds the row-lock key of the name (`?`): 1 if one
/// does.
pub(crate) fn key_used(t: &str) -> String {
    format!("SELECT NOT ({})", key_free("?", t))
}

/// A SQL boolean over the lock row of table `t` (its columns in scope, the row read locked):
/// a live lease holds the name, an exclusive owner or a live share or permit (in the shares
/// table `st`, the name in `name`: a row lock is exclusive, no share holds beside it).
pub(crate) fn leased(st: &str, name: &str) -> String {
    let now = "UTC_TIMESTAMP(6)";
    format!(
        "((owner IS NOT NULL AND expires_at > {now}) \
          OR (COALESCE(shares_until > {now}, 0) \
              AND EXISTS (SELECT 1 FROM {st} WHERE name = {name} AND expires_at > {now})))"
    )
}

/// The row lock's check when it wants no token (`GET_LOCK` alone, nothing written): run once
/// the key is held, a locking read of the lock row that gives the key back (both keys under
/// `interop`) if a live lease holds the name. Every parameter is the name ([`params`]). No
/// row: no lease (nothing answered).
pub(crate) fn row_lock_check(t: &str, st: &str, interop: bool) -> String {
    format!(
        "SELECT IF({}, {} IS NOT NULL, 0) FROM {t} WHERE name = ? LOCK IN SHARE MODE",
        leased(st, "?"),
        release(t, interop),
    )
}

/// A SQL expression releasing the keys a row lock holds (`interop`: the peer's, the exact
/// name, and the default layout's), 1 when every one was held; its parameters are the name.
fn release(t: &str, interop: bool) -> String {
    let own = format!("COALESCE(RELEASE_LOCK({}), 0)", name_key("?", t));
    if interop {
        format!("(COALESCE(RELEASE_LOCK(?), 0) * {own})")
    } else {
        own
    }
}

/// The row lock's unlock statement: 1 when the keys were held. Every parameter is the name.
pub(crate) fn row_unlock(t: &str, interop: bool) -> String {
    format!("SELECT {}", release(t, interop))
}

/// How many parameters `sql` (a statement whose every parameter is the name) takes.
pub(crate) fn params(sql: &str) -> usize {
    sql.matches('?').count()
}

/// `interop=get_lock`'s acquisition: `GET_LOCK(name)` as the peers take it, then, holding it,
/// the default layout's key of the name (the same wait), which default-layout row locks take
/// and leases look at: an interop holder and a default-layout holder of one name exclude each
/// other as two default-layout holders do. 1 when both were taken; the first is given back
/// when the second was not. Parameters: name, wait (s), name, wait (s), name.
pub(crate) fn interop_acquire(t: &str) -> String {
    format!(
        "SELECT COALESCE(CASE WHEN GET_LOCK(?, ?) = 1 THEN \
           IF(GET_LOCK({}, ?) = 1, 1, LEAST(0, RELEASE_LOCK(?))) ELSE 0 END, 0) = 1",
        name_key("?", t)
    )
}

/// The fenced row lock's statement: `GET_LOCK` (parameter order: name, holder metadata, name
/// for the key, the wait in seconds, the name for the shares) then, holding it, the lock row
/// upserted: the fence bumped and committed, unless a live lease holds the name, in which case
/// the key is given back and nothing changes. `LAST_INSERT_ID` in the OK packet says which:
/// the new fence (1 for a new row), or 0 (leased). No row affected: the key was busy.
pub(crate) fn row_acquire_fenced(t: &str, st: &str) -> String {
    let key = name_key("?", t);
    let own_key = name_key("VALUES(name)", t);
    format!(
        "INSERT INTO {t} (name, fence, holder_meta, acquired_at) \
         SELECT ?, LAST_INSERT_ID(1), ?, UTC_TIMESTAMP(6) FROM DUAL WHERE GET_LOCK({key}, ?) = 1 \
         ON DUPLICATE KEY UPDATE \
           fence = IF(@locksmith_leased := {}, \
             fence + LEAST(0, LAST_INSERT_ID(0)) + LEAST(0, RELEASE_LOCK({own_key})), \
             LAST_INSERT_ID(fence + 1)), \
           holder_meta = IF(@locksmith_leased, holder_meta, VALUES(holder_meta)), \
           acquired_at = IF(@locksmith_leased, acquired_at, VALUES(acquired_at))",
        leased(st, "?"),
    )
}

/// What a row lock's statement answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowOutcome {
    /// Taken, with this fence (0 when no token was asked for).
    Taken(u64),
    /// The key is held by another session (a row lock).
    Busy,
    /// The key was free, but a live lease holds the name: the key was given back.
    Leased,
}

impl RowOutcome {
    /// The fenced statement's outcome from its OK packet.
    pub(crate) fn of_fenced(rows_affected: u64, last_insert_id: u64) -> RowOutcome {
        match (rows_affected, last_insert_id) {
            (0, _) => RowOutcome::Busy,
            (_, 0) => RowOutcome::Leased,
            (_, fence) => RowOutcome::Taken(fence),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_of_the_fenced_statement() {
        assert_eq!(RowOutcome::of_fenced(0, 7), RowOutcome::Busy);
        assert_eq!(RowOutcome::of_fenced(1, 1), RowOutcome::Taken(1));
        assert_eq!(RowOutcome::of_fenced(2, 9), RowOutcome::Taken(9));
        assert_eq!(RowOutcome::of_fenced(1, 0), RowOutcome::Leased);
    }
}
