//! Tests of the report's model and renderings.

use std::time::Duration;

use lockcore::Capabilities;

use super::markdown::md_cell;
use super::text::fmt_duration;
use super::*;
use crate::measure::Figures;

fn result(name: &str, status: Status, reason: Option<&str>) -> ScenarioResult {
    ScenarioResult {
        scenario: name.to_string(),
        status,
        reason: reason.map(str::to_string),
        observed: None,
        millis: 12,
    }
}

fn backend(label: &str, results: Vec<ScenarioResult>, figures: Option<Figures>) -> BackendReport {
    let mut caps = Capabilities::default();
    caps.fencing = true;
    caps.notes = vec!["caveat <b>bold</b> & \"quoted\"".to_string()];
    BackendReport {
        label: label.to_string(),
        backend: format!("{label}://host (password redacted)"),
        server_version: (label == "memory").then(|| "memory 7.0.15".to_string()),
        compatibility: Some(caps.compatibility_table()),
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

/// A pass that measured a figure keeps its pass and gets a note with the figure, in every
/// rendering; the JSON carries it, and leaves `observed` out where nothing was measured.
#[test]
fn a_figure_measured_by_a_passing_scenario_is_noted_beside_its_pass() {
    let mut r = fake_report();
    r.backends[0].results[0].observed = Some("15.8 requests per hand-over".to_string());
    let md = r.to_markdown();
    let row = md
        .lines()
        .find(|l| l.starts_with("| `acquire_release_reacquire`"))
        .unwrap();
    assert!(row.contains("| pass [1] |"), "{row}");
    assert!(
        md.contains("`acquire_release_reacquire`: pass: measured: 15.8 requests per hand-over"),
        "{md}"
    );
    let html = r.to_html();
    assert!(html.contains("measured: 15.8 requests per hand-over"));
    assert!(html.contains("title=\"15.8 requests per hand-over\""));
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(
        v["backends"][0]["results"][0]["observed"],
        "15.8 requests per hand-over"
    );
    assert!(v["backends"][0]["results"][1].get("observed").is_none());
    assert_eq!(r.failed(), fake_report().failed(), "a figure is no failure");
}

/// The primitives matrix: a row per primitive, a cell per backend, a reason for every "no".
#[test]
fn primitives_matrix_gives_a_reason_for_every_no() {
    let mut r = fake_report();
    if let Some(c) = r.backends[0].capabilities.as_mut() {
        c.shared = lockcore::Support::Yes;
        c.permits = lockcore::Support::no("a majority does not keep a count");
    }
    let md = r.to_markdown();
    let row = |name: &str| {
        md.lines()
            .find(|l| l.starts_with(&format!("| {name} (")))
            .unwrap_or_else(|| panic!("no {name} row: {md}"))
            .to_string()
    };
    assert!(row("read-write lock").contains("| yes |"), "{md}");
    assert!(
        row("semaphore").contains("no: a majority does not keep a count"),
        "{md}"
    );
    assert!(
        row("semaphore").contains("no: not declared by this backend"),
        "{md}"
    );
    assert!(row("mutex").matches("| yes").count() >= 2, "{md}");
    let html = r.to_html();
    assert!(html.contains("<h2>Primitives</h2>"));
    assert!(html.contains("no: a majority does not keep a count"));
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
