//! The report as GitHub-flavoured Markdown.

use std::fmt::Write as _;

use crate::run::Status;

use super::text::{
    CAPABILITY_ROWS, FIGURE_COLUMNS, FIGURES_LEGEND, PRIMITIVE_ROWS, capability_value, describe,
    figure_cells, note_number, plural, primitive_value,
};
use super::{Report, count, find};

impl Report {
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
                    Some(r) if r.status == Status::Pass && r.observed.is_none() => {
                        "pass".to_string()
                    }
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
            let _ = writeln!(w, "\nResults that did not pass, and figures measured:\n");
            for note in &notes {
                let _ = writeln!(
                    w,
                    "{}. {} · `{}`: {}: {}",
                    note.number,
                    md_cell(&self.backends[note.backend].label),
                    md_code(&note.result.scenario),
                    status_md(note.result.status),
                    md_cell(&note.text())
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

        let _ = writeln!(w, "\n## Primitives\n");
        let _ = write!(w, "| primitive |");
        for b in &self.backends {
            let _ = write!(w, " {} |", md_cell(&b.label));
        }
        let _ = writeln!(w, "\n|---|{}", "---|".repeat(self.backends.len()));
        for (row, what) in PRIMITIVE_ROWS {
            let _ = write!(w, "| {row} ({}) |", md_cell(what));
            for b in &self.backends {
                let v = b
                    .capabilities
                    .as_ref()
                    .map_or("?".to_string(), |c| primitive_value(c, row));
                let _ = write!(w, " {} |", md_cell(&v));
            }
            let _ = writeln!(w);
        }

        w.push_str(&super::compat_table::markdown(&self.backends, md_cell));
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
}

const STATUS_LEGEND_MD: &str = "Statuses: **pass**; **FAIL** (the backend broke the contract); \
     **unsupported** (the backend does not declare the capability the scenario needs: not a pass); \
     **skipped** (not run, e.g. no server URL).";

fn status_md(s: Status) -> &'static str {
    match s {
        Status::Pass => "pass",
        Status::Fail => "**FAIL**",
        Status::Unsupported => "unsupported",
        Status::Skipped => "skipped",
    }
}

/// Text safe inside a Markdown table cell: one line, pipes escaped, HTML tags neutralised.
pub(super) fn md_cell(s: &str) -> String {
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
