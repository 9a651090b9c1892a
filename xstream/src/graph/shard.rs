//! One xstream's part of a running graph: the tasks placed on it, their
//! pending-dependency counters, and its ready list.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::FutureExt;
use glommio::Task as GlommioTask;

use super::exchange::Batch;
use super::run::{Plan, ShardTasks, TraceEntry};
use super::{Body, TaskError, TaskId, TaskOutcome, NONE};
use crate::context;
use crate::error::{Error, Result};
use crate::rng::SeededRng;
use crate::XstreamId;

/// Tasks run between two checks whether the scheduler should yield.
const YIELD_EVERY: u32 = 128;
/// The ready task to run next is drawn from this many most recent ones.
const PICK_WINDOW: usize = 8;

pub(crate) struct ShardResult {
    pub(crate) completed: u64,
    pub(crate) canceled: u64,
    pub(crate) rounds: u32,
    pub(crate) trace: Vec<TraceEntry>,
}

pub(crate) struct Shard {
    me: usize,
    plan: Arc<Plan>,
    tasks: ShardTasks,
    ready: Vec<u32>,
    rng: SeededRng,
    outbox: Vec<Vec<u64>>,
    remaining: u64,
    finished_this_round: u64,
    round: u32,
    started: Vec<u64>,
    result: ShardResult,
}

type InFlight = Vec<(u32, GlommioTask<Result<(), TaskError>>)>;

impl Shard {
    pub(crate) fn new(me: usize, plan: Arc<Plan>, tasks: ShardTasks) -> Self {
        let n = tasks.ids.len();
        let shards = plan.exchange_len();
        let ready = (0..n as u32)
            .filter(|&l| tasks.slots[l as usize].pending == 0)
            .collect();
        let seed = plan.options.seed ^ (me as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let tracing = plan.options.record_trace;
        Self {
            me,
            ready,
            rng: SeededRng::new(seed),
            outbox: (0..shards).map(|_| Vec::new()).collect(),
            remaining: n as u64,
            finished_this_round: 0,
            round: 0,
            started: if tracing { vec![0; n] } else { Vec::new() },
            result: ShardResult {
                completed: 0,
                canceled: 0,
                rounds: 0,
                trace: Vec::new(),
            },
            plan,
            tasks,
        }
    }

    pub(crate) async fn run(mut self) -> Result<ShardResult> {
        let mut stash = Vec::new();
        loop {
            self.run_local().await;
            if self.exchange(&mut stash).await? {
                break;
            }
            self.round += 1;
        }
        self.result.rounds = self.round + 1;
        Ok(self.result)
    }

    /// Runs every task that is or becomes ready on this shard.
    async fn run_local(&mut self) {
        let mut in_flight: InFlight = Vec::new();
        let mut since_yield = 0;
        loop {
            while !self.ready.is_empty() {
                // A seeded pick among the most recently released tasks:
                // their rows are still in cache.
                let window = self.ready.len().min(PICK_WINDOW);
                let pick = self.ready.len() - 1 - self.rng.below(window);
                let local = self.ready.swap_remove(pick);
                self.start(local, &mut in_flight);
                since_yield += 1;
                if since_yield == YIELD_EVERY {
                    since_yield = 0;
                    glommio::yield_if_needed().await;
                }
            }
            if in_flight.is_empty() {
                return;
            }
            // Completions are applied in start order, whatever order they
            // finished in, so the ready order stays a function of the seed.
            for (local, task) in std::mem::take(&mut in_flight) {
                let outcome = match task.await {
                    Ok(()) => TaskOutcome::Completed,
                    Err(e) => TaskOutcome::Failed(Arc::new(e)),
                };
                self.finish(local, outcome);
            }
        }
    }

    fn start(&mut self, local: u32, in_flight: &mut InFlight) {
        let l = local as usize;
        if self.plan.options.record_trace {
            self.started[l] = self.plan.clock.fetch_add(1, Ordering::SeqCst);
        }
        let cause = self.tasks.slots[l].cause;
        if cause != NONE {
            let error = self.failure(cause);
            let outcome = TaskOutcome::Canceled {
                cause: TaskId(cause),
                error,
            };
            return self.finish(local, outcome);
        }
        if !self.has_extras(l) {
            return self.finish(local, TaskOutcome::Completed);
        }
        match std::mem::replace(&mut self.tasks.bodies[l], Body::Noop) {
            Body::Noop => self.finish(local, TaskOutcome::Completed),
            Body::Sync(body) => {
                let outcome = match catch_unwind(AssertUnwindSafe(body)) {
                    Ok(Ok(())) => TaskOutcome::Completed,
                    Ok(Err(e)) => TaskOutcome::Failed(Arc::new(e)),
                    Err(_) => TaskOutcome::Failed(Arc::new(TaskError::new("the task panicked"))),
                };
                self.finish(local, outcome)
            }
            Body::Async(class, body) => {
                let future = AssertUnwindSafe(async move { body().await }).catch_unwind();
                let future =
                    future.map(|r| r.unwrap_or_else(|_| Err(TaskError::new("the task panicked"))));
                match context::spawn(class, future) {
                    Ok(task) => in_flight.push((local, task)),
                    Err(e) => self.finish(local, TaskOutcome::Failed(Arc::new(TaskError::new(e)))),
                }
            }
        }
    }

    fn has_extras(&self, l: usize) -> bool {
        self.tasks.extras[l / 64] & (1 << (l % 64)) != 0
    }

    fn finish(&mut self, local: u32, outcome: TaskOutcome) {
        let l = local as usize;
        if self.plan.options.record_trace {
            let finished = self.plan.clock.fetch_add(1, Ordering::SeqCst);
            self.result.trace.push(TraceEntry {
                task: TaskId(self.tasks.ids[l]),
                xstream: XstreamId(self.me),
                round: self.round,
                started: self.started[l],
                finished,
            });
        }
        let cause = match &outcome {
            TaskOutcome::Completed => {
                self.result.completed += 1;
                NONE
            }
            TaskOutcome::Failed(error) => {
                let id = self.tasks.ids[l];
                let mut failures = self.plan.failures.lock().unwrap_or_else(|e| e.into_inner());
                failures.insert(id, error.clone());
                id
            }
            TaskOutcome::Canceled { cause, .. } => {
                self.result.canceled += 1;
                cause.0
            }
        };
        if self.has_extras(l) {
            if let Some(callback) = self.tasks.callbacks[l].take() {
                let id = TaskId(self.tasks.ids[l]);
                let _ = catch_unwind(AssertUnwindSafe(|| callback(id, &outcome)));
            }
        }
        let slot = self.tasks.slots[l];
        for edge in slot.edge_begin as usize..slot.edge_end as usize {
            let target = self.tasks.targets[edge];
            let (shard, dependent) = ((target >> 32) as usize, target as u32);
            if shard == self.me {
                self.release(dependent, cause);
            } else {
                self.outbox[shard].push(u64::from(dependent) << 32 | u64::from(cause));
            }
        }
        self.remaining -= 1;
        self.finished_this_round += 1;
    }

    /// One dependency of `local` is done (`cause` NONE) or failed.
    fn release(&mut self, local: u32, cause: u32) {
        let slot = &mut self.tasks.slots[local as usize];
        if cause != NONE && slot.cause == NONE {
            slot.cause = cause;
        }
        slot.pending -= 1;
        if slot.pending == 0 {
            self.ready.push(local);
        }
    }

    fn failure(&self, cause: u32) -> Arc<TaskError> {
        let failures = self.plan.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures
            .get(&cause)
            .cloned()
            .unwrap_or_else(|| Arc::new(TaskError::new("unknown failure")))
    }

    /// Sends this round's batches, applies the others'; true when every
    /// shard is done.
    async fn exchange(&mut self, stash: &mut Vec<Batch>) -> Result<bool> {
        let shards = self.outbox.len();
        let finished = std::mem::take(&mut self.finished_this_round);
        let mut global_remaining = self.remaining;
        let mut global_activity = finished;
        if shards == 1 {
            return self.settle(global_remaining, global_activity);
        }
        for to in (0..shards).filter(|&s| s != self.me) {
            let items = std::mem::take(&mut self.outbox[to]);
            let batch = Batch {
                round: self.round,
                from: self.me,
                remaining: self.remaining,
                finished,
                items,
            };
            if self.plan.exchange.send(to, batch).is_err() {
                return Err(Error::GraphStalled {
                    remaining: self.remaining,
                });
            }
            let plan = self.plan.clone();
            let wake: crate::mesh::Message = Box::new(move || plan.exchange.wake(to));
            self.plan.mesh.push(XstreamId(to), wake).await?;
        }
        let batches = self.plan.exchange.receive(self.me, self.round, stash).await;
        for batch in batches {
            global_remaining += batch.remaining;
            global_activity += batch.finished + batch.items.len() as u64;
            for item in batch.items {
                self.release((item >> 32) as u32, item as u32);
            }
        }
        self.settle(global_remaining, global_activity)
    }

    fn settle(&self, global_remaining: u64, global_activity: u64) -> Result<bool> {
        if global_remaining == 0 {
            Ok(true)
        } else if global_activity == 0 {
            Err(Error::GraphStalled {
                remaining: global_remaining,
            })
        } else {
            Ok(false)
        }
    }
}
