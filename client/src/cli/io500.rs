//! `ferrite io500`: the IO500-style benchmark (see `ferrite_client::io500`).
//!
//! `--backend posix --dir PATH` runs the phases through POSIX calls on any directory;
//! `--backend ferrite` (the default) runs them on the Ferrite namespace through the client
//! library (like IOR's DFS backend), on `--engine URL` or on an embedded engine.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use ferrite_client::client::Client;
use ferrite_client::fs::io500::FerriteBackend;
use ferrite_client::fs::{Namespace, DEFAULT_CONTAINER};
use ferrite_client::io500::config::{
    parse_bytes, parse_duration, IOR_EASY_TRANSFER_BYTES, IOR_HARD_TRANSFER_BYTES,
};
use ferrite_client::io500::phases::{run_phase, Phase, PhaseOutcome};
use ferrite_client::io500::score::PhaseResult;
use ferrite_client::io500::{run as run_io500, Config, Io500Backend, PosixBackend, RunReport};
use ferrite_proto::bucket::SLOTS_PER_BUCKET;

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
    /// Namespace container for `--backend ferrite`.
    #[arg(long, default_value_t = DEFAULT_CONTAINER)]
    pub container: u64,
    /// Size of each target's bdev file of the embedded engine (no `--engine`). The run's data
    /// must fit: the ior files plus metadata, spread over the targets.
    #[arg(long, default_value = "8GiB", value_parser = parse_bytes)]
    pub embedded_bdev_size: u64,
    /// Execution streams (targets) of the embedded engine. Default: one per allowed core.
    #[arg(long)]
    pub embedded_xstreams: Option<usize>,
    /// When the embedded engine acknowledges updates: `process` (once written to its
    /// bdev files, small commits through the page cache and bulk ones with O_DIRECT,
    /// flushed by fsync — what the posix backend gets from a local file system) or
    /// `device` (O_DIRECT, after a device flush per group commit).
    #[arg(long, value_enum, default_value_t = EmbeddedDurability::Process)]
    pub embedded_durability: EmbeddedDurability,
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
    /// Run one phase only: setup, an IO500 phase (ior-easy-write, ..., mdtest-hard-delete),
    /// score or cleanup (see `ferrite_client::io500::phases`); `all` runs them in order.
    #[arg(long, default_value = "all")]
    pub phase: String,
    /// Run id (hex) naming the run directory `io500.<id>`: every phase of a run one by one
    /// must be given the same. Default: a new one (whole runs only).
    #[arg(long, value_parser = parse_run_id)]
    pub run_id: Option<u64>,
}

fn parse_run_id(text: &str) -> Result<u64, String> {
    u64::from_str_radix(text.trim_start_matches("0x"), 16)
        .map_err(|e| format!("run id {text:?} is not hex: {e}"))
}

/// Ring bytes of each embedded target: the memory that holds its newest records, which
/// clients read one-sided. At `process` durability bulk writes bypass the page cache
/// (`direct_from`), so the ring is also where a run's data is read back from: it gets as
/// much as the log allows (half of it: three eighths of the bdev) and a quarter of the
/// machine's memory shared by the targets allows, rounded down to 64 MiB (to a power of
/// two below that). The 8 GiB default on a 24 GiB machine with 2 targets gets 2.94 GiB.
#[cfg(feature = "embedded")]
fn embedded_ring_bytes(bdev_bytes: u64, targets: u64, memory: u64) -> u64 {
    const STEP: u64 = 64 << 20;
    // The log is the bdev less a quarter (checkpoints) and a block (superblock).
    let half_log = (bdev_bytes / 8 * 3).saturating_sub(4096);
    let want = half_log.min(memory / 4 / targets.max(1));
    match want >= STEP {
        true => want / STEP * STEP,
        false => 1u64 << (63 - want.max(1 << 20).leading_zeros()),
    }
}

/// Bytes of memory of this machine (0 when unknown).
#[cfg(feature = "embedded")]
fn physical_memory() -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages.max(0) as u64).saturating_mul(page.max(0) as u64)
}

/// `--embedded-durability` values (the engine's `durability` setting).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbeddedDurability {
    Process,
    Device,
}

fn config_from(args: &Args) -> Config {
    let tasks = args.tasks.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let mut config = Config::new(tasks, args.stonewall);
    if let Some(id) = args.run_id {
        config.run_seed = id;
    }
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

/// Client options of a run: a pooled connection per task, so that tasks never wait on
/// another task's connection.
fn client_options(args: &Args) -> ferrite_client::client::ClientOptions {
    let mut options = ferrite_client::client::ClientOptions::default();
    options.connections = options.connections.max(config_from(args).tasks);
    options
}

/// The engine at `--engine`, or an embedded one; with a description for the report.
fn connect(args: &Args) -> anyhow::Result<(Client, String)> {
    match args.engine.as_deref() {
        Some(url) => {
            let client = Client::connect_with(url, client_options(args))
                .with_context(|| format!("connect to {url}"))?;
            Ok((client, format!("ferrite:{url}")))
        }
        None => embedded(args),
    }
}

/// An engine in this process on a temp directory: uring bdev files and the shm fabric, as
/// in production, sized for the run.
#[cfg(feature = "embedded")]
fn embedded(args: &Args) -> anyhow::Result<(Client, String)> {
    let options = client_options(args);
    let size = args.embedded_bdev_size;
    let xstreams = args.embedded_xstreams;
    let durability = match args.embedded_durability {
        EmbeddedDurability::Process => ferrite_engine::store::Durability::Process,
        EmbeddedDurability::Device => ferrite_engine::store::Durability::Device,
    };
    let client = ferrite_client::embedded::connect_with(options, |config| {
        // `process` is a local file system's guarantee (written to the device, fsync on
        // sync): small commits go through the page cache, bulk ones (from 128 KiB: ior
        // data, batches of mdtest-hard files) straight to the device from the ring, which
        // keeps them for reads. `device` writes everything through and flushes.
        config.bdev = match durability {
            ferrite_engine::store::Durability::Device => {
                format!("uring:{{dir}}/target-{{i}}.bdev?size={size}&direct=1")
            }
            _ => format!("uring:{{dir}}/target-{{i}}.bdev?size={size}&direct=0&direct_from=128K"),
        };
        config.xstreams = xstreams;
        config.durability = durability;
        // Room for a run's entries in the index (mdtest makes hundreds of thousands) and a
        // ring that holds what the run reads back (`embedded_ring_bytes`).
        let targets =
            xstreams.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let ring = embedded_ring_bytes(size, targets as u64, physical_memory());
        config.cache.ring_bytes = ferrite_engine::config::Size(ring);
        config.cache.buckets = 1 << 20;
        config.cache.overflow_buckets = 1 << 18;
        // The first client maps (populates) every ring anyway: faulting them in writable at
        // open instead spares the xstreams a page fault on every page they append to.
        config.cache.populate = true;
    })
    .context("start an embedded engine")?;
    let targets = client.targets().len();
    let gib = size as f64 / (1u64 << 30) as f64;
    Ok((
        client,
        format!(
            "ferrite:embedded ({targets} targets, {gib:.1} GiB bdev each, durability {})",
            durability.as_str()
        ),
    ))
}

#[cfg(not(feature = "embedded"))]
fn embedded(_: &Args) -> anyhow::Result<(Client, String)> {
    bail!("no --engine given and this ferrite is built without the embedded engine")
}

fn print(report: &RunReport, json: bool) {
    if json {
        eprint!("{}", report.table());
        println!("{}", report.to_json());
    } else {
        print!("{}", report.table());
    }
}

/// Per-task caps that keep a whole run's data inside storage with `free`
/// bytes on each of `targets` (the least free of them; file chunks spread
/// over targets by hash): ior-easy 45 %, ior-hard 20 % and mdtest-hard 10 %
/// of 60 % of it, the rest is room for metadata, copies and the cleaner.
/// Returns (ior-easy transfers, ior-hard segments, mdtest-hard files).
fn caps_for_space(free: u64, targets: u64, tasks: u64) -> (u64, u64, u64) {
    let budget = free.saturating_mul(targets) / 10 * 6;
    let per_task = |share: u64, unit: u64| (budget / 100 * share / tasks.max(1) / unit).max(1);
    (
        per_task(45, IOR_EASY_TRANSFER_BYTES as u64),
        per_task(20, IOR_HARD_TRANSFER_BYTES as u64),
        per_task(10, 4096 + 512),
    )
}

/// Device-log bytes an mdtest-easy file and an mdtest-hard file cost over a whole run
/// (entry, its removal; the hard file's chunk and its removal), rounded up: a whole
/// 8-task run appended about 265 bytes per easy file and 4.4 KiB per hard file.
const EASY_FILE_LOG_BYTES: u64 = 512;
const HARD_FILE_LOG_BYTES: u64 = 4096 + 1024;

/// What a whole run with `config`'s caps appends to the device logs at most, over all
/// targets, a quarter more than its data and entries.
fn run_log_bytes(config: &Config) -> u64 {
    let parts = [
        (
            config.ior_easy_max_transfers,
            IOR_EASY_TRANSFER_BYTES as u64,
        ),
        (config.ior_hard_max_segments, IOR_HARD_TRANSFER_BYTES as u64),
        (config.mdtest_easy_max_files, EASY_FILE_LOG_BYTES),
        (config.mdtest_hard_max_files, HARD_FILE_LOG_BYTES),
    ];
    let per_task =
        (parts.iter()).fold(0u64, |sum, &(n, b)| sum.saturating_add(n.saturating_mul(b)));
    per_task.saturating_mul(config.tasks as u64) / 4 * 5
}

/// Scales down the caps the user did not set so that a whole run's logs fit in `disk`
/// bytes (what the file system under the embedded engine's device files has free: the
/// files are sparse, and a log write past the free space would poison the targets
/// mid-run). Returns the factor applied, `None` when the run fits as it is.
fn fit_disk(args: &Args, config: &mut Config, disk: u64) -> Option<f64> {
    let need = run_log_bytes(config);
    let room = disk / 10 * 8;
    if need <= room {
        return None;
    }
    let f = room as f64 / need as f64;
    let scale = |cap: &mut u64, user_set: bool| {
        if !user_set {
            *cap = ((*cap as f64 * f) as u64).max(1);
        }
    };
    scale(
        &mut config.ior_easy_max_transfers,
        args.ior_easy_max_bytes.is_some(),
    );
    scale(
        &mut config.ior_hard_max_segments,
        args.ior_hard_max_segments.is_some(),
    );
    scale(
        &mut config.mdtest_easy_max_files,
        args.mdtest_easy_max_files.is_some(),
    );
    scale(
        &mut config.mdtest_hard_max_files,
        args.mdtest_hard_max_files.is_some(),
    );
    Some(f)
}

/// Bytes an unprivileged writer may still allocate on the file system holding `dir`.
fn fs_available(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the struct it is given; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Per-task caps on mdtest files that keep a whole run's new keys inside
/// the index room of `targets` targets with `room` keys each (the least of
/// them; names spread over targets by hash): mdtest-easy 60 % (one key per
/// file) and mdtest-hard 30 % (a name and a chunk per file) of 60 % of it.
/// Returns (mdtest-easy files, mdtest-hard files).
fn caps_for_keys(room: u64, targets: u64, tasks: u64) -> (u64, u64) {
    let budget = room.saturating_mul(targets) / 10 * 6;
    let per_task = |share: u64, keys: u64| (budget / 100 * share / tasks.max(1) / keys).max(1);
    (per_task(60, 1), per_task(30, 2))
}

/// New keys a target's index still takes: it refuses new keys once its
/// overflow pool could run out, at about 0.66 of all slots (engine
/// FORMAT.md); this counts 0.6.
fn key_room(counter: impl Fn(&str) -> Option<u64>) -> Option<u64> {
    let slots = counter("bucket_count_total")? * SLOTS_PER_BUCKET as u64;
    Some((slots / 10 * 6).saturating_sub(counter("keys")?))
}

/// Where the user set no cap, caps the write phases of a whole run so that
/// its data fits in the engine's free log space and its files in the
/// engine's index (a stonewalled write phase then ends at its cap, as IO500
/// runs with caps do), and says so.
fn fit_caps(client: &Client, args: &Args, config: &mut Config) -> anyhow::Result<()> {
    // An embedded engine keeps bulk data out of the page cache: what a run reads back
    // must fit in its rings.
    let embedded = args.engine.is_none();
    let stat = client.stat().context("engine stat (free log space)")?;
    let room_of = |t: &ferrite_proto::rpc::TargetStat| {
        let get = |name: &str| t.counters.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
        let mut free = get("log_capacity_bytes")?.saturating_sub(get("log_used_bytes")?);
        // What the target still admits (its space ceiling), where it says.
        if let (Some(ceiling), Some(live)) = (get("live_ceiling_bytes"), get("live_bytes")) {
            free = free.min(ceiling.saturating_sub(live));
        }
        if embedded {
            free = free.min(get("ring_bytes")?);
        }
        Some((free, key_room(get)?))
    };
    let rooms: Option<Vec<(u64, u64)>> = stat.target_counters.iter().map(room_of).collect();
    let Some(rooms) = rooms.filter(|r| !r.is_empty()) else {
        return Ok(());
    };
    let least = rooms.iter().map(|r| r.0).min().unwrap_or(0);
    let least_keys = rooms.iter().map(|r| r.1).min().unwrap_or(0);
    let targets = stat.target_counters.len() as u64;
    let (easy, hard, files) = caps_for_space(least, targets, config.tasks as u64);
    let (easy_files, hard_files) = caps_for_keys(least_keys, targets, config.tasks as u64);
    if args.mdtest_easy_max_files.is_none() {
        config.mdtest_easy_max_files = config.mdtest_easy_max_files.min(easy_files);
    }
    let files = files.min(hard_files);
    if args.ior_easy_max_bytes.is_none() {
        config.ior_easy_max_transfers = config.ior_easy_max_transfers.min(easy);
    }
    if args.ior_hard_max_segments.is_none() {
        config.ior_hard_max_segments = config.ior_hard_max_segments.min(hard);
    }
    if args.mdtest_hard_max_files.is_none() {
        config.mdtest_hard_max_files = config.mdtest_hard_max_files.min(files);
    }
    if embedded {
        // The embedded engine's device files live under the temp directory.
        if let Some(disk) = fs_available(&std::env::temp_dir()) {
            if let Some(f) = fit_disk(args, config, disk) {
                eprintln!(
                    "io500: the file system under the embedded engine has {:.1} GiB free: the \
                     write phases' caps are scaled to {:.0} % so that the run fits",
                    disk as f64 / (1u64 << 30) as f64,
                    f * 100.0
                );
            }
        }
    }
    eprintln!(
        "io500: {} targets with {:.1} GiB for data (free log, within the ring when embedded) and room for {} new keys each: per task at \
         most {} ior-easy transfers, {} ior-hard segments, {} mdtest-easy files, {} \
         mdtest-hard files (--ior-easy-max-bytes, --ior-hard-max-segments, \
         --mdtest-easy-max-files, --mdtest-hard-max-files change them)",
        targets,
        least as f64 / (1u64 << 30) as f64,
        least_keys,
        config.ior_easy_max_transfers,
        config.ior_hard_max_segments,
        config.mdtest_easy_max_files,
        config.mdtest_hard_max_files
    );
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut config = config_from(&args);
    let phase = match args.phase.as_str() {
        "all" => None,
        name => match Phase::parse(name) {
            Some(p) if args.run_id.is_some() => Some(p),
            Some(_) => bail!("--phase {name} needs --run-id HEX, the same for every phase"),
            None => bail!("no io500 phase {name:?}; phases: all, {}", Phase::names()),
        },
    };
    match args.backend {
        BackendKind::Posix => {
            let Some(dir) = &args.dir else {
                bail!("--backend posix needs --dir PATH");
            };
            let backend =
                PosixBackend::new(dir).with_context(|| format!("--dir {}", dir.display()))?;
            run_on(&backend, &config, phase, args.json)
        }
        BackendKind::Ferrite => {
            if phase.is_some() && args.engine.is_none() {
                bail!("--phase needs storage that outlives this process: --engine URL");
            }
            let (client, description) = connect(&args)?;
            if phase.is_none() {
                fit_caps(&client, &args, &mut config)?;
            }
            let namespace = Namespace::new(Arc::new(client), args.container);
            let backend = FerriteBackend::new(namespace, description);
            run_on(&backend, &config, phase, args.json)
        }
    }
}

/// Runs the whole benchmark, or one phase of it, and prints what it measured.
fn run_on<B: Io500Backend>(
    backend: &B,
    config: &Config,
    phase: Option<Phase>,
    json: bool,
) -> anyhow::Result<()> {
    let report = match phase {
        None => run_io500(backend, config)?,
        Some(phase) => match run_phase(backend, config, phase)? {
            PhaseOutcome::Report(report) => report,
            PhaseOutcome::Done(p) => {
                eprintln!("io500 {}: done", p.name());
                return Ok(());
            }
            PhaseOutcome::Measured(result) => {
                print_phase(&result, json);
                if result.errors > 0 {
                    bail!(
                        "io500 {}: {} verification errors",
                        result.name,
                        result.errors
                    );
                }
                return Ok(());
            }
        },
    };
    print(&report, json);
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

fn print_phase(result: &PhaseResult, json: bool) {
    let line = format!(
        "{} {:.3} {} in {:.2} s ({} ops, {} errors)",
        result.name,
        result.value,
        result.unit.label(),
        result.seconds,
        result.ops,
        result.errors
    );
    if json {
        eprintln!("{line}");
        println!("{}", serde_json::to_string(result).unwrap_or_default());
    } else {
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(args: &[&str]) -> Args {
        let argv = std::iter::once("io500").chain(args.iter().copied());
        Cli::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn defaults_are_the_ferrite_backend_and_a_30s_stonewall() {
        let args = parse(&[]);
        assert_eq!(args.backend, BackendKind::Ferrite);
        assert_eq!(args.stonewall, Duration::from_secs(30));
        let config = config_from(&args);
        assert!(config.progress && !config.keep);
        assert_eq!(config.ior_easy_max_transfers, u64::MAX);
    }

    #[test]
    fn durations_and_caps_reach_the_config() {
        let args = parse(&[
            "--backend",
            "posix",
            "--stonewall",
            "500ms",
            "--tasks",
            "3",
            "--ior-easy-max-bytes",
            "5MiB",
            "--ior-hard-max-segments",
            "7",
            "--mdtest-easy-max-files",
            "8",
            "--mdtest-hard-max-files",
            "9",
            "--keep",
        ]);
        let config = config_from(&args);
        assert_eq!(config.stonewall, Duration::from_millis(500));
        assert_eq!(config.tasks, 3);
        assert_eq!(
            config.ior_easy_max_transfers, 2,
            "5 MiB is two whole 2 MiB transfers"
        );
        assert_eq!(config.ior_hard_max_segments, 7);
        assert_eq!(config.mdtest_easy_max_files, 8);
        assert_eq!(config.mdtest_hard_max_files, 9);
        assert!(config.keep);
        assert!(Cli::try_parse_from(["io500", "--stonewall", "soon"]).is_err());
    }

    #[test]
    fn caps_keep_a_run_inside_the_free_space() {
        let gib = 1u64 << 30;
        let (easy, hard, files) = super::caps_for_space(5 * gib, 2, 8);
        let data = 8
            * (easy * super::IOR_EASY_TRANSFER_BYTES as u64
                + hard * super::IOR_HARD_TRANSFER_BYTES as u64
                + files * 4096);
        assert!(data <= 10 * gib * 6 / 10, "{data}");
        assert!(data >= 10 * gib * 6 / 10 * 7 / 10, "caps too tight: {data}");
        assert_eq!(super::caps_for_space(0, 2, 8), (1, 1, 1));
    }

    #[test]
    fn caps_shrink_to_the_free_disk_but_not_the_users() {
        let args = parse;
        let gib = 1u64 << 30;
        let mut config = Config::new(8, Duration::from_secs(5));
        config.ior_easy_max_transfers = 128;
        config.ior_hard_max_segments = 5000;
        config.mdtest_easy_max_files = 200_000;
        config.mdtest_hard_max_files = 10_000;
        let need = super::run_log_bytes(&config);
        assert!(need > 5 * gib && need < 8 * gib, "{need}");
        // Room enough: nothing changes.
        let before = config.clone();
        assert_eq!(super::fit_disk(&args(&[]), &mut config, 60 * gib), None);
        assert_eq!(config, before);
        // A 3 GiB disk: every cap shrinks alike and the run fits in 80 % of it.
        let f = super::fit_disk(&args(&[]), &mut config, 3 * gib).unwrap();
        assert!(f > 0.2 && f < 0.5, "{f}");
        assert!(super::run_log_bytes(&config) <= 3 * gib / 10 * 8);
        assert_eq!(config.mdtest_hard_max_files, (10_000f64 * f) as u64);
        // A cap the user set stays as set.
        let mut config = before.clone();
        let user = args(&["--mdtest-easy-max-files", "200000"]);
        super::fit_disk(&user, &mut config, 3 * gib).unwrap();
        assert_eq!(config.mdtest_easy_max_files, 200_000);
        assert!(config.ior_easy_max_transfers < 128);
        assert!(super::fs_available(&std::env::temp_dir()).is_some_and(|b| b > 0));
    }

    #[test]
    fn caps_keep_a_run_inside_the_index() {
        // The embedded engine's index: 2^20 + 2^18 buckets per target, about
        // 2.6 M keys each before it refuses new ones.
        let counters = |name: &str| match name {
            "bucket_count_total" => Some((1 << 20) + (1 << 18)),
            "keys" => Some(1000),
            _ => None,
        };
        let room = super::key_room(counters).unwrap();
        assert!(room < 2_590_000 && room > 2_000_000, "{room}");
        assert_eq!(super::key_room(|_| None), None);
        let (easy, hard) = super::caps_for_keys(room, 2, 8);
        let keys = 8 * (easy + 2 * hard);
        assert!(keys <= 2 * room * 6 / 10, "{keys}");
        assert!(keys >= 2 * room * 6 / 10 * 8 / 10, "caps too tight: {keys}");
        assert_eq!(super::caps_for_keys(0, 2, 8), (1, 1));
    }

    #[cfg(feature = "embedded")]
    #[test]
    fn embedded_ring_fits_the_bdev_and_the_memory() {
        let ring = super::embedded_ring_bytes;
        let gib = 1u64 << 30;
        // Three eighths of the bdev (half its log), or a quarter of memory per target.
        assert_eq!(ring(8 * gib, 2, 24 * gib), 3 * gib - (64 << 20));
        assert_eq!(ring(8 * gib, 2, 64 * gib), 3 * gib - (64 << 20));
        assert_eq!(ring(64 * gib, 2, 24 * gib), 3 * gib);
        assert_eq!(ring(64 * gib, 8, 16 * gib), 512 << 20);
        assert_eq!(ring(256 << 20, 1, 24 * gib), 64 << 20);
        assert_eq!(ring(100 << 20, 1, 24 * gib), 32 << 20);
        assert_eq!(ring(1 << 20, 1, 24 * gib), 1 << 20);
        assert_eq!(ring(8 * gib, 2, 0), 1 << 20);
    }

    /// The default backend end to end on an embedded engine: every phase verifies.
    #[cfg(feature = "embedded")]
    #[test]
    fn ferrite_backend_runs_on_an_embedded_engine() {
        let args = parse(&[
            "--tasks",
            "2",
            "--stonewall",
            "10m",
            "--no-progress",
            "--ior-easy-max-bytes",
            "2MiB",
            "--ior-hard-max-segments",
            "3",
            "--mdtest-easy-max-files",
            "5",
            "--mdtest-hard-max-files",
            "8",
            "--embedded-bdev-size",
            "256MiB",
            "--embedded-xstreams",
            "2",
        ]);
        assert_eq!(args.backend, BackendKind::Ferrite);
        run(args).unwrap();
    }

    #[test]
    fn posix_needs_a_dir_and_runs_on_one() {
        let err = run(parse(&["--backend", "posix"])).unwrap_err();
        assert!(err.to_string().contains("--dir"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap();
        let args = parse(&[
            "--backend",
            "posix",
            "--dir",
            path,
            "--tasks",
            "2",
            "--stonewall",
            "10m",
            "--no-progress",
            "--ior-easy-max-bytes",
            "2MiB",
            "--ior-hard-max-segments",
            "3",
            "--mdtest-easy-max-files",
            "5",
            "--mdtest-hard-max-files",
            "105",
        ]);
        run(args).unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "the run cleaned up after itself");
    }
}
