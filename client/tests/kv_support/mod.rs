//! Runs a `ferrite-engine` process for client tests.
//!
//! The binary is looked up next to the test executable (`target/<profile>/`);
//! if it is missing it is built with cargo into the same target dir, with a
//! message saying so.

#![allow(dead_code)]

pub mod linearizable;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long an engine may take to print `ready`, unless
/// `FERRITE_ENGINE_START_TIMEOUT_S` says otherwise (the soft-RoCE guest,
/// an emulated CPU on a loaded host, gives it minutes).
const START_TIMEOUT: Duration = Duration::from_secs(60);

fn start_timeout() -> Duration {
    std::env::var("FERRITE_ENGINE_START_TIMEOUT_S")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(START_TIMEOUT, Duration::from_secs)
}

pub fn engine_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let bin = profile_dir.join("ferrite-engine");
    if !bin.exists() {
        let target_dir = profile_dir.parent().expect("target dir");
        eprintln!(
            "kv tests: {} not found; building it (cargo build -p ferrite-engine --bin ferrite-engine)",
            bin.display()
        );
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "-p", "ferrite-engine", "--bin", "ferrite-engine"])
            .env("CARGO_TARGET_DIR", target_dir);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("running cargo to build ferrite-engine");
        assert!(status.success(), "building ferrite-engine failed");
    }
    bin
}

/// A running engine process on a data directory.
pub struct EngineProc {
    child: Option<Child>,
    pub dir: PathBuf,
    pub tcp: String,
    pub unix: String,
    /// The engine's token file (its `token_file PATH` line) and token,
    /// which TCP clients must prove.
    pub token_file: PathBuf,
    pub token: Vec<u8>,
}

impl EngineProc {
    /// Starts an engine with one target on `dir` (which it may recover).
    pub fn start(dir: &Path) -> Self {
        Self::start_with(dir, &[])
    }

    /// Starts an engine with `extra` flags (a `--bdev` among them replaces
    /// the default device).
    pub fn start_with(dir: &Path, extra: &[&str]) -> Self {
        let sock = dir.join("engine.sock");
        let _ = std::fs::remove_file(&sock);
        let mut child = Command::new(engine_binary())
            .arg("--data-dir")
            .arg(dir)
            .args([
                "--xstreams",
                "1",
                "--tcp",
                "127.0.0.1:0",
                "--providers",
                "shm,tcp",
            ])
            .args(match extra.contains(&"--bdev") {
                true => &[][..],
                false => &["--bdev", "uring:{dir}/target-{i}.bdev?size=256M"][..],
            })
            .arg("--unix")
            .arg(&sock)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning ferrite-engine");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (mut tcp, mut unix) = (String::new(), String::new());
        let mut token_file = None;
        let (started, limit) = (Instant::now(), start_timeout());
        let mut seen: Vec<String> = Vec::new();
        loop {
            let left = limit.saturating_sub(started.elapsed());
            let line = match rx.recv_timeout(left) {
                Ok(l) => l,
                Err(e) => {
                    // Disconnected: stdout closed, the engine exited.
                    let status = match e {
                        mpsc::RecvTimeoutError::Timeout => {
                            let _ = child.kill();
                            "killed".to_string()
                        }
                        mpsc::RecvTimeoutError::Disconnected => "exited".to_string(),
                    };
                    let status = match child.wait() {
                        Ok(s) => format!("{status}: {s}"),
                        Err(e) => format!("{status}: wait failed: {e}"),
                    };
                    panic!(
                        "ferrite-engine did not print ready within {:.1} s (limit {limit:?}, \
                         FERRITE_ENGINE_START_TIMEOUT_S); {status}; its stdout so far: {seen:?} \
                         (stderr above)",
                        started.elapsed().as_secs_f64()
                    );
                }
            };
            if let Some(url) = line.strip_prefix("listen ") {
                if url.starts_with("tcp://") {
                    tcp = url.to_string();
                } else {
                    unix = url.to_string();
                }
            }
            if let Some(path) = line.strip_prefix("token_file ") {
                token_file = Some(PathBuf::from(path));
            }
            if line == "ready" {
                break;
            }
            seen.push(line);
        }
        let token_file = token_file.expect("the engine prints its token_file");
        let token = ferrite_proto::rpc::handshake::read_token_file(&token_file)
            .expect("the engine's token file");
        Self {
            child: Some(child),
            dir: dir.to_path_buf(),
            tcp,
            unix,
            token_file,
            token,
        }
    }

    /// Default client options holding this engine's token.
    pub fn options(&self) -> ferrite_client::client::ClientOptions {
        ferrite_client::client::ClientOptions {
            token: Some(self.token.clone()),
            ..Default::default()
        }
    }

    /// A client of `url` (either listener) with [`EngineProc::options`].
    pub fn client(&self, url: &str) -> ferrite_client::client::Client {
        ferrite_client::client::Client::connect_with(url, self.options()).expect("connect")
    }

    /// SIGKILL, no chance to flush.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: sending a signal to our own child by pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

impl Drop for EngineProc {
    fn drop(&mut self) {
        self.kill();
    }
}
