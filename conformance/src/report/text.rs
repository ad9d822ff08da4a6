//! Formatting shared by the Markdown and HTML renderings: the provenance line, backend
//! descriptions, capability rows and the figures' cells.

use std::time::Duration;

use lockcore::{Capabilities, LossDetection};

use crate::measure::Figures;
use crate::run::BackendReport;

use super::{Note, Report};

impl Report {
    /// One line on where the report comes from, and a warning for a debug build.
    pub(super) fn provenance_line(&self) -> (String, Option<&'static str>) {
        let Some(p) = &self.provenance else {
            return (String::new(), None);
        };
        let mut line = format!(
            "{} · commit {} · {} build",
            p.tool,
            p.git_commit.as_deref().unwrap_or("unknown"),
            p.profile
        );
        let servers: Vec<String> = self
            .backends
            .iter()
            .filter_map(|b| Some(format!("{}: {}", b.label, b.server_version.as_ref()?)))
            .collect();
        if !servers.is_empty() {
            line.push_str(&format!(" · servers: {}", servers.join(", ")));
        }
        let warn = (p.profile != "release").then_some(
            "Debug build: latency and hand-over figures are not representative; \
             measure with `cargo run --release -p locksmith-cli -- report`.",
        );
        (line, warn)
    }
}

pub(super) fn note_number(notes: &[Note<'_>], backend: usize, scenario: &str) -> usize {
    notes
        .iter()
        .find(|n| n.backend == backend && n.result.scenario == scenario)
        .map(|n| n.number)
        .unwrap_or(0)
}

pub(super) fn describe(b: &BackendReport) -> String {
    if b.backend.is_empty() {
        "(not connected)".to_string()
    } else if let Some(version) = &b.server_version {
        format!("{} · server {version}", b.backend)
    } else {
        b.backend.clone()
    }
}

pub(super) fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The capability rows: field name and what it means.
pub(super) const CAPABILITY_ROWS: [(&str, &str); 18] = [
    ("fencing", "guards carry strictly increasing fencing tokens"),
    ("fair", "waiters served first come, first served"),
    ("wait", "how lock() learns the lock is free"),
    ("renew", "native: session-bound; emulated: TTL + watchdog"),
    ("lost_detection", "the backend itself reports lost leases"),
    (
        "revoke_detection",
        "it also notices a lock deleted behind its holder by itself",
    ),
    (
        "loss_detection",
        "how soon it reports a lease lost behind its holder by itself",
    ),
    ("extend_sets_ttl", "extend(ttl) sets the TTL asked for"),
    ("reentrant", "a holder may take its own lock again"),
    (
        "expiry_after_ttl",
        "a crashed holder's lock is held until its TTL runs out",
    ),
    ("force_release", "an operator can free a held lock"),
    (
        "inspect",
        "anyone can read who holds a lock (holder metadata, token, TTL left)",
    ),
    (
        "shared",
        "read-write locks: readers together, never beside a writer (why not, where not)",
    ),
    (
        "permits",
        "semaphores: at most N holders, each permit a lease (why not, where not)",
    ),
    (
        "atomic_multi",
        "a multi-lock taken in one request, every member or none (why not, where not)",
    ),
    ("min_ttl", "smallest TTL accepted"),
    ("max_ttl", "largest TTL accepted"),
    ("notes", "caveats of this backend's guarantees"),
];

pub(super) fn capability_value(c: &Capabilities, cap: &str) -> Vec<String> {
    let yn = |b: bool| vec![if b { "yes" } else { "no" }.to_string()];
    let kind = |v: serde_json::Result<serde_json::Value>| {
        vec![match v {
            Ok(serde_json::Value::String(s)) => s,
            _ => "?".to_string(),
        }]
    };
    match cap {
        "fencing" => yn(c.fencing),
        "fair" => yn(c.fair),
        "wait" => kind(serde_json::to_value(c.wait)),
        "renew" => kind(serde_json::to_value(c.renew)),
        "lost_detection" => yn(c.lost_detection),
        "revoke_detection" => yn(c.revoke_detection),
        "loss_detection" => vec![match c.loss_detection {
            LossDetection::Pushed { within } => format!("pushed within {}", fmt_duration(within)),
            LossDetection::Checked { every } => format!("checked every {}", fmt_duration(every)),
            _ => "at renewal".to_string(),
        }],
        "extend_sets_ttl" => yn(c.extend_sets_ttl),
        "reentrant" => yn(c.reentrant),
        "expiry_after_ttl" => yn(c.expiry_after_ttl),
        "force_release" => yn(c.force_release),
        "inspect" => yn(c.inspect),
        "shared" => support(&c.shared),
        "permits" => support(&c.permits),
        "atomic_multi" => support(&c.atomic_multi),
        "min_ttl" => vec![fmt_duration(c.min_ttl)],
        "max_ttl" => vec![fmt_duration(c.max_ttl)],
        "notes" => c.notes.clone(),
        _ => vec!["?".to_string()],
    }
}

/// The primitives-by-backend rows: the primitive and what it is.
pub(super) const PRIMITIVE_ROWS: [(&str, &str); 5] = [
    ("mutex", "one holder at a time"),
    (
        "read-write lock",
        "readers together, a writer alone (LockMode::Shared)",
    ),
    (
        "semaphore",
        "at most N holders, each permit a lease (LockMode::Permit)",
    ),
    (
        "multi-lock",
        "several names all or nothing (Locker::lock_all), in canonical order",
    ),
    (
        "leader election",
        "campaign / leader / watch_leader (Locker::campaign), the term a fencing token",
    ),
];

/// Whether a backend with `c` gives the primitive of `row`, and why not.
pub(super) fn primitive_value(c: &Capabilities, row: &str) -> String {
    match row {
        "mutex" => "yes".into(),
        "read-write lock" => support(&c.shared).join(""),
        "semaphore" => support(&c.permits).join(""),
        "multi-lock" if c.atomic_multi.is_yes() => {
            "yes: one request for the set (exclusive), every member or none".into()
        }
        "multi-lock" => "yes: one acquisition per name, in canonical order".into(),
        "leader election" if !c.inspect => {
            "campaign yes; leader() no: the backend cannot read who holds a lock".into()
        }
        "leader election" if !c.fencing => "yes, without terms (no fencing tokens)".into(),
        "leader election" => "yes".into(),
        _ => "?".into(),
    }
}

fn support(s: &lockcore::Support) -> Vec<String> {
    vec![match s.why_not() {
        None => "yes".to_string(),
        Some(why) => format!("no: {why}"),
    }]
}

/// Uncontended p50 as a multiple of the round trip, or `-`.
fn fmt_ratio(f: &crate::measure::Figures) -> String {
    match f.round_trip_p50_us {
        Some(rt) if rt > 0.0 => format!("{:.2}x", f.uncontended_p50_us / rt),
        _ => "-".into(),
    }
}

fn fmt_us(v: f64) -> String {
    if !v.is_finite() {
        "?".to_string()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn fmt_rate(v: f64) -> String {
    if !v.is_finite() {
        "?".to_string()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

pub(super) fn fmt_ms(ms: u64) -> String {
    if ms >= 10_000 {
        format!("{:.0} s", ms as f64 / 1000.0)
    } else {
        format!("{ms} ms")
    }
}

pub(super) fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    let secs = d.as_secs();
    if d.is_zero() {
        "0".to_string()
    } else if ms < 1000 {
        format!("{ms} ms")
    } else if secs < 120 && d.subsec_millis() == 0 {
        format!("{secs} s")
    } else if secs < 120 {
        format!("{:.1} s", d.as_secs_f64())
    } else if secs < 2 * 3600 {
        format!("{} min", secs / 60)
    } else if secs < 2 * 86400 {
        format!("{} h", secs / 3600)
    } else {
        format!("{} days", secs / 86400)
    }
}

/// What the figures columns mean.
pub(super) const FIGURES_LEGEND: &str = "Uncontended: `try_lock` + `release` by one client, one after the other; shared and permit: \
the same for a reader of a read-write lock and for one of 3 permits, interleaved with the \
exclusive pairs, as a multiple of an exclusive pair. \
Bare: the backend's own lock primitive without the library (`Backend::bare_cycle`), and round \
trip: its cheapest request (`PING`, `SELECT 1`, `exists`), both measured interleaved with the \
uncontended pairs by the same client. Hand-over: clients looping `lock` + `release` on one \
name, as tasks of one process and as separate OS processes (spread: most / fewest \
acquisitions of one process). Fairness: more processes over a longer run (8 for 10 s by \
default); the fewest acquisitions of one process divided by a fair share (1.00 is even, 0.00 \
a starved process: split-vote livelock or one process re-grabbing). Requests per hand-over: growth of the server's own request \
counter divided by hand-overs, with many waiters spread over several processes (a herd shows \
as a large number). Loopback servers on a shared machine: compare ratios, not absolute numbers.";

/// The figures table's columns after the backend.
pub(super) const FIGURE_COLUMNS: [&str; 14] = [
    "uncontended p50 (µs)",
    "uncontended p99 (µs)",
    "shared p50 / exclusive",
    "permit p50 / exclusive",
    "bare p50 (µs)",
    "p50 / bare",
    "round trip p50 (µs)",
    "p50 / round trip",
    "samples",
    "tasks hand-over/s (N)",
    "processes hand-over/s (N)",
    "process spread (max/min)",
    "fairness: fewest / fair share (N processes, s)",
    "server requests per hand-over",
];

/// One backend's figures as the cells of [`FIGURE_COLUMNS`].
pub(super) fn figure_cells(f: &Figures) -> Vec<String> {
    let (procs, spread) = match &f.processes {
        Some(p) => (
            format!("{} ({})", fmt_rate(p.handover_per_sec), p.processes),
            format!("{:.2}", p.spread()),
        ),
        None => ("-".into(), "-".into()),
    };
    let fairness = match &f.fairness {
        Some(p) => format!("{:.2} ({}, {} s)", p.min_fair_share(), p.processes, p.secs),
        None => "-".into(),
    };
    let requests = match &f.server_requests {
        Some(r) => match r.per_handover {
            Some(v) => match r.client_per_handover {
                Some(sent) => format!(
                    "{v:.1}; {sent:.1} sent by the clients ({} waiters / {} processes)",
                    r.waiters, r.processes
                ),
                None => format!("{v:.1} ({} waiters / {} processes)", r.waiters, r.processes),
            },
            None => "unsupported".into(),
        },
        None => "-".into(),
    };
    vec![
        fmt_us(f.uncontended_p50_us),
        fmt_us(f.uncontended_p99_us),
        f.shared_ratio().map_or("-".into(), |r| format!("{r:.2}x")),
        f.permit_ratio().map_or("-".into(), |r| format!("{r:.2}x")),
        f.bare_cycle_p50_us.map_or("-".into(), fmt_us),
        f.bare_ratio().map_or("-".into(), |r| format!("{r:.2}x")),
        f.round_trip_p50_us.map_or("-".into(), fmt_us),
        fmt_ratio(f),
        f.samples.to_string(),
        format!("{} ({})", fmt_rate(f.handover_per_sec), f.holders),
        procs,
        spread,
        fairness,
        requests,
    ]
}
