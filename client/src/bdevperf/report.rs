//! Figures of a bdevperf run: per xstream and total, as text or JSON.

use super::job::Stats;
use super::PerfConfig;
use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// Figures of one xstream (or the total, with `xstream = None`).
#[derive(Debug, Clone)]
pub struct StreamReport {
    pub xstream: Option<usize>,
    pub core: Option<usize>,
    pub ops: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub seconds: f64,
    pub iops: f64,
    pub mib_per_s: f64,
    /// CPU seconds the xstream threads used.
    pub cpu_seconds: f64,
    latency_ns: Histogram<u64>,
}

impl StreamReport {
    pub(super) fn from_stats(xstream: usize, core: usize, io_size: usize, s: Stats) -> Self {
        let seconds = s.elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        let iops = s.ops as f64 / seconds;
        Self {
            xstream: Some(xstream),
            core: Some(core),
            ops: s.ops,
            errors: s.errors,
            first_error: s.first_error,
            seconds,
            iops,
            mib_per_s: iops * io_size as f64 / (1024.0 * 1024.0),
            cpu_seconds: s.cpu.as_secs_f64(),
            latency_ns: s.latency_ns,
        }
    }

    /// Operations per second of CPU time: the rate one fully busy core
    /// would reach, even when the cores were shared during the run.
    pub fn iops_per_core(&self) -> f64 {
        if self.cpu_seconds > 0.0 {
            self.ops as f64 / self.cpu_seconds
        } else {
            0.0
        }
    }

    /// Latency at percentile `p` (0..=100) in microseconds.
    pub fn latency_us(&self, p: f64) -> f64 {
        self.latency_ns.value_at_percentile(p) as f64 / 1000.0
    }

    pub fn mean_latency_us(&self) -> f64 {
        self.latency_ns.mean() / 1000.0
    }

    fn to_json(&self) -> Value {
        json!({
            "xstream": self.xstream,
            "core": self.core,
            "ops": self.ops,
            "errors": self.errors,
            "seconds": self.seconds,
            "iops": self.iops,
            "mib_per_s": self.mib_per_s,
            "cpu_seconds": self.cpu_seconds,
            "iops_per_core": self.iops_per_core(),
            "latency_us": {
                "mean": self.mean_latency_us(),
                "p50": self.latency_us(50.0),
                "p99": self.latency_us(99.0),
                "p99_9": self.latency_us(99.9),
                "max": self.latency_ns.max() as f64 / 1000.0,
            },
        })
    }

    fn text_row(&self) -> String {
        let who = match self.xstream {
            Some(x) => format!("xstream {x}"),
            None => "total".to_string(),
        };
        format!(
            "{who:<10} {:>12.0} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>8}",
            self.iops,
            self.mib_per_s,
            self.latency_us(50.0),
            self.latency_us(99.0),
            self.latency_us(99.9),
            self.errors
        )
    }
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct PerfReport {
    pub bdev: String,
    pub workload: &'static str,
    pub queue_depth: usize,
    pub io_size: usize,
    pub streams: Vec<StreamReport>,
    pub total: StreamReport,
    /// Failed operations plus verify mismatches, over all xstreams.
    pub errors: u64,
    /// How a `pmem` device persists writes (`map_sync`: DAX with cache-line
    /// flushes, `msync`: page cache); `None` for other backends.
    pub pmem_persist: Option<&'static str>,
}

impl PerfReport {
    pub(super) fn new(config: &PerfConfig, streams: Vec<StreamReport>) -> Self {
        let mut latency_ns = Histogram::new_from(&streams[0].latency_ns);
        for s in &streams {
            // Same bounds everywhere, so adding cannot fail.
            let _ = latency_ns.add(&s.latency_ns);
        }
        let seconds = streams.iter().map(|s| s.seconds).fold(0.0, f64::max);
        let iops: f64 = streams.iter().map(|s| s.iops).sum();
        let errors = streams.iter().map(|s| s.errors).sum();
        let total = StreamReport {
            xstream: None,
            core: None,
            ops: streams.iter().map(|s| s.ops).sum(),
            errors,
            first_error: streams.iter().find_map(|s| s.first_error.clone()),
            seconds,
            iops,
            mib_per_s: streams.iter().map(|s| s.mib_per_s).sum(),
            cpu_seconds: streams.iter().map(|s| s.cpu_seconds).sum(),
            latency_ns,
        };
        Self {
            bdev: config.bdev.clone(),
            workload: config.workload.name(),
            queue_depth: config.queue_depth,
            io_size: config.io_size,
            streams,
            total,
            errors,
            pmem_persist: None,
        }
    }

    /// One JSON object: `total.iops`, `total.mib_per_s`, `total.cpu_seconds`,
    /// `total.iops_per_core`,
    /// `total.latency_us.{mean,p50,p99,p99_9,max}`, `errors`, `xstreams[]`,
    /// `pmem_persist` (`map_sync`, `msync` or null).
    pub fn to_json(&self) -> Value {
        json!({
            "bdev": self.bdev,
            "workload": self.workload,
            "queue_depth": self.queue_depth,
            "io_size": self.io_size,
            "xstreams": self.streams.iter().map(StreamReport::to_json).collect::<Vec<_>>(),
            "total": self.total.to_json(),
            "errors": self.errors,
            "first_error": self.total.first_error,
            "pmem_persist": self.pmem_persist,
        })
    }

    /// A table: one row per xstream and the total.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "bdevperf {} {} qd={} io={} bytes, {:.1} s\n{:<10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>8}\n",
            self.bdev,
            self.workload,
            self.queue_depth,
            self.io_size,
            self.total.seconds,
            "",
            "IOPS",
            "MiB/s",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "errors"
        );
        for s in self.streams.iter().chain(std::iter::once(&self.total)) {
            out.push_str(&s.text_row());
            out.push('\n');
        }
        if let Some(mode) = self.pmem_persist {
            out.push_str(&format!("pmem persistence: {mode}\n"));
        }
        if let Some(e) = &self.total.first_error {
            out.push_str(&format!("first error: {e}\n"));
        }
        out
    }
}
