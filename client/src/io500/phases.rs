//! One phase at a time, each possibly in its own process (a job's tasks): [`run_phase`].
//!
//! `setup` makes the run's tree and timestamp file; each of the twelve IO500 phases runs
//! alone and leaves what later phases need — its result and, for the write phases, how much
//! each task wrote — in `io500.<run>/state/<phase>.json` on the backend itself (outside the
//! data tree find walks); `score` gathers the twelve results into the run's report and checks
//! that the delete phases emptied the mdtest directories; `cleanup` removes the tree. Every
//! invocation must use the same run id (`Config::run_seed`) and task count.
//!
//! [`Phase::needs`] says which phases a phase reads the results of, and [`Phase::previous`]
//! the phase IO500 runs just before it: in a job both are its constraints
//! (`examples/io500.toml`), so the phases run one at a time in IO500's order. A measured
//! phase started before either fails naming it.
//!
//! ```
//! use ferrite_client::io500::phases::{run_phase, Phase, PhaseOutcome};
//! use ferrite_client::io500::{Config, PosixBackend};
//! use std::time::Duration;
//! let dir = tempfile::tempdir().unwrap();
//! let backend = PosixBackend::new(dir.path()).unwrap();
//! let mut config = Config::new(2, Duration::from_millis(20));
//! config.ior_easy_max_transfers = 1;
//! config.ior_hard_max_segments = 2;
//! config.mdtest_easy_max_files = 5;
//! config.mdtest_hard_max_files = 5;
//! let mut report = None;
//! for phase in Phase::ORDER {
//!     if let PhaseOutcome::Report(r) = run_phase(&backend, &config, phase).unwrap() {
//!         report = Some(r);
//!     }
//! }
//! assert!(report.unwrap().passed());
//! ```

use serde::{Deserialize, Serialize};

use super::backend::Io500Backend;
use super::config::Config;
use super::find::find;
use super::ior;
use super::mdtest::{self, Action, Shape};
use super::report::RunReport;
use super::runner::{
    count_leftovers, counted, make_timestamp, make_tree, remove_tree, with_ctx, Written,
};
use super::score::{score, PhaseResult, Unit};
use super::{io_context, Ctx, Io500Error};

/// Defines [`Phase`] with its variants in run order, [`Phase::ORDER`] and [`Phase::name`] from
/// one list.
macro_rules! phases {
    ($($variant:ident => $name:literal,)*) => {
        /// A step of a run that can be run by itself.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Phase {
            $($variant,)*
        }

        impl Phase {
            /// Every phase in the order one process runs them (`ferrite io500` without
            /// `--phase`).
            pub const ORDER: [Phase; [$($name),*].len()] = [$(Phase::$variant,)*];

            /// The phase's name (IO500's for the measured ones).
            pub fn name(self) -> &'static str {
                match self {
                    $(Phase::$variant => $name,)*
                }
            }
        }
    };
}

phases! {
    Setup => "setup",
    IorEasyWrite => "ior-easy-write",
    MdtestEasyWrite => "mdtest-easy-write",
    IorHardWrite => "ior-hard-write",
    MdtestHardWrite => "mdtest-hard-write",
    Find => "find",
    IorEasyRead => "ior-easy-read",
    MdtestEasyStat => "mdtest-easy-stat",
    IorHardRead => "ior-hard-read",
    MdtestHardStat => "mdtest-hard-stat",
    MdtestEasyDelete => "mdtest-easy-delete",
    MdtestHardRead => "mdtest-hard-read",
    MdtestHardDelete => "mdtest-hard-delete",
    Score => "score",
    Cleanup => "cleanup",
}

use Phase::*;

/// The twelve measured phases in IO500's order: all but the first and the last two.
const MEASURED: &[Phase] = Phase::ORDER.split_at(1).1.split_at(12).0;

impl Phase {
    /// The phase called `name`.
    pub fn parse(name: &str) -> Option<Phase> {
        Self::ORDER.into_iter().find(|p| p.name() == name)
    }

    /// Every phase name, comma-separated (for error messages).
    pub fn names() -> String {
        Self::ORDER.map(Phase::name).join(", ")
    }

    /// The phases that must have finished before this one: the writes a read, stat or find
    /// checks; find before the deletes (it counts the files they remove); the other
    /// phases on the same files before a delete; all twelve before `score`.
    pub fn needs(self) -> &'static [Phase] {
        match self {
            Setup => &[],
            IorEasyWrite | MdtestEasyWrite | IorHardWrite | MdtestHardWrite => &[Setup],
            Find => &[IorEasyWrite, MdtestEasyWrite, IorHardWrite, MdtestHardWrite],
            IorEasyRead => &[IorEasyWrite],
            MdtestEasyStat => &[MdtestEasyWrite],
            IorHardRead => &[IorHardWrite],
            MdtestHardStat | MdtestHardRead => &[MdtestHardWrite],
            MdtestEasyDelete => &[MdtestEasyWrite, MdtestEasyStat, Find],
            MdtestHardDelete => &[MdtestHardWrite, MdtestHardStat, MdtestHardRead, Find],
            Score => MEASURED,
            Cleanup => &[Score],
        }
    }

    /// The phase run just before this one in IO500's order (`None` for `setup`). IO500 runs
    /// its phases one at a time in that order, so a measured phase also refuses to start
    /// before its predecessor ran, data dependency or not.
    pub fn previous(self) -> Option<Phase> {
        let at = Self::ORDER.iter().position(|p| *p == self)?;
        at.checked_sub(1).map(|i| Self::ORDER[i])
    }
}

/// What one phase left.
#[derive(Debug, Clone)]
pub enum PhaseOutcome {
    /// `setup` or `cleanup` ran.
    Done(Phase),
    /// A measured phase ran.
    Measured(PhaseResult),
    /// `score` gathered the run's report.
    Report(RunReport),
}

/// What a measured phase keeps for later phases (`state/<phase>.json`).
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    name: String,
    value: f64,
    unit: Unit,
    seconds: f64,
    ops: u64,
    bytes: u64,
    errors: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    round_trips: Option<u64>,
    /// Per task: transfers (ior) or files (mdtest) written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    written: Vec<u64>,
    /// find: (found, expected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    found_expected: Option<(u64, u64)>,
}

impl Saved {
    fn new(result: &PhaseResult, written: Vec<u64>, found_expected: Option<(u64, u64)>) -> Self {
        Self {
            name: result.name.to_string(),
            value: result.value,
            unit: result.unit,
            seconds: result.seconds,
            ops: result.ops,
            bytes: result.bytes,
            errors: result.errors,
            round_trips: result.round_trips,
            written,
            found_expected,
        }
    }

    fn result(&self, phase: Phase) -> PhaseResult {
        PhaseResult {
            name: phase.name(),
            value: self.value,
            unit: self.unit,
            seconds: self.seconds,
            ops: self.ops,
            bytes: self.bytes,
            errors: self.errors,
            round_trips: self.round_trips,
            valid: true,
            invalid_because: Vec::new(),
        }
    }
}

/// Runs `phase` of the run `config.run_seed` against `backend`.
pub fn run_phase<B: Io500Backend>(
    backend: &B,
    config: &Config,
    phase: Phase,
) -> Result<PhaseOutcome, Io500Error> {
    with_ctx(backend, config, |ctx| match phase {
        Setup => {
            make_tree(ctx)?;
            let dir = ctx.layout.state_dir();
            backend
                .mkdir(&dir)
                .map_err(io_context("setup", "mkdir", &dir))?;
            make_timestamp(ctx)?;
            Ok(PhaseOutcome::Done(Setup))
        }
        Score => gather(ctx).map(PhaseOutcome::Report),
        Cleanup => {
            remove_tree(backend, ctx.layout.root())?;
            Ok(PhaseOutcome::Done(Cleanup))
        }
        measured => {
            let saved = measure(ctx, measured)?;
            save(ctx, measured, &saved)?;
            Ok(PhaseOutcome::Measured(saved.result(measured)))
        }
    })
}

/// Runs a measured phase on what its inputs left.
fn measure<B: Io500Backend>(ctx: &Ctx<B>, phase: Phase) -> Result<Saved, Io500Error> {
    for &before in phase.needs().iter().chain(phase.previous().as_ref()) {
        if before != Setup {
            load(ctx, before)?;
        }
    }
    let written = |p: Phase| load(ctx, p).map(|s| s.written);
    let plain = |r: Result<PhaseResult, Io500Error>| r.map(|r| Saved::new(&r, Vec::new(), None));
    let follow = |shape, action, files: Vec<u64>| {
        plain(
            counted(ctx, || {
                mdtest::follow_up(ctx, shape, action, &files).map(|r| (r, ()))
            })
            .map(|r| r.0),
        )
    };
    let wrote = |r: Result<(PhaseResult, Vec<u64>), Io500Error>| {
        r.map(|(result, counts)| Saved::new(&result, counts, None))
    };
    match phase {
        IorEasyWrite => wrote(counted(ctx, || ior::easy_write(ctx))),
        MdtestEasyWrite => wrote(counted(ctx, || mdtest::write(ctx, Shape::Easy))),
        IorHardWrite => wrote(counted(ctx, || ior::hard_write(ctx))),
        MdtestHardWrite => wrote(counted(ctx, || mdtest::write(ctx, Shape::Hard))),
        Find => find_phase(ctx),
        IorEasyRead => {
            let w = written(IorEasyWrite)?;
            plain(counted(ctx, || ior::easy_read(ctx, &w).map(|r| (r, ()))).map(|r| r.0))
        }
        IorHardRead => {
            let w = written(IorHardWrite)?;
            plain(counted(ctx, || ior::hard_read(ctx, &w).map(|r| (r, ()))).map(|r| r.0))
        }
        MdtestEasyStat => follow(Shape::Easy, Action::Stat, written(MdtestEasyWrite)?),
        MdtestHardStat => follow(Shape::Hard, Action::Stat, written(MdtestHardWrite)?),
        MdtestEasyDelete => follow(Shape::Easy, Action::Delete, written(MdtestEasyWrite)?),
        MdtestHardRead => follow(Shape::Hard, Action::Read, written(MdtestHardWrite)?),
        MdtestHardDelete => follow(Shape::Hard, Action::Delete, written(MdtestHardWrite)?),
        Setup | Score | Cleanup => Err(Io500Error::Config(format!(
            "{} is not a measured phase",
            phase.name()
        ))),
    }
}

fn find_phase<B: Io500Backend>(ctx: &Ctx<B>) -> Result<Saved, Io500Error> {
    let (ior_easy, mdtest_easy) = (load(ctx, IorEasyWrite)?, load(ctx, MdtestEasyWrite)?);
    let (ior_hard, mdtest_hard) = (load(ctx, IorHardWrite)?, load(ctx, MdtestHardWrite)?);
    let written = Written {
        ior_easy: &ior_easy.written,
        ior_hard: &ior_hard.written,
        mdtest_easy: &mdtest_easy.written,
        mdtest_hard: &mdtest_hard.written,
    };
    let (expected, present) = written.expected_find();
    let stamp = ctx.layout.timestamp();
    let newer_than = ctx
        .backend
        .stat(&stamp)
        .map_err(io_context("find", "stat", &stamp))?
        .mtime;
    let (result, found) = counted(ctx, || find(ctx, newer_than, expected, present))?;
    Ok(Saved::new(&result, Vec::new(), Some((found, expected))))
}

/// The twelve results and the checks of a whole run.
fn gather<B: Io500Backend>(ctx: &Ctx<B>) -> Result<RunReport, Io500Error> {
    let mut phases = Vec::with_capacity(MEASURED.len());
    let mut find_counts = (0, 0);
    for &phase in MEASURED {
        let saved = load(ctx, phase)?;
        if let Some(fe) = saved.found_expected {
            find_counts = fe;
        }
        phases.push(saved.result(phase));
    }
    let leftover_entries = count_leftovers(ctx)?;
    let report = RunReport {
        backend: ctx.backend.describe(),
        tasks: ctx.config.tasks,
        stonewall_seconds: ctx.config.stonewall.as_secs_f64(),
        score: score(&phases),
        verify_errors: phases.iter().map(|p| p.errors).sum(),
        phases,
        find_found: find_counts.0,
        find_expected: find_counts.1,
        leftover_entries,
        storage_counters: ctx.backend.storage_counters(),
        valid: true,
        invalid_because: Vec::new(),
    };
    let mut report = report;
    super::validity::judge(&mut report, &ctx.config.limits());
    Ok(report)
}

/// Writes `saved` as `state/<phase>.json` (replacing an earlier one: a retried phase).
fn save<B: Io500Backend>(ctx: &Ctx<B>, phase: Phase, saved: &Saved) -> Result<(), Io500Error> {
    let path = ctx.layout.phase_state(phase.name());
    let text = serde_json::to_vec(saved).map_err(|e| inconsistent(phase, e.to_string()))?;
    match ctx.backend.unlink(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_context(phase.name(), "unlink", &path)(e)),
    }
    let b = ctx.backend;
    let file = b
        .create(&path)
        .map_err(io_context(phase.name(), "create", &path))?;
    let wrote = b
        .write_at(&file, 0, &text)
        .and_then(|()| b.sync(&file))
        .map_err(io_context(phase.name(), "write", &path));
    let closed = b
        .close(file)
        .map_err(io_context(phase.name(), "close", &path));
    wrote.and(closed)?;
    // A backend may close behind (acknowledged later): the next phase may be another process.
    b.drain().map_err(io_context(phase.name(), "drain", &path))
}

/// Reads what `phase` left; fails naming it when it has not run (for this run id and task
/// count).
fn load<B: Io500Backend>(ctx: &Ctx<B>, phase: Phase) -> Result<Saved, Io500Error> {
    let path = ctx.layout.phase_state(phase.name());
    let missing = || {
        inconsistent(
            phase,
            format!(
                "phase {} has not run in {} (run id and --tasks must match)",
                phase.name(),
                ctx.layout.root()
            ),
        )
    };
    let b = ctx.backend;
    let size = match b.stat(&path) {
        Ok(stat) => stat.size_bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing()),
        Err(e) => return Err(io_context(phase.name(), "stat", &path)(e)),
    };
    let file = b
        .open(&path)
        .map_err(io_context(phase.name(), "open", &path))?;
    let mut text = vec![0u8; size as usize];
    let read = b.read_at(&file, 0, &mut text);
    b.close(file)
        .map_err(io_context(phase.name(), "close", &path))?;
    let n = read.map_err(io_context(phase.name(), "read", &path))?;
    text.truncate(n);
    let saved: Saved =
        serde_json::from_slice(&text).map_err(|e| inconsistent(phase, format!("{path}: {e}")))?;
    let tasks_ok = saved.written.is_empty() || saved.written.len() == ctx.config.tasks;
    if saved.name != phase.name() || !tasks_ok {
        return Err(missing());
    }
    Ok(saved)
}

fn inconsistent(phase: Phase, what: String) -> Io500Error {
    Io500Error::Inconsistent {
        phase: phase.name(),
        what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io500::layout::Layout;
    use crate::io500::PosixBackend;
    use std::time::Duration;

    fn small_config(run_seed: u64) -> Config {
        // The caps end the write phases, long before the stonewall: exact counts.
        let mut config = Config::new(2, Duration::from_secs(600));
        config.ior_easy_max_transfers = 1;
        config.ior_hard_max_segments = 2;
        config.mdtest_easy_max_files = 4;
        // Index 101 is the first whose name matches find's `*01*`.
        config.mdtest_hard_max_files = 102;
        config.run_seed = run_seed;
        config
    }

    #[test]
    fn every_need_comes_earlier_in_the_order() {
        for (i, phase) in Phase::ORDER.into_iter().enumerate() {
            assert_eq!(Phase::parse(phase.name()), Some(phase));
            for need in phase.needs() {
                let at = Phase::ORDER.iter().position(|p| p == need).unwrap();
                assert!(at < i, "{} needs the later {}", phase.name(), need.name());
            }
        }
        assert_eq!(Phase::parse("all"), None);
    }

    /// Phases one by one, each with a config of its own (as separate processes), give the
    /// report a whole run gives; a phase started before one it needs fails naming it.
    #[test]
    fn phases_one_by_one_make_a_whole_run() {
        let dir = tempfile::tempdir().unwrap();
        let backend = PosixBackend::new(dir.path()).unwrap();
        let run = |phase| run_phase(&backend, &small_config(0x5eed), phase);
        run(Setup).unwrap();
        let early = run(IorEasyRead).unwrap_err().to_string();
        assert!(
            early.contains("phase ior-easy-write has not run"),
            "{early}"
        );
        run(IorEasyWrite).unwrap();
        // IO500's order, not only the data: ior-hard-write needs nothing but setup, yet
        // mdtest-easy-write runs before it.
        let early = run(IorHardWrite).unwrap_err().to_string();
        assert!(
            early.contains("phase mdtest-easy-write has not run"),
            "{early}"
        );
        let mut report = None;
        for phase in &Phase::ORDER[2..] {
            match run(*phase).unwrap() {
                PhaseOutcome::Measured(r) => assert_eq!(r.name, phase.name()),
                PhaseOutcome::Report(r) => report = Some(r),
                PhaseOutcome::Done(p) => assert_eq!(p, *phase),
            }
            if *phase == MdtestEasyStat {
                // Another run id or task count does not see this run's results.
                let mut other = small_config(0x5eed);
                other.tasks = 3;
                let e = run_phase(&backend, &other, MdtestEasyDelete).unwrap_err();
                assert!(e.to_string().contains("has not run"), "{e}");
            }
        }
        let report = report.expect("score ran");
        let names: Vec<_> = report.phases.iter().map(|p| p.name).collect();
        let measured: Vec<_> = MEASURED.iter().map(|p| p.name()).collect();
        assert_eq!(names, measured);
        assert!(report.passed(), "{}", report.table());
        assert_eq!(
            report.find_expected, 2,
            "file.mdtest.0.101 and file.mdtest.1.101"
        );
        assert!(report.score.score > 0.0);
        assert!(!dir.path().join(Layout::new(0x5eed).root()).exists());
    }
}
