//! What each dialect and strategy declares it does ([`Capabilities`]): the contract the
//! conformance suite holds every configuration to.

use std::time::Duration;

use lockcore::Capabilities;

use crate::config::{Dialect, Parsed, Strategy};

pub(crate) fn capabilities(config: &Parsed) -> Capabilities {
    let mut c = strategy_capabilities(config.dialect, config.strategy);
    c.compatibility = crate::compat::table(config.dialect);
    match config.interop {
        Some(peer) => peer.capabilities(c),
        None => c,
    }
}

pub(crate) fn strategy_capabilities(dialect: Dialect, strategy: Strategy) -> Capabilities {
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
            // PostgreSQL: a revoke sends a NOTIFY naming the owner tokens it took away, heard by
            // every client's listener (see `pg::revocation`): the holder's lost signal fires at
            // once. MariaDB and SQLite have no notification channel: the next renewal finds out
            // (the default, at renewal).
            if dialect == Dialect::Postgres {
                c.revoke_detection = true;
                c.loss_detection = lockcore::LossDetection::Pushed {
                    within: Duration::from_secs(1),
                };
            }
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
                    c.notes.push(
                        "postgres lease: force_release notifies the revoked holders' clients (NOTIFY on the lock table's channel, which every lease client listens to from connect): the holder's lost signal fires within a second; a notice sent while its listener was reconnecting is lost, and the next renewal finds out".into(),
                    );
                }
                Dialect::MySql => {
                    c.notes.push(
                        "mysql lease: one statement per attempt; durability follows innodb_flush_log_at_trx_commit".into(),
                    );
                    c.notes.push(
                        "mysql lease: no notification channel: a holder learns of a force_release at its next renewal (a third of the TTL under auto-renewal)".into(),
                    );
                }
                Dialect::Sqlite => {
                    // SQLite's `julianday('now')` is the calling process's wall clock.
                    c.expiry_on_client_clock = true;
                    c.notes.push(
                        "sqlite: one host only (a file shared by processes, WAL mode); expiry has millisecond resolution".into(),
                    );
                    c.notes.push(
                        "sqlite: no notification channel: a holder learns of a force_release at its next renewal (a third of the TTL under auto-renewal)".into(),
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
