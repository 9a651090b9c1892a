//! The run's report: the table printed after the run and the `--json` object.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::score::{PhaseResult, Score};

/// Everything a run measured and checked.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// [`crate::io500::Io500Backend::describe`] of the backend.
    pub backend: String,
    /// Client tasks per phase.
    pub tasks: usize,
    /// The stonewall of the write phases.
    pub stonewall_seconds: f64,
    /// `score`, `bw_gib_s`, `md_kiops` (flattened into the JSON object).
    #[serde(flatten)]
    pub score: Score,
    /// The twelve phases in run order.
    pub phases: Vec<PhaseResult>,
    /// Files find reported.
    pub find_found: u64,
    /// Files find should have reported, from what the write phases created.
    pub find_expected: u64,
    /// Sum of every phase's errors (bytes that did not verify, wrong sizes, find's miscount).
    pub verify_errors: u64,
    /// Entries left in the mdtest directories after the delete phases.
    pub leftover_entries: u64,
    /// [`crate::io500::Io500Backend::storage_counters`] at the end of the run.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub storage_counters: BTreeMap<String, u64>,
    /// The score is valid as IO500 judges a run ([`crate::io500::validity`]).
    pub valid: bool,
    /// Why not, when not valid.
    pub invalid_because: Vec<String>,
}

impl RunReport {
    /// True when every read verified, find counted right and the deletes emptied the
    /// directories.
    pub fn passed(&self) -> bool {
        self.verify_errors == 0
            && self.find_found == self.find_expected
            && self.leftover_entries == 0
    }

    /// A report of `phases` and nothing else, for tests of the rules.
    #[cfg(test)]
    pub(crate) fn for_tests(stonewall_seconds: f64, phases: Vec<PhaseResult>) -> Self {
        Self {
            backend: String::new(),
            tasks: 1,
            stonewall_seconds,
            score: super::score::score(&phases),
            phases,
            find_found: 0,
            find_expected: 0,
            verify_errors: 0,
            leftover_entries: 0,
            storage_counters: BTreeMap::new(),
            valid: true,
            invalid_because: Vec::new(),
        }
    }

    /// The phase called `name`, if it ran.
    pub fn phase(&self, name: &str) -> Option<&PhaseResult> {
        self.phases.iter().find(|p| p.name == name)
    }

    /// The human-readable table, ending with the score line.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<20} {:>12} {:<6} {:>9} {:>12} {:>8} {:>8}  valid",
            "phase", "value", "unit", "seconds", "ops", "errors", "rt/op"
        );
        for p in &self.phases {
            let _ = writeln!(
                out,
                "{:<20} {:>12.3} {:<6} {:>9.2} {:>12} {:>8} {:>8}  {}",
                p.name,
                p.value,
                p.unit.label(),
                p.seconds,
                p.ops,
                p.errors,
                p.round_trips_per_op()
                    .map_or_else(|| "-".to_string(), |r| format!("{r:.2}")),
                if p.valid {
                    "yes".to_string()
                } else {
                    format!("[INVALID] {}", p.invalid_because.join("; "))
                }
            );
        }
        let _ = writeln!(
            out,
            "[SCORE] bandwidth {:.3} GiB/s : iops {:.3} kiops : total {:.3}{}",
            self.score.bw_gib_s,
            self.score.md_kiops,
            self.score.score,
            if self.valid { "" } else { " [INVALID]" }
        );
        if !self.valid {
            let _ = writeln!(out, "invalid because: {}", self.invalid_because.join("; "));
        }
        let _ = writeln!(
            out,
            "backend {} : tasks {} : stonewall {}s : find {} of {} expected : \
             verification errors {} : entries left after delete {}",
            self.backend,
            self.tasks,
            self.stonewall_seconds,
            self.find_found,
            self.find_expected,
            self.verify_errors,
            self.leftover_entries
        );
        if !self.storage_counters.is_empty() {
            let counters: Vec<String> = self
                .storage_counters
                .iter()
                .map(|(name, v)| format!("{name} {v}"))
                .collect();
            let _ = writeln!(out, "storage: {}", counters.join(" : "));
        }
        out
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}
