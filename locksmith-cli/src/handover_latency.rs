//! The hand-over latency of `locksmith bench`: how long from a holder's release being sent to
//! the next holder's `lock()` returning in another process.
//!
//! Each worker process stamps, on the system clock (the one clock every process of one machine
//! shares; `Instant` cannot leave its process), the moment each `lock()` returned and the
//! moment just before each `release()` was sent, and prints them as one `times` line. The
//! parent merges every process's stamps into one timeline. Mutual exclusion makes that
//! timeline alternate: an acquisition, its release, the next acquisition... (the next
//! `lock()` can only return after the server saw the release, which was sent after the stamp).
//! So each acquisition is paired with the release just before it, no token needed; a pair
//! inside one process (a re-grab) is not a hand-over across processes and is left out, and a
//! timeline that does not alternate (a clock stepped back) pairs nothing at that point.

use std::time::{SystemTime, UNIX_EPOCH};

use conformance::HandoverLatency;

/// One stamp of a worker: nanoseconds since the Unix epoch on the system clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stamp {
    /// `lock()` returned.
    Acquired(u64),
    /// `release()` is about to be sent.
    Released(u64),
}

impl Stamp {
    fn at(self) -> u64 {
        match self {
            Stamp::Acquired(t) | Stamp::Released(t) => t,
        }
    }
}

/// Now, on the clock all processes share, in nanoseconds since the Unix epoch.
pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The prefix of the line a worker prints its stamps on.
pub(crate) const TIMES_PREFIX: &str = "times ";

/// A worker's stamps as its `times` line: `a<ns>` or `r<ns>`, space separated.
pub(crate) fn times_line(stamps: &[Stamp]) -> String {
    let mut line = String::with_capacity(TIMES_PREFIX.len() + stamps.len() * 21);
    line.push_str(TIMES_PREFIX);
    for (i, s) in stamps.iter().enumerate() {
        if i > 0 {
            line.push(' ');
        }
        line.push(if matches!(s, Stamp::Acquired(_)) {
            'a'
        } else {
            'r'
        });
        line.push_str(&s.at().to_string());
    }
    line
}

/// The stamps of a `times` line (its prefix removed); `None` if a word is not a stamp.
pub(crate) fn parse_times(words: &str) -> Option<Vec<Stamp>> {
    words
        .split_whitespace()
        .map(|w| {
            let (kind, at) = w.split_at_checked(1)?;
            let at = at.parse().ok()?;
            match kind {
                "a" => Some(Stamp::Acquired(at)),
                "r" => Some(Stamp::Released(at)),
                _ => None,
            }
        })
        .collect()
}

/// The hand-overs between two processes, in nanoseconds, from every process's stamps
/// (`per_process[i]` is process `i`'s, in any order).
pub(crate) fn cross_process_handovers(per_process: &[Vec<Stamp>]) -> Vec<u64> {
    let mut timeline: Vec<(u64, bool, usize)> = per_process
        .iter()
        .enumerate()
        .flat_map(|(process, stamps)| {
            stamps
                .iter()
                .map(move |s| (s.at(), matches!(s, Stamp::Acquired(_)), process))
        })
        .collect();
    // At one nanosecond a release sorts before an acquisition (`false` < `true`).
    timeline.sort_unstable();
    let mut last_release: Option<(u64, usize)> = None;
    let mut handovers = Vec::new();
    for (at, acquired, process) in timeline {
        if !acquired {
            last_release = Some((at, process));
        } else if let Some((released, by)) = last_release.take()
            && by != process
        {
            handovers.push(at - released);
        }
    }
    handovers
}

/// The median and 99th percentile (nearest rank) of `handovers_ns`; `None` when empty.
pub(crate) fn latency(mut handovers_ns: Vec<u64>) -> Option<HandoverLatency> {
    if handovers_ns.is_empty() {
        return None;
    }
    handovers_ns.sort_unstable();
    let at = |p: f64| {
        let rank = ((handovers_ns.len() - 1) as f64 * p).round() as usize;
        handovers_ns[rank] as f64 / 1e3
    };
    Some(HandoverLatency {
        handovers: handovers_ns.len(),
        p50_us: at(0.50),
        p99_us: at(0.99),
    })
}

#[cfg(test)]
mod tests {
    use super::Stamp::{Acquired as A, Released as R};
    use super::*;

    #[test]
    fn pairs_each_acquisition_with_the_release_before_it_across_processes() {
        // Process 0 acquires at 100, releases at 200; process 1 gets it at 250 (50 ns);
        // process 1 releases at 300 and re-grabs at 310 itself (not across processes);
        // releases at 400; process 0 gets it at 470 (70 ns).
        let p0 = vec![A(100), R(200), A(470), R(500)];
        let p1 = vec![A(250), R(300), A(310), R(400)];
        assert_eq!(cross_process_handovers(&[p0, p1]), vec![50, 70]);
    }

    #[test]
    fn an_acquisition_without_a_release_before_it_pairs_nothing() {
        // Two acquisitions in a row (a clock stepped back): the second has no release of its
        // own; the first acquisition of the run has none either.
        let p0 = vec![A(100), R(200)];
        let p1 = vec![A(250), A(260), R(300)];
        let p2 = vec![A(340)];
        assert_eq!(cross_process_handovers(&[p0, p1, p2]), vec![50, 40]);
    }

    #[test]
    fn percentiles_by_nearest_rank_in_microseconds() {
        let ns: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        let l = latency(ns).expect("samples");
        assert_eq!(l.handovers, 100);
        assert_eq!(l.p50_us, 51.0); // rank round(99 * 0.5) = 50: the 51st
        assert_eq!(l.p99_us, 99.0); // rank round(99 * 0.99) = 98: the 99th
        assert!(latency(Vec::new()).is_none());
    }

    #[test]
    fn times_line_round_trips() {
        let stamps = vec![A(1_764_000_000_123_456_789), R(1_764_000_000_123_500_000)];
        let line = times_line(&stamps);
        assert_eq!(
            line, "times a1764000000123456789 r1764000000123500000",
            "{line}"
        );
        let words = line.strip_prefix(TIMES_PREFIX).expect("prefix");
        assert_eq!(parse_times(words), Some(stamps));
        assert_eq!(parse_times("a12 x3"), None);
        assert_eq!(times_line(&[]), TIMES_PREFIX, "no stamps: the prefix alone");
        assert_eq!(parse_times(""), Some(Vec::new()));
    }
}
