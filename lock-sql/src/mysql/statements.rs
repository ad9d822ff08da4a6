//! MariaDB's statements, built once per client from its table, strategy and interop mode:
//! row locks (`GET_LOCK`), leases (one conditional upsert), shares, inspection.

use super::*;

/// What a failed exclusive lease attempt reports (as its `LAST_INSERT_ID`) when live readers
/// hold the name, or permits (a semaphore is not a mutex: a conflict). Fences never come near
/// these.
pub(super) const HELD_BY_READERS: u64 = 1 << 62;

pub(super) const HELD_BY_PERMITS: u64 = (1 << 62) + 1;

pub(super) struct Sql {
    pub(super) row_acquire: String,
    /// `GET_LOCK` alone, 1 when taken: for a holder that wants no token (and under
    /// `interop=get_lock`, which hands none out: the peer's key, then the default layout's):
    /// nothing written, no commit.
    pub(super) row_acquire_unfenced: String,
    /// After `row_acquire_unfenced` took its keys: a live lease gives them back.
    pub(super) row_lock_check: String,
    /// Whether a row lock holds the name's key (after an exclusive lease attempt created the
    /// row, see `crate::mysql::exclusion`).
    pub(super) key_used: String,
    /// Gives back the keys a row lock holds (each parameter the name).
    pub(super) row_unlock: String,
    pub(super) holder: String,
    pub(super) lease_acquire: String,
    pub(super) share_lock_row: String,
    pub(super) share_row: String,
    pub(super) share_expired: String,
    pub(super) share_live: String,
    pub(super) share_insert: String,
    pub(super) share_take: String,
    pub(super) share_extend: String,
    pub(super) share_raise: String,
    /// Deletes one share (`?2`), or every share (`?2` NULL: a revoke).
    pub(super) share_delete: String,
    pub(super) share_inspect: String,
    /// The share procedures' calls, if they exist (see [`crate::mysql::procs`]); without them
    /// (a user without `CREATE ROUTINE`, none created yet by one who has it) a share takes the
    /// transaction of the statements above.
    pub(super) share_calls: Option<ShareCalls>,
    pub(super) lease_extend: String,
    pub(super) lease_release: String,
    pub(super) revoke_lease: String,
    /// Held or free, TTL left (lease), token, holder metadata and when acquired, of one name.
    pub(super) inspect: String,
}

/// [`Sql::lease_acquire`] with its parameters: the row's values, the name again (for the
/// shares subquery), the writer's mark (µs, 0 for none) twice.
pub(super) fn lease_acquire_query(
    sql: &str,
    name: &str,
    token: &str,
    ttl_us: u64,
    holder: &str,
    mark_us: u64,
) -> sqlx::query::Query<'static, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    sqlx::query(AssertSqlSafe(sql.to_owned()))
        .bind(name.to_owned())
        .bind(token.to_owned())
        .bind(ttl_us)
        .bind(holder.to_owned())
        .bind(name.to_owned())
        .bind(mark_us)
        .bind(mark_us)
}

impl Sql {
    /// Every statement of a client of lock table `config.table`; `share_calls`, the share
    /// procedures' calls where they exist.
    pub(super) fn new(config: &Parsed, share_calls: Option<ShareCalls>) -> Sql {
        let t = &config.table;
        let st = crate::shares::table(t);
        // The user lock of a name: per database and table, hashed to fit GET_LOCK's 64
        // characters.
        // Under interop=get_lock, the exact name (as the peers call GET_LOCK); the statements
        // are otherwise the same (no token is handed out, a peer bumps nothing: acquisitions
        // take `GET_LOCK` alone).
        let interop = config.interop == Some(crate::Interop::GetLock);
        let key = if interop {
            "?".to_owned()
        } else {
            crate::mysql::exclusion::name_key("?", t)
        };
        // Live shares hold the name as an exclusive holder does (see `crate::shares`):
        // `shares_until` is an upper bound of their expiries (a share release does not lower
        // it), so past it none is live, and before it the shares table says:
        // `@locksmith_shares` is 0 (none live), [`HELD_BY_READERS`] or [`HELD_BY_PERMITS`],
        // set by the first assignment and read by the later ones (one subquery: each copy of
        // it in the statement cost the exclusive path ~8 µs even when not run). The subquery
        // runs after the upsert locked the row (InnoDB opens a statement's read view at its
        // first consistent read), so it sees every share committed by an attempt that held
        // the row before.
        let shares_held = format!(
            "(@locksmith_shares := IF(COALESCE(shares_until > UTC_TIMESTAMP(6), 0), \
                   (SELECT IF(COUNT(*) = 0, 0, \
                       IF(MAX(mode <> 'shared'), {HELD_BY_PERMITS}, {HELD_BY_READERS})) \
                     FROM {st} WHERE name = ? AND expires_at > UTC_TIMESTAMP(6)), 0))"
        );
        let now = "UTC_TIMESTAMP(6)";
        // A lease attempt takes the name only while no row lock holds its key, judged on the
        // locked row (see `crate::mysql::exclusion`); leases exist in the default layout only.
        let key_free = crate::mysql::exclusion::key_free("VALUES(name)", t);
        Sql {
            // GET_LOCK first (a WHERE of the insert's source); holding it, the counter row is
            // bumped and committed with the statement (autocommit), so the token is durable
            // before the caller sees it, unless a live lease holds the name (the key is then
            // given back: see `crate::mysql::exclusion`). LAST_INSERT_ID(expr) hands the
            // outcome back in the OK packet (`RowOutcome::of_fenced`). The holder's metadata
            // rides in the same statement. Never under interop=get_lock (no token).
            row_acquire: crate::mysql::exclusion::row_acquire_fenced(t, &st),
            row_lock_check: crate::mysql::exclusion::row_lock_check(t, &st, interop),
            key_used: crate::mysql::exclusion::key_used(t),
            row_acquire_unfenced: if interop {
                crate::mysql::exclusion::interop_acquire(t)
            } else {
                format!("SELECT COALESCE(GET_LOCK({key}, ?), 0) = 1")
            },
            row_unlock: crate::mysql::exclusion::row_unlock(t, interop),
            holder: format!("SELECT IS_USED_LOCK({key})"),
            // One statement per attempt, idempotent for the same token. Assignments run left
            // to right and see earlier ones: owner is decided first (`@locksmith_took`), the
            // rest follow only if it was taken. A retry with the same token (an attempt whose
            // reply was lost) passes the same checks as a first attempt: its own row is
            // retaken only while no live share holds the name (a reader may have come once its
            // lease ran out; taking the row then would hold beside it and clear
            // `shares_until`, letting the next writer in too). LAST_INSERT_ID reports the outcome in the OK packet: 1 for a new row
            // (from VALUES), the new fence if taken over or retaken, 0 if someone else holds it,
            // [`HELD_BY_READERS`] or [`HELD_BY_PERMITS`] if live shares hold it (the fence
            // column unchanged: LEAST(.., 0) adds nothing). A waiting writer held back by
            // readers marks itself (`writer_until`, µs; 0 from try_lock). A holder clears
            // `shares_until` (no share is live beside it), so that later attempts skip the
            // shares table. A row lock holding the name's key keeps it too (`key_free`; a new
            // row is checked after the statement, see `lease_attempt`). Parameters: see
            // [`lease_acquire_query`] (the name comes again for the subquery: MariaDB takes no
            // VALUES() in one).
            lease_acquire: format!(
                "INSERT INTO {t} (name, owner, fence, expires_at, holder_meta, acquired_at) \
                     VALUES (?, ?, LAST_INSERT_ID(1), {now} + INTERVAL ? MICROSECOND, ?, {now}) \
                     ON DUPLICATE KEY UPDATE \
                       owner = IF(@locksmith_took := ({shares_held} = 0 AND {key_free} \
                           AND (owner IS NULL OR expires_at <= {now} OR owner = VALUES(owner))), \
                         VALUES(owner), owner), \
                       fence = IF(@locksmith_took, LAST_INSERT_ID(fence + 1), \
                         fence + LEAST(0, LAST_INSERT_ID(@locksmith_shares))), \
                       expires_at = IF(@locksmith_took, VALUES(expires_at), expires_at), \
                       holder_meta = IF(@locksmith_took, VALUES(holder_meta), holder_meta), \
                       acquired_at = IF(@locksmith_took, VALUES(acquired_at), acquired_at), \
                       writer_until = IF(@locksmith_took, NULL, \
                         IF(? > 0 AND @locksmith_shares <> 0, {now} + INTERVAL ? MICROSECOND, \
                           writer_until)), \
                       shares_until = IF(@locksmith_took, NULL, shares_until)"
            ),
            // A no-op update: the row locked exclusively at once (a shared lock taken by a
            // duplicate-key insert and upgraded afterwards deadlocks two such transactions).
            share_lock_row: format!(
                "INSERT INTO {t} (name) VALUES (?) ON DUPLICATE KEY UPDATE name = name"
            ),
            share_row: format!(
                "SELECT IF(owner IS NOT NULL AND expires_at > {now}, \
                         TIMESTAMPDIFF(MICROSECOND, {now}, expires_at), NULL), \
                       IF(writer_until > {now}, TIMESTAMPDIFF(MICROSECOND, {now}, writer_until), NULL), \
                       fence FROM {t} WHERE name = ? FOR UPDATE"
            ),
            share_expired: format!("DELETE FROM {st} WHERE name = ? AND expires_at <= {now}"),
            share_live: format!(
                "SELECT token, mode, TIMESTAMPDIFF(MICROSECOND, {now}, expires_at), fence \
                     FROM {st} WHERE name = ?"
            ),
            share_insert: format!(
                "INSERT INTO {st} (name, token, mode, expires_at, fence, holder) \
                     VALUES (?, ?, ?, {now} + INTERVAL ? MICROSECOND, ?, ?)"
            ),
            // One counter across modes: the share's fence is the row's next.
            share_take: format!(
                "UPDATE {t} SET fence = ?, shares_until = GREATEST(COALESCE(shares_until, \
                       '1970-01-01 00:00:01'), (SELECT expires_at FROM {st} WHERE name = ? AND token = ?)) \
                     WHERE name = ?"
            ),
            share_extend: format!(
                "UPDATE {st} SET expires_at = {now} + INTERVAL ? MICROSECOND \
                     WHERE name = ? AND token = ? AND expires_at > {now}"
            ),
            share_raise: format!(
                "UPDATE {t} SET shares_until = GREATEST(COALESCE(shares_until, \
                       '1970-01-01 00:00:01'), (SELECT expires_at FROM {st} WHERE name = ? AND token = ?)) \
                     WHERE name = ?"
            ),
            share_delete: format!(
                "DELETE FROM {st} WHERE name = ? AND (? IS NULL OR token = ?) AND expires_at > {now}"
            ),
            share_inspect: format!(
                "SELECT mode, fence, TIMESTAMPDIFF(MICROSECOND, {now}, expires_at), holder \
                     FROM {st} WHERE name = ? AND expires_at > {now} ORDER BY fence"
            ),
            share_calls,
            lease_extend: format!(
                "UPDATE {t} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                     WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
            lease_release: format!(
                "UPDATE {t} SET owner = NULL, expires_at = '1970-01-01 00:00:01' \
                     WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
            revoke_lease: format!(
                "UPDATE {t} SET owner = NULL, expires_at = '1970-01-01 00:00:01' \
                     WHERE name = ? AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)"
            ),
            // Row lock: held while a session holds the user lock (the row keeps the last
            // holder's token and metadata); lease: while the row has an unexpired owner.
            // Times as microseconds since the epoch by datetime arithmetic (UNIX_TIMESTAMP
            // would read the UTC values in the session's time zone).
            inspect: {
                let (held, remaining) = match config.strategy {
                    Strategy::RowLock => (
                        format!("IS_USED_LOCK({key}) IS NOT NULL"),
                        "CAST(NULL AS SIGNED)",
                    ),
                    Strategy::Lease => (
                        "COALESCE(r.owner IS NOT NULL AND r.expires_at > UTC_TIMESTAMP(6), 0)"
                            .to_owned(),
                        "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), r.expires_at)",
                    ),
                };
                format!(
                    "SELECT ({held}) + 0 AS held, {remaining} AS remaining_us, r.fence, \
                           r.holder_meta, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', r.acquired_at) \
                           AS acquired_us \
                         FROM (SELECT 1) one LEFT JOIN {t} r ON r.name = ?"
                )
            },
        }
    }
}
