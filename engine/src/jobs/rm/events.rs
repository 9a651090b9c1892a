//! Finished tasks, lost nodes and the end of jobs.

use ferrite_proto::rpc_jobs::{JobPhase, TaskPhase, TaskResult};

use super::{Action, NodeId, ResourceManager, TaskInfo};
use crate::jobs::state::TaskOutcome;

impl ResourceManager {
    pub(super) fn finished(&mut self, node_id: NodeId, results: Vec<TaskResult>, now_ns: u64) {
        let mut records: Vec<(u128, Vec<TaskOutcome>)> = Vec::new();
        for r in results {
            let Some(node) = self.nodes.get_mut(&node_id) else {
                return;
            };
            // A result counts only for the lease it answers.
            match node.leases.get(&(r.job, r.idx)) {
                Some(&(attempt, x)) if attempt == r.attempt => {
                    node.leases.remove(&(r.job, r.idx));
                    if let Some(f) = node.free.get_mut(x as usize) {
                        *f += 1;
                    }
                }
                _ => continue,
            }
            let node_name = node.name.clone();
            if let Some(outcome) = self.apply_result(node_id, node_name, r, now_ns) {
                match records.last_mut() {
                    Some((job, v)) if *job == outcome.0 => v.push(outcome.1),
                    _ => records.push((outcome.0, vec![outcome.1])),
                }
            }
        }
        for (job, outcomes) in records {
            self.actions.push(Action::Record { job, outcomes });
        }
    }

    /// Updates the run for one accepted result; returns the row to persist.
    fn apply_result(
        &mut self,
        node_id: NodeId,
        node_name: String,
        r: TaskResult,
        now_ns: u64,
    ) -> Option<(u128, TaskOutcome)> {
        let run = self.runs.get_mut(&r.job)?;
        let i = r.idx as usize;
        if run.phase != JobPhase::Running || run.state.get(i) != Some(&TaskPhase::Running) {
            return None;
        }
        let ok = r.error.is_none() && r.exit_code == 0;
        run.info[i] = TaskInfo {
            node: Some(node_id),
            restored_node: None,
            xstream: r.xstream,
            start_ns: Some(r.start_ns),
            end_ns: Some(r.end_ns),
            exit_code: Some(r.exit_code),
            error: r.error.clone(),
        };
        let policy = run.graph.retry(r.idx);
        let retry = !ok && policy.on_failure && r.attempt + 1 < policy.max_attempts;
        run.state[i] = if ok {
            TaskPhase::Done
        } else if retry {
            TaskPhase::Ready
        } else {
            TaskPhase::Failed
        };
        let mut row = super::query::row_of(run, r.idx, &node_name);
        row.attempt = r.attempt;
        let outcome = TaskOutcome {
            row,
            stdout: r.stdout,
            stderr: r.stderr,
        };
        let job = r.job;
        if ok {
            run.done += 1;
            if run.graph.is_input[i] {
                run.outputs.insert(r.idx, outcome.stdout.clone());
            }
            let mut newly_ready = false;
            for &s in &run.graph.succs[i] {
                let w = &mut run.waiting[s as usize];
                *w -= 1;
                if *w == 0 && run.state[s as usize] == TaskPhase::Pending {
                    run.state[s as usize] = TaskPhase::Ready;
                    run.ready_ns[s as usize] = now_ns;
                    run.ready.push_back(s);
                    newly_ready = true;
                }
            }
            let all_done = run.done == run.state.len();
            if newly_ready {
                self.mark_ready(job);
            }
            if all_done {
                self.end_job(job, JobPhase::Done, None, now_ns);
            }
        } else if retry {
            self.requeue(job, r.idx, now_ns);
        } else {
            let why = r
                .error
                .unwrap_or_else(|| format!("exit code {}", r.exit_code));
            let cause = format!(
                "task {:?} failed on {node_name}: {why}",
                run.graph.id(r.idx)
            );
            self.end_job(job, JobPhase::Failed, Some(cause), now_ns);
        }
        Some((job, outcome))
    }

    fn mark_ready(&mut self, job: u128) {
        if !self.ready_jobs.contains(&job) {
            self.ready_jobs.push_back(job);
        }
    }

    /// Puts a task back in its job's ready queue for its next attempt.
    fn requeue(&mut self, job: u128, idx: u32, now_ns: u64) {
        if let Some(run) = self.runs.get_mut(&job) {
            let i = idx as usize;
            run.attempt[i] += 1;
            run.state[i] = TaskPhase::Ready;
            run.ready_ns[i] = now_ns;
            run.ready.push_back(idx);
            self.mark_ready(job);
        }
    }

    pub(super) fn node_lost(&mut self, node_id: NodeId, now_ns: u64) {
        let Some(node) = self.nodes.get_mut(&node_id) else {
            return;
        };
        node.alive = false;
        node.free.iter_mut().for_each(|f| *f = 0);
        let name = node.name.clone();
        self.node_order.retain(|&n| n != node_id);
        let mut leases: Vec<_> = node.leases.drain().collect();
        leases.sort_unstable();
        for ((job, idx), (attempt, _)) in leases {
            let Some(run) = self.runs.get_mut(&job) else {
                continue;
            };
            if run.phase != JobPhase::Running || run.attempt[idx as usize] != attempt {
                continue;
            }
            let policy = run.graph.retry(idx);
            if attempt + 1 < policy.max_attempts {
                self.requeue(job, idx, now_ns);
            } else {
                let cause = format!(
                    "task {:?}: node {name} lost during attempt {} of {}",
                    run.graph.id(idx),
                    attempt + 1,
                    policy.max_attempts
                );
                run.state[idx as usize] = TaskPhase::Failed;
                run.info[idx as usize].error = Some(cause.clone());
                self.end_job(job, JobPhase::Failed, Some(cause), now_ns);
            }
        }
    }

    /// Ends a job: cancels what did not run, revokes what runs, releases
    /// its coordinator slot (the next queued job starts on the next event).
    pub(super) fn end_job(
        &mut self,
        job: u128,
        phase: JobPhase,
        cause: Option<String>,
        _now_ns: u64,
    ) {
        let Some(run) = self.runs.get_mut(&job) else {
            return;
        };
        if run.phase.is_final() {
            return;
        }
        run.phase = phase;
        run.cause = cause.clone();
        run.ready.clear();
        let mut revoked = Vec::new();
        for s in run.state.iter_mut().filter(|s| !s.is_final()) {
            *s = TaskPhase::Cancelled;
        }
        for &n in &run.nodes {
            if let Some(node) = self.nodes.get_mut(&n) {
                let before = node.leases.len();
                node.leases.retain(|&(j, _), &mut (_, x)| {
                    if j == job {
                        if let Some(f) = node.free.get_mut(x as usize) {
                            *f += 1;
                        }
                    }
                    j != job
                });
                if node.alive && node.leases.len() != before {
                    revoked.push(n);
                }
            }
        }
        self.queue.retain(|&j| j != job);
        self.ready_jobs.retain(|&j| j != job);
        for node in revoked {
            self.actions.push(Action::Revoke { node, job });
        }
        self.actions.push(Action::JobPhase { job, phase, cause });
    }
}
