//! The resource manager and the job queue, as one event-driven state machine.
//!
//! Resources are execution streams: the engine offers `coordinator_slots`
//! control streams (node 0) that own running jobs, and every worker node
//! offers its xstreams, each able to hold `depth` granted tasks. Events come
//! in ([`Event`]), actions go out ([`Action`]); nothing here waits or polls.
//!
//! Flow: a submitted job waits in the queue until the manager grants it a
//! coordinator slot; the job is then split into tasks, and for each task whose
//! constraints are satisfied a worker stream is asked for and granted; a
//! finished task frees its stream, may make successors ready, and a job whose
//! tasks are all done releases its coordinator slot to the next queued job.
//! A lost node's leased tasks run again elsewhere under the retry policy.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use ferrite_proto::rpc_jobs::{JobPhase, TaskPhase, TaskResult, TaskRow};

use super::spec::JobGraph;
use super::state::TaskOutcome;

/// A node offering resources; 0 is the engine itself.
pub type NodeId = u32;

/// A task granted to one execution stream of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub job: u128,
    pub idx: u32,
    pub attempt: u32,
    pub xstream: u32,
    pub ready_ns: u64,
    /// The outputs of the task's inputs, concatenated.
    pub stdin: Vec<u8>,
}

/// Something that happened.
#[derive(Debug)]
pub enum Event {
    /// A node offers `xstreams` execution streams.
    NodeOffered {
        node: NodeId,
        name: String,
        xstreams: u32,
    },
    /// A node is gone (connection lost, process killed).
    NodeLost {
        node: NodeId,
    },
    /// A job enters the queue; `restored` carries rows and outputs of a job
    /// reloaded from its state file (done tasks are not run again).
    JobSubmitted {
        graph: Arc<JobGraph>,
        restored: Vec<(TaskRow, Vec<u8>)>,
    },
    /// A node ran these tasks.
    TasksFinished {
        node: NodeId,
        results: Vec<TaskResult>,
    },
    JobCancelled {
        job: u128,
    },
}

/// Something the service must do.
#[derive(Debug, PartialEq)]
pub enum Action {
    Grant {
        node: NodeId,
        tasks: Vec<Assignment>,
    },
    /// Tell a node to drop a job's tasks.
    Revoke { node: NodeId, job: u128 },
    /// Persist these task rows in the job state object.
    Record {
        job: u128,
        outcomes: Vec<TaskOutcome>,
    },
    JobPhase {
        job: u128,
        phase: JobPhase,
        cause: Option<String>,
    },
}

#[derive(Debug)]
struct Node {
    name: String,
    alive: bool,
    free: Vec<u32>,
    /// (job, idx) -> (attempt, xstream)
    leases: HashMap<(u128, u32), (u32, u32)>,
}

#[derive(Debug, Clone, Default)]
struct TaskInfo {
    node: Option<NodeId>,
    /// Node name of a task restored from the job state file.
    restored_node: Option<String>,
    xstream: u32,
    start_ns: Option<u64>,
    end_ns: Option<u64>,
    exit_code: Option<i32>,
    error: Option<String>,
}

#[derive(Debug)]
struct Run {
    graph: Arc<JobGraph>,
    phase: JobPhase,
    cause: Option<String>,
    waiting: Vec<u32>,
    state: Vec<TaskPhase>,
    attempt: Vec<u32>,
    ready_ns: Vec<u64>,
    info: Vec<TaskInfo>,
    ready: VecDeque<u32>,
    done: usize,
    outputs: HashMap<u32, Vec<u8>>,
    nodes: Vec<NodeId>,
}

/// The resource manager with its job queue.
#[derive(Debug)]
pub struct ResourceManager {
    depth: u32,
    coordinator_slots: u32,
    nodes: HashMap<NodeId, Node>,
    node_order: Vec<NodeId>,
    runs: HashMap<u128, Run>,
    queue: VecDeque<u128>,
    ready_jobs: VecDeque<u128>,
    actions: Vec<Action>,
}

impl ResourceManager {
    /// `coordinator_slots`: jobs running at once; `depth`: tasks granted to
    /// one execution stream at once.
    pub fn new(coordinator_slots: u32, depth: u32) -> Self {
        Self {
            depth: depth.max(1),
            coordinator_slots: coordinator_slots.max(1),
            nodes: HashMap::new(),
            node_order: Vec::new(),
            runs: HashMap::new(),
            queue: VecDeque::new(),
            ready_jobs: VecDeque::new(),
            actions: Vec::new(),
        }
    }

    /// Applies one event at time `now_ns`; then call [`Self::take_actions`].
    pub fn handle(&mut self, event: Event, now_ns: u64) {
        match event {
            Event::NodeOffered {
                node,
                name,
                xstreams,
            } => {
                let free = vec![self.depth; xstreams.max(1) as usize];
                self.nodes.insert(
                    node,
                    Node {
                        name,
                        alive: true,
                        free,
                        leases: HashMap::new(),
                    },
                );
                self.node_order.retain(|&n| n != node);
                self.node_order.push(node);
            }
            Event::NodeLost { node } => self.node_lost(node, now_ns),
            Event::JobSubmitted { graph, restored } => self.submit(graph, restored),
            Event::TasksFinished { node, results } => self.finished(node, results, now_ns),
            Event::JobCancelled { job } => {
                self.end_job(job, JobPhase::Cancelled, Some("cancelled".into()), now_ns)
            }
        }
        self.start_queued(now_ns);
        self.dispatch();
    }

    /// Actions produced since the last call.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    fn submit(&mut self, graph: Arc<JobGraph>, restored: Vec<(TaskRow, Vec<u8>)>) {
        let n = graph.len();
        let mut run = Run {
            waiting: graph.preds.iter().map(|p| p.len() as u32).collect(),
            graph,
            phase: JobPhase::Queued,
            cause: None,
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
            run.attempt[i] = row.attempt;
            if row.state == TaskPhase::Done {
                run.state[i] = TaskPhase::Done;
                run.ready_ns[i] = row.ready_ns.unwrap_or(0);
                run.info[i] = TaskInfo {
                    node: None,
                    restored_node: row.node.clone(),
                    xstream: row.xstream.unwrap_or(0),
                    start_ns: row.start_ns,
                    end_ns: row.end_ns,
                    exit_code: row.exit_code,
                    error: None,
                };
                if run.graph.is_input[i] {
                    run.outputs.insert(row.idx, stdout);
                }
            }
        }
        for i in 0..n {
            if run.state[i] == TaskPhase::Done {
                run.done += 1;
                for &s in &run.graph.succs[i] {
                    run.waiting[s as usize] -= 1;
                }
            }
        }
        let job = run.graph.job;
        self.runs.insert(job, run);
        self.queue.push_back(job);
    }

    /// Grants coordinator slots to queued jobs and splits them into tasks.
    fn start_queued(&mut self, now_ns: u64) {
        let running = self
            .runs
            .values()
            .filter(|r| r.phase == JobPhase::Running)
            .count() as u32;
        let mut free = self.coordinator_slots.saturating_sub(running);
        while free > 0 {
            let Some(job) = self.queue.pop_front() else {
                break;
            };
            let Some(run) = self.runs.get_mut(&job) else {
                continue;
            };
            if run.phase != JobPhase::Queued {
                continue;
            }
            free -= 1;
            run.phase = JobPhase::Running;
            self.actions.push(Action::JobPhase {
                job,
                phase: JobPhase::Running,
                cause: None,
            });
            for i in 0..run.state.len() {
                if run.state[i] == TaskPhase::Pending && run.waiting[i] == 0 {
                    run.state[i] = TaskPhase::Ready;
                    run.ready_ns[i] = now_ns;
                    run.ready.push_back(i as u32);
                }
            }
            if !run.ready.is_empty() {
                self.ready_jobs.push_back(job);
            }
            if run.done == run.state.len() {
                self.end_job(job, JobPhase::Done, None, now_ns);
            }
        }
    }

    /// The alive stream with the most free grants.
    fn best_slot(&self) -> Option<(NodeId, u32)> {
        let mut best: Option<(NodeId, u32, u32)> = None;
        for &id in &self.node_order {
            let node = &self.nodes[&id];
            if !node.alive {
                continue;
            }
            for (x, &f) in node.free.iter().enumerate() {
                if f > 0 && best.is_none_or(|(_, _, bf)| f > bf) {
                    best = Some((id, x as u32, f));
                }
            }
        }
        best.map(|(n, x, _)| (n, x))
    }

    /// Grants ready tasks to free streams, round robin over jobs.
    fn dispatch(&mut self) {
        let mut grants: HashMap<NodeId, Vec<Assignment>> = HashMap::new();
        while let Some(&job) = self.ready_jobs.front() {
            let Some((node_id, xstream)) = self.best_slot() else {
                break;
            };
            let Some(run) = self.runs.get_mut(&job) else {
                self.ready_jobs.pop_front();
                continue;
            };
            let Some(idx) = run.ready.pop_front() else {
                self.ready_jobs.pop_front();
                continue;
            };
            let i = idx as usize;
            run.state[i] = TaskPhase::Running;
            run.info[i].node = Some(node_id);
            run.info[i].xstream = xstream;
            if !run.nodes.contains(&node_id) {
                run.nodes.push(node_id);
            }
            let stdin = run.graph.inputs[i]
                .iter()
                .flat_map(|p| run.outputs.get(p).map(Vec::as_slice).unwrap_or(&[]))
                .copied()
                .collect();
            let a = Assignment {
                job,
                idx,
                attempt: run.attempt[i],
                xstream,
                ready_ns: run.ready_ns[i],
                stdin,
            };
            if run.ready.is_empty() {
                self.ready_jobs.pop_front();
            } else if self.ready_jobs.len() > 1 {
                self.ready_jobs.rotate_left(1);
            }
            if let Some(node) = self.nodes.get_mut(&node_id) {
                node.free[xstream as usize] -= 1;
                node.leases.insert((job, idx), (a.attempt, xstream));
            }
            grants.entry(node_id).or_default().push(a);
        }
        let mut nodes: Vec<_> = grants.into_iter().collect();
        nodes.sort_by_key(|(n, _)| *n);
        for (node, tasks) in nodes {
            self.actions.push(Action::Grant { node, tasks });
        }
    }
}

mod events;
mod query;

#[cfg(test)]
mod tests;
