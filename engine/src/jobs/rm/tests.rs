//! Deterministic simulation of the manager: random DAGs, random finishing
//! order, nodes lost and offered. Seed from `FERRITE_SEED` to replay.

use std::collections::HashMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use ferrite_proto::rpc_jobs::{JobSpec, RetryPolicy, Step, TaskPhase, TaskSpec};

fn random_spec(rng: &mut StdRng, n: usize, max_attempts: u32) -> JobSpec {
    let tasks = (0..n)
        .map(|i| {
            let k = if i == 0 {
                0
            } else {
                rng.gen_range(0..4.min(i + 1))
            };
            let after = (0..k)
                .map(|_| format!("t{}", rng.gen_range(0..i)))
                .collect();
            TaskSpec {
                id: format!("t{i}"),
                after,
                inputs: vec![],
                steps: vec![Step::Noop],
                retry: None,
            }
        })
        .collect();
    JobSpec {
        name: "sim".into(),
        retry: RetryPolicy {
            max_attempts,
            on_failure: false,
        },
        tasks,
    }
}

fn result(a: &Assignment, t: u64, exit_code: i32) -> TaskResult {
    TaskResult {
        job: a.job,
        idx: a.idx,
        attempt: a.attempt,
        xstream: a.xstream,
        start_ns: t,
        end_ns: t,
        exit_code,
        error: None,
        stdout: vec![],
        stderr: vec![],
    }
}

struct Sim {
    rm: ResourceManager,
    held: HashMap<NodeId, Vec<Assignment>>,
    phases: Vec<(u128, JobPhase)>,
    granted: Vec<Assignment>,
    flow: Flow,
}

/// The flow the manager's actions show, checked as they come: a job gets a
/// coordinator slot, that slot splits it and asks for streams, and each task
/// goes to a stream the manager granted that job's coordinator.
#[derive(Default)]
struct Flow {
    /// job -> its coordinator slot.
    slot_of: HashMap<u128, u32>,
    /// Jobs that hold a slot now.
    running: HashMap<u128, u32>,
    /// Jobs split, by the slot that split them, and the tasks it then
    /// asked streams for.
    split_by: HashMap<u128, (u32, u32)>,
    /// (job, node, xstream) -> streams granted and not yet sent a task.
    unsent: HashMap<(u128, NodeId, u32), u32>,
    /// Every grant of a stream: (job, slot, node, xstream).
    streams: Vec<(u128, u32, NodeId, u32)>,
}

impl Flow {
    fn see(&mut self, action: &Action, slots: u32) {
        match action {
            Action::CoordinatorGranted { job, slot } => {
                assert!(*slot < slots, "slot {slot} is not one of the {slots}");
                assert!(
                    self.running.values().all(|s| s != slot),
                    "slot {slot} granted twice"
                );
                assert!(self.slot_of.insert(*job, *slot).is_none());
                self.running.insert(*job, *slot);
            }
            Action::Split { job, slot, ready } => {
                assert_eq!(self.slot_of.get(job), Some(slot), "split off its slot");
                let split = self.split_by.insert(*job, (*slot, *ready));
                assert!(split.is_none(), "split twice");
            }
            Action::StreamsGranted { job, slot, streams } => {
                let by = self.split_by.get(job).map(|s| s.0);
                assert_eq!(by, Some(*slot), "streams before the split or off its slot");
                assert!(!streams.is_empty());
                for &(n, x) in streams {
                    *self.unsent.entry((*job, n, x)).or_default() += 1;
                    self.streams.push((*job, *slot, n, x));
                }
            }
            Action::Grant { node, tasks } => {
                for a in tasks {
                    let left = self.unsent.get_mut(&(a.job, *node, a.xstream));
                    let left = left
                        .filter(|l| **l > 0)
                        .expect("task on an ungranted stream");
                    *left -= 1;
                }
            }
            Action::JobPhase { job, phase, .. } if phase.is_final() => {
                self.running.remove(job);
            }
            _ => {}
        }
    }
}

impl Sim {
    fn new(rm: ResourceManager) -> Self {
        Self {
            rm,
            held: HashMap::new(),
            phases: vec![],
            granted: vec![],
            flow: Flow::default(),
        }
    }

    fn pump(&mut self) {
        let slots = self.rm.resources.slots();
        for a in self.rm.take_actions() {
            self.flow.see(&a, slots);
            match a {
                Action::Grant { node, tasks } => {
                    self.granted.extend(tasks.iter().cloned());
                    self.held.entry(node).or_default().extend(tasks);
                }
                Action::JobPhase { job, phase, .. } => self.phases.push((job, phase)),
                Action::Revoke { node, job } => {
                    if let Some(h) = self.held.get_mut(&node) {
                        h.retain(|a| a.job != job);
                    }
                }
                _ => {}
            }
        }
        assert!(
            self.flow.unsent.values().all(|&l| l == 0),
            "a granted stream got no task"
        );
    }
}

#[test]
fn random_dags_respect_constraints_through_node_loss() {
    let seed = ferrite_xstream::seed_from_env();
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..20 {
        let n = rng.gen_range(1..300);
        let graph = Arc::new(JobGraph::build(round + 1, random_spec(&mut rng, n, 50)).unwrap());
        let mut sim = Sim::new(ResourceManager::new(2, rng.gen_range(1..8)));
        let mut next_node = 1;
        for _ in 0..3 {
            let ev = Event::NodeOffered {
                node: next_node,
                name: format!("n{next_node}"),
                xstreams: 2,
            };
            sim.rm.handle(ev, 0);
            next_node += 1;
        }
        sim.rm.handle(
            Event::JobSubmitted {
                graph: graph.clone(),
                restored: vec![],
            },
            0,
        );
        sim.pump();
        let mut done_at: Vec<Option<u64>> = vec![None; n];
        let mut finished_count = vec![0u32; n];
        for t in 1..100_000u64 {
            if sim.phases.iter().any(|p| p.1.is_final()) {
                break;
            }
            let nodes: Vec<NodeId> = sim
                .held
                .keys()
                .copied()
                .filter(|k| !sim.held[k].is_empty())
                .collect();
            assert!(
                !nodes.is_empty(),
                "seed {seed}: stalled with nothing granted"
            );
            let node = nodes[rng.gen_range(0..nodes.len())];
            if rng.gen_bool(0.01) {
                sim.held.remove(&node);
                sim.rm.handle(Event::NodeLost { node }, t);
                let ev = Event::NodeOffered {
                    node: next_node,
                    name: format!("n{next_node}"),
                    xstreams: 1,
                };
                sim.rm.handle(ev, t);
                next_node += 1;
            } else {
                let h = sim.held.get_mut(&node).unwrap();
                let k = rng.gen_range(1..=h.len());
                let batch: Vec<_> = h.drain(..k).collect();
                for a in &batch {
                    for &p in &graph.preds[a.idx as usize] {
                        assert!(
                            done_at[p as usize].is_some(),
                            "seed {seed}: {} ran before {p}",
                            a.idx
                        );
                    }
                    done_at[a.idx as usize] = Some(t);
                    finished_count[a.idx as usize] += 1;
                }
                let results = batch.iter().map(|a| result(a, t, 0)).collect();
                sim.rm.handle(Event::TasksFinished { node, results }, t);
            }
            sim.pump();
        }
        assert_eq!(
            sim.phases.last().map(|p| p.1),
            Some(JobPhase::Done),
            "seed {seed}"
        );
        assert!(
            finished_count.iter().all(|&c| c == 1),
            "seed {seed}: a task finished twice"
        );
        let rows = sim.rm.rows(round + 1).unwrap();
        assert!(rows.iter().all(|r| r.state == TaskPhase::Done));
        assert_eq!(
            sim.rm.free_grants(),
            sim.rm
                .resources
                .nodes
                .values()
                .filter(|n| n.alive)
                .map(|n| n.free.len() as u32 * sim.rm.resources.depth)
                .sum::<u32>()
        );
    }
}

fn chain(n: usize, max_attempts: u32) -> Arc<JobGraph> {
    let tasks = (0..n)
        .map(|i| TaskSpec {
            id: format!("c{i}"),
            after: if i == 0 {
                vec![]
            } else {
                vec![format!("c{}", i - 1)]
            },
            inputs: vec![],
            steps: vec![Step::Noop],
            retry: None,
        })
        .collect();
    let spec = JobSpec {
        name: "chain".into(),
        retry: RetryPolicy {
            max_attempts,
            on_failure: false,
        },
        tasks,
    };
    Arc::new(JobGraph::build(9, spec).unwrap())
}

#[test]
fn lost_node_exhausting_retries_fails_the_job_with_the_cause() {
    let mut rm = ResourceManager::new(1, 4);
    rm.handle(
        Event::NodeOffered {
            node: 1,
            name: "w1".into(),
            xstreams: 1,
        },
        0,
    );
    rm.handle(
        Event::JobSubmitted {
            graph: chain(2, 1),
            restored: vec![],
        },
        0,
    );
    rm.take_actions();
    rm.handle(Event::NodeLost { node: 1 }, 5);
    let actions = rm.take_actions();
    let cause = actions.iter().find_map(|a| match a {
        Action::JobPhase {
            phase: JobPhase::Failed,
            cause,
            ..
        } => cause.clone(),
        _ => None,
    });
    let cause = cause.expect("job failed");
    assert!(cause.contains("\"c0\"") && cause.contains("w1"), "{cause}");
    assert_eq!(rm.rows(9).unwrap()[1].state, TaskPhase::Cancelled);
}

#[test]
fn queue_waits_for_a_coordinator_and_restored_tasks_are_not_rerun() {
    let mut rm = ResourceManager::new(1, 4);
    rm.handle(
        Event::NodeOffered {
            node: 1,
            name: "w1".into(),
            xstreams: 1,
        },
        0,
    );
    let first = chain(1, 1);
    rm.handle(
        Event::JobSubmitted {
            graph: first,
            restored: vec![],
        },
        0,
    );
    // A second job with a restored, done first task.
    let spec = chain(3, 1).spec.clone();
    let second = Arc::new(JobGraph::build(10, spec).unwrap());
    let mut row = rm.rows(9).unwrap()[0].clone();
    row.state = TaskPhase::Done;
    rm.handle(
        Event::JobSubmitted {
            graph: second,
            restored: vec![(row, vec![])],
        },
        0,
    );
    let actions = rm.take_actions();
    let granted: Vec<_> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Grant { tasks, .. } => Some(tasks.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(granted.len(), 1);
    assert_eq!(
        granted[0].job, 9,
        "job 10 must wait for the only coordinator slot"
    );
    assert_eq!(rm.phase(10).unwrap().0, JobPhase::Queued);
    rm.handle(
        Event::TasksFinished {
            node: 1,
            results: vec![result(&granted[0], 1, 0)],
        },
        1,
    );
    let granted: Vec<_> = rm
        .take_actions()
        .into_iter()
        .filter_map(|a| match a {
            Action::Grant { tasks, .. } => Some(tasks),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(
        granted.iter().map(|a| (a.job, a.idx)).collect::<Vec<_>>(),
        vec![(10, 1)]
    );
}

#[test]
fn failing_task_retries_on_failure_then_fails_the_job() {
    let mut spec = chain(1, 2).spec.clone();
    spec.retry.on_failure = true;
    let g = Arc::new(JobGraph::build(11, spec).unwrap());
    let mut rm = ResourceManager::new(1, 4);
    rm.handle(
        Event::NodeOffered {
            node: 1,
            name: "w1".into(),
            xstreams: 1,
        },
        0,
    );
    rm.handle(
        Event::JobSubmitted {
            graph: g,
            restored: vec![],
        },
        0,
    );
    for attempt in 0..2 {
        let a = rm
            .take_actions()
            .into_iter()
            .find_map(|a| match a {
                Action::Grant { mut tasks, .. } => tasks.pop(),
                _ => None,
            })
            .expect("granted");
        assert_eq!(a.attempt, attempt);
        rm.handle(
            Event::TasksFinished {
                node: 1,
                results: vec![result(&a, 1, 3)],
            },
            1,
        );
    }
    let (phase, cause) = rm.phase(11).unwrap();
    assert_eq!(phase, JobPhase::Failed);
    assert!(cause.unwrap().contains("exit code 3"));
}

/// Guards the flow of the issue: the job queue asks for a coordinator slot
/// per job, the granted slot splits its job and asks the manager for streams
/// for the ready tasks, and every task goes to a stream the manager granted
/// that job's coordinator (checked action by action in `Flow::see`).
#[test]
fn each_job_is_split_on_its_granted_slot_which_asks_for_its_streams() {
    let seed = ferrite_xstream::seed_from_env();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut sim = Sim::new(ResourceManager::new(2, 3));
    for node in 1..=2 {
        let name = format!("w{node}");
        sim.rm.handle(
            Event::NodeOffered {
                node,
                name,
                xstreams: 2,
            },
            0,
        );
    }
    let graphs: Vec<_> = (1..=4u128)
        .map(|job| {
            let n = rng.gen_range(1..200);
            Arc::new(JobGraph::build(job, random_spec(&mut rng, n, 1)).unwrap())
        })
        .collect();
    for graph in &graphs {
        let (graph, restored) = (graph.clone(), vec![]);
        sim.rm.handle(Event::JobSubmitted { graph, restored }, 0);
    }
    sim.pump();
    assert_eq!(
        sim.flow.split_by.len(),
        2,
        "seed {seed}: two slots, two splits"
    );
    assert_eq!(sim.rm.phase(3).unwrap().0, JobPhase::Queued, "seed {seed}");
    for t in 1..100_000u64 {
        if sim.phases.iter().filter(|p| p.1.is_final()).count() == graphs.len() {
            break;
        }
        let nodes: Vec<NodeId> = (1..=2).filter(|n| !sim.held[n].is_empty()).collect();
        assert!(!nodes.is_empty(), "seed {seed}: stalled");
        let node = nodes[rng.gen_range(0..nodes.len())];
        let h = sim.held.get_mut(&node).unwrap();
        let k = rng.gen_range(1..=h.len());
        let results = h.drain(..k).map(|a| result(&a, t, 0)).collect();
        sim.rm.handle(Event::TasksFinished { node, results }, t);
        sim.pump();
    }
    for g in &graphs {
        let job = g.job;
        assert_eq!(sim.rm.phase(job).unwrap().0, JobPhase::Done, "seed {seed}");
        let slot = sim.flow.slot_of[&job];
        let (by, ready) = sim.flow.split_by[&job];
        assert_eq!(by, slot, "seed {seed}: job {job} split off its slot");
        assert_eq!(sim.rm.coordinator_slot(job), Some(slot));
        let roots = g.preds.iter().filter(|p| p.is_empty()).count() as u32;
        assert_eq!(ready, roots, "seed {seed}: job {job} asked for its roots");
        let streams = sim.flow.streams.iter().filter(|s| s.0 == job);
        assert!(streams.clone().all(|s| s.1 == slot));
        assert_eq!(streams.count(), g.len(), "seed {seed}: one stream per task");
    }
}
