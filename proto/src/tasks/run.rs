//! Running one granted task: check its record against its key, decode it,
//! run its steps.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use super::{steps, TaskHost, TaskStore};
use crate::record::RecordView;
use crate::rpc::{Key, Reply, Request};
use crate::rpc_jobs::{
    output_key, task_key, Step, TaskGrant, TaskResult, TaskSpec, AKEY_EXIT, AKEY_STDERR,
    AKEY_STDOUT,
};

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Gets the task's record — from the engine `store` under
/// `task_key(job, id)` (one-sided when the store can; the store checks the
/// record against the key), else from the grant, checked here — and decodes it.
pub async fn decode_task<S: TaskStore>(
    grant: &TaskGrant,
    store: Option<&S>,
    buf: &mut Vec<u8>,
) -> Result<TaskSpec, String> {
    let key = task_key(grant.job, grant.id.as_bytes());
    let value: &[u8] = match store {
        Some(store) if grant.record.is_empty() => match store.get_into(&key, buf).await {
            Ok(Some(_version)) => buf,
            Ok(None) => {
                return Err(format!(
                    "task record of {:?} is not in the engine",
                    grant.id
                ))
            }
            Err(e) => return Err(format!("task record of {:?}: {e}", grant.id)),
        },
        _ => {
            let view = RecordView::parse(&grant.record).map_err(|e| format!("task record: {e}"))?;
            view.verify_for(&key, grant.addr)
                .map_err(|e| format!("task record: {e}"))?;
            buf.clear();
            buf.extend_from_slice(view.value());
            buf
        }
    };
    let spec: TaskSpec =
        serde_json::from_slice(value).map_err(|e| format!("task record value: {e}"))?;
    if spec.id != grant.id {
        return Err(format!(
            "task record holds task {:?}, not {:?}",
            spec.id, grant.id
        ));
    }
    Ok(spec)
}

/// Whether the task is only no-op steps (nothing worth a "started" update).
pub fn is_trivial(spec: &TaskSpec) -> bool {
    spec.steps.iter().all(|s| matches!(s, Step::Noop))
}

/// The result of a task that could not run at all (its record, say).
pub fn failed(grant: &TaskGrant, start_ns: u64, error: String) -> TaskResult {
    TaskResult {
        job: grant.job,
        idx: grant.idx,
        attempt: grant.attempt,
        xstream: grant.xstream,
        start_ns,
        end_ns: now_ns(),
        exit_code: -1,
        error: Some(error),
        stdout: Vec::new(),
        stderr: Vec::new(),
    }
}

/// Runs the steps in order, stopping at the first that fails. With an
/// engine `store`, storage steps run against it, the standard input comes
/// from the stdout records of the task's `inputs`, and the task's stdout,
/// stderr and exit code are stored back as records ([`output_key`]).
pub async fn run_task<S: TaskStore, H: TaskHost>(
    grant: &TaskGrant,
    spec: &TaskSpec,
    start_ns: u64,
    store: Option<&S>,
    host: &H,
) -> TaskResult {
    let mut result = TaskResult {
        job: grant.job,
        idx: grant.idx,
        attempt: grant.attempt,
        xstream: grant.xstream,
        start_ns,
        end_ns: 0,
        exit_code: 0,
        error: None,
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    let stdin = match (store, grant.inputs.is_empty()) {
        (Some(s), false) => read_inputs(s, grant).await,
        _ => Ok(grant.stdin.clone()),
    };
    match stdin {
        Ok(stdin) => run_steps(grant, spec, stdin, store, host, &mut result).await,
        Err(e) => result.error = Some(e),
    }
    if let (Some(s), false) = (store, is_trivial(spec)) {
        match store_outputs(s, grant, &result).await {
            // The records are the outputs: the result no longer carries them.
            Ok(()) => {
                result.stdout.clear();
                result.stderr.clear();
            }
            Err(e) => {
                result.error.get_or_insert(e);
            }
        }
    }
    result.end_ns = now_ns();
    result
}

async fn run_steps<S: TaskStore, H: TaskHost>(
    grant: &TaskGrant,
    spec: &TaskSpec,
    stdin: Vec<u8>,
    store: Option<&S>,
    host: &H,
    result: &mut TaskResult,
) {
    for step in &spec.steps {
        let outcome = match (step, store) {
            (Step::Noop, _) => Ok(String::new()),
            (Step::Exec { cmd, .. }, _) => {
                let command = Exec::of(grant, step, stdin.clone());
                host.blocking(move || command.run())
                    .await
                    .and_then(|r| r.map_err(|e| e.to_string()))
                    .map(|out| out.add_to(result))
                    .map_err(|e| format!("{cmd}: {e}"))
            }
            (Step::Io500 { phase, args }, _) => io500(grant, phase, args, host, result).await,
            (_, Some(s)) => storage_step(s, step).await,
            (_, None) => Err(format!(
                "step kind {:?} needs the job's engine store: run the job service inside ferrite-engine, or submit with a store",
                kind_of(step)
            )),
        };
        match outcome {
            Ok(line) => result.stdout.extend_from_slice(line.as_bytes()),
            Err(e) => result.error = Some(e),
        }
        if result.error.is_some() || result.exit_code != 0 {
            break;
        }
    }
}

/// Runs one built-in storage step against `store`; its summary line.
async fn storage_step<S: TaskStore>(store: &S, step: &Step) -> Result<String, String> {
    match step {
        Step::Put {
            container,
            prefix,
            count,
            size_bytes,
        } => steps::put(store, *container, prefix, *count, *size_bytes).await,
        Step::Get {
            container,
            prefix,
            count,
        } => steps::get(store, *container, prefix, *count).await,
        Step::Copy {
            source,
            target,
            prefix,
            count,
        } => steps::copy(store, *source, *target, prefix, *count).await,
        Step::Scrub { container } => steps::scrub(store, *container).await,
        other => Err(format!("{:?} is not a storage step", kind_of(other))),
    }
}

/// The `kind` tag of a step.
fn kind_of(step: &Step) -> String {
    serde_json::to_value(step)
        .ok()
        .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_string))
        .unwrap_or_default()
}

/// Runs `ferrite io500 ARGS`: every phase in order in one process (`all`), or one phase
/// (`ferrite io500 --phase PHASE --run-id ID ARGS`, the run id from the job's id unless ARGS
/// give one, so that the job's phases share one run directory).
async fn io500<H: TaskHost>(
    grant: &TaskGrant,
    phase: &str,
    args: &[String],
    host: &H,
    result: &mut TaskResult,
) -> Result<String, String> {
    let mut full = vec!["io500".to_string()];
    if phase != "all" {
        host.check_io500_phase(phase)?;
        full.extend(["--phase".to_string(), phase.to_string()]);
        if !args
            .iter()
            .any(|a| a == "--run-id" || a.starts_with("--run-id="))
        {
            full.extend(["--run-id".to_string(), format!("{:x}", grant.job as u64)]);
        }
    }
    full.extend(args.iter().cloned());
    let cmd = host.ferrite_binary().display().to_string();
    let step = Step::Exec {
        cmd: cmd.clone(),
        args: full,
        env: BTreeMap::new(),
        cwd: None,
        timeout_s: None,
    };
    let command = Exec::of(grant, &step, Vec::new());
    host.blocking(move || command.run())
        .await
        .and_then(|r| r.map_err(|e| e.to_string()))
        .map(|out| out.add_to(result))
        .map_err(|e| format!("{cmd} io500: {e}"))
}

/// The stdout records of the task's inputs, concatenated in order.
async fn read_inputs<S: TaskStore>(store: &S, grant: &TaskGrant) -> Result<Vec<u8>, String> {
    let mut stdin = Vec::new();
    let mut buf = Vec::new();
    for id in &grant.inputs {
        let key = output_key(grant.job, id.as_bytes(), AKEY_STDOUT);
        match store.get_into(&key, &mut buf).await {
            Ok(Some(_)) => stdin.extend_from_slice(&buf),
            // A task without output stores no record.
            Ok(None) => {}
            Err(e) => return Err(format!("stdout of input {id:?}: {e}")),
        }
    }
    Ok(stdin)
}

/// Stores stdout, stderr and the exit code under [`output_key`].
async fn store_outputs<S: TaskStore>(
    store: &S,
    grant: &TaskGrant,
    r: &TaskResult,
) -> Result<(), String> {
    let id = grant.id.as_bytes();
    let key = |akey| {
        let k = output_key(grant.job, id, akey);
        Key::new(k.container, k.object, k.dkey, k.akey)
    };
    let puts = vec![
        Request::Update {
            key: key(AKEY_STDOUT),
            value: r.stdout.clone(),
        },
        Request::Update {
            key: key(AKEY_STDERR),
            value: r.stderr.clone(),
        },
        Request::Update {
            key: key(AKEY_EXIT),
            value: r.exit_code.to_le_bytes().to_vec(),
        },
    ];
    let replies = store
        .batch(puts)
        .await
        .map_err(|e| format!("storing outputs: {e}"))?;
    for reply in replies {
        if let Reply::Error { message, .. } = reply {
            return Err(format!("storing outputs: {message}"));
        }
    }
    Ok(())
}

/// A command line to run, owned so it can move to a blocking thread.
struct Exec {
    cmd: String,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    input: Vec<u8>,
    timeout: std::time::Duration,
}

/// What a command left.
struct ExecOutput {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit_code: i32,
}

impl ExecOutput {
    /// Adds the output to `result`; the command ran, so no step summary.
    fn add_to(self, result: &mut TaskResult) -> String {
        result.stdout.extend_from_slice(&self.stdout);
        result.stderr.extend_from_slice(&self.stderr);
        result.exit_code = self.exit_code;
        String::new()
    }
}

impl Exec {
    /// The command of an `exec` step (anything else runs nothing), with the
    /// task named in its environment.
    fn of(grant: &TaskGrant, step: &Step, input: Vec<u8>) -> Self {
        let mut timeout_s_of = super::EXEC_TIMEOUT_S;
        let (cmd, args, mut env, cwd) = match step {
            Step::Exec {
                cmd,
                args,
                env,
                cwd,
                timeout_s,
            } => {
                timeout_s_of = timeout_s.unwrap_or(super::EXEC_TIMEOUT_S).max(1);
                (cmd.clone(), args.clone(), env.clone(), cwd.clone())
            }
            _ => ("true".into(), Vec::new(), BTreeMap::new(), None),
        };
        env.insert("FERRITE_JOB".into(), format!("{:032x}", grant.job));
        env.insert("FERRITE_TASK".into(), grant.id.clone());
        env.insert("FERRITE_ATTEMPT".into(), grant.attempt.to_string());
        Self {
            cmd,
            args,
            env,
            cwd,
            input,
            timeout: std::time::Duration::from_secs(timeout_s_of),
        }
    }

    /// Runs the command to its end (blocking).
    fn run(self) -> std::io::Result<ExecOutput> {
        let mut c = Command::new(&self.cmd);
        c.args(&self.args)
            .envs(&self.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(d) = &self.cwd {
            c.current_dir(d);
        }
        let cpus = process_cpus();
        // A task dies with its node (SIGKILL included): the resource manager
        // runs it again elsewhere, so it must not linger here. It may use
        // every CPU the process may, not only the core of the (pinned)
        // thread that starts it.
        // SAFETY: prctl(PR_SET_PDEATHSIG) and sched_setaffinity are
        // async-signal-safe system calls; the child reads only `cpus`, its
        // own copy. That is all it does before exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            c.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(set) = &cpus {
                    // Best effort: on failure the task runs where it was.
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set);
                }
                Ok(())
            });
        }
        // Its own process group, so a timeout kills what it started too.
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        let mut child = c.spawn()?;
        let stdin = child.stdin.take();
        let input = self.input;
        // A separate writer so a child that writes before reading cannot block us.
        let feeder = std::thread::spawn(move || {
            if let Some(mut s) = stdin {
                let _ = s.write_all(&input);
            }
        });
        let stdout = capture(child.stdout.take(), EXEC_OUTPUT_MAX_BYTES);
        let stderr = capture(child.stderr.take(), EXEC_OUTPUT_MAX_BYTES);
        let group = child.id() as libc::pid_t;
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let status = child.wait();
            let _ = done_tx.send(());
            status
        });
        let timed_out = match done_rx.recv_timeout(self.timeout) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                // SAFETY: kill(2) on the child's process group, which
                // exists until the child is reaped by `waiter` below.
                unsafe { libc::kill(-group, libc::SIGKILL) };
                true
            }
            _ => false,
        };
        let status = waiter
            .join()
            .map_err(|_| std::io::Error::other("waiting for the command panicked"))??;
        let _ = feeder.join();
        let (stdout, stderr) = (joined(stdout), joined(stderr));
        if timed_out {
            let secs = self.timeout.as_secs();
            return Err(std::io::Error::other(format!("timed out after {secs} s")));
        }
        let exit_code = match status.code() {
            Some(c) => c,
            None => {
                use std::os::unix::process::ExitStatusExt;
                128 + status.signal().unwrap_or(0)
            }
        };
        Ok(ExecOutput {
            stdout,
            stderr,
            exit_code,
        })
    }
}

/// Most bytes of an exec step's stdout, and of its stderr, kept; the rest
/// is read and dropped, and a [`TRUNCATED_MARK`] line says how much.
pub const EXEC_OUTPUT_MAX_BYTES: usize = 1 << 20;
/// Starts the line appended to truncated output.
pub const TRUNCATED_MARK: &str = "\n[ferrite: output truncated, ";

type Capture = std::thread::JoinHandle<Vec<u8>>;

/// Reads `pipe` to its end on a thread of its own, keeping `max` bytes.
fn capture(pipe: Option<impl std::io::Read + Send + 'static>, max: usize) -> Option<Capture> {
    let mut pipe = pipe?;
    let reader = std::thread::spawn(move || {
        let (mut kept, mut dropped, mut buf) = (Vec::new(), 0u64, vec![0u8; 64 << 10]);
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = max.saturating_sub(kept.len()).min(n);
                    kept.extend_from_slice(&buf[..room]);
                    dropped += (n - room) as u64;
                }
            }
        }
        if dropped > 0 {
            let mark = format!("{TRUNCATED_MARK}{dropped} bytes dropped]\n");
            kept.extend_from_slice(mark.as_bytes());
        }
        kept
    });
    Some(reader)
}

fn joined(capture: Option<Capture>) -> Vec<u8> {
    capture.and_then(|c| c.join().ok()).unwrap_or_default()
}

/// The CPUs of the process's main thread: those the process was started
/// with, before any xstream pinned its threads (and an engine's blocking
/// pool thread, which starts `exec` tasks, to its xstream's core).
fn process_cpus() -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data, valid zeroed; sched_getaffinity
    // writes at most `size_of::<cpu_set_t>()` bytes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        (libc::sched_getaffinity(libc::getpid(), size, &mut set) == 0).then_some(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Here;
    impl TaskHost for Here {
        async fn blocking<R: Send + 'static>(
            &self,
            f: impl FnOnce() -> R + Send + 'static,
        ) -> Result<R, String> {
            super::super::run_caught(f)
        }
    }
    struct Nowhere;
    impl TaskStore for Nowhere {
        async fn batch(&self, _: Vec<Request>) -> Result<Vec<Reply>, String> {
            Err("no engine".into())
        }
    }

    fn run_sh(script: &str, timeout_s: Option<u64>) -> TaskResult {
        let grant = TaskGrant {
            job: 1,
            idx: 0,
            id: "a".into(),
            attempt: 0,
            xstream: 0,
            ready_ns: 0,
            addr: 0,
            record: vec![],
            stdin: vec![],
            inputs: vec![],
        };
        let step = Step::Exec {
            cmd: "sh".into(),
            args: vec!["-c".into(), script.into()],
            env: BTreeMap::new(),
            cwd: None,
            timeout_s,
        };
        let spec = TaskSpec {
            id: "a".into(),
            after: vec![],
            inputs: vec![],
            steps: vec![step],
            retry: None,
        };
        futures::executor::block_on(run_task(&grant, &spec, 1, None::<&Nowhere>, &Here))
    }

    #[test]
    fn an_exec_step_past_its_timeout_is_killed_with_its_group_and_fails() {
        // Guards the per-step timeout: the command and the child it left
        // in the background are killed, and the step says why it failed.
        let dir = tempfile::tempdir().unwrap();
        let late = dir.path().join("late");
        let script = format!("(sleep 3; touch {}) & sleep 600", late.display());
        let r = run_sh(&script, Some(1));
        let error = r.error.expect("the step failed");
        assert!(error.contains("timed out after 1 s"), "{error}");
        std::thread::sleep(std::time::Duration::from_secs(4));
        assert!(!late.exists(), "the background child was killed too");
    }

    #[test]
    fn captured_output_is_capped_and_the_cut_is_marked() {
        // Guards the output cap: a command printing 3 MiB keeps 1 MiB of
        // stdout and stderr each, with a line saying how much was dropped.
        let r = run_sh(
            "head -c 3145728 /dev/zero; head -c 3145728 /dev/zero >&2",
            None,
        );
        assert_eq!((r.exit_code, r.error.as_deref()), (0, None));
        for out in [&r.stdout, &r.stderr] {
            let text = String::from_utf8_lossy(&out[EXEC_OUTPUT_MAX_BYTES..]);
            assert!(text.starts_with(TRUNCATED_MARK), "{text}");
            assert!(text.contains("2097152 bytes dropped"), "{text}");
        }
        let small = run_sh("echo hi", None);
        assert_eq!(small.stdout, b"hi\n");
    }
}
