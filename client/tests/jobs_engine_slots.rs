//! Guards the engine's execution streams working next to a worker's: with
//! one engine task slot and one `ferrite worker`, the ready tasks of a job
//! are granted to both (each writes the task state objects of the tasks
//! it ran, under its own name), and `ferrite job status` shows the
//! coordinator slot that split the job, in text and in `--json`.
#![cfg(feature = "embedded")]

#[path = "jobs_common.rs"]
mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use ferrite_client::jobs::task_state::TaskState;
use ferrite_client::jobs::JobClient;
use ferrite_engine::config::EngineConfig;
use ferrite_engine::jobs::{JobService, JobServiceConfig};
use ferrite_engine::Engine;
use ferrite_proto::rpc_jobs::{JobPhase, SpecFormat, TaskPhase};
use ferrite_xstream::XstreamId;

/// Independent no-op tasks: all ready at once, more than one stream holds.
fn fan_out(tasks: usize) -> String {
    let mut text = "name='both'\n".to_string();
    for i in 0..tasks {
        text.push_str(&format!("[[task]]\nid='t{i}'\nsteps=[{{kind='noop'}}]\n"));
    }
    text
}

#[test]
fn engine_slots_and_a_worker_share_a_job() {
    common::watchdog(Duration::from_secs(90));
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineConfig::for_temp_dir(dir.path())).unwrap();
    let router = engine.router();
    let config = JobServiceConfig {
        // The worker reaches the store over the Unix socket (its uid is
        // the engine's), as `ferrite-engine` tells workers to; TCP would
        // need the engine's token.
        store: router
            .urls()
            .iter()
            .find(|u| u.starts_with("unix://"))
            .cloned(),
        task_slots: 1,
        depth: 4,
        router: Some(router),
        ..JobServiceConfig::new(dir.path().join("jobs")).with_token(common::TOKEN)
    };
    let last = XstreamId(engine.mesh().len() - 1);
    let service = JobService::start_on(config, engine.mesh(), last).unwrap();
    let addr = service.addr().to_string();
    let worker = common::Worker::start(&addr, "w0", 1, dir.path());
    let mut client = JobClient::connect(&addr, common::TOKEN).unwrap();
    let nodes = client.wait_resources(2).unwrap();
    assert_eq!(
        nodes,
        vec![("engine".to_string(), 1), ("w0".to_string(), 1)]
    );
    let job = client.submit(&fan_out(16), SpecFormat::Toml).unwrap();
    let (phase, cause) = client.wait(job).unwrap();
    assert_eq!(phase, JobPhase::Done, "{cause:?}");
    let status = client.status(job).unwrap();
    let used: BTreeSet<&str> = status
        .tasks
        .iter()
        .filter_map(|t| t.node.as_deref())
        .collect();
    assert_eq!(used, BTreeSet::from(["engine", "w0"]));
    // Each node's task state object holds exactly the tasks it ran.
    let objects = [
        (dir.path().join("jobs").join("tasks"), "engine"),
        (worker.state_dir.clone(), "w0"),
    ];
    let mut ran = 0;
    for (dir, node) in &objects {
        let rows = TaskState::open(dir, job, node).unwrap().rows().unwrap();
        assert!(!rows.is_empty(), "{node} ran no task");
        for row in &rows {
            assert_eq!(row.state, TaskPhase::Done);
            assert_eq!(status.tasks[row.idx as usize].node.as_deref(), Some(*node));
        }
        ran += rows.len();
    }
    assert_eq!(ran, 16);
    // `ferrite job status` names the slot that split the job.
    let cli = |json: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ferrite"));
        c.env("FERRITE_TOKEN", "jobs-test-token");
        c.args(["job", "status", &format!("{job:032x}"), "--engine", &addr]);
        if json {
            c.arg("--json");
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(cli(false).contains("split by engine/coordinator-0"));
    let json: serde_json::Value = serde_json::from_str(cli(true).trim()).unwrap();
    assert_eq!(json["coordinator"], "engine/coordinator-0");
    drop(worker);
    service.shutdown();
    engine.shutdown().unwrap();
}
