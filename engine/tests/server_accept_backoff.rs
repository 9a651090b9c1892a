//! Guards the listener of an engine out of file descriptors: an engine
//! started with RLIMIT_NOFILE a few descriptors above what it needs to
//! run is sent more connections than it can accept; its accepts fail with
//! EMFILE and it backs off (one log line per burst, not one per retry: a
//! listener retrying at once logs thousands in a second), and once those
//! connections close, a new one logs in and is served.

mod server_support;

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use server_support::*;

/// Connections sent, beyond what the engine can accept.
const CONNECTIONS_MAX: usize = 64;
/// Descriptors the limited engine has beyond what it uses when ready.
const SPARE_FDS: u64 = 6;
/// Looks at the engine's log for the failing accept, at most.
const LOG_LOOKS: usize = 600;

/// No job service: fewer descriptors, counted in a probe run.
const ENGINE_FLAGS: [&str; 2] = ["--jobs", ""];

fn open_fds(pid: u32) -> u64 {
    let dir = format!("/proc/{pid}/fd");
    std::fs::read_dir(dir)
        .expect("the engine's fd list")
        .count() as u64
}

/// Lines of the engine's log that report an accept failing with EMFILE,
/// and lines that say accepts work again.
fn log_lines(log: &Path) -> (usize, usize) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let failing = (text.lines())
        .filter(|l| l.contains("accept") && l.contains("os error 24"))
        .count();
    let recovered = text
        .lines()
        .filter(|l| l.contains("accept works again"))
        .count();
    (failing, recovered)
}

#[test]
fn accept_out_of_descriptors_backs_off_and_recovers() {
    let probe_dir = temp_dir();
    let probe = EngineProcess::start(probe_dir.path(), &ENGINE_FLAGS);
    let used = open_fds(probe.pid());
    assert_eq!(probe.terminate(), Some(0));

    let dir = temp_dir();
    let log = dir.path().join("engine.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let limit = used + SPARE_FDS;
    let engine = EngineProcess::start_with(dir.path(), &ENGINE_FLAGS, move |cmd| {
        cmd.env("RUST_LOG", "ferrite_engine=warn").stderr(log_file);
        // SAFETY: setrlimit is async-signal-safe and touches only the
        // child's own limits, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let rl = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    // Connections the engine holds open (each waiting for its Hello) and
    // more, which wait in the listen backlog once accept fails.
    let mut held = Vec::new();
    for _ in 0..CONNECTIONS_MAX {
        held.push(TcpStream::connect(engine.tcp).unwrap());
    }
    let mut looks = 0;
    while log_lines(&log).0 == 0 && looks < LOG_LOOKS {
        std::thread::sleep(Duration::from_millis(50));
        looks += 1;
    }
    assert!(
        log_lines(&log).0 > 0,
        "accept never failed with EMFILE (limit {limit}, {used} fds in use at start)"
    );
    // Let it fail on for a while, then free the descriptors.
    std::thread::sleep(Duration::from_millis(500));
    drop(held);
    let mut c = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    healthy(&mut c, 1);
    // One line when a burst of failures starts, one when it ends.
    let (failing, recovered) = log_lines(&log);
    eprintln!("engine log: {failing} lines of failing accepts, {recovered} of recoveries");
    assert!(
        failing <= recovered + 1 && recovered >= 1,
        "{failing} log lines of failing accepts, {recovered} of recoveries: \
         the listener retried without backing off"
    );
    drop(c);
    assert_eq!(engine.terminate(), Some(0), "engine shut down cleanly");
}
