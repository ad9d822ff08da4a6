//! The conformance report: results of every backend, as JSON, Markdown and a self-contained HTML
//! page (inline CSS and SVG, no scripts, no network).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockcore::Capabilities;
use serde::Serialize;

pub use crate::html::html_escape;
use crate::measure::Figures;
use crate::report_charts::Series;
use crate::run::{BackendReport, ScenarioResult, Status};
use crate::scenarios;

/// One scenario of the suite, as listed in the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ScenarioInfo {
    /// Its stable name.
    pub name: String,
    /// One line: what it proves.
    pub summary: String,
}

/// The version of the report's JSON layout; raised when a field changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 2;

/// Where a report comes from: the tool that made it and how it was built.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Provenance {
    /// The reporting tool and its version (`locksmith 0.1.0`).
    pub tool: String,
    /// The git commit of the source tree, when known (`-dirty` when it had local changes).
    pub git_commit: Option<String>,
    /// The build profile: `release`, or `debug` (whose figures are not representative).
    pub profile: String,
}

/// Results of the suite against several backends.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The JSON layout's version ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// When the report was made, in seconds since the Unix epoch.
    pub generated_unix: u64,
    /// The same moment, `YYYY-MM-DD HH:MM UTC`.
    pub generated: String,
    /// The tool, commit and build profile, when the caller gave them.
    pub provenance: Option<Provenance>,
    /// The suite's scenarios, in order.
    pub scenarios: Vec<ScenarioInfo>,
    /// One entry per backend, in the order given.
    pub backends: Vec<BackendReport>,
    /// The fault matrix, when the fault suite ran (see [`crate::faults`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults: Option<crate::faults::FaultMatrix>,
}

impl Report {
    /// A report of `backends`, dated now, listing the suite's scenarios.
    pub fn new(backends: Vec<BackendReport>) -> Self {
        let generated_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Report {
            schema_version: SCHEMA_VERSION,
            generated_unix,
            generated: utc_date(generated_unix),
            provenance: None,
            scenarios: scenarios::all()
                .iter()
                .map(|s| ScenarioInfo {
                    name: s.name.to_string(),
                    summary: s.summary.to_string(),
                })
                .collect(),
            backends,
            faults: None,
        }
    }

    /// The same report with its provenance (shown under the title; a debug build is flagged).
    pub fn with_provenance(mut self, provenance: Provenance) -> Self {
        self.provenance = Some(provenance);
        self
    }

    /// One line on where the report comes from, and a warning for a debug build.
    fn provenance_line(&self) -> (String, Option<&'static str>) {
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

    /// The same report with the fault matrix beside the scenario matrix.
    pub fn with_faults(mut self, faults: crate::faults::FaultMatrix) -> Self {
        self.faults = Some(faults);
        self
    }

    /// How many scenario results failed, over every backend (a backend that could not connect
    /// and has no results counts as one failure), plus the fault matrix's undocumented
    /// violations and errors. Unsupported and skipped are not failures, and not passes either.
    pub fn failed(&self) -> usize {
        let faults = self.faults.as_ref().map_or(0, |f| f.failed());
        faults
            + self
                .backends
                .iter()
                .map(|b| {
                    let fails = count(b, Status::Fail);
                    if fails == 0 && b.error.is_some() {
                        1
                    } else {
                        fails
                    }
                })
                .sum::<usize>()
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }

    /// The report as GitHub-flavoured Markdown: summary, scenario matrix with numbered notes for
    /// every result that did not pass, capabilities and figures.
    pub fn to_markdown(&self) -> String {
        let mut md = String::new();
        let w = &mut md;
        let _ = writeln!(w, "# locksmith conformance report\n");
        let _ = writeln!(
            w,
            "Generated {} · {} scenarios · {} backend{}\n",
            self.generated,
            self.scenarios.len(),
            self.backends.len(),
            plural(self.backends.len())
        );
        let (prov, warn) = self.provenance_line();
        if !prov.is_empty() {
            let _ = writeln!(w, "{}\n", md_cell(&prov));
        }
        if let Some(warn) = warn {
            let _ = writeln!(w, "> **Warning.** {warn}\n");
        }
        let _ = writeln!(w, "{STATUS_LEGEND_MD}\n");
        if self.backends.is_empty() {
            let _ = writeln!(w, "No backend was tested.");
            return md;
        }

        let _ = writeln!(w, "## Summary\n");
        let _ = writeln!(
            w,
            "| backend | description | pass | FAIL | unsupported | skipped |"
        );
        let _ = writeln!(w, "|---|---|---:|---:|---:|---:|");
        for b in &self.backends {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} |",
                md_cell(&b.label),
                md_cell(&describe(b)),
                count(b, Status::Pass),
                count(b, Status::Fail),
                count(b, Status::Unsupported),
                count(b, Status::Skipped),
            );
        }

        let _ = writeln!(w, "\n## Scenarios\n");
        let notes = self.notes();
        let _ = write!(w, "| scenario |");
        for b in &self.backends {
            let _ = write!(w, " {} |", md_cell(&b.label));
        }
        let _ = write!(w, "\n|---|");
        for _ in &self.backends {
            let _ = write!(w, ":---:|");
        }
        let _ = writeln!(w);
        for row in self.rows() {
            let _ = write!(w, "| `{}` |", md_code(&row.name));
            for (col, b) in self.backends.iter().enumerate() {
                let cell = match find(b, &row.name) {
                    None => "–".to_string(),
                    Some(r) if r.status == Status::Pass => "pass".to_string(),
                    Some(r) => {
                        let n = note_number(&notes, col, &r.scenario);
                        format!("{} [{n}]", status_md(r.status))
                    }
                };
                let _ = write!(w, " {cell} |");
            }
            let _ = writeln!(w);
        }
        if !notes.is_empty() {
            let _ = writeln!(w, "\nResults that did not pass:\n");
            for note in &notes {
                let _ = writeln!(
                    w,
                    "{}. {} · `{}`: {}: {}",
                    note.number,
                    md_cell(&self.backends[note.backend].label),
                    md_code(&note.result.scenario),
                    status_md(note.result.status),
                    md_cell(note.result.reason.as_deref().unwrap_or("(no reason given)"))
                );
            }
        }
        let _ = writeln!(w, "\nWhat each scenario proves:\n");
        for row in self.rows() {
            let _ = writeln!(w, "- `{}`: {}", md_code(&row.name), md_cell(&row.summary));
        }
        let errors: Vec<_> = self
            .backends
            .iter()
            .filter_map(|b| b.error.as_ref().map(|e| (b, e)))
            .collect();
        if !errors.is_empty() {
            let _ = writeln!(w, "\nBackends that could not connect:\n");
            for (b, e) in errors {
                let _ = writeln!(w, "- {}: {}", md_cell(&b.label), md_cell(e));
            }
        }

        let _ = writeln!(w, "\n## Capabilities\n");
        let _ = write!(w, "| capability |");
        for b in &self.backends {
            let _ = write!(w, " {} |", md_cell(&b.label));
        }
        let _ = write!(w, "\n|---|");
        for _ in &self.backends {
            let _ = write!(w, "---|");
        }
        let _ = writeln!(w);
        for (cap, what) in CAPABILITY_ROWS {
            let _ = write!(w, "| {cap} |");
            for b in &self.backends {
                let v = match &b.capabilities {
                    None => "?".to_string(),
                    Some(c) => capability_value(c, cap).join("; "),
                };
                let _ = write!(w, " {} |", md_cell(&v));
            }
            let _ = writeln!(w);
            let _ = what;
        }

        let _ = writeln!(w, "\n## Figures\n");
        let _ = writeln!(w, "{FIGURES_LEGEND}\n");
        let _ = writeln!(w, "| backend | {} |", FIGURE_COLUMNS.join(" | "));
        let _ = writeln!(w, "|---|{}", "---:|".repeat(FIGURE_COLUMNS.len()));
        for b in &self.backends {
            match &b.figures {
                Some(f) => {
                    let _ = writeln!(
                        w,
                        "| {} | {} |",
                        md_cell(&b.label),
                        figure_cells(f).join(" | ")
                    );
                }
                None => {
                    let _ = writeln!(
                        w,
                        "| {} | not measured |{}",
                        md_cell(&b.label),
                        " |".repeat(FIGURE_COLUMNS.len() - 1)
                    );
                }
            }
        }
        if let Some(f) = &self.faults {
            md.push_str(&f.to_markdown());
        }
        md
    }

    /// The report as one self-contained HTML page: inline CSS, an inline SVG chart, no scripts,
    /// no fonts or anything else fetched. Every string from the results is HTML-escaped.
    pub fn to_html(&self) -> String {
        let mut h = String::with_capacity(32 * 1024);
        let w = &mut h;
        let _ = write!(
            w,
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>locksmith conformance report</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        );
        let _ = writeln!(w, "<header><h1>locksmith conformance report</h1>");
        let _ = writeln!(
            w,
            "<p class=\"meta\">Generated {} · {} scenarios · {} backend{} · {} failed</p>",
            esc(&self.generated),
            self.scenarios.len(),
            self.backends.len(),
            plural(self.backends.len()),
            self.failed()
        );
        let (prov, warn) = self.provenance_line();
        if !prov.is_empty() {
            let _ = writeln!(w, "<p class=\"meta\">{}</p>", esc(&prov));
        }
        if let Some(warn) = warn {
            let _ = writeln!(
                w,
                "<p class=\"warn\"><b>Warning.</b> {}</p>",
                esc(warn).replace("`", "")
            );
        }
        let _ = writeln!(w, "</header>");
        if self.backends.is_empty() {
            let _ = writeln!(w, "<p>No backend was tested.</p>\n</body>\n</html>");
            return h;
        }

        // Summary cards: "passed" out of every scenario row, so that results missing from a
        // backend do not make it look complete.
        let total_rows = self.rows().len();
        let _ = writeln!(w, "<section class=\"cards\">");
        for b in &self.backends {
            let (pass, fail, unsup, skip) = (
                count(b, Status::Pass),
                count(b, Status::Fail),
                count(b, Status::Unsupported),
                count(b, Status::Skipped),
            );
            let verdict = if fail > 0 || b.error.is_some() {
                "bad"
            } else {
                "good"
            };
            let _ = writeln!(
                w,
                "<div class=\"card {verdict}\"><div class=\"label\">{}</div>\
                 <div class=\"desc\">{}</div>\
                 <div class=\"big\">{pass}<span>/{}</span> passed</div><div class=\"counts\">\
                 <span class=\"st {}\">{fail} FAIL</span> \
                 <span class=\"st {}\">{unsup} unsupported</span> \
                 <span class=\"st {}\">{skip} skipped</span></div>{}</div>",
                esc(&b.label),
                esc(&describe(b)),
                total_rows.max(b.results.len()),
                if fail > 0 { "fail" } else { "zero" },
                if unsup > 0 { "unsupported" } else { "zero" },
                if skip > 0 { "skipped" } else { "zero" },
                b.error
                    .as_ref()
                    .map(|e| format!("<div class=\"err\">could not connect: {}</div>", esc(e)))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(w, "</section>");

        // Matrix.
        let notes = self.notes();
        let _ = writeln!(
            w,
            "<h2>Scenarios</h2>\n<p class=\"legend\">{STATUS_LEGEND_HTML}</p>"
        );
        let _ = writeln!(
            w,
            "<div class=\"scroll\"><table class=\"matrix\">\n<thead><tr><th class=\"left\">scenario</th>"
        );
        for b in &self.backends {
            let _ = write!(w, "<th>{}</th>", esc(&b.label));
        }
        let _ = writeln!(w, "</tr></thead>\n<tbody>");
        for row in self.rows() {
            let _ = write!(
                w,
                "<tr><th class=\"left\" scope=\"row\"><code>{}</code><div class=\"sum\">{}</div></th>",
                esc(&row.name),
                esc(&row.summary)
            );
            for (col, b) in self.backends.iter().enumerate() {
                match find(b, &row.name) {
                    None => {
                        let _ = write!(w, "<td class=\"st none\" title=\"not run\">–</td>");
                    }
                    Some(r) if r.status == Status::Pass => {
                        let _ = write!(
                            w,
                            "<td class=\"st pass\">pass<small>{}</small></td>",
                            fmt_ms(r.millis)
                        );
                    }
                    Some(r) => {
                        let n = note_number(&notes, col, &r.scenario);
                        let _ = write!(
                            w,
                            "<td class=\"st {cls}\" title=\"{reason}\">{label} \
                             <a href=\"#note-{n}\">[{n}]</a>{ms}</td>",
                            cls = r.status.as_str(),
                            reason = esc(r.reason.as_deref().unwrap_or("")),
                            label = status_html(r.status),
                            ms = if r.status == Status::Fail {
                                format!("<small>{}</small>", fmt_ms(r.millis))
                            } else {
                                String::new()
                            }
                        );
                    }
                }
            }
            let _ = writeln!(w, "</tr>");
        }
        let _ = writeln!(w, "</tbody></table></div>");
        if !notes.is_empty() {
            let _ = writeln!(
                w,
                "<h3>Results that did not pass</h3>\n<ol class=\"notes\">"
            );
            for note in &notes {
                let _ = writeln!(
                    w,
                    "<li id=\"note-{}\" value=\"{}\"><span class=\"st {}\">{}</span> \
                     <b>{}</b> · <code>{}</code><div class=\"reason\">{}</div></li>",
                    note.number,
                    note.number,
                    note.result.status.as_str(),
                    status_html(note.result.status),
                    esc(&self.backends[note.backend].label),
                    esc(&note.result.scenario),
                    esc(note.result.reason.as_deref().unwrap_or("(no reason given)"))
                );
            }
            let _ = writeln!(w, "</ol>");
        }

        // Capabilities.
        let _ = writeln!(
            w,
            "<h2>Capabilities</h2>\n<p class=\"legend\">As each backend declares them; \
             the scenarios check the declarations.</p>\n<div class=\"scroll\"><table class=\"caps\">\n\
             <thead><tr><th class=\"left\">capability</th>"
        );
        for b in &self.backends {
            let _ = write!(w, "<th>{}</th>", esc(&b.label));
        }
        let _ = writeln!(w, "</tr></thead>\n<tbody>");
        for (cap, what) in CAPABILITY_ROWS {
            let _ = write!(
                w,
                "<tr><th class=\"left\" scope=\"row\"><code>{cap}</code><div class=\"sum\">{}</div></th>",
                esc(what)
            );
            for b in &self.backends {
                let cell = match &b.capabilities {
                    None => "<td class=\"unknown\">?</td>".to_string(),
                    Some(c) => {
                        let vals = capability_value(c, cap);
                        if cap == "notes" {
                            if vals.is_empty() {
                                "<td class=\"notes\">–</td>".to_string()
                            } else {
                                let items: String = vals
                                    .iter()
                                    .map(|v| format!("<li>{}</li>", esc(v)))
                                    .collect();
                                format!("<td class=\"notes\"><ul>{items}</ul></td>")
                            }
                        } else {
                            let v = vals.join("; ");
                            let cls = match v.as_str() {
                                "yes" => "yes",
                                "no" => "no",
                                _ => "val",
                            };
                            format!("<td class=\"{cls}\">{}</td>", esc(&v))
                        }
                    }
                };
                let _ = write!(w, "{cell}");
            }
            let _ = writeln!(w, "</tr>");
        }
        let _ = writeln!(w, "</tbody></table></div>");

        // Figures.
        let _ = writeln!(
            w,
            "<h2>Figures</h2>\n<p class=\"legend\">{}</p>",
            esc(FIGURES_LEGEND).replace('`', "")
        );
        let _ = write!(
            w,
            "<div class=\"scroll\"><table class=\"figs\"><thead><tr><th class=\"left\">backend</th>"
        );
        for c in FIGURE_COLUMNS {
            let _ = write!(w, "<th>{}</th>", esc(c));
        }
        let _ = writeln!(w, "</tr></thead><tbody>");
        for b in &self.backends {
            match &b.figures {
                Some(f) => {
                    let cells: String = figure_cells(f)
                        .iter()
                        .map(|c| format!("<td>{}</td>", esc(c)))
                        .collect();
                    let _ = writeln!(
                        w,
                        "<tr><th class=\"left\">{}</th>{cells}</tr>",
                        esc(&b.label)
                    );
                }
                None => {
                    let _ = writeln!(
                        w,
                        "<tr><th class=\"left\">{}</th><td colspan=\"{}\" class=\"unknown\">not measured</td></tr>",
                        esc(&b.label),
                        FIGURE_COLUMNS.len()
                    );
                }
            }
        }
        let _ = writeln!(w, "</tbody></table></div>");
        let _ = writeln!(w, "{}", self.handover_svg());
        let _ = writeln!(w, "{}", self.latency_svg());
        if let Some(f) = &self.faults {
            let _ = writeln!(w, "{}", f.to_html());
        }
        let _ = writeln!(w, "</body>\n</html>");
        h
    }

    /// Writes `report.json`, `report.md` and `report.html` into `dir` (created if missing) and
    /// returns their paths in that order.
    ///
    /// # Errors
    /// Any I/O error creating the directory or writing a file.
    pub fn write_to(&self, dir: &Path) -> std::io::Result<[PathBuf; 3]> {
        std::fs::create_dir_all(dir)?;
        let paths = [
            dir.join("report.json"),
            dir.join("report.md"),
            dir.join("report.html"),
        ];
        std::fs::write(&paths[0], self.to_json())?;
        std::fs::write(&paths[1], self.to_markdown())?;
        std::fs::write(&paths[2], self.to_html())?;
        Ok(paths)
    }

    /// The matrix rows: the suite's scenarios, then any result not among them.
    fn rows(&self) -> Vec<ScenarioInfo> {
        let mut rows = self.scenarios.clone();
        for b in &self.backends {
            for r in &b.results {
                if !rows.iter().any(|s| s.name == r.scenario) {
                    rows.push(ScenarioInfo {
                        name: r.scenario.clone(),
                        summary: String::new(),
                    });
                }
            }
        }
        rows
    }

    /// Every result that did not pass, numbered in matrix order (row by row).
    fn notes(&self) -> Vec<Note<'_>> {
        let mut notes = Vec::new();
        for row in self.rows() {
            for (col, b) in self.backends.iter().enumerate() {
                if let Some(r) = find(b, &row.name)
                    && r.status != Status::Pass
                {
                    notes.push(Note {
                        number: notes.len() + 1,
                        backend: col,
                        result: r,
                    });
                }
            }
        }
        notes
    }

    /// Horizontal bars of p50 and p99 per backend, on a linear axis in µs.
    fn latency_svg(&self) -> String {
        if self.backends.iter().all(|b| b.figures.is_none()) {
            return "<p class=\"unknown\">No latency figures were measured (run without \
                    <code>--no-bench</code> to get them).</p>"
                .to_string();
        }
        let rows: Vec<_> = self
            .backends
            .iter()
            .map(|b| {
                let vals = b.figures.as_ref().map(|f| {
                    vec![
                        Some(f.uncontended_p50_us),
                        Some(f.uncontended_p99_us),
                        f.bare_cycle_p50_us,
                    ]
                });
                (b.label.clone(), vals)
            })
            .collect();
        crate::report_charts::log_bar_chart(
            "Uncontended try_lock + release latency",
            "µs",
            &[
                Series {
                    class: "p50",
                    label: "p50",
                },
                Series {
                    class: "p99",
                    label: "p99",
                },
                Series {
                    class: "bare",
                    label: "bare p50",
                },
            ],
            &rows,
        )
    }

    /// Hand-over rates (tasks in one process, separate processes) on a log axis.
    fn handover_svg(&self) -> String {
        let rows: Vec<_> = self
            .backends
            .iter()
            .map(|b| {
                let vals = b.figures.as_ref().map(|f| {
                    vec![
                        Some(f.handover_per_sec),
                        f.processes.as_ref().map(|p| p.handover_per_sec),
                    ]
                });
                (b.label.clone(), vals)
            })
            .collect();
        crate::report_charts::log_bar_chart(
            "Hand-over rate, one lock, 4 contenders",
            "hand-overs per second",
            &[
                Series {
                    class: "tasks",
                    label: "tasks",
                },
                Series {
                    class: "procs",
                    label: "processes",
                },
            ],
            &rows,
        )
    }
}

/// A numbered note on a result that did not pass.
struct Note<'a> {
    number: usize,
    backend: usize,
    result: &'a ScenarioResult,
}

fn note_number(notes: &[Note<'_>], backend: usize, scenario: &str) -> usize {
    notes
        .iter()
        .find(|n| n.backend == backend && n.result.scenario == scenario)
        .map(|n| n.number)
        .unwrap_or(0)
}

fn find<'a>(b: &'a BackendReport, scenario: &str) -> Option<&'a ScenarioResult> {
    b.results.iter().find(|r| r.scenario == scenario)
}

fn count(b: &BackendReport, status: Status) -> usize {
    b.results.iter().filter(|r| r.status == status).count()
}

fn describe(b: &BackendReport) -> String {
    if b.backend.is_empty() {
        "(not connected)".to_string()
    } else if let Some(version) = &b.server_version {
        format!("{} · server {version}", b.backend)
    } else {
        b.backend.clone()
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The capability rows: field name and what it means.
const CAPABILITY_ROWS: [(&str, &str); 14] = [
    ("fencing", "guards carry strictly increasing fencing tokens"),
    ("fair", "waiters served first come, first served"),
    ("wait", "how lock() learns the lock is free"),
    ("renew", "native: session-bound; emulated: TTL + watchdog"),
    ("lost_detection", "the backend itself reports lost leases"),
    (
        "revoke_detection",
        "it also notices a lock deleted behind its holder by itself",
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
    ("min_ttl", "smallest TTL accepted"),
    ("max_ttl", "largest TTL accepted"),
    ("notes", "caveats of this backend's guarantees"),
];

fn capability_value(c: &Capabilities, cap: &str) -> Vec<String> {
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
        "extend_sets_ttl" => yn(c.extend_sets_ttl),
        "reentrant" => yn(c.reentrant),
        "expiry_after_ttl" => yn(c.expiry_after_ttl),
        "force_release" => yn(c.force_release),
        "inspect" => yn(c.inspect),
        "min_ttl" => vec![fmt_duration(c.min_ttl)],
        "max_ttl" => vec![fmt_duration(c.max_ttl)],
        "notes" => c.notes.clone(),
        _ => vec!["?".to_string()],
    }
}

const STATUS_LEGEND_MD: &str = "Statuses: **pass**; **FAIL** (the backend broke the contract); \
     **unsupported** (the backend does not declare the capability the scenario needs: not a pass); \
     **skipped** (not run, e.g. no server URL).";

const STATUS_LEGEND_HTML: &str = "<span class=\"st pass\">pass</span> the contract held · \
     <span class=\"st fail\">FAIL</span> the backend broke the contract · \
     <span class=\"st unsupported\">unsupported</span> the backend does not declare what the \
     scenario needs: <b>not</b> a pass · <span class=\"st skipped\">skipped</span> not run. \
     Hover a cell for its reason; numbers link to the notes below.";

fn status_md(s: Status) -> &'static str {
    match s {
        Status::Pass => "pass",
        Status::Fail => "**FAIL**",
        Status::Unsupported => "unsupported",
        Status::Skipped => "skipped",
    }
}

fn status_html(s: Status) -> &'static str {
    match s {
        Status::Pass => "pass",
        Status::Fail => "FAIL",
        Status::Unsupported => "unsupported",
        Status::Skipped => "skipped",
    }
}

fn esc(s: &str) -> String {
    html_escape(s)
}

/// Text safe inside a Markdown table cell: one line, pipes escaped, HTML tags neutralised.
fn md_cell(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace(['\r', '\n'], " ")
}

/// Text safe inside a backtick code span in a table.
fn md_code(s: &str) -> String {
    s.replace('`', "'")
        .replace('|', "\\|")
        .replace(['\r', '\n'], " ")
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

fn fmt_ms(ms: u64) -> String {
    if ms >= 10_000 {
        format!("{:.0} s", ms as f64 / 1000.0)
    } else {
        format!("{ms} ms")
    }
}

fn fmt_duration(d: Duration) -> String {
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

/// `YYYY-MM-DD HH:MM UTC` of a Unix time (from the `time` crate's calendar).
fn utc_date(unix: u64) -> String {
    let Ok(t) = i64::try_from(unix)
        .map_err(drop)
        .and_then(|u| time::OffsetDateTime::from_unix_timestamp(u).map_err(drop))
    else {
        return format!("unix time {unix}");
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute()
    )
}

/// What the figures columns mean.
const FIGURES_LEGEND: &str = "Uncontended: `try_lock` + `release` by one client, one after the other. \
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
const FIGURE_COLUMNS: [&str; 12] = [
    "uncontended p50 (µs)",
    "uncontended p99 (µs)",
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
fn figure_cells(f: &Figures) -> Vec<String> {
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
            Some(v) => format!("{v:.1} ({} waiters / {} processes)", r.waiters, r.processes),
            None => "unsupported".into(),
        },
        None => "-".into(),
    };
    vec![
        fmt_us(f.uncontended_p50_us),
        fmt_us(f.uncontended_p99_us),
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

const CSS: &str = r#"
:root { --fg:#1b1f24; --muted:#5b6570; --line:#d8dee4; --bg:#ffffff; --head:#f3f5f7;
  --pass:#1a7f37; --pass-bg:#dafbe1; --fail:#b3261e; --fail-bg:#ffe1de;
  --uns:#7a5c00; --uns-bg:#fff4cc; --skip:#57606a; --skip-bg:#eef1f4; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1680px; padding: 24px 28px 48px; color: var(--fg); background: var(--bg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 32px 0 6px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 16px; margin: 20px 0 6px; }
code { font: 12.5px/1.3 ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace; }
.meta, .legend { color: var(--muted); margin: 4px 0 10px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin-top: 16px; }
.card { border: 1px solid var(--line); border-left: 6px solid var(--pass); border-radius: 6px;
  padding: 10px 14px; min-width: 220px; max-width: 380px; background: #fbfcfd; }
.card.bad { border-left-color: var(--fail); }
.card .label { font-weight: 700; font-size: 16px; }
.card .desc { color: var(--muted); font-size: 12.5px; word-break: break-all; }
.card .big { font-size: 22px; font-weight: 700; margin: 6px 0 4px; }
.card .big span { color: var(--muted); font-weight: 400; }
.card .err { color: var(--fail); margin-top: 6px; font-size: 12.5px; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid var(--line); padding: 5px 10px; vertical-align: middle; }
thead th { background: var(--head); position: sticky; top: 0; font-weight: 600; }
th.left { text-align: left; font-weight: 400; }
thead th.left { font-weight: 600; }
.matrix td, .caps td { text-align: center; min-width: 110px; }
.sum { color: var(--muted); font-size: 12px; }
.st { font-weight: 600; white-space: nowrap; }
span.st { display: inline-block; padding: 0 6px; border-radius: 4px; font-size: 12px; }
.st.pass { color: var(--pass); background: var(--pass-bg); }
.st.fail { color: var(--fail); background: var(--fail-bg); }
.st.unsupported { color: var(--uns); background: var(--uns-bg); }
.st.skipped, .st.none { color: var(--skip); background: var(--skip-bg); font-weight: 400; }
.st.zero { color: var(--muted); background: transparent; border: 1px solid var(--line); font-weight: 400; }
td.st small { display: block; font-weight: 400; color: var(--muted); font-size: 11px; }
td.st a { color: inherit; font-weight: 400; font-size: 12px; }
.notes { padding-left: 28px; }
.notes li { margin: 6px 0; }
.notes .reason { font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  white-space: pre-wrap; word-break: break-word; color: #333; background: #f6f8fa; padding: 4px 8px;
  border-radius: 4px; margin-top: 2px; }
td.yes { color: var(--pass); font-weight: 600; }
td.no { color: var(--muted); }
td.val { font-variant-numeric: tabular-nums; }
td.notes { text-align: left; vertical-align: top; font-size: 12px; min-width: 180px; max-width: 360px; }
td.notes ul { margin: 0; padding-left: 16px; }
td.notes ul { margin: 0; padding-left: 16px; }
.unknown { color: var(--muted); font-style: italic; }
.figs td { text-align: right; font-variant-numeric: tabular-nums; }
.chart { margin: 16px 0 0; }
.chart svg { max-width: 100%; height: auto; font-family: system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; }
.chart .title { font-size: 13px; font-weight: 600; fill: var(--fg); }
.chart .key, .chart .val { font-size: 11.5px; fill: var(--fg); }
.chart .name { font-size: 12.5px; text-anchor: end; fill: var(--fg); }
.chart .tick { font-size: 11px; text-anchor: middle; fill: var(--muted); }
.chart .axislabel { font-size: 12px; text-anchor: middle; fill: var(--muted); }
.chart .missing { font-size: 12px; font-style: italic; fill: var(--muted); }
.chart .grid { stroke: #e6e9ec; stroke-width: 1; }
.chart .axis { stroke: #8c959f; stroke-width: 1; }
.chart .p50 { fill: #4a90d9; }
.chart .p99 { fill: #e8833a; }
.chart .bare { fill: #9aa5b1; }
.chart .tasks { fill: #2e9e6b; }
.chart .procs { fill: #8a5cc7; }
.warn { color: #7a5c00; background: #fff4cc; border: 1px solid #e8d48a; border-radius: 4px; padding: 6px 10px; }
@media print { thead th { position: static; } }
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Figures;

    fn result(name: &str, status: Status, reason: Option<&str>) -> ScenarioResult {
        ScenarioResult {
            scenario: name.to_string(),
            status,
            reason: reason.map(str::to_string),
            millis: 12,
        }
    }

    fn backend(
        label: &str,
        results: Vec<ScenarioResult>,
        figures: Option<Figures>,
    ) -> BackendReport {
        let mut caps = Capabilities::default();
        caps.fencing = true;
        caps.notes = vec!["caveat <b>bold</b> & \"quoted\"".to_string()];
        BackendReport {
            label: label.to_string(),
            backend: format!("{label}://host (password redacted)"),
            server_version: (label == "memory").then(|| "memory 7.0.15".to_string()),
            capabilities: Some(caps),
            results,
            figures,
            error: None,
        }
    }

    fn figures(p50: f64, p99: f64) -> Figures {
        Figures {
            uncontended_p50_us: p50,
            uncontended_p99_us: p99,
            round_trip_p50_us: Some(p50 / 2.5),
            samples: 2000,
            handover_per_sec: 1234.5,
            holders: 4,
            contended_secs: 2.0,
            ..Figures::default()
        }
    }

    /// A fake three-backend report with every status, hostile strings and missing figures.
    pub(crate) fn fake_report() -> Report {
        let hostile = "expected <Timeout> got \"Ok\" for name '; DROP TABLE locks; -- & <script>alert(1)</script>";
        let mut report = Report::new(vec![
            backend(
                "memory",
                vec![
                    result("acquire_release_reacquire", Status::Pass, None),
                    result("fencing_tokens_increase", Status::Pass, None),
                    result("fifo_fairness", Status::Pass, None),
                ],
                Some(figures(8.5, 41.0)),
            ),
            backend(
                "redis<x>",
                vec![
                    result("acquire_release_reacquire", Status::Fail, Some(hostile)),
                    result(
                        "fencing_tokens_increase",
                        Status::Unsupported,
                        Some("the backend declares no fencing tokens"),
                    ),
                    result("fifo_fairness", Status::Skipped, Some("no server URL")),
                ],
                Some(figures(310.0, 1520.0)),
            ),
            backend(
                "zk",
                vec![result("acquire_release_reacquire", Status::Pass, None)],
                None,
            ),
        ]);
        report.scenarios = vec![
            ScenarioInfo {
                name: "acquire_release_reacquire".into(),
                summary: "a lock can be taken <again>".into(),
            },
            ScenarioInfo {
                name: "fencing_tokens_increase".into(),
                summary: "tokens increase".into(),
            },
            ScenarioInfo {
                name: "fifo_fairness".into(),
                summary: "FIFO".into(),
            },
        ];
        report
    }

    /// Each backend's server version shows beside it and in the provenance line (escaped).
    #[test]
    fn server_versions_show_in_provenance_and_per_backend() {
        let report = fake_report().with_provenance(Provenance {
            tool: "locksmith 0.1.0".into(),
            git_commit: Some("abc".into()),
            profile: "release".into(),
        });
        let html = report.to_html();
        assert!(html.contains("servers: memory: memory 7.0.15"), "{html}");
        assert!(html.contains("· server memory 7.0.15"));
        let md = report.to_markdown();
        assert!(md.contains("servers: memory: memory 7.0.15"), "{md}");
    }

    #[test]
    fn html_escapes_every_string() {
        let html = fake_report().to_html();
        assert!(!html.contains("<script>"), "a reason injected a tag");
        assert!(
            !html.contains("<b>bold"),
            "a capability note injected a tag"
        );
        assert!(!html.contains("redis<x>"));
        assert!(!html.contains("<again>"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("&#39;; DROP TABLE locks; -- &amp;"));
        assert!(html.contains("got &quot;Ok&quot;"));
        assert!(html.contains("redis&lt;x&gt;"));
        // No script, no external resource.
        assert!(!html.contains("<script"));
        // The only URLs are the inline SVGs' namespace (nothing is fetched).
        assert_eq!(
            html.matches("http://").count(),
            html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count()
        );
        assert!(!html.contains("https://"));
        assert!(!html.contains("@import") && !html.contains("url("));
    }

    #[test]
    fn escape_function() {
        assert_eq!(
            html_escape(r#"<a href="x" onclick='y'>&</a>"#),
            "&lt;a href=&quot;x&quot; onclick=&#39;y&#39;&gt;&amp;&lt;/a&gt;"
        );
        assert_eq!(html_escape("plain µs"), "plain µs");
    }

    #[test]
    fn unsupported_is_never_rendered_as_pass() {
        let report = fake_report();
        let html = report.to_html();
        let md = report.to_markdown();
        // The unsupported cell is labelled unsupported and carries its reason.
        assert!(html.contains(
            "<td class=\"st unsupported\" title=\"the backend declares no fencing tokens\">unsupported"
        ));
        // The fencing row of redis in Markdown says unsupported, not pass.
        let row = md
            .lines()
            .find(|l| l.starts_with("| `fencing_tokens_increase`"))
            .unwrap();
        let cells: Vec<_> = row.split(" | ").collect();
        assert_eq!(cells[1], "pass");
        assert!(cells[2].starts_with("unsupported ["), "{row}");
        // Counts: redis has no pass at all.
        assert!(html.contains("0<span>/3</span> passed"));
        assert!(md.contains(
            "| redis&lt;x&gt; | redis&lt;x&gt;://host (password redacted) | 0 | 1 | 1 | 1 |"
        ));
        // Pass cells only for pass results: 4 passes in the fake report.
        assert_eq!(html.matches("<td class=\"st pass\">").count(), 4);
        assert_eq!(report.failed(), 1);
    }

    #[test]
    fn markdown_notes_and_escaping() {
        let md = fake_report().to_markdown();
        assert!(md.contains(
            "1. redis&lt;x&gt; · `acquire_release_reacquire`: **FAIL**: expected &lt;Timeout&gt;"
        ));
        assert!(md.contains("not measured"));
        // Every table row of the matrix has one cell per backend.
        let row = md
            .lines()
            .find(|l| l.starts_with("| `fifo_fairness`"))
            .unwrap();
        assert_eq!(row.matches(" |").count(), 4, "{row}");
        assert!(
            md.contains("| `fifo_fairness` | pass | skipped [3] | – |"),
            "{md}"
        );
    }

    #[test]
    fn json_round_trips_statuses() {
        let json = fake_report().to_json();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["backends"][1]["results"][1]["status"], "unsupported");
        assert_eq!(v["scenarios"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn chart_handles_zero_one_many_and_missing() {
        let mut r = fake_report();
        let many = r.latency_svg();
        assert!(many.starts_with("<figure"));
        assert!(many.contains("not measured"));
        assert!(many.contains("µs, log scale"));
        // The longest bar is within the plot.
        assert!(many.contains("p99 1520"));
        r.backends.truncate(1);
        assert!(r.latency_svg().contains("p50 8.50"));
        r.backends[0].figures = Some(figures(0.0, 0.0));
        // A zero has no place on a log axis: shown as not measured, never as NaN.
        let zero = r.latency_svg();
        assert!(
            zero.contains("nothing was measured") && !zero.contains("NaN"),
            "{zero}"
        );
        r.backends[0].figures = None;
        assert!(r.latency_svg().contains("No latency figures"));
        r.backends.clear();
        assert!(r.to_html().contains("No backend was tested"));
        assert!(r.to_markdown().contains("No backend was tested"));
        assert_eq!(r.failed(), 0);
    }

    #[test]
    fn helpers() {
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_date(1_700_000_000), "2023-11-14 22:13 UTC");
        assert_eq!(utc_date(u64::MAX), format!("unix time {}", u64::MAX));
        assert_eq!(fmt_duration(Duration::from_millis(1)), "1 ms");
        assert_eq!(fmt_duration(Duration::from_secs(7 * 86400)), "7 days");
        assert_eq!(md_cell("a|b\nc"), "a\\|b c");
    }

    /// The three files are written, and a failure and an unsupported result reach the page.
    #[test]
    fn writes_the_three_files() {
        let dir = std::env::temp_dir().join(format!("locksmith-report-{}", std::process::id()));
        let paths = fake_report().write_to(&dir).unwrap();
        for p in &paths {
            assert!(std::fs::metadata(p).unwrap().len() > 0, "{p:?} is empty");
        }
        let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
        assert!(html.contains("FAIL") && html.contains("unsupported"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
