//! Guards the TaskGraph contract on random graphs: every task runs once,
//! only after all of its dependencies finished; failures cancel exactly the
//! transitive dependents, with a failed ancestor as cause; a dependency that
//! would close a cycle is refused exactly when it would.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ferrite_xstream::{
    Error, RunOptions, Task, TaskClass, TaskError, TaskGraph, TaskId, TaskOutcome, XstreamId,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct NodeSpec {
    deps: Vec<usize>,
    placement: Option<usize>,
    kind: u8,
    fails: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Model {
    Completed,
    Failed,
    Canceled,
}

fn graph_strategy() -> impl Strategy<Value = Vec<NodeSpec>> {
    let node = (
        proptest::collection::vec(any::<prop::sample::Index>(), 0..=8),
        proptest::option::of(0usize..64),
        0u8..3,
        proptest::bool::weighted(0.08),
    );
    proptest::collection::vec(node, 1..90).prop_map(|raw| {
        let mut fan_out = vec![0usize; raw.len()];
        raw.into_iter()
            .enumerate()
            .map(|(i, (picks, placement, kind, fails))| {
                let mut deps: Vec<usize> = Vec::new();
                if i > 0 {
                    for p in picks {
                        let d = p.index(i);
                        if fan_out[d] < 8 && !deps.contains(&d) {
                            fan_out[d] += 1;
                            deps.push(d);
                        }
                    }
                }
                NodeSpec {
                    deps,
                    placement,
                    kind,
                    fails,
                }
            })
            .collect()
    })
}

type Seen = Arc<Mutex<HashMap<u32, TaskOutcome>>>;

fn build(specs: &[NodeSpec], xstreams: usize, seen: &Seen) -> TaskGraph {
    let mut graph = TaskGraph::with_capacity(specs.len());
    for spec in specs {
        let fails = spec.fails;
        let mut task = match spec.kind {
            0 if !fails => Task::noop(),
            0 | 1 => Task::new(move || {
                if fails {
                    Err(TaskError::new("sync failure"))
                } else {
                    Ok(())
                }
            }),
            _ => Task::new_async(TaskClass::Foreground, move || async move {
                glommio::yield_if_needed().await;
                if fails {
                    Err(TaskError::new("async failure"))
                } else {
                    Ok(())
                }
            }),
        };
        if let Some(p) = spec.placement {
            task = task.on(XstreamId(p % xstreams));
        }
        let seen = seen.clone();
        task = task.completion_callback(move |id, outcome| {
            seen.lock().unwrap().insert(id.0, outcome.clone());
        });
        let deps: Vec<TaskId> = spec.deps.iter().map(|&d| TaskId(d as u32)).collect();
        graph.add(&deps, task).unwrap();
    }
    graph
}

fn model(specs: &[NodeSpec]) -> Vec<Model> {
    let mut out: Vec<Model> = Vec::with_capacity(specs.len());
    for spec in specs {
        let m = if spec.deps.iter().any(|&d| out[d] != Model::Completed) {
            Model::Canceled
        } else if spec.fails {
            Model::Failed
        } else {
            Model::Completed
        };
        out.push(m);
    }
    out
}

fn is_ancestor(specs: &[NodeSpec], ancestor: usize, of: usize) -> bool {
    let mut stack = vec![of];
    let mut seen = vec![false; specs.len()];
    while let Some(n) = stack.pop() {
        for &d in &specs[n].deps {
            if d == ancestor {
                return true;
            }
            if !seen[d] {
                seen[d] = true;
                stack.push(d);
            }
        }
    }
    false
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_dags_respect_dependencies_and_failures(specs in graph_strategy(), seed in any::<u64>()) {
        let set = common::shared_set();
        let seen: Seen = Arc::default();
        let graph = build(&specs, set.len(), &seen);
        let options = RunOptions::seeded(seed).with_trace();
        let report = common::block_on(graph.run(set.mesh(), options)).unwrap();
        let expected = model(&specs);
        let count = |m| expected.iter().filter(|&&e| e == m).count() as u64;
        prop_assert_eq!(report.completed, count(Model::Completed));
        prop_assert_eq!(report.canceled, count(Model::Canceled));
        prop_assert_eq!(report.failed.len() as u64, count(Model::Failed));
        // Each task once, after every dependency finished.
        prop_assert_eq!(report.trace.len(), specs.len());
        let mut by_task = HashMap::new();
        for e in &report.trace {
            prop_assert!(by_task.insert(e.task.0 as usize, e.clone()).is_none(), "task ran twice");
        }
        for (i, spec) in specs.iter().enumerate() {
            for &d in &spec.deps {
                prop_assert!(by_task[&i].started > by_task[&d].finished, "task {} started before dep {}", i, d);
            }
            if let Some(p) = spec.placement {
                prop_assert_eq!(by_task[&i].xstream, XstreamId(p % set.len()));
            }
        }
        // Callbacks saw the modelled outcome; causes are failed ancestors.
        let seen = seen.lock().unwrap();
        prop_assert_eq!(seen.len(), specs.len());
        for (i, m) in expected.iter().enumerate() {
            match (&seen[&(i as u32)], m) {
                (TaskOutcome::Completed, Model::Completed) | (TaskOutcome::Failed(_), Model::Failed) => {}
                (TaskOutcome::Canceled { cause, error }, Model::Canceled) => {
                    let c = cause.0 as usize;
                    prop_assert_eq!(expected[c], Model::Failed);
                    prop_assert!(is_ancestor(&specs, c, i));
                    prop_assert!(error.message.contains("failure"));
                }
                (got, want) => prop_assert!(false, "task {}: got {:?}, model {:?}", i, got, want),
            }
        }
    }

    #[test]
    fn cycles_are_refused_exactly_when_they_would_close(specs in graph_strategy(), pairs in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 1..20)) {
        let seen: Seen = Arc::default();
        let mut graph = build(&specs, 1, &seen);
        let mut specs = specs;
        for (a, b) in pairs {
            let (task, on) = (a.index(specs.len()), b.index(specs.len()));
            // `task` waits for `on`: a cycle iff `on` already waits for `task`.
            let closes = task == on || is_ancestor(&specs, task, on);
            match graph.add_dependency(TaskId(task as u32), TaskId(on as u32)) {
                Ok(()) => {
                    prop_assert!(!closes, "accepted a cycle {} -> {}", task, on);
                    specs[task].deps.push(on);
                }
                Err(Error::Cycle { cycle, .. }) => {
                    prop_assert!(closes, "refused a non-cycle {} -> {}", task, on);
                    prop_assert!(cycle.len() >= 2);
                    prop_assert_eq!(cycle.first(), cycle.last());
                }
                Err(e) => prop_assert!(false, "unexpected error {}", e),
            }
        }
    }
}

/// A large random DAG (fan-in and fan-out up to 8) of no-op tasks, spread
/// over all xstreams, runs to completion with a callback on a sample.
#[test]
fn large_random_dag_completes() {
    const N: usize = 200_000;
    let set = common::shared_set();
    let mut rng = ferrite_xstream::SeededRng::new(0xDA6);
    let mut graph = TaskGraph::with_capacity(N);
    let mut fan_out = vec![0u8; N];
    let mut deps: Vec<TaskId> = Vec::with_capacity(8);
    let called = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for i in 0..N {
        deps.clear();
        for _ in 0..if i == 0 { 0 } else { rng.below(9) } {
            let d = rng.below(i);
            if fan_out[d] < 8 && !deps.contains(&TaskId(d as u32)) {
                fan_out[d] += 1;
                deps.push(TaskId(d as u32));
            }
        }
        let mut task = Task::noop();
        if i % 1000 == 0 {
            let called = called.clone();
            task = task.completion_callback(move |_, outcome| {
                if matches!(outcome, TaskOutcome::Completed) {
                    called.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
        graph.add(&deps, task).unwrap();
    }
    assert!(graph.edge_count() > 2 * N);
    let report = common::block_on(graph.run(set.mesh(), RunOptions::seeded(5))).unwrap();
    assert_eq!(report.completed, N as u64);
    assert_eq!(called.load(std::sync::atomic::Ordering::SeqCst), N / 1000);
    assert!(report.rounds >= 1);
}
