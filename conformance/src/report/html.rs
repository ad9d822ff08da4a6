//! The report as one self-contained HTML page: inline CSS (`page.css`) and SVG charts, no
//! scripts, nothing fetched.

use std::fmt::Write as _;

use crate::escape::html_escape;
use crate::run::Status;

use super::charts::{Series, log_bar_chart};
use super::text::{
    CAPABILITY_ROWS, FIGURE_COLUMNS, FIGURES_LEGEND, PRIMITIVE_ROWS, capability_value, describe,
    figure_cells, fmt_ms, note_number, plural, primitive_value,
};
use super::{Report, count, find};

impl Report {
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
                    Some(r) if r.status == Status::Pass && r.observed.is_none() => {
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
                            reason =
                                esc(r.reason.as_deref().or(r.observed.as_deref()).unwrap_or("")),
                            label = status_html(r.status),
                            ms = if matches!(r.status, Status::Fail | Status::Pass) {
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
                "<h3>Results that did not pass, and figures measured</h3>\n<ol class=\"notes\">"
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
                    esc(&note.text())
                );
            }
            let _ = writeln!(w, "</ol>");
        }

        // Primitives, beside the scenario matrix.
        let _ = writeln!(
            w,
            "<h2>Primitives</h2>\n<p class=\"legend\">What each backend gives beyond the mutex, \
             and why not where it does not.</p>\n<div class=\"scroll\"><table class=\"caps\">\n\
             <thead><tr><th class=\"left\">primitive</th>"
        );
        for b in &self.backends {
            let _ = write!(w, "<th>{}</th>", esc(&b.label));
        }
        let _ = writeln!(w, "</tr></thead>\n<tbody>");
        for (row, what) in PRIMITIVE_ROWS {
            let _ = write!(
                w,
                "<tr><th class=\"left\" scope=\"row\">{}<div class=\"sum\">{}</div></th>",
                esc(row),
                esc(what)
            );
            for b in &self.backends {
                let v = b
                    .capabilities
                    .as_ref()
                    .map_or("?".to_string(), |c| primitive_value(c, row));
                let cls = if v == "yes" {
                    "yes"
                } else if v.starts_with("no") {
                    "no"
                } else {
                    "val"
                };
                let _ = write!(w, "<td class=\"{cls}\">{}</td>", esc(&v));
            }
            let _ = writeln!(w, "</tr>");
        }
        let _ = writeln!(w, "</tbody></table></div>");

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

        w.push_str(&super::compat_table::html(&self.backends));

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

    /// Horizontal bars of p50 and p99 per backend, on a linear axis in µs.
    pub(super) fn latency_svg(&self) -> String {
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
        log_bar_chart(
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
        log_bar_chart(
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

const STATUS_LEGEND_HTML: &str = "<span class=\"st pass\">pass</span> the contract held · \
     <span class=\"st fail\">FAIL</span> the backend broke the contract · \
     <span class=\"st unsupported\">unsupported</span> the backend does not declare what the \
     scenario needs: <b>not</b> a pass · <span class=\"st skipped\">skipped</span> not run. \
     Hover a cell for its reason; numbers link to the notes below.";

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

/// The page's style sheet, inlined into its `<head>`.
const CSS: &str = include_str!("page.css");
