//! The fault matrix on real topologies: every backend under every fault, the observation
//! asserted against what the backend's documentation states ([`faults::expected`]). Each
//! backend's cells are written to `target/faults/<label>.json` (the report can merge them).

use faults::{Expect, FaultCell, FaultOutcome, expected, matches, run_backend};

fn check(label: &str) {
    let kind = faults::backends()
        .into_iter()
        .find(|(l, _)| *l == label)
        .map(|(_, k)| k)
        .expect("a known backend");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cells: Vec<FaultCell> = rt.block_on(run_backend(label, kind));
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("faults");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(
        dir.join(format!("{label}.json")),
        serde_json::to_string_pretty(&cells).unwrap(),
    );
    let mut bad = Vec::new();
    for c in &cells {
        let fault = faults::Fault::ALL
            .into_iter()
            .find(|f| f.name() == c.fault)
            .unwrap();
        let e = expected(label, fault);
        eprintln!(
            "{label} / {}: {:?}{} {:?} detect={:?} next={:?} margin={:?} {}",
            c.fault,
            c.outcome,
            if c.documented { " (documented)" } else { "" },
            c.counts,
            c.detect_ms,
            c.next_holder_ms,
            c.margin_ms,
            c.note
        );
        if c.outcome == FaultOutcome::Error || !matches(e, c) {
            bad.push(format!(
                "{}: observed {:?} {:?} ({}), docs say {e:?}",
                c.fault, c.outcome, c.counts, c.note
            ));
        }
        if let Expect::Documented(why) | Expect::Either(why) = e {
            eprintln!("{label} / {}: docs: {why}", c.fault);
        }
        if let Expect::KnownDefect(why) = e {
            eprintln!("{label} / {}: KNOWN DEFECT: {why}", c.fault);
        }
    }
    assert!(bad.is_empty(), "{label}:\n{}", bad.join("\n"));
}

#[test]
fn redis() {
    check("redis");
}

#[test]
fn redis_sentinel() {
    check("redis-sentinel");
}

#[test]
fn redis_sentinel_min_replicas() {
    check("redis-sentinel-min1");
}

#[test]
fn postgres_lease() {
    check("postgres-lease");
}

#[test]
fn postgres_row_lock() {
    check("postgres-row-lock");
}

#[test]
fn mysql_lease() {
    check("mysql-lease");
}

#[test]
fn mysql_row_lock() {
    check("mysql-row-lock");
}

#[test]
fn sqlite() {
    check("sqlite");
}

#[test]
fn zk_ensemble() {
    check("zk-ensemble");
}

#[test]
fn etcd_cluster() {
    check("etcd-cluster");
}

#[test]
fn redlock() {
    check("redlock");
}
