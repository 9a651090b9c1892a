//! Turning a [`TaskGraph`] into per-xstream shards and running them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use super::exchange::Exchange;
use super::shard::{Shard, ShardResult};
use super::{Body, Callback, TaskError, TaskGraph, TaskId, ANY, NONE};
use crate::error::{Error, Result};
use crate::mesh::Mesh;
use crate::{TaskClass, XstreamId};

/// How to run a graph.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Draws the ready order; the same seed gives the same order.
    pub seed: u64,
    /// Record a [`TraceEntry`] per task (costs a little per task).
    pub record_trace: bool,
    /// Task class the per-xstream schedulers (and inline bodies) run in.
    pub class: TaskClass,
}

impl RunOptions {
    pub fn seeded(seed: u64) -> Self {
        Self {
            seed,
            record_trace: false,
            class: TaskClass::Foreground,
        }
    }

    /// Seeded from `FERRITE_SEED` or the clock; the seed is printed.
    pub fn from_env() -> Self {
        Self::seeded(crate::rng::seed_from_env())
    }

    pub fn with_trace(mut self) -> Self {
        self.record_trace = true;
        self
    }
}

/// One task's run, in trace mode. `started`/`finished` are ticks of one
/// clock shared by all xstreams: a task's `started` is above the `finished`
/// of every task it depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    pub task: TaskId,
    pub xstream: XstreamId,
    pub round: u32,
    pub started: u64,
    pub finished: u64,
}

/// What a run did.
#[derive(Debug)]
pub struct GraphReport {
    pub seed: u64,
    pub completed: u64,
    pub canceled: u64,
    /// Failed tasks and their errors, by task id.
    pub failed: Vec<(TaskId, Arc<TaskError>)>,
    /// Exchange rounds the run took.
    pub rounds: u32,
    /// Per xstream in order, each xstream's tasks in the order they started.
    pub trace: Vec<TraceEntry>,
}

/// What every shard reads: the edges in compressed rows and where each task
/// lives.
pub(crate) struct Plan {
    pub(crate) offsets: Vec<u32>,
    pub(crate) targets: Vec<u32>,
    pub(crate) shard_of: Vec<u16>,
    pub(crate) local_of: Vec<u32>,
    pub(crate) exchange: Exchange,
    pub(crate) failures: Mutex<HashMap<u32, Arc<TaskError>>>,
    pub(crate) clock: AtomicU64,
    pub(crate) options: RunOptions,
}

impl Plan {
    pub(crate) fn exchange_len(&self) -> usize {
        self.exchange.len()
    }
}

/// The tasks one shard owns, by local index.
pub(crate) struct ShardTasks {
    pub(crate) ids: Vec<u32>,
    pub(crate) pending: Vec<u32>,
    pub(crate) bodies: Vec<Body>,
    pub(crate) callbacks: Vec<Option<Callback>>,
}

impl TaskGraph {
    /// Runs every task on the xstreams of `mesh` and resolves when all are
    /// done (completed, failed or canceled). The future is `Send`: await it
    /// on an xstream or block on it from any thread.
    pub fn run(
        self,
        mesh: &Mesh,
        options: RunOptions,
    ) -> impl Future<Output = Result<GraphReport>> + Send + 'static {
        let mesh = mesh.clone();
        let prepared = self.prepare(mesh.len(), options);
        async move {
            let (plan, shards) = prepared?;
            let class = plan.options.class;
            let runs = shards.into_iter().enumerate().map(|(i, tasks)| {
                let plan = plan.clone();
                mesh.run_on(XstreamId(i), class, move || {
                    Shard::new(i, plan, tasks).run()
                })
            });
            let results = futures::future::join_all(runs).await;
            let mut merged = Vec::with_capacity(results.len());
            for r in results {
                merged.push(r??);
            }
            Ok(merge(&plan, merged))
        }
    }

    fn prepare(self, shards: usize, options: RunOptions) -> Result<(Arc<Plan>, Vec<ShardTasks>)> {
        let n = self.len();
        let shard_of = self.resolve_placement(shards)?;
        let mut offsets = vec![0u32; n + 1];
        for (from, &head) in self.first_out.iter().enumerate() {
            let mut degree = 0;
            let mut edge = head;
            while edge != NONE {
                degree += 1;
                edge = self.edge_next[edge as usize];
            }
            offsets[from + 1] = offsets[from] + degree;
        }
        let mut targets = vec![0u32; self.edge_to.len()];
        for (from, &head) in self.first_out.iter().enumerate() {
            let mut at = offsets[from] as usize;
            let mut edge = head;
            while edge != NONE {
                targets[at] = self.edge_to[edge as usize];
                at += 1;
                edge = self.edge_next[edge as usize];
            }
        }
        let mut tasks: Vec<ShardTasks> = (0..shards)
            .map(|_| ShardTasks {
                ids: Vec::new(),
                pending: Vec::new(),
                bodies: Vec::new(),
                callbacks: Vec::new(),
            })
            .collect();
        let mut local_of = Vec::with_capacity(n);
        let parts = self
            .bodies
            .into_iter()
            .zip(self.callbacks)
            .zip(self.in_degree);
        for (id, ((body, callback), in_degree)) in parts.enumerate() {
            let shard = &mut tasks[shard_of[id] as usize];
            local_of.push(shard.ids.len() as u32);
            shard.ids.push(id as u32);
            shard.pending.push(in_degree);
            shard.bodies.push(body);
            shard.callbacks.push(callback);
        }
        let plan = Plan {
            offsets,
            targets,
            shard_of,
            local_of,
            exchange: Exchange::new(shards),
            failures: Mutex::new(HashMap::new()),
            clock: AtomicU64::new(1),
            options,
        };
        Ok((Arc::new(plan), tasks))
    }

    fn resolve_placement(&self, shards: usize) -> Result<Vec<u16>> {
        if shards > u16::MAX as usize {
            let reason = format!("a graph runs on at most {} xstreams", u16::MAX);
            return Err(Error::InvalidCoreList {
                cores: Vec::new(),
                reason,
            });
        }
        self.placement
            .iter()
            .enumerate()
            .map(|(id, &p)| match p {
                ANY => Ok((id % shards) as u16),
                p if (p as usize) < shards => Ok(p as u16),
                p => Err(Error::NoSuchXstream {
                    xstream: XstreamId(p as usize),
                    count: shards,
                }),
            })
            .collect()
    }
}

fn merge(plan: &Plan, shards: Vec<ShardResult>) -> GraphReport {
    let mut report = GraphReport {
        seed: plan.options.seed,
        completed: 0,
        canceled: 0,
        failed: Vec::new(),
        rounds: 0,
        trace: Vec::new(),
    };
    for s in shards {
        report.completed += s.completed;
        report.canceled += s.canceled;
        report.rounds = report.rounds.max(s.rounds);
        report.trace.extend(s.trace);
    }
    let failures = plan.failures.lock().unwrap_or_else(|e| e.into_inner());
    report.failed = failures
        .iter()
        .map(|(&t, e)| (TaskId(t), e.clone()))
        .collect();
    report.failed.sort_by_key(|(t, _)| *t);
    report
}
