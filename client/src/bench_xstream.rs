//! `ferrite bench xstream`: Ferrite's execution streams against a tokio
//! multi-thread runtime with one worker per core, doing the same work in
//! the same process, one after the other:
//!
//! - `spawn_complete`: spawn empty tasks in batches of 1000 and await them,
//!   on every core at once; tasks per second per core.
//! - `round_trip_p50` / `round_trip_p99`: a request to another core and its
//!   answer. Ferrite: `Mesh::run_on` from xstream 0 to xstream 1 (spinning
//!   50 µs before parking). tokio: an mpsc request carrying a oneshot for
//!   the reply, between two current-thread runtimes on two threads (the
//!   multi-thread runtime cannot be told to put two tasks on two workers).
//! - `dag_random`: a random DAG (each node has up to 8 dependencies chosen
//!   among earlier nodes, each node at most 8 dependents) of no-op tasks run
//!   to completion; tasks per second. Ferrite: `PreparedGraph::run`, timed
//!   from the call to the report. tokio: an atomic counter per node and a
//!   `tokio::spawn` per ready node, timed from allocating the counters to
//!   the last completion. On both sides laying out the dependents in
//!   compressed rows (`TaskGraph::prepare`) is graph construction, untimed;
//!   Ferrite's is printed on stderr.
//!
//! `ratio` is always `ferrite / peer`: above 1 is better for rates, below 1
//! is better for latencies.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ferrite_xstream::{
    Mesh, RunOptions, SeededRng, Task, TaskClass, TaskGraph, TaskId, XstreamConfig, XstreamId,
    XstreamSet,
};
use hdrhistogram::Histogram;

/// What to measure, and how much.
#[derive(Clone, Debug)]
pub struct XstreamBenchOptions {
    pub dag_tasks: usize,
    pub round_trips: usize,
    pub spawns_per_core: usize,
    pub seed: u64,
    pub spin: Duration,
}

impl Default for XstreamBenchOptions {
    fn default() -> Self {
        Self {
            dag_tasks: 1_000_000,
            round_trips: 20_000,
            spawns_per_core: 2_000_000,
            seed: 0xF3_2217E,
            spin: Duration::from_micros(50),
        }
    }
}

/// One line of the comparison.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub name: String,
    pub unit: String,
    pub ferrite: f64,
    pub peer: f64,
    pub peer_name: String,
    pub ratio: f64,
}

const SPAWN_BATCH: usize = 1000;

/// Runs every measurement and returns the rows.
pub fn measure(options: &XstreamBenchOptions) -> anyhow::Result<Vec<Row>> {
    let config = XstreamConfig::default().with_spin(options.spin);
    let set = XstreamSet::start(config).context("starting the xstreams")?;
    let cores = set.len();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let peer_name = format!("tokio multi-thread ({cores} workers)");
    let row = |name: &str, unit: &str, ferrite: f64, peer: f64| Row {
        name: name.into(),
        unit: unit.into(),
        ferrite,
        peer,
        peer_name: peer_name.clone(),
        ratio: if peer > 0.0 { ferrite / peer } else { f64::NAN },
    };
    let mut rows = Vec::new();
    let ferrite = ferrite_spawn_rate(set.mesh(), options.spawns_per_core)?;
    let peer = tokio_spawn_rate(&runtime, cores, options.spawns_per_core);
    rows.push(row("spawn_complete", "tasks/s/core", ferrite, peer));
    let ferrite = ferrite_round_trips(set.mesh(), options.round_trips)?;
    let peer = tokio_round_trips(options.round_trips)?;
    for (name, q) in [("round_trip_p50", 0.5), ("round_trip_p99", 0.99)] {
        let mut r = row(name, "us", quantile_us(&ferrite, q), quantile_us(&peer, q));
        r.peer_name = "tokio current-thread x2 threads (mpsc+oneshot)".into();
        rows.push(r);
    }
    let dag = RandomDag::generate(options.dag_tasks, options.seed);
    let ferrite = ferrite_dag_rate(set.mesh(), &dag, options.seed)?;
    let peer = tokio_dag_rate(&runtime, &dag)?;
    rows.push(row("dag_random", "tasks/s", ferrite, peer));
    set.shutdown().context("stopping the xstreams")?;
    Ok(rows)
}

/// `ferrite bench xstream [--json]`.
pub fn run(options: &XstreamBenchOptions, json: bool) -> anyhow::Result<()> {
    let rows = measure(options)?;
    if json {
        for r in &rows {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(());
    }
    println!(
        "{:<16} {:>13} {:>14} {:>14} {:>8}   peer",
        "name", "unit", "ferrite", "peer", "ratio"
    );
    for r in &rows {
        println!(
            "{:<16} {:>13} {:>14.2} {:>14.2} {:>8.2}   {}",
            r.name, r.unit, r.ferrite, r.peer, r.ratio, r.peer_name
        );
    }
    println!(
        "(dag_random: {} tasks, seed {}; ratio = ferrite / peer)",
        options.dag_tasks, options.seed
    );
    Ok(())
}

fn quantile_us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).context("histogram bounds")
}

fn ferrite_spawn_rate(mesh: &Mesh, per_core: usize) -> anyhow::Result<f64> {
    let runs = (0..mesh.len()).map(|xs| {
        mesh.run_on(XstreamId(xs), TaskClass::Foreground, move || async move {
            let start = Instant::now();
            let mut tasks = Vec::with_capacity(SPAWN_BATCH);
            for _ in 0..per_core.div_ceil(SPAWN_BATCH) {
                for _ in 0..SPAWN_BATCH {
                    match ferrite_xstream::spawn(TaskClass::Foreground, async {}) {
                        Ok(t) => tasks.push(t),
                        Err(e) => return Err(e),
                    }
                }
                for t in tasks.drain(..) {
                    t.await;
                }
            }
            Ok(start.elapsed())
        })
    });
    let elapsed = futures::executor::block_on(futures::future::join_all(runs));
    let mut rate = 0.0;
    for e in elapsed {
        let e = e??;
        rate += per_core.div_ceil(SPAWN_BATCH) as f64 * SPAWN_BATCH as f64 / e.as_secs_f64();
    }
    Ok(rate / mesh.len() as f64)
}

fn tokio_spawn_rate(runtime: &tokio::runtime::Runtime, cores: usize, per_core: usize) -> f64 {
    let batches = per_core.div_ceil(SPAWN_BATCH);
    let elapsed = runtime.block_on(async move {
        let start = Instant::now();
        let drivers: Vec<_> = (0..cores)
            .map(|_| {
                tokio::spawn(async move {
                    let mut tasks = Vec::with_capacity(SPAWN_BATCH);
                    for _ in 0..batches {
                        tasks.extend((0..SPAWN_BATCH).map(|_| tokio::spawn(async {})));
                        for t in tasks.drain(..) {
                            let _ = t.await;
                        }
                    }
                })
            })
            .collect();
        for d in drivers {
            let _ = d.await;
        }
        start.elapsed()
    });
    (batches * SPAWN_BATCH) as f64 / elapsed.as_secs_f64()
}

fn ferrite_round_trips(mesh: &Mesh, count: usize) -> anyhow::Result<Histogram<u64>> {
    let target = XstreamId(if mesh.len() > 1 { 1 } else { 0 });
    let mesh2 = mesh.clone();
    let run = mesh.run_on(XstreamId(0), TaskClass::Foreground, move || async move {
        let mut h = new_histogram()?;
        for i in 0..count + count / 10 {
            let start = Instant::now();
            mesh2
                .run_on(target, TaskClass::Foreground, || async {})
                .await?;
            if i >= count / 10 {
                h.record(start.elapsed().as_nanos() as u64)?;
            }
        }
        Ok::<_, anyhow::Error>(h)
    });
    futures::executor::block_on(run)?
}

/// tokio's multi-thread runtime cannot place two tasks on two different
/// workers (a ping-pong there usually stays on one worker and never
/// crosses a core), so the round trip peer is two current-thread tokio
/// runtimes on two threads, talking over tokio mpsc + oneshot.
fn tokio_round_trips(count: usize) -> anyhow::Result<Histogram<u64>> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>(1024);
    let current_thread = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let echo_runtime = current_thread().context("building the echo runtime")?;
    let echo = std::thread::spawn(move || {
        echo_runtime.block_on(async move {
            while let Some(reply) = rx.recv().await {
                let _ = reply.send(());
            }
        })
    });
    let runtime = current_thread().context("building the ping runtime")?;
    let h = runtime.block_on(async move {
        let mut h = new_histogram()?;
        for i in 0..count + count / 10 {
            let start = Instant::now();
            let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
            tx.send(reply_tx)
                .await
                .map_err(|_| anyhow::anyhow!("echo task gone"))?;
            reply_rx.await?;
            if i >= count / 10 {
                h.record(start.elapsed().as_nanos() as u64)?;
            }
        }
        Ok::<_, anyhow::Error>(h)
    })?;
    echo.join()
        .map_err(|_| anyhow::anyhow!("echo thread panicked"))?;
    Ok(h)
}

/// A random DAG in compressed rows: node `i` depends on
/// `deps[offsets[i]..offsets[i + 1]]`, all `< i`.
pub struct RandomDag {
    pub offsets: Vec<u32>,
    pub deps: Vec<u32>,
}

impl RandomDag {
    /// Up to 8 distinct dependencies per node (uniform 0..=8 attempts), at
    /// most 8 dependents per node.
    pub fn generate(n: usize, seed: u64) -> Self {
        let mut rng = SeededRng::new(seed);
        let mut fan_out = vec![0u8; n];
        let mut offsets = Vec::with_capacity(n + 1);
        let mut deps: Vec<u32> = Vec::with_capacity(n * 4);
        offsets.push(0);
        for i in 0..n {
            let start = deps.len();
            if i > 0 {
                for _ in 0..rng.below(9) {
                    let d = rng.below(i);
                    if fan_out[d] < 8 && !deps[start..].contains(&(d as u32)) {
                        fan_out[d] += 1;
                        deps.push(d as u32);
                    }
                }
            }
            offsets.push(deps.len() as u32);
        }
        Self { offsets, deps }
    }

    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn deps_of(&self, i: usize) -> &[u32] {
        &self.deps[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }
}

fn ferrite_dag_rate(mesh: &Mesh, dag: &RandomDag, seed: u64) -> anyhow::Result<f64> {
    let mut graph = TaskGraph::with_capacity(dag.len());
    let mut ids: Vec<TaskId> = Vec::with_capacity(8);
    for i in 0..dag.len() {
        ids.clear();
        ids.extend(dag.deps_of(i).iter().map(|&d| TaskId(d)));
        graph.add(&ids, Task::noop())?;
    }
    let edges = graph.edge_count();
    let start = Instant::now();
    let prepared = graph.prepare(mesh.len())?;
    let prepare_time = start.elapsed();
    let start = Instant::now();
    let report = futures::executor::block_on(prepared.run(mesh, RunOptions::seeded(seed)))?;
    let elapsed = start.elapsed();
    eprintln!(
        "ferrite dag: {} tasks, {edges} edges, {} rounds, prepare {:.1} ms (untimed), run {:.1} ms",
        dag.len(),
        report.rounds,
        prepare_time.as_secs_f64() * 1e3,
        elapsed.as_secs_f64() * 1e3
    );
    anyhow::ensure!(
        report.completed as usize == dag.len(),
        "DAG run completed {} of {}",
        report.completed,
        dag.len()
    );
    Ok(dag.len() as f64 / elapsed.as_secs_f64())
}

struct TokioDag {
    offsets: Vec<u32>,
    dependents: Vec<u32>,
    pending: Vec<AtomicU32>,
    done: AtomicUsize,
    finished: tokio::sync::Notify,
}

fn tokio_run_node(dag: Arc<TokioDag>, node: u32) {
    let n = node as usize;
    for &d in &dag.dependents[dag.offsets[n] as usize..dag.offsets[n + 1] as usize] {
        if dag.pending[d as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
            let dag = dag.clone();
            tokio::spawn(async move { tokio_run_node(dag, d) });
        }
    }
    if dag.done.fetch_add(1, Ordering::AcqRel) + 1 == dag.pending.len() {
        dag.finished.notify_one();
    }
}

fn tokio_dag_rate(runtime: &tokio::runtime::Runtime, dag: &RandomDag) -> anyhow::Result<f64> {
    // Dependents in compressed rows (not timed, like TaskGraph::add).
    let n = dag.len();
    let mut offsets = vec![0u32; n + 1];
    for &d in &dag.deps {
        offsets[d as usize + 1] += 1;
    }
    for i in 0..n {
        offsets[i + 1] += offsets[i];
    }
    let mut fill = offsets.clone();
    let mut dependents = vec![0u32; dag.deps.len()];
    for i in 0..n {
        for &d in dag.deps_of(i) {
            dependents[fill[d as usize] as usize] = i as u32;
            fill[d as usize] += 1;
        }
    }
    let in_degree: Vec<u32> = (0..n).map(|i| dag.deps_of(i).len() as u32).collect();
    let elapsed = runtime.block_on(async move {
        let start = Instant::now();
        let state = Arc::new(TokioDag {
            offsets,
            dependents,
            pending: in_degree.iter().map(|&d| AtomicU32::new(d)).collect(),
            done: AtomicUsize::new(0),
            finished: tokio::sync::Notify::new(),
        });
        let finished = state.finished.notified();
        for (i, _) in in_degree.iter().enumerate().filter(|(_, &d)| d == 0) {
            let state = state.clone();
            tokio::spawn(async move { tokio_run_node(state, i as u32) });
        }
        if n > 0 {
            finished.await;
        }
        (start.elapsed(), state.done.load(Ordering::Acquire))
    });
    anyhow::ensure!(elapsed.1 == n, "tokio DAG completed {} of {n}", elapsed.1);
    Ok(n as f64 / elapsed.0.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_dag_respects_its_bounds() {
        let dag = RandomDag::generate(20_000, 5);
        let mut fan_out = vec![0usize; dag.len()];
        for i in 0..dag.len() {
            let deps = dag.deps_of(i);
            assert!(deps.len() <= 8);
            for &d in deps {
                assert!((d as usize) < i);
                fan_out[d as usize] += 1;
            }
        }
        assert!(fan_out.iter().all(|&f| f <= 8));
        assert!(
            dag.deps.len() > dag.len(),
            "about four dependencies per node on average"
        );
    }
}
