//! The work of one xstream: `queue_depth` tasks sharing one channel.

use super::Workload;
use ferrite_bdev::{BdevRef, Channel, IoBuf};
use hdrhistogram::Histogram;
use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

/// Operations between two offers to yield the core (memory-backed devices
/// complete synchronously and would otherwise never yield).
const YIELD_EVERY: u32 = 64;
/// Highest latency the histogram holds: 60 s in nanoseconds.
const LATENCY_NS_MAX: u64 = 60_000_000_000;

/// What one xstream does.
pub(super) struct Plan {
    pub dev: BdevRef,
    pub workload: Workload,
    pub queue_depth: usize,
    pub io_size: usize,
    /// Its slice of the device, in units of `io_size`.
    pub first_io: u64,
    pub ios: u64,
    pub duration: Duration,
    pub seed: u64,
}

/// What one xstream measured.
pub struct Stats {
    pub ops: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub latency_ns: Histogram<u64>,
    pub elapsed: Duration,
    /// CPU time the xstream's thread used during the run.
    pub cpu: Duration,
}

/// CPU time used so far by the calling thread.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec; the clock always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

fn histogram() -> Histogram<u64> {
    // Bounds are constants that hdrhistogram accepts.
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("valid histogram bounds")
}

struct Shared<'a> {
    plan: &'a Plan,
    ch: &'a dyn Channel,
    deadline: Instant,
    stats: RefCell<Stats>,
    cursor: Cell<u64>,
}

/// splitmix64: a small, fast PRNG for offsets and patterns.
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The verify pattern of `offset` at generation `generation`: offset and
/// generation little-endian in the first 16 bytes, PRNG bytes after.
fn fill_pattern(buf: &mut [u8], offset: u64, generation: u64) {
    let mut state = offset ^ generation.rotate_left(40);
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let word = match i {
            0 => offset,
            1 => generation,
            _ => next_random(&mut state),
        };
        chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
    }
}

impl Shared<'_> {
    fn record(&self, started: Instant, ended: Instant) {
        let ns = ended.duration_since(started).as_nanos() as u64;
        let mut s = self.stats.borrow_mut();
        s.ops += 1;
        s.latency_ns.saturating_record(ns.max(1));
    }

    fn fail(&self, what: String) {
        let mut s = self.stats.borrow_mut();
        s.errors += 1;
        s.first_error.get_or_insert(what);
    }

    /// Offset of the next I/O for task `task`.
    fn next_offset(&self, task: usize, rng: &mut u64) -> u64 {
        let p = self.plan;
        let index = match p.workload {
            Workload::Read | Workload::Write => {
                let i = self.cursor.get();
                self.cursor.set((i + 1) % p.ios);
                i
            }
            Workload::Randread | Workload::Randwrite => next_random(rng) % p.ios,
            // Task t owns the I/O slots t, t+qd, t+2qd... of the slice.
            Workload::Verify => {
                let qd = p.queue_depth as u64;
                let owned = (p.ios - task as u64).div_ceil(qd);
                task as u64 + qd * (next_random(rng) % owned)
            }
        };
        (p.first_io + index) * p.io_size as u64
    }

    async fn verify_one(&self, offset: u64, generation: u64, bufs: &mut Option<(IoBuf, IoBuf)>) {
        let Some((mut out, back)) = bufs.take() else {
            return;
        };
        fill_pattern(out.as_mut_slice(), offset, generation);
        let t0 = Instant::now();
        let out = match self.ch.write(offset, out).await {
            Ok(b) => b,
            Err(e) => return self.fail(e.to_string()),
        };
        let t1 = Instant::now();
        self.record(t0, t1);
        let back = match self.ch.read(offset, back).await {
            Ok(b) => b,
            Err(e) => return self.fail(e.to_string()),
        };
        self.record(t1, Instant::now());
        if back.as_slice() != out.as_slice() {
            self.fail(format!(
                "verify: data at offset {offset} differs from what was written"
            ));
        }
        *bufs = Some((out, back));
    }

    async fn task(&self, task: usize) {
        let p = self.plan;
        let mut rng = p.seed ^ (task as u64).rotate_left(32);
        if p.workload == Workload::Verify {
            if task as u64 >= p.ios {
                return; // fewer slots than tasks: this one has none
            }
            let bufs = (self.ch.alloc(p.io_size), self.ch.alloc(p.io_size));
            let mut bufs = match bufs {
                (Ok(a), Ok(b)) => Some((a, b)),
                (Err(e), _) | (_, Err(e)) => return self.fail(e.to_string()),
            };
            let mut n = 0u64;
            while bufs.is_some() && Instant::now() < self.deadline {
                n += 1;
                let offset = self.next_offset(task, &mut rng);
                self.verify_one(offset, n, &mut bufs).await;
                if n % u64::from(YIELD_EVERY) == 0 {
                    glommio::yield_if_needed().await;
                }
            }
            return;
        }
        let mut buf = match self.ch.alloc(p.io_size) {
            Ok(b) => b,
            Err(e) => return self.fail(e.to_string()),
        };
        let write = matches!(p.workload, Workload::Write | Workload::Randwrite);
        if write {
            fill_pattern(buf.as_mut_slice(), task as u64, p.seed);
        }
        let mut now = Instant::now();
        let mut n = 0u32;
        while now < self.deadline {
            let offset = self.next_offset(task, &mut rng);
            let r = if write {
                self.ch.write(offset, buf).await
            } else {
                self.ch.read(offset, buf).await
            };
            let done = Instant::now();
            match r {
                Ok(b) => buf = b,
                Err(e) => return self.fail(e.to_string()),
            }
            self.record(now, done);
            now = done;
            n = n.wrapping_add(1);
            if n % YIELD_EVERY == 0 {
                glommio::yield_if_needed().await;
                now = Instant::now();
            }
        }
    }
}

/// Runs `plan` on the calling xstream until its duration has passed.
pub(super) async fn run(plan: Plan) -> Stats {
    let empty = Stats {
        ops: 0,
        errors: 0,
        first_error: None,
        latency_ns: histogram(),
        elapsed: Duration::ZERO,
        cpu: Duration::ZERO,
    };
    let ch = match plan.dev.channel() {
        Ok(ch) => ch,
        Err(e) => {
            return Stats {
                errors: 1,
                first_error: Some(e.to_string()),
                ..empty
            }
        }
    };
    let start = Instant::now();
    let cpu_start = thread_cpu_time();
    let shared = Shared {
        plan: &plan,
        ch: &*ch,
        deadline: start + plan.duration,
        stats: RefCell::new(empty),
        cursor: Cell::new(0),
    };
    let tasks = (0..plan.queue_depth).map(|t| shared.task(t));
    futures::future::join_all(tasks).await;
    let mut stats = shared.stats.into_inner();
    stats.elapsed = start.elapsed();
    stats.cpu = thread_cpu_time().saturating_sub(cpu_start);
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_name_offset_and_generation() {
        let fill = |offset, generation| {
            let mut b = vec![0u8; 4096];
            fill_pattern(&mut b, offset, generation);
            b
        };
        let a = fill(8192, 3);
        assert_eq!(u64::from_le_bytes(a[..8].try_into().unwrap()), 8192);
        assert_eq!(u64::from_le_bytes(a[8..16].try_into().unwrap()), 3);
        assert_eq!(a, fill(8192, 3));
        assert_ne!(a[16..], fill(8192, 4)[16..]);
        assert_ne!(a[16..], fill(4096, 3)[16..]);
    }
}
