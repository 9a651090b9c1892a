//! A task's outputs as the worker stored them back in the engine: stdout,
//! stderr and exit code under [`output_key`]`(job, task id, akey)`.

use ferrite_proto::rpc_jobs::{output_key, JobStatus, AKEY_EXIT, AKEY_STDERR, AKEY_STDOUT};

use super::error::JobsError;
use crate::client::Client;

/// What a finished task left in the engine.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TaskOutputs {
    pub id: String,
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// The outputs of task `id` of `job`; `None` if it stored none (not run
/// yet, or only no-op steps).
pub fn read(store: &Client, job: u128, id: &str) -> Result<Option<TaskOutputs>, JobsError> {
    let get = |akey| {
        store
            .get(&owned(job, id, akey))
            .map_err(|e| JobsError::Store(format!("output of {id:?}: {e}")))
    };
    let Some(exit) = get(AKEY_EXIT)? else {
        return Ok(None);
    };
    let exit: [u8; 4] = exit
        .as_slice()
        .try_into()
        .map_err(|_| JobsError::Store(format!("exit record of {id:?} is not 4 bytes")))?;
    let text = |v: Option<Vec<u8>>| String::from_utf8_lossy(&v.unwrap_or_default()).into_owned();
    Ok(Some(TaskOutputs {
        id: id.to_string(),
        exit_code: i32::from_le_bytes(exit),
        stdout: text(get(AKEY_STDOUT)?),
        stderr: text(get(AKEY_STDERR)?),
    }))
}

fn owned(job: u128, id: &str, akey: &[u8]) -> crate::client::Key {
    let k = output_key(job, id.as_bytes(), akey);
    crate::client::Key::new(k.container, k.object, k.dkey, k.akey)
}

/// The outputs of the first `limit` finished tasks of a job, read from its
/// engine store (empty when the job has none).
pub fn read_all(status: &JobStatus, limit: usize) -> Result<Vec<TaskOutputs>, JobsError> {
    let Some(url) = &status.store else {
        return Ok(Vec::new());
    };
    let store = Client::connect(url)?;
    let mut out = Vec::new();
    for t in status
        .tasks
        .iter()
        .filter(|t| t.state.is_final())
        .take(limit)
    {
        if let Some(o) = read(&store, status.job, &t.id)? {
            out.push(o);
        }
    }
    Ok(out)
}
