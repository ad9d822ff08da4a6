//! MariaDB's share procedures: a share or permit attempt and a share's extend, each one `CALL`
//! (one statement, one round trip) instead of a transaction of separate statements (`SET
//! TRANSACTION`, `BEGIN`, five to seven statements, `COMMIT`). With a commit as cheap as the
//! test server's, a share's cost was the server's work per statement received: about 4x an
//! exclusive acquisition, which is one statement. (A release needs no procedure: it is one
//! `DELETE`, see `release_shares`.)
//!
//! The on-table protocol is the statements' (see [`crate::shares`]): the name's lease row is
//! locked first (created if missing), then its shares are read (a statement of its own, so
//! that it reads what the transactions that held the row before committed) and written in one
//! READ COMMITTED transaction (the session's isolation, set at connect), committed before the `CALL` answers. Clients that send the
//! statements (a user without `CREATE ROUTINE`, see `create_share_procedures`) and clients
//! calling the procedures exclude each other on that row.
//!
//! The procedures are created when missing by any lease client that may; an existing one is
//! never replaced (a client running it keeps the body it knows): a change of what one does is
//! a new version (see [`crate::shares::routine`]).

/// The version of the procedures' protocol, part of their names. 2: `acquire` is busy while a
/// row lock holds the name's key (`crate::mysql::exclusion`; `_sacq1` does not look).
const VERSION: u32 = 2;

/// The `CALL`s of lock table `t`, with `?` parameters.
#[derive(Debug, Clone)]
pub(crate) struct ShareCalls {
    /// `(name, token, mode column, permit limit or 0 for a reader, TTL µs, holder)` → one row
    /// `(verdict, value)`: `(1, fence)` taken (or already this token's: a retried attempt whose
    /// first try committed, its TTL reset), `(0, µs)` held (the time left of what holds it, if
    /// known), `(-1, 0)` the name is used in another way (another mode or limit, or a permit
    /// beside an exclusive holder).
    pub(crate) acquire: String,
    /// `(name, token, TTL µs)` → one row: 1 if the live share was extended, 0 if it was not
    /// live.
    pub(crate) extend: String,
}

/// The procedures' names beside lock table `t`: acquire, extend.
pub(crate) fn names(t: &str) -> [String; 2] {
    ["sacq", "sext"].map(|what| crate::shares::routine(t, what, VERSION))
}

impl ShareCalls {
    pub(crate) fn new(t: &str) -> ShareCalls {
        let [acquire, extend] = names(t);
        ShareCalls {
            acquire: format!("CALL {acquire}(?, ?, ?, ?, ?, ?)"),
            extend: format!("CALL {extend}(?, ?, ?)"),
        }
    }
}

/// The `CREATE PROCEDURE IF NOT EXISTS` statements of lock table `t` (shares table `s`), in
/// the order of [`names`].
///
/// `acquire` decides as [`crate::shares::decide`] does (held to it by the conformance
/// scenarios every lease dialect runs), once the row is locked and no row lock holds the
/// name's key (else busy, `(0, 0)`): this token's live share first, then a conflict
/// (another mode or limit among the live shares; a permit beside an exclusive holder), then a
/// wait (a permit while `limit` are held; a reader behind an exclusive holder or a waiting
/// writer's mark), else the share is inserted with the lease row's next fence and
/// `shares_until` follows it. Live and expired are judged at one instant, the locking read's
/// start (a wait for the row only makes it older: more shares count as live, never fewer, and
/// a new share's expiry comes earlier, never later); expired shares are deleted only when the
/// read saw one (most attempts find none). Each outcome commits before it answers, so the row
/// lock never outlives the `CALL`; an error rolls back (the exit handler) and reaches the
/// client as itself (a deadlock InnoDB broke is contention to the caller).
///
/// `extend` resets a live share's expiry and raises `shares_until` to it, on the locked row
/// (the order every writer of the row and its shares keeps: row first).
pub(crate) fn ddl(t: &str, s: &str) -> [String; 2] {
    let [acquire, extend] = names(t);
    let now = "UTC_TIMESTAMP(6)";
    let epoch = "'1970-01-01 00:00:01'";
    // READ COMMITTED: the session's (lock-sql's MariaDB sessions set it once, at connect).
    let begin = "DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END; \
         START TRANSACTION;";
    // The lease row's state, the row locked: an exclusive holder's µs left, a waiting writer's
    // mark's µs left, the fence (NULL: no row yet), and the instant the rest is judged at.
    let lock_row = format!(
        "SELECT IF(owner IS NOT NULL AND expires_at > {now}, \
             TIMESTAMPDIFF(MICROSECOND, {now}, expires_at), NULL), \
           IF(writer_until > {now}, TIMESTAMPDIFF(MICROSECOND, {now}, writer_until), NULL), \
           fence, {now} INTO v_ex, v_wr, v_fence, v_now FROM {t} WHERE name = p_name FOR UPDATE;"
    );
    let until = "v_now + INTERVAL p_ttl MICROSECOND";
    let raise = format!(
        "shares_until = GREATEST(COALESCE(shares_until, {epoch}), {until}) WHERE name = p_name;"
    );
    let name_token = "p_name VARBINARY(320), p_token VARCHAR(64) CHARACTER SET ascii";
    // Judged on the locked row: a row lock holding the name's key keeps the name.
    let key_used = format!("NOT ({})", crate::mysql::exclusion::key_free("p_name", t));
    // Each branch commits, then answers (one row, two BIGINTs).
    [
        format!(
            "CREATE PROCEDURE IF NOT EXISTS {acquire}({name_token}, \
               p_mode VARCHAR(32) CHARACTER SET ascii, p_limit BIGINT, p_ttl BIGINT, \
               p_holder TEXT CHARACTER SET utf8mb4) MODIFIES SQL DATA \
             BEGIN \
               DECLARE v_ex, v_wr, v_fence, v_n, v_min, v_mine, v_dead BIGINT; \
               DECLARE v_other INT; \
               DECLARE v_now DATETIME(6); \
               {begin} \
               {lock_row} \
               IF v_fence IS NULL THEN \
                 INSERT INTO {t} (name) VALUES (p_name) ON DUPLICATE KEY UPDATE name = name; \
                 {lock_row} \
               END IF; \
               SELECT COALESCE(SUM(expires_at > v_now), 0), \
                   MIN(IF(expires_at > v_now, TIMESTAMPDIFF(MICROSECOND, v_now, expires_at), NULL)), \
                   COALESCE(MAX(expires_at > v_now AND mode <> p_mode), 0), \
                   MAX(IF(expires_at > v_now AND token = p_token, fence, NULL)), \
                   COALESCE(SUM(expires_at <= v_now), 0) \
                 INTO v_n, v_min, v_other, v_mine, v_dead FROM {s} WHERE name = p_name; \
               IF {key_used} THEN \
                 COMMIT; \
                 SELECT CAST(0 AS SIGNED), CAST(0 AS SIGNED); \
               ELSE \
               IF v_dead > 0 THEN \
                 DELETE FROM {s} WHERE name = p_name AND expires_at <= v_now; \
               END IF; \
               IF v_mine IS NOT NULL THEN \
                 UPDATE {s} SET expires_at = {until} WHERE name = p_name AND token = p_token; \
                 UPDATE {t} SET {raise} \
                 COMMIT; \
                 SELECT CAST(1 AS SIGNED), v_mine; \
               ELSEIF v_other OR (p_limit > 0 AND v_ex IS NOT NULL) THEN \
                 COMMIT; \
                 SELECT CAST(-1 AS SIGNED), CAST(0 AS SIGNED); \
               ELSEIF p_limit > 0 AND v_n >= p_limit THEN \
                 COMMIT; \
                 SELECT CAST(0 AS SIGNED), v_min; \
               ELSEIF p_limit = 0 AND COALESCE(v_ex, v_wr) IS NOT NULL THEN \
                 COMMIT; \
                 SELECT CAST(0 AS SIGNED), COALESCE(v_ex, v_wr); \
               ELSE \
                 INSERT INTO {s} (name, token, mode, expires_at, fence, holder) \
                   VALUES (p_name, p_token, p_mode, {until}, v_fence + 1, p_holder); \
                 UPDATE {t} SET fence = v_fence + 1, {raise} \
                 COMMIT; \
                 SELECT CAST(1 AS SIGNED), v_fence + 1; \
               END IF; \
               END IF; \
             END"
        ),
        format!(
            "CREATE PROCEDURE IF NOT EXISTS {extend}({name_token}, p_ttl BIGINT) \
               MODIFIES SQL DATA \
             BEGIN \
               DECLARE v_ex, v_wr, v_fence, v_n BIGINT; \
               DECLARE v_now DATETIME(6); \
               {begin} \
               {lock_row} \
               UPDATE {s} SET expires_at = {until} \
                 WHERE name = p_name AND token = p_token AND expires_at > v_now; \
               SET v_n = ROW_COUNT(); \
               IF v_n > 0 THEN \
                 UPDATE {t} SET {raise} \
               END IF; \
               COMMIT; \
               SELECT v_n; \
             END"
        ),
    ]
}
