//! locksmith backend for SQL databases through [sqlx]: PostgreSQL, MariaDB (MySQL for leases)
//! and SQLite.
//!
//! ```no_run
//! # async fn demo() -> lockcore::Result<()> {
//! use lockcore::{LockOptions, Locker};
//! let backend = lock_sql::SqlBackend::connect(
//!     "postgres://app:secret@db/app?sslmode=verify-full&sslrootcert=/etc/ca.pem&strategy=row-lock",
//! )
//! .await?;
//! let locker = Locker::new(backend);
//! let guard = locker.lock("jobs/nightly", &LockOptions::new()).await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # URL
//!
//! `postgres://` / `postgresql://`, `mysql://` (`mariadb://` is an alias) and `sqlite://path`.
//! Parameters read here, and removed before the URL goes to sqlx:
//!
//! * `strategy=lease` (default, every database) or `strategy=row-lock` (PostgreSQL 11+ and
//!   MariaDB; refused on SQLite with `InvalidConfig`). Lease is the default because it works
//!   everywhere and has a real server-side TTL.
//! * `table=` the lock table (default `locksmith_locks`), `^[A-Za-z_][A-Za-z0-9_]{0,62}$`.
//!   It is created on connect if missing. Both strategies (and on PostgreSQL [`PgXactLock`])
//!   may share a table: they exclude each other per name (see *One name, one lock* below).
//!   Holder metadata ([`lockcore::Holder`], read by
//!   [`Locker::inspect`](lockcore::Locker::inspect)) is written by the acquiring statement into
//!   the row: columns `holder` and `acquired_at` (the server's `clock_timestamp()`) on
//!   PostgreSQL, `holder_meta` and `acquired_at` (the server's `UTC_TIMESTAMP(6)`) on MariaDB
//!   (its older `holder` column is unused), `holder` on SQLite; a table created by an earlier
//!   version gets them on the first connect (one `ALTER TABLE`, only when they are missing).
//!   Not under `interop=get_lock`, whose peers write no row (`inspect` is `Unsupported` there).
//! * `pool_max=` (default 10; 4 on SQLite) how many connections short statements (lease
//!   operations, revokes) share, and how many idle connections are kept. A held row lock keeps
//!   a connection of its own outside this count, so any number of locks can be held up to the
//!   server's connection limit (a refusal there is `Unavailable`).
//! * `op_timeout_ms=` (default 5000) the client-side bound of a statement or connect that has
//!   no deadline of its own (`try_lock`, release, extend, revoke). Waits are bounded by the
//!   caller's deadline, so an unreachable database cannot hold `lock()` past it.
//! * `interop=sqlx` (PostgreSQL) or `interop=get_lock` (MariaDB/MySQL), with
//!   `strategy=row-lock`: the row lock is taken on the key another client uses, so both
//!   exclude each other: sqlx's `PgAdvisoryLock::new(name)` key (computed by sqlx itself), or
//!   `GET_LOCK` with the exact name (at most 64 characters: longer names are refused with
//!   `InvalidName` before any I/O). No fencing tokens in these modes (the peer bumps no
//!   counter); waiting, fairness and session-bound locks are the row-lock strategy's. See
//!   [`Interop`].
//!
//! The driver's parameters that sqlx 0.9 reads go to sqlx as they are ([`sqlx_params`] lists
//! them per database, every spelling sqlx reads: `sslmode`, `sslrootcert`, `application_name`,
//! ... on PostgreSQL; `ssl-mode`, `ssl-ca`, ... on MySQL/MariaDB; `mode`, `cache`, ... on
//! SQLite). Any other parameter is refused with `InvalidConfig` naming it and listing the
//! accepted ones: sqlx ignores a parameter it does not read, so a misspelled `sslmode` would
//! connect without checking the certificate, and a misspelled `strategy` would take locks
//! that do not exclude the other strategy's.
//! Secrets never appear in `Debug`, [`Backend::describe`], logs or errors, wherever the URL
//! carries them: the user-info password and any secret-looking query parameter (`password=`,
//! `sslkey=`, ...).
//!
//! **TLS**: `sslmode=require` (PostgreSQL) and `ssl-mode=required` (MySQL) encrypt but do **not**
//! verify the server's certificate: anyone on the path can pose as the server. Use
//! `sslmode=verify-full&sslrootcert=ca.pem` (PostgreSQL) or
//! `ssl-mode=verify_identity&ssl-ca=ca.pem` (MySQL/MariaDB): the certificate must chain to the
//! CA and name the host.
//!
//! # Strategies
//!
//! **row-lock**: the lock is a session lock held by a connection dedicated to the holder: a
//! PostgreSQL session advisory lock (`pg_advisory_lock` on a 64-bit hash of table and name:
//! `hashtextextended(name, seed)`, the seed the table name's 64-bit FNV-1a read as a signed
//! `bigint`, `-6380568882776862090` for the default `locksmith_locks`) or a
//! MariaDB user lock (`GET_LOCK` on a SHA-1 of database, table and name). Acquiring is one
//! statement: take the lock (try, or wait in the server's queue until the deadline via
//! `lock_timeout` / `GET_LOCK`'s timeout) and, holding it, bump the lock row's fencing counter,
//! committed with the statement before the caller sees the token (with `synchronous_commit = on`
//! forced on PostgreSQL): tokens never repeat or go back, across crashes and restarts too (on
//! MariaDB as durable as its commits: `innodb_flush_log_at_trx_commit = 1`). Release is one
//! statement.
//!
//! *What the token costs* (PostgreSQL): the counter's commit waits for a WAL flush, which is
//! most of an acquisition's time: an uncontended acquire + release measured 3.4x the bare
//! `pg_advisory_lock` + unlock with it, and the hand-over rate between processes 0.38x the bare
//! advisory-lock loop. The default options ([`Fencing::IfAvailable`](lockcore::Fencing)) give a
//! token and pay it; a caller whose writes are not fenced says
//! [`LockOptions::no_fencing`](lockcore::LockOptions::no_fencing) and the acquisition is the
//! advisory lock and its guard alone, nothing written (about the bare primitive's cost), its
//! guard without a token. [`Fencing::Required`](lockcore::Fencing) asks for one explicitly.
//! Tokens of holders that ask for them still only grow, whatever came between. Such a holder
//! stores no metadata either: [`inspect`](lockcore::Locker::inspect) of a lock held without a
//! token shows it held, with the token and metadata of the last holder that took one.
//! (MariaDB's row lock makes its token either way.) Waiters of one client on one name queue in the client; only the first waits on
//! the server. The lock lives as long as the connection: a crashed holder frees it at once
//! (`expiry_after_ttl = false`). The TTL is enforced by lockcore's watchdog; `extend` checks the
//! connection is alive; a background task pings the holding connection every
//! `min(ttl/4, 500 ms)` and fires [`LostReason::ConnectionLost`](lockcore::LostReason) when it
//! fails or takes longer than the TTL (within 250 ms..1 s: a slow answer on a loaded machine is
//! not a dead connection, and giving the connection up frees the lock); a server-side idle
//! guard of `ttl + 1 s`
//! (`idle_session_timeout` on PostgreSQL 14+, `wait_timeout` on MariaDB) ends the session of a
//! holder that stops talking (a wedged process).
//!
//! *Loss window*: when the server ends a holder's session (an administrator's kill, a restart),
//! the lock is free at once, and the holder learns it at its next health ping: within
//! `min(ttl/4, 500 ms)` plus a round trip, or the TTL (within 250 ms..1 s) more when the network
//! is silent, which is still before the server's idle guard frees the lock behind a silent
//! holder.
//! Until then its guard still reads valid. Fence writes with the token to close that window.
//!
//! A waiter's statement touches the lock table, so it keeps a `ROW EXCLUSIVE` (PostgreSQL) or
//! metadata lock (MariaDB) on it while it waits: schema changes of the lock table wait for the
//! waiters (normal statements and autovacuum do not).
//!
//! *Supported and tested*: PostgreSQL 15 and MariaDB 10.11 (the Debian packages). The MariaDB
//! SQL (`GET_LOCK` with fractional timeouts, `LAST_INSERT_ID(expr)`, `IS_USED_LOCK`) also
//! exists in MySQL 5.7+, but row-lock is not tested against MySQL.
//!
//! *Inside your own transaction* (PostgreSQL): [`PgXactLock`] takes the same lock with
//! `pg_advisory_xact_lock` on a transaction the application passes in, and bumps the same
//! fencing counter in it, so an update and the lock that guards it commit or roll back together.
//! It excludes row-lock holders and lease holders of the same name and table.
//!
//! **lease**: a row per name (bound as a parameter, never pasted into SQL) with the owner token,
//! a fencing counter and `expires_at` computed on the database clock. It is taken over only once
//! expired, in one statement that writes only when it takes (PostgreSQL reads first; MySQL's
//! upsert leaves a held row unchanged); release and extend only touch the row carrying the
//! caller's token. PostgreSQL's exclusive waiters queue on the server: a row each in
//! `<table>_waits` (name, the waiter's owner token, when it entered and when the entry expires,
//! both on the database clock), entered or renewed by the waiter's own attempts. A freed lock
//! goes to the queue's head only (first come, first served: `fair`), and a release's
//! `NOTIFY` names only the head (its token as the payload), so a hand-over costs the release,
//! the head's attempt and a few safety polls however many wait (the others poll every 2 s).
//! An entry expires 6 s after its waiter's last attempt: a waiter whose wait ended (deadline,
//! cancelled `lock()`) removes its entry in the background and names the next head; a crashed
//! one leaves nothing past those 6 s, during which, if it was the head, the freed lock waits.
//! Shared and permit waiters announce themselves on the row instead and are woken by a
//! `NOTIFY` of the name (sent only when one announced itself), with a capped poll as a safety
//! net; MySQL and SQLite waiters poll with backoff and jitter.
//!
//! *Shared holders and permits* (lease only: [`LockMode::Shared`](lockcore::LockMode) and
//! [`LockMode::Permit`](lockcore::LockMode)): each holder is a row of `<table>_shares` (name,
//! owner token, mode `shared` or `permit:<limit>`, `expires_at` on the database clock, fencing
//! token, holder metadata), created beside the lock table on connect (a lock table name over
//! 56 characters is cut and given a hash of the whole, to fit PostgreSQL's identifiers). A share is taken in one transaction that locks the name's lease row:
//! it drops the name's expired shares, checks the rules (no exclusive holder; for a reader, no
//! waiting writer; fewer than `limit` permits; every holder in the same mode and limit, else
//! `Conflict`) and takes the next value of the row's fencing counter, one counter across modes.
//! On PostgreSQL that transaction is one call of a PL/pgSQL function created beside the tables
//! on connect (one round trip, as an exclusive acquisition is), and a release another:
//! `<table>_sacq1` and `<table>_srel1` (the lock table's name cut as for `<table>_shares`, the
//! `1` the version of their protocol). They are created only when missing, under the advisory
//! lock the backend's DDL already takes (concurrent first connects create them once; an
//! existing one is never replaced, so a newer client's are new names beside it), with the
//! caller's rights: the backend's user needs `CREATE` on the schema (as for the tables) and
//! `EXECUTE` on them (granted to `PUBLIC` by default). They lock the name's lease row before
//! touching its shares, as the statements of older clients do, so both kinds of client
//! exclude each other during a rolling upgrade; inside the function each statement reads a new
//! snapshot, so the shares committed while it waited for the row are seen.
//! The lease row carries `shares_until` (the latest expiry of the live shares), which the
//! exclusive acquire's single statement checks, and `writer_until`, set by a waiting
//! `lock()` of a writer held back by readers (a few seconds, renewed at each attempt): readers
//! that come meanwhile wait, so a stream of readers cannot starve a writer. A released share
//! wakes waiters as an exclusive release does; `inspect` lists every live share; a revoke
//! deletes them all.
//!
//! *Multi-locks* (lease only; [`Capabilities::atomic_multi`]): an exclusive set
//! ([`Locker::try_lock_all`](lockcore::Locker::try_lock_all),
//! [`Locker::lock_all`](lockcore::Locker::lock_all)) is one transaction on one connection:
//! every member's own `try_lock` statement in canonical order (so on PostgreSQL a member with a
//! live waiter queued loses, as its `try_lock` does: a set jumps no queue), rolled back at the
//! first member not taken (reported busy, nothing taken) and committed when all were, each
//! member with the fencing token a single acquisition gives. The rows taken stay locked until
//! the transaction ends, so another client sees the whole set or none of it, and two sets lock
//! their common rows in the same order. Run detached as a single attempt is: a caller gone
//! before the commit rolls it back, one gone after has every member released in the
//! background. The row-lock strategy takes a set one lock at a time: each of its locks is a
//! session lock on a connection of its own, pinged, lost and released on its own, which one
//! transaction cannot be.
//!
//! *Readers on PostgreSQL's row lock* ([`LockMode::Shared`](lockcore::LockMode) with
//! `strategy=row-lock`): a reader holds `pg_advisory_lock_shared` on the writers' very key
//! (taken, waited for, released and fenced by the same statements as a writer's, with the
//! `_shared` functions), so readers hold together and never beside a writer, whoever took it:
//! another locksmith, a `psql` session's `pg_advisory_lock(hashtextextended(name, seed))`, a
//! [`PgXactLock`]. The server queues a request that conflicts with one already waiting behind
//! it, so a reader that comes after a waiting writer waits (and `try_lock` finds the name
//! busy): a stream of readers cannot starve a writer, and a writer whose wait ends frees the
//! readers behind it at once. Every reader gets a fencing token from the lock row's counter,
//! one counter across modes; readers taking tokens at the same moment wait for each other's
//! commit, not for each other's hold. `inspect` gives the mode and counts the readers (the
//! sessions `pg_locks` shows holding the key shared), without per-reader metadata: the row
//! keeps the last acquisition's only. No permits (an advisory lock counts no holders), and no
//! readers under `interop=sqlx` (sqlx's lock is exclusive only). MariaDB's row lock is
//! exclusive only (`GET_LOCK`).
//!
//! # One name, one lock
//!
//! What excludes what on one lock table and one name (issue 33). *Excludes*: the second
//! request is busy (`try_lock` answers `Ok(None)`, `lock()` waits) while the first holds;
//! *holds beside*: both hold; *Conflict*: the second is refused with `ErrorKind::Conflict`
//! (a semaphore is not a mutex).
//!
//! **PostgreSQL**, default layout (no `interop`), one table:
//!
//! | first holds \ second asks | lease excl. | lease shared | lease permits N | row-lock excl. | row-lock shared | `PgXactLock` |
//! |---|---|---|---|---|---|---|
//! | lease exclusive | excludes | excludes | Conflict | excludes | excludes | excludes |
//! | lease shared | excludes | holds beside | Conflict | excludes | holds beside | excludes |
//! | lease permits N | Conflict | Conflict | beside up to N (same N; else Conflict) | excludes | excludes | excludes |
//! | row-lock exclusive | excludes | excludes | excludes | excludes | excludes | excludes |
//! | row-lock shared | excludes | holds beside | excludes | excludes | holds beside | excludes |
//! | `PgXactLock` | excludes | excludes | excludes | excludes | excludes | excludes |
//!
//! How (`pg/exclusion.rs`): a row lock and a `PgXactLock` are the advisory lock on the name's
//! key (`hashtextextended(name, seed)`); a lease is the lock row and `<table>_shares`. A lease
//! attempt takes that key for its own transaction (`pg_advisory_xact_lock`, `_shared` for a
//! reader), waiting at most 500 ms: other lease attempts hold it for a statement, a row lock
//! or transaction lock for as long as it holds the name, and the attempt is then busy (no
//! `Unavailable` after the operation timeout, no wait on a row a transaction locked, and a
//! lease holder's renewal never waits: renewals do not take the key). A row lock or a
//! `PgXactLock`, once it holds the key, asks `<table>_lheld1` (a `VOLATILE` PL/pgSQL function,
//! created beside the share functions: its query takes a fresh snapshot, so it sees every
//! lease committed before the key was granted) whether a live lease holds the name, and backs
//! off if one does: a row lock unlocks the key at once (a waiting `lock()` looks again with a
//! backoff: a lease's expiry or release notifies it of nothing), a `PgXactLock::try_lock`
//! answers `None` and keeps the key until its transaction ends (PostgreSQL frees a
//! transaction's key only then), a `PgXactLock::lock` rolls back the savepoint it waits in and
//! looks again. Either order one side sees the other, so a fleet moving from one strategy to
//! the other one service at a time never has two holders. The share acquire function is at
//! version 2 (`<table>_sacq2`) for this; clients of earlier versions (`_sacq1`, and the lease
//! statements before it) take no key and do not exclude row locks. Leases need PostgreSQL 11+
//! for it (`hashtextextended`), as row locks did.
//!
//! *Cost*: the key adds an advisory lock to each lease attempt's transaction and a function
//! call (two index lookups) to each row-lock and transaction-lock acquisition, no round trip.
//! Measured on 2026-12-05 with `examples/sql_bench` (debug build, PostgreSQL 15 on loopback,
//! a 2-core machine at load 17, six interleaved runs of 1,000 uncontended `try_lock` +
//! release each): lease p50 460..804 µs before, 496..904 µs after (median of the runs 0.58 ms
//! to 0.87 ms; against the bare insert + delete 2.4x to 3.0x); row lock within the noise
//! (273..480 µs before, 329..408 µs after).
//!
//! **Interop layouts.** Under `interop=sqlx` (PostgreSQL row lock) the key is sqlx's
//! `PgAdvisoryLock::new(name)` key: it excludes sqlx's lock and other `interop=sqlx` row
//! locks; holding it, the row lock also tries the default layout's key (not waiting for it
//! while it holds sqlx's: busy, and a waiting `lock()` looks again with a backoff) and backs
//! off from a live lease as a default-layout row lock does, so it excludes leases,
//! default-layout row locks and `PgXactLock` of the name too, in both orders (sqlx's own
//! `PgAdvisoryLock` takes only its key: it does not see the default layout). Under `interop=get_lock` (MariaDB) the key is `GET_LOCK(name)`:
//! it excludes that peer and other `interop=get_lock` row locks; holding it, the row lock also
//! takes the default layout's key (`GET_LOCK` on a SHA-1 of database, table and name, the same
//! wait) and looks at the leases as a default-layout row lock does, so it excludes
//! default-layout row locks and leases of the name too, in both orders. The peer itself takes
//! only `GET_LOCK(name)`: it excludes `interop=get_lock` clients, not default-layout ones (a
//! declared limit: give every locksmith client of a name shared with the peer
//! `interop=get_lock`).
//!
//! **MariaDB**, one table: leases among themselves as in the PostgreSQL table (exclusive,
//! shared, permits); row locks among themselves (exclusive only); a lease (any mode, or a
//! member of a set) and a row lock of one name exclude each other, in both orders.
//! How (`mysql_exclusion.rs`): a row lock is `GET_LOCK` on the name's key (a SHA-1 of
//! database, table and name), a lease the lock row and `<table>_shares`. A lease attempt,
//! holding the lock row's InnoDB lock, takes the name only while `IS_USED_LOCK` says no
//! session holds the key (never waiting on it: a lease `try_lock` beside a row lock is
//! `Ok(None)` at once); an exclusive attempt that created the row (its values judged before
//! the row existed) asks once more after its commit and gives the lease back if a row lock
//! holds the key. A row lock, once it holds the key, reads the lock row with a lock (the
//! fenced statement's own upsert; a `LOCK IN SHARE MODE` read when it wants no token): it
//! waits for a lease attempt holding the row, and gives the key back at once if a live lease
//! (an owner, a live share or permit) holds the name; a waiting `lock()` looks again with a
//! backoff. Renewals look at neither side. The share procedures are at version 2
//! (`<table>_sacq2`, `_sext2`) for this; clients of earlier releases (`_sacq1`, their
//! statements) do not look at the key. Row-lock clients create `<table>_shares` too (their
//! check reads it).
//!
//! *Cost* (MariaDB): an `IS_USED_LOCK` in each lease attempt; the fenced row lock's upsert
//! reads the row's lease columns (and the shares table while `shares_until` is ahead); a row
//! lock without a token takes a second statement (the locking read). Measured on 2026-12-05
//! with `examples/sql_bench URL 1 0.5` (release builds of the commit before and after, run
//! interleaved three times each, MariaDB on loopback, a 2-core machine at load 13..17: the
//! figures are noisy), uncontended `try_lock` + release p50: lease 342/573/345 µs before,
//! 393/717/395 µs after; row lock with a token 196/203/174 µs before, 275/273/230 µs after;
//! row lock without a token (`SQL_BENCH_FENCING=off`) 97/97/99 µs before, 255/249/234 µs
//! after.
//!
//! **SQLite**: leases only, as in the PostgreSQL table among leases.
//!
//! **Retries.** An attempt re-sent with the same owner token (a lost reply, retried by
//! [`Locker::lock`](lockcore::Locker::lock)) passes every check the first one did (live
//! shares, permits, the queue); only the row it already holds, while it holds it, is taken
//! again. What an attempt wins after its caller's bound is released in the background once the
//! request is over or its guard ended, never under the guard of a retry that holds the same
//! row ([`lockcore::backend::acquire_detached_for`]).
#![deny(missing_docs)]

mod compat;
mod config;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod conns;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod inspect;
mod interop;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod registration;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod rowlock;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod shares;
mod sql_errors;

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "mysql")]
mod mysql_exclusion;
#[cfg(feature = "mysql")]
mod mysql_procs;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(feature = "postgres")]
mod pg_xact;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::fmt;
use std::time::Duration;

use lockcore::backend::{AcquireRequest, Acquired, Backend};
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use lockcore::backend::{Backoff, poll_attempts};
use lockcore::{Capabilities, Error, LockInfo, LockName, Result};

pub use config::{Config, DEFAULT_TABLE, Strategy, sqlx_params, validate_table};
use config::{Dialect, Parsed};
pub use interop::{Interop, MAX_GET_LOCK_BYTES, MAX_GET_LOCK_CHARS};
#[cfg(feature = "postgres")]
pub use pg_xact::PgXactLock;
#[cfg(feature = "mysql")]
pub use registration::MYSQL;
#[cfg(feature = "postgres")]
pub use registration::POSTGRES;
#[cfg(feature = "sqlite")]
pub use registration::SQLITE;

/// A client of one SQL database: a connection pool plus the lock table.
///
/// Two `SqlBackend`s connected separately never share a connection; within one backend, every
/// row-lock holder has a connection of its own for as long as it holds the lock.
pub struct SqlBackend {
    inner: Inner,
    config: Parsed,
    capabilities: Capabilities,
}

enum Inner {
    #[cfg(feature = "postgres")]
    Pg(Box<pg::PgBackend>),
    #[cfg(feature = "mysql")]
    My(mysql::MyBackend),
    #[cfg(feature = "sqlite")]
    Lite(sqlite::LiteBackend),
}

impl fmt::Debug for SqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlBackend")
            .field("url", &self.config.redacted)
            .field("strategy", &self.config.strategy)
            .field("table", &self.config.table)
            .finish()
    }
}

impl SqlBackend {
    /// Parses `url`, connects a pool and creates the lock table if it is missing.
    ///
    /// Cancel safety: dropping the future leaves nothing behind but possibly the (idempotently
    /// created) lock table.
    ///
    /// # Errors
    /// `InvalidConfig` for a malformed URL, an unknown scheme or parameter value, a bad table name
    /// or `strategy=row-lock` on SQLite; `Unavailable` when the server cannot be reached;
    /// `Backend` when it refuses (authentication, permissions).
    pub async fn connect(url: &str) -> Result<SqlBackend> {
        Self::from_config(Config::parse(url)?).await
    }

    /// Connects from a [`Config`] (deserialized from a config file, say), validated exactly as
    /// a URL is.
    ///
    /// Cancel safety: as [`SqlBackend::connect`].
    ///
    /// # Errors
    /// As [`SqlBackend::connect`].
    pub async fn from_config(config: Config) -> Result<SqlBackend> {
        let config = Parsed::from_config(config)?;
        let inner = match config.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => Inner::Pg(Box::new(pg::PgBackend::connect(&config).await?)),
            #[cfg(feature = "mysql")]
            Dialect::MySql => Inner::My(mysql::MyBackend::connect(&config).await?),
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => Inner::Lite(sqlite::LiteBackend::connect(&config).await?),
            #[allow(unreachable_patterns)]
            other => {
                return Err(Error::invalid_config(format!(
                    "lock-sql was built without support for {other:?}"
                )));
            }
        };
        let capabilities = capabilities(&config);
        Ok(SqlBackend {
            inner,
            config,
            capabilities,
        })
    }

    /// A lease backend on an SQLite pool the application already has, so it does not open a
    /// second one: the lock table (`table`, created if missing) lives in the pool's database
    /// file. The pool's own settings are kept: give it a `busy_timeout` (sqlx's default is 5 s)
    /// and WAL journaling for several processes, as [`SqlBackend::connect`] does.
    ///
    /// Cancel safety: dropping the future leaves nothing behind but possibly the (idempotently
    /// created) lock table.
    ///
    /// # Errors
    /// `InvalidConfig` for a bad table name or an in-memory database (its locks would not be
    /// shared between the pool's connections); `Unavailable` or `Backend` when the table cannot
    /// be created.
    #[cfg(feature = "sqlite")]
    pub async fn from_sqlite_pool(pool: sqlx::SqlitePool, table: &str) -> Result<SqlBackend> {
        let file = pool.connect_options().get_filename().to_owned();
        let mut url = url::Url::parse("sqlite://").expect("a valid URL");
        url.set_path(&file.to_string_lossy());
        let mut settings = Config::new(url.to_string());
        settings.table = table.to_owned();
        let config = Parsed::from_config(settings)?;
        let inner = Inner::Lite(sqlite::LiteBackend::with_pool(&config, pool).await?);
        let capabilities = capabilities(&config);
        Ok(SqlBackend {
            inner,
            config,
            capabilities,
        })
    }

    /// A backend on the connection settings of a PostgreSQL pool the application already has
    /// (host, credentials, TLS: no second URL or password to configure). Statements run on
    /// connections of this crate's own, opened with those settings as needed (a held row lock
    /// keeps a connection of its own, and sqlx's pool would add a ping per checkout): the
    /// application's pool is left alone.
    ///
    /// Cancel safety: as [`SqlBackend::connect`].
    ///
    /// # Errors
    /// As [`SqlBackend::connect`] (`InvalidConfig` for a bad table name).
    #[cfg(feature = "postgres")]
    pub async fn from_pg_pool(
        pool: &sqlx::PgPool,
        strategy: Strategy,
        table: &str,
    ) -> Result<SqlBackend> {
        let opts = (*pool.connect_options()).clone();
        let config = pool_config(
            "postgres",
            (opts.get_host(), opts.get_port()),
            opts.get_username(),
            opts.get_database(),
            strategy,
            table,
        )?;
        let inner = Inner::Pg(Box::new(pg::PgBackend::connect_with(&config, opts).await?));
        let capabilities = capabilities(&config);
        Ok(SqlBackend {
            inner,
            config,
            capabilities,
        })
    }

    /// A backend on the connection settings of a MySQL/MariaDB pool the application already
    /// has, as [`SqlBackend::from_pg_pool`] does for PostgreSQL (no second URL or password; this
    /// crate's own connections, opened with those settings; the application's pool is left
    /// alone).
    ///
    /// ```no_run
    /// # async fn f() -> lockcore::Result<()> {
    /// let pool = sqlx::MySqlPool::connect("mysql://app:pw@db/app").await.unwrap();
    /// let backend =
    ///     lock_sql::SqlBackend::from_mysql_pool(&pool, lock_sql::Strategy::Lease, "app_locks")
    ///         .await?;
    /// let locker = lockcore::Locker::new(backend);
    /// # Ok(()) }
    /// ```
    ///
    /// Cancel safety: as [`SqlBackend::connect`].
    ///
    /// # Errors
    /// As [`SqlBackend::connect`] (`InvalidConfig` for a bad table name).
    #[cfg(feature = "mysql")]
    pub async fn from_mysql_pool(
        pool: &sqlx::MySqlPool,
        strategy: Strategy,
        table: &str,
    ) -> Result<SqlBackend> {
        let opts = (*pool.connect_options()).clone();
        let config = pool_config(
            "mysql",
            (opts.get_host(), opts.get_port()),
            opts.get_username(),
            opts.get_database(),
            strategy,
            table,
        )?;
        let inner = Inner::My(mysql::MyBackend::connect_with(&config, opts).await?);
        let capabilities = capabilities(&config);
        Ok(SqlBackend {
            inner,
            config,
            capabilities,
        })
    }

    /// The strategy in use.
    pub fn strategy(&self) -> Strategy {
        self.config.strategy
    }

    /// The lock table.
    pub fn table(&self) -> &str {
        &self.config.table
    }

    /// Frees `name` behind its holder's back, as an administrator would: a lease row is expired
    /// (its fencing counter kept), a row lock's holding session, as the server reports it at
    /// this moment (`pg_locks` / `IS_USED_LOCK`), is terminated (`pg_terminate_backend` /
    /// `KILL CONNECTION`). The holder learns it through its next renewal (lease) or its
    /// connection health check (row lock). Returns whether anything was held.
    ///
    /// Cancel safety: dropping the future may or may not have revoked the lock.
    ///
    /// # Errors
    /// `Unsupported` where [`Capabilities::force_release`] is not offered; `Unavailable` or
    /// `Backend` when the database fails.
    pub async fn revoke(&self, name: &LockName) -> Result<bool> {
        if !self.capabilities.force_release {
            return Err(lockcore::Error::unsupported(
                "this backend cannot force-release locks",
            ));
        }
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.revoke(name).await,
            #[cfg(feature = "mysql")]
            Inner::My(b) => b.revoke(name).await,
            #[cfg(feature = "sqlite")]
            Inner::Lite(b) => b.revoke(name).await,
        }
    }

    /// A `SELECT 1` round trip on a pooled connection (for benchmarks: the floor of any lock
    /// operation).
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// `Unavailable` or `Backend` when the database fails.
    pub async fn ping(&self) -> Result<()> {
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.ping().await,
            #[cfg(feature = "mysql")]
            Inner::My(b) => b.ping().await,
            #[cfg(feature = "sqlite")]
            Inner::Lite(b) => b.ping().await,
        }
    }
}

fn capabilities(config: &Parsed) -> Capabilities {
    let mut c = strategy_capabilities(config.dialect, config.strategy);
    c.compatibility = compat::table(config.dialect);
    match config.interop {
        Some(peer) => peer.capabilities(c),
        None => c,
    }
}

fn strategy_capabilities(dialect: Dialect, strategy: Strategy) -> Capabilities {
    let mut c = Capabilities::default();
    c.fencing = true;
    c.reentrant = false;
    // Row locks: the holder's session is found on the server at the moment of revoking
    // (pg_locks / IS_USED_LOCK) and ended; leases: the row is expired.
    c.force_release = true;
    // Holder metadata is stored and read on every dialect, both strategies (interop modes
    // take it away again: their peers write no row).
    c.inspect = true;
    match strategy {
        Strategy::RowLock => {
            // A holder is a server session lock. PostgreSQL's advisory locks have a shared
            // mode (pg_advisory_lock_shared on the same key: readers); MariaDB's GET_LOCK is
            // exclusive only. Neither keeps a count of holders for permits.
            if dialect == Dialect::Postgres {
                c.shared = lockcore::Support::Yes;
                c.permits = lockcore::Support::no(
                    "row-lock: an advisory lock has no count of holders; use strategy=lease",
                );
            } else {
                let why = "row-lock: MariaDB's GET_LOCK is exclusive only; use strategy=lease";
                c.shared = lockcore::Support::no(why);
                c.permits = lockcore::Support::no(why);
            }
            // The server's lock queue: waiters sleep in the server and are woken by it.
            c.wait = lockcore::WaitKind::Notify;
            c.renew = lockcore::RenewKind::Native;
            c.lost_detection = true;
            c.revoke_detection = true;
            // The holder's connection is pinged at most min(ttl/4, 500 ms) after its last
            // statement (`rowlock::check_interval`): a killed session is seen by the next ping.
            c.loss_detection = lockcore::LossDetection::Checked {
                every: Duration::from_millis(500),
            };
            c.expiry_after_ttl = false;
            // PostgreSQL grants heavyweight (advisory) locks in arrival order, and a request
            // that conflicts with one already waiting queues behind it (a reader behind a
            // waiting writer waits; pg_try_advisory_lock_shared refuses): readers cannot starve
            // a writer. MariaDB's user locks promise no order, and waits over 5 s are queued
            // again.
            c.fair = dialect == Dialect::Postgres;
            c.min_ttl = Duration::from_millis(100);
            // Each held lock is a session lock on a connection of its own (pinged, released,
            // lost on its own): a set in one session would tie every member to one connection,
            // released together and lost together. A set is a sequence.
            c.atomic_multi = lockcore::Support::no(
                "row-lock: every lock is a session lock on a connection of its own; a set is taken one lock at a time",
            );
            c.notes = vec![
                "row-lock: a session lock (PostgreSQL advisory lock / MariaDB GET_LOCK) held by the holder's own connection; a crash frees it at once".into(),
                "row-lock: fencing tokens are the lock row's counter, committed before the token is returned: they never repeat across a server crash or restart (MariaDB: as durable as its commits, innodb_flush_log_at_trx_commit=1)".into(),
                "row-lock: loss window: a server-side kill frees the lock at once; the holder learns it within min(ttl/4, 500 ms) plus a round trip (a silent network adds up to the TTL, within 250 ms..1 s)".into(),
                "row-lock: the ttl is enforced by the client watchdog and by a server-side idle guard of ttl + 1 s".into(),
                "row-lock: every held lock has a connection of its own, outside pool_max; the server's connection limit bounds them (refusal: Unavailable)".into(),
            ];
            if dialect == Dialect::Postgres {
                c.notes.push(
                    "postgres row-lock: needs PostgreSQL 11+; the idle guard needs 14+ (idle_session_timeout); tested on 15".into(),
                );
                c.notes.push(
                    "postgres row-lock: the token's commit (a WAL flush) is most of an acquisition's cost; LockOptions::no_fencing() skips it (no token, nothing written: about the bare advisory lock's cost)".into(),
                );
                c.notes.push(
                    "postgres row-lock: readers hold pg_advisory_lock_shared on the writers' key; the server queues a reader behind a waiting writer (first come, first served: a stream of readers cannot starve a writer); inspect counts the readers (from pg_locks) but keeps no metadata per reader".into(),
                );
            } else {
                c.notes.push(
                    "mysql row-lock: tested on MariaDB 10.11 only (GET_LOCK, fractional timeouts); MySQL untested; the idle guard is wait_timeout (whole seconds); waits over 5 s are re-queued".into(),
                );
            }
        }
        Strategy::Lease => {
            // Shares are rows of `<table>_shares` beside the lease row (see `shares`).
            c.shared = lockcore::Support::Yes;
            c.permits = lockcore::Support::Yes;
            c.wait = if dialect == Dialect::Postgres {
                lockcore::WaitKind::Notify
            } else {
                lockcore::WaitKind::Poll
            };
            c.renew = lockcore::RenewKind::Emulated;
            c.lost_detection = false;
            c.expiry_after_ttl = true;
            // PostgreSQL: exclusive waiters queue in `<table>_waits`, served first come, first
            // served (the queue's head takes a freed lock; nobody else may).
            c.fair = dialect == Dialect::Postgres;
            c.min_ttl = Duration::from_millis(10);
            // An exclusive set is every member's attempt in one transaction (`try_set`).
            c.atomic_multi = lockcore::Support::Yes;
            c.notes = vec!["lease: expiry is judged on the database clock".into()];
            match dialect {
                Dialect::Postgres => {
                    c.notes.push(
                        "postgres lease: commits are synchronous (synchronous_commit=on) so a taken lease and its token survive a crash".into(),
                    );
                    c.notes.push(
                        "postgres lease: exclusive waiters queue on the server (FIFO, entries expire 6 s after their waiter's last attempt); a release notifies only the queue's head, the others poll every 2 s; a crashed waiter at the head holds a freed lock back until its entry expires".into(),
                    );
                }
                Dialect::MySql => c.notes.push(
                    "mysql lease: one statement per attempt; durability follows innodb_flush_log_at_trx_commit".into(),
                ),
                Dialect::Sqlite => {
                    // SQLite's `julianday('now')` is the calling process's wall clock.
                    c.expiry_on_client_clock = true;
                    c.notes.push(
                        "sqlite: one host only (a file shared by processes, WAL mode); expiry has millisecond resolution".into(),
                    );
                    c.notes.push(
                        "sqlite: expiry is judged on the host's wall clock (the library runs in each client): a clock stepped forward, or a process whose clock runs ahead, frees a live holder's lease early".into(),
                    );
                }
            }
        }
    }
    c
}

#[lockcore::backend::async_trait]
impl Backend for SqlBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.try_acquire(req).await,
            #[cfg(feature = "mysql")]
            Inner::My(b) => b.try_acquire(req).await,
            #[cfg(feature = "sqlite")]
            Inner::Lite(b) => b.attempt(req, false).await,
        }
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<lockcore::Instant>,
    ) -> Result<Option<Acquired>> {
        #[cfg(any(feature = "mysql", feature = "sqlite"))]
        let backoff = Backoff::for_ttl(req.ttl);
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.acquire(req, deadline).await,
            #[cfg(feature = "mysql")]
            Inner::My(b) if self.config.strategy == Strategy::RowLock => {
                b.acquire(req, deadline).await
            }
            // MySQL leases poll with backoff and full jitter, every attempt bounded by the
            // deadline.
            #[cfg(feature = "mysql")]
            Inner::My(b) => {
                poll_attempts(req, deadline, &backoff, || b.acquire(req, deadline)).await
            }
            // SQLite leases poll with backoff and full jitter; the attempts of a waiting
            // lock() (a writer marks itself waiting behind readers).
            #[cfg(feature = "sqlite")]
            Inner::Lite(b) => poll_attempts(req, deadline, &backoff, || b.attempt(req, true)).await,
        }
    }

    /// The lease strategy only (the only one declaring [`Capabilities::atomic_multi`]): every
    /// member's single exclusive attempt, with a `try_lock`'s parameters, in the order given
    /// (canonical), in one transaction on one connection; rolled back at the first member not
    /// won (`Busy` with it), committed when all are.
    ///
    /// Cancel safety: run detached as a single attempt is; a caller gone before the commit
    /// rolls the transaction back, and a set committed for a caller gone is released in the
    /// background.
    async fn try_acquire_all(
        &self,
        reqs: &[AcquireRequest],
    ) -> Result<lockcore::backend::SetAttempt> {
        if !self.capabilities.atomic_multi.is_yes() {
            return Err(Error::unsupported(
                "the row-lock strategy takes a set one lock at a time",
            ));
        }
        if let Some(r) = reqs
            .iter()
            .find(|r| r.mode != lockcore::LockMode::Exclusive)
        {
            return Err(Error::unsupported(format!(
                "sql leases take exclusive sets in one transaction, not {}",
                r.mode
            )));
        }
        if reqs.is_empty() {
            return Ok(lockcore::backend::SetAttempt::All(Vec::new()));
        }
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.try_set(reqs).await,
            #[cfg(feature = "mysql")]
            Inner::My(b) => b.try_set(reqs).await,
            #[cfg(feature = "sqlite")]
            Inner::Lite(b) => b.try_set(reqs).await,
        }
    }

    async fn queued_waiters(&self, name: &LockName) -> Result<usize> {
        // Used by the PostgreSQL arm only.
        let _ = name;
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.queued_waiters(name).await,
            #[allow(unreachable_patterns)]
            _ => Err(lockcore::Error::unsupported(
                "this database does not report its queued lock waiters",
            )),
        }
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        self.revoke(name).await
    }

    /// One statement: the lock row, with `pg_locks` (PostgreSQL) or `IS_USED_LOCK` (MariaDB)
    /// for a row lock.
    ///
    /// Cancel safe.
    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        match &self.inner {
            #[cfg(feature = "mysql")]
            Inner::My(b) => b.inspect(name).await,
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.inspect(name).await,
            #[cfg(feature = "sqlite")]
            Inner::Lite(b) => b.inspect(name).await,
        }
    }

    async fn round_trip(&self) -> Result<()> {
        SqlBackend::ping(self).await
    }

    async fn bare_cycle(&self, name: &LockName) -> Result<()> {
        // Unused where only SQLite is built.
        let _ = name;
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.bare_cycle(name).await,
            #[cfg(feature = "mysql")]
            Inner::My(b) => b.bare_cycle(name).await,
            #[cfg(feature = "sqlite")]
            Inner::Lite(_) => Err(Error::unsupported(
                "sqlite: no bare primitive is measured (a local file)",
            )),
        }
    }

    /// The row lock's bare cycle is `pg_advisory_lock` / `GET_LOCK`, which wait.
    fn bare_cycle_waits(&self) -> bool {
        self.config.strategy == Strategy::RowLock
    }

    async fn server_requests(&self) -> Result<u64> {
        match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.server_requests().await,
            #[cfg(feature = "mysql")]
            Inner::My(b) => b.server_requests().await,
            #[cfg(feature = "sqlite")]
            Inner::Lite(_) => Err(Error::unsupported("sqlite has no server to count requests")),
        }
    }

    async fn server_version(&self) -> Option<String> {
        let version = match &self.inner {
            #[cfg(feature = "postgres")]
            Inner::Pg(b) => b.server_version().await,
            #[cfg(feature = "mysql")]
            Inner::My(b) => b.server_version().await,
            #[cfg(feature = "sqlite")]
            Inner::Lite(b) => b.server_version().await,
        };
        version.ok()
    }

    fn describe(&self) -> String {
        match self.config.interop {
            Some(peer) => format!(
                "{} (strategy={}, table={}, interop={peer})",
                self.config.redacted, self.config.strategy, self.config.table
            ),
            None => format!(
                "{} (strategy={}, table={})",
                self.config.redacted, self.config.strategy, self.config.table
            ),
        }
    }
}

/// One member of a set attempt, as the dialects' set transactions bind it (each in its own
/// units: the TTL as µs or seconds).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[derive(Clone)]
pub(crate) struct SetMember {
    pub(crate) name: LockName,
    /// The owner token, as hex.
    pub(crate) token: String,
    pub(crate) ttl: Duration,
    /// The holder's metadata, encoded.
    pub(crate) holder: String,
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
impl SetMember {
    /// The members of a set, in the order of its requests.
    pub(crate) fn of(reqs: &[AcquireRequest]) -> Vec<SetMember> {
        reqs.iter()
            .map(|r| SetMember {
                name: r.name.clone(),
                token: r.token.to_hex(),
                ttl: r.ttl,
                holder: r.holder.encode(),
            })
            .collect()
    }
}

/// What a set attempt run by [`run_set_detached`] found: every member's lease in order, or
/// none and the index of the first member not won.
pub(crate) type SetWon<L> = (Vec<L>, Option<usize>);

/// [`lockcore::backend::acquire_detached_for`] for a set taken in one transaction (see
/// [`Backend::try_acquire_all`]): the attempt's leases become the set's acquisitions, all sent
/// at `sent_at`. The caller waits until `caller_bound` at most. A set won for a caller gone is
/// released member by member, in order, in the background, once the members' requests are
/// over (a retry of the set with the same tokens holds the same rows: never freed under it).
///
/// Cancel safe: what a dropped call's attempt wins is released.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) async fn run_set_detached<L, F, Fut>(
    reqs: &[lockcore::backend::AcquireRequest],
    sent_at: lockcore::Instant,
    caller_bound: Option<lockcore::Instant>,
    attempt: F,
) -> Result<lockcore::backend::SetAttempt>
where
    L: lockcore::backend::Lease,
    F: FnOnce(lockcore::backend::CallerGone) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<SetWon<L>>> + Send + 'static,
{
    use lockcore::backend::SetAttempt;
    match lockcore::backend::acquire_detached_for(reqs, caller_bound, attempt).await? {
        (_, Some(busy)) => Ok(SetAttempt::Busy(busy)),
        (won, None) => Ok(SetAttempt::All(
            won.into_iter().map(|l| Acquired::new(l, sent_at)).collect(),
        )),
    }
}

/// What a set's transaction found (see [`Backend::try_acquire_all`]).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) enum SetFound {
    /// Committed: every member's fence, in order.
    Won(Vec<u64>),
    /// Rolled back at this member, not taken.
    Busy(usize),
    /// Rolled back: the caller left before the commit.
    Abandoned,
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
impl SetFound {
    /// The leases of a committed set (each `leases[i]` given its fence by `fenced`), or the
    /// busy member.
    pub(crate) fn into_won<L>(
        self,
        leases: Vec<L>,
        fenced: impl Fn(L, u64) -> L,
    ) -> Result<SetWon<L>> {
        match self {
            SetFound::Won(fences) => {
                debug_assert_eq!(fences.len(), leases.len());
                Ok((
                    leases
                        .into_iter()
                        .zip(fences)
                        .map(|(l, f)| fenced(l, f))
                        .collect(),
                    None,
                ))
            }
            SetFound::Busy(i) => Ok((Vec::new(), Some(i))),
            SetFound::Abandoned => Err(set_abandoned()),
        }
    }
}

/// The error of a set attempt whose caller left before its commit: rolled back, nothing taken
/// (nobody reads it).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn set_abandoned() -> Error {
    Error::unavailable(
        "acquiring a set of locks",
        "the caller left before the commit: rolled back",
    )
}

/// The settings of a backend made on an application's pool: a URL naming the server, user and
/// database (for `describe()` and errors only: the connection settings are the pool's own,
/// password included, which never enters this URL).
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn pool_config(
    scheme: &str,
    (host, port): (&str, u16),
    user: &str,
    database: Option<&str>,
    strategy: Strategy,
    table: &str,
) -> Result<Parsed> {
    let mut url = url::Url::parse(&format!("{scheme}://localhost")).expect("a valid URL");
    let _ = url.set_host(Some(host));
    let _ = url.set_port(Some(port));
    let _ = url.set_username(user);
    url.set_path(database.unwrap_or(""));
    let mut settings = Config::new(url.to_string());
    settings.strategy = strategy;
    settings.table = table.to_owned();
    Parsed::from_config(settings)
}
