//! PostgreSQL's statements, built once per client from its table, strategy and server
//! version: row locks (per mode), leases and their queue, shares, inspection.

use lockcore::LockMode;

use super::exclusion;
use super::handover::{RELEASED, notify_head, release_ctes};
use super::names::{queue_table, share_function, table_seed};
use crate::config::{Handover, Parsed, Strategy};

/// The row-lock statements of one mode, alike but for the advisory-lock functions they call:
/// `pg_advisory_lock` and friends for an exclusive holder, `pg_advisory_lock_shared` and
/// friends for a reader, on the same key (so they conflict as a read-write lock's modes do).
pub(super) struct RowSql {
    /// Takes the lock if free, bumps and commits the fencing counter.
    pub(super) try_fenced: String,
    /// `try_fenced` without the fencing counter (the caller wants no token).
    pub(super) try_unfenced: String,
    /// Waits for the lock in the server's queue (`lock_timeout`), then as `try_fenced`.
    pub(super) wait_fenced: String,
    /// `wait_fenced` without the fencing counter.
    pub(super) wait_unfenced: String,
    pub(super) unlock: String,
}

pub(super) struct Sql {
    pub(super) row_exclusive: RowSql,
    pub(super) row_shared: RowSql,
    pub(super) row_guard: String,
    pub(super) revoke_row: String,
    pub(super) queued_row: String,
    pub(super) lease_acquire: String,
    pub(super) lease_extend: String,
    pub(super) lease_release: String,
    pub(super) lease_wait_mark: String,
    /// Removes a waiter's queue entry (`$2`), and when the lock is free names the next waiter
    /// to `$3`'s channel (the removed one may have been woken as the head).
    pub(super) lease_dequeue: String,
    /// Live queued waiters of a name (exclusive, shared and permit).
    pub(super) queued_lease: String,
    /// A revoke's first statement (see `revocation`): locks the name's lease row, and reads
    /// its live holder's owner token (NULL when none; no row when the name never was held).
    pub(super) revoke_lock: String,
    /// The owner tokens of the name's live shares (the lease row locked first).
    pub(super) revoke_share_tokens: String,
    /// Expires the lease (`$1`), waking waiters on `$2`'s channel as a release does, and sends
    /// the revocation notices `$3` (a text array) on it.
    pub(super) revoke_lease: String,
    /// Shares (see [`crate::shares`]): one attempt, a call of the share function (see
    /// [`share_function`]): fence if won, seconds to wait, conflict.
    pub(super) share_acquire: String,
    pub(super) share_extend: String,
    /// Deletes one share (`$2`), or every share (`$2` NULL: a revoke), with the row locked: a
    /// call of the release function.
    pub(super) share_release: String,
    /// Every live share, for `inspect`.
    pub(super) share_inspect: String,
    /// Held or free, token, TTL left, metadata and waiters of one name (per strategy).
    pub(super) inspect: String,
}

impl Sql {
    /// The row-lock statements of `mode`: shared, or exclusive (permits are not declared on
    /// row-lock, so never asked for).
    pub(super) fn row(&self, mode: LockMode) -> &RowSql {
        match mode {
            LockMode::Shared => &self.row_shared,
            _ => &self.row_exclusive,
        }
    }
}

impl Sql {
    /// Every statement of a client of lock table `config.table` on a server of `version`
    /// (`server_version_num`).
    pub(super) fn new(config: &Parsed, version: i32) -> Sql {
        let t = &config.table;
        let s = crate::shares::table(t);
        let q = queue_table(t);
        // The server-side guard of a holder that stops talking (a wedged process):
        // idle_session_timeout, PostgreSQL 14+.
        let guard = version >= 140000;
        let seed = table_seed(t);
        // Under interop=sqlx, $1 of the row statements is sqlx's key as decimal text instead of
        // the name (see `row_param`).
        let interop = config.interop == Some(crate::Interop::Sqlx);
        let key = if interop {
            "($1::text)::int8".to_owned()
        } else {
            format!("hashtextextended($1, {seed})")
        };
        let set_guard = |p: &str| {
            if guard {
                format!("set_config('idle_session_timeout', {p}, false)")
            } else {
                format!("set_config('locksmith.ttl', {p}, false)")
            }
        };
        // The advisory lock is taken first (materialized CTE); then, holding it, the lock row's
        // counter is bumped and committed with the statement: the token is durable before the
        // caller sees it, and every later holder's is larger, across crashes too.
        // The holder's metadata rides in the same statement (`holder`: the parameter holding it).
        let fence_upsert = |from: &str, cond: &str, holder: &str| {
            format!(
                "INSERT INTO {t} AS r (name, fence, holder, acquired_at) \
                 SELECT $1, 1, {holder}::text, clock_timestamp() FROM {from} WHERE {cond} \
                 ON CONFLICT (name) DO UPDATE SET fence = r.fence + 1, holder = EXCLUDED.holder, \
                   acquired_at = EXCLUDED.acquired_at RETURNING r.fence"
            )
        };
        // The entries of pg_locks for this name's advisory lock, granted or awaited (a bigint
        // key shows as classid = high half, objid = low half, objsubid = 1; mode ExclusiveLock
        // for pg_advisory_lock, ShareLock for pg_advisory_lock_shared).
        let of_key = format!(
            "l.locktype = 'advisory' AND l.objsubid = 1 \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND ((l.classid::int8 << 32) | l.objid::int8) = {key}"
        );
        // Row lock: held while a session holds the advisory lock (the row keeps the last
        // holder's token and metadata), by readers when those sessions hold it shared (one
        // read of pg_locks, which copies the server's whole lock table); lease: while the row
        // has an unexpired owner (its shares are read apart).
        let inspect = match config.strategy {
            Strategy::RowLock => format!(
                "WITH k AS MATERIALIZED (SELECT l.granted, l.mode FROM pg_locks l WHERE {of_key}) \
                 SELECT EXISTS (SELECT 1 FROM k WHERE granted) AS held, NULL::float8 AS remaining, \
                   (SELECT count(*) FROM k WHERE NOT granted) AS waiting, r.fence, r.holder, \
                   (EXTRACT(EPOCH FROM r.acquired_at) * 1000)::float8 AS acquired_ms, \
                   (SELECT count(*) FROM k WHERE granted AND mode = 'ShareLock') AS readers \
                 FROM (SELECT 1) one LEFT JOIN {t} r ON r.name = $1"
            ),
            Strategy::Lease => format!(
                "SELECT COALESCE(r.owner IS NOT NULL AND r.expires_at > clock_timestamp(), false) AS held, \
                   EXTRACT(EPOCH FROM (r.expires_at - clock_timestamp()))::float8 AS remaining, \
                   (SELECT count(*) FROM {q} w WHERE w.name = $1 AND w.mode <> 'g' \
                     AND w.expires > clock_timestamp()) AS waiting, r.fence, r.holder, \
                   (EXTRACT(EPOCH FROM r.acquired_at) * 1000)::float8 AS acquired_ms, \
                   NULL::int8 AS readers \
                 FROM (SELECT 1) one LEFT JOIN {t} r ON r.name = $1"
            ),
        };
        // Without a fencing token (the caller said it needs none), and under interop=sqlx (a
        // sqlx holder bumps no counter): the advisory lock and the server-side guard only,
        // nothing written, so no commit and no WAL flush. The statement answers 0 when the lock
        // was taken, no row when it was not; the holder parameter is bound as in the counted
        // form, nothing stores it.
        let uncounted = |from: &str, cond: &str, holder: &str| {
            format!("SELECT 0::int8 FROM {from} WHERE {cond} AND ({holder}::text IS NULL OR true)")
        };
        // A lock taken by a session survives its transaction's rollback, so nothing after it
        // in the statement may fail with lock_timeout's error (read as "busy": the connection
        // would go back to the pool holding the lock). The counter's row lock, for which
        // concurrent readers wait for each other's commit, is waited for without it (a
        // deadline cut-off closes the connection instead).
        let untimed = "set_config('lock_timeout', '0', true) IS NOT NULL";
        let try_cond = format!(
            "CASE WHEN got THEN {untimed} AND {} IS NOT NULL END",
            set_guard("$2")
        );
        let wait_cond = try_cond.clone();
        let taken = |from: &str, cond: &str, holder: &str| {
            if interop {
                uncounted(from, cond, holder)
            } else {
                fence_upsert(from, cond, holder)
            }
        };
        // One mode's statements: `pg_advisory_lock` and friends, or their `_shared` forms on
        // the same key. A reader's counter bump serialises with other readers' only for the
        // statement's commit, not while they hold.
        let row_sql = |shared: bool| {
            let f = if shared { "_shared" } else { "" };
            // Holding the key, a row lock backs off from a live lease of the name (unlocking
            // the key at once): see `exclusion`. Under interop, whose key is sqlx's, it takes
            // the default layout's key too (the name is the last parameter: `$name`).
            let unless_leased = |got: &str, name: &str| {
                let unlock = format!("pg_advisory_unlock{f}({key})");
                if interop {
                    exclusion::interop_takes_name_key(t, name, got, &unlock)
                } else {
                    exclusion::unless_leased(t, "$1", got, &unlock, shared)
                }
            };
            let try_head = format!(
                "WITH a AS MATERIALIZED (SELECT pg_try_advisory_lock{f}({key}) AS got), \
                 l AS MATERIALIZED (SELECT {} AS got FROM a)",
                unless_leased("got", "$4")
            );
            let wait_head = format!(
                "WITH s AS MATERIALIZED (SELECT set_config('lock_timeout', $3, true) AS t), \
                 a AS MATERIALIZED (SELECT pg_advisory_lock{f}({key}) IS NULL AS x FROM s), \
                 l AS MATERIALIZED (SELECT {} AS got FROM a)",
                unless_leased("true", "$5")
            );
            RowSql {
                try_fenced: format!("{try_head} {}", taken("l", &try_cond, "$3")),
                try_unfenced: format!("{try_head} {}", uncounted("l", &try_cond, "$3")),
                wait_fenced: format!("{wait_head} {}", taken("l", &wait_cond, "$4")),
                wait_unfenced: format!("{wait_head} {}", uncounted("l", &wait_cond, "$4")),
                unlock: if interop {
                    // The default layout's key (`$2`: the name), then sqlx's (operands are
                    // evaluated left to right). The other way round, the next interop waiter,
                    // queued on sqlx's key, woke while this holder still had the default key,
                    // found it taken, gave its place up and queued again last
                    // (`postgres-interop-sqlx::fifo_order` served [1, 2, ..., 7, 0]).
                    format!(
                        "SELECT pg_advisory_unlock({})::int \
                           + pg_advisory_unlock({key})::int = 2 FROM (SELECT {}) g",
                        exclusion::name_key("$2", t),
                        set_guard("'0'")
                    )
                } else {
                    format!(
                        "SELECT pg_advisory_unlock{f}({key}) FROM (SELECT {}) g",
                        set_guard("'0'")
                    )
                },
            }
        };
        let notify_head = |chan: &str, cond: &str, but: &str| notify_head(&q, chan, cond, but);
        let share_acquire_fn = share_function(t, "sacq");
        let share_release_fn = share_function(t, "srel");
        // A lease attempt takes the name's advisory key for its transaction: busy while a row
        // lock or a transaction lock has it (see `exclusion`).
        let takes_key = exclusion::lease_key_ctes(t);
        let grant = config.handover == Handover::Grant;
        Sql {
            row_exclusive: row_sql(false),
            row_shared: row_sql(true),
            row_guard: format!("SELECT {}", set_guard("$1")),
            // The sessions holding the advisory lock of this name (every reader, or the one
            // exclusive holder).
            revoke_row: format!(
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks l \
                 WHERE {of_key} AND l.granted AND l.pid <> pg_backend_pid()"
            ),
            // Sessions waiting for the advisory lock of this name (each client's own waiters
            // queue in the client first: one per client shows here).
            queued_row: format!("SELECT count(*) FROM pg_locks l WHERE {of_key} AND NOT l.granted"),
            // Read first: the upsert runs only when the row is free (or already ours: a retry of
            // an attempt whose answer was lost), so a failed attempt writes and locks nothing.
            // The second column is the current holder's remaining time, for the waiter's sleep.
            // Live shares hold the name too (`shares_until`, checked again on the locked row by
            // the upsert's WHERE); a waiting writer they hold back marks itself
            // (`writer_until`, `$5` µs from now; 0 from try_lock) so later readers wait. The
            // third column: the shares are permits (a semaphore is not a mutex: a conflict).
            // Exclusive waiters queue (`{q}`, FIFO on the server's clock): a free lock goes to
            // the queue's head, so an attempt with a live entry ahead of its own (or any, for
            // one not queued: a try_lock, a first attempt) does not take it, unless the row is
            // already this owner's (a retry whose answer was lost). A queued attempt (`$6`)
            // that loses enters the queue or renews its entry for `$7` µs and clears expired
            // entries (skipping those another statement holds: two waiters clearing each
            // other's would deadlock); one that wins leaves it. A queued attempt asking for a
            // grant (`handover=grant`) leaves in its entry its number (`$8`, NULL when it asks
            // none), its claim TTL (`$9` µs) and its holder metadata, from which a release
            // grants it the lock (see `handover`); an entry granted earlier whose claim passed
            // is a plain entry again. An entry renewed within the
            // last second and asking nothing new is left as it is (without grants the look
            // again right after entering writes nothing), and an attempt that did not win commits without waiting for the WAL
            // flush (`lazy`: the setting is read at the statement's commit): the queue is soft
            // state, a crash loses nothing its waiters' next attempts do not make again, and a
            // won lease stays durable. The fourth column: someone is ahead (so the
            // waiter does not wake at the holder's expiry: the head does). Nothing is written
            // (no row locked, no mark) unless the name's advisory key was taken for the
            // transaction (`k`): a row lock or a transaction lock holding it makes the attempt
            // fail with lock_not_available after `exclusion::KEY_WAIT`, read as busy.
            lease_acquire: format!(
                "WITH cur AS MATERIALIZED (\
                   SELECT owner, EXTRACT(EPOCH FROM (expires_at - clock_timestamp()))::float8 AS remaining, \
                     EXTRACT(EPOCH FROM (shares_until - clock_timestamp()))::float8 AS shares_left \
                   FROM {t} WHERE name = $1), \
                 me AS MATERIALIZED (SELECT enqueued FROM {q} WHERE name = $1 AND waiter = $2 \
                   AND expires > clock_timestamp()), \
                 ahead AS MATERIALIZED (SELECT 1 AS x FROM {q} w WHERE w.name = $1 AND w.waiter <> $2 \
                   AND w.mode = 'x' AND w.expires > clock_timestamp() \
                   AND (NOT EXISTS (SELECT 1 FROM me) OR (w.enqueued, w.waiter) < ((SELECT enqueued FROM me), $2)) \
                   AND NOT EXISTS (SELECT 1 FROM cur WHERE owner = $2 AND remaining > 0) LIMIT 1), \
                 {takes_key} \
                 busy AS MATERIALIZED (SELECT CASE WHEN shares_left > 0 THEN shares_left \
                     ELSE remaining END AS remaining, shares_left > 0 AS by_shares FROM cur \
                   WHERE (owner IS NOT NULL AND owner <> $2 AND remaining > 0) OR shares_left > 0), \
                 mark AS (UPDATE {t} SET writer_until = clock_timestamp() + $5::float8 * interval '1 microsecond' \
                   WHERE name = $1 AND $5::float8 > 0 AND EXISTS (SELECT 1 FROM busy WHERE by_shares) \
                     AND (SELECT got FROM k)), \
                 won AS (\
                   INSERT INTO {t} AS l (name, owner, fence, expires_at, holder, acquired_at) \
                   SELECT $1, $2, 1, clock_timestamp() + $3::float8 * interval '1 microsecond', \
                     $4::text, clock_timestamp() \
                   WHERE NOT EXISTS (SELECT 1 FROM busy) AND NOT EXISTS (SELECT 1 FROM ahead) \
                     AND (SELECT got FROM k) \
                   ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, fence = l.fence + 1, \
                     expires_at = EXCLUDED.expires_at, holder = EXCLUDED.holder, \
                     acquired_at = EXCLUDED.acquired_at, writer_until = NULL \
                   WHERE (l.owner IS NULL OR l.expires_at <= clock_timestamp() OR l.owner = EXCLUDED.owner) \
                     AND (l.shares_until IS NULL OR l.shares_until <= clock_timestamp()) \
                   RETURNING l.fence), \
                 left_queue AS (DELETE FROM {q} WHERE name = $1 AND waiter = $2 \
                   AND EXISTS (SELECT 1 FROM won)), \
                 gone AS (DELETE FROM {q} WHERE ctid IN (SELECT ctid FROM {q} WHERE $6 AND name = $1 \
                   AND expires <= clock_timestamp() AND waiter <> $2 FOR UPDATE SKIP LOCKED)), \
                 queued AS (INSERT INTO {q} (name, waiter, mode, enqueued, expires, ask, claim, holder) \
                   SELECT $1, $2, 'x', clock_timestamp(), clock_timestamp() + $7::float8 * interval '1 microsecond', \
                     $8::int8, $9::float8, CASE WHEN $8::int8 IS NOT NULL THEN $4::text END \
                   WHERE $6 AND NOT EXISTS (SELECT 1 FROM won) \
                   ON CONFLICT (name, waiter) DO UPDATE SET expires = EXCLUDED.expires, mode = 'x', \
                     granted = NULL, ask = EXCLUDED.ask, claim = EXCLUDED.claim, holder = EXCLUDED.holder \
                   WHERE {q}.expires < EXCLUDED.expires - interval '1 second' \
                     OR {q}.ask IS DISTINCT FROM EXCLUDED.ask OR {q}.mode <> 'x'), \
                 lazy AS (SELECT set_config('synchronous_commit', 'off', true) AS s \
                   WHERE NOT EXISTS (SELECT 1 FROM won)) \
                 SELECT (SELECT fence FROM won) AS fence, (SELECT remaining FROM busy) AS remaining, \
                   (SELECT EXISTS (SELECT 1 FROM {s} WHERE name = $1 AND mode <> 'shared' \
                      AND expires_at > clock_timestamp()) FROM busy WHERE by_shares) AS permits, \
                   EXISTS (SELECT 1 FROM ahead) AS behind, (SELECT count(*) FROM lazy) AS lazy"
            ),
            lease_extend: format!(
                "UPDATE {t} SET expires_at = clock_timestamp() + $3::float8 * interval '1 microsecond' \
                 WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp()"
            ),
            // The row (and its fencing counter) stays; a notification goes out on commit only
            // if a waiter announced itself (NOTIFY serialises commits on a global queue lock).
            // Waiters that announced themselves (`wait_until`: shared holders' waiters) hear
            // the name; the exclusive waiters' queue hears only its head's token. With
            // `handover=grant` the row goes to the queue's head instead, when it asked for it
            // (see `handover::release_ctes`).
            lease_release: format!(
                "WITH {} {RELEASED}",
                release_ctes(t, &q, "l.owner = $2", grant, true)
            ),
            // The leaver's entry goes (a granted one only if the grant answered an attempt of
            // this wait, numbered `$4` to `$5`: a later wait of the same request may hold it);
            // the lock granted to it and not taken is given back as a release does (to the
            // next head, granted or woken); otherwise the next head is woken if the lock is
            // free (the leaver may have been woken as the head and gone).
            lease_dequeue: format!(
                "WITH d AS (DELETE FROM {q} WHERE name = $1 AND waiter = $2 \
                   AND (mode <> 'g' OR ask BETWEEN $4 AND $5) RETURNING mode, granted), \
                 {}, \
                 wk AS ({}) \
                 SELECT (SELECT count(*) FROM d) + 0 * (SELECT count(*) FROM wk) \
                   + 0 * ({RELEASED})",
                release_ctes(
                    t,
                    &q,
                    "l.owner = $2 AND l.fence = (SELECT granted FROM d WHERE mode = 'g')",
                    grant,
                    false
                ),
                notify_head(
                    "$3",
                    &format!(
                        "EXISTS (SELECT 1 FROM d) AND NOT EXISTS (SELECT 1 FROM r) \
                       AND NOT EXISTS (SELECT 1 FROM {t} \
                       WHERE name = $1 AND ((owner IS NOT NULL AND expires_at > clock_timestamp()) \
                         OR shares_until > clock_timestamp()))"
                    ),
                    "AND waiter <> $2"
                )
            ),
            queued_lease: format!(
                "SELECT count(*) FROM {q} WHERE name = $1 AND mode <> 'g' \
                 AND expires > clock_timestamp()"
            ),
            // A shared or permit waiter's mark, and its queue entry (mode 's': counted by
            // `queued_waiters`, outside the exclusive waiters' order) as long as the mark.
            lease_wait_mark: format!(
                "WITH m AS (UPDATE {t} SET wait_until = greatest(wait_until, \
                   clock_timestamp() + $2::float8 * interval '1 microsecond') WHERE name = $1) \
                 INSERT INTO {q} (name, waiter, mode, enqueued, expires) \
                 VALUES ($1, $3, 's', clock_timestamp(), \
                   clock_timestamp() + $2::float8 * interval '1 microsecond') \
                 ON CONFLICT (name, waiter) DO UPDATE SET expires = EXCLUDED.expires"
            ),
            inspect,
            share_acquire: format!("SELECT * FROM {share_acquire_fn}($1, $2, $3, $4, $5, $6)"),
            // The lease row is locked first, as every statement touching shares does: a
            // release or revoke (row, then shares) and an extend (share, then row) would
            // otherwise wait for each other.
            share_extend: format!(
                "WITH l AS MATERIALIZED (SELECT 1 FROM {t} WHERE name = $1 FOR UPDATE), \
                 e AS (UPDATE {s} SET expires_at = clock_timestamp() + $3::float8 * interval '1 microsecond' \
                   WHERE EXISTS (SELECT 1 FROM l) AND name = $1 AND token = $2 \
                     AND expires_at > clock_timestamp() \
                   RETURNING expires_at), \
                 u AS (UPDATE {t} SET shares_until = greatest(shares_until, (SELECT expires_at FROM e)) \
                   WHERE name = $1 AND EXISTS (SELECT 1 FROM e)) \
                 SELECT count(*) FROM e"
            ),
            share_release: format!("SELECT {share_release_fn}($1, $2, $3)"),
            share_inspect: format!(
                "SELECT mode, fence, EXTRACT(EPOCH FROM (expires_at - clock_timestamp()))::float8, \
                   holder FROM {s} WHERE name = $1 AND expires_at > clock_timestamp() ORDER BY fence"
            ),
            revoke_lock: format!(
                "SELECT CASE WHEN owner IS NOT NULL AND expires_at > clock_timestamp() \
                   THEN owner END FROM {t} WHERE name = $1 FOR UPDATE"
            ),
            revoke_share_tokens: format!(
                "SELECT token FROM {s} WHERE name = $1 AND expires_at > clock_timestamp() \
                 ORDER BY fence"
            ),
            revoke_lease: format!(
                "WITH r AS (UPDATE {t} SET owner = NULL, expires_at = 'epoch' \
                   WHERE name = $1 AND owner IS NOT NULL AND expires_at > clock_timestamp() \
                   RETURNING name, wait_until), \
                 n AS (SELECT pg_notify($2, name) FROM r WHERE wait_until > clock_timestamp()), \
                 h AS ({}), \
                 v AS (SELECT pg_notify($2, notice) FROM unnest($3::text[]) notice) \
                 SELECT (SELECT count(*) FROM r) + 0 * (SELECT count(*) FROM n) \
                   + 0 * (SELECT count(*) FROM h) + 0 * (SELECT count(*) FROM v)",
                notify_head("$2", "EXISTS (SELECT 1 FROM r)", "")
            ),
        }
    }
}
