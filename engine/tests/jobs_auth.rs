//! Guards the job service's front door: every connection proves it holds
//! the engine's token before its first frame, so a peer without the token
//! (or with a wrong one) never gets an exec step run — the file its
//! command would write is never written — while a peer with the token
//! does; a service without a token refuses to start; and with exec steps
//! turned off a job with one is refused at submit.

mod jobs_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use ferrite_engine::jobs::{JobError, JobService, JobServiceConfig};
use ferrite_proto::rpc_jobs::{write_frame, JobPhase, SpecFormat, ToEngine, ToPeer};
use jobs_support::{Peer, TOKEN};

/// A job whose one exec step writes `marker`.
fn exec_job(marker: &Path) -> ToEngine {
    let text = format!(
        "name='x'\n[[task]]\nid='w'\nsteps=[{{kind='exec', cmd='sh', args=['-c', 'id -un > {}']}}]\n",
        marker.display()
    );
    ToEngine::Submit {
        text,
        format: SpecFormat::Toml,
        job: None,
        store: None,
    }
}

/// A service whose own streams run tasks (no workers needed).
fn start(dir: &Path, exec: bool) -> JobService {
    let config = JobServiceConfig {
        task_slots: 1,
        exec,
        ..JobServiceConfig::new(dir.join("jobs")).with_token(TOKEN)
    };
    JobService::start(config).expect("job service starts")
}

/// Sends a submit frame with no handshake; whatever the service does, the
/// connection must end without an answer frame.
fn submit_without_handshake(service: &JobService, marker: &Path) {
    let mut s = TcpStream::connect(service.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = write_frame(&mut s, &exec_job(marker));
    let _ = s.flush();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    // The service refuses at the Hello (bad magic) and closes: never a
    // frame, never a `Submitted`.
    assert!(
        !String::from_utf8_lossy(&got).contains("submitted"),
        "{got:?}"
    );
}

#[test]
fn exec_jobs_run_only_for_peers_holding_the_token() {
    jobs_support::watchdog(Duration::from_secs(120));
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path(), true);
    let refused = dir.path().join("unauthenticated");
    submit_without_handshake(&service, &refused);
    let wrong = Peer::connect_with(service.addr(), b"not-the-token");
    assert!(wrong.is_err(), "a wrong token is refused");
    let empty = Peer::connect_with(service.addr(), b"");
    assert!(empty.is_err(), "an empty token is refused");

    let ran = dir.path().join("authenticated");
    let mut peer = Peer::connect(&service);
    let ToPeer::Submitted { job } = peer.ask(exec_job(&ran)) else {
        panic!("submit with the token")
    };
    let ToPeer::Ended { state, cause, .. } = peer.ask(ToEngine::Wait { job }) else {
        panic!("wait")
    };
    assert_eq!(state, JobPhase::Done, "{cause:?}");
    assert!(ran.exists(), "the job with the token ran");
    assert!(!refused.exists(), "the job without the token never ran");
    service.shutdown();
}

#[test]
fn a_service_without_a_token_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let none = JobService::start(JobServiceConfig::new(dir.path().join("a")));
    assert!(matches!(none, Err(JobError::NoToken)), "{none:?}");
    let empty = JobService::start(JobServiceConfig::new(dir.path().join("b")).with_token(b""));
    assert!(matches!(empty, Err(JobError::NoToken)), "{empty:?}");
}

#[test]
fn with_exec_off_a_job_with_an_exec_step_is_refused_at_submit() {
    jobs_support::watchdog(Duration::from_secs(120));
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path(), false);
    let marker = dir.path().join("never");
    let mut peer = Peer::connect(&service);
    match peer.ask(exec_job(&marker)) {
        ToPeer::Error { message } => {
            assert!(message.contains("exec = false"), "{message}");
            assert!(message.contains("\"w\""), "names the task: {message}");
        }
        other => panic!("{other:?}"),
    }
    let noop = "name='n'\n[[task]]\nid='a'\nsteps=[{kind='noop'}]\n";
    let ToPeer::Submitted { .. } = peer.ask(ToEngine::Submit {
        text: noop.into(),
        format: SpecFormat::Toml,
        job: None,
        store: None,
    }) else {
        panic!("a job without exec steps is still accepted")
    };
    assert!(!marker.exists());
    service.shutdown();
}
