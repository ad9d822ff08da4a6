//! PostgreSQL's schema: the lock table, its shares and waiters' tables and the share
//! functions, created on connect where missing.

use super::exclusion;
use super::names::queue_table;

/// The tables of lock table `t` (the lock rows, `<t>_shares`, `<t>_waits`), created or
/// brought up to date in one implicit transaction. The waiters' queue carries what a release
/// needs to grant its head the lock (`handover=grant`, see `handover`): the number of the
/// waiter's last refused attempt (`ask`, NULL: wake it instead), its claim TTL in µs and its
/// holder metadata; a granted entry has mode `'g'` and the fence it was granted (`granted`).
/// Clients that predate these columns write none of them (their waiters are woken) and see
/// granted entries as no waiter of theirs (they order only mode `'x'`).
pub(super) fn tables(t: &str) -> String {
    let old_seq = format!("{}_fseq", &t[..t.len().min(57)]);
    let s = crate::shares::table(t);
    let q = queue_table(t);
    // One implicit transaction; the advisory lock serialises concurrent first connects
    // (CREATE ... IF NOT EXISTS can still collide on the catalog otherwise). Nothing takes a
    // table lock when the table is already as it should be: row-lock waiters keep a ROW
    // EXCLUSIVE lock on it while they wait, which an ALTER TABLE would queue behind. Row-lock
    // tokens used to come from a sequence: fold it into the rows' counters once, so they
    // only grow.
    format!(
        "SELECT pg_advisory_xact_lock(hashtext('locksmith ddl')); \
             CREATE TABLE IF NOT EXISTS {t} (name TEXT PRIMARY KEY, owner TEXT, \
               fence BIGINT NOT NULL DEFAULT 0, expires_at TIMESTAMPTZ NOT NULL DEFAULT 'epoch'); \
             DO $$ BEGIN \
               IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{t}'::regclass \
                   AND attname = 'wait_until' AND NOT attisdropped) THEN \
                 ALTER TABLE {t} ADD COLUMN wait_until TIMESTAMPTZ NOT NULL DEFAULT 'epoch'; \
               END IF; \
               IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{t}'::regclass \
                   AND attname = 'holder' AND NOT attisdropped) THEN \
                 ALTER TABLE {t} ADD COLUMN holder TEXT, ADD COLUMN acquired_at TIMESTAMPTZ; \
               END IF; \
               IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{t}'::regclass \
                   AND attname = 'shares_until' AND NOT attisdropped) THEN \
                 ALTER TABLE {t} ADD COLUMN shares_until TIMESTAMPTZ, \
                   ADD COLUMN writer_until TIMESTAMPTZ; \
               END IF; \
               CREATE TABLE IF NOT EXISTS {s} (name TEXT NOT NULL, token TEXT NOT NULL, \
                 mode TEXT NOT NULL, expires_at TIMESTAMPTZ NOT NULL, fence BIGINT NOT NULL, \
                 holder TEXT, PRIMARY KEY (name, token)); \
               CREATE TABLE IF NOT EXISTS {q} (name TEXT NOT NULL, waiter TEXT NOT NULL, \
                 mode TEXT NOT NULL, enqueued TIMESTAMPTZ NOT NULL, expires TIMESTAMPTZ NOT NULL, \
                 PRIMARY KEY (name, waiter)); \
               IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{q}'::regclass \
                   AND attname = 'ask' AND NOT attisdropped) THEN \
                 ALTER TABLE {q} ADD COLUMN ask BIGINT, ADD COLUMN claim FLOAT8, \
                   ADD COLUMN holder TEXT, ADD COLUMN granted BIGINT; \
               END IF; \
               IF to_regclass('{old_seq}') IS NOT NULL THEN \
               UPDATE {t} SET fence = (SELECT last_value FROM {old_seq}) \
                 WHERE fence < (SELECT last_value FROM {old_seq}); \
               DROP SEQUENCE {old_seq}; END IF; END $$"
    )
}

/// Creates the share functions of lock table `t` if missing (`acquire` and `release`, named by
/// [`share_function`]), under the advisory lock that serialises the backend's DDL: concurrent
/// first connects create them once (two `CREATE FUNCTION`s of one name at once fail), and an
/// existing one is never replaced (a client running it keeps the body it knows).
///
/// Each is one round trip for what used to be a transaction of several statements. The
/// on-table protocol is the statements': the name's lease row is locked (`FOR UPDATE`; created
/// if missing by an attempt) before its shares or `shares_until` are touched, so clients that
/// still send the statements and clients calling the functions exclude each other on the one
/// row. Inside a `VOLATILE` PL/pgSQL function every statement takes a new snapshot under READ
/// COMMITTED: once the row lock is granted the attempt reads the shares committed while it
/// waited, which one plain statement (one snapshot) cannot.
///
/// `acquire($1 name, $2 token, $3 ttl µs, $4 mode column, $5 permit limit or NULL for a reader,
/// $6 holder)` decides as [`crate::shares::decide`] does (the rules are pinned by the
/// conformance scenarios every lease dialect runs): a live share of this token is extended and
/// its fence returned (a retried attempt whose first try committed); another mode or limit
/// among the live shares is a conflict, and so is a permit beside an exclusive holder; a reader
/// waits for an exclusive holder or a waiting writer's mark, a permit while `limit` are held;
/// otherwise the share is inserted with the row's next fence and `shares_until` follows it.
/// Before all that it takes the name's advisory key for its transaction (shared for a reader;
/// see [`exclusion`]): when a row lock or a transaction lock has it, the call fails with
/// `lock_not_available`, read as busy with no time to wait known. It answers (fence if won, seconds to wait if known, conflict); an
/// attempt that won nothing
/// commits without waiting for the WAL flush, as a lost exclusive attempt does (it wrote at most
/// an empty lease row).
///
/// `release($1 name, $2 token or NULL for every share (a revoke), $3 notification channel)`
/// deletes the share(s), sets `shares_until` from those left and notifies as an exclusive
/// release does (the name if a waiter announced itself, the exclusive queue's head by token);
/// it answers how many it deleted.
pub(super) fn share_functions(
    t: &str,
    acquire: &str,
    release: &str,
    notify_head: &dyn Fn(&str, &str, &str) -> String,
) -> String {
    let s = crate::shares::table(t);
    // `shares_until` from the shares left (NULL once none is); waiters hear of it as of an
    // exclusive release.
    let release_stmt = format!(
        "WITH d AS (DELETE FROM {s} WHERE name = $1 AND ($2::text IS NULL OR token = $2) \
           AND expires_at > clock_timestamp() RETURNING name), \
         u AS (UPDATE {t} SET shares_until = (SELECT max(expires_at) FROM {s} \
             WHERE name = $1 AND $2::text IS NOT NULL AND token <> $2 \
             AND expires_at > clock_timestamp()) \
           WHERE name = $1 AND EXISTS (SELECT 1 FROM d) RETURNING wait_until), \
         n AS (SELECT pg_notify($3, $1) FROM u WHERE wait_until > clock_timestamp()), \
         h AS ({}) \
         SELECT (SELECT count(*) FROM d) + 0 * (SELECT count(*) FROM n) \
           + 0 * (SELECT count(*) FROM h)",
        notify_head("$3", "EXISTS (SELECT 1 FROM u)", "")
    );
    let left = |col: &str| format!("EXTRACT(EPOCH FROM ({col} - clock_timestamp()))::float8");
    let row_left = format!(
        "CASE WHEN l.owner IS NOT NULL AND l.expires_at > clock_timestamp() THEN {} END, \
         CASE WHEN l.writer_until > clock_timestamp() THEN {} END",
        left("l.expires_at"),
        left("l.writer_until")
    );
    let until = "clock_timestamp() + $3 * interval '1 microsecond'";
    format!(
        "SELECT pg_advisory_xact_lock(hashtext('locksmith ddl')); \
         DO $$ BEGIN \
         IF to_regprocedure('{acquire}(text, text, float8, text, int8, text)') IS NULL THEN \
         CREATE FUNCTION {acquire}(text, text, float8, text, int8, text, \
           OUT o_fence int8, OUT o_wait float8, OUT o_conflict bool) \
         LANGUAGE plpgsql VOLATILE AS $f$ \
         DECLARE v_ex float8; v_wr float8; v_n int8; v_min float8; v_other bool; v_mine int8; \
           v_until timestamptz; v_old text; \
         BEGIN \
           o_conflict := false; \
           {takes_key} \
           LOOP \
             SELECT {row_left} INTO v_ex, v_wr FROM {t} l WHERE l.name = $1 FOR UPDATE; \
             EXIT WHEN FOUND; \
             INSERT INTO {t} (name) VALUES ($1) ON CONFLICT (name) DO NOTHING; \
           END LOOP; \
           DELETE FROM {s} WHERE name = $1 AND expires_at <= clock_timestamp(); \
           SELECT count(*), min({live_left}), coalesce(bool_or(mode <> $4), false), \
               max(fence) FILTER (WHERE token = $2) \
             INTO v_n, v_min, v_other, v_mine \
             FROM {s} WHERE name = $1 AND expires_at > clock_timestamp(); \
           IF v_mine IS NOT NULL THEN \
             UPDATE {s} SET expires_at = {until} WHERE name = $1 AND token = $2 \
               RETURNING expires_at INTO v_until; \
             UPDATE {t} SET shares_until = greatest(shares_until, v_until) WHERE name = $1; \
             o_fence := v_mine; \
             RETURN; \
           END IF; \
           IF v_other OR ($5 IS NOT NULL AND v_ex IS NOT NULL) THEN \
             o_conflict := true; \
           ELSIF $5 IS NOT NULL AND v_n >= $5 THEN \
             o_wait := v_min; \
           ELSIF $5 IS NULL AND coalesce(v_ex, v_wr) IS NOT NULL THEN \
             o_wait := coalesce(v_ex, v_wr); \
           ELSE \
             v_until := {until}; \
             UPDATE {t} SET fence = fence + 1, shares_until = greatest(shares_until, v_until) \
               WHERE name = $1 RETURNING fence INTO o_fence; \
             INSERT INTO {s} (name, token, mode, expires_at, fence, holder) \
               VALUES ($1, $2, $4, v_until, o_fence, $6); \
             RETURN; \
           END IF; \
           PERFORM set_config('synchronous_commit', 'off', true); \
         END $f$; \
         END IF; \
         IF to_regprocedure('{release}(text, text, text)') IS NULL THEN \
         CREATE FUNCTION {release}(text, text, text) RETURNS int8 \
         LANGUAGE plpgsql VOLATILE AS $f$ \
         DECLARE v_n int8; \
         BEGIN \
           PERFORM 1 FROM {t} WHERE name = $1 FOR UPDATE; \
           {release_stmt} INTO v_n; \
           RETURN v_n; \
         END $f$; \
         END IF; {held} END $$",
        live_left = left("expires_at"),
        takes_key = exclusion::share_takes_key(t),
        held = exclusion::held_function_ddl(t),
    )
}
