//! The calling thread's scheduler statistics: how long it ran (its CPU
//! clock) and how long it waited runnable for a CPU (the second field of
//! `/proc/thread-self/schedstat`, up to date while the thread runs; its first
//! field, the run time, lags by up to a scheduler tick). What is left of
//! a stretch of wall time is time it slept, which tells a lost wake (the
//! thread slept with mail waiting) from a busy machine (it waited for a CPU).

use std::fs::File;
use std::os::unix::fs::FileExt;

/// One reading, in nanoseconds since the thread started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sample {
    pub run: u64,
    pub wait: u64,
}

/// An open handle on one thread's statistics; `None` readings where the
/// kernel has none (built without scheduler info).
pub(crate) struct SchedStat {
    file: Option<File>,
}

impl SchedStat {
    /// Opens the statistics of the calling thread.
    pub fn of_this_thread() -> Self {
        Self {
            file: File::open("/proc/thread-self/schedstat").ok(),
        }
    }

    pub fn sample(&self) -> Option<Sample> {
        let mut buf = [0u8; 96];
        let n = self.file.as_ref()?.read_at(&mut buf, 0).ok()?;
        let wait = parse_wait(&buf[..n])?;
        Some(Sample {
            run: thread_cpu_ns()?,
            wait,
        })
    }
}

/// The calling thread's CPU time.
fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// The wait field of `"<run ns> <wait ns> <timeslices>\n"`.
fn parse_wait(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut fields = text.split_ascii_whitespace().map(str::parse::<u64>);
    fields.next()?.ok()?;
    fields.next()?.ok()
}

/// Nanoseconds of `wall` (between readings `a` and `b`) the thread spent
/// neither running nor waiting for a CPU.
pub(crate) fn slept(a: Sample, b: Sample, wall: u64) -> u64 {
    let busy = b.run.saturating_sub(a.run) + b.wait.saturating_sub(a.wait);
    wall.saturating_sub(busy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_parse_and_a_sleep_is_seen_as_one() {
        assert_eq!(parse_wait(b"12 34 5\n"), Some(34));
        assert_eq!(parse_wait(b"12\n"), None);
        assert_eq!(parse_wait(b"x 1 2"), None);
        let stat = SchedStat::of_this_thread();
        let Some(a) = stat.sample() else {
            return; // no scheduler info in this kernel: nothing to measure
        };
        // Each wall-clock span lies inside its pair of readings, so that a
        // preemption between a reading and the clock counts as waiting.
        let t = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let wall = t.elapsed().as_nanos() as u64;
        let b = stat.sample().unwrap();
        assert!(b.run >= a.run && b.wait >= a.wait);
        let asleep = slept(a, b, wall);
        // It slept 30 ms, unless the machine was too busy to wake it on time.
        let waited = b.wait - a.wait;
        assert!(
            asleep >= 29_000_000 || waited >= 1_000_000,
            "{asleep} {waited}"
        );
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(20) {}
        let wall = spin.elapsed().as_nanos() as u64;
        let c = stat.sample().unwrap();
        // A thread that spun did not sleep, however often it was preempted.
        // The kernel brings a running thread's figures up to date only at
        // ticks and switches, so a reading can lag by a few milliseconds
        // on a loaded machine: half the span is far from a sleep of all of it.
        let spun = slept(b, c, wall);
        assert!(spun < wall / 2, "{spun} of {wall}");
    }
}
