//! `ferrite-engine`: the server.
//!
//! ```text
//! ferrite-engine --config engine.toml
//! ferrite-engine --data-dir /tmp/f --xstreams 2 --tcp 127.0.0.1:7600 --unix /tmp/f/engine.sock
//! ferrite-engine --data-dir /tmp/f --task-slots 2   # its xstreams run job tasks too
//! ```
//!
//! Prints one `listen URL` line per listener, `token_file PATH` (the file
//! holding the token TCP clients must prove, unless the config gives the
//! token inline), one `region ...` line per
//! exported region, `jobs ADDR` for the job service, then `ready`, on
//! stdout. SIGTERM or SIGINT makes it
//! stop listening, flush and checkpoint every target, and exit 0.

/// mimalloc instead of glibc's malloc: the request path allocates small, short-lived
/// buffers on every xstream (decoded keys, batch futures), where glibc spent about a
/// tenth of the engine's CPU in mdtest-hard-write (perf).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ferrite_engine::config::{EngineConfig, Size};
use ferrite_engine::jobs::{JobService, JobServiceConfig};
use ferrite_engine::store::Durability;
use ferrite_engine::Engine;

#[derive(Debug, Parser)]
#[command(name = "ferrite-engine", about = "Ferrite storage engine server")]
struct Args {
    /// engine.toml; flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Directory for `{dir}` in the bdev template and the socket path.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Number of xstreams (one target each).
    #[arg(long)]
    xstreams: Option<usize>,
    /// Exact cores, comma separated (overrides --xstreams).
    #[arg(long, value_delimiter = ',')]
    cores: Option<Vec<usize>>,
    /// Microseconds an xstream with nothing to do keeps polling before it
    /// sleeps (default 100; 0 sleeps at once). Polling saves requests the
    /// wake-up; an idle engine still sleeps.
    #[arg(long)]
    spin_us: Option<u64>,
    /// Bdev spec template, `{dir}` and `{i}` substituted.
    #[arg(long)]
    bdev: Option<String>,
    /// TCP listen address ("" disables).
    #[arg(long)]
    tcp: Option<String>,
    /// Unix socket path ("" disables).
    #[arg(long)]
    unix: Option<String>,
    /// File with the shared-secret token for TCP clients (mode 0600;
    /// default: DATA_DIR/engine.token, created on first start).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Uids admitted on the Unix socket besides the engine's and root's,
    /// comma separated (`[listen] allow_uids`).
    #[arg(long, value_delimiter = ',')]
    allow_uids: Option<Vec<u32>>,
    /// Gids whose members (by primary gid) are admitted on the Unix socket
    /// (`[listen] allow_gids`).
    #[arg(long, value_delimiter = ',')]
    allow_gids: Option<Vec<u32>>,
    /// One-sided read providers, comma separated: shm, tcp.
    #[arg(long, value_delimiter = ',')]
    providers: Option<Vec<String>>,
    /// Record log ring per target, e.g. 64M.
    #[arg(long)]
    ring_bytes: Option<String>,
    /// Main-area buckets per target (any count ≥ 4; 3 slots each, plus an
    /// overflow pool of a quarter as many buckets).
    #[arg(long)]
    buckets: Option<u64>,
    /// When updates are acknowledged: `device` (after the device flush) or
    /// `process` (once written to the device; survives the engine being
    /// killed, not a power loss before the next background flush).
    #[arg(long)]
    durability: Option<String>,
    /// Background flush period in ms under `--durability process`.
    #[arg(long)]
    flush_interval_ms: Option<u64>,
    /// Job service listen address (DAG jobs, resource manager); port 0
    /// picks one, "" disables. Workers connect here (`ferrite worker`).
    #[arg(long, default_value = "127.0.0.1:0")]
    jobs: String,
    /// Execution streams this engine offers to jobs (`[jobs] task_slots`):
    /// granted tasks run on its xstreams; 0 leaves them to workers.
    #[arg(long)]
    task_slots: Option<u32>,
    /// Refuse jobs with `exec` steps (`[jobs] exec = false`).
    #[arg(long)]
    no_exec: bool,
    /// Close a logged-in connection that sends nothing for this many
    /// seconds with nothing of its own running (`[limits] idle_timeout_s`;
    /// 0: never, the default).
    #[arg(long)]
    idle_timeout_s: Option<u64>,
}

fn build_config(args: Args) -> Result<EngineConfig, String> {
    let mut c = match &args.config {
        Some(path) => EngineConfig::from_file(path).map_err(|e| e.to_string())?,
        None => EngineConfig::default(),
    };
    if let Some(d) = args.data_dir {
        c.data_dir = d;
    }
    if args.xstreams.is_some() {
        c.xstreams = args.xstreams;
        c.cores = None;
    }
    if args.cores.is_some() {
        c.cores = args.cores;
    }
    if let Some(us) = args.spin_us {
        c.spin_us = us;
    }
    if let Some(b) = args.bdev {
        c.bdev = b;
    }
    if let Some(t) = args.tcp {
        c.listen.tcp = t;
    }
    if let Some(u) = args.unix {
        c.listen.unix = u;
    }
    if args.token_file.is_some() {
        c.listen.token_file = args.token_file;
    }
    if let Some(uids) = args.allow_uids {
        c.listen.allow_uids = uids;
    }
    if let Some(gids) = args.allow_gids {
        c.listen.allow_gids = gids;
    }
    if let Some(p) = args.providers {
        c.fabric.providers = p;
    }
    if let Some(r) = args.ring_bytes {
        let bytes = ferrite_bdev::spec::parse_size(&r).ok_or(format!("--ring-bytes {r:?}"))?;
        c.cache.ring_bytes = Size(bytes);
    }
    if let Some(b) = args.buckets {
        c.cache.buckets = b;
    }
    if let Some(d) = args.durability {
        c.durability = Durability::parse(&d)
            .ok_or(format!("--durability {d:?}: expected device or process"))?;
    }
    if let Some(ms) = args.flush_interval_ms {
        c.flush_interval_ms = ms;
    }
    if let Some(n) = args.task_slots {
        c.jobs.task_slots = n;
    }
    if args.no_exec {
        c.jobs.exec = false;
    }
    if let Some(s) = args.idle_timeout_s {
        c.limits.idle_timeout_s = s;
    }
    Ok(c)
}

/// Blocks SIGTERM and SIGINT in this thread (and so in every thread started
/// after), so that [`wait_for_signal`] receives them.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset; the calls
    // only read and write `set`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` was initialised by block_signals; `sig` is a valid out
    // pointer.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

fn main() -> ExitCode {
    ferrite_xstream::tune_allocator();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let jobs_listen = args.jobs.clone();
    let config = match build_config(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferrite-engine: {e}");
            return ExitCode::from(2);
        }
    };
    let signals = block_signals();
    let jobs_dir = config.data_dir.join("jobs");
    let task_slots = config.jobs.task_slots;
    let token_file = match (&config.listen.token, &config.listen.token_file) {
        (Some(_), _) => None,
        (None, Some(file)) => Some(file.clone()),
        (None, None) => Some(config.default_token_file()),
    };
    let exec = config.jobs.exec;
    let durability = config.durability;
    let engine = match Engine::start(config) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("ferrite-engine: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "ferrite-engine: {} targets, durability {}, task slots {task_slots}",
        engine.target_count(),
        durability.as_str()
    );
    for url in engine.urls() {
        println!("listen {url}");
    }
    let jobs_auth = JobsAuth { task_slots, exec };
    if let Some(file) = token_file {
        println!("token_file {}", file.display());
    }
    for d in engine.regions() {
        println!(
            "region {} target {} {:?} {:?} length {} param {}",
            d.region_id, d.target, d.provider, d.kind, d.length, d.param
        );
    }
    // Workers store job outputs in this engine: the Unix socket (one-sided
    // reads over shm for workers on this host), else TCP.
    let store = engine
        .urls()
        .into_iter()
        .min_by_key(|u| !u.starts_with("unix://"));
    let jobs = match start_jobs(&jobs_listen, jobs_dir, store, jobs_auth, &engine) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("ferrite-engine: job service: {e}");
            let _ = engine.shutdown();
            return ExitCode::FAILURE;
        }
    };
    println!("ready");
    let sig = wait_for_signal(&signals);
    eprintln!("ferrite-engine: signal {sig}, shutting down");
    if let Some(j) = jobs {
        j.shutdown();
    }
    match engine.shutdown() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferrite-engine: shutdown: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What the job service takes from the engine's config.
struct JobsAuth {
    task_slots: u32,
    exec: bool,
}

/// Starts the job service unless `listen` is empty; prints its address.
fn start_jobs(
    listen: &str,
    state_dir: PathBuf,
    store: Option<String>,
    jobs: JobsAuth,
    engine: &ferrite_engine::EngineHandle,
) -> Result<Option<JobService>, String> {
    let mesh = engine.mesh();
    if listen.is_empty() {
        return Ok(None);
    }
    let addr = listen
        .parse()
        .map_err(|e| format!("--jobs {listen:?}: {e}"))?;
    // The resource manager runs in the control task class of the last
    // xstream (xstream 0 also accepts the engine's TCP connections).
    let xstream = ferrite_xstream::XstreamId(mesh.len() - 1);
    let config = JobServiceConfig {
        listen: addr,
        store,
        task_slots: jobs.task_slots,
        router: Some(engine.router()),
        // The engine's token: the configured one or the one it generated
        // in its data dir.
        token: Some(engine.token().to_vec()),
        exec: jobs.exec,
        ..JobServiceConfig::new(state_dir)
    };
    let service = JobService::start_on(config, mesh, xstream).map_err(|e| e.to_string())?;
    // Not a "listen URL" line: workers take the bare address.
    println!("jobs {}", service.addr());
    Ok(Some(service))
}
