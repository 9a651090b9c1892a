//! Client tasks: N threads started together, the stonewall with IO500's wear-out rule, and the
//! progress line on stderr.
//!
//! # Stonewall rule
//! Each task of a write phase works until the stonewall time has passed since the phase
//! started (or its cap is reached, or any task has stopped). Then every task publishes how
//! many operations it completed, and all tasks continue until each has done the maximum any
//! task reached (IOR `-O stoneWallingWearOut=1`, mdtest's synchronised stonewall). The phase
//! time runs from the common start to the end of the wear-out, so the figure is the data
//! actually written over the time actually spent, and every task ends with the same count.

use std::io::{IsTerminal, Write};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Barrier, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use super::score::{PhaseResult, Unit, GIB};
use super::Io500Error;

/// Live counters of one phase, updated by its tasks and read by the progress line.
#[derive(Debug)]
pub(crate) struct Progress {
    name: &'static str,
    unit: Unit,
    /// What the bar measures: the stonewall for write phases, a total for read phases.
    goal: Goal,
    ops: AtomicU64,
    bytes: AtomicU64,
    live: bool,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Goal {
    Stonewall(Duration),
    Ops(u64),
}

impl Progress {
    /// Counters for phase `name`; `live` draws the line while the phase runs.
    pub(crate) fn new(name: &'static str, unit: Unit, goal: Goal, live: bool) -> Self {
        Self {
            name,
            unit,
            goal,
            ops: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            live,
        }
    }

    /// Counts `ops` more operations that moved `bytes`.
    pub(crate) fn add(&self, ops: u64, bytes: u64) {
        self.ops.fetch_add(ops, Ordering::Relaxed);
        if bytes != 0 {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    fn line(&self, elapsed: Duration) -> String {
        let ops = self.ops.load(Ordering::Relaxed);
        let bytes = self.bytes.load(Ordering::Relaxed);
        let secs = elapsed.as_secs_f64().max(1e-9);
        let (fraction, note) = match self.goal {
            Goal::Stonewall(wall) => {
                let f = secs / wall.as_secs_f64();
                (f.min(1.0), if f >= 1.0 { " wear-out" } else { "" })
            }
            Goal::Ops(total) => ((ops as f64 / total.max(1) as f64).min(1.0), ""),
        };
        let rate = match self.unit {
            Unit::GibPerSecond => format!("{:8.3} GiB/s", bytes as f64 / GIB / secs),
            Unit::KiloIops => format!("{:8.3} kIOPS", ops as f64 / 1000.0 / secs),
        };
        format!(
            "{:<20} [{}] {:7.1}s {:>11} ops {}{}",
            self.name,
            bar(fraction, 24),
            secs,
            ops,
            rate,
            note
        )
    }

    /// The phase's closing line, with its measured figures.
    pub(crate) fn finish(&self, result: &PhaseResult) {
        if !self.live {
            return;
        }
        let line = format!(
            "{:<20} [{}] {:7.1}s {:>11} ops {:8.3} {}",
            result.name,
            bar(1.0, 24),
            result.seconds,
            result.ops,
            result.value,
            result.unit.label()
        );
        let mut err = std::io::stderr().lock();
        if err.is_terminal() {
            let _ = writeln!(err, "\r{line}\x1b[K");
        } else {
            let _ = writeln!(err, "{line}");
        }
    }
}

fn bar(fraction: f64, width: usize) -> String {
    let filled = ((fraction * width as f64).round() as usize).min(width);
    let mut s = "=".repeat(filled);
    if filled < width {
        s.push('>');
        s.push_str(&" ".repeat(width - filled - 1));
    }
    s
}

/// Joins the tasks in order; on failure keeps the root cause (a task that stopped because
/// another failed reports `Aborted`, which the failing task's own error replaces).
fn join_all<T>(
    handles: Vec<thread::ScopedJoinHandle<'_, Result<T, Io500Error>>>,
) -> Result<Vec<T>, Io500Error> {
    let mut results = Vec::with_capacity(handles.len());
    let mut first_error: Option<Io500Error> = None;
    for (task, handle) in handles.into_iter().enumerate() {
        let error = match handle.join() {
            Ok(Ok(value)) => {
                results.push(value);
                continue;
            }
            Ok(Err(e)) => e,
            Err(_) => Io500Error::Thread(format!("task {task} panicked")),
        };
        let replace = match &first_error {
            None => true,
            Some(Io500Error::Aborted { .. }) => !matches!(error, Io500Error::Aborted { .. }),
            Some(_) => false,
        };
        if replace {
            first_error = Some(error);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(results),
    }
}

/// Runs `body(task)` on `tasks` threads that start together. Returns each task's result in
/// task order and the instant they were released. While they run, a reporter thread redraws
/// the progress line every 200 ms if `progress` is live and stderr is a terminal.
///
/// The threads wait behind a gate (a write lock held while spawning) rather than a barrier,
/// so that if one cannot be spawned the others are released, see the abort flag and end.
pub(crate) fn run_tasks<T, F>(
    tasks: usize,
    progress: &Progress,
    body: F,
) -> Result<(Vec<T>, Instant), Io500Error>
where
    T: Send,
    F: Fn(usize) -> Result<T, Io500Error> + Sync,
{
    let gate = RwLock::new(());
    let abort = AtomicBool::new(false);
    let draw = progress.live && std::io::stderr().is_terminal();
    thread::scope(|scope| {
        let held = gate
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut handles = Vec::with_capacity(tasks);
        for task in 0..tasks {
            let (body, gate, abort) = (&body, &gate, &abort);
            let spawned = thread::Builder::new()
                .name(format!("io500-{task}"))
                .spawn_scoped(scope, move || {
                    drop(gate.read().unwrap_or_else(|poisoned| poisoned.into_inner()));
                    if abort.load(Ordering::Relaxed) {
                        return Err(Io500Error::Thread("a sibling task did not start".into()));
                    }
                    body(task)
                });
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    abort.store(true, Ordering::Relaxed);
                    drop(held);
                    return Err(Io500Error::Thread(format!("spawn task {task}: {e}")));
                }
            }
        }
        let start = Instant::now();
        drop(held);
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        if draw {
            scope.spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) =
                    stop_rx.recv_timeout(Duration::from_millis(200))
                {
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "\r{}\x1b[K", progress.line(start.elapsed()));
                    let _ = err.flush();
                }
            });
        }
        let results = join_all(handles);
        drop(stop_tx);
        results.map(|r| (r, start))
    })
}

/// The stonewall of one write phase, shared by its tasks (see the module guide).
#[derive(Debug)]
pub(crate) struct Stonewall {
    duration: Duration,
    cap: u64,
    stop: AtomicBool,
    failed: AtomicBool,
    reached: Vec<AtomicU64>,
    barrier: Barrier,
}

impl Stonewall {
    /// A stonewall of `duration` for `tasks` tasks, each doing at most `cap` operations.
    pub(crate) fn new(duration: Duration, cap: u64, tasks: usize) -> Self {
        Self {
            duration,
            cap,
            stop: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            reached: (0..tasks).map(|_| AtomicU64::new(0)).collect(),
            barrier: Barrier::new(tasks),
        }
    }

    /// For a task that failed before its first operation (e.g. its create failed): takes
    /// its part in the wear-out barrier so the others are released, and returns `error`.
    pub(crate) fn fail(&self, error: Io500Error) -> Result<u64, Io500Error> {
        self.failed.store(true, Ordering::Relaxed);
        self.stop.store(true, Ordering::Relaxed);
        self.barrier.wait();
        Err(error)
    }

    /// Runs `op(0)`, `op(1)`, ... for task `task` under the stonewall rule and returns how
    /// many operations it completed (the same for every task when all succeed). Every task
    /// of the phase must call this exactly once, or the others wait forever at the wear-out
    /// barrier.
    pub(crate) fn run(
        &self,
        task: usize,
        mut op: impl FnMut(u64) -> Result<(), Io500Error>,
        phase: &'static str,
    ) -> Result<u64, Io500Error> {
        self.run_groups(task, 1, |range| op(range.start), phase)
    }

    /// [`run`](Self::run) with the operations handed out in groups of up to `group`
    /// consecutive indices (fewer at the cap and at the end of the wear-out), for a backend
    /// that keeps a group's operations in flight together. The clock is checked after each
    /// group, and a group counts only once `op` returned for all of it.
    pub(crate) fn run_groups(
        &self,
        task: usize,
        group: u64,
        mut op: impl FnMut(Range<u64>) -> Result<(), Io500Error>,
        phase: &'static str,
    ) -> Result<u64, Io500Error> {
        let group = group.max(1);
        let deadline = Instant::now() + self.duration;
        let cap = self.cap.max(1);
        let mut done = 0u64;
        let mut error = None;
        // Like IOR, the clock is checked after each operation, so every task does at least one.
        while done < cap {
            let range = done..cap.min(done.saturating_add(group));
            // A panicking backend call becomes an error, so this task still reaches the
            // wear-out barrier and the others are not left waiting for it.
            let outcome =
                catch_unwind(AssertUnwindSafe(|| op(range.clone()))).unwrap_or_else(|_| {
                    Err(Io500Error::Thread(format!("{phase}: task {task} panicked")))
                });
            if let Err(e) = outcome {
                error = Some(e);
                self.failed.store(true, Ordering::Relaxed);
                self.stop.store(true, Ordering::Relaxed);
                break;
            }
            done = range.end;
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            if Instant::now() >= deadline {
                self.stop.store(true, Ordering::Relaxed);
                break;
            }
        }
        if let Some(slot) = self.reached.get(task) {
            slot.store(done, Ordering::Relaxed);
        }
        self.barrier.wait();
        if let Some(e) = error {
            return Err(e);
        }
        if self.failed.load(Ordering::Relaxed) {
            return Err(Io500Error::Aborted { phase });
        }
        let target = self
            .reached
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .max()
            .unwrap_or(done);
        while done < target {
            let range = done..target.min(done.saturating_add(group));
            op(range.clone())?;
            done = range.end;
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn quiet(goal: Goal) -> Progress {
        Progress::new("test", Unit::KiloIops, goal, false)
    }

    #[test]
    fn wear_out_brings_every_task_to_the_max_count() {
        // Task 0's first operations are slow, so it has done few when the stonewall passes;
        // task 1 runs fast (up to the cap). After the wear-out both end at the same count.
        let tasks = 2;
        let wall = Stonewall::new(Duration::from_millis(20), 5_000, tasks);
        let progress = quiet(Goal::Stonewall(Duration::from_millis(20)));
        let (counts, _) = run_tasks(tasks, &progress, |task| {
            wall.run(
                task,
                |i| {
                    if task == 0 && i < 3 {
                        thread::sleep(Duration::from_millis(10));
                    }
                    progress.add(1, 0);
                    Ok(())
                },
                "test",
            )
        })
        .unwrap();
        assert_eq!(counts[0], counts[1]);
        assert!(counts[0] >= 1);
        assert_eq!(progress.ops.load(Ordering::Relaxed), counts[0] * 2);
    }

    #[test]
    fn groups_cover_every_index_once_up_to_the_cap_and_after_the_wear_out() {
        // Task 0 is slow at first, so the wear-out has it catch up in groups too; the
        // cap cuts the last group short.
        let tasks = 2;
        let wall = Stonewall::new(Duration::from_millis(20), 101, tasks);
        let progress = quiet(Goal::Stonewall(Duration::from_millis(20)));
        let (ranges, _) = run_tasks(tasks, &progress, |task| {
            let mut seen = Vec::new();
            let done = wall.run_groups(
                task,
                8,
                |r| {
                    if task == 0 && r.start < 16 {
                        thread::sleep(Duration::from_millis(10));
                    }
                    seen.push(r);
                    Ok(())
                },
                "test",
            )?;
            Ok((done, seen))
        })
        .unwrap();
        assert_eq!(ranges[0].0, ranges[1].0);
        for (done, seen) in ranges {
            assert!(done <= 101);
            let mut next = 0;
            for r in seen {
                assert_eq!(r.start, next);
                assert!(r.end > r.start && r.end - r.start <= 8, "{r:?}");
                next = r.end;
            }
            assert_eq!(next, done);
        }
    }

    #[test]
    fn cap_stops_before_the_stonewall() {
        let wall = Stonewall::new(Duration::from_secs(600), 7, 3);
        let progress = quiet(Goal::Ops(21));
        let (counts, _) = run_tasks(3, &progress, |task| wall.run(task, |_| Ok(()), "t")).unwrap();
        assert_eq!(counts, vec![7, 7, 7]);
    }

    #[test]
    fn a_failing_task_stops_all_and_reports_its_error() {
        let wall = Stonewall::new(Duration::from_secs(600), u64::MAX, 2);
        let progress = quiet(Goal::Ops(1));
        let calls = AtomicUsize::new(0);
        let err = run_tasks(2, &progress, |task| {
            wall.run(
                task,
                |i| {
                    calls.fetch_add(1, Ordering::Relaxed);
                    if task == 1 && i == 3 {
                        Err(Io500Error::Config("injected".into()))
                    } else {
                        Ok(())
                    }
                },
                "t",
            )
        })
        .unwrap_err();
        assert!(err.to_string().contains("injected"), "{err}");
        assert!(calls.load(Ordering::Relaxed) >= 4);
    }

    #[test]
    fn a_panicking_operation_becomes_an_error_instead_of_a_hang() {
        let wall = Stonewall::new(Duration::from_secs(600), 50, 2);
        let progress = quiet(Goal::Ops(1));
        let err = run_tasks(2, &progress, |task| {
            wall.run(
                task,
                |i| {
                    assert!(!(task == 0 && i == 2), "injected panic");
                    Ok(())
                },
                "t",
            )
        })
        .unwrap_err();
        assert!(err.to_string().contains("task 0 panicked"), "{err}");
    }

    #[test]
    fn bar_is_full_width_at_every_fraction() {
        for f in [0.0, 0.3, 0.99, 1.0, 2.0] {
            assert_eq!(bar(f, 10).len(), 10);
        }
        assert_eq!(bar(1.0, 4), "====");
        assert_eq!(bar(0.0, 4), ">   ");
    }
}
