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

/// What every shard of a run shares.
pub(crate) struct Plan {
    pub(crate) mesh: Mesh,
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

/// The hot state of one task, in one 16-byte record so that running a
/// task touches one cache line for it: dependencies not yet done, the
/// failed task that cancels it (or NONE), and its row of dependents.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    pub(crate) pending: u32,
    pub(crate) cause: u32,
    pub(crate) edge_begin: u32,
    pub(crate) edge_end: u32,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 16);

/// The tasks one shard owns, by local index. Local task `l` releases
/// `targets[slots[l].edge_begin..slots[l].edge_end]`, each packed as
/// `shard << 32 | local`. Bit `l` of `extras` says whether it has a body or
/// a callback (otherwise `bodies[l]`/`callbacks[l]` are not looked at).
pub(crate) struct ShardTasks {
    pub(crate) ids: Vec<u32>,
    pub(crate) slots: Vec<Slot>,
    pub(crate) extras: Vec<u64>,
    pub(crate) bodies: Vec<Body>,
    pub(crate) callbacks: Vec<Option<Callback>>,
    pub(crate) targets: Vec<u64>,
}

/// A graph cut into per-xstream shards, ready to run.
pub struct PreparedGraph {
    shards: Vec<ShardTasks>,
}

impl std::fmt::Debug for PreparedGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tasks: Vec<usize> = self.shards.iter().map(|s| s.ids.len()).collect();
        f.debug_struct("PreparedGraph")
            .field("tasks_per_shard", &tasks)
            .finish()
    }
}

impl TaskGraph {
    /// Prepares and runs every task on the xstreams of `mesh`; resolves
    /// when all are done (completed, failed or canceled). The future is
    /// `Send`: await it on an xstream or block on it from any thread.
    pub fn run(
        self,
        mesh: &Mesh,
        options: RunOptions,
    ) -> impl Future<Output = Result<GraphReport>> + Send + 'static {
        let prepared = self.prepare(mesh.len());
        let mesh = mesh.clone();
        async move { prepared?.run(&mesh, options).await }
    }

    /// Cuts the graph into `xstreams` shards by placement (tasks without
    /// one are spread by id) and lays out each shard's dependents.
    pub fn prepare(self, xstreams: usize) -> Result<PreparedGraph> {
        let n = self.len();
        let shard_of = self.resolve_placement(xstreams)?;
        let mut shards: Vec<ShardTasks> = (0..xstreams)
            .map(|_| ShardTasks {
                ids: Vec::new(),
                slots: Vec::new(),
                extras: Vec::new(),
                bodies: Vec::new(),
                callbacks: Vec::new(),
                targets: Vec::new(),
            })
            .collect();
        let mut loc: Vec<u64> = Vec::with_capacity(n);
        let mut out_degree = vec![0u32; n];
        for (id, &s) in shard_of.iter().enumerate() {
            let shard = &mut shards[s as usize];
            loc.push(u64::from(s) << 32 | shard.ids.len() as u64);
            shard.ids.push(id as u32);
            let mut pending = 0;
            for d in self.dependencies(id as u32) {
                out_degree[d as usize] += 1;
                pending += 1;
            }
            shard.slots.push(Slot {
                pending,
                cause: NONE,
                edge_begin: 0,
                edge_end: 0,
            });
        }
        for shard in &mut shards {
            let mut end = 0u32;
            for (slot, &id) in shard.slots.iter_mut().zip(&shard.ids) {
                slot.edge_begin = end;
                end += out_degree[id as usize];
                slot.edge_end = end;
            }
            shard.targets = vec![0; end as usize];
            shard.extras = vec![0; shard.ids.len().div_ceil(64)];
        }
        let mut cursor: Vec<Vec<u32>> = shards
            .iter()
            .map(|s| s.slots.iter().map(|slot| slot.edge_begin).collect())
            .collect();
        for (id, &at) in loc.iter().enumerate() {
            for d in self.dependencies(id as u32) {
                let (s, l) = (
                    (loc[d as usize] >> 32) as usize,
                    loc[d as usize] as u32 as usize,
                );
                let slot = &mut cursor[s][l];
                shards[s].targets[*slot as usize] = at;
                *slot += 1;
            }
        }
        for (id, (body, callback)) in self.bodies.into_iter().zip(self.callbacks).enumerate() {
            let shard = &mut shards[shard_of[id] as usize];
            if !matches!(body, Body::Noop) || callback.is_some() {
                let l = loc[id] as u32 as usize;
                shard.extras[l / 64] |= 1 << (l % 64);
            }
            shard.bodies.push(body);
            shard.callbacks.push(callback);
        }
        Ok(PreparedGraph { shards })
    }

    fn resolve_placement(&self, shards: usize) -> Result<Vec<u16>> {
        if shards == 0 || shards > u16::MAX as usize {
            let reason = format!("a graph runs on 1 to {} xstreams, not {shards}", u16::MAX);
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

impl PreparedGraph {
    /// Runs the shards, one per xstream of `mesh` (which must have as many
    /// xstreams as the graph was prepared for).
    pub fn run(
        self,
        mesh: &Mesh,
        options: RunOptions,
    ) -> impl Future<Output = Result<GraphReport>> + Send + 'static {
        let mesh = mesh.clone();
        async move {
            if mesh.len() != self.shards.len() {
                return Err(Error::NoSuchXstream {
                    xstream: XstreamId(self.shards.len() - 1),
                    count: mesh.len(),
                });
            }
            let plan = Arc::new(Plan {
                mesh: mesh.clone(),
                exchange: Exchange::new(self.shards.len()),
                failures: Mutex::new(HashMap::new()),
                clock: AtomicU64::new(1),
                options,
            });
            let class = plan.options.class;
            let runs = self.shards.into_iter().enumerate().map(|(i, tasks)| {
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
