//! Shared helpers of the `jobs_*` tests (included with `#[path]`): a job
//! service in this process, worker processes of the `ferrite` binary, and a
//! watchdog that bounds every test in time.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferrite_engine::jobs::{JobService, JobServiceConfig};

/// The token every test job service is started with.
pub const TOKEN: &[u8] = b"jobs-test-token";

/// Aborts the test process if a test runs longer than `limit`.
pub fn watchdog(limit: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("watchdog: test exceeded {limit:?}");
        std::process::abort();
    });
}

pub fn start_service(dir: &Path, depth: u32) -> JobService {
    let mut config = JobServiceConfig::new(dir.join("jobs")).with_token(TOKEN);
    config.depth = depth;
    JobService::start(config).expect("job service starts")
}

/// A `ferrite worker` process, SIGKILLed and reaped on drop.
pub struct Worker {
    pub child: Child,
    pub name: String,
    pub state_dir: PathBuf,
}

impl Worker {
    pub fn start(addr: &str, name: &str, xstreams: u32, dir: &Path) -> Worker {
        let state_dir = dir.join(name);
        let child = Command::new(env!("CARGO_BIN_EXE_ferrite"))
            .env("FERRITE_TOKEN", "jobs-test-token")
            .args(["worker", "--engine", addr, "--name", name])
            .args(["--xstreams", &xstreams.to_string()])
            .arg("--state-dir")
            .arg(&state_dir)
            .stdin(Stdio::null())
            .spawn()
            .expect("worker starts");
        Worker {
            child,
            name: name.to_string(),
            state_dir,
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Makes a FIFO; a task writing to it blocks until the test reads.
pub fn fifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", path.display());
}

/// Blocks until a task writes a line to the FIFO; returns it.
pub fn read_fifo_line(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read fifo");
    text.trim().to_string()
}

/// What most job tests start with: a watchdog, a temp dir holding a FIFO
/// named `started`, and a job service.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub fifo: PathBuf,
    pub service: JobService,
    pub addr: String,
}

pub fn setup(limit: Duration) -> Setup {
    watchdog(limit);
    let dir = tempfile::tempdir().unwrap();
    let fifo_path = dir.path().join("started");
    fifo(&fifo_path);
    let service = start_service(dir.path(), 4);
    let addr = service.addr().to_string();
    Setup {
        dir,
        fifo: fifo_path,
        service,
        addr,
    }
}
