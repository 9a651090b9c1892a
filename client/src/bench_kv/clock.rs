//! The bench's latency clock: on x86_64 the CPU's time-stamp counter, read
//! by one `rdtsc` as perftest's `get_cycles` reads it, so that timing a GET
//! adds about what timing an `ib_read_lat` read does. A monotonic clock
//! read (`Instant::now`, a vDSO call) costs about a microsecond on the
//! soft-RoCE guest's emulated CPU, and half of each of the two reads fell
//! inside every GET measured. Ticks become nanoseconds by the rate measured
//! against the monotonic clock over the whole run ([`Calibration`]), as
//! perftest turns cycles into microseconds with the CPU's rate. Elsewhere
//! ticks are nanoseconds of `Instant`.

use std::time::Instant;

/// The current tick.
#[inline]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions and exists on every x86_64 CPU.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Ticks since `t0` (0 if the counter went back: another CPU's).
#[inline]
pub fn since(t0: u64) -> u64 {
    ticks().saturating_sub(t0)
}

/// Ticks and monotonic time at the start of a run.
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    ticks: u64,
    instant: Instant,
}

impl Calibration {
    pub fn start() -> Self {
        Self {
            instant: Instant::now(),
            ticks: ticks(),
        }
    }

    /// Nanoseconds per tick over the time since [`start`](Self::start).
    pub fn ns_per_tick(&self) -> f64 {
        let ns = self.instant.elapsed().as_nanos() as f64;
        ns_per_tick(since(self.ticks), ns)
    }
}

/// The rate of `ticks` counted over `ns` nanoseconds (1 when nothing was
/// counted).
pub fn ns_per_tick(ticks: u64, ns: f64) -> f64 {
    if ticks == 0 || ns <= 0.0 {
        1.0
    } else {
        ns / ticks as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_advance_and_convert_by_the_measured_rate() {
        let cal = Calibration::start();
        let t0 = ticks();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(since(t0) > 0, "the counter advances over a sleep");
        assert!(cal.ns_per_tick() > 0.0);
        assert_eq!(ns_per_tick(2_000, 1_000.0), 0.5);
        assert_eq!(ns_per_tick(0, 1_000.0), 1.0, "no ticks: unconverted");
        assert_eq!(since(u64::MAX), 0, "a counter behind t0 counts 0");
    }
}
