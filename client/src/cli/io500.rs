//! `ferrite io500`: the IO500-style benchmark (see `ferrite_client::io500`).
//!
//! `--backend posix --dir PATH` runs the phases through POSIX calls on any directory;
//! `--backend ferrite` (the default) will run them on the Ferrite namespace once it is wired.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use ferrite_client::io500::config::{parse_bytes, parse_duration, IOR_EASY_TRANSFER_BYTES};
use ferrite_client::io500::{run as run_io500, Config, PosixBackend, RunReport};

/// Where the phases run.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The Ferrite file namespace, through the client library.
    Ferrite,
    /// Plain POSIX calls under `--dir`.
    Posix,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Storage to benchmark.
    #[arg(long, value_enum, default_value_t = BackendKind::Ferrite)]
    pub backend: BackendKind,
    /// Directory for `--backend posix` (ext4, tmpfs, a FUSE mount...). The run makes and
    /// removes its own `io500.<id>` directory inside.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Engine to use with `--backend ferrite`; without it one is started embedded.
    #[arg(long)]
    pub engine: Option<String>,
    /// Client tasks (threads) per phase. Default: the number of CPUs.
    #[arg(long)]
    pub tasks: Option<usize>,
    /// How long each write phase runs: 30s, 300s (official length), 5s, 500ms...
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub stonewall: Duration,
    /// Print one JSON object on stdout (the table goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Keep the run directory and the ior files afterwards.
    #[arg(long)]
    pub keep: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    pub no_progress: bool,
    /// Per-task cap on ior-easy data, e.g. 64MiB (rounded down to 2 MiB transfers, min one).
    #[arg(long, value_parser = parse_bytes)]
    pub ior_easy_max_bytes: Option<u64>,
    /// Per-task cap on ior-hard segments (47008 bytes each).
    #[arg(long)]
    pub ior_hard_max_segments: Option<u64>,
    /// Per-task cap on mdtest-easy files.
    #[arg(long)]
    pub mdtest_easy_max_files: Option<u64>,
    /// Per-task cap on mdtest-hard files.
    #[arg(long)]
    pub mdtest_hard_max_files: Option<u64>,
}

fn config_from(args: &Args) -> Config {
    let tasks = args.tasks.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let mut config = Config::new(tasks, args.stonewall);
    config.keep = args.keep;
    config.progress = !args.no_progress;
    if let Some(bytes) = args.ior_easy_max_bytes {
        config.ior_easy_max_transfers = (bytes / IOR_EASY_TRANSFER_BYTES as u64).max(1);
    }
    if let Some(n) = args.ior_hard_max_segments {
        config.ior_hard_max_segments = n;
    }
    if let Some(n) = args.mdtest_easy_max_files {
        config.mdtest_easy_max_files = n;
    }
    if let Some(n) = args.mdtest_hard_max_files {
        config.mdtest_hard_max_files = n;
    }
    config
}

fn print(report: &RunReport, json: bool) {
    if json {
        eprint!("{}", report.table());
        println!("{}", report.to_json());
    } else {
        print!("{}", report.table());
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let config = config_from(&args);
    let report = match args.backend {
        BackendKind::Posix => {
            let Some(dir) = &args.dir else {
                bail!("--backend posix needs --dir PATH");
            };
            let backend =
                PosixBackend::new(dir).with_context(|| format!("--dir {}", dir.display()))?;
            run_io500(&backend, &config)?
        }
        BackendKind::Ferrite => {
            bail!(
                "ferrite backend not wired yet: the Ferrite file namespace has not landed; \
                 use --backend posix --dir PATH"
            );
        }
    };
    print(&report, args.json);
    if !report.passed() {
        bail!(
            "io500 check failed: {} verification errors, find found {} of {} expected, \
             {} entries left after the delete phases",
            report.verify_errors,
            report.find_found,
            report.find_expected,
            report.leftover_entries
        );
    }
    Ok(())
}
