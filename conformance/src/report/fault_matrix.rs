//! The fault matrix's report sections: `## Faults` in Markdown and its HTML counterpart.

use std::fmt::Write as _;

use crate::escape::html_escape as esc;
use crate::faults::{FaultCell, FaultMatrix, FaultOutcome};

impl FaultMatrix {
    /// The Markdown section (`## Faults`).
    pub fn to_markdown(&self) -> String {
        let mut md = String::new();
        let w = &mut md;
        let _ = writeln!(w, "\n## Faults\n");
        let _ = writeln!(
            w,
            "Each cell: what the backend did under the fault, on real servers started for the run. \
             **holds**: the contract held. **VIOLATION**: it broke (counts below); *documented* \
             when the backend's documentation states it, otherwise a defect. **n/a**: the fault \
             does not apply (reason below). Times in ms: detect = fault until the holder's lost \
             signal; next = fault until another client held the lock; margin = first moment \
             another client could win minus the lost signal (negative: the holder learned too \
             late).\n"
        );
        let _ = write!(w, "| fault |");
        for b in &self.backends {
            let _ = write!(w, " {} |", md_cell(b));
        }
        let _ = writeln!(w);
        let _ = write!(w, "|---|");
        for _ in &self.backends {
            let _ = write!(w, "---|");
        }
        let _ = writeln!(w);
        let mut notes = Vec::new();
        for f in &self.faults {
            let _ = write!(w, "| `{}` |", f.name);
            for b in &self.backends {
                match self.cell(b, &f.name) {
                    Some(c) => {
                        notes.push(c);
                        let _ = write!(w, " {} [{}] |", label_md(c), notes.len());
                    }
                    None => {
                        let _ = write!(w, " - |");
                    }
                }
            }
            let _ = writeln!(w);
        }
        let _ = writeln!(
            w,
            "\n### Fault times\n\nEvery cell that ran (ms; `-`: not measured for that fault). \
             detect: fault until the holder's lost signal; next holder: fault until another \
             client held the lock; margin: first moment another client could win minus the \
             holder's lost signal (negative: another client won before the holder knew).\n"
        );
        let _ = writeln!(
            w,
            "| backend | fault | outcome | counts | detect (ms) | next holder (ms) | margin (ms) |"
        );
        let _ = writeln!(w, "|---|---|---|---|---:|---:|---:|");
        for c in self.timed() {
            let [d, n, m] = times(c);
            let _ = writeln!(
                w,
                "| {} | `{}` | {} | {} | {d} | {n} | {m} |",
                md_cell(&c.backend),
                c.fault,
                label_md(c),
                md_cell(&counts(c))
            );
        }
        let _ = writeln!(w, "\nFaults:\n");
        for f in &self.faults {
            let _ = writeln!(w, "- `{}`: {}", f.name, md_cell(&f.summary));
        }
        let _ = writeln!(w, "\nCells:\n");
        for (i, c) in notes.iter().enumerate() {
            let _ = writeln!(
                w,
                "{}. {} / `{}`: {}{}{}",
                i + 1,
                md_cell(&c.backend),
                c.fault,
                label_md(c),
                details(c).map(|d| format!(" ({d})")).unwrap_or_default(),
                if c.note.is_empty() {
                    String::new()
                } else {
                    format!(": {}", md_cell(&c.note))
                }
            );
        }
        md
    }

    /// The HTML section (`<h2>Faults</h2>` and a matrix table), every string escaped.
    pub fn to_html(&self) -> String {
        let mut h = String::new();
        let w = &mut h;
        let _ = writeln!(
            w,
            "<h2>Faults</h2>\n<p class=\"legend\">What each backend did under each fault on real \
             servers: <span class=\"st pass\">holds</span> the contract held · \
             <span class=\"st fail\">VIOLATION</span> it broke (counts; <em>documented</em> when \
             the backend's docs state it, otherwise a defect) · \
             <span class=\"st skipped\">n/a</span> does not apply. detect: fault until the \
             holder's lost signal; next: fault until another client held the lock; margin: first \
             moment another client could win minus the lost signal (ms).</p>"
        );
        let _ = write!(
            w,
            "<div class=\"scroll\"><table class=\"matrix faults\">\n<thead><tr><th class=\"left\">fault</th>"
        );
        for b in &self.backends {
            let _ = write!(w, "<th>{}</th>", esc(b));
        }
        let _ = writeln!(w, "</tr></thead><tbody>");
        for f in &self.faults {
            let _ = write!(
                w,
                "<tr><th class=\"left\"><code>{}</code><br><span class=\"sum\">{}</span></th>",
                esc(&f.name),
                esc(&f.summary)
            );
            for b in &self.backends {
                match self.cell(b, &f.name) {
                    Some(c) => {
                        let class = class_of(c);
                        let _ = write!(
                            w,
                            "<td class=\"st {class}\" title=\"{}\">{}{}<small>{}</small></td>",
                            esc(&c.note),
                            esc(&label_plain(c)),
                            details(c)
                                .map(|d| format!("<small>{}</small>", esc(&d)))
                                .unwrap_or_default(),
                            esc(&c.note)
                        );
                    }
                    None => {
                        let _ = write!(w, "<td class=\"st none\">-</td>");
                    }
                }
            }
            let _ = writeln!(w, "</tr>");
        }
        let _ = writeln!(w, "</tbody></table></div>");
        let _ = writeln!(
            w,
            "<h3>Fault times</h3>\n<p class=\"legend\">Every cell that ran, in ms (-: not \
             measured for that fault). margin: first moment another client could win minus the \
             holder's lost signal (negative: another client won before the holder knew).</p>\n\
             <div class=\"scroll\"><table class=\"fault-times\">\n<thead><tr>\
             <th class=\"left\">backend</th><th class=\"left\">fault</th><th>outcome</th>\
             <th class=\"left\">counts</th><th>detect (ms)</th><th>next holder (ms)</th>\
             <th>margin (ms)</th></tr></thead><tbody>"
        );
        for c in self.timed() {
            let [d, n, m] = times(c);
            let _ = writeln!(
                w,
                "<tr><td class=\"left\">{}</td><td class=\"left\"><code>{}</code></td>\
                 <td class=\"st {}\">{}</td><td class=\"left\">{}</td><td class=\"num\">{d}</td>\
                 <td class=\"num\">{n}</td><td class=\"num\">{m}</td></tr>",
                esc(&c.backend),
                esc(&c.fault),
                class_of(c),
                esc(&label_plain(c)),
                esc(&counts(c))
            );
        }
        let _ = writeln!(w, "</tbody></table></div>");
        h
    }

    /// The cells that ran (not n/a), in matrix order: fault by fault, backend by backend.
    fn timed(&self) -> Vec<&FaultCell> {
        let mut out = Vec::new();
        for b in &self.backends {
            for f in &self.faults {
                if let Some(c) = self.cell(b, &f.name)
                    && c.outcome != FaultOutcome::NotApplicable
                {
                    out.push(c);
                }
            }
        }
        out
    }
}

fn class_of(c: &FaultCell) -> &'static str {
    match c.outcome {
        FaultOutcome::Holds => "pass",
        FaultOutcome::Violation => "fail",
        FaultOutcome::NotApplicable => "skipped",
        FaultOutcome::Error => "unsupported",
    }
}

/// The three times of a cell, formatted (`-` when not measured).
fn times(c: &FaultCell) -> [String; 3] {
    [c.detect_ms, c.next_holder_ms, c.margin_ms]
        .map(|v| v.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into()))
}

/// The counts of a cell, `k=v` comma-separated.
fn counts(c: &FaultCell) -> String {
    c.counts
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn label_plain(c: &FaultCell) -> String {
    match c.outcome {
        FaultOutcome::Violation if c.documented => "VIOLATION (documented)".into(),
        FaultOutcome::Violation => "VIOLATION (undocumented)".into(),
        FaultOutcome::Holds => "holds".into(),
        FaultOutcome::NotApplicable => "n/a".into(),
        FaultOutcome::Error => "error".into(),
    }
}

fn label_md(c: &FaultCell) -> String {
    match c.outcome {
        FaultOutcome::Violation => format!("**{}**", label_plain(c)),
        _ => label_plain(c),
    }
}

/// Counts and times, e.g. `double_holders=1, detect 310 ms, margin 12 ms`.
fn details(c: &FaultCell) -> Option<String> {
    let mut parts: Vec<String> = c.counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
    for (name, v) in [
        ("detect", c.detect_ms),
        ("next", c.next_holder_ms),
        ("margin", c.margin_ms),
    ] {
        if let Some(v) = v {
            parts.push(format!("{name} {v:.0} ms"));
        }
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::FaultInfo;

    #[test]
    fn renders_every_outcome_escaped_and_counts_defects() {
        let mut m = FaultMatrix {
            faults: vec![FaultInfo {
                name: "holder_kill".into(),
                summary: "kill <the> holder".into(),
            }],
            backends: vec!["a".into(), "b<".into(), "c".into()],
            cells: Vec::new(),
        };
        let mut v = FaultCell::new("a", "holder_kill");
        v.outcome = FaultOutcome::Violation;
        v.count("double_holders", 2);
        v.margin_ms = Some(-12.0);
        m.cells.push(v.clone());
        v.backend = "b<".into();
        v.documented = true;
        m.cells.push(v);
        m.cells
            .push(FaultCell::new("c", "holder_kill").not_applicable("no <server>"));
        assert_eq!(m.failed(), 1, "only the undocumented violation fails");
        let md = m.to_markdown();
        assert!(md.contains("**VIOLATION (undocumented)**"), "{md}");
        assert!(md.contains("double_holders=2, margin -12 ms"), "{md}");
        assert!(
            md.contains("| a | `holder_kill` | **VIOLATION (undocumented)** | double_holders=2 | - | - | -12 |"),
            "the times table has the times as columns: {md}"
        );
        assert!(
            !md.contains("| c | `holder_kill`"),
            "n/a cells are not timed: {md}"
        );
        let html = m.to_html();
        assert!(!html.contains("<the>") && !html.contains("b<<") && !html.contains("<server>"));
        assert!(html.contains("VIOLATION (documented)"));
        assert!(
            html.contains("<h3>Fault times</h3>") && html.contains("<td class=\"num\">-12</td>")
        );
        let back: FaultMatrix = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }
}
