//! What the manager knows about jobs, for status and listings.

use ferrite_proto::rpc_jobs::{JobPhase, JobSummary, TaskPhase, TaskRow};

use super::coordinator::Coordinator;
use super::{NodeId, ResourceManager};

/// The row for task `idx` of a job as its coordinator knows it.
pub(super) fn row_of(run: &Coordinator, idx: u32, node_name: &str) -> TaskRow {
    let i = idx as usize;
    let info = &run.info[i];
    let state = run.state[i];
    let started = !matches!(state, TaskPhase::Pending | TaskPhase::Ready);
    TaskRow {
        idx,
        id: run.graph.id(idx).to_string(),
        state,
        node: (started && !node_name.is_empty()).then(|| node_name.to_string()),
        xstream: started.then_some(info.xstream),
        attempt: run.attempt[i],
        ready_ns: (state != TaskPhase::Pending && run.ready_ns[i] != 0).then_some(run.ready_ns[i]),
        start_ns: info.start_ns,
        end_ns: info.end_ns,
        exit_code: info.exit_code,
        error: info.error.clone(),
    }
}

impl ResourceManager {
    fn node_name(&self, node: Option<NodeId>) -> &str {
        node.and_then(|n| self.resources.nodes.get(&n))
            .map(|n| n.name.as_str())
            .unwrap_or("")
    }

    /// Every task's row as the manager knows it.
    pub fn rows(&self, job: u128) -> Option<Vec<TaskRow>> {
        let run = self.jobs.get(&job)?;
        Some(
            (0..run.state.len() as u32)
                .map(|i| {
                    let info = &run.info[i as usize];
                    let name = match (&info.restored_node, info.node) {
                        (Some(n), None) => n.as_str(),
                        _ => self.node_name(info.node),
                    };
                    row_of(run, i, name)
                })
                .collect(),
        )
    }

    /// Alive nodes that hold task state objects of `job`.
    pub fn nodes_of(&self, job: u128) -> Vec<NodeId> {
        self.jobs
            .get(&job)
            .map(|r| {
                r.nodes
                    .iter()
                    .copied()
                    .filter(|n| self.resources.nodes.get(n).is_some_and(|n| n.alive))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn node_label(&self, node: NodeId) -> Option<&str> {
        self.resources.nodes.get(&node).map(|n| n.name.as_str())
    }

    /// The job's phase and, if it ended badly, why.
    pub fn phase(&self, job: u128) -> Option<(JobPhase, Option<String>)> {
        self.jobs.get(&job).map(|r| (r.phase, r.cause.clone()))
    }

    pub fn graph(&self, job: u128) -> Option<&std::sync::Arc<crate::jobs::spec::JobGraph>> {
        self.jobs.get(&job).map(|r| &r.graph)
    }

    /// One summary per known job, in id order.
    pub fn summaries(&self) -> Vec<JobSummary> {
        let mut out: Vec<_> = self
            .jobs
            .values()
            .map(|r| JobSummary {
                job: r.graph.job,
                name: r.graph.spec.name.clone(),
                state: r.phase,
                tasks: r.state.len() as u32,
                done: r.done as u32,
            })
            .collect();
        out.sort_by_key(|s| s.job);
        out
    }

    /// Alive nodes (the engine's own streams first, when it offers any,
    /// then workers) and their execution streams, in offer order.
    pub fn resources(&self) -> Vec<(String, u32)> {
        self.resources
            .node_order
            .iter()
            .filter_map(|n| self.resources.nodes.get(n))
            .filter(|n| n.alive)
            .map(|n| (n.name.clone(), n.free.len() as u32))
            .collect()
    }

    /// Free grants over all alive streams (for tests and metrics).
    pub fn free_grants(&self) -> u32 {
        self.resources.free_grants()
    }

    /// The coordinator slot running `job`, once one was granted.
    pub fn coordinator_slot(&self, job: u128) -> Option<u32> {
        self.jobs.get(&job).and_then(|c| c.slot)
    }
}
