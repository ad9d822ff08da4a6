//! `locksmith report` and `locksmith bench`.

use std::path::Path;
use std::sync::Arc;

use conformance::{BackendReport, Harness, Progress, Report, Status, run_selected, scenarios};

use crate::bench::{Plan, add_process_figures};
use crate::harness::{UrlHarness, labels};
use crate::provenance::provenance;

/// The URLs `report` uses when given none: the two embedded backends, which need no server
/// (memory, and a SQLite file in the output directory).
pub fn embedded_urls(out: &Path) -> Vec<String> {
    let db = out.join("report-sqlite.db");
    vec!["memory://".into(), format!("sqlite://{}", db.display())]
}

/// Runs the suite (the scenarios named in `only`, or all when it is empty) against every URL,
/// writes the report, prints its paths. Returns the exit code: 0 when nothing failed, 1
/// otherwise, 2 when the report could not be written.
pub async fn report(
    urls: &[String],
    out: &Path,
    bench: Option<Plan>,
    faults: Option<&Path>,
    only: &[String],
) -> u8 {
    // Read first: a file that is not there fails before the suite runs.
    let faults = match faults.map(read_faults).transpose() {
        Ok(matrix) => matrix,
        Err(e) => {
            eprintln!("locksmith: {e}");
            return 2;
        }
    };
    if let Some(unknown) = only
        .iter()
        .find(|o| !scenarios::all().iter().any(|s| s.name == o.as_str()))
    {
        eprintln!("locksmith: no scenario is named {unknown:?}");
        return 2;
    }
    // Early, so that a bad --out fails before the suite runs (and the embedded SQLite file
    // has its directory).
    if let Err(e) = std::fs::create_dir_all(out) {
        eprintln!("locksmith: cannot create {}: {e}", out.display());
        return 2;
    }
    let labels = labels(urls);
    let label_width = labels.iter().map(|l| l.len()).max().unwrap_or(0);
    let name_width = scenarios::all()
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0);
    let mut backends: Vec<BackendReport> = Vec::with_capacity(urls.len());
    for (label, url) in labels.into_iter().zip(urls) {
        let harness = UrlHarness::probe(label.clone(), url.clone()).await;
        eprintln!("==> {label}: {}", harness.shown_url());
        let harness: Arc<dyn Harness> = Arc::new(harness);
        let selected = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
        let mut result = run_selected(harness, bench.is_some(), selected, |p| match p {
            Progress::Scenario {
                label,
                done,
                total,
                result,
            } => {
                let status = match result.status {
                    Status::Fail => "FAIL",
                    other => other.as_str(),
                };
                eprintln!(
                    "[{done:>2}/{total}] {label:<label_width$}  {:<name_width$}  {status:<11}  {:>5} ms",
                    result.scenario, result.millis
                );
                if let Some(reason) = &result.reason
                    && result.status != Status::Pass
                {
                    for line in reason.lines() {
                        eprintln!("        {line}");
                    }
                }
            }
            Progress::Measuring { label } => {
                eprintln!(
                    "[bench] {label:<label_width$}  measuring uncontended latency and hand-over rate (about {} s)",
                    2 * conformance::MEASURE_TIME.as_secs()
                );
            }
        })
        .await;
        if let Some(e) = &result.error {
            eprintln!("{label}: could not connect: {e}");
        }
        if bench.is_some() && result.error.is_none() && result.figures.is_none() {
            eprintln!("{label}: the benchmark failed; no figures");
        }
        if let (Some(plan), Some(figures)) = (bench, result.figures.as_mut()) {
            // The report has no place for the one-off cost per waiter.
            let _ = add_process_figures(url, &label, figures, plan).await;
        }
        let n = |s| result.results.iter().filter(|r| r.status == s).count();
        eprintln!(
            "{label}: {} pass, {} FAIL, {} unsupported, {} skipped",
            n(Status::Pass),
            n(Status::Fail),
            n(Status::Unsupported),
            n(Status::Skipped)
        );
        backends.push(result);
    }
    let mut report = Report::new(backends).with_provenance(provenance());
    if let Some(matrix) = faults {
        report = report.with_faults(matrix);
    }
    match report.write_to(out) {
        Ok(paths) => {
            for p in paths {
                println!("{}", p.display());
            }
        }
        Err(e) => {
            eprintln!(
                "locksmith: cannot write the report to {}: {e}",
                out.display()
            );
            return 2;
        }
    }
    let failed = report.failed();
    if failed > 0 {
        eprintln!("{failed} scenario result(s) failed");
        1
    } else {
        0
    }
}

/// The fault matrix the fault suite wrote (`cargo run -p faults --bin locksmith-faults`).
fn read_faults(path: &Path) -> Result<conformance::FaultMatrix, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the fault matrix {}: {e}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a fault matrix: {e}", path.display()))
}
