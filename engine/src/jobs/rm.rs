//! The resource manager and the job queue, as one event-driven state machine.
//!
//! Resources are execution streams: the engine offers `coordinator_slots`
//! control streams (node 0) that run jobs, and every worker node offers its
//! xstreams, each able to hold `depth` granted tasks. Events come in
//! ([`Event`]), actions go out ([`Action`]); nothing here waits or polls.
//!
//! Flow (each step is an [`Action`] too, so it can be followed): the job
//! queue asks the manager for a coordinator slot for a job and the manager
//! grants one ([`Action::CoordinatorGranted`]); the job is sent to that slot,
//! whose coordinator splits it into tasks and asks the manager for a stream
//! for each task whose constraints are satisfied ([`Action::Split`]); the
//! manager grants streams from its list ([`Action::StreamsGranted`]) and the
//! coordinator sends a task to each ([`Action::Grant`]); as a stream finishes
//! a task the manager is told, frees the stream in its list and hands the
//! result to the coordinator, which readies successors and asks for more. A
//! job whose tasks are all done releases its slot to the next queued job; a
//! lost node's tasks run again elsewhere under the retry policy.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use ferrite_proto::rpc_jobs::{JobPhase, TaskResult, TaskRow};

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
    /// The job queue's request for a coordinator slot for `job` was
    /// granted: the job goes to slot `slot` of the engine.
    CoordinatorGranted { job: u128, slot: u32 },
    /// Coordinator slot `slot` split `job` into tasks; `ready` of them had
    /// their constraints satisfied, and it asked the manager for as many
    /// streams.
    Split { job: u128, slot: u32, ready: u32 },
    /// The manager granted the coordinator of `job` (on slot `slot`) these
    /// streams (node, xstream), one per task it sends.
    StreamsGranted {
        job: u128,
        slot: u32,
        streams: Vec<(NodeId, u32)>,
    },
}

/// The name of the engine's coordinator slot `slot`, as job state files
/// record the resource that split a job.
pub fn coordinator_name(slot: u32) -> String {
    format!("engine/coordinator-{slot}")
}

/// The resource manager with its job queue and the jobs' coordinators.
#[derive(Debug)]
pub struct ResourceManager {
    resources: Resources,
    /// Jobs waiting for a coordinator slot, in arrival order.
    queue: VecDeque<u128>,
    /// Every job's coordinator (kept once ended, for status).
    jobs: HashMap<u128, Coordinator>,
    actions: Vec<Action>,
}

impl ResourceManager {
    /// `coordinator_slots`: jobs running at once; `depth`: tasks granted to
    /// one execution stream at once.
    pub fn new(coordinator_slots: u32, depth: u32) -> Self {
        Self {
            resources: Resources::new(coordinator_slots, depth),
            queue: VecDeque::new(),
            jobs: HashMap::new(),
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
            } => self.resources.offer(node, name, xstreams),
            Event::NodeLost { node } => self.node_lost(node, now_ns),
            Event::JobSubmitted { graph, restored } => {
                let job = graph.job;
                self.jobs.insert(job, Coordinator::new(graph, restored));
                self.queue.push_back(job);
            }
            Event::TasksFinished { node, results } => self.finished(node, results, now_ns),
            Event::JobCancelled { job } => {
                self.end_job(job, JobPhase::Cancelled, Some("cancelled".into()))
            }
        }
        self.start_queued(now_ns);
        self.serve();
    }

    /// No stream of `node` is granted to `job` (call before the job's
    /// [`Event::JobSubmitted`]): the engine's own streams (node 0) cannot
    /// reach a job's store in another engine.
    pub fn keep_off(&mut self, job: u128, node: NodeId) {
        self.resources.keep_off(job, node);
    }

    /// Actions produced since the last call.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// The job queue asks for a coordinator slot for each queued job; each
    /// granted job is sent to its slot, which splits it and asks for streams.
    fn start_queued(&mut self, now_ns: u64) {
        while let Some(&job) = self.queue.front() {
            let Some(coordinator) = self.jobs.get_mut(&job) else {
                self.queue.pop_front();
                continue;
            };
            if coordinator.phase != JobPhase::Queued {
                self.queue.pop_front();
                continue;
            }
            let Some(slot) = self.resources.grant_slot(job) else {
                break;
            };
            self.queue.pop_front();
            self.actions.push(Action::CoordinatorGranted { job, slot });
            let verdict = coordinator.split(slot, now_ns);
            let ready = coordinator.wanted();
            self.actions.push(Action::JobPhase {
                job,
                phase: JobPhase::Running,
                cause: None,
            });
            self.actions.push(Action::Split { job, slot, ready });
            self.resources.request(job, ready);
            if let Verdict::End(phase, cause) = verdict {
                self.end_job(job, phase, cause);
            }
        }
    }

    /// Grants streams to the coordinators' requests; each coordinator sends
    /// a task to every stream it was granted.
    fn serve(&mut self) {
        let granted = self.resources.serve();
        if granted.is_empty() {
            return;
        }
        let mut sent = Vec::new();
        for (job, streams) in granted {
            let Some(coordinator) = self.jobs.get_mut(&job) else {
                continue;
            };
            coordinator.assign(&streams, &mut sent);
            let slot = coordinator.slot.unwrap_or(0);
            self.actions
                .push(Action::StreamsGranted { job, slot, streams });
        }
        let mut grants: Vec<(NodeId, Vec<Assignment>)> = Vec::new();
        for (node, a) in sent {
            match grants.iter_mut().find(|(n, _)| *n == node) {
                Some((_, v)) => v.push(a),
                None => grants.push((node, vec![a])),
            }
        }
        grants.sort_by_key(|(n, _)| *n);
        for (node, tasks) in grants {
            self.actions.push(Action::Grant { node, tasks });
        }
    }
}

mod coordinator;
mod events;
mod query;
mod resources;

use coordinator::{Coordinator, Verdict};
use resources::Resources;

#[cfg(test)]
mod tests;
