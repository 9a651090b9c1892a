//! Deterministic simulation of the manager: random DAGs, random finishing
//! order, nodes lost and offered. Seed from `FERRITE_SEED` to replay.

use std::collections::HashMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use ferrite_proto::rpc_jobs::{JobSpec, RetryPolicy, Step, TaskSpec};

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
}

impl Sim {
    fn pump(&mut self) {
        for a in self.rm.take_actions() {
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
                Action::Record { .. } => {}
            }
        }
    }
}

#[test]
fn random_dags_respect_constraints_through_node_loss() {
    let seed: u64 = std::env::var("FERRITE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("FERRITE_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..20 {
        let n = rng.gen_range(1..300);
        let graph = Arc::new(JobGraph::build(round + 1, random_spec(&mut rng, n, 50)).unwrap());
        let mut sim = Sim {
            rm: ResourceManager::new(2, rng.gen_range(1..8)),
            held: HashMap::new(),
            phases: vec![],
            granted: vec![],
        };
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
                .nodes
                .values()
                .filter(|n| n.alive)
                .map(|n| n.free.len() as u32 * sim.rm.depth)
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
