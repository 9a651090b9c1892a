//! The four ior phases: easy (a file per task, 2 MiB transfers) and hard (one shared file,
//! 47008-byte transfers, segment-interleaved by task like IOR `-s`: segment `s` of task `t`
//! is at offset `(s * tasks + t) * 47008`).

use std::time::Instant;

use super::backend::Io500Backend;
use super::config::{IOR_EASY_TRANSFER_BYTES, IOR_HARD_TRANSFER_BYTES};
use super::layout::neighbour;
use super::pattern::{file_key, fill, verify_read};
use super::score::{PhaseResult, Unit};
use super::tasks::{run_tasks, Goal, Progress, Stonewall};
use super::{io_context, Ctx, Io500Error};

/// Pattern tag of ior-easy files.
const TAG_EASY: u8 = 1;
/// Pattern tag of the ior-hard file.
const TAG_HARD: u8 = 2;

/// How many transfers each task wrote (equal for all tasks after the wear-out).
pub(crate) type Transfers = Vec<u64>;

fn hard_offset(segment: u64, task: usize, tasks: usize) -> u64 {
    (segment * tasks as u64 + task as u64) * IOR_HARD_TRANSFER_BYTES as u64
}

/// One file's transfers within a phase: where errors are reported and what is counted.
struct Transfer<'a, B: Io500Backend> {
    ctx: &'a Ctx<'a, B>,
    phase: &'static str,
    path: &'a str,
    key: u64,
    progress: &'a Progress,
}

impl<B: Io500Backend> Transfer<'_, B> {
    /// Fills `buf` with the pattern for `offset` and writes it there.
    fn write(&self, file: &B::File, buf: &mut [u8], offset: u64) -> Result<(), Io500Error> {
        fill(buf, self.key, offset);
        self.ctx
            .backend
            .write_at(file, offset, buf)
            .map_err(io_context(self.phase, "write_at", self.path))?;
        self.progress.add(1, buf.len() as u64);
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset` and returns how many do not verify.
    fn read(&self, file: &B::File, buf: &mut [u8], offset: u64) -> Result<u64, Io500Error> {
        let got = self
            .ctx
            .backend
            .read_at(file, offset, buf)
            .map_err(io_context(self.phase, "read_at", self.path))?;
        self.progress.add(1, buf.len() as u64);
        Ok(verify_read(&buf[..got], buf.len(), self.key, offset))
    }

    /// Syncs (if `sync`) and closes `file`, reporting the first failure after trying both.
    fn finish(&self, file: B::File, sync: bool) -> Result<(), Io500Error> {
        let synced = if sync {
            self.ctx.backend.sync(&file)
        } else {
            Ok(())
        };
        let closed = self.ctx.backend.close(file);
        synced.map_err(io_context(self.phase, "sync", self.path))?;
        closed.map_err(io_context(self.phase, "close", self.path))
    }
}

/// The phase's result from its transfer count, size, start and errors; draws its last line.
fn result(
    progress: &Progress,
    phase: &'static str,
    (transfers, size): (u64, usize),
    start: Instant,
    errors: u64,
) -> PhaseResult {
    let seconds = start.elapsed().as_secs_f64();
    let bytes = transfers * size as u64;
    let result = PhaseResult::bandwidth(phase, bytes, transfers, seconds, errors);
    progress.finish(&result);
    result
}

/// ior-easy-write: each task writes its own file until the stonewall, then fsyncs it.
pub(crate) fn easy_write<B: Io500Backend>(
    ctx: &Ctx<B>,
) -> Result<(PhaseResult, Transfers), Io500Error> {
    const NAME: &str = "ior-easy-write";
    let config = ctx.config;
    let progress = ctx.progress(NAME, Unit::GibPerSecond, Goal::Stonewall(config.stonewall));
    let wall = Stonewall::new(
        config.stonewall,
        config.ior_easy_max_transfers,
        config.tasks,
    );
    let (counts, start) = run_tasks(config.tasks, &progress, |task| {
        let path = ctx.layout.ior_easy_file(task);
        let file = match ctx.backend.create(&path) {
            Ok(file) => file,
            Err(e) => return wall.fail(io_context(NAME, "create", &path)(e)),
        };
        let key = file_key(config.run_seed, TAG_EASY, task as u32, 0);
        let io = Transfer {
            ctx,
            phase: NAME,
            path: &path,
            key,
            progress: &progress,
        };
        let mut buf = vec![0u8; IOR_EASY_TRANSFER_BYTES];
        let step = |i: u64| io.write(&file, &mut buf, i * IOR_EASY_TRANSFER_BYTES as u64);
        let written = wall.run(task, step, NAME);
        let finished = io.finish(file, true);
        let written = written?;
        finished?;
        Ok(written)
    })?;
    let total = counts.iter().sum();
    let result = result(&progress, NAME, (total, IOR_EASY_TRANSFER_BYTES), start, 0);
    Ok((result, counts))
}

/// ior-easy-read: each task reads back and verifies its neighbour's file.
pub(crate) fn easy_read<B: Io500Backend>(
    ctx: &Ctx<B>,
    written: &Transfers,
) -> Result<PhaseResult, Io500Error> {
    const NAME: &str = "ior-easy-read";
    let config = ctx.config;
    let total: u64 = written.iter().sum();
    let progress = ctx.progress(NAME, Unit::GibPerSecond, Goal::Ops(total));
    let (errors, start) = run_tasks(config.tasks, &progress, |task| {
        let source = neighbour(task, config.tasks);
        let path = ctx.layout.ior_easy_file(source);
        let io = Transfer {
            ctx,
            phase: NAME,
            path: &path,
            key: file_key(config.run_seed, TAG_EASY, source as u32, 0),
            progress: &progress,
        };
        let file = ctx
            .backend
            .open(&path)
            .map_err(io_context(NAME, "open", &path))?;
        let mut buf = vec![0u8; IOR_EASY_TRANSFER_BYTES];
        let count = written.get(source).copied().unwrap_or(0);
        let mut read_all = || -> Result<u64, Io500Error> {
            let mut errors = 0;
            for i in 0..count {
                errors += io.read(&file, &mut buf, i * IOR_EASY_TRANSFER_BYTES as u64)?;
            }
            Ok(errors)
        };
        let errors = read_all();
        let finished = io.finish(file, false);
        let errors = errors?;
        finished?;
        Ok(errors)
    })?;
    let errors = errors.iter().sum();
    Ok(result(
        &progress,
        NAME,
        (total, IOR_EASY_TRANSFER_BYTES),
        start,
        errors,
    ))
}

/// ior-hard-write: all tasks write interleaved segments of one shared file through one
/// shared handle until the stonewall; the file is fsynced once at the end (timed).
pub(crate) fn hard_write<B: Io500Backend>(
    ctx: &Ctx<B>,
) -> Result<(PhaseResult, Transfers), Io500Error> {
    const NAME: &str = "ior-hard-write";
    let config = ctx.config;
    let path = ctx.layout.ior_hard_file();
    let progress = ctx.progress(NAME, Unit::GibPerSecond, Goal::Stonewall(config.stonewall));
    let io = Transfer {
        ctx,
        phase: NAME,
        path: &path,
        key: file_key(config.run_seed, TAG_HARD, 0, 0),
        progress: &progress,
    };
    let file = ctx
        .backend
        .create_shared(&path)
        .map_err(io_context(NAME, "create", &path))?;
    let wall = Stonewall::new(config.stonewall, config.ior_hard_max_segments, config.tasks);
    let outcome = run_tasks(config.tasks, &progress, |task| {
        let mut buf = vec![0u8; IOR_HARD_TRANSFER_BYTES];
        let step = |segment: u64| {
            let offset = hard_offset(segment, task, config.tasks);
            io.write(&file, &mut buf, offset)
        };
        wall.run(task, step, NAME)
    });
    let finished = io.finish(file, true);
    let (counts, start) = outcome?;
    finished?;
    let total = counts.iter().sum();
    let result = result(&progress, NAME, (total, IOR_HARD_TRANSFER_BYTES), start, 0);
    Ok((result, counts))
}

/// ior-hard-read: each task reads back and verifies its neighbour's segments through one
/// shared read handle.
pub(crate) fn hard_read<B: Io500Backend>(
    ctx: &Ctx<B>,
    written: &Transfers,
) -> Result<PhaseResult, Io500Error> {
    const NAME: &str = "ior-hard-read";
    let config = ctx.config;
    let total: u64 = written.iter().sum();
    let path = ctx.layout.ior_hard_file();
    let progress = ctx.progress(NAME, Unit::GibPerSecond, Goal::Ops(total));
    let io = Transfer {
        ctx,
        phase: NAME,
        path: &path,
        key: file_key(config.run_seed, TAG_HARD, 0, 0),
        progress: &progress,
    };
    let file = ctx
        .backend
        .open(&path)
        .map_err(io_context(NAME, "open", &path))?;
    let outcome = run_tasks(config.tasks, &progress, |task| {
        let source = neighbour(task, config.tasks);
        let mut buf = vec![0u8; IOR_HARD_TRANSFER_BYTES];
        let mut errors = 0u64;
        for segment in 0..written.get(source).copied().unwrap_or(0) {
            let offset = hard_offset(segment, source, config.tasks);
            errors += io.read(&file, &mut buf, offset)?;
        }
        Ok(errors)
    });
    let finished = io.finish(file, false);
    let (errors, start) = outcome?;
    finished?;
    let errors = errors.iter().sum();
    Ok(result(
        &progress,
        NAME,
        (total, IOR_HARD_TRANSFER_BYTES),
        start,
        errors,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hard_segments_interleave_without_gaps_or_overlap() {
        let tasks = 3;
        let mut offsets: Vec<u64> = (0..4)
            .flat_map(|s| (0..tasks).map(move |t| hard_offset(s, t, tasks)))
            .collect();
        offsets.sort_unstable();
        for (i, o) in offsets.iter().enumerate() {
            assert_eq!(*o, i as u64 * IOR_HARD_TRANSFER_BYTES as u64);
        }
    }
}
