//! The "Faults" matrix of the report: what each backend did under each fault (holder crash and
//! pause, server restart, partition, failover, slow replies, Redlock node faults), observed on
//! real topologies by the `faults` crate. This module holds the data; the report renders it
//! (`report::fault_matrix`), and the scenarios live in the `faults` crate (they need every
//! backend).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a fault did to the lock's contract on one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultOutcome {
    /// The contract held under the fault.
    Holds,
    /// The contract was broken (two holders, a stale write accepted, a token going backwards,
    /// a lost signal after another client won, no progress): the counts say how often.
    Violation,
    /// The fault does not apply to this backend (the reason says why).
    NotApplicable,
    /// The scenario could not run (a topology did not start): not a result.
    Error,
}

impl FaultOutcome {
    /// A short label.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultOutcome::Holds => "holds",
            FaultOutcome::Violation => "violation",
            FaultOutcome::NotApplicable => "n/a",
            FaultOutcome::Error => "error",
        }
    }
}

/// One fault of the matrix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultInfo {
    /// Its stable name.
    pub name: String,
    /// What is done and what is checked.
    pub summary: String,
}

/// One backend under one fault.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FaultCell {
    /// The backend's label (e.g. `redis`, `postgres-row-lock`, `zk-ensemble`).
    pub backend: String,
    /// The fault's name.
    pub fault: String,
    /// What happened.
    pub outcome: FaultOutcome,
    /// For a violation: whether the backend's documentation states it (an undocumented one is
    /// a defect of the backend).
    pub documented: bool,
    /// What was counted: `double_holders`, `stale_accepted`, `stale_rejected`,
    /// `token_regressions`, ...
    pub counts: BTreeMap<String, u64>,
    /// From the fault until the holder's lost signal fired, in ms.
    pub detect_ms: Option<f64>,
    /// From the fault until another client held the lock, in ms.
    pub next_holder_ms: Option<f64>,
    /// The first moment another client could win minus the holder's lost signal, in ms
    /// (positive: the holder knew first; negative: it learned after another client won).
    pub margin_ms: Option<f64>,
    /// What was observed, in a sentence (or why the fault does not apply).
    pub note: String,
}

impl FaultCell {
    /// A cell for `backend` under `fault`, outcome holds, nothing counted yet.
    pub fn new(backend: &str, fault: &str) -> Self {
        FaultCell {
            backend: backend.to_string(),
            fault: fault.to_string(),
            outcome: FaultOutcome::Holds,
            documented: false,
            counts: BTreeMap::new(),
            detect_ms: None,
            next_holder_ms: None,
            margin_ms: None,
            note: String::new(),
        }
    }

    /// Marks the fault as not applying, for `reason`.
    pub fn not_applicable(mut self, reason: impl Into<String>) -> Self {
        self.outcome = FaultOutcome::NotApplicable;
        self.note = reason.into();
        self
    }

    /// Adds `n` to the count `what`.
    pub fn count(&mut self, what: &str, n: u64) {
        *self.counts.entry(what.to_string()).or_default() += n;
    }

    /// A violation that the backend's documentation does not state.
    pub fn is_defect(&self) -> bool {
        self.outcome == FaultOutcome::Violation && !self.documented
    }
}

/// Every backend under every fault.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultMatrix {
    /// The faults, in order.
    pub faults: Vec<FaultInfo>,
    /// The backends, in order.
    pub backends: Vec<String>,
    /// One cell per backend and fault that ran.
    pub cells: Vec<FaultCell>,
}

impl FaultMatrix {
    /// The cell of `backend` under `fault`.
    pub fn cell(&self, backend: &str, fault: &str) -> Option<&FaultCell> {
        self.cells
            .iter()
            .find(|c| c.backend == backend && c.fault == fault)
    }

    /// Undocumented violations (defects) and errors: what makes a report run fail.
    pub fn failed(&self) -> usize {
        self.cells
            .iter()
            .filter(|c| c.is_defect() || c.outcome == FaultOutcome::Error)
            .count()
    }
}
