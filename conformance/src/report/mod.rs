//! The conformance report: results of every backend, as JSON, Markdown and a self-contained HTML
//! page (inline CSS and SVG, no scripts, no network).
//!
//! This file is the report's model (what ran, the results, and which of them need a note).
//! The renderings live apart and use it, never the other way round: `text` (formatting both
//! renderings share), `markdown`, `html` (with `charts` and `page.css`), `compat_table` (the
//! compatibility section of both), `fault_matrix` (the
//! fault suite's sections of both) and `files` (writing all three).

mod charts;
mod compat_table;
mod fault_matrix;
mod files;
mod html;
mod markdown;
#[cfg(test)]
mod tests;
mod text;

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::run::{BackendReport, ScenarioResult, Status};
use crate::scenarios;

pub use crate::escape::html_escape;

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

    /// Every result that did not pass or recorded a figure, numbered in matrix order (row by
    /// row).
    fn notes(&self) -> Vec<Note<'_>> {
        let mut notes = Vec::new();
        for row in self.rows() {
            for (col, b) in self.backends.iter().enumerate() {
                if let Some(r) = find(b, &row.name)
                    && (r.status != Status::Pass || r.observed.is_some())
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
}

/// A numbered note on a result that did not pass, or that recorded a figure.
struct Note<'a> {
    number: usize,
    backend: usize,
    result: &'a ScenarioResult,
}

impl Note<'_> {
    /// Why it did not pass, and what it measured.
    fn text(&self) -> String {
        match (&self.result.reason, &self.result.observed) {
            (Some(why), Some(seen)) => format!("{why} (measured: {seen})"),
            (Some(why), None) => why.clone(),
            (None, Some(seen)) => format!("measured: {seen}"),
            (None, None) => "(no reason given)".to_string(),
        }
    }
}

fn find<'a>(b: &'a BackendReport, scenario: &str) -> Option<&'a ScenarioResult> {
    b.results.iter().find(|r| r.scenario == scenario)
}

fn count(b: &BackendReport, status: Status) -> usize {
    b.results.iter().filter(|r| r.status == status).count()
}

/// `YYYY-MM-DD HH:MM UTC` of a Unix time (from the `time` crate's calendar).
pub fn utc_date(unix: u64) -> String {
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
