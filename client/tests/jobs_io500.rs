//! Guards `examples/io500.toml`, the IO500-style run as a job with one task per phase: its
//! constraints hold every dependency the phases have (`Phase::needs`, through any path) and
//! IO500's full order (every phase after every phase before it in `Phase::ORDER`), and
//! two workers run it — shrunk by the test to a small capped run on a temp directory — to a
//! passing score, with every phase's result handed on through the run directory and nothing
//! left behind.
#![cfg(feature = "embedded")]

#[path = "jobs_common.rs"]
mod common;

use std::time::Duration;

use ferrite_client::io500::phases::Phase;
use ferrite_client::jobs::JobClient;
use ferrite_engine::jobs::spec::{parse_spec, JobGraph};
use ferrite_engine::jobs::state::JobState;
use ferrite_proto::rpc_jobs::{JobPhase, JobSpec, SpecFormat, Step, TaskPhase};

fn example() -> JobSpec {
    parse_spec(include_str!("../../examples/io500.toml"), SpecFormat::Toml)
        .expect("examples/io500.toml parses")
}

/// The io500 phase each task runs, by task index.
fn phases(spec: &JobSpec) -> Vec<Option<Phase>> {
    spec.tasks
        .iter()
        .map(|t| {
            t.steps.iter().find_map(|s| match s {
                Step::Io500 { phase, .. } => Some(Phase::parse(phase).expect("a phase name")),
                _ => None,
            })
        })
        .collect()
}

#[test]
fn example_constraints_cover_what_every_phase_needs_and_io500_order() {
    let spec = example();
    let phases = phases(&spec);
    let graph = JobGraph::build(1, spec).unwrap();
    for phase in Phase::ORDER {
        let count = phases.iter().filter(|p| **p == Some(phase)).count();
        assert_eq!(count, 1, "one task runs {}", phase.name());
    }
    for (i, phase) in phases.iter().enumerate() {
        let Some(phase) = phase else { continue };
        // Every task that must have finished before task i.
        let mut before = vec![false; phases.len()];
        let mut stack = graph.preds[i].clone();
        while let Some(p) = stack.pop() {
            if !std::mem::replace(&mut before[p as usize], true) {
                stack.extend(&graph.preds[p as usize]);
            }
        }
        let at = |need: &Phase| phases.iter().position(|p| p == &Some(*need)).unwrap();
        for need in phase.needs() {
            assert!(
                before[at(need)],
                "{} runs before {}",
                need.name(),
                phase.name()
            );
        }
        // IO500 runs its phases one at a time, in order.
        let place = Phase::ORDER.iter().position(|p| p == phase).unwrap();
        for earlier in &Phase::ORDER[..place] {
            assert!(
                before[at(earlier)],
                "{} runs before {} (IO500's order)",
                earlier.name(),
                phase.name()
            );
        }
    }
}

/// Rewrites every argument list: `scratch` for the example's scratch directory, a stonewall
/// the caps end long before (exact counts), small caps.
fn shrink(spec: &mut JobSpec, scratch: &str) {
    let replace = |args: &mut Vec<String>| {
        for i in 0..args.len() {
            if args[i] == "io500-scratch" {
                args[i] = scratch.to_string();
            }
            let value = match args[i].as_str() {
                "--stonewall" => "10m",
                "--ior-easy-max-bytes" => "2MiB",
                "--ior-hard-max-segments" => "2",
                "--mdtest-easy-max-files" => "5",
                "--mdtest-hard-max-files" => "102",
                _ => continue,
            };
            args[i + 1] = value.to_string();
        }
    };
    for step in spec.tasks.iter_mut().flat_map(|t| t.steps.iter_mut()) {
        match step {
            Step::Io500 { args, .. } | Step::Exec { args, .. } => replace(args),
            _ => {}
        }
    }
}

#[test]
fn example_runs_phase_by_phase_on_two_workers() {
    common::watchdog(Duration::from_secs(120));
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("scratch");
    let mut spec = example();
    shrink(&mut spec, scratch.to_str().unwrap());
    let service = common::start_service(dir.path(), 4);
    let addr = service.addr().to_string();
    let _w1 = common::Worker::start(&addr, "a", 2, dir.path());
    let _w2 = common::Worker::start(&addr, "b", 1, dir.path());
    let mut client = JobClient::connect(&addr, common::TOKEN).unwrap();
    let text = serde_json::to_string(&spec).unwrap();
    let job = client.submit(&text, SpecFormat::Json).unwrap();
    let (phase, cause) = client.wait(job).unwrap();
    assert_eq!(phase, JobPhase::Done, "{cause:?}");
    service.shutdown();

    let path = dir
        .path()
        .join("jobs")
        .join(format!("{job:032x}.job.sqlite"));
    let st = JobState::open(&path).unwrap();
    let rows = st.rows().unwrap();
    assert!(rows.iter().all(|r| r.state == TaskPhase::Done), "{rows:?}");
    let idx = |id: &str| rows.iter().find(|r| r.id == id).unwrap().idx;
    let (score, _) = st.output(idx("score")).unwrap().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&score).unwrap();
    assert_eq!(report["phases"].as_array().unwrap().len(), 12);
    assert_eq!(report["verify_errors"], 0);
    assert_eq!(report["find_expected"], 2);
    assert_eq!(report["find_found"], 2);
    assert_eq!(report["leftover_entries"], 0);
    let (line, _) = st.output(idx("report")).unwrap().unwrap();
    assert!(String::from_utf8_lossy(&line).starts_with("\"score\""));
    assert!(!scratch.exists(), "remove-scratch ran");
}
