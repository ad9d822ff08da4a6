//! The report's compatibility section: each backend's table (a row per way the name is held,
//! a column per way it is then asked for), each cell with what the backend declares and the
//! result of the suite's scenario for it (or the backend crate's test that checks it), as
//! Markdown and as HTML.

use std::fmt::Write as _;

use lockcore::{Cell, Compatibility};

use crate::escape::html_escape;
use crate::run::{BackendReport, Status};
use crate::scenarios::compat_scenario_name;

use super::find;

/// A backend's table and each cell's result, as one line of text per cell.
fn cell_text(b: &BackendReport, cell: &Cell) -> String {
    let declared = cell.relation.as_str();
    let result = match find(b, &compat_scenario_name(&cell.first, &cell.second)) {
        Some(r) if r.status == Status::Pass => "pass".to_string(),
        Some(r) if r.status == Status::Fail => "FAIL".to_string(),
        Some(r) => r.status.as_str().to_string(),
        None => match &cell.tested_by {
            Some(_) => "crate test".to_string(),
            None => "–".to_string(),
        },
    };
    format!("{declared} · {result}")
}

fn table(b: &BackendReport) -> Option<&Compatibility> {
    b.compatibility.as_ref()
}

/// The reasons and tests of `t`'s cells, one line each (`first → second: ...`).
fn footnotes(t: &Compatibility) -> Vec<String> {
    t.cells()
        .iter()
        .filter(|c| c.relation.reason().is_some() || c.tested_by.is_some())
        .map(|c| {
            let mut line = format!("{} → {}: {}", c.first, c.second, c.relation);
            if let Some(test) = &c.tested_by {
                let _ = write!(line, " (checked by `{test}`)");
            }
            line
        })
        .collect()
}

/// The section as Markdown.
pub(super) fn markdown(backends: &[BackendReport], cell: impl Fn(&str) -> String) -> String {
    let mut w = String::new();
    let _ = writeln!(
        w,
        "\n## Compatibility\n\nOne name taken one way (row), then asked for another way (column): \
         `exclude` (kept out), `share` (both hold), `refuse` (a typed error), `limit` (a documented \
         limit); then the result of the cell's scenario, or `crate test` where the backend's own \
         tests check it.\n"
    );
    for b in backends {
        let Some(t) = table(b) else { continue };
        let _ = writeln!(w, "### {}\n", cell(&b.label));
        let _ = write!(w, "| held \\ asked |");
        for way in t.ways() {
            let _ = write!(w, " {} |", cell(&way.id));
        }
        let _ = write!(w, "\n|---|");
        for _ in t.ways() {
            let _ = write!(w, ":---:|");
        }
        let _ = writeln!(w);
        for first in t.ways() {
            let _ = write!(w, "| {} |", cell(&first.id));
            for second in t.ways() {
                let text = t
                    .cell_of(&first.id, &second.id)
                    .map_or("**missing**".to_string(), |c| cell_text(b, c));
                let _ = write!(w, " {} |", cell(&text));
            }
            let _ = writeln!(w);
        }
        let notes = footnotes(t);
        if !notes.is_empty() {
            let _ = writeln!(w);
            for n in notes {
                let _ = writeln!(w, "- {}", cell(&n));
            }
        }
        let _ = writeln!(w);
    }
    w
}

/// The section as HTML.
pub(super) fn html(backends: &[BackendReport]) -> String {
    let esc = html_escape;
    let mut w = String::new();
    let _ = writeln!(
        w,
        "<h2>Compatibility</h2>\n<p class=\"legend\">One name taken one way (row), then asked for \
         another way (column): exclude, share, refuse (a typed error) or limit (documented); then \
         the result of the cell's scenario, or <em>crate test</em> where the backend's own tests \
         check it.</p>"
    );
    for b in backends {
        let Some(t) = table(b) else { continue };
        let _ = writeln!(
            w,
            "<h3>{}</h3>\n<div class=\"scroll\"><table class=\"caps\">\n<thead><tr><th class=\"left\">held \\ asked</th>",
            esc(&b.label)
        );
        for way in t.ways() {
            let _ = write!(w, "<th>{}</th>", esc(&way.id));
        }
        let _ = writeln!(w, "</tr></thead>\n<tbody>");
        for first in t.ways() {
            let _ = write!(
                w,
                "<tr><th class=\"left\" scope=\"row\">{}</th>",
                esc(&first.id)
            );
            for second in t.ways() {
                let (text, cls) = match t.cell_of(&first.id, &second.id) {
                    None => ("missing".to_string(), "no"),
                    Some(c) => {
                        let text = cell_text(b, c);
                        let cls = if text.ends_with("FAIL") {
                            "no"
                        } else if text.ends_with("pass") {
                            "yes"
                        } else {
                            "val"
                        };
                        (text, cls)
                    }
                };
                let _ = write!(w, "<td class=\"{cls}\">{}</td>", esc(&text));
            }
            let _ = writeln!(w, "</tr>");
        }
        let _ = writeln!(w, "</tbody></table></div>");
        let notes = footnotes(t);
        if !notes.is_empty() {
            let items: String = notes
                .iter()
                .map(|n| format!("<li>{}</li>", esc(n)))
                .collect();
            let _ = writeln!(w, "<ul class=\"notes\">{items}</ul>");
        }
    }
    w
}
