//! Running one granted task: check its record against its key, decode it,
//! run its steps.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::client::Client;
use ferrite_proto::record::RecordView;
use ferrite_proto::rpc_jobs::{task_key, Step, TaskGrant, TaskResult, TaskSpec};

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

/// Runs the steps in order, stopping at the first that fails.
pub fn run_task(grant: &TaskGrant, spec: &TaskSpec, start_ns: u64) -> TaskResult {
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
    for step in &spec.steps {
        match step {
            Step::Noop => {}
            Step::Exec {
                cmd,
                args,
                env,
                cwd,
            } => {
                if let Err(e) = exec(grant, cmd, args, env, cwd.as_deref(), &mut result) {
                    result.error = Some(format!("{cmd}: {e}"));
                }
            }
            Step::Io500 { phase, args } if phase == "all" => {
                let mut full = vec!["io500".to_string()];
                full.extend(args.iter().cloned());
                let bin = ferrite_binary();
                let cmd = bin.display().to_string();
                let env = std::collections::BTreeMap::new();
                if let Err(e) = exec(grant, &cmd, &full, &env, None, &mut result) {
                    result.error = Some(format!("{cmd} io500: {e}"));
                }
            }
            Step::Io500 { phase, .. } => {
                result.error = Some(format!(
                    "io500 phase {phase:?}: the io500 runner runs all phases together; use phase = \"all\""
                ));
            }
            other => {
                let kind = serde_json::to_value(other)
                    .ok()
                    .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_string))
                    .unwrap_or_default();
                result.error = Some(format!(
                    "step kind {kind:?} needs the record store client, which this worker does not have"
                ));
            }
        }
        if result.error.is_some() || result.exit_code != 0 {
            break;
        }
    }
    result.end_ns = now_ns();
    result
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
    let input = grant.stdin.clone();
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
