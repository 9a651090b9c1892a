//! Guards: task records stored in the engine under `task_key(job, task id)`
//! are what workers run — fetched from the engine by key (one-sided over shm
//! for an engine on this host), not from the grant — and a job whose records
//! are missing from the engine fails naming the task.
#![cfg(feature = "embedded")]

#[path = "jobs_common.rs"]
mod common;

use std::time::Duration;

use ferrite_client::client::Key;
use ferrite_client::jobs::JobClient;
use ferrite_proto::rpc_jobs::{
    JobPhase, SpecFormat, TaskPhase, TaskSpec, AKEY_TASK, JOBS_CONTAINER,
};

const JOB: &str = "name='stored'\n[[task]]\nid='one'\nsteps=[{kind='exec', cmd='echo', args=['from the store']}]\n\
                   [[task]]\nid='two'\ninputs=['one']\nsteps=[{kind='exec', cmd='cat'}]\n";

#[test]
fn workers_run_task_records_fetched_from_the_engine() {
    common::watchdog(Duration::from_secs(90));
    let dir = tempfile::tempdir().unwrap();
    let store = ferrite_client::embedded::connect().unwrap();
    let service = common::start_service(dir.path(), 4);
    let addr = service.addr().to_string();
    let _w: Vec<_> = (0..2)
        .map(|i| common::Worker::start(&addr, &format!("w{i}"), 1, dir.path()))
        .collect();
    let mut client = JobClient::connect(&addr, common::TOKEN).unwrap();
    let job = client.submit_stored(JOB, SpecFormat::Toml, &store).unwrap();
    let (phase, cause) = client.wait(job).unwrap();
    assert_eq!(phase, JobPhase::Done, "{cause:?}");
    let record = store
        .get(&Key::new(JOBS_CONTAINER, job, b"two", AKEY_TASK))
        .unwrap()
        .expect("task record in the engine");
    let task: TaskSpec = serde_json::from_slice(&record).unwrap();
    assert_eq!(task.inputs, vec!["one".to_string()]);
    service.shutdown();
    let st = ferrite_engine::jobs::state::JobState::open(
        &dir.path()
            .join("jobs")
            .join(format!("{job:032x}.job.sqlite")),
    )
    .unwrap();
    assert_eq!(st.meta().unwrap().store, Some(store.url()));
    // Outputs are records in the engine, not in the job state file; `two`
    // read `one`'s stdout record as its standard input.
    assert_eq!(st.output(1).unwrap().unwrap().0, b"");
    let two = ferrite_client::jobs::outputs::read(&store, job, "two")
        .unwrap()
        .expect("outputs of two");
    assert_eq!(two.stdout, "from the store\n");
}

#[test]
fn missing_task_records_fail_the_job_by_name() {
    common::watchdog(Duration::from_secs(90));
    let dir = tempfile::tempdir().unwrap();
    let store = ferrite_client::embedded::connect().unwrap();
    let service = common::start_service(dir.path(), 4);
    let addr = service.addr().to_string();
    let _w = common::Worker::start(&addr, "w", 1, dir.path());
    // Say the records are in the engine without storing them.
    let mut peer = ferrite_client::jobs::api::connect_authenticated(&addr, common::TOKEN).unwrap();
    let msg = ferrite_proto::rpc_jobs::ToEngine::Submit {
        text: JOB.into(),
        format: SpecFormat::Toml,
        job: Some(0xfeed),
        store: Some(store.url()),
    };
    ferrite_proto::rpc_jobs::write_frame(&mut peer, &msg).unwrap();
    let reply: ferrite_proto::rpc_jobs::ToPeer = ferrite_proto::rpc_jobs::read_frame(&mut peer)
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            reply,
            ferrite_proto::rpc_jobs::ToPeer::Submitted { job: 0xfeed }
        ),
        "{reply:?}"
    );
    let mut client = JobClient::connect(&addr, common::TOKEN).unwrap();
    let (phase, cause) = client.wait(0xfeed).unwrap();
    assert_eq!(phase, JobPhase::Failed);
    let cause = cause.unwrap();
    assert!(
        cause.contains("\"one\"") && cause.contains("not in the engine"),
        "{cause}"
    );
    assert_eq!(
        client.status(0xfeed).unwrap().tasks[1].state,
        TaskPhase::Cancelled
    );
    service.shutdown();
}
