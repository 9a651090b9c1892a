//! `ferrite bench jobs`: a random DAG of no-op tasks run by worker
//! processes (and the engine's own streams with `--engine-slots`); reports tasks per second and the delay from "constraints
//! satisfied" (`ready_ns`, stamped by the resource manager) to "task started"
//! (`start_ns`, stamped by the worker), both read back from the job's state.
//!
//! The DAG: task `i > 0` waits for `min_deps..=max_deps` tasks drawn
//! uniformly from the `window` tasks before it (seeded; duplicates merged).
//! The delay is also given from the end of a task's last predecessor (as the
//! worker stamped it), which adds the report's trip to the manager. `--emit-dag` writes it as JSON
//! (`{"tasks": N, "preds": [[...], ...]}`) so `hack/bench-dask` runs the
//! very same graph on Dask.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use ferrite_proto::rpc_jobs::{
    JobPhase, JobSpec, JobStatus, RetryPolicy, SpecFormat, Step, TaskSpec,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::jobs::api::JobClient;
use crate::jobs::error::JobsError;
use crate::jobs::task_state::Layout;

/// Knobs of the benchmark.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchJobsOptions {
    /// Tasks in the DAG.
    #[arg(long, default_value_t = 100_000)]
    pub tasks: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Execution streams per worker.
    #[arg(long, default_value_t = 1)]
    pub xstreams: u32,
    /// Execution streams the engine itself offers (its xstreams run tasks
    /// next to the workers'): the embedded engine is started with them;
    /// with `--engine`, give the engine's `task_slots` so the bench waits
    /// for it too.
    #[arg(long, default_value_t = 0)]
    pub engine_slots: u32,
    /// Tasks granted to one execution stream at once.
    #[arg(long, default_value_t = 256)]
    pub depth: u32,
    /// Fewest constraints per task (but the first).
    #[arg(long, default_value_t = 1)]
    pub min_deps: u32,
    /// Most constraints per task.
    #[arg(long, default_value_t = 3)]
    pub max_deps: u32,
    /// Constraints are drawn from this many preceding tasks.
    #[arg(long, default_value_t = 1000)]
    pub window: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Use this job service instead of one started in this process.
    #[arg(long)]
    pub engine: Option<String>,
    /// Store the task records in an engine and have workers fetch them from
    /// it by key: an engine URL, or `embedded` for one in this process
    /// (Unix socket, one-sided reads over shm). Default: records ride inline
    /// in the grants.
    #[arg(long)]
    pub store: Option<String>,
    /// Workers' task state objects: one SQLite file per task, or per job.
    #[arg(long, default_value_t = Layout::PerJob)]
    pub task_state: Layout,
    /// Write the DAG as JSON to this file and exit.
    #[arg(long)]
    pub emit_dag: Option<PathBuf>,
}

/// What one run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchJobsReport {
    pub tasks: usize,
    pub workers: u32,
    pub xstreams: u32,
    pub engine_slots: u32,
    pub submit_s: f64,
    /// From the first task ready to the last task finished.
    pub run_s: f64,
    pub tasks_per_s: f64,
    pub delay_us_p50: f64,
    pub delay_us_p99: f64,
    pub delay_us_max: f64,
    /// From the last predecessor's end to the start (tasks with predecessors).
    pub delay_from_pred_end_us_p50: f64,
    pub delay_from_pred_end_us_p99: f64,
}

/// Predecessors of each task of the benchmark DAG.
pub fn random_dag(tasks: usize, deps: (u32, u32), window: usize, seed: u64) -> Vec<Vec<u32>> {
    let (min_deps, max_deps) = (deps.0.min(deps.1), deps.1);
    let mut rng = StdRng::seed_from_u64(seed);
    (0..tasks)
        .map(|i| {
            if i == 0 {
                return Vec::new();
            }
            let k = rng.gen_range(min_deps..=max_deps);
            let lo = i.saturating_sub(window.max(1));
            let mut p: Vec<u32> = (0..k).map(|_| rng.gen_range(lo..i) as u32).collect();
            p.sort_unstable();
            p.dedup();
            p
        })
        .collect()
}

/// The DAG as a job of no-op tasks `t0`, `t1`, ...
pub fn dag_spec(preds: &[Vec<u32>]) -> JobSpec {
    let tasks = preds
        .iter()
        .enumerate()
        .map(|(i, p)| TaskSpec {
            id: format!("t{i}"),
            after: p.iter().map(|j| format!("t{j}")).collect(),
            inputs: Vec::new(),
            steps: vec![Step::Noop],
            retry: None,
        })
        .collect();
    JobSpec {
        name: format!("bench-{}", preds.len()),
        retry: RetryPolicy::default(),
        tasks,
    }
}

/// Worker processes, killed and reaped on drop.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn_workers(
    o: &BenchJobsOptions,
    addr: &str,
    token: &[u8],
    dir: &std::path::Path,
) -> Result<Workers, JobsError> {
    use std::os::unix::ffi::OsStrExt;
    let token = std::ffi::OsStr::from_bytes(token);
    let bin = std::env::var_os("FERRITE_BIN")
        .map(PathBuf::from)
        .or_else(|| std::env::current_exe().ok())
        .unwrap_or_else(|| "ferrite".into());
    let mut children = Workers(Vec::new());
    for w in 0..o.workers {
        let child = Command::new(&bin)
            .args([
                "worker",
                "--engine",
                addr,
                "--xstreams",
                &o.xstreams.to_string(),
            ])
            .args(["--name", &format!("bench-w{w}")])
            .args(["--task-state", &o.task_state.to_string()])
            .arg("--state-dir")
            .arg(dir.join(format!("w{w}")))
            .env("FERRITE_TOKEN", token)
            .stdin(Stdio::null())
            .spawn()
            .map_err(JobsError::io("spawn worker"))?;
        children.0.push(child);
    }
    Ok(children)
}

/// Runs the benchmark against `addr` (authenticating with `token`) with
/// worker processes it starts.
pub fn run_against(
    o: &BenchJobsOptions,
    addr: &str,
    token: &[u8],
) -> Result<BenchJobsReport, JobsError> {
    let preds = random_dag(o.tasks, (o.min_deps, o.max_deps), o.window, o.seed);
    let text = serde_json::to_string(&dag_spec(&preds))
        .map_err(|e| JobsError::Unexpected(e.to_string()))?;
    let dir = tempfile::tempdir().map_err(JobsError::io("temp dir"))?;
    let _workers = spawn_workers(o, addr, token, dir.path())?;
    let mut client = JobClient::connect(addr, token)?;
    // Workers, and the engine when it offers streams.
    client.wait_resources(o.workers + u32::from(o.engine_slots > 0))?;
    let store = match o.store.as_deref() {
        None => None,
        Some("embedded") => Some(embedded_store()?),
        Some(url) => Some(crate::client::Client::connect(url)?),
    };
    let t0 = std::time::Instant::now();
    let job = match &store {
        Some(s) => client.submit_stored(&text, SpecFormat::Json, s)?,
        None => client.submit(&text, SpecFormat::Json)?,
    };
    let submit_s = t0.elapsed().as_secs_f64();
    let (state, cause) = client.wait(job)?;
    if state != JobPhase::Done {
        return Err(JobsError::Service(format!(
            "bench job ended {}: {}",
            state.as_str(),
            cause.unwrap_or_default()
        )));
    }
    // The final state, gathered from the workers' task state objects.
    let status = client.status(job)?;
    report(o, &status, submit_s)
}

fn report(
    o: &BenchJobsOptions,
    status: &JobStatus,
    submit_s: f64,
) -> Result<BenchJobsReport, JobsError> {
    let mut hist =
        hdrhistogram::Histogram::<u64>::new(3).map_err(|e| JobsError::Unexpected(e.to_string()))?;
    let mut from_end = hist.clone();
    let mut preds_end = vec![0u64; status.tasks.len()];
    for &(b, a) in &status.edges {
        let end = status.tasks[b as usize].end_ns.unwrap_or(0);
        let slot = &mut preds_end[a as usize];
        *slot = (*slot).max(end);
    }
    let (mut first, mut last) = (u64::MAX, 0u64);
    for (t, &pred_end) in status.tasks.iter().zip(&preds_end) {
        let (Some(r), Some(s), Some(e)) = (t.ready_ns, t.start_ns, t.end_ns) else {
            return Err(JobsError::Unexpected(format!("task {} has no times", t.id)));
        };
        first = first.min(r);
        last = last.max(e);
        let _ = hist.record(s.saturating_sub(r) / 1000);
        if pred_end > 0 {
            let _ = from_end.record(s.saturating_sub(pred_end) / 1000);
        }
    }
    let run_s = last.saturating_sub(first) as f64 / 1e9;
    Ok(BenchJobsReport {
        tasks: status.tasks.len(),
        workers: o.workers,
        xstreams: o.xstreams,
        engine_slots: o.engine_slots,
        submit_s,
        run_s,
        tasks_per_s: status.tasks.len() as f64 / run_s.max(1e-9),
        delay_us_p50: hist.value_at_quantile(0.5) as f64,
        delay_us_p99: hist.value_at_quantile(0.99) as f64,
        delay_us_max: hist.max() as f64,
        delay_from_pred_end_us_p50: from_end.value_at_quantile(0.5) as f64,
        delay_from_pred_end_us_p99: from_end.value_at_quantile(0.99) as f64,
    })
}

#[cfg(feature = "embedded")]
fn embedded_store() -> Result<crate::client::Client, JobsError> {
    Ok(crate::embedded::connect()?)
}

#[cfg(not(feature = "embedded"))]
fn embedded_store() -> Result<crate::client::Client, JobsError> {
    Err(JobsError::Store(
        "built without the `embedded` feature: give an engine URL".into(),
    ))
}

/// Writes the DAG for `hack/bench-dask`.
pub fn emit_dag(o: &BenchJobsOptions, path: &std::path::Path) -> Result<(), JobsError> {
    let preds = random_dag(o.tasks, (o.min_deps, o.max_deps), o.window, o.seed);
    let text = serde_json::json!({ "tasks": o.tasks, "preds": preds }).to_string();
    std::fs::write(path, text).map_err(JobsError::io("write dag"))
}
