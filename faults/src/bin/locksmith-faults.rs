//! Runs the fault suite on throw-away topologies (every backend under every fault, a few
//! minutes; needs the server packages of scripts/install-servers.sh) and writes its matrix as
//! JSON, for `locksmith report --faults FILE`, which puts it beside the scenario matrix:
//!
//! ```text
//! cargo run -p faults --bin locksmith-faults -- target/faults.json
//! locksmith report --faults target/faults.json
//! ```
//!
//! The fault suite is not part of the published `locksmith` command: it needs the server
//! packages and starts topologies of its own.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let Some(out) = std::env::args_os().nth(1) else {
        eprintln!("usage: locksmith-faults OUT.json");
        return ExitCode::from(2);
    };
    eprintln!("==> faults: starting topologies (a few minutes)");
    let matrix = faults::run_matrix(faults::backends(), 3).await;
    for c in &matrix.cells {
        eprintln!(
            "[faults] {:<20} {:<15} {:<10}{} {}",
            c.backend,
            c.fault,
            c.outcome.as_str(),
            if c.is_defect() { " (undocumented)" } else { "" },
            c.note.trim()
        );
    }
    let json = serde_json::to_string_pretty(&matrix).expect("a fault matrix serializes");
    if let Err(e) = std::fs::write(&out, json) {
        eprintln!(
            "locksmith-faults: cannot write {}: {e}",
            out.to_string_lossy()
        );
        return ExitCode::from(1);
    }
    println!("{}", out.to_string_lossy());
    ExitCode::SUCCESS
}
