//! `ferrite job submit|list|status|cancel|serve` and `ferrite worker`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use ferrite_client::jobs::api::{parse_job_id, JobClient, DEFAULT_JOBS_PORT};
use ferrite_client::jobs::task_state::Layout;
use ferrite_client::jobs::worker::{run_worker, WorkerConfig};
use ferrite_client::jobs::{outputs, picture};
use ferrite_proto::rpc_jobs::{JobStatus, TaskPhase};

/// The job service's token, found as every command finds it
/// ([`ferrite_client::auth::find_token`]: `--token-file`, `$FERRITE_TOKEN`,
/// `$FERRITE_TOKEN_FILE`, the default data dir's token file).
fn job_token(token_file: Option<&std::path::Path>) -> anyhow::Result<Vec<u8>> {
    ferrite_client::auth::find_token(token_file, None)?.ok_or_else(|| {
        anyhow::anyhow!(
            "the job service needs the engine's token: --token-file, $FERRITE_TOKEN \
             or $FERRITE_TOKEN_FILE"
        )
    })
}

/// `--token-file` of every job command.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TokenArg {
    /// File holding the engine's token (default: $FERRITE_TOKEN, $FERRITE_TOKEN_FILE, then the default data dir's engine.token).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}

impl TokenArg {
    fn token(&self) -> anyhow::Result<Vec<u8>> {
        job_token(self.token_file.as_deref())
    }
}

fn default_engine() -> String {
    std::env::var("FERRITE_ENGINE").unwrap_or_else(|_| format!("127.0.0.1:{DEFAULT_JOBS_PORT}"))
}

#[derive(Subcommand, Debug)]
pub enum JobCommand {
    /// Submit a job file (TOML, or JSON if it ends in .json); prints the job id.
    Submit {
        #[command(flatten)]
        auth: TokenArg,
        file: PathBuf,
        /// Job service address (default $FERRITE_ENGINE or 127.0.0.1:7341).
        #[arg(long)]
        engine: Option<String>,
        /// Wait for the job to end; fail if it does not finish.
        #[arg(long)]
        wait: bool,
    },
    /// List jobs.
    List {
        #[command(flatten)]
        auth: TokenArg,
        #[arg(long)]
        engine: Option<String>,
    },
    /// A job's state, gathered from its task state objects, and its DAG.
    Status {
        #[command(flatten)]
        auth: TokenArg,
        id: String,
        /// Print again each time the job changes, until it ends.
        #[arg(long)]
        watch: bool,
        #[arg(long)]
        json: bool,
        #[arg(long)]
        engine: Option<String>,
    },
    /// Cancel a job.
    Cancel {
        #[command(flatten)]
        auth: TokenArg,
        id: String,
        #[arg(long)]
        engine: Option<String>,
    },
    /// Run the job service by itself (what `ferrite-engine` starts too).
    Serve {
        #[command(flatten)]
        auth: TokenArg,
        #[arg(long, default_value_t = format!("127.0.0.1:{DEFAULT_JOBS_PORT}"))]
        listen: String,
        /// Directory of the job state files.
        #[arg(long)]
        state_dir: PathBuf,
        /// Tasks granted to one execution stream at once.
        #[arg(long, default_value_t = 64)]
        depth: u32,
        /// Execution streams the service itself offers (they run on its
        /// xstream, jobs without an engine store only: no-op and exec steps).
        #[arg(long, default_value_t = 0)]
        task_slots: u32,
    },
}

#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// Job service address (default $FERRITE_ENGINE or 127.0.0.1:7341).
    #[arg(long)]
    pub engine: Option<String>,
    /// Execution streams offered to the resource manager.
    #[arg(long, default_value_t = 1)]
    pub xstreams: u32,
    /// Node name (default: host name and process id).
    #[arg(long)]
    pub name: Option<String>,
    /// Directory for the task state objects (default: a per-process temp dir).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Task state objects: one SQLite file per task, or per job.
    #[arg(long, default_value_t = Layout::PerJob)]
    pub task_state: Layout,
    #[command(flatten)]
    pub auth: TokenArg,
}

pub fn run(c: JobCommand) -> anyhow::Result<()> {
    match c {
        JobCommand::Submit {
            file,
            engine,
            wait,
            auth,
        } => {
            let mut client =
                JobClient::connect(&engine.unwrap_or_else(default_engine), &auth.token()?)?;
            let job = client
                .submit_file(&file)
                .with_context(|| format!("submit {}", file.display()))?;
            println!("{job:032x}");
            if wait {
                client.wait(job)?;
                let status = client.status(job)?;
                eprint!("{}", picture::render(&status));
                if status.state != ferrite_proto::rpc_jobs::JobPhase::Done {
                    anyhow::bail!("job {job:032x} {}", status.state.as_str());
                }
            }
            Ok(())
        }
        JobCommand::List { engine, auth } => {
            let mut client =
                JobClient::connect(&engine.unwrap_or_else(default_engine), &auth.token()?)?;
            println!("{:<32}  {:<9}  {:>9}  name", "job", "state", "done");
            for j in client.list()? {
                let done = format!("{}/{}", j.done, j.tasks);
                println!(
                    "{:032x}  {:<9}  {done:>9}  {}",
                    j.job,
                    j.state.as_str(),
                    j.name
                );
            }
            Ok(())
        }
        JobCommand::Status {
            id,
            watch,
            json,
            engine,
            auth,
        } => {
            let job = parse_job_id(&id)?;
            let mut client =
                JobClient::connect(&engine.unwrap_or_else(default_engine), &auth.token()?)?;
            let print = |s: &JobStatus| print_status(s, json);
            if watch {
                client.watch(job, print)?;
            } else {
                print(&client.status(job)?);
            }
            Ok(())
        }
        JobCommand::Cancel { id, engine, auth } => {
            let job = parse_job_id(&id)?;
            JobClient::connect(&engine.unwrap_or_else(default_engine), &auth.token()?)?
                .cancel(job)?;
            println!("cancelled {job:032x}");
            Ok(())
        }
        JobCommand::Serve {
            listen,
            state_dir,
            depth,
            task_slots,
            auth,
        } => serve(listen, state_dir, depth, task_slots, auth),
    }
}

#[cfg(feature = "embedded")]
fn serve(
    listen: String,
    state_dir: PathBuf,
    depth: u32,
    task_slots: u32,
    auth: TokenArg,
) -> anyhow::Result<()> {
    use ferrite_engine::jobs::{JobService, JobServiceConfig};
    let mut config = JobServiceConfig::new(state_dir).with_token(&auth.token()?);
    config.listen = listen
        .parse()
        .with_context(|| format!("--listen {listen}"))?;
    config.depth = depth;
    config.task_slots = task_slots;
    let service = JobService::start(config)?;
    eprintln!("job service listening on {}", service.addr());
    // The service runs on its own threads until the process is stopped.
    loop {
        std::thread::park();
    }
}

#[cfg(not(feature = "embedded"))]
fn serve(
    _listen: String,
    _state_dir: PathBuf,
    _depth: u32,
    _slots: u32,
    _auth: TokenArg,
) -> anyhow::Result<()> {
    anyhow::bail!("this ferrite was built without the `embedded` feature: run ferrite-engine")
}

/// Tasks whose output records `job status` reads and prints.
const OUTPUTS_MAX_TASKS: usize = picture::DETAIL_MAX_TASKS;
/// Bytes of each output shown in the table view.
const OUTPUT_SHOWN_BYTES: usize = 400;

fn print_status(s: &JobStatus, json: bool) {
    // Outputs are records in the job's engine: read them only once a task
    // ended, for jobs small enough to be shown task by task.
    let outputs = match s.tasks.len() <= OUTPUTS_MAX_TASKS {
        true => outputs::read_all(s, OUTPUTS_MAX_TASKS).unwrap_or_else(|e| {
            eprintln!("ferrite: task outputs: {e}");
            Vec::new()
        }),
        false => Vec::new(),
    };
    if json {
        let mut value = serde_json::to_value(s).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.insert("outputs".into(), serde_json::json!(outputs));
        }
        println!("{value}");
        return;
    }
    print!("{}", picture::render(s));
    print_tasks(s);
    for o in &outputs {
        println!("--- {} exit {}", o.id, o.exit_code);
        for (name, text) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
            if text.is_empty() {
                continue;
            }
            let mut cut = OUTPUT_SHOWN_BYTES.min(text.len());
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let more = if cut < text.len() { " ..." } else { "" };
            println!("{name}: {}{more}", text[..cut].trim_end());
        }
    }
}

fn print_tasks(s: &JobStatus) {
    let detail = s.tasks.len() <= picture::DETAIL_MAX_TASKS;
    let shown: Vec<_> = s
        .tasks
        .iter()
        .filter(|t| detail || matches!(t.state, TaskPhase::Running | TaskPhase::Failed))
        .take(100)
        .collect();
    if shown.is_empty() {
        return;
    }
    println!(
        "{:<20} {:<9} {:<16} {:>7} {:>12} {:>5}",
        "task", "state", "node", "attempt", "run_us", "exit"
    );
    for t in shown {
        let run_us = match (t.start_ns, t.end_ns) {
            (Some(a), Some(b)) => format!("{}", b.saturating_sub(a) / 1000),
            _ => "-".into(),
        };
        let exit = t.exit_code.map_or("-".into(), |c| c.to_string());
        println!(
            "{:<20} {:<9} {:<16} {:>7} {:>12} {:>5}{}",
            t.id,
            t.state.as_str(),
            t.node.as_deref().unwrap_or("-"),
            t.attempt,
            run_us,
            exit,
            t.error
                .as_deref()
                .map(|e| format!("  {e}"))
                .unwrap_or_default()
        );
    }
}

pub fn worker(a: WorkerArgs) -> anyhow::Result<()> {
    let pid = std::process::id();
    let name = a.name.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{pid}", host.trim())
    });
    let state_dir = a
        .state_dir
        .unwrap_or_else(|| std::env::temp_dir().join(format!("ferrite-worker-{pid}")));
    let config = WorkerConfig {
        engine: a.engine.unwrap_or_else(default_engine),
        node: name,
        xstreams: a.xstreams,
        state_dir,
        layout: a.task_state,
        token: a.auth.token()?,
    };
    run_worker(&config)?;
    Ok(())
}

/// `ferrite bench jobs`.
pub fn bench(a: crate::cli::bench::BenchJobsArgs) -> anyhow::Result<()> {
    use ferrite_client::bench_jobs::{emit_dag, run_against};
    let o = a.options;
    if let Some(path) = &o.emit_dag {
        emit_dag(&o, path)?;
        return Ok(());
    }
    let report = match &o.engine {
        Some(url) => run_against(&o, url, &job_token(None)?)?,
        None => bench_embedded(&o)?,
    };
    if a.json {
        let lines = [
            ("jobs_tasks_per_s", "tasks/s", report.tasks_per_s),
            ("jobs_delay_us_p99", "us", report.delay_us_p99),
        ];
        for (name, unit, value) in lines {
            let line = serde_json::json!({
                "name": name, "unit": unit, "ferrite": value,
                "peer": null, "peer_name": "dask (hack/bench-dask)", "ratio": null,
                "detail": &report,
            });
            println!("{line}");
        }
    } else {
        println!(
            "bench jobs: {} no-op tasks, {} workers x {} xstreams, {} engine streams: {:.0} tasks/s (run {:.3} s, submit {:.3} s); \
             ready->started delay p50 {:.0} us, p99 {:.0} us, max {:.0} us; \
             last predecessor end->started p50 {:.0} us, p99 {:.0} us",
            report.tasks,
            report.workers,
            report.xstreams,
            report.engine_slots,
            report.tasks_per_s,
            report.run_s,
            report.submit_s,
            report.delay_us_p50,
            report.delay_us_p99,
            report.delay_us_max,
            report.delay_from_pred_end_us_p50,
            report.delay_from_pred_end_us_p99
        );
    }
    Ok(())
}

#[cfg(feature = "embedded")]
fn bench_embedded(
    o: &ferrite_client::bench_jobs::BenchJobsOptions,
) -> anyhow::Result<ferrite_client::bench_jobs::BenchJobsReport> {
    use ferrite_engine::jobs::{JobService, JobServiceConfig};
    let dir = tempfile::tempdir()?;
    // A service of this process only: a fresh random token.
    let token: [u8; 32] = rand::random();
    let token = token.map(|b| b"0123456789abcdef"[usize::from(b & 15)]);
    let mut config = JobServiceConfig::new(dir.path().join("jobs")).with_token(&token);
    config.depth = o.depth;
    if o.engine_slots == 0 {
        let service = JobService::start(config)?;
        let report =
            ferrite_client::bench_jobs::run_against(o, &service.addr().to_string(), &token)?;
        service.shutdown();
        return Ok(report);
    }
    // An engine whose xstreams run tasks: one per stream, as cores allow.
    let cores = ferrite_xstream::allowed_cores()?.len().max(1);
    let mut engine_config = ferrite_engine::config::EngineConfig::for_temp_dir(dir.path());
    engine_config.xstreams = Some((o.engine_slots as usize).clamp(1, cores));
    let engine = ferrite_engine::Engine::start(engine_config)?;
    let router = engine.router();
    config.task_slots = o.engine_slots;
    config.router = Some(router);
    let last = ferrite_xstream::XstreamId(engine.mesh().len() - 1);
    let service = JobService::start_on(config, engine.mesh(), last)?;
    let report = ferrite_client::bench_jobs::run_against(o, &service.addr().to_string(), &token)?;
    service.shutdown();
    engine.shutdown()?;
    Ok(report)
}

#[cfg(not(feature = "embedded"))]
fn bench_embedded(
    _o: &ferrite_client::bench_jobs::BenchJobsOptions,
) -> anyhow::Result<ferrite_client::bench_jobs::BenchJobsReport> {
    anyhow::bail!("built without the `embedded` feature: pass --engine")
}
