//! Finished tasks, lost nodes and the end of jobs.

use ferrite_proto::rpc_jobs::{JobPhase, TaskResult};

use super::coordinator::Verdict;
use super::{Action, NodeId, ResourceManager};
use crate::jobs::state::TaskOutcome;

impl ResourceManager {
    /// `node` finished these tasks: each frees its stream in the list and
    /// goes to its job's coordinator.
    pub(super) fn finished(&mut self, node_id: NodeId, results: Vec<TaskResult>, now_ns: u64) {
        let Some(node_name) = self.resources.nodes.get(&node_id).map(|n| n.name.clone()) else {
            return;
        };
        let mut records: Vec<(u128, Vec<TaskOutcome>)> = Vec::new();
        for r in results {
            let job = r.job;
            let Some(coordinator) = self.jobs.get_mut(&job) else {
                continue;
            };
            // A result counts only for the grant it answers.
            let Some(accepted) = coordinator.finished(node_id, &node_name, r, now_ns) else {
                continue;
            };
            self.resources.release(node_id, job, accepted.xstream);
            self.resources.request(job, coordinator.wanted());
            match records.last_mut() {
                Some((j, v)) if *j == job => v.push(accepted.outcome),
                _ => records.push((job, vec![accepted.outcome])),
            }
            if let Verdict::End(phase, cause) = accepted.verdict {
                // At once: the job's later results in the batch are refused.
                self.end_job(job, phase, cause);
            }
        }
        for (job, outcomes) in records {
            self.actions.push(Action::Record { job, outcomes });
        }
    }

    /// `node` is gone: its streams leave the list, and the coordinators of
    /// the jobs it ran tasks for run them again or fail.
    pub(super) fn node_lost(&mut self, node_id: NodeId, now_ns: u64) {
        let name = self
            .resources
            .nodes
            .get(&node_id)
            .map(|n| n.name.clone())
            .unwrap_or_default();
        for job in self.resources.node_lost(node_id) {
            let Some(coordinator) = self.jobs.get_mut(&job) else {
                continue;
            };
            match coordinator.node_lost(node_id, &name, now_ns) {
                Verdict::Continue => self.resources.request(job, coordinator.wanted()),
                Verdict::End(phase, cause) => self.end_job(job, phase, cause),
            }
        }
    }

    /// Ends a job: its coordinator cancels what did not run, the nodes
    /// running its tasks are told to drop them, and its slot and streams go
    /// back to the list (the next queued job starts at the end of the event).
    pub(super) fn end_job(&mut self, job: u128, phase: JobPhase, cause: Option<String>) {
        let Some(coordinator) = self.jobs.get_mut(&job) else {
            return;
        };
        if !coordinator.end(phase, cause.clone()) {
            return;
        }
        for node in self.resources.release_job(job, &coordinator.nodes) {
            self.actions.push(Action::Revoke { node, job });
        }
        self.queue.retain(|&j| j != job);
        self.actions.push(Action::JobPhase { job, phase, cause });
    }
}
