//! Guards the engine's own execution streams (`task_slots`): with no worker
//! at all, a job of `exec` and storage steps runs on the engine's xstreams
//! and finishes; every task's state object is written by the engine node
//! and names it; constraints hold by the recorded start and end times;
//! `exec` output is stored back as records in the engine (and read there
//! by the task that takes it as input), and an `exec` task is not pinned
//! to the core of the engine thread that started it; status names the coordinator slot
//! that split the job; a job whose store is another engine is kept off the
//! engine's streams.

mod jobs_support;
mod server_support;

use std::time::Duration;

use ferrite_engine::config::EngineConfig;
use ferrite_engine::jobs::{JobService, JobServiceConfig};
use ferrite_engine::{Engine, EngineHandle};
use ferrite_proto::rpc::{Key, Reply, Request};
use ferrite_proto::rpc_jobs::{
    output_key, JobPhase, JobStatus, SpecFormat, TaskPhase, ToEngine, ToPeer, AKEY_STDOUT,
};
use ferrite_proto::tasks::state::{task_state_path, TaskState};
use ferrite_xstream::{TaskClass, XstreamId};
use jobs_support::{watchdog, Peer};

const JOB: &str = "name='slots'\n\
[[task]]\nid='hello'\nsteps=[{kind='exec', cmd='echo', args=['hello']}]\n\
[[task]]\nid='shout'\ninputs=['hello']\nsteps=[{kind='exec', cmd='tr', args=['a-z', 'A-Z']}]\n\
[[task]]\nid='put'\nsteps=[{kind='put', container=7, prefix='k', count=40, size_bytes=100}]\n\
[[task]]\nid='get'\nafter=['put']\nsteps=[{kind='get', container=7, prefix='k', count=40}]\n\
[[task]]\nid='copy'\nafter=['put']\nsteps=[{kind='copy', source=7, target=8, prefix='k', count=40}]\n\
[[task]]\nid='scrub'\nafter=['get', 'copy', 'shout']\nsteps=[{kind='scrub', container=8}]\n\
[[task]]\nid='cpus'\nsteps=[{kind='exec', cmd='grep', args=['Cpus_allowed_list', '/proc/self/status']}]\n";

trait Ask {
    fn submit(&mut self, text: &str, store: Option<String>) -> u128;
    fn status(&mut self, job: u128) -> JobStatus;
    fn wait_done(&mut self, job: u128);
}

impl Ask for Peer {
    fn submit(&mut self, text: &str, store: Option<String>) -> u128 {
        let msg = ToEngine::Submit {
            text: text.into(),
            format: SpecFormat::Toml,
            job: None,
            store,
        };
        match self.ask(msg) {
            ToPeer::Submitted { job } => job,
            other => panic!("{other:?}"),
        }
    }

    fn status(&mut self, job: u128) -> JobStatus {
        match self.ask(ToEngine::Status { job, watch: false }) {
            ToPeer::Status { status } => status,
            other => panic!("{other:?}"),
        }
    }

    fn wait_done(&mut self, job: u128) {
        match self.ask(ToEngine::Wait { job }) {
            ToPeer::Ended { state, cause, .. } => assert_eq!(state, JobPhase::Done, "{cause:?}"),
            other => panic!("{other:?}"),
        }
    }
}

/// An engine with the job service on its xstreams, offering `slots`.
fn start(dir: &std::path::Path, slots: u32) -> (EngineHandle, JobService) {
    let engine = Engine::start(EngineConfig::for_temp_dir(dir)).unwrap();
    let router = engine.router();
    let config = JobServiceConfig {
        store: router.urls().first().cloned(),
        task_slots: slots,
        router: Some(router),
        ..JobServiceConfig::new(dir.join("jobs")).with_token(jobs_support::TOKEN)
    };
    let last = XstreamId(engine.mesh().len() - 1);
    let service = JobService::start_on(config, engine.mesh(), last).unwrap();
    (engine, service)
}

/// Reads a record of the engine through its router.
fn fetch(engine: &EngineHandle, key: Key) -> Option<Vec<u8>> {
    let router = engine.router();
    let run = engine
        .mesh()
        .run_on(XstreamId(0), TaskClass::Foreground, move || async move {
            router.execute(Request::Fetch { key }).await
        });
    match futures::executor::block_on(run).unwrap() {
        Reply::Value(found) => found.map(|f| f.value),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_job_runs_on_the_engine_streams_with_no_worker() {
    watchdog(Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let (engine, service) = start(dir.path(), 2);
    let mut peer = Peer::connect(&service);
    let job = peer.submit(JOB, None);
    peer.wait_done(job);
    let status = peer.status(job);
    assert_eq!(status.coordinator.as_deref(), Some("engine/coordinator-0"));
    assert_eq!(status.answered, vec!["engine".to_string()]);
    // The engine's task state object holds every task, written by it.
    let st = TaskState::open(&dir.path().join("jobs").join("tasks"), job, "engine").unwrap();
    assert!(task_state_path(&dir.path().join("jobs").join("tasks"), job, "engine").exists());
    let rows = st.rows().unwrap();
    assert_eq!(rows.len(), status.tasks.len());
    for (row, merged) in rows.iter().zip(&status.tasks) {
        assert_eq!(row.state, TaskPhase::Done, "{row:?}");
        assert_eq!(row.node.as_deref(), Some("engine"));
        assert_eq!((row.start_ns, row.end_ns), (merged.start_ns, merged.end_ns));
    }
    for &(before, after) in &status.edges {
        let (b, a) = (&rows[before as usize], &rows[after as usize]);
        assert!(
            a.start_ns.unwrap() >= b.end_ns.unwrap(),
            "{} started before {} ended",
            a.id,
            b.id
        );
    }
    // exec output is a record in the engine, and `shout` read `hello`'s.
    let out = |id: &str| {
        let k = output_key(job, id.as_bytes(), AKEY_STDOUT);
        fetch(&engine, Key::new(k.container, k.object, k.dkey, k.akey))
    };
    assert_eq!(out("hello").as_deref(), Some(&b"hello\n"[..]));
    assert_eq!(out("shout").as_deref(), Some(&b"HELLO\n"[..]));
    // An exec task may use the process's CPUs, not only the engine
    // xstream's core its starting thread is pinned to.
    let status_text = std::fs::read_to_string("/proc/self/status").unwrap();
    let ours = status_text
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list"))
        .unwrap();
    let theirs = String::from_utf8(out("cpus").unwrap()).unwrap();
    assert_eq!(theirs.trim_end(), ours);
    let scrub = String::from_utf8(out("scrub").unwrap()).unwrap();
    assert!(
        scrub.contains("scrub 40 records") && scrub.contains("all good"),
        "{scrub}"
    );
    drop(peer);
    service.shutdown();
    engine.shutdown().unwrap();
}

#[test]
fn a_job_stored_in_another_engine_is_kept_off_the_engine_streams() {
    watchdog(Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let (engine, service) = start(dir.path(), 1);
    let mut peer = Peer::connect(&service);
    let other = Some("tcp://127.0.0.1:9".to_string());
    let text = "name='far'\n[[task]]\nid='a'\nsteps=[{kind='noop'}]\n";
    let far = peer.submit(text, other);
    let near = peer.submit(text, None);
    peer.wait_done(near);
    // The engine's stream was free all along, and `far` was split first.
    let status = peer.status(far);
    assert_eq!(status.state, JobPhase::Running);
    assert_eq!(status.coordinator.as_deref(), Some("engine/coordinator-0"));
    assert_eq!(status.tasks[0].state, TaskPhase::Ready);
    assert!(matches!(
        peer.ask(ToEngine::Cancel { job: far }),
        ToPeer::Cancelled { .. }
    ));
    drop(peer);
    service.shutdown();
    engine.shutdown().unwrap();
}

fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", path.display());
}

/// An `exec` task waits for its child off the xstreams, and off the
/// blocking-thread pool the job service writes job state files with: a
/// job is accepted while another's task is still running on the engine
/// (one xstream, so the task's stream shares it with the control task).
#[test]
fn a_job_is_accepted_while_an_engine_exec_task_runs() {
    watchdog(Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let (engine, service) = start(dir.path(), 1);
    assert_eq!(engine.mesh().len(), 1);
    let (started, release) = (dir.path().join("started"), dir.path().join("release"));
    mkfifo(&started);
    mkfifo(&release);
    let script = format!("echo up > {}; cat {}", started.display(), release.display());
    let long = format!(
        "name='long'\n[[task]]\nid='wait'\nsteps=[{{kind='exec', cmd='sh', args=['-c', '{script}']}}]\n"
    );
    let mut peer = Peer::connect(&service);
    let job = peer.submit(&long, None);
    assert_eq!(std::fs::read_to_string(&started).unwrap(), "up\n");
    // The task runs (and waits for `release`): another job is accepted.
    let next = peer.submit(
        "name='next'\n[[task]]\nid='a'\nsteps=[{kind='noop'}]\n",
        None,
    );
    std::fs::write(&release, "go\n").unwrap();
    peer.wait_done(job);
    peer.wait_done(next);
    drop(peer);
    service.shutdown();
    engine.shutdown().unwrap();
}

/// `ferrite-engine --task-slots 2` runs a job with no worker, and after a
/// restart (SIGTERM, start again on the same data) its state file still
/// says who split it and that the engine ran every task.
#[test]
fn ferrite_engine_task_slots_flag_runs_jobs_and_they_survive_a_restart() {
    watchdog(Duration::from_secs(120));
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, jobs_support::TOKEN).unwrap();
    // The engine refuses a token file others may read.
    let owner_only = std::os::unix::fs::PermissionsExt::from_mode(0o600);
    std::fs::set_permissions(&token, owner_only).unwrap();
    let token = token.display().to_string();
    let flags = ["--task-slots", "2", "--token-file", &token];
    let engine = server_support::EngineProcess::start(dir.path(), &flags);
    let mut peer = Peer::connect_to(engine.jobs.expect("job service"));
    let job = peer.submit(JOB, None);
    peer.wait_done(job);
    drop(peer);
    assert_eq!(engine.terminate(), Some(0));
    let engine = server_support::EngineProcess::start(dir.path(), &flags);
    let mut peer = Peer::connect_to(engine.jobs.expect("job service"));
    let status = peer.status(job);
    assert_eq!(status.state, JobPhase::Done);
    assert_eq!(status.coordinator.as_deref(), Some("engine/coordinator-0"));
    assert!(status
        .tasks
        .iter()
        .all(|t| t.state == TaskPhase::Done && t.node.as_deref() == Some("engine")));
    drop(peer);
    assert_eq!(engine.terminate(), Some(0));
}
