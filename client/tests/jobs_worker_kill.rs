//! Guards: a worker killed with SIGKILL in the middle of a task loses its
//! lease; the task runs again on another worker and the job finishes; tasks
//! that had finished are not run again.
#![cfg(feature = "embedded")]

#[path = "jobs_common.rs"]
mod common;

use std::time::Duration;

use ferrite_client::jobs::task_state::TaskState;
use ferrite_client::jobs::JobClient;
use ferrite_proto::rpc_jobs::{JobPhase, SpecFormat, TaskPhase};

#[test]
fn sigkilled_worker_task_reruns_elsewhere_and_done_tasks_stay_done() {
    let common::Setup {
        dir,
        fifo,
        service,
        addr,
    } = common::setup(Duration::from_secs(90));
    let mut doomed = common::Worker::start(&addr, "doomed", 1, dir.path());
    let mut client = JobClient::connect(&addr, common::TOKEN).unwrap();
    client.wait_resources(1).unwrap();
    // First attempt: tell the test it started, then hang. Later attempts: finish.
    let slow = format!(
        "if [ \"$FERRITE_ATTEMPT\" = 0 ]; then echo started > {}; exec sleep 600; fi; echo attempt $FERRITE_ATTEMPT",
        fifo.display()
    );
    let mut text = String::from("name = 'kill'\n[retry]\nmax_attempts = 2\n");
    for i in 0..5 {
        text += &format!("[[task]]\nid = 'early{i}'\nsteps = [{{kind='exec', cmd='true'}}]\n");
    }
    text += "[[task]]\nid = 'slow'\nafter = ['early0','early1','early2','early3','early4']\n";
    text += &format!("steps = [{{kind='exec', cmd='sh', args=['-c', '''{slow}''']}}]\n");
    text += "[[task]]\nid = 'late'\nafter = ['slow']\nsteps = [{kind='exec', cmd='true'}]\n";
    let job = client.submit(&text, SpecFormat::Toml).unwrap();

    assert_eq!(common::read_fifo_line(&fifo), "started");
    // The worker records "started" on its recorder thread while the task
    // runs: kill it only once its task state object says so (bounded wait).
    let recorded = |dir: &std::path::Path| {
        TaskState::open(&dir.join("doomed"), job, "doomed")
            .and_then(|s| s.rows())
            .is_ok_and(|rows| {
                rows.iter()
                    .any(|r| r.id == "slow" && r.state == TaskPhase::Running)
            })
    };
    for _ in 0..1000 {
        if recorded(dir.path()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    doomed.kill();
    let _rescuer = common::Worker::start(&addr, "rescuer", 1, dir.path());
    let (phase, cause) = client.wait(job).unwrap();
    assert_eq!(phase, JobPhase::Done, "{cause:?}");

    let status = client.status(job).unwrap();
    let by_id = |id: &str| status.tasks.iter().find(|t| t.id == id).unwrap().clone();
    let slow = by_id("slow");
    assert_eq!(
        (slow.state, slow.attempt, slow.node.as_deref()),
        (TaskPhase::Done, 1, Some("rescuer"))
    );
    for i in 0..5 {
        let t = by_id(&format!("early{i}"));
        assert_eq!(
            (t.attempt, t.node.as_deref()),
            (0, Some("doomed")),
            "early{i} not redone"
        );
    }
    assert_eq!(by_id("late").node.as_deref(), Some("rescuer"));
    service.shutdown();

    // The rescuer's task state object holds only what it ran.
    let rescuer_rows = TaskState::open(&dir.path().join("rescuer"), job, "rescuer")
        .unwrap()
        .rows()
        .unwrap();
    let mut ran: Vec<_> = rescuer_rows.iter().map(|r| r.id.as_str()).collect();
    ran.sort();
    assert_eq!(ran, vec!["late", "slow"]);
    // The killed worker's file still says what it saw: early tasks done, slow running.
    let doomed_rows = TaskState::open(&dir.path().join("doomed"), job, "doomed")
        .unwrap()
        .rows()
        .unwrap();
    let slow_there = doomed_rows.iter().find(|r| r.id == "slow").unwrap();
    assert_eq!(
        (slow_there.state, slow_there.attempt),
        (TaskPhase::Running, 0)
    );
    assert_eq!(
        doomed_rows
            .iter()
            .filter(|r| r.state == TaskPhase::Done)
            .count(),
        5
    );
    // The job state object has the second attempt's output.
    let st = ferrite_engine::jobs::state::JobState::open(
        &dir.path()
            .join("jobs")
            .join(format!("{job:032x}.job.sqlite")),
    )
    .unwrap();
    let (out, _) = st.output(slow.idx).unwrap().unwrap();
    assert_eq!(out, b"attempt 1\n");
}

#[test]
fn losing_the_last_attempt_fails_the_job_with_the_cause() {
    let common::Setup {
        dir,
        fifo,
        service,
        addr,
    } = common::setup(Duration::from_secs(60));
    let mut doomed = common::Worker::start(&addr, "only", 1, dir.path());
    let mut client = JobClient::connect(&addr, common::TOKEN).unwrap();
    client.wait_resources(1).unwrap();
    let text = format!(
        "name='once'\n[retry]\nmax_attempts=1\n[[task]]\nid='hang'\nsteps=[{{kind='exec', cmd='sh', args=['-c', 'echo go > {}; exec sleep 600']}}]\n",
        fifo.display()
    );
    let job = client.submit(&text, SpecFormat::Toml).unwrap();
    assert_eq!(common::read_fifo_line(&fifo), "go");
    doomed.kill();
    let (phase, cause) = client.wait(job).unwrap();
    assert_eq!(phase, JobPhase::Failed);
    let cause = cause.unwrap();
    assert!(
        cause.contains("\"hang\"") && cause.contains("only") && cause.contains("lost"),
        "{cause}"
    );
    service.shutdown();
}
