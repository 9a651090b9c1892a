//! Phase results and the score, computed as IO500 computes it.
//!
//! BW is the geometric mean of the four ior phases in GiB/s (2^30 bytes per second), MD the
//! geometric mean of the eight mdtest phases and find in kIOPS (10^3 operations per second),
//! and the score is `sqrt(BW * MD)`. A phase with a value of zero (or a missing phase) makes
//! its group, and so the score, zero, as in IO500.
//!
//! ```
//! use ferrite_client::io500::score::geometric_mean;
//! assert!((geometric_mean(&[2.0, 8.0]) - 4.0).abs() < 1e-12);
//! assert_eq!(geometric_mean(&[3.0, 0.0]), 0.0);
//! ```

use serde::{Deserialize, Serialize};

/// Bytes in a GiB.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The unit of a phase's value: bandwidth phases report GiB/s, the others kIOPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unit {
    /// 2^30 bytes per second.
    #[serde(rename = "GiB/s")]
    GibPerSecond,
    /// 10^3 operations per second.
    #[serde(rename = "kIOPS")]
    KiloIops,
}

impl Unit {
    /// The unit as printed in the table and JSON.
    pub fn label(self) -> &'static str {
        match self {
            Unit::GibPerSecond => "GiB/s",
            Unit::KiloIops => "kIOPS",
        }
    }
}

/// One phase's measured figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseResult {
    /// IO500 phase name, e.g. `ior-easy-write`.
    pub name: &'static str,
    /// The phase's figure in `unit`.
    pub value: f64,
    /// GiB/s for ior phases, kIOPS for the rest.
    pub unit: Unit,
    /// Wall time from the start barrier to the last task's end.
    pub seconds: f64,
    /// Operations done: transfers for ior, files for mdtest, entries checked for find.
    pub ops: u64,
    /// Bytes moved (ior and mdtest-hard data).
    pub bytes: u64,
    /// Verification errors: mismatched or missing bytes, wrong sizes.
    pub errors: u64,
    /// Requests the backend sent to its storage during the phase (a batch counts once), when
    /// it counts them ([`crate::io500::Io500Backend::round_trips`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round_trips: Option<u64>,
    /// Valid as IO500 judges a phase ([`crate::io500::validity`]).
    pub valid: bool,
    /// Why not, when not valid.
    pub invalid_because: Vec<String>,
}

impl PhaseResult {
    /// Round trips per operation, if counted.
    pub fn round_trips_per_op(&self) -> Option<f64> {
        self.round_trips.map(|r| r as f64 / self.ops.max(1) as f64)
    }

    /// A bandwidth phase: `bytes` moved in `seconds`.
    pub fn bandwidth(name: &'static str, bytes: u64, ops: u64, seconds: f64, errors: u64) -> Self {
        let value = if seconds > 0.0 {
            bytes as f64 / GIB / seconds
        } else {
            0.0
        };
        Self {
            name,
            value,
            unit: Unit::GibPerSecond,
            seconds,
            ops,
            bytes,
            errors,
            round_trips: None,
            valid: true,
            invalid_because: Vec::new(),
        }
    }

    /// A metadata phase: `ops` operations in `seconds`.
    pub fn rate(name: &'static str, ops: u64, bytes: u64, seconds: f64, errors: u64) -> Self {
        let value = if seconds > 0.0 {
            ops as f64 / 1000.0 / seconds
        } else {
            0.0
        };
        Self {
            name,
            value,
            unit: Unit::KiloIops,
            seconds,
            ops,
            bytes,
            errors,
            round_trips: None,
            valid: true,
            invalid_because: Vec::new(),
        }
    }
}

/// The geometric mean of `values`; zero if any value is zero or negative or there are none.
pub fn geometric_mean(values: &[f64]) -> f64 {
    if values.is_empty() || values.iter().any(|v| v.is_nan() || *v <= 0.0) {
        return 0.0;
    }
    let log_sum: f64 = values.iter().map(|v| v.ln()).sum();
    (log_sum / values.len() as f64).exp()
}

/// The three headline figures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Score {
    /// Geometric mean of the ior phases, GiB/s.
    pub bw_gib_s: f64,
    /// Geometric mean of the mdtest phases and find, kIOPS.
    pub md_kiops: f64,
    /// `sqrt(bw_gib_s * md_kiops)`.
    pub score: f64,
}

/// Scores a run: bandwidth phases form BW, the others MD.
pub fn score(phases: &[PhaseResult]) -> Score {
    let pick = |unit: Unit| -> Vec<f64> {
        phases
            .iter()
            .filter(|p| p.unit == unit)
            .map(|p| p.value)
            .collect()
    };
    let bw_gib_s = geometric_mean(&pick(Unit::GibPerSecond));
    let md_kiops = geometric_mean(&pick(Unit::KiloIops));
    Score {
        bw_gib_s,
        md_kiops,
        score: (bw_gib_s * md_kiops).sqrt(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn geometric_means_of_known_sets() {
        assert!(close(geometric_mean(&[1.0, 4.0, 16.0]), 4.0));
        assert!(close(geometric_mean(&[5.0]), 5.0));
        assert!(close(geometric_mean(&[2.0, 2.0, 2.0, 2.0]), 2.0));
        assert!(close(geometric_mean(&[0.5, 8.0, 1.0, 4.0]), 2.0));
        assert_eq!(geometric_mean(&[]), 0.0);
        assert_eq!(geometric_mean(&[1.0, f64::NAN]), 0.0);
        assert_eq!(geometric_mean(&[1.0, -1.0]), 0.0);
    }

    #[test]
    fn score_is_sqrt_of_bw_times_md() {
        let bw = [1.0, 4.0, 2.0, 8.0]; // geomean 2^(6/4) = 2.8284...
        let md = [9.0; 9];
        let mut phases: Vec<PhaseResult> = bw
            .iter()
            .map(|&v| PhaseResult::bandwidth("b", (v * GIB) as u64, 1, 1.0, 0))
            .collect();
        phases.extend(
            md.iter()
                .map(|&v| PhaseResult::rate("m", (v * 1000.0) as u64, 0, 1.0, 0)),
        );
        let s = score(&phases);
        assert!(close(s.bw_gib_s, 2f64.powf(1.5)), "{}", s.bw_gib_s);
        assert!(close(s.md_kiops, 9.0));
        assert!(close(s.score, (2f64.powf(1.5) * 9.0).sqrt()));
    }

    #[test]
    fn a_zero_phase_zeroes_the_score() {
        let phases = vec![
            PhaseResult::bandwidth("b", 1 << 30, 1, 1.0, 0),
            PhaseResult::rate("m", 0, 0, 1.0, 0),
        ];
        let s = score(&phases);
        assert!(close(s.bw_gib_s, 1.0));
        assert_eq!(s.md_kiops, 0.0);
        assert_eq!(s.score, 0.0);
    }

    #[test]
    fn units_convert_bytes_and_ops() {
        let p = PhaseResult::bandwidth("w", 3 << 30, 10, 2.0, 0);
        assert!(close(p.value, 1.5));
        let p = PhaseResult::rate("m", 5000, 0, 2.5, 0);
        assert!(close(p.value, 2.0));
        assert_eq!(PhaseResult::rate("m", 5, 0, 0.0, 0).value, 0.0);
    }
}
