//! Guards the engine's side of authentication and its data dir hygiene:
//! with no token configured an engine generates one (0600) in its data dir
//! and every TCP connection must prove it; token files others may read and
//! empty tokens are refused at start; a second engine cannot open a data
//! dir in use (the first keeps serving); the data dir, bdev, socket and
//! token files get their modes; the open-file limit is raised to the hard
//! one.

mod server_support;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferrite_proto::rpc::handshake::TOKEN_FILE_NAME;
use ferrite_proto::rpc::{Reply, Request};
use server_support::{temp_dir, EngineProcess, RawClient};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn stat_works(c: &mut RawClient) {
    assert!(matches!(c.call(&Request::Stat).unwrap(), Reply::Stat(_)));
}

/// How long an engine that must refuse to start may take to exit.
const REFUSAL_LIMIT: Duration = Duration::from_secs(60);

/// Runs the engine binary on `dir` with `extra` flags, expecting it to
/// refuse to start (killed, and the test failed, if it still runs after
/// [`REFUSAL_LIMIT`]); returns its stderr.
fn failed_start(dir: &Path, extra: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrite-engine"))
        .arg("--data-dir")
        .arg(dir)
        .args(["--xstreams", "1", "--tcp", "127.0.0.1:0", "--jobs", ""])
        .args(["--bdev", "uring:{dir}/target-{i}.bdev?size=64M"])
        .args(["--ring-bytes", "4M", "--buckets", "4096"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > REFUSAL_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the engine started (still running after {REFUSAL_LIMIT:?})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "the engine exited 0");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn tcp_needs_the_token_the_engine_generated_and_files_get_their_modes() {
    let dir = temp_dir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let engine = EngineProcess::start(dir.path(), &[]);
    let token_file = dir.path().join(TOKEN_FILE_NAME);
    let text = std::fs::read_to_string(&token_file).unwrap();
    assert_eq!(
        text.trim_end().len(),
        64,
        "32 random bytes in hex: {text:?}"
    );
    assert!(text.trim_end().bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(engine.token, text.trim_end().as_bytes());

    assert_eq!(mode(&token_file), 0o600, "token file");
    assert_eq!(mode(dir.path()), 0o700, "data dir");
    assert_eq!(mode(&engine.unix), 0o660, "unix socket");
    for i in 0..2 {
        let bdev = dir.path().join(format!("target-{i}.bdev"));
        assert_eq!(mode(&bdev), 0o600, "{}", bdev.display());
    }

    // No proof, a wrong one: refused. The generated token: admitted.
    assert!(RawClient::connect_tcp(engine.tcp, None).is_err());
    assert!(RawClient::connect_tcp(engine.tcp, Some(b"guess")).is_err());
    let mut c = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    stat_works(&mut c);
    let first_token = engine.token.clone();
    assert_eq!(engine.terminate(), Some(0));

    // A restart keeps the token it generated.
    let engine = EngineProcess::start(dir.path(), &[]);
    assert_eq!(engine.token, first_token);
}

#[test]
fn token_files_others_may_read_and_empty_tokens_are_refused_at_start() {
    let dir = temp_dir();
    let file = dir.path().join("token");
    std::fs::write(&file, "a-secret\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = failed_start(dir.path(), &["--token-file", file.to_str().unwrap()]);
    assert!(
        err.contains("0644") && err.contains("token"),
        "stderr: {err}"
    );

    std::fs::write(&file, "\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = failed_start(dir.path(), &["--token-file", file.to_str().unwrap()]);
    assert!(err.contains("empty"), "stderr: {err}");

    let config = dir.path().join("engine.toml");
    std::fs::write(&config, "[listen]\ntoken = \"\"\n").unwrap();
    let err = failed_start(dir.path(), &["--config", config.to_str().unwrap()]);
    assert!(
        err.contains("listen.token") && err.contains("empty"),
        "stderr: {err}"
    );

    // The engine's own token file, opened up by someone: refused too.
    let generated = dir.path().join(TOKEN_FILE_NAME);
    std::fs::write(&generated, "0123abcd\n").unwrap();
    std::fs::set_permissions(&generated, std::fs::Permissions::from_mode(0o640)).unwrap();
    let err = failed_start(dir.path(), &[]);
    assert!(err.contains("0640"), "stderr: {err}");
}

#[test]
fn a_second_engine_on_a_data_dir_in_use_fails_and_the_first_keeps_serving() {
    let dir = temp_dir();
    let first = EngineProcess::start(dir.path(), &[]);
    let mut c = RawClient::connect_tcp(first.tcp, Some(&first.token)).unwrap();

    let other_socket = temp_dir();
    let sock = other_socket.path().join("second.sock");
    let err = failed_start(dir.path(), &["--unix", sock.to_str().unwrap()]);
    assert!(err.contains("in use"), "stderr: {err}");
    assert!(
        err.contains(&dir.path().display().to_string()),
        "names the dir: {err}"
    );
    assert!(
        err.contains(&format!("pid {}", first.pid())),
        "names the holder: {err}"
    );

    // The first engine's socket, token and targets are untouched.
    stat_works(&mut c);
    let mut again = RawClient::connect_tcp(first.tcp, Some(&first.token)).unwrap();
    stat_works(&mut again);
    let mut unix = RawClient::connect_unix(&first.unix, false).unwrap();
    stat_works(&mut unix);
}

/// The soft and hard open-file limits of process `pid`.
fn open_file_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].to_string(), fields[4].to_string())
}

#[test]
fn the_open_file_limit_is_raised_to_the_hard_limit() {
    let dir = temp_dir();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrite-engine"));
    cmd.arg("--data-dir")
        .arg(dir.path())
        .args(["--xstreams", "1", "--tcp", "127.0.0.1:0", "--jobs", ""])
        .args(["--bdev", "uring:{dir}/target-{i}.bdev?size=64M"])
        .args(["--ring-bytes", "4M", "--buckets", "4096"])
        .stdout(Stdio::piped());
    // SAFETY: the closure only calls getrlimit/setrlimit (async-signal-safe)
    // in the child between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
            limit.rlim_cur = limit.rlim_max.min(256);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let ready = stdout
        .lines()
        .take(200)
        .any(|l| l.is_ok_and(|l| l == "ready"));
    let (soft, hard) = open_file_limits(child.id());
    let _ = child.kill();
    let _ = child.wait();
    assert!(ready, "the engine did not start");
    assert_ne!(hard, "256", "the test needs a hard limit above 256");
    assert_eq!(soft, hard, "soft open-file limit raised to the hard one");
}
