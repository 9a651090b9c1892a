//! Validity as IO500 defines it. IO500 (`src/main.c`) marks a write phase
//! whose runtime is below the stonewall `[INVALID]`, and the score invalid
//! when any phase is, when a phase had errors, or when the stonewall is
//! shorter than the 300 s a submission needs. Ferrite adds the two ways its
//! own runs can fall short: a write phase stopped by a per-task cap
//! ([`Limits::ior_easy_max_transfers`] and the like) rather than by the
//! stonewall, and the end-of-run checks (find's count, entries left after
//! the deletes).
//!
//! ```
//! use ferrite_client::io500::score::PhaseResult;
//! use ferrite_client::io500::validity::{phase_reasons, Limits};
//! use std::time::Duration;
//! let limits = Limits::uncapped(1, Duration::from_secs(300));
//! let short = PhaseResult::rate("mdtest-easy-write", 1000, 0, 12.0, 0);
//! assert_eq!(phase_reasons(&short, &limits), ["ran 12.00 s, below the 300 s stonewall"]);
//! ```

use super::report::RunReport;
use super::score::PhaseResult;
use std::time::Duration;

/// The shortest stonewall IO500 accepts for a submission, in seconds.
pub const STONEWALL_SECONDS_MIN: f64 = 300.0;

/// What a run was told to do, as far as validity goes (from
/// `Config::limits`): the stonewall, the tasks and each write phase's
/// per-task cap (`u64::MAX`: none).
#[derive(Debug, Clone)]
pub struct Limits {
    pub stonewall: Duration,
    pub tasks: usize,
    pub ior_easy_max_transfers: u64,
    pub ior_hard_max_segments: u64,
    pub mdtest_easy_max_files: u64,
    pub mdtest_hard_max_files: u64,
}

impl Limits {
    /// `tasks` tasks, `stonewall`, no caps.
    pub fn uncapped(tasks: usize, stonewall: Duration) -> Self {
        Limits {
            stonewall,
            tasks,
            ior_easy_max_transfers: u64::MAX,
            ior_hard_max_segments: u64::MAX,
            mdtest_easy_max_files: u64::MAX,
            mdtest_hard_max_files: u64::MAX,
        }
    }
}

/// The write phases, each with its per-task cap and what the cap counts.
fn write_cap(name: &str, config: &Limits) -> Option<(u64, &'static str)> {
    match name {
        "ior-easy-write" => Some((config.ior_easy_max_transfers, "transfers")),
        "ior-hard-write" => Some((config.ior_hard_max_segments, "segments")),
        "mdtest-easy-write" => Some((config.mdtest_easy_max_files, "files")),
        "mdtest-hard-write" => Some((config.mdtest_hard_max_files, "files")),
        _ => None,
    }
}

/// Why `phase` is invalid under `config`; empty when it is valid.
pub fn phase_reasons(phase: &PhaseResult, config: &Limits) -> Vec<String> {
    let mut reasons = Vec::new();
    let stonewall = config.stonewall.as_secs_f64();
    if let Some((cap, what)) = write_cap(phase.name, config) {
        if phase.seconds < stonewall {
            reasons.push(format!(
                "ran {:.2} s, below the {} s stonewall",
                phase.seconds, stonewall
            ));
        }
        let all_tasks = cap.saturating_mul(config.tasks as u64);
        if cap != u64::MAX && phase.ops >= all_tasks {
            reasons.push(format!("stopped at its cap of {cap} {what} per task"));
        }
    }
    if phase.errors > 0 {
        reasons.push(format!("{} verification errors", phase.errors));
    }
    reasons
}

/// Marks every phase of `report` and the run itself.
pub fn judge(report: &mut RunReport, config: &Limits) {
    let mut run = Vec::new();
    if report.stonewall_seconds < STONEWALL_SECONDS_MIN {
        run.push(format!(
            "stonewall {} s is shorter than the {STONEWALL_SECONDS_MIN} s IO500 requires",
            report.stonewall_seconds
        ));
    }
    for phase in &mut report.phases {
        phase.invalid_because = phase_reasons(phase, config);
        phase.valid = phase.invalid_because.is_empty();
        if !phase.valid {
            run.push(format!("{} is invalid", phase.name));
        }
    }
    if report.find_found != report.find_expected {
        run.push(format!(
            "find reported {} files, {} expected",
            report.find_found, report.find_expected
        ));
    }
    if report.leftover_entries > 0 {
        run.push(format!(
            "{} entries left after the delete phases",
            report.leftover_entries
        ));
    }
    report.valid = run.is_empty();
    report.invalid_because = run;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &'static str, ops: u64, seconds: f64) -> PhaseResult {
        PhaseResult::rate(name, ops, 0, seconds, 0)
    }

    #[test]
    fn a_write_phase_is_invalid_below_the_stonewall_or_at_its_cap() {
        let mut config = Limits::uncapped(2, Duration::from_secs(300));
        assert!(phase_reasons(&write("ior-easy-write", 10, 301.0), &config).is_empty());
        // Read phases have no stonewall.
        assert!(phase_reasons(&write("ior-easy-read", 10, 1.0), &config).is_empty());
        config.ior_easy_max_transfers = 5;
        assert_eq!(
            phase_reasons(&write("ior-easy-write", 10, 301.0), &config),
            ["stopped at its cap of 5 transfers per task"]
        );
        assert!(phase_reasons(&write("ior-easy-write", 9, 301.0), &config).is_empty());
        let mut errors = write("ior-hard-read", 10, 5.0);
        errors.errors = 3;
        assert_eq!(phase_reasons(&errors, &config), ["3 verification errors"]);
    }

    #[test]
    fn the_run_is_valid_only_with_a_300s_stonewall_and_every_phase_valid() {
        let config = Limits::uncapped(1, Duration::from_secs(300));
        let mut report = RunReport::for_tests(300.0, vec![write("mdtest-easy-write", 5, 310.0)]);
        judge(&mut report, &config);
        assert!(report.valid, "{:?}", report.invalid_because);
        let mut report = RunReport::for_tests(300.0, vec![write("mdtest-easy-write", 5, 2.0)]);
        judge(&mut report, &config);
        assert!(!report.valid && !report.phases[0].valid);
        assert_eq!(report.invalid_because, ["mdtest-easy-write is invalid"]);
        let short = Limits::uncapped(1, Duration::from_secs(30));
        let mut report = RunReport::for_tests(30.0, vec![write("mdtest-easy-write", 5, 31.0)]);
        judge(&mut report, &short);
        assert!(report.phases[0].valid);
        assert_eq!(
            report.invalid_because,
            ["stonewall 30 s is shorter than the 300 s IO500 requires"]
        );
        report.find_expected = 4;
        report.leftover_entries = 1;
        judge(&mut report, &short);
        assert_eq!(report.invalid_because.len(), 3);
    }
}
