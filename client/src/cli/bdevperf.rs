//! `ferrite bdevperf`: measure a block device (see `ferrite_client::bdevperf`).

use ferrite_client::bdevperf::{run as run_perf, PerfConfig, Workload};
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Device spec: `uring:/path?size=1G`, `pmem:/path`, `malloc:1G`, ...
    #[arg(long)]
    pub bdev: String,
    /// Operations in flight per xstream.
    #[arg(short = 'q', long = "queue-depth", default_value_t = 32)]
    pub queue_depth: usize,
    /// Bytes per operation (4096, 64K, 1M ...).
    #[arg(short = 'o', long = "io-size", default_value = "4096", value_parser = parse_io_size)]
    pub io_size: usize,
    /// Access pattern.
    #[arg(short = 'w', long = "workload", value_enum, default_value = "randread")]
    pub workload: Workload,
    /// Seconds to run (fractions allowed).
    #[arg(short = 't', long = "time", default_value_t = 10.0)]
    pub seconds: f64,
    /// Xstreams, pinned to cores 0..N.
    #[arg(long, default_value_t = 1)]
    pub xstreams: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn parse_io_size(s: &str) -> Result<usize, String> {
    ferrite_bdev::spec::parse_size(s)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("bad I/O size {s:?}: expected e.g. 4096, 64K, 1M"))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if !(args.seconds > 0.0 && args.seconds < 1e6) {
        anyhow::bail!(
            "bdevperf: -t {} is not a positive number of seconds",
            args.seconds
        );
    }
    let config = PerfConfig {
        bdev: args.bdev,
        queue_depth: args.queue_depth,
        io_size: args.io_size,
        workload: args.workload,
        duration: Duration::from_secs_f64(args.seconds),
        xstreams: args.xstreams,
    };
    let report = run_perf(&config)?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    if report.errors > 0 {
        anyhow::bail!(
            "bdevperf: {} I/O errors or verify mismatches",
            report.errors
        );
    }
    Ok(())
}
