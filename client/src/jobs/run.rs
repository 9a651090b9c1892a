//! Running one granted task: check its record against its key, decode it,
//! run its steps.

use std::io::Write;
use std::process::{Command, Stdio};

use super::steps;
use crate::client::{Client, Key, Reply, Request};
use ferrite_proto::record::RecordView;
use ferrite_proto::rpc_jobs::{
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
/// `task_key(job, id)` (one-sided when the client can; the client checks the
/// record against the key), else from the grant, checked here — and decodes it.
pub fn decode_task(
    grant: &TaskGrant,
    store: Option<&Client>,
    buf: &mut Vec<u8>,
) -> Result<TaskSpec, String> {
    let key = task_key(grant.job, grant.id.as_bytes());
    let value: &[u8] = match store {
        Some(client) if grant.record.is_empty() => match client.get_into(&key, buf) {
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

/// Runs the steps in order, stopping at the first that fails. With an
/// engine `store`, storage steps run against it, the standard input comes
/// from the stdout records of the task's `inputs`, and the task's stdout,
/// stderr and exit code are stored back as records ([`output_key`]).
pub fn run_task(
    grant: &TaskGrant,
    spec: &TaskSpec,
    start_ns: u64,
    store: Option<&Client>,
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
        (Some(c), false) => read_inputs(c, grant),
        _ => Ok(grant.stdin.clone()),
    };
    match stdin {
        Ok(stdin) => run_steps(grant, spec, &stdin, store, &mut result),
        Err(e) => result.error = Some(e),
    }
    if let (Some(c), false) = (store, is_trivial(spec)) {
        match store_outputs(c, grant, &result) {
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

fn run_steps(
    grant: &TaskGrant,
    spec: &TaskSpec,
    stdin: &[u8],
    store: Option<&Client>,
    result: &mut TaskResult,
) {
    for step in &spec.steps {
        let storage = |f: &dyn Fn(&Client) -> Result<String, String>| {
            match store {
            Some(c) => f(c),
            None => Err(format!(
                "step kind {:?} needs the job's engine store: run the job service inside ferrite-engine, or submit with a store",
                kind_of(step)
            )),
        }
        };
        let outcome = match step {
            Step::Noop => Ok(String::new()),
            Step::Exec {
                cmd,
                args,
                env,
                cwd,
            } => exec(grant, cmd, args, env, cwd.as_deref(), stdin, result)
                .map(|()| String::new())
                .map_err(|e| format!("{cmd}: {e}")),
            Step::Put {
                container,
                prefix,
                count,
                size_bytes,
            } => storage(&|c| steps::put(c, *container, prefix, *count, *size_bytes)),
            Step::Get {
                container,
                prefix,
                count,
            } => storage(&|c| steps::get(c, *container, prefix, *count)),
            Step::Copy {
                source,
                target,
                prefix,
                count,
            } => storage(&|c| steps::copy(c, *source, *target, prefix, *count)),
            Step::Scrub { container } => storage(&|c| steps::scrub(c, *container)),
            Step::Io500 { phase, args } => io500(grant, phase, args, result),
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
fn io500(
    grant: &TaskGrant,
    phase: &str,
    args: &[String],
    result: &mut TaskResult,
) -> Result<String, String> {
    let mut full = vec!["io500".to_string()];
    if phase != "all" {
        if crate::io500::phases::Phase::parse(phase).is_none() {
            let names = crate::io500::phases::Phase::names();
            return Err(format!("no io500 phase {phase:?}; phases: all, {names}"));
        }
        full.extend(["--phase".to_string(), phase.to_string()]);
        if !args
            .iter()
            .any(|a| a == "--run-id" || a.starts_with("--run-id="))
        {
            full.extend(["--run-id".to_string(), format!("{:x}", grant.job as u64)]);
        }
    }
    full.extend(args.iter().cloned());
    let cmd = ferrite_binary().display().to_string();
    let env = std::collections::BTreeMap::new();
    exec(grant, &cmd, &full, &env, None, &[], result)
        .map(|()| String::new())
        .map_err(|e| format!("{cmd} io500: {e}"))
}

/// The stdout records of the task's inputs, concatenated in order.
fn read_inputs(store: &Client, grant: &TaskGrant) -> Result<Vec<u8>, String> {
    let mut stdin = Vec::new();
    let mut buf = Vec::new();
    for id in &grant.inputs {
        let key = output_key(grant.job, id.as_bytes(), AKEY_STDOUT);
        match store.get_into(&key, &mut buf) {
            Ok(Some(_)) => stdin.extend_from_slice(&buf),
            // A task without output stores no record.
            Ok(None) => {}
            Err(e) => return Err(format!("stdout of input {id:?}: {e}")),
        }
    }
    Ok(stdin)
}

/// Stores stdout, stderr and the exit code under [`output_key`].
fn store_outputs(store: &Client, grant: &TaskGrant, r: &TaskResult) -> Result<(), String> {
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
        .map_err(|e| format!("storing outputs: {e}"))?;
    for reply in replies {
        if let Reply::Error { message, .. } = reply {
            return Err(format!("storing outputs: {message}"));
        }
    }
    Ok(())
}

/// The `ferrite` binary: `$FERRITE_BIN`, else this executable.
fn ferrite_binary() -> std::path::PathBuf {
    std::env::var_os("FERRITE_BIN")
        .map(Into::into)
        .or_else(|| std::env::current_exe().ok())
        .unwrap_or_else(|| "ferrite".into())
}

fn exec(
    grant: &TaskGrant,
    cmd: &str,
    args: &[String],
    env: &std::collections::BTreeMap<String, String>,
    cwd: Option<&str>,
    input: &[u8],
    result: &mut TaskResult,
) -> std::io::Result<()> {
    let mut c = Command::new(cmd);
    c.args(args)
        .envs(env)
        .env("FERRITE_JOB", format!("{:032x}", grant.job))
        .env("FERRITE_TASK", &grant.id)
        .env("FERRITE_ATTEMPT", grant.attempt.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    // A task dies with its worker (SIGKILL included): the resource manager
    // runs it again elsewhere, so it must not linger here.
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no
    // memory of the parent; it is all the child does before exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        c.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = c.spawn()?;
    let stdin = child.stdin.take();
    let input = input.to_vec();
    // A separate writer so a child that writes before reading cannot block us.
    let feeder = std::thread::spawn(move || {
        if let Some(mut s) = stdin {
            let _ = s.write_all(&input);
        }
    });
    let out = child.wait_with_output()?;
    let _ = feeder.join();
    result.stdout.extend_from_slice(&out.stdout);
    result.stderr.extend_from_slice(&out.stderr);
    result.exit_code = match out.status.code() {
        Some(c) => c,
        None => {
            use std::os::unix::process::ExitStatusExt;
            128 + out.status.signal().unwrap_or(0)
        }
    };
    Ok(())
}
