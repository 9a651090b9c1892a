//! The mdtest phases: easy (empty files, a directory per task) and hard (3901-byte files in
//! one shared directory). Writes run under the stonewall; stat, read and delete phases work
//! on the neighbour task's files, all of them.

use super::backend::{EntryKind, Io500Backend};
use super::config::{MDTEST_FILES_PER_GROUP as FILES_PER_GROUP, MDTEST_HARD_FILE_BYTES};
use super::layout::{neighbour, Layout};
use super::pattern::{file_key, fill, verify_read};
use super::score::{PhaseResult, Unit};
use super::tasks::{run_tasks, Goal, Progress, Stonewall};
use super::{io_context, Ctx, Io500Error};
use std::ops::Range;

/// Pattern tag of mdtest-hard files.
const TAG_HARD: u8 = 3;

/// How many files each task created (equal for all tasks after the wear-out).
pub(crate) type Files = Vec<u64>;

/// Which of the two mdtest shapes a phase works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Easy,
    Hard,
}

impl Shape {
    fn path(self, layout: &Layout, task: usize, index: u64) -> String {
        match self {
            Shape::Easy => layout.mdtest_easy_file(task, index),
            Shape::Hard => layout.mdtest_hard_file(task, index),
        }
    }

    fn file_bytes(self) -> u64 {
        match self {
            Shape::Easy => 0,
            Shape::Hard => MDTEST_HARD_FILE_BYTES as u64,
        }
    }
}

/// mdtest-easy-write and mdtest-hard-write: create (and for hard, write 3901 bytes into)
/// files until the stonewall.
pub(crate) fn write<B: Io500Backend>(
    ctx: &Ctx<B>,
    shape: Shape,
) -> Result<(PhaseResult, Files), Io500Error> {
    let (name, cap) = match shape {
        Shape::Easy => ("mdtest-easy-write", ctx.config.mdtest_easy_max_files),
        Shape::Hard => ("mdtest-hard-write", ctx.config.mdtest_hard_max_files),
    };
    let config = ctx.config;
    let progress = ctx.progress(name, Unit::KiloIops, Goal::Stonewall(config.stonewall));
    let wall = Stonewall::new(config.stonewall, cap, config.tasks);
    let bytes = shape.file_bytes();
    let (counts, start) = run_tasks(config.tasks, &progress, |task| {
        let mut bufs = vec![vec![0u8; bytes as usize]; FILES_PER_GROUP as usize];
        let step = |indices: Range<u64>| {
            let count = indices.end - indices.start;
            for (index, buf) in indices.clone().zip(bufs.iter_mut()) {
                if shape == Shape::Hard {
                    fill(
                        buf,
                        file_key(config.run_seed, TAG_HARD, task as u32, index),
                        0,
                    );
                }
            }
            let files: Vec<(String, &[u8])> = indices
                .map(|index| shape.path(ctx.layout, task, index))
                .zip(bufs.iter().map(Vec::as_slice))
                .collect();
            for ((path, _), result) in files.iter().zip(ctx.backend.create_files(&files)) {
                result.map_err(|e| io_context(name, e.op, path)(e.error))?;
            }
            progress.add(count, count * bytes);
            Ok(())
        };
        let done = wall.run_groups(task, FILES_PER_GROUP, step, name)?;
        ctx.backend
            .drain()
            .map_err(io_context(name, "drain", ctx.layout.root()))?;
        Ok(done)
    })?;
    let seconds = start.elapsed().as_secs_f64();
    let ops: u64 = counts.iter().sum();
    let result = PhaseResult::rate(name, ops, ops * bytes, seconds, 0);
    progress.finish(&result);
    Ok((result, counts))
}

/// What a follow-up phase does to each of the neighbour's files; returns errors found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Stat and check kind and size.
    Stat,
    /// Open, read all 3901 bytes, verify, close (hard only).
    Read,
    /// Unlink.
    Delete,
}

fn phase_name(shape: Shape, action: Action) -> &'static str {
    match (shape, action) {
        (Shape::Easy, Action::Stat) => "mdtest-easy-stat",
        (Shape::Hard, Action::Stat) => "mdtest-hard-stat",
        (Shape::Easy, Action::Read) => "mdtest-easy-read",
        (Shape::Hard, Action::Read) => "mdtest-hard-read",
        (Shape::Easy, Action::Delete) => "mdtest-easy-delete",
        (Shape::Hard, Action::Delete) => "mdtest-hard-delete",
    }
}

/// Bytes a follow-up phase reads per file: the file's, in the read phase.
fn read_bytes(shape: Shape, action: Action) -> u64 {
    match action {
        Action::Read => shape.file_bytes(),
        Action::Stat | Action::Delete => 0,
    }
}

/// A follow-up phase's work for one task: stats, reads or unlinks files `0..count` of
/// task `source`, handed to the backend [`FILES_PER_GROUP`] at a time. Returns the
/// verification errors found.
fn in_groups<B: Io500Backend>(
    ctx: &Ctx<B>,
    (name, shape, action): (&'static str, Shape, Action),
    source: usize,
    count: u64,
    progress: &Progress,
) -> Result<u64, Io500Error> {
    // A buffer one byte longer than the file: a longer file shows up as an error.
    let mut bufs = match action {
        Action::Read => vec![vec![0u8; shape.file_bytes() as usize + 1]; FILES_PER_GROUP as usize],
        _ => Vec::new(),
    };
    let bytes_each = read_bytes(shape, action);
    let mut errors = 0;
    let mut first = 0;
    while first < count {
        let last = count.min(first + FILES_PER_GROUP);
        let paths: Vec<String> = (first..last)
            .map(|index| shape.path(ctx.layout, source, index))
            .collect();
        errors += match action {
            Action::Delete => {
                for (path, result) in paths.iter().zip(ctx.backend.unlink_files(&paths)) {
                    result.map_err(io_context(name, "unlink", path))?;
                }
                0
            }
            Action::Stat => stat_group(ctx, (name, shape), &paths)?,
            Action::Read => {
                let bufs = &mut bufs[..paths.len()];
                read_group(ctx, (name, shape), (source, first), &paths, bufs)?
            }
        };
        progress.add(last - first, (last - first) * bytes_each);
        first = last;
    }
    Ok(errors)
}

/// Stats `paths`; returns how many are not a file of the shape's size.
fn stat_group<B: Io500Backend>(
    ctx: &Ctx<B>,
    (name, shape): (&'static str, Shape),
    paths: &[String],
) -> Result<u64, Io500Error> {
    let mut errors = 0;
    for (path, result) in paths.iter().zip(ctx.backend.stat_files(paths)) {
        let stat = result.map_err(io_context(name, "stat", path))?;
        errors += u64::from(stat.kind != EntryKind::File);
        errors += u64::from(stat.size_bytes != shape.file_bytes());
    }
    Ok(errors)
}

/// Reads `paths`, the files `first..` of task `source`, and verifies their bytes; returns
/// the verification errors.
fn read_group<B: Io500Backend>(
    ctx: &Ctx<B>,
    (name, shape): (&'static str, Shape),
    (source, first): (usize, u64),
    paths: &[String],
    bufs: &mut [Vec<u8>],
) -> Result<u64, Io500Error> {
    let expected = shape.file_bytes() as usize;
    let mut errors = 0;
    let results = ctx.backend.read_files(paths, bufs);
    for (i, (result, buf)) in results.into_iter().zip(bufs.iter()).enumerate() {
        let got = result.map_err(|e| io_context(name, e.op, &paths[i])(e.error))?;
        let key = file_key(
            ctx.config.run_seed,
            TAG_HARD,
            source as u32,
            first + i as u64,
        );
        errors += verify_read(&buf[..got.min(expected)], expected, key, 0);
        errors += got.saturating_sub(expected) as u64;
    }
    Ok(errors)
}

/// mdtest-*-stat, mdtest-hard-read, mdtest-*-delete: every task handles all of its
/// neighbour's files.
pub(crate) fn follow_up<B: Io500Backend>(
    ctx: &Ctx<B>,
    shape: Shape,
    action: Action,
    created: &Files,
) -> Result<PhaseResult, Io500Error> {
    let name = phase_name(shape, action);
    let config = ctx.config;
    let total: u64 = created.iter().sum();
    let progress: Progress = ctx.progress(name, Unit::KiloIops, Goal::Ops(total));
    let bytes_each = read_bytes(shape, action);
    let (errors, start) = run_tasks(config.tasks, &progress, |task| {
        let source = neighbour(task, config.tasks);
        let count = created.get(source).copied().unwrap_or(0);
        let errors = in_groups(ctx, (name, shape, action), source, count, &progress)?;
        ctx.backend
            .drain()
            .map_err(io_context(name, "drain", ctx.layout.root()))?;
        Ok(errors)
    })?;
    let seconds = start.elapsed().as_secs_f64();
    let errors = errors.iter().sum();
    let result = PhaseResult::rate(name, total, total * bytes_each, seconds, errors);
    progress.finish(&result);
    Ok(result)
}
