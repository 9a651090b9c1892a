//! Guards the job service's front door without workers: refused job files
//! name the offending tasks, accepted jobs get a state file and wait for
//! resources with their roots ready, cancel ends them, and a restarted
//! service finds every job again from its files.

mod jobs_support;

use ferrite_engine::jobs::state::JobState;
use ferrite_engine::jobs::{JobService, JobServiceConfig};
use std::io::Write;

use ferrite_proto::rpc_jobs::{
    read_frame, write_frame, JobPhase, SpecFormat, TaskPhase, ToEngine, ToPeer,
};
use jobs_support::Peer;

fn submit(text: &str) -> ToEngine {
    ToEngine::Submit {
        text: text.into(),
        format: SpecFormat::Toml,
        job: None,
        store: None,
    }
}

#[test]
fn refused_jobs_name_their_tasks_and_accepted_jobs_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = JobServiceConfig::new(dir.path().join("jobs")).with_token(jobs_support::TOKEN);
    let service = JobService::start(config.clone()).unwrap();
    let mut peer = Peer::connect(&service);

    let dup = "name='d'\n[[task]]\nid='same'\nsteps=[{kind='noop'}]\n[[task]]\nid='same'\nsteps=[{kind='noop'}]\n";
    match peer.ask(submit(dup)) {
        ToPeer::Error { message } => assert_eq!(message, "duplicate task ids: same"),
        other => panic!("{other:?}"),
    }
    let cyc = "name='c'\n[[task]]\nid='p'\nafter=['q']\nsteps=[{kind='noop'}]\n[[task]]\nid='q'\nafter=['p']\nsteps=[{kind='noop'}]\n";
    match peer.ask(submit(cyc)) {
        ToPeer::Error { message } => assert!(
            message.contains("p -> q -> p") || message.contains("q -> p -> q"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }

    let ok = "name='two'\n[[task]]\nid='root'\nsteps=[{kind='noop'}]\n[[task]]\nid='leaf'\nafter=['root']\nsteps=[{kind='noop'}]\n";
    let ToPeer::Submitted { job: kept } = peer.ask(submit(ok)) else {
        panic!("submit")
    };
    let ToPeer::Submitted { job: dropped } = peer.ask(submit(ok)) else {
        panic!("submit")
    };
    assert_ne!(kept, dropped);
    let ToPeer::Status { status } = peer.ask(ToEngine::Status {
        job: kept,
        watch: false,
    }) else {
        panic!("status")
    };
    assert_eq!(status.state, JobPhase::Running);
    assert_eq!(
        status.tasks[0].state,
        TaskPhase::Ready,
        "no worker yet: ready, not running"
    );
    assert_eq!(status.tasks[1].state, TaskPhase::Pending);
    assert_eq!(status.edges, vec![(0, 1)]);
    assert!(matches!(
        peer.ask(ToEngine::Cancel { job: dropped }),
        ToPeer::Cancelled { .. }
    ));
    assert!(matches!(
        peer.ask(ToEngine::Wait { job: dropped }),
        ToPeer::Ended {
            state: JobPhase::Cancelled,
            ..
        }
    ));
    drop(peer);
    service.shutdown();

    let path = dir
        .path()
        .join("jobs")
        .join(format!("{dropped:032x}.job.sqlite"));
    assert_eq!(
        JobState::open(&path).unwrap().meta().unwrap().state,
        JobPhase::Cancelled
    );

    let service = JobService::start(config).unwrap();
    let mut peer = Peer::connect(&service);
    let ToPeer::Jobs { jobs } = peer.ask(ToEngine::List) else {
        panic!("list")
    };
    let mut states: Vec<_> = jobs.iter().map(|j| (j.job, j.state)).collect();
    states.sort_by_key(|s| s.0);
    let mut want = vec![(kept, JobPhase::Running), (dropped, JobPhase::Cancelled)];
    want.sort_by_key(|s| s.0);
    assert_eq!(states, want);
    let ToPeer::Status { status } = peer.ask(ToEngine::Status {
        job: kept,
        watch: false,
    }) else {
        panic!("status")
    };
    assert_eq!(status.tasks[0].state, TaskPhase::Ready);
    match peer.ask(ToEngine::Status {
        job: 12345,
        watch: false,
    }) {
        ToPeer::Error { message } => assert!(message.contains("no job"), "{message}"),
        other => panic!("{other:?}"),
    }
    service.shutdown();
}

/// A submit of a chain of `n` no-op tasks.
fn submit_chain(n: usize) -> ToEngine {
    ToEngine::Submit {
        text: chain_json(n),
        format: SpecFormat::Json,
        job: None,
        store: None,
    }
}

/// A chain of `n` no-op tasks as a JSON job file.
fn chain_json(n: usize) -> String {
    let tasks: Vec<String> = (0..n)
        .map(|i| match i {
            0 => r#"{"id":"t0","steps":[{"kind":"noop"}]}"#.to_string(),
            _ => format!(
                r#"{{"id":"t{i}","after":["t{}"],"steps":[{{"kind":"noop"}}]}}"#,
                i - 1
            ),
        })
        .collect();
    format!(r#"{{"name":"big","tasks":[{}]}}"#, tasks.join(","))
}

/// Guards that a big job's state file is written off the control task: a
/// list query sent right behind the submit, on the same connection, is
/// answered first — while the file is written — and does not show the job
/// yet; once the submit is answered the job and its file are complete.
#[test]
fn queries_are_answered_while_a_big_job_file_is_written() {
    const TASKS: usize = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let service = JobService::start(
        JobServiceConfig::new(dir.path().join("jobs")).with_token(jobs_support::TOKEN),
    )
    .unwrap();
    let mut peer = Peer::connect(&service);
    let big = submit_chain(TASKS);
    write_frame(&mut peer.output, &big).unwrap();
    write_frame(&mut peer.output, &ToEngine::List).unwrap();
    peer.output.flush().unwrap();

    let first: ToPeer = read_frame(&mut peer.input).unwrap().expect("an answer");
    let ToPeer::Jobs { jobs } = first else {
        panic!("the submit was answered before the list behind it: {first:?}")
    };
    assert!(jobs.is_empty(), "{jobs:?}");
    let second: ToPeer = read_frame(&mut peer.input).unwrap().expect("an answer");
    let ToPeer::Submitted { job } = second else {
        panic!("{second:?}")
    };

    let ToPeer::Jobs { jobs } = peer.ask(ToEngine::List) else {
        panic!("list")
    };
    assert_eq!(jobs.len(), 1);
    assert_eq!((jobs[0].job, jobs[0].tasks), (job, TASKS as u32));
    let path = dir
        .path()
        .join("jobs")
        .join(format!("{job:032x}.job.sqlite"));
    let state = JobState::open(&path).unwrap();
    assert_eq!(state.rows().unwrap().len(), TASKS);
    assert_eq!(state.edges().unwrap().len(), TASKS - 1);
    drop(state);
    service.shutdown();
}

/// Guards that the files of jobs that ended before the service started are
/// not read on the control task: `wait` and `list` are answered from what
/// the service read at start, and `status` (every row of the file) on the
/// blocking-thread pool — so a wait and a list pipelined behind a status
/// of a big ended job, on the same connection, are answered first.
#[test]
fn ended_jobs_files_are_read_off_the_control_task() {
    const TASKS: usize = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let config = JobServiceConfig::new(dir.path().join("jobs")).with_token(jobs_support::TOKEN);
    let service = JobService::start(config.clone()).unwrap();
    let mut peer = Peer::connect(&service);
    let big = submit_chain(TASKS);
    let ToPeer::Submitted { job } = peer.ask(big) else {
        panic!("submit")
    };
    assert!(matches!(
        peer.ask(ToEngine::Cancel { job }),
        ToPeer::Cancelled { .. }
    ));
    drop(peer);
    service.shutdown();

    let service = JobService::start(config).unwrap();
    let mut peer = Peer::connect(&service);
    let status = ToEngine::Status { job, watch: false };
    for msg in [status, ToEngine::Wait { job }, ToEngine::List] {
        write_frame(&mut peer.output, &msg).unwrap();
    }
    peer.output.flush().unwrap();
    let mut answers = Vec::new();
    for _ in 0..3 {
        let answer: ToPeer = read_frame(&mut peer.input).unwrap().expect("an answer");
        answers.push(answer);
    }
    let [ended, jobs, status] = <[ToPeer; 3]>::try_from(answers).unwrap();
    let ToPeer::Ended { state, .. } = ended else {
        panic!("the wait behind the status was not answered first: {ended:?}")
    };
    assert_eq!(state, JobPhase::Cancelled);
    let ToPeer::Jobs { jobs } = jobs else {
        panic!("the list behind the status was not answered second: {jobs:?}")
    };
    assert_eq!(jobs.len(), 1);
    let summary = &jobs[0];
    assert_eq!((summary.job, summary.state), (job, JobPhase::Cancelled));
    assert_eq!((summary.tasks, summary.done), (TASKS as u32, 0));
    let ToPeer::Status { status } = status else {
        panic!("{status:?}")
    };
    assert_eq!((status.job, status.state), (job, JobPhase::Cancelled));
    assert_eq!(status.tasks.len(), TASKS);
    assert_eq!(status.edges.len(), TASKS - 1);
    service.shutdown();
}

/// Guards that a job is split on the coordinator slot the manager granted
/// it, and that its state file names that slot: with one slot, the first job
/// is split there; the second waits in the queue, split by nobody, until the
/// first ends, and is then split on the freed slot.
#[test]
fn each_job_is_split_on_its_granted_coordinator_slot() {
    let dir = tempfile::tempdir().unwrap();
    let config = JobServiceConfig {
        coordinator_slots: 1,
        ..JobServiceConfig::new(dir.path().join("jobs")).with_token(jobs_support::TOKEN)
    };
    let meta = |job: u128| {
        let path = config.state_dir.join(format!("{job:032x}.job.sqlite"));
        JobState::open(&path).unwrap().meta().unwrap()
    };
    let service = JobService::start(config.clone()).unwrap();
    let mut peer = Peer::connect(&service);
    let mut submitted = Vec::new();
    for _ in 0..2 {
        let ToPeer::Submitted { job } = peer.ask(submit_chain(3)) else {
            panic!("submit")
        };
        submitted.push(job);
    }
    let [first, second] = submitted[..] else {
        unreachable!()
    };
    // A status answer comes after the control task handled both submits.
    let status = ToEngine::Status {
        job: second,
        watch: false,
    };
    let ToPeer::Status { status: s } = peer.ask(status) else {
        panic!("status")
    };
    assert_eq!(s.state, JobPhase::Queued);
    service.shutdown(); // writes every pending state update
    assert_eq!(
        meta(first).coordinator.as_deref(),
        Some("engine/coordinator-0")
    );
    assert_eq!(meta(second).coordinator, None, "a queued job is not split");

    let service = JobService::start(config.clone()).unwrap();
    let mut peer = Peer::connect(&service);
    let ToPeer::Cancelled { .. } = peer.ask(ToEngine::Cancel { job: first }) else {
        panic!("cancel")
    };
    let ToPeer::Ended { .. } = peer.ask(ToEngine::Wait { job: first }) else {
        panic!("wait")
    };
    let status = ToEngine::Status {
        job: second,
        watch: false,
    };
    let ToPeer::Status { status: s } = peer.ask(status) else {
        panic!("status")
    };
    assert_eq!(
        s.state,
        JobPhase::Running,
        "the freed slot took the queued job"
    );
    service.shutdown();
    assert_eq!(
        meta(second).coordinator.as_deref(),
        Some("engine/coordinator-0")
    );
}
