//! The find phase: walk the data tree with all tasks and count the files that are newer than
//! the timestamp file, exactly 3901 bytes, and named `*01*` (IO500's
//! `find DATA -newer timestampfile -size 3901c -name "*01*"`).
//!
//! Tasks share one work queue of directories to list and batches of names to stat, so one
//! huge directory (mdtest-hard) is listed by one task but stat'ed by all. As pfind does, the
//! name is checked first and only matching names are stat'ed. The rate is the number of
//! files examined per second (IO500 scores find by pfind's total files over the runtime).

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::SystemTime;

use super::backend::{EntryKind, FileStat, Io500Backend};
use super::config::MDTEST_HARD_FILE_BYTES;
use super::score::{PhaseResult, Unit};
use super::tasks::{run_tasks, Goal};
use super::{io_context, Ctx, Io500Error};

const NAME: &str = "find";
/// Names stat'ed per work item.
const CHECK_BATCH: usize = 256;

/// The `-name "*01*"` test.
pub(crate) fn name_matches(name: &str) -> bool {
    name.contains("01")
}

/// The `-newer`, `-size 3901c` and regular-file tests.
fn stat_matches(stat: &FileStat, newer_than: SystemTime) -> bool {
    stat.kind == EntryKind::File
        && stat.size_bytes == MDTEST_HARD_FILE_BYTES as u64
        && stat.mtime > newer_than
}

/// How many of the files `(name, size)`, all made after the timestamp, find should report.
pub(crate) fn expected_matches<'a>(files: impl Iterator<Item = (&'a str, u64)>) -> u64 {
    files
        .filter(|(name, size)| name_matches(name) && *size == MDTEST_HARD_FILE_BYTES as u64)
        .count() as u64
}

enum Work {
    List(String),
    Check(Vec<String>),
}

#[derive(Default)]
struct QueueState {
    items: Vec<Work>,
    /// Items queued plus items being worked on.
    pending: usize,
    failed: bool,
}

#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, work: Work) {
        let mut state = self.lock();
        state.items.push(work);
        state.pending += 1;
        self.ready.notify_one();
    }

    /// The next item, or `None` once all work is done or a task failed.
    fn pop(&self) -> Option<Work> {
        let mut state = self.lock();
        loop {
            if state.failed {
                return None;
            }
            if let Some(work) = state.items.pop() {
                return Some(work);
            }
            if state.pending == 0 {
                return None;
            }
            state = self
                .ready
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    fn done(&self) {
        let mut state = self.lock();
        state.pending = state.pending.saturating_sub(1);
        if state.pending == 0 {
            self.ready.notify_all();
        }
    }

    fn fail(&self) {
        self.lock().failed = true;
        self.ready.notify_all();
    }
}

#[derive(Default)]
struct Tally {
    examined: u64,
    found: u64,
}

fn list<B: Io500Backend>(
    ctx: &Ctx<B>,
    queue: &Queue,
    dir: &str,
    newer_than: SystemTime,
    tally: &mut Tally,
) -> Result<(), Io500Error> {
    let mut batch = Vec::new();
    ctx.backend
        .readdir(dir, &mut |entry| {
            // Paths are made only for what goes back on the queue.
            if entry.kind == EntryKind::Directory {
                queue.push(Work::List(format!("{dir}/{}", entry.name)));
                return Ok(());
            }
            tally.examined += 1;
            if !name_matches(&entry.name) {
                return Ok(());
            }
            match entry.stat {
                Some(stat) => tally.found += u64::from(stat_matches(&stat, newer_than)),
                None => batch.push(format!("{dir}/{}", entry.name)),
            }
            if batch.len() >= CHECK_BATCH {
                queue.push(Work::Check(std::mem::take(&mut batch)));
            }
            Ok(())
        })
        .map_err(io_context(NAME, "readdir", dir))?;
    if !batch.is_empty() {
        queue.push(Work::Check(batch));
    }
    Ok(())
}

fn check<B: Io500Backend>(
    ctx: &Ctx<B>,
    paths: &[String],
    newer_than: SystemTime,
) -> Result<u64, Io500Error> {
    let mut found = 0;
    for path in paths {
        let stat = ctx
            .backend
            .stat(path)
            .map_err(io_context(NAME, "stat", path))?;
        found += u64::from(stat_matches(&stat, newer_than));
    }
    Ok(found)
}

/// Runs find over the run's data directory, where `files_present` files exist of which
/// `expected` should match. Returns the phase result (its errors are the difference between
/// found and expected) and the number found.
pub(crate) fn find<B: Io500Backend>(
    ctx: &Ctx<B>,
    newer_than: SystemTime,
    expected: u64,
    files_present: u64,
) -> Result<(PhaseResult, u64), Io500Error> {
    let queue = Queue::default();
    queue.push(Work::List(ctx.layout.data()));
    let progress = ctx.progress(NAME, Unit::KiloIops, Goal::Ops(files_present));
    let (tallies, start) = run_tasks(ctx.config.tasks, &progress, |_task| {
        let mut tally = Tally::default();
        while let Some(work) = queue.pop() {
            let before = tally.examined;
            let outcome = match &work {
                Work::List(dir) => list(ctx, &queue, dir, newer_than, &mut tally),
                Work::Check(paths) => check(ctx, paths, newer_than).map(|n| tally.found += n),
            };
            if let Err(e) = outcome {
                queue.fail();
                return Err(e);
            }
            progress.add(tally.examined - before, 0);
            queue.done();
        }
        Ok(tally)
    })?;
    let seconds = start.elapsed().as_secs_f64();
    let examined = tallies.iter().map(|t| t.examined).sum();
    let found: u64 = tallies.iter().map(|t| t.found).sum();
    let errors = found.abs_diff(expected);
    let result = PhaseResult::rate(NAME, examined, 0, seconds, errors);
    progress.finish(&result);
    Ok((result, found))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn name_size_and_time_must_all_match() {
        assert!(name_matches("file.mdtest.0.101"));
        assert!(name_matches("ior_file_easy.00000001"));
        assert!(!name_matches("file.mdtest.1.10"));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let good = FileStat {
            kind: EntryKind::File,
            size_bytes: 3901,
            mtime: t0 + Duration::from_nanos(1),
        };
        assert!(stat_matches(&good, t0));
        assert!(
            !stat_matches(&FileStat { mtime: t0, ..good }, t0),
            "-newer is strict"
        );
        assert!(!stat_matches(
            &FileStat {
                size_bytes: 3900,
                ..good
            },
            t0
        ));
        assert!(!stat_matches(
            &FileStat {
                kind: EntryKind::Directory,
                ..good
            },
            t0
        ));
    }

    #[test]
    fn expected_counts_only_matching_names_of_the_right_size() {
        let files = [
            ("file.mdtest.0.101", 3901),
            ("file.mdtest.1.201", 3900),
            ("file.mdtest.1.10", 3901),
            ("ior_file_easy.00000001", 2 << 20),
            ("x01", 0),
        ];
        assert_eq!(expected_matches(files.iter().map(|(n, s)| (*n, *s))), 1);
    }
}
