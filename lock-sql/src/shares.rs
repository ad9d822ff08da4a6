//! Shared holders and semaphore permits of the lease strategy, common to every dialect: how a
//! share's mode is stored, what one attempt decides from what it read under the lease row's
//! lock, and how the live shares read back for `inspect`.
//!
//! Every dialect keeps the shares in `<table>_shares` (name, token, mode, expires_at, fence,
//! holder) and two columns on the lease row: `shares_until`, at least the latest expiry of the
//! name's live shares (the exclusive acquire's one statement reads the shares table only
//! before it: PostgreSQL keeps it exact, a MariaDB or SQLite share release leaves it as it was
//! so that the release is one `DELETE`), and `writer_until`, set by a waiting exclusive
//! acquisition that found live shares (shared requests that come while it lasts wait: a stream
//! of readers cannot starve a writer).
// Parts serve some dialects only (PostgreSQL decides in PL/pgSQL, SQLite in its statement's
// verdict, MariaDB's procedures and statements here): a build without every dialect leaves
// some unused.
#![cfg_attr(
    not(all(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]

use std::time::Duration;

use lockcore::{Error, Holder, LockInfo, LockMode, LockName, Result, Share};

/// How long a waiting writer's mark outlasts its attempt: past its next attempt, which comes
/// within a poll (at most 1 s, `Backoff::for_ttl`) or PostgreSQL's safety poll, with room for
/// a slow statement on a loaded machine. A writer that gives up leaves readers waiting at most
/// this long.
pub(crate) const WRITER_MARK: Duration = Duration::from_secs(3);

/// The shares table beside lock table `t`: `<t>_shares`. A `t` too long for PostgreSQL's
/// 63-byte identifiers once suffixed (the server would cut it) is cut to 47 characters and
/// given 8 hex digits of a hash of the whole name, so that two long lock tables with one
/// prefix never share a shares table.
pub(crate) fn table(t: &str) -> String {
    if t.len() <= 56 {
        return format!("{t}_shares");
    }
    // FNV-1a: stable across builds and platforms, which the table name must be.
    let hash = t.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let cut = t
        .char_indices()
        .map(|(i, _)| i)
        .take_while(|&i| i <= 47)
        .last()
        .unwrap_or(0);
    format!("{}_{:08x}_shares", &t[..cut], hash as u32)
}

/// A server-side share routine beside lock table `t`: `<t>_<what><version>` (e.g. `_sacq1`, a
/// share or permit attempt; `_srel1`, a release or revoke), cut as the shares table is, so
/// within PostgreSQL's 63 bytes and MariaDB's 64. The version is part of the name: a change of
/// a routine's signature or of what it does on the tables is a new routine beside the old
/// (which older clients keep calling), never a replacement. Pasted into SQL as the table names
/// are (validated: letters, digits and `_` only).
pub(crate) fn routine(t: &str, what: &str, version: u32) -> String {
    let shares = table(t);
    let stem = shares.strip_suffix("_shares").unwrap_or(&shares);
    format!("{stem}_{what}{version}")
}

/// The `mode` column of a share: `shared` or `permit:<limit>`.
pub(crate) fn mode_str(mode: LockMode) -> String {
    match mode {
        LockMode::Permit { limit } => format!("permit:{limit}"),
        _ => "shared".to_owned(),
    }
}

/// The mode a `mode` column names.
pub(crate) fn parse_mode(s: &str) -> Option<LockMode> {
    match s.strip_prefix("permit:") {
        Some(limit) => limit.parse().ok().map(|limit| LockMode::Permit { limit }),
        None => (s == "shared").then_some(LockMode::Shared),
    }
}

/// The refusal of a request whose use of the name disagrees with its holders'.
pub(crate) fn conflict(mode: LockMode) -> Error {
    Error::conflict(format!(
        "the lock is in use in another way (another mode or permit limit, or as a mutex), and \
         this acquisition asks for {mode}"
    ))
}

/// What a share attempt read with the lease row locked (times in seconds from now on the
/// database clock; only live entries).
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// The exclusive holder's time left, if the name is held exclusively.
    pub(crate) exclusive_left: Option<f64>,
    /// A waiting writer's mark's time left.
    pub(crate) writer_left: Option<f64>,
    /// The live shares: mode and time left.
    pub(crate) live: Vec<(String, f64)>,
    /// This token's live share's fence (a retried attempt whose first try committed).
    pub(crate) mine: Option<i64>,
}

impl Seen {
    /// From the lease row's times left and the name's live share rows, each (owner token,
    /// mode, seconds left, fence), as every dialect reads them; `token` is this attempt's.
    pub(crate) fn from_rows(
        exclusive_left: Option<f64>,
        writer_left: Option<f64>,
        token: &str,
        rows: Vec<(String, String, f64, i64)>,
    ) -> Self {
        Seen {
            exclusive_left,
            writer_left,
            mine: rows.iter().find(|r| r.0 == token).map(|r| r.3),
            live: rows.into_iter().map(|r| (r.1, r.2)).collect(),
        }
    }
}

/// What a share attempt does.
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    /// Insert the share (with the next fence).
    Take,
    /// Already ours (a retried attempt): reset its expiry and hand back its fence.
    Mine(i64),
    /// Held: try again, after about this long if known.
    Wait(Option<Duration>),
}

pub(crate) fn secs(s: f64) -> Option<Duration> {
    (s.is_finite() && s > 0.0).then(|| Duration::from_secs_f64(s.min(1e6)))
}

/// The rules, as lockcore's memory backend has them: another mode or limit among the live
/// shares is a conflict, and so is a permit beside an exclusive holder (a semaphore is never a
/// mutex); a reader waits for an exclusive holder and for a waiting writer; a permit waits
/// while `limit` are held.
pub(crate) fn decide(mode: LockMode, seen: &Seen) -> Result<Verdict> {
    if let Some(fence) = seen.mine {
        return Ok(Verdict::Mine(fence));
    }
    let wanted = mode_str(mode);
    if seen.live.iter().any(|(m, _)| *m != wanted) {
        return Err(conflict(mode));
    }
    let earliest = seen.live.iter().map(|(_, l)| *l).reduce(f64::min);
    match mode {
        LockMode::Permit { limit } => {
            if seen.exclusive_left.is_some() {
                return Err(conflict(mode));
            }
            if seen.live.len() >= limit as usize {
                return Ok(Verdict::Wait(earliest.and_then(secs)));
            }
        }
        _ => {
            if let Some(left) = seen.exclusive_left.or(seen.writer_left) {
                return Ok(Verdict::Wait(secs(left)));
            }
        }
    }
    Ok(Verdict::Take)
}

/// The codes of a verdict worked out by the database in [`verdict_sql`] (SQLite's).
#[cfg(feature = "sqlite")]
pub(crate) const SQL_WAIT: i64 = 0;
#[cfg(feature = "sqlite")]
pub(crate) const SQL_TAKE: i64 = 1;
#[cfg(feature = "sqlite")]
pub(crate) const SQL_MINE: i64 = 2;
#[cfg(feature = "sqlite")]
pub(crate) const SQL_CONFLICT: i64 = 3;

/// What a share attempt read, as SQL expressions for [`verdict_sql`]: where a dialect folds
/// the attempt into one round trip, the decision is made by the database, between its reads
/// and its writes.
#[cfg(feature = "sqlite")]
pub(crate) struct SeenSql<'a> {
    /// 1 if an exclusive holder holds the name, else 0 (never NULL).
    pub(crate) exclusive: &'a str,
    /// 1 if a waiting writer's mark is live, else 0 (never NULL).
    pub(crate) writer: &'a str,
    /// How many live shares the name has.
    pub(crate) live: &'a str,
    /// How many of them are in another mode than the one asked for (another permit limit too).
    pub(crate) other_modes: &'a str,
    /// This token's live share's fence, NULL if it has none.
    pub(crate) mine: &'a str,
    /// 1 for a permit, 0 for a shared request.
    pub(crate) permit: &'a str,
    /// The permit's limit (anything for a shared request).
    pub(crate) limit: &'a str,
}

/// [`decide`] as one SQL expression, evaluating to [`SQL_WAIT`], [`SQL_TAKE`], [`SQL_MINE`] or
/// [`SQL_CONFLICT`]: the same rules in the same order (the unit tests hold the two together).
#[cfg(feature = "sqlite")]
pub(crate) fn verdict_sql(s: &SeenSql<'_>) -> String {
    let SeenSql {
        exclusive,
        writer,
        live,
        other_modes,
        mine,
        permit,
        limit,
    } = s;
    format!(
        "(CASE WHEN ({mine}) IS NOT NULL THEN {SQL_MINE} \
           WHEN ({other_modes}) > 0 THEN {SQL_CONFLICT} \
           WHEN ({permit}) = 1 THEN (CASE WHEN ({exclusive}) = 1 THEN {SQL_CONFLICT} \
             WHEN ({live}) >= ({limit}) THEN {SQL_WAIT} ELSE {SQL_TAKE} END) \
           WHEN ({exclusive}) = 1 OR ({writer}) = 1 THEN {SQL_WAIT} \
           ELSE {SQL_TAKE} END)"
    )
}

/// A held name's [`LockInfo`] from its live shares: (mode, fence, seconds left, metadata), in
/// grant order. `None` when there are none.
pub(crate) fn info(
    name: &LockName,
    shares: Vec<(String, i64, f64, Option<String>)>,
) -> Option<LockInfo> {
    let mode = parse_mode(&shares.first()?.0)?;
    let all = shares
        .into_iter()
        .map(|(_, fence, left, holder)| {
            Share::new(
                u64::try_from(fence).ok(),
                secs(left),
                holder.as_deref().and_then(Holder::decode),
            )
        })
        .collect();
    Some(
        LockInfo::held(name.clone())
            .with_shares(all)
            .with_mode(Some(mode)),
    )
}

#[cfg(test)]
mod tests {

    #[test]
    fn long_lock_tables_get_shares_tables_of_their_own() {
        assert_eq!(table("locks"), "locks_shares");
        let a = table(&format!("{}a", "t".repeat(60)));
        let b = table(&format!("{}b", "t".repeat(60)));
        assert_ne!(a, b);
        for t in [a, b] {
            assert!(t.len() <= 63, "{t}");
            assert!(t.ends_with("_shares"), "{t}");
        }
    }
    use super::*;

    #[test]
    fn modes_round_trip_through_the_mode_column() {
        for mode in [LockMode::Shared, LockMode::Permit { limit: 7 }] {
            assert_eq!(parse_mode(&mode_str(mode)), Some(mode));
        }
        assert_eq!(parse_mode(""), None);
        assert_eq!(parse_mode("permit:x"), None);
    }

    /// [`verdict_sql`] run by a database agrees with [`decide`] on every combination of what
    /// an attempt can read (SQLite, whose share attempt uses it).
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn the_sql_verdict_is_decide() {
        use sqlx::Connection;
        let mut db = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("in-memory SQLite");
        let mut checked = 0;
        for mode in [LockMode::Shared, LockMode::Permit { limit: 2 }] {
            for (exclusive, writer, live, others, mine) in grid(0..2, 0..2, 0..4, 0..2, 0..2) {
                if others > live || mine > live {
                    continue;
                }
                let other_mode = match mode {
                    LockMode::Permit { .. } => "permit:3",
                    _ => "permit:2",
                };
                let seen = Seen {
                    exclusive_left: (exclusive == 1).then_some(1.0),
                    writer_left: (writer == 1).then_some(1.0),
                    live: (0..live)
                        .map(|i| {
                            let m = if i < others {
                                other_mode
                            } else {
                                &mode_str(mode)
                            };
                            (m.to_owned(), 5.0)
                        })
                        .collect(),
                    mine: (mine == 1).then_some(9),
                };
                let want = match decide(mode, &seen) {
                    Ok(Verdict::Take) => SQL_TAKE,
                    Ok(Verdict::Mine(_)) => SQL_MINE,
                    Ok(Verdict::Wait(_)) => SQL_WAIT,
                    Err(e) => {
                        assert_eq!(e.kind(), lockcore::ErrorKind::Conflict);
                        SQL_CONFLICT
                    }
                };
                let (permit, limit) = match mode {
                    LockMode::Permit { limit } => (1, limit),
                    _ => (0, 0),
                };
                let (exclusive, writer, live, others) = (
                    exclusive.to_string(),
                    writer.to_string(),
                    live.to_string(),
                    others.to_string(),
                );
                let sql = verdict_sql(&SeenSql {
                    exclusive: &exclusive,
                    writer: &writer,
                    live: &live,
                    other_modes: &others,
                    mine: if mine == 1 { "9" } else { "NULL" },
                    permit: &permit.to_string(),
                    limit: &limit.to_string(),
                });
                let got: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {sql}")))
                    .fetch_one(&mut db)
                    .await
                    .expect("the verdict evaluates");
                assert_eq!(got, want, "{mode} {seen:?}");
                checked += 1;
            }
        }
        assert!(checked > 40, "{checked} combinations");
    }

    fn grid(
        a: std::ops::Range<usize>,
        b: std::ops::Range<usize>,
        c: std::ops::Range<usize>,
        d: std::ops::Range<usize>,
        e: std::ops::Range<usize>,
    ) -> Vec<(usize, usize, usize, usize, usize)> {
        let mut all = Vec::new();
        for a in a {
            for b in b.clone() {
                for c in c.clone() {
                    for d in d.clone() {
                        for e in e.clone() {
                            all.push((a, b, c, d, e));
                        }
                    }
                }
            }
        }
        all
    }

    #[test]
    fn readers_wait_for_writers_and_permits_for_a_place() {
        let p2 = LockMode::Permit { limit: 2 };
        let shared = |n| vec![("shared".to_owned(), 5.0); n];
        let permits = |n| vec![("permit:2".to_owned(), 5.0); n];
        let seen = |live, exclusive_left, writer_left| Seen {
            exclusive_left,
            writer_left,
            live,
            mine: None,
        };
        let d = |mode, s: Seen| decide(mode, &s).map_err(|e| e.kind());
        assert_eq!(
            d(LockMode::Shared, seen(shared(3), None, None)),
            Ok(Verdict::Take)
        );
        assert!(matches!(
            d(LockMode::Shared, seen(shared(1), None, Some(2.0))),
            Ok(Verdict::Wait(Some(_)))
        ));
        assert!(matches!(
            d(LockMode::Shared, seen(vec![], Some(2.0), None)),
            Ok(Verdict::Wait(Some(_)))
        ));
        assert_eq!(d(p2, seen(permits(1), None, None)), Ok(Verdict::Take));
        assert!(matches!(
            d(p2, seen(permits(2), None, None)),
            Ok(Verdict::Wait(_))
        ));
        // A writer's mark does not hold permits back: it waits for readers only.
        assert_eq!(d(p2, seen(vec![], None, Some(2.0))), Ok(Verdict::Take));
        let conflict = Err(lockcore::ErrorKind::Conflict);
        assert_eq!(
            d(LockMode::Permit { limit: 3 }, seen(permits(1), None, None)),
            conflict
        );
        assert_eq!(d(LockMode::Shared, seen(permits(1), None, None)), conflict);
        assert_eq!(d(p2, seen(shared(1), None, None)), conflict);
        assert_eq!(d(p2, seen(vec![], Some(1.0), None)), conflict);
        let mut retried = seen(permits(2), None, None);
        retried.mine = Some(9);
        assert_eq!(decide(p2, &retried).ok(), Some(Verdict::Mine(9)));
    }
}
