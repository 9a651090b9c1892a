//! A coordinator: what runs on the coordinator slot the manager granted a
//! job. It splits the job into tasks, asks the manager for execution streams
//! for the tasks whose constraints are satisfied, sends each granted stream a
//! task, and follows the results (successors become ready, failures retry or
//! end the job). It owns the job's DAG state; the manager owns the streams.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use ferrite_proto::rpc_jobs::{JobPhase, TaskPhase, TaskResult, TaskRow};

use super::{Assignment, NodeId};
use crate::jobs::spec::JobGraph;
use crate::jobs::state::TaskOutcome;

#[derive(Debug, Clone, Default)]
pub(super) struct TaskInfo {
    pub node: Option<NodeId>,
    /// Node name of a task restored from the job state file.
    pub restored_node: Option<String>,
    pub xstream: u32,
    pub start_ns: Option<u64>,
    pub end_ns: Option<u64>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
}

/// Where a job goes after an event.
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    Continue,
    End(JobPhase, Option<String>),
}

/// An accepted result: the stream it frees and the row to persist.
pub(super) struct Accepted {
    /// The stream the task had been granted.
    pub xstream: u32,
    pub outcome: TaskOutcome,
    pub verdict: Verdict,
}

/// One job, queued or on its coordinator slot.
#[derive(Debug)]
pub(super) struct Coordinator {
    pub graph: Arc<JobGraph>,
    pub phase: JobPhase,
    pub cause: Option<String>,
    /// The coordinator slot the job was granted, once it was.
    pub slot: Option<u32>,
    waiting: Vec<u32>,
    pub state: Vec<TaskPhase>,
    pub attempt: Vec<u32>,
    pub ready_ns: Vec<u64>,
    pub info: Vec<TaskInfo>,
    ready: VecDeque<u32>,
    pub done: usize,
    outputs: HashMap<u32, Vec<u8>>,
    /// Nodes that ran tasks of the job (they hold its task state objects).
    pub nodes: Vec<NodeId>,
}

impl Coordinator {
    /// A submitted job, waiting for a coordinator slot; `restored` carries
    /// rows and outputs read back from its state file (done tasks stay done).
    pub fn new(graph: Arc<JobGraph>, restored: Vec<(TaskRow, Vec<u8>)>) -> Self {
        let n = graph.len();
        let mut me = Self {
            waiting: Vec::new(),
            graph,
            phase: JobPhase::Queued,
            cause: None,
            slot: None,
            state: vec![TaskPhase::Pending; n],
            attempt: vec![0; n],
            ready_ns: vec![0; n],
            info: vec![TaskInfo::default(); n],
            ready: VecDeque::new(),
            done: 0,
            outputs: HashMap::new(),
            nodes: Vec::new(),
        };
        for (row, stdout) in restored {
            let i = row.idx as usize;
            if i >= n {
                continue;
            }
            me.attempt[i] = row.attempt;
            if row.state != TaskPhase::Done || me.state[i] == TaskPhase::Done {
                continue;
            }
            me.state[i] = TaskPhase::Done;
            me.done += 1;
            me.ready_ns[i] = row.ready_ns.unwrap_or(0);
            me.info[i] = TaskInfo {
                node: None,
                restored_node: row.node.clone(),
                xstream: row.xstream.unwrap_or(0),
                start_ns: row.start_ns,
                end_ns: row.end_ns,
                exit_code: row.exit_code,
                error: None,
            };
            if me.graph.is_input[i] {
                me.outputs.insert(row.idx, stdout);
            }
        }
        me
    }

    /// On coordinator slot `slot`: splits the job into tasks — counts each
    /// task's unfinished predecessors and readies those with none. Returns
    /// whether the job is already complete (every task restored done).
    pub fn split(&mut self, slot: u32, now_ns: u64) -> Verdict {
        self.slot = Some(slot);
        self.phase = JobPhase::Running;
        let g = &self.graph;
        self.waiting = g
            .preds
            .iter()
            .map(|p| {
                p.iter()
                    .filter(|&&p| self.state[p as usize] != TaskPhase::Done)
                    .count() as u32
            })
            .collect();
        for i in 0..self.state.len() {
            if self.state[i] == TaskPhase::Pending && self.waiting[i] == 0 {
                self.state[i] = TaskPhase::Ready;
                self.ready_ns[i] = now_ns;
                self.ready.push_back(i as u32);
            }
        }
        match self.done == self.state.len() {
            true => Verdict::End(JobPhase::Done, None),
            false => Verdict::Continue,
        }
    }

    /// Tasks waiting for a stream: what the coordinator asks the manager for.
    pub fn wanted(&self) -> u32 {
        self.ready.len() as u32
    }

    /// Sends one ready task to each stream the manager granted.
    pub fn assign(&mut self, streams: &[(NodeId, u32)], out: &mut Vec<(NodeId, Assignment)>) {
        for &(node, xstream) in streams {
            let Some(idx) = self.ready.pop_front() else {
                // The manager grants at most what was asked for.
                debug_assert!(false, "stream granted without a ready task");
                break;
            };
            let i = idx as usize;
            self.state[i] = TaskPhase::Running;
            self.info[i].node = Some(node);
            self.info[i].xstream = xstream;
            if !self.nodes.contains(&node) {
                self.nodes.push(node);
            }
            let stdin = self.graph.inputs[i]
                .iter()
                .flat_map(|p| self.outputs.get(p).map(Vec::as_slice).unwrap_or(&[]))
                .copied()
                .collect();
            let a = Assignment {
                job: self.graph.job,
                idx,
                attempt: self.attempt[i],
                xstream,
                ready_ns: self.ready_ns[i],
                stdin,
            };
            out.push((node, a));
        }
    }

    /// A result from `node`: accepted only for the task's current grant
    /// (running there, same attempt).
    pub fn finished(
        &mut self,
        node: NodeId,
        node_name: &str,
        r: TaskResult,
        now_ns: u64,
    ) -> Option<Accepted> {
        let i = r.idx as usize;
        if self.phase != JobPhase::Running
            || self.state.get(i) != Some(&TaskPhase::Running)
            || self.info[i].node != Some(node)
            || self.attempt[i] != r.attempt
        {
            return None;
        }
        let xstream = self.info[i].xstream;
        let ok = r.error.is_none() && r.exit_code == 0;
        self.info[i] = TaskInfo {
            node: Some(node),
            restored_node: None,
            xstream: r.xstream,
            start_ns: Some(r.start_ns),
            end_ns: Some(r.end_ns),
            exit_code: Some(r.exit_code),
            error: r.error.clone(),
        };
        let policy = self.graph.retry(r.idx);
        let retry = !ok && policy.on_failure && r.attempt + 1 < policy.max_attempts;
        self.state[i] = match (ok, retry) {
            (true, _) => TaskPhase::Done,
            (false, true) => TaskPhase::Ready,
            (false, false) => TaskPhase::Failed,
        };
        let mut row = super::query::row_of(self, r.idx, node_name);
        row.attempt = r.attempt;
        let verdict = if ok {
            self.succeeded(r.idx, &r.stdout, now_ns)
        } else if retry {
            self.requeue(r.idx, now_ns);
            Verdict::Continue
        } else {
            let why = r
                .error
                .clone()
                .unwrap_or_else(|| format!("exit code {}", r.exit_code));
            let cause = format!(
                "task {:?} failed on {node_name}: {why}",
                self.graph.id(r.idx)
            );
            Verdict::End(JobPhase::Failed, Some(cause))
        };
        let outcome = TaskOutcome {
            row,
            stdout: r.stdout,
            stderr: r.stderr,
        };
        Some(Accepted {
            xstream,
            outcome,
            verdict,
        })
    }

    /// Task `idx` is done: its successors may become ready.
    fn succeeded(&mut self, idx: u32, stdout: &[u8], now_ns: u64) -> Verdict {
        let i = idx as usize;
        self.done += 1;
        if self.graph.is_input[i] {
            self.outputs.insert(idx, stdout.to_vec());
        }
        for &s in &self.graph.succs[i] {
            let w = &mut self.waiting[s as usize];
            *w -= 1;
            if *w == 0 && self.state[s as usize] == TaskPhase::Pending {
                self.state[s as usize] = TaskPhase::Ready;
                self.ready_ns[s as usize] = now_ns;
                self.ready.push_back(s);
            }
        }
        match self.done == self.state.len() {
            true => Verdict::End(JobPhase::Done, None),
            false => Verdict::Continue,
        }
    }

    /// Puts a task back in the ready queue for its next attempt.
    fn requeue(&mut self, idx: u32, now_ns: u64) {
        let i = idx as usize;
        self.attempt[i] += 1;
        self.state[i] = TaskPhase::Ready;
        self.ready_ns[i] = now_ns;
        self.ready.push_back(idx);
    }

    /// `node` is gone: its running tasks run again elsewhere under the
    /// retry policy, or the job fails naming the first that cannot.
    pub fn node_lost(&mut self, node: NodeId, name: &str, now_ns: u64) -> Verdict {
        if self.phase != JobPhase::Running {
            return Verdict::Continue;
        }
        for idx in 0..self.state.len() as u32 {
            let i = idx as usize;
            if self.state[i] != TaskPhase::Running || self.info[i].node != Some(node) {
                continue;
            }
            let attempt = self.attempt[i];
            let policy = self.graph.retry(idx);
            if attempt + 1 < policy.max_attempts {
                self.requeue(idx, now_ns);
                continue;
            }
            let cause = format!(
                "task {:?}: node {name} lost during attempt {} of {}",
                self.graph.id(idx),
                attempt + 1,
                policy.max_attempts
            );
            self.state[i] = TaskPhase::Failed;
            self.info[i].error = Some(cause.clone());
            return Verdict::End(JobPhase::Failed, Some(cause));
        }
        Verdict::Continue
    }

    /// Ends the job: what did not finish is cancelled. False if it had
    /// already ended.
    pub fn end(&mut self, phase: JobPhase, cause: Option<String>) -> bool {
        if self.phase.is_final() {
            return false;
        }
        self.phase = phase;
        self.cause = cause;
        self.ready.clear();
        for s in self.state.iter_mut().filter(|s| !s.is_final()) {
            *s = TaskPhase::Cancelled;
        }
        true
    }
}
