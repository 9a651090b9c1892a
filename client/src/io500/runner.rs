//! The whole run: make the tree, take the timestamp, run the twelve phases in IO500's order,
//! check what is left, clean up.

use std::time::{Duration, SystemTime};

use super::backend::{EntryKind, Io500Backend};
use super::config::{Config, IOR_EASY_TRANSFER_BYTES, IOR_HARD_TRANSFER_BYTES};
use super::find::{expected_matches, find};
use super::ior::{self, Transfers};
use super::layout::Layout;
use super::mdtest::{self, Action, Files, Shape};
use super::report::RunReport;
use super::score::{score, PhaseResult};
use super::{io_context, Ctx, Io500Error};

const SETUP: &str = "setup";
const CHECK: &str = "check";
const CLEANUP: &str = "cleanup";
/// Bound on the wait for the backend's clock to move past the timestamp file's mtime.
const CLOCK_PROBES: usize = 2000;

/// Runs every phase against `backend` and returns the report. Unless `config.keep`, the run
/// directory is removed afterwards, also when a phase failed.
pub fn run<B: Io500Backend>(backend: &B, config: &Config) -> Result<RunReport, Io500Error> {
    with_ctx(backend, config, |ctx| {
        let made = make_tree(ctx);
        let outcome = made.and_then(|()| run_phases(ctx));
        let cleanup = if config.keep {
            Ok(())
        } else {
            remove_tree(backend, ctx.layout.root())
        };
        let report = outcome?;
        cleanup?;
        Ok(report)
    })
}

/// Checks `config` and calls `f` with the context of its run.
pub(super) fn with_ctx<B: Io500Backend, T>(
    backend: &B,
    config: &Config,
    f: impl FnOnce(&Ctx<B>) -> Result<T, Io500Error>,
) -> Result<T, Io500Error> {
    config.validate()?;
    let layout = Layout::new(config.run_seed);
    f(&Ctx {
        backend,
        config,
        layout: &layout,
    })
}

pub(super) fn make_tree<B: Io500Backend>(ctx: &Ctx<B>) -> Result<(), Io500Error> {
    let layout = ctx.layout;
    let mut dirs = vec![
        layout.root().to_string(),
        layout.data(),
        layout.ior_easy_dir(),
        layout.ior_hard_dir(),
        layout.mdtest_easy_dir(),
        layout.mdtest_hard_dir(),
    ];
    dirs.extend((0..ctx.config.tasks).map(|t| layout.mdtest_easy_task_dir(t)));
    for dir in dirs {
        ctx.backend
            .mkdir(&dir)
            .map_err(io_context(SETUP, "mkdir", &dir))?;
    }
    Ok(())
}

fn create_and_stat<B: Io500Backend>(backend: &B, path: &str) -> Result<SystemTime, Io500Error> {
    let file = backend
        .create(path)
        .map_err(io_context(SETUP, "create", path))?;
    backend
        .close(file)
        .map_err(io_context(SETUP, "close", path))?;
    let stat = backend
        .stat(path)
        .map_err(io_context(SETUP, "stat", path))?;
    Ok(stat.mtime)
}

/// Creates the timestamp file and returns its mtime, after waiting until files created now
/// get a later mtime (file systems stamp files with a coarse clock; without the wait a file
/// made within the same tick would not be `-newer`).
pub(super) fn make_timestamp<B: Io500Backend>(ctx: &Ctx<B>) -> Result<SystemTime, Io500Error> {
    let stamp = create_and_stat(ctx.backend, &ctx.layout.timestamp())?;
    let probe = format!("{}/clockprobe", ctx.layout.root());
    for _ in 0..CLOCK_PROBES {
        let later = create_and_stat(ctx.backend, &probe)?;
        ctx.backend
            .unlink(&probe)
            .map_err(io_context(SETUP, "unlink", &probe))?;
        if later > stamp {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(stamp)
}

/// What the write phases left, for find's expected count.
pub(super) struct Written<'a> {
    pub(super) ior_easy: &'a Transfers,
    pub(super) ior_hard: &'a Transfers,
    pub(super) mdtest_easy: &'a Files,
    pub(super) mdtest_hard: &'a Files,
}

impl Written<'_> {
    /// Find's expected matches and the number of files present.
    pub(super) fn expected_find(&self) -> (u64, u64) {
        let mut files: Vec<(String, u64)> = Vec::new();
        for (task, &n) in self.ior_easy.iter().enumerate() {
            files.push((
                Layout::ior_easy_name(task),
                n * IOR_EASY_TRANSFER_BYTES as u64,
            ));
        }
        let hard_bytes: u64 = self.ior_hard.iter().sum::<u64>() * IOR_HARD_TRANSFER_BYTES as u64;
        files.push((Layout::IOR_HARD_NAME.to_string(), hard_bytes));
        for (created, shape_bytes) in [(self.mdtest_easy, 0u64), (self.mdtest_hard, 3901)] {
            for (task, &n) in created.iter().enumerate() {
                files.extend((0..n).map(|i| (Layout::mdtest_name(task, i), shape_bytes)));
            }
        }
        let expected = expected_matches(files.iter().map(|(n, s)| (n.as_str(), *s)));
        (expected, files.len() as u64)
    }
}

/// A phase after find: nothing to hand on but its result.
type LaterPhase<'a> = Box<dyn Fn() -> Result<(PhaseResult, ()), Io500Error> + 'a>;

/// Runs one phase and notes the backend's round trips during it in its result.
pub(super) fn counted<B: Io500Backend, T>(
    ctx: &Ctx<B>,
    phase: impl FnOnce() -> Result<(PhaseResult, T), Io500Error>,
) -> Result<(PhaseResult, T), Io500Error> {
    let before = ctx.backend.round_trips();
    let (mut result, rest) = phase()?;
    if let (Some(b), Some(a)) = (before, ctx.backend.round_trips()) {
        result.round_trips = Some(a.saturating_sub(b));
    }
    Ok((result, rest))
}

fn run_phases<B: Io500Backend>(ctx: &Ctx<B>) -> Result<RunReport, Io500Error> {
    let newer_than = make_timestamp(ctx)?;
    let mut phases = Vec::with_capacity(12);
    let (result, ior_easy) = counted(ctx, || ior::easy_write(ctx))?;
    phases.push(result);
    let (result, mdtest_easy) = counted(ctx, || mdtest::write(ctx, Shape::Easy))?;
    phases.push(result);
    let (result, ior_hard) = counted(ctx, || ior::hard_write(ctx))?;
    phases.push(result);
    let (result, mdtest_hard) = counted(ctx, || mdtest::write(ctx, Shape::Hard))?;
    phases.push(result);
    let written = Written {
        ior_easy: &ior_easy,
        ior_hard: &ior_hard,
        mdtest_easy: &mdtest_easy,
        mdtest_hard: &mdtest_hard,
    };
    let (find_expected, files_present) = written.expected_find();
    let (result, find_found) =
        counted(ctx, || find(ctx, newer_than, find_expected, files_present))?;
    phases.push(result);
    let plain = |r: PhaseResult| (r, ());
    let follow =
        |shape, action, files| move || mdtest::follow_up(ctx, shape, action, files).map(plain);
    let rest: [LaterPhase<'_>; 7] = [
        Box::new(|| ior::easy_read(ctx, &ior_easy).map(plain)),
        Box::new(follow(Shape::Easy, Action::Stat, &mdtest_easy)),
        Box::new(|| ior::hard_read(ctx, &ior_hard).map(plain)),
        Box::new(follow(Shape::Hard, Action::Stat, &mdtest_hard)),
        Box::new(follow(Shape::Easy, Action::Delete, &mdtest_easy)),
        Box::new(follow(Shape::Hard, Action::Read, &mdtest_hard)),
        Box::new(follow(Shape::Hard, Action::Delete, &mdtest_hard)),
    ];
    for phase in rest {
        phases.push(counted(ctx, phase)?.0);
    }
    let leftover_entries = count_leftovers(ctx)?;
    let verify_errors = phases.iter().map(|p| p.errors).sum();
    let mut report = RunReport {
        backend: ctx.backend.describe(),
        tasks: ctx.config.tasks,
        stonewall_seconds: ctx.config.stonewall.as_secs_f64(),
        score: score(&phases),
        phases,
        find_found,
        find_expected,
        verify_errors,
        leftover_entries,
        storage_counters: ctx.backend.storage_counters(),
        valid: true,
        invalid_because: Vec::new(),
    };
    super::validity::judge(&mut report, &ctx.config.limits());
    Ok(report)
}

fn count_entries<B: Io500Backend>(backend: &B, dir: &str) -> Result<u64, Io500Error> {
    let mut n = 0u64;
    backend
        .readdir(dir, &mut |_| {
            n += 1;
            Ok(())
        })
        .map_err(io_context(CHECK, "readdir", dir))?;
    Ok(n)
}

/// Entries still in the mdtest directories after the delete phases (must be none).
pub(super) fn count_leftovers<B: Io500Backend>(ctx: &Ctx<B>) -> Result<u64, Io500Error> {
    let mut left = count_entries(ctx.backend, &ctx.layout.mdtest_hard_dir())?;
    for task in 0..ctx.config.tasks {
        left += count_entries(ctx.backend, &ctx.layout.mdtest_easy_task_dir(task))?;
    }
    Ok(left)
}

/// Removes `dir` and everything under it.
pub(super) fn remove_tree<B: Io500Backend>(backend: &B, dir: &str) -> Result<(), Io500Error> {
    let mut entries = Vec::new();
    backend
        .readdir(dir, &mut |entry| {
            entries.push((entry.name, entry.kind));
            Ok(())
        })
        .map_err(io_context(CLEANUP, "readdir", dir))?;
    for (name, kind) in entries {
        let path = format!("{dir}/{name}");
        if kind == EntryKind::Directory {
            remove_tree(backend, &path)?;
        } else {
            backend
                .unlink(&path)
                .map_err(io_context(CLEANUP, "unlink", &path))?;
        }
    }
    backend
        .rmdir(dir)
        .map_err(io_context(CLEANUP, "rmdir", dir))
}
