//! PostgreSQL: row locks (a session advisory lock plus the lock row's committed fencing counter,
//! one statement) and leases (read first, then one conditional upsert; LISTEN/NOTIFY wake-ups).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use lockcore::backend::{
    AcquireRequest, Acquired, CancelCleanUp, CleanUpIfCancelled, CleanUpTask, Lease,
};
use lockcore::{Error, Instant, LockInfo, LockMode, LockName, OwnerToken, Result, Share};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::{OnceCell, broadcast, oneshot};

use crate::config::{Parsed, Strategy};
use crate::conns::{Checked, Conns, is_conn_err};
use crate::rowlock::guard_timeout;
use crate::rowlock::{HealthChecks, Holding, Queues, RowLease};
use crate::sql_errors::{db_code, map_err};

pub(crate) mod exclusion;
mod lease;
mod rowlock;

/// SQLSTATE lock_not_available: lock_timeout ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The longest a lease waiter sleeps without a notification (the safety net for a lost NOTIFY).
const SAFETY_POLL: Duration = Duration::from_millis(500);

/// How far ahead a lease waiter announces itself (it announces again when that passes).
const WAIT_MARK: Duration = Duration::from_secs(30);

/// The longest a queued exclusive lease waiter sleeps without a notification: a release names
/// only the queue's head, so the others' polls are a safety net (a lost NOTIFY, a head that
/// died), each a request; every poll also renews the waiter's queue entry.
const QUEUE_POLL: Duration = Duration::from_secs(2);

/// How long a queue entry lives past its waiter's last attempt (judged on the server's clock):
/// long enough for the polls in between on a loaded machine, and the longest a crashed
/// waiter at the head of the queue keeps a freed lock from the next (a cancelled one removes
/// its entry at once).
const QUEUE_ENTRY_TTL: Duration = Duration::from_secs(6);

/// A NOTIFY payload naming one queued waiter (its owner token after this byte), not a lock
/// name: no lock name starts with it (names have no control characters).
const WAITER_PREFIX: char = '\u{1}';

/// The queue of exclusive lease waiters beside lock table `t` (`<t>_waits`; within
/// PostgreSQL's 63 bytes as the shares table is).
pub(crate) fn queue_table(t: &str) -> String {
    let shares = crate::shares::table(t);
    let stem = shares.strip_suffix("_shares").unwrap_or(&shares);
    format!("{stem}_waits")
}

/// The version of each share function's protocol, part of its name: a change of its signature
/// or of what it does on the tables is a new version (a new function beside the old, which
/// older clients keep calling), never a replacement. The acquire is at 2: it takes the name's
/// advisory key for its transaction first (see [`exclusion`]).
const SHARE_ACQUIRE_VERSION: u32 = 2;
const SHARE_RELEASE_VERSION: u32 = 1;

/// A share function beside lock table `t` (see [`crate::shares::routine`]): `sacq` or `srel`.
pub(crate) fn share_function(t: &str, what: &str) -> String {
    let version = if what == "sacq" {
        SHARE_ACQUIRE_VERSION
    } else {
        SHARE_RELEASE_VERSION
    };
    crate::shares::routine(t, what, version)
}

type PgConns = Conns<PgConnectOptions, ()>;

/// The row-lock statements of one mode, alike but for the advisory-lock functions they call:
/// `pg_advisory_lock` and friends for an exclusive holder, `pg_advisory_lock_shared` and
/// friends for a reader, on the same key (so they conflict as a read-write lock's modes do).
struct RowSql {
    /// Takes the lock if free, bumps and commits the fencing counter.
    try_fenced: String,
    /// `try_fenced` without the fencing counter (the caller wants no token).
    try_unfenced: String,
    /// Waits for the lock in the server's queue (`lock_timeout`), then as `try_fenced`.
    wait_fenced: String,
    /// `wait_fenced` without the fencing counter.
    wait_unfenced: String,
    unlock: String,
}

struct Sql {
    row_exclusive: RowSql,
    row_shared: RowSql,
    row_guard: String,
    revoke_row: String,
    queued_row: String,
    lease_acquire: String,
    lease_extend: String,
    lease_release: String,
    lease_wait_mark: String,
    /// Removes a waiter's queue entry (`$2`), and when the lock is free names the next waiter
    /// to `$3`'s channel (the removed one may have been woken as the head).
    lease_dequeue: String,
    /// Live queued waiters of a name (exclusive, shared and permit).
    queued_lease: String,
    revoke_lease: String,
    /// Shares (see [`crate::shares`]): one attempt, a call of the share function (see
    /// [`share_function`]): fence if won, seconds to wait, conflict.
    share_acquire: String,
    share_extend: String,
    /// Deletes one share (`$2`), or every share (`$2` NULL: a revoke), with the row locked: a
    /// call of the release function.
    share_release: String,
    /// Every live share, for `inspect`.
    share_inspect: String,
    /// Held or free, token, TTL left, metadata and waiters of one name (per strategy).
    inspect: String,
}

impl Sql {
    /// The row-lock statements of `mode`: shared, or exclusive (permits are not declared on
    /// row-lock, so never asked for).
    fn row(&self, mode: LockMode) -> &RowSql {
        match mode {
            LockMode::Shared => &self.row_shared,
            _ => &self.row_exclusive,
        }
    }
}

pub(crate) struct PgBackend {
    config: Parsed,
    conns: Arc<PgConns>,
    sql: Arc<Sql>,
    queues: Arc<Queues>,
    /// The health checks of this client's held row locks.
    health: Arc<HealthChecks>,
    listen_opts: PgConnectOptions,
    wakeups: OnceCell<Arc<Wakeups>>,
}

/// Release notifications of this client's table, fanned out to its waiters. `None` means
/// "maybe anything" (the listener reconnected and may have missed some).
struct Wakeups {
    tx: broadcast::Sender<Option<Arc<str>>>,
    _stop: oneshot::Sender<()>,
}

/// A stable 64-bit FNV-1a of the table name: the seed of the advisory-lock keys, so two lock
/// tables in one database never share a key.
pub(crate) fn table_seed(table: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in table.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

/// Every new connection: commits wait for the WAL flush (fencing tokens and leases must survive
/// a crash whatever the server's default), and (PostgreSQL 14+) a waiter whose client is gone
/// leaves the lock queue within 250 ms.
fn setup(conn: &mut PgConnection) -> futures::future::BoxFuture<'_, sqlx::Result<()>> {
    async move {
        let mut sql = String::from("SET synchronous_commit = on");
        if conn.server_version_num().unwrap_or(0) >= 140000 {
            sql.push_str("; SET client_connection_check_interval = '250ms'");
        }
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn).await?;
        Ok(())
    }
    .boxed()
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
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
fn share_functions_ddl(
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

impl PgBackend {
    pub(crate) async fn connect(config: &Parsed) -> Result<PgBackend> {
        let opts = PgConnectOptions::from_str(&config.sqlx_url).map_err(|e| {
            Error::invalid_config(config.scrub(format!("invalid postgres URL: {e}")))
        })?;
        Self::connect_with(config, opts).await
    }

    /// With connection settings the application already has (its pool's).
    pub(crate) async fn connect_with(config: &Parsed, opts: PgConnectOptions) -> Result<PgBackend> {
        let conns = Conns::new(opts.clone(), config, setup);
        let t = &config.table;
        let old_seq = format!("{}_fseq", &t[..t.len().min(57)]);
        let s = crate::shares::table(t);
        let q = queue_table(t);
        // One implicit transaction; the advisory lock serialises concurrent first connects
        // (CREATE ... IF NOT EXISTS can still collide on the catalog otherwise). Nothing takes a
        // table lock when the table is already as it should be: row-lock waiters keep a ROW
        // EXCLUSIVE lock on it while they wait, which an ALTER TABLE would queue behind. Row-lock
        // tokens used to come from a sequence: fold it into the rows' counters once, so they
        // only grow.
        let ddl = format!(
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
               IF to_regclass('{old_seq}') IS NOT NULL THEN \
               UPDATE {t} SET fence = (SELECT last_value FROM {old_seq}) \
                 WHERE fence < (SELECT last_value FROM {old_seq}); \
               DROP SEQUENCE {old_seq}; END IF; END $$"
        );
        let bound = conns.bound();
        let version: i32 = conns
            .run(bound, "creating the lock table", move |c| {
                let ddl = ddl.clone();
                async move {
                    sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut *c).await?;
                    Ok(c.server_version_num().unwrap_or(0) as i32)
                }
                .boxed()
            })
            .await?;
        if config.strategy == Strategy::RowLock && version < 110000 {
            return Err(Error::unsupported(
                "strategy=row-lock needs PostgreSQL 11 or later (hashtextextended)",
            ));
        }
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
                   (SELECT count(*) FROM {q} w WHERE w.name = $1 \
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
                    // sqlx's key and the default layout's (`$2`: the name).
                    format!(
                        "SELECT pg_advisory_unlock({key})::int \
                           + pg_advisory_unlock({})::int = 2 FROM (SELECT {}) g",
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
        // The queue's head for name `$1` (the first live entry), notified by name on channel
        // `chan` when `cond` holds: only it tries; `but` leaves out an entry being removed.
        let notify_head = |chan: &str, cond: &str, but: &str| {
            format!(
                "SELECT pg_notify({chan}, chr(1) || w.waiter) FROM (SELECT waiter FROM {q} \
                   WHERE name = $1 AND mode = 'x' AND expires > clock_timestamp() {but} \
                   ORDER BY enqueued, waiter LIMIT 1) w WHERE {cond}"
            )
        };
        // The share functions (see `share_functions_ddl`): an attempt and a release each one
        // round trip.
        let share_acquire_fn = share_function(t, "sacq");
        let share_release_fn = share_function(t, "srel");
        let functions = share_functions_ddl(t, &share_acquire_fn, &share_release_fn, &notify_head);
        conns
            .run(conns.bound(), "creating the share functions", move |c| {
                let functions = functions.clone();
                async move {
                    sqlx::raw_sql(AssertSqlSafe(functions))
                        .execute(&mut *c)
                        .await
                        .map(|_| ())
                }
                .boxed()
            })
            .await?;
        // A lease attempt takes the name's advisory key for its transaction: busy while a row
        // lock or a transaction lock has it (see `exclusion`).
        let takes_key = exclusion::lease_key_ctes(t);
        let sql = Sql {
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
            // other's would deadlock); one that wins leaves it. An entry renewed within the
            // last second is left as it is (the look again right after entering writes
            // nothing), and an attempt that did not win commits without waiting for the WAL
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
                 queued AS (INSERT INTO {q} (name, waiter, mode, enqueued, expires) \
                   SELECT $1, $2, 'x', clock_timestamp(), clock_timestamp() + $7::float8 * interval '1 microsecond' \
                   WHERE $6 AND NOT EXISTS (SELECT 1 FROM won) \
                   ON CONFLICT (name, waiter) DO UPDATE SET expires = EXCLUDED.expires \
                   WHERE {q}.expires < EXCLUDED.expires - interval '1 second'), \
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
            // the name; the exclusive waiters' queue hears only its head's token.
            lease_release: format!(
                "WITH r AS (UPDATE {t} SET owner = NULL, expires_at = 'epoch' \
                   WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp() \
                   RETURNING name, wait_until), \
                 n AS (SELECT pg_notify($3, name) FROM r WHERE wait_until > clock_timestamp()), \
                 h AS ({}) \
                 SELECT (SELECT count(*) FROM r) + 0 * (SELECT count(*) FROM n) \
                   + 0 * (SELECT count(*) FROM h)",
                notify_head("$3", "EXISTS (SELECT 1 FROM r)", "")
            ),
            lease_dequeue: format!(
                "WITH d AS (DELETE FROM {q} WHERE name = $1 AND waiter = $2 RETURNING 1), \
                 h AS ({}) \
                 SELECT (SELECT count(*) FROM d) + 0 * (SELECT count(*) FROM h)",
                notify_head(
                    "$3",
                    &format!(
                        "EXISTS (SELECT 1 FROM d) AND NOT EXISTS (SELECT 1 FROM {t} \
                       WHERE name = $1 AND ((owner IS NOT NULL AND expires_at > clock_timestamp()) \
                         OR shares_until > clock_timestamp()))"
                    ),
                    "AND waiter <> $2"
                )
            ),
            queued_lease: format!(
                "SELECT count(*) FROM {q} WHERE name = $1 AND expires > clock_timestamp()"
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
            revoke_lease: format!(
                "WITH r AS (UPDATE {t} SET owner = NULL, expires_at = 'epoch' \
                   WHERE name = $1 AND owner IS NOT NULL AND expires_at > clock_timestamp() \
                   RETURNING name, wait_until), \
                 n AS (SELECT pg_notify($2, name) FROM r WHERE wait_until > clock_timestamp()), \
                 h AS ({}) \
                 SELECT (SELECT count(*) FROM r) + 0 * (SELECT count(*) FROM n) \
                   + 0 * (SELECT count(*) FROM h)",
                notify_head("$2", "EXISTS (SELECT 1 FROM r)", "")
            ),
        };
        Ok(PgBackend {
            config: config.clone(),
            conns,
            sql: Arc::new(sql),
            queues: Arc::default(),
            health: Arc::default(),
            listen_opts: opts,
            wakeups: OnceCell::new(),
        })
    }

    /// The server's version string, for the report.
    pub(crate) async fn server_version(&self) -> Result<String> {
        self.conns
            .run(self.conns.bound(), "SHOW server_version", |c| {
                async move {
                    sqlx::query_scalar::<_, String>("SHOW server_version")
                        .fetch_one(c)
                        .await
                }
                .boxed()
            })
            .await
            .map(|v| format!("PostgreSQL {v}"))
    }

    pub(crate) async fn ping(&self) -> Result<()> {
        self.conns
            .run(self.conns.bound(), "SELECT 1", |c| {
                async move { sqlx::raw_sql("SELECT 1").execute(c).await.map(|_| ()) }.boxed()
            })
            .await
    }

    /// The bare primitive of the strategy: row-lock `pg_advisory_lock` then `pg_advisory_unlock`
    /// on one connection; lease: an insert and a delete of a row.
    pub(crate) async fn bare_cycle(&self, name: &LockName) -> Result<()> {
        let name = name.as_str().to_owned();
        let t = self.config.table.clone();
        let row_lock = self.config.strategy == Strategy::RowLock;
        self.conns
            .run(self.conns.bound(), "bare cycle", move |c| {
                let name = name.clone();
                let t = t.clone();
                async move {
                    if row_lock {
                        sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
                            .bind(&name)
                            .execute(&mut *c)
                            .await?;
                        sqlx::query("SELECT pg_advisory_unlock(hashtext($1))")
                            .bind(&name)
                            .execute(&mut *c)
                            .await?;
                    } else {
                        let bare = format!("{name}\u{1}bare");
                        sqlx::query(AssertSqlSafe(format!(
                            "INSERT INTO {t} (name, owner) VALUES ($1, 'bare')"
                        )))
                        .bind(&bare)
                        .execute(&mut *c)
                        .await?;
                        sqlx::query(AssertSqlSafe(format!("DELETE FROM {t} WHERE name = $1")))
                            .bind(&bare)
                            .execute(&mut *c)
                            .await?;
                    }
                    Ok(())
                }
                .boxed()
            })
            .await
    }

    /// Transactions the server has finished (committed + rolled back), from
    /// `pg_stat_database`: every statement of this crate is one. Sessions publish their counts
    /// at most once a second, so read it a second after the load stops.
    pub(crate) async fn server_requests(&self) -> Result<u64> {
        self.conns
            .run(self.conns.bound(), "reading pg_stat_database", |c| {
                async move {
                    let n: i64 = sqlx::query_scalar(
                        "SELECT (sum(xact_commit) + sum(xact_rollback))::int8 FROM pg_stat_database",
                    )
                    .fetch_one(c)
                    .await?;
                    Ok(n as u64)
                }
                .boxed()
            })
            .await
    }

    pub(crate) async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        match self.config.strategy {
            Strategy::RowLock => self.row_acquire(req, None, true).await,
            Strategy::Lease => Ok(self
                .lease_attempt(req, self.conns.bound(), false, false, None)
                .await?
                .0),
        }
    }

    pub(crate) async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        match self.config.strategy {
            Strategy::RowLock => {
                let nowait = deadline.is_some_and(|d| d <= Instant::now());
                self.row_acquire(req, deadline, nowait).await
            }
            Strategy::Lease => self.lease_wait(req, deadline).await,
        }
    }

    /// Waiters queued in the server for `name`: row-lock sessions waiting for the advisory
    /// lock, or exclusive lease waiters' queue entries.
    ///
    /// Cancel safe.
    pub(crate) async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        let (name, sql) = match self.config.strategy {
            Strategy::RowLock => (self.row_param(name), self.sql.queued_row.clone()),
            // Exclusive waiters' live queue entries.
            Strategy::Lease => (name.as_str().to_owned(), self.sql.queued_lease.clone()),
        };
        let n: i64 = self
            .conns
            .run(self.conns.bound(), "counting queued waiters", move |c| {
                sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                    .bind(name.clone())
                    .fetch_one(c)
                    .boxed()
            })
            .await?;
        Ok(n.max(0) as usize)
    }

    /// One statement: held or free, TTL left (lease), waiters (the row lock's server queue, the
    /// lease's queue entries), the row's token
    /// and holder metadata, when acquired on the server's clock.
    ///
    /// Cancel safe.
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        type Row = (
            bool,
            Option<f64>,
            Option<i64>,
            Option<i64>,
            Option<String>,
            Option<f64>,
            Option<i64>,
        );
        let (n, sql) = (name.as_str().to_owned(), self.sql.inspect.clone());
        let (held, remaining, waiting, fence, holder, acquired_ms, readers): Row = self
            .conns
            .run(self.conns.bound(), "inspecting a lock", move |c| {
                sqlx::query_as(AssertSqlSafe(sql.clone()))
                    .bind(n.clone())
                    .fetch_one(c)
                    .boxed()
            })
            .await?;
        let waiters = waiting.map(|w| w.max(0) as usize);
        let lease = self.config.strategy == Strategy::Lease;
        if !held {
            if lease && let Some(info) = self.inspect_shares(name).await? {
                return Ok(info);
            }
            return Ok(LockInfo::free(name.clone(), waiters));
        }
        // Row-lock readers: the server knows their sessions, not which acquisition the row's
        // token and metadata are from (the last one that took a token, maybe gone): each is
        // listed without them.
        if let Some(readers) = readers.filter(|&r| r > 0) {
            let shares = vec![Share::new(None, None, None); readers as usize];
            return Ok(LockInfo::held(name.clone())
                .with_shares(shares)
                .with_mode(Some(LockMode::Shared))
                .with_waiters(waiters));
        }
        Ok(
            crate::inspect::held(name, fence, remaining, holder.as_deref(), acquired_ms)
                .with_waiters(waiters)
                .with_mode(Some(LockMode::Exclusive)),
        )
    }

    /// The live shares of a name (lease strategy), if any.
    ///
    /// Cancel safe.
    async fn inspect_shares(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let (n, sql) = (name.as_str().to_owned(), self.sql.share_inspect.clone());
        let rows: Vec<(String, i64, f64, Option<String>)> = self
            .conns
            .run(self.conns.bound(), "inspecting shares", move |c| {
                sqlx::query_as(AssertSqlSafe(sql.clone()))
                    .bind(n.clone())
                    .fetch_all(c)
                    .boxed()
            })
            .await?;
        Ok(crate::shares::info(name, rows))
    }

    pub(crate) async fn revoke(&self, name: &LockName) -> Result<bool> {
        let param = self.row_param(name);
        let shares = match self.config.strategy {
            Strategy::Lease => {
                lease::release_shares(&self.conns, &self.sql, name, None, &self.config.table)
                    .await?
            }
            Strategy::RowLock => 0,
        };
        let name = name.as_str().to_owned();
        let table = self.config.table.clone();
        match self.config.strategy {
            Strategy::Lease => {
                let sql = self.sql.revoke_lease.clone();
                let n: i64 = self
                    .conns
                    .run(self.conns.bound(), "revoking a lease", move |c| {
                        sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                            .bind(name.clone())
                            .bind(table.clone())
                            .fetch_one(c)
                            .boxed()
                    })
                    .await?;
                Ok(n > 0 || shares > 0)
            }
            Strategy::RowLock => {
                let name = param;
                let sql = self.sql.revoke_row.clone();
                let killed: Vec<bool> = self
                    .conns
                    .run(
                        self.conns.bound(),
                        "terminating a row lock's holder",
                        move |c| {
                            sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                                .bind(name.clone())
                                .fetch_all(c)
                                .boxed()
                        },
                    )
                    .await?;
                Ok(killed.into_iter().any(|k| k))
            }
        }
    }
}
