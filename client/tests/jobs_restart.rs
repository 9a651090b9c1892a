//! Guards: job state files stay consistent across a job service restart —
//! an unfinished job resumes without redoing finished tasks, a finished job
//! is served from its file, and the files are plain SQLite (`sqlite3 .dump`).
#![cfg(feature = "embedded")]

#[path = "jobs_common.rs"]
mod common;

use std::time::Duration;

use ferrite_client::jobs::JobClient;
use ferrite_engine::jobs::state::JobState;
use ferrite_proto::rpc_jobs::{JobPhase, SpecFormat, TaskPhase};

#[test]
fn unfinished_job_resumes_after_restart_and_files_stay_readable() {
    let common::Setup {
        dir,
        fifo,
        service,
        addr,
    } = common::setup(Duration::from_secs(120));
    let marker = dir.path().join("second-run");
    let w1 = common::Worker::start(&addr, "before", 1, dir.path());
    let mut client = JobClient::connect(&addr, common::TOKEN).unwrap();
    let gate = format!(
        "if [ -e {m} ]; then echo resumed; else touch {m}; echo go > {f}; exec sleep 600; fi",
        m = marker.display(),
        f = fifo.display()
    );
    let text = format!(
        "name='restart'\n[[task]]\nid='a'\nsteps=[{{kind='exec', cmd='echo', args=['A']}}]\n\
         [[task]]\nid='b'\nafter=['a']\nsteps=[{{kind='exec', cmd='echo', args=['B']}}]\n\
         [[task]]\nid='gate'\nafter=['b']\nsteps=[{{kind='exec', cmd='sh', args=['-c', '{gate}']}}]\n\
         [[task]]\nid='z'\nafter=['gate']\nsteps=[{{kind='noop'}}]\n"
    );
    let job = client.submit(&text, SpecFormat::Toml).unwrap();
    assert_eq!(common::read_fifo_line(&fifo), "go");
    drop(client);
    service.shutdown();
    drop(w1);

    let path = dir
        .path()
        .join("jobs")
        .join(format!("{job:032x}.job.sqlite"));
    let rows = JobState::open(&path).unwrap().rows().unwrap();
    let states: Vec<_> = rows.iter().map(|r| (r.id.as_str(), r.state)).collect();
    assert_eq!(
        states,
        vec![
            ("a", TaskPhase::Done),
            ("b", TaskPhase::Done),
            ("gate", TaskPhase::Pending),
            ("z", TaskPhase::Pending)
        ]
    );
    let a_end = rows[0].end_ns;

    let service = common::start_service(dir.path(), 4);
    let addr = service.addr().to_string();
    let _w2 = common::Worker::start(&addr, "after", 1, dir.path());
    let mut client = JobClient::connect(&addr, common::TOKEN).unwrap();
    assert_eq!(client.wait(job).unwrap().0, JobPhase::Done);
    let s = client.status(job).unwrap();
    assert_eq!(s.tasks[0].node.as_deref(), Some("before"), "a not redone");
    assert_eq!(s.tasks[0].end_ns, a_end);
    assert_eq!(s.tasks[2].node.as_deref(), Some("after"));
    drop(client);
    service.shutdown();

    // A third start serves the finished job from its file alone.
    let service = common::start_service(dir.path(), 4);
    let mut client = JobClient::connect(&service.addr().to_string(), common::TOKEN).unwrap();
    let archived = client.status(job).unwrap();
    assert_eq!(archived.state, JobPhase::Done);
    assert!(archived.tasks.iter().all(|t| t.state == TaskPhase::Done));
    assert_eq!(archived.edges, vec![(0, 1), (1, 2), (2, 3)]);
    assert_eq!(client.wait(job).unwrap().0, JobPhase::Done);
    service.shutdown();
    let st = JobState::open(&path).unwrap();
    assert_eq!(st.output(2).unwrap().unwrap().0, b"resumed\n");
    drop(st);

    // Plain SQLite: the sqlite3 shell reads the job and task state files.
    if let Ok(out) = std::process::Command::new("sqlite3")
        .arg(&path)
        .arg(".dump")
        .output()
    {
        let dump = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success());
        assert!(dump.contains("CREATE TABLE tasks"), "{dump}");
        assert!(dump.contains("'gate','done','after'"), "{dump}");
        let task_file = ferrite_client::jobs::task_state::task_state_path(
            &dir.path().join("after"),
            job,
            "after",
        );
        let out = std::process::Command::new("sqlite3")
            .arg(&task_file)
            .arg("SELECT id, state FROM tasks ORDER BY idx")
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "gate|done\nz|done\n");
    } else {
        eprintln!("sqlite3 shell not installed: checked with rusqlite only");
    }
}
