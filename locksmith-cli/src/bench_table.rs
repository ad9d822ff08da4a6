//! The table `locksmith bench` prints: its cells from the measured [`Figures`], aligned plain
//! text for the terminal, and the Markdown file (`--markdown`) that says how, when and under
//! what load the figures were measured (the guide's figures chapter includes that file).

use conformance::Figures;

use crate::steady::OncePerWaiter;

/// One measured backend: its label, its figures, and what its waiters paid once in the
/// requests run, where counted.
pub(crate) struct Row {
    pub(crate) label: String,
    pub(crate) figures: Figures,
    pub(crate) once: Option<OncePerWaiter>,
}

/// When and under what load a run started or ended.
pub(crate) struct Conditions {
    /// `YYYY-MM-DD HH:MM UTC`.
    date: String,
    /// The 1-minute load average (`/proc/loadavg`), where the system has one.
    load: Option<String>,
}

impl Conditions {
    pub(crate) fn now() -> Self {
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Conditions {
            date: conformance::report::utc_date(unix),
            load: std::fs::read_to_string("/proc/loadavg")
                .ok()
                .and_then(|l| l.split_whitespace().next().map(str::to_owned)),
        }
    }
}

/// The command line as run, with every URL's password blanked (the figures file is shared).
pub(crate) fn shown_command(args: impl Iterator<Item = String>) -> String {
    let mut words = vec!["locksmith".to_owned()];
    words.extend(args.skip(1).map(|a| {
        if a.contains("://") {
            locksmith::redact_url(&a)
        } else {
            a
        }
    }));
    words.join(" ")
}

/// The figures as a Markdown file: the command, the build, the date and the machine's load,
/// the table, and what its columns mean. Generated, never edited by hand: the guide's figures
/// chapter includes it.
pub(crate) fn markdown(
    command: &str,
    started: &Conditions,
    ended: &Conditions,
    cells: &[Vec<String>],
) -> String {
    use std::fmt::Write;
    let provenance = crate::provenance::provenance();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let load = |c: &Conditions| c.load.clone().unwrap_or_else(|| "unknown".into());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<!-- Written by `locksmith bench --markdown`; regenerate it, do not edit it. -->\n"
    );
    let _ = writeln!(out, "Measured with `{command}`\n");
    let _ = writeln!(
        out,
        "- {}, {} build{}",
        provenance.tool,
        provenance.profile,
        provenance
            .git_commit
            .map_or(String::new(), |c| format!(" of commit `{c}`"))
    );
    let _ = writeln!(out, "- from {} to {}", started.date, ended.date);
    let _ = writeln!(
        out,
        "- {cores} cores; load average (1 min) {} at the start, {} at the end: a busy machine \
         moves every figure, so compare ratios within one run, not microseconds across runs\n",
        load(started),
        load(ended)
    );
    for (i, line) in cells.iter().enumerate() {
        let _ = writeln!(out, "| {} |", line.join(" | "));
        if i == 0 {
            let align: Vec<&str> = (0..line.len())
                .map(|c| if c == 0 { "---" } else { "---:" })
                .collect();
            let _ = writeln!(out, "|{}|", align.join("|"));
        }
    }
    out.push_str(COLUMNS);
    out
}

/// What each column of the table means (printed under the Markdown table).
const COLUMNS: &str = "
Columns: *p50 / p99*: uncontended `try_lock` + `release` by one client; *shared x* and
*permit x*: a reader's and a permit's cycle over the exclusive one; *bare*: the backend's bare
primitive (`Backend::bare_cycle`: the fewest server requests that take and give back the lock)
by the same client, and *x bare* the ratio; *rtt*: the backend's cheapest round trip on the
bench's multi-thread runtime, *rtt 1-thread* on a current-thread runtime of its own;
*hand-over µs*: from a holder's release being sent to the next holder's `lock()` returning in
another process (p50 / p99, in the *procs/s* run, stamped on the system clock the processes
share), and *hand-over x rtt* its p50 over *rtt*;
*tasks/s*: hand-overs between tasks of one process (their number in brackets); *procs/s*:
hand-overs between OS processes on one name; *bare procs/s*: the same processes looping the
bare primitive where it waits, and *procs x bare* the ratio; *spread*: most / fewest
acquisitions of one process; *fair*: the fewest acquisitions of one process over a fair share;
*req/hand-over*: server requests per hand-over with many waiters (the server's own counter,
server-wide); *sent/hand-over*: the requests those waiting clients sent per hand-over (counted
by proxies in front of them; `-` where none can stand before the server). Both are counted
over the run's steady window, which lasts `--secs`: it opens once every waiter has been seen
waiting (each one's `lock()` was marked waiting by its backend, `Locker::waiting`: its first
attempt answered, subscribed or queued) and closes before the waiters are told to stop (so
before any wait is cut off), and the hand-overs are the acquisitions stamped inside it. What a
waiter pays once, to start waiting (its first attempts, subscriptions, queue entries) and to
stop (leaving the queue, unsubscribing), is *sent once/waiter*: what the clients sent over the
whole run (from `go` to every worker's exit; connecting is not counted) beyond the steady
rate times all the run's hand-overs, per waiter. `-`: not measured for that backend.

Options: every loop takes the library's defaults, as a user who sets nothing gets them: the
lease renewed in the background (auto-renewal on), a fencing token where the backend gives one
(`--no-fencing`: none). The in-process loops (*p50 / p99*, *shared x*, *permit x*, *tasks/s*)
ask a 10 s TTL and bound their wait at 30 s; the worker processes (*hand-over µs*, *procs/s*,
*spread*, *fair*, *req/hand-over*, *sent/hand-over*) keep the default TTL (30 s) and wait without a
deadline. A renewal falls due a third of the way into a lease (on Redis, into a granted
hand-over's short claim: a second at the default `poll_ms`), so with holds of microseconds the
counted runs renew nothing; a renewal that did fall due would count in *req/hand-over* and
*sent/hand-over* like any request.
";

/// The figures as table cells, the header first.
pub(crate) fn cells(rows: &[Row]) -> Vec<Vec<String>> {
    let opt = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    let header = [
        "backend",
        "p50 µs",
        "p99 µs",
        "shared x",
        "permit x",
        "bare µs",
        "x bare",
        "rtt µs",
        "rtt 1-thread µs",
        "hand-over µs",
        "hand-over x rtt",
        "tasks/s",
        "procs/s",
        "bare procs/s",
        "procs x bare",
        "spread",
        "fair min/share",
        "req/hand-over",
        "sent/hand-over",
        "sent once/waiter",
    ];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for Row {
        label,
        figures: f,
        once,
    } in rows
    {
        let (procs, spread) = match &f.processes {
            Some(p) => (
                format!("{:.0} ({})", p.handover_per_sec, p.processes),
                format!("{:.2}", p.spread()),
            ),
            None => ("-".into(), "-".into()),
        };
        let fairness = match &f.fairness {
            Some(p) => format!("{:.2} ({}p {}s)", p.min_fair_share(), p.processes, p.secs),
            None => "-".into(),
        };
        let requests = match &f.server_requests {
            Some(r) => match (r.per_handover, &r.unsupported) {
                (Some(v), _) => format!("{v:.1} ({}w/{}p)", r.waiters, r.processes),
                (None, Some(_)) => "unsupported".into(),
                (None, None) => "-".into(),
            },
            None => "-".into(),
        };
        let sent = f
            .server_requests
            .as_ref()
            .and_then(|r| r.client_per_handover)
            .map_or("-".into(), |v| format!("{v:.2}"));
        lines.push(vec![
            label.clone(),
            format!("{:.1}", f.uncontended_p50_us),
            format!("{:.1}", f.uncontended_p99_us),
            opt(f.shared_ratio(), 2),
            opt(f.permit_ratio(), 2),
            opt(f.bare_cycle_p50_us, 1),
            opt(f.bare_ratio(), 2),
            opt(f.round_trip_p50_us, 1),
            opt(f.round_trip_one_thread_p50_us, 1),
            f.handover_latency
                .as_ref()
                .map_or("-".into(), |l| format!("{:.0}/{:.0}", l.p50_us, l.p99_us)),
            opt(f.handover_latency_ratio(), 2),
            format!("{:.0} ({})", f.handover_per_sec, f.holders),
            procs,
            f.bare_processes
                .as_ref()
                .map_or("-".into(), |b| format!("{:.0}", b.handover_per_sec)),
            opt(f.bare_handover_ratio(), 2),
            spread,
            fairness,
            requests,
            sent,
            once.and_then(|o| o.sent)
                .map_or("-".into(), |v| format!("{v:.1}")),
        ]);
    }
    lines
}

/// Table cells as aligned plain text.
pub(crate) fn plain_table(lines: &[Vec<String>]) -> String {
    use std::fmt::Write;
    let header = &lines[0];
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in lines {
        for (i, cell) in line.iter().enumerate() {
            let pad = widths[i] - cell.chars().count();
            if i == 0 {
                let _ = write!(out, "{cell}{}", " ".repeat(pad));
            } else {
                let _ = write!(out, "  {}{cell}", " ".repeat(pad));
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use conformance::{HandoverLatency, ProcessHandover, ServerRequests};

    use super::*;

    #[test]
    fn table_shows_unsupported_and_missing() {
        let mut f = Figures {
            uncontended_p50_us: 300.0,
            uncontended_p99_us: 900.0,
            bare_cycle_p50_us: Some(150.0),
            round_trip_p50_us: Some(80.0),
            handover_per_sec: 1000.0,
            holders: 4,
            ..Figures::default()
        };
        f.server_requests = Some(ServerRequests {
            waiters: 100,
            processes: 10,
            unsupported: Some("no counter".into()),
            ..ServerRequests::default()
        });
        f.processes = Some(ProcessHandover {
            processes: 4,
            secs: 2.0,
            per_process: vec![10, 20, 10, 5],
            handover_per_sec: 22.5,
        });
        // The bare primitive's processes: 30/s, the library's 22.5/s.
        f.bare_processes = Some(ProcessHandover {
            processes: 4,
            secs: 2.0,
            per_process: vec![15, 15, 15, 15],
            handover_per_sec: 30.0,
        });
        // Fair share 10; the fewest got 5.
        f.fairness = Some(ProcessHandover {
            processes: 8,
            secs: 10.0,
            per_process: vec![5, 10, 10, 10, 10, 10, 10, 15],
            handover_per_sec: 8.0,
        });
        // The hand-over's p50 over the round trip's: 120 / 80.
        f.handover_latency = Some(HandoverLatency {
            handovers: 44,
            p50_us: 120.0,
            p99_us: 1234.4,
        });
        let mut counted = f.clone();
        counted.server_requests = Some(ServerRequests {
            waiters: 100,
            processes: 10,
            handovers: 40,
            requests: Some(2000),
            per_handover: Some(50.0),
            client_requests: Some(172),
            client_per_handover: Some(4.3),
            ..ServerRequests::default()
        });
        let row = |label: &str, figures: Figures, once: Option<OncePerWaiter>| Row {
            label: label.into(),
            figures,
            once,
        };
        let once = OncePerWaiter {
            sent: Some(12.5),
            server: Some(40.0),
        };
        let t = plain_table(&cells(&[
            row("redis", f, None),
            row("memory", Figures::default(), None),
            row("counted", counted, Some(once)),
        ]));
        let counted_line = t.lines().last().expect("three rows");
        assert!(counted_line.contains("50.0 (100w/10p)"), "{t}");
        let last: Vec<&str> = counted_line.split_whitespace().rev().take(2).collect();
        assert_eq!(
            last,
            ["12.5", "4.30"],
            "the clients' own count, then once per waiter: {t}"
        );
        assert!(t.contains("0.50 (8p 10s)"), "{t}");
        assert!(t.contains("2.00"), "{t}"); // x bare
        assert!(t.contains("4.00"), "{t}"); // spread 20/5
        assert!(t.contains("unsupported"), "{t}");
        assert!(t.contains("0.75"), "procs x bare: {t}");
        let cell = |row: usize, header: &str| {
            let lines: Vec<Vec<&str>> = t
                .lines()
                .map(|l| {
                    l.split("  ")
                        .map(str::trim)
                        .filter(|c| !c.is_empty())
                        .collect()
                })
                .collect();
            let column = lines[0].iter().position(|h| *h == header).expect(header);
            lines[row][column].to_owned()
        };
        assert_eq!(cell(1, "hand-over µs"), "120/1234", "{t}");
        assert_eq!(cell(1, "hand-over x rtt"), "1.50", "{t}");
        assert_eq!(cell(2, "hand-over µs"), "-", "not measured: {t}");
        assert_eq!(cell(2, "hand-over x rtt"), "-", "not measured: {t}");
        assert_eq!(cell(1, "sent once/waiter"), "-", "not counted: {t}");
        assert_eq!(t.lines().count(), 4);
    }

    #[test]
    fn markdown_says_how_and_when_without_passwords() {
        let command = shown_command(
            [
                "/x/target/release/locksmith",
                "bench",
                "--secs",
                "3",
                "redis://:hunter2@127.0.0.1:6379",
                "--markdown",
                "figures.md",
            ]
            .into_iter()
            .map(String::from),
        );
        assert_eq!(
            command,
            "locksmith bench --secs 3 redis://:***@127.0.0.1:6379 --markdown figures.md"
        );
        let f = Figures {
            uncontended_p50_us: 120.0,
            uncontended_p99_us: 300.0,
            handover_per_sec: 1000.0,
            holders: 4,
            ..Figures::default()
        };
        let at = |load: &str| Conditions {
            date: "2026-12-05 09:30 UTC".into(),
            load: Some(load.into()),
        };
        let md = markdown(
            &command,
            &at("1.50"),
            &at("2.25"),
            &cells(&[Row {
                label: "redis".into(),
                figures: f,
                once: None,
            }]),
        );
        assert!(md.contains(&format!("`{command}`")), "{md}");
        assert!(md.contains("2026-12-05 09:30 UTC"), "{md}");
        assert!(md.contains("1.50 at the start, 2.25 at the end"), "{md}");
        assert!(!md.contains("hunter2"), "{md}");
        let table: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(table.len(), 3, "header, alignment, one row: {md}");
        assert!(table[0].starts_with("| backend | p50 µs |"), "{md}");
        assert!(table[1].starts_with("|---|---:|"), "{md}");
        assert!(table[2].starts_with("| redis | 120.0 | 300.0 |"), "{md}");
    }
}
