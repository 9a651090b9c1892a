//! Guards: a random DAG run by several worker processes respects every
//! constraint (each task's recorded start is after every predecessor's
//! recorded end), fan-out/fan-in data edges deliver outputs in order, and
//! cyclic or dangling job files are refused naming the offending tasks.
#![cfg(feature = "embedded")]

#[path = "jobs_common.rs"]
mod common;

use std::time::Duration;

use ferrite_client::bench_jobs::{dag_spec, random_dag};
use ferrite_client::jobs::JobClient;
use ferrite_proto::rpc_jobs::{JobPhase, SpecFormat, TaskPhase};

#[test]
fn random_dags_on_three_workers_respect_every_constraint() {
    common::watchdog(Duration::from_secs(120));
    let dir = tempfile::tempdir().unwrap();
    let service = common::start_service(dir.path(), 4);
    let addr = service.addr().to_string();
    let _w: Vec<_> = (0..3)
        .map(|i| common::Worker::start(&addr, &format!("w{i}"), 2, dir.path()))
        .collect();
    let mut client = JobClient::connect(&addr, common::TOKEN).unwrap();
    assert_eq!(client.wait_resources(3).unwrap().len(), 3);
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    for round in 0..3u64 {
        let preds = random_dag(400, (0, 4), 40, seed.wrapping_add(round));
        let text = serde_json::to_string(&dag_spec(&preds)).unwrap();
        let job = client.submit(&text, SpecFormat::Json).unwrap();
        assert_eq!(client.wait(job).unwrap().0, JobPhase::Done);
        let status = client.status(job).unwrap();
        assert_eq!(
            status.answered.len(),
            3,
            "every worker answered: {:?}",
            status.answered
        );
        let mut nodes = std::collections::BTreeSet::new();
        for (i, t) in status.tasks.iter().enumerate() {
            assert_eq!(t.state, TaskPhase::Done, "task {}", t.id);
            let start = t.start_ns.unwrap();
            assert!(t.ready_ns.unwrap() <= start);
            for &p in &preds[i] {
                let before = &status.tasks[p as usize];
                assert!(
                    before.end_ns.unwrap() <= start,
                    "seed {seed}: {} started before {} ended",
                    t.id,
                    before.id
                );
            }
            nodes.insert(t.node.clone().unwrap());
        }
        assert!(nodes.len() >= 2, "work spread over workers: {nodes:?}");
    }
    service.shutdown();
}

#[test]
fn fan_out_fan_in_passes_outputs_along_data_edges() {
    common::watchdog(Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let service = common::start_service(dir.path(), 4);
    let addr = service.addr().to_string();
    let _w1 = common::Worker::start(&addr, "a", 2, dir.path());
    let _w2 = common::Worker::start(&addr, "b", 1, dir.path());
    let mut client = JobClient::connect(&addr, common::TOKEN).unwrap();
    let mut text = String::from(
        "name = 'fan'\n[[task]]\nid = 'src'\nsteps = [{kind='exec', cmd='echo', args=['x']}]\n",
    );
    for i in 0..8 {
        text += &format!(
            "[[task]]\nid = 'm{i}'\ninputs = ['src']\nsteps = [{{kind='exec', cmd='sh', args=['-c', 'read v; echo ${{v}}{i}']}}]\n"
        );
    }
    let inputs: Vec<String> = (0..8).rev().map(|i| format!("'m{i}'")).collect();
    text += &format!(
        "[[task]]\nid = 'join'\ninputs = [{}]\nsteps = [{{kind='exec', cmd='cat'}}]\n",
        inputs.join(",")
    );
    let job = client.submit(&text, SpecFormat::Toml).unwrap();
    assert_eq!(client.wait(job).unwrap().0, JobPhase::Done);
    service.shutdown();
    let path = dir
        .path()
        .join("jobs")
        .join(format!("{job:032x}.job.sqlite"));
    let st = ferrite_engine::jobs::state::JobState::open(&path).unwrap();
    let join = st
        .rows()
        .unwrap()
        .iter()
        .find(|r| r.id == "join")
        .unwrap()
        .idx;
    let (stdout, _) = st.output(join).unwrap().unwrap();
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        "x7\nx6\nx5\nx4\nx3\nx2\nx1\nx0\n"
    );
}

#[test]
fn cycles_and_unknown_references_are_refused_by_name() {
    common::watchdog(Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let service = common::start_service(dir.path(), 4);
    let mut client = JobClient::connect(&service.addr().to_string(), common::TOKEN).unwrap();
    let cyclic = r#"{"name":"c","task":[
        {"id":"a","after":["c"],"steps":[{"kind":"noop"}]},
        {"id":"b","after":["a"],"steps":[{"kind":"noop"}]},
        {"id":"c","after":["b"],"steps":[{"kind":"noop"}]}]}"#;
    let err = client
        .submit(cyclic, SpecFormat::Json)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cycle") && err.contains("a -> b -> c -> a")
            || err.contains("b -> c -> a -> b")
            || err.contains("c -> a -> b -> c"),
        "{err}"
    );
    let dangling = "name='d'\n[[task]]\nid='x'\nafter=['nope']\nsteps=[{kind='noop'}]\n";
    let err = client
        .submit(dangling, SpecFormat::Toml)
        .unwrap_err()
        .to_string();
    assert!(err.contains(r#""x" -> "nope""#), "{err}");
    assert!(
        client.list().unwrap().is_empty(),
        "refused jobs are not queued"
    );
    service.shutdown();
}
