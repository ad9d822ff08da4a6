//! PostgreSQL lease hand-over by grant (`handover=grant`): a release gives the lock row to the
//! exclusive waiters' queue head itself, with a short claim TTL, and its `NOTIFY` names the
//! head, the attempt the grant answers and the fence; the head holds as soon as it hears it,
//! without an attempt of its own (see the crate docs' `handover=`).
//!
//! Safety of the head's validity, on its clock alone: the grant is made from what the head's
//! last refused attempt left in its queue entry (the attempt's number, `ask`), so the release
//! ran after that attempt reached the server; the claim counts from that attempt's send. A
//! grant naming an earlier attempt (a later one was refused since: the claim may be gone) is
//! only a wake-up. Attempt numbers come from one counter of the process, so two waits of one
//! request (a retry after `Unavailable`) never share one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::QUEUE_ENTRY_TTL;

/// A NOTIFY payload granting the lock to a queued waiter: after this byte, its owner token,
/// the number of the attempt the grant answers and the fence, separated by spaces (no lock
/// name starts with it: names have no control characters; a wake-up naming a waiter starts
/// with `\u{1}`, a revocation notice with `\u{2}`).
pub(super) const GRANT_PREFIX: char = '\u{3}';

/// The numbers of waiting attempts that ask for a grant: one counter for the process, never 0.
static ASKS: AtomicU64 = AtomicU64::new(1);

/// A fresh number for a waiting attempt that asks for a grant.
pub(super) fn next_ask() -> u64 {
    ASKS.fetch_add(1, Ordering::Relaxed)
}

/// The TTL a release gives the lock it grants to a waiter of `ttl`: short, so that a waiter
/// that crashed while queued or once granted holds the name up for this long at most (as long
/// as a dead queue entry), and longer than the queued waiters' poll, which finds a grant whose
/// notification was lost (the waiter's attempt wins the row that is already its own).
pub(super) fn claim(ttl: Duration) -> Duration {
    ttl.min(QUEUE_ENTRY_TTL)
}

/// A grant's notification, read: to whom, answering which attempt, with which fence.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Grant<'a> {
    pub(super) token: &'a str,
    pub(super) ask: u64,
    pub(super) fence: u64,
}

/// Reads a NOTIFY payload as a grant (`None`: it is something else).
pub(super) fn grant_of(payload: &str) -> Option<Grant<'_>> {
    let mut parts = payload.strip_prefix(GRANT_PREFIX)?.split(' ');
    let token = parts.next()?;
    let ask = parts.next()?.parse().ok()?;
    let fence = parts.next()?.parse().ok()?;
    parts
        .next()
        .is_none()
        .then_some(Grant { token, ask, fence })
}

/// The queue's head for name `$1` (the first live entry of queue table `q`), notified by name
/// on channel `chan` when `cond` holds: only it tries; `but` leaves out an entry being removed.
pub(super) fn notify_head(q: &str, chan: &str, cond: &str, but: &str) -> String {
    format!(
        "SELECT pg_notify({chan}, chr(1) || w.waiter) FROM (SELECT waiter FROM {q} \
           WHERE name = $1 AND mode = 'x' AND expires > clock_timestamp() {but} \
           ORDER BY enqueued, waiter LIMIT 1) w WHERE {cond}"
    )
}

/// The CTEs (separated by `,`) of a release of the lock row of name `$1` that `owned`
/// (a condition on its row, alias `l`) matches while it is live, on lock table `t` with
/// waiters' queue `q`, notifying on channel `$3`. `g` is the queue's live head (leaving out
/// waiter `$2`, the releaser or a leaver), read without a lock; with `grant`, when it asked for
/// a grant and no share is live (`gr`), the row goes to it in the release's own `UPDATE` (`r`,
/// returning `heir`: its token, the fence bumped, its holder metadata, an expiry of its
/// claim), its entry becomes a granted one (`gm`: mode `'g'`, the fence, expiring with the
/// claim) and the grant is notified (`gn`). Otherwise the row is freed, the head woken by its
/// token (`h`), and waiters that announced themselves by the name (`n`), as before grants.
/// With `own_entry`, the releaser's own granted entry, if it held by a grant, goes (`mine`:
/// entries no longer needed would pile up in the name's queue until their claims ran out; a
/// leaver's statement deletes its entry itself).
///
/// Locks are taken in the order every attempt takes them, the row first and then a queue
/// entry (`gm` waits for the head's entry while its own attempt has it: that attempt saw the
/// row held, so it waits for nothing of this statement's), so the two never wait for each
/// other. The row is never free in between: a row lock or a transaction lock of the name sees
/// it held either way (see `exclusion`). A head whose attempt renewed its entry meanwhile was
/// refused (it saw the row held), so the grant's notification names an attempt before its
/// last: it attempts again, and wins the row that is its own.
pub(super) fn release_ctes(t: &str, q: &str, owned: &str, grant: bool, own_entry: bool) -> String {
    let granting = if grant { "true" } else { "false" };
    let own_entry = if own_entry { "true" } else { "false" };
    format!(
        "g AS MATERIALIZED (SELECT w.waiter, w.ask, w.claim, w.holder FROM {q} w \
           WHERE w.name = $1 AND w.mode = 'x' AND w.expires > clock_timestamp() \
             AND w.waiter <> $2 ORDER BY w.enqueued, w.waiter LIMIT 1), \
         gr AS MATERIALIZED (SELECT * FROM g WHERE {granting} AND g.ask IS NOT NULL \
           AND g.claim > 0 AND NOT EXISTS (SELECT 1 FROM {t} s WHERE s.name = $1 \
             AND s.shares_until > clock_timestamp())), \
         r AS (UPDATE {t} AS l SET owner = gr.waiter, \
             expires_at = CASE WHEN gr.waiter IS NULL THEN 'epoch' \
               ELSE clock_timestamp() + gr.claim * interval '1 microsecond' END, \
             fence = CASE WHEN gr.waiter IS NULL THEN l.fence ELSE l.fence + 1 END, \
             holder = CASE WHEN gr.waiter IS NULL THEN l.holder ELSE gr.holder END, \
             acquired_at = CASE WHEN gr.waiter IS NULL THEN l.acquired_at ELSE clock_timestamp() END, \
             writer_until = CASE WHEN gr.waiter IS NULL THEN l.writer_until END \
           FROM (SELECT 1) one LEFT JOIN gr ON true \
           WHERE l.name = $1 AND {owned} AND l.expires_at > clock_timestamp() \
           RETURNING l.name, l.wait_until, gr.waiter AS heir, gr.ask, l.fence, l.expires_at), \
         gm AS (UPDATE {q} w SET mode = 'g', granted = r.fence, expires = r.expires_at \
           FROM r WHERE w.name = $1 AND w.waiter = r.heir), \
         mine AS (DELETE FROM {q} WHERE ctid IN (SELECT ctid FROM {q} \
           WHERE {own_entry} AND name = $1 AND waiter = $2 AND mode = 'g' \
             AND EXISTS (SELECT 1 FROM r) FOR UPDATE SKIP LOCKED)), \
         n AS (SELECT pg_notify($3, name) FROM r \
           WHERE heir IS NULL AND wait_until > clock_timestamp()), \
         gn AS (SELECT pg_notify($3, chr({grant_prefix}) || heir || ' ' || ask || ' ' || fence) \
           FROM r WHERE heir IS NOT NULL), \
         h AS (SELECT pg_notify($3, chr(1) || g.waiter) FROM g \
           WHERE EXISTS (SELECT 1 FROM r WHERE heir IS NULL))",
        grant_prefix = GRANT_PREFIX as u32,
    )
}

/// The final `SELECT` of a statement built on [`release_ctes`]: how many rows it released
/// (granted or freed), every notification CTE read.
pub(super) const RELEASED: &str = "SELECT (SELECT count(*) FROM r) + 0 * (SELECT count(*) FROM n) \
     + 0 * (SELECT count(*) FROM gn) + 0 * (SELECT count(*) FROM h)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_read_back_and_nothing_else_reads_as_one() {
        let g = grant_of("\u{3}abc 12 7").unwrap();
        assert_eq!(
            g,
            Grant {
                token: "abc",
                ask: 12,
                fence: 7
            }
        );
        assert_eq!(grant_of("\u{1}abc"), None);
        assert_eq!(grant_of("\u{2}abc 12 7"), None);
        assert_eq!(
            super::super::revocation::revoked_tokens("\u{3}abc 12 7"),
            None
        );
        assert_eq!(grant_of("name"), None);
        assert_eq!(grant_of("\u{3}abc 12"), None);
        assert_eq!(grant_of("\u{3}abc x 7"), None);
        assert_eq!(grant_of("\u{3}abc 1 2 3"), None);
        assert!(next_ask() < next_ask());
        assert_eq!(claim(Duration::from_secs(30)), QUEUE_ENTRY_TTL);
        assert_eq!(claim(Duration::from_secs(1)), Duration::from_secs(1));
    }
}
