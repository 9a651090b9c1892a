//! `bdevperf`: drives a block device at a fixed queue depth from one or more
//! xstreams and reports IOPS, bandwidth and latency percentiles, like SPDK's
//! `bdevperf`.
//!
//! Each xstream opens its own channel and works on its own slice of the
//! device (so `write` and `verify` never race between xstreams), keeping
//! `queue_depth` operations in flight with as many tasks. Latency is taken
//! per operation, from submission to completion, into an HDR histogram.
//!
//! ```
//! use ferrite_client::bdevperf::{run, PerfConfig, Workload};
//! use std::time::Duration;
//!
//! let report = run(&PerfConfig {
//!     bdev: "malloc:16M".into(),
//!     queue_depth: 4,
//!     io_size: 4096,
//!     workload: Workload::Verify,
//!     duration: Duration::from_millis(100),
//!     xstreams: 1,
//! })
//! .unwrap();
//! assert_eq!(report.errors, 0);
//! assert!(report.total.ops > 0);
//! assert!(report.to_json()["total"]["iops"].as_f64().unwrap() > 0.0);
//! ```

mod job;
mod report;

pub use report::{PerfReport, StreamReport};

use ferrite_bdev::BdevRef;
use ferrite_xstream::{TaskClass, XstreamConfig, XstreamId, XstreamSet};
use std::time::Duration;

/// The access pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Uniform random reads of `io_size`, aligned to it.
    Randread,
    /// Uniform random writes.
    Randwrite,
    /// Sequential reads, wrapping at the end of the slice.
    Read,
    /// Sequential writes, wrapping at the end of the slice.
    Write,
    /// Random writes of a pattern naming offset and generation, each read
    /// back and checked; a mismatch counts as an error.
    Verify,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Randread => "randread",
            Workload::Randwrite => "randwrite",
            Workload::Read => "read",
            Workload::Write => "write",
            Workload::Verify => "verify",
        }
    }
}

/// One bdevperf run.
#[derive(Debug, Clone)]
pub struct PerfConfig {
    /// Device spec, e.g. `uring:/path?size=1G` (see `ferrite_bdev::open`).
    pub bdev: String,
    /// Operations in flight per xstream.
    pub queue_depth: usize,
    /// Bytes per operation (a multiple of the block size).
    pub io_size: usize,
    pub workload: Workload,
    pub duration: Duration,
    /// Xstreams, pinned to cores 0..xstreams.
    pub xstreams: usize,
}

/// Errors that stop a run before it produces a report.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    #[error("bdevperf: {0}")]
    Config(String),
    #[error("bdevperf: {0}")]
    Bdev(#[from] ferrite_bdev::BdevError),
    #[error("bdevperf: {0}")]
    Xstream(#[from] ferrite_xstream::Error),
}

/// Opens `config.bdev`, runs the workload and returns the per-xstream and
/// total figures.
pub fn run(config: &PerfConfig) -> Result<PerfReport, PerfError> {
    if config.queue_depth == 0 || config.xstreams == 0 || config.io_size == 0 {
        return Err(PerfError::Config(
            "queue depth, xstreams and io size must be positive".into(),
        ));
    }
    run_on(ferrite_bdev::open(&config.bdev)?, config)
}

/// Runs the workload on an open device (e.g. one wrapped in an
/// `ErrorBdev`); `config.bdev` only names it in the report.
pub fn run_on(dev: BdevRef, config: &PerfConfig) -> Result<PerfReport, PerfError> {
    let bad = |s: String| Err(PerfError::Config(s));
    if config.queue_depth == 0 || config.xstreams == 0 || config.io_size == 0 {
        return bad("queue depth, xstreams and io size must be positive".into());
    }
    let bs = dev.block_size() as usize;
    if config.io_size % bs != 0 {
        return bad(format!(
            "io size {} is not a multiple of the block size {bs} of {}",
            config.io_size, config.bdev
        ));
    }
    let io = config.io_size as u64;
    let slice_ios = dev.size_bytes() / config.xstreams as u64 / io;
    if slice_ios == 0 {
        return bad(format!(
            "{} ({} bytes) is too small for {} xstreams of {io}-byte I/O",
            config.bdev,
            dev.size_bytes(),
            config.xstreams
        ));
    }
    let cores: Vec<usize> = (0..config.xstreams).collect();
    let set = XstreamSet::start(XstreamConfig::default().with_cores(cores.clone()))?;
    let jobs: Vec<_> = (0..config.xstreams)
        .map(|i| {
            let plan = job::Plan {
                dev: dev.clone(),
                workload: config.workload,
                queue_depth: config.queue_depth,
                io_size: config.io_size,
                first_io: i as u64 * slice_ios,
                ios: slice_ios,
                duration: config.duration,
                seed: 0x5eed_0000 + i as u64,
            };
            set.mesh()
                .run_on(XstreamId(i), TaskClass::Foreground, move || job::run(plan))
        })
        .collect();
    let results = futures::executor::block_on(futures::future::join_all(jobs));
    set.shutdown()?;
    let mut streams = Vec::with_capacity(results.len());
    for (i, r) in results.into_iter().enumerate() {
        let stats = r?;
        streams.push(StreamReport::from_stats(i, cores[i], config.io_size, stats));
    }
    let mut report = PerfReport::new(config, streams);
    report.pmem_persist = dev.as_pmem().map(|p| p.persist_mode().name());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(bdev: String, workload: Workload, xstreams: usize) -> PerfConfig {
        PerfConfig {
            bdev,
            queue_depth: 8,
            io_size: 4096,
            workload,
            duration: Duration::from_millis(200),
            xstreams,
        }
    }

    #[test]
    fn verify_and_write_on_a_uring_file_with_two_xstreams() {
        let dir = tempfile::tempdir().unwrap();
        let spec = format!("uring:{}?size=8M", dir.path().join("f").display());
        for workload in [Workload::Verify, Workload::Write, Workload::Randread] {
            let r = run(&config(spec.clone(), workload, 2)).unwrap();
            assert_eq!(r.errors, 0, "{:?}", r.total.first_error);
            assert_eq!(r.streams.len(), 2);
            assert_eq!(r.total.ops, r.streams.iter().map(|s| s.ops).sum::<u64>());
            assert!(r.streams.iter().all(|s| s.ops > 0));
            let j = r.to_json();
            assert!(j["total"]["latency_us"]["p99"].as_f64().unwrap() > 0.0);
            assert_eq!(j["xstreams"].as_array().unwrap().len(), 2);
        }
    }

    #[test]
    fn io_errors_are_counted_not_hidden() {
        use ferrite_bdev::wrap::{ErrorBdev, ErrorRule};
        use ferrite_bdev::IoType;
        let dev = std::sync::Arc::new(ErrorBdev::new(ferrite_bdev::open("malloc:1M").unwrap(), 3));
        dev.add_rule(ErrorRule::fail(&[IoType::Read]).nth(5));
        let r = run_on(dev.clone(), &config("error".into(), Workload::Randread, 1)).unwrap();
        assert_eq!(r.errors, 1);
        assert!(r.total.first_error.as_deref().unwrap().contains("injected"));
        dev.clear_rules();
        dev.add_rule(ErrorRule::corrupt(&[IoType::Read]).nth(3));
        let r = run_on(dev.clone(), &config("corrupt".into(), Workload::Verify, 1)).unwrap();
        assert_eq!(r.errors, 1, "a corrupted read-back is a verify error");
        assert!(r.total.first_error.as_deref().unwrap().contains("verify"));
    }

    #[test]
    fn bad_configs_are_refused_clearly() {
        // 4 KiB device, 8 KiB I/O: the slice check refuses it up front.
        let e = run(&PerfConfig {
            io_size: 8192,
            ..config("malloc:4K".into(), Workload::Read, 1)
        });
        assert!(matches!(e, Err(PerfError::Config(_))));
        let e = run(&PerfConfig {
            io_size: 1000,
            ..config("malloc:1M".into(), Workload::Read, 1)
        });
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("multiple of the block size"));
        assert!(run(&config("nope:1".into(), Workload::Read, 1)).is_err());
    }
}
