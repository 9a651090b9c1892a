//! What the job service, its workers and the `ferrite job` CLI agree on.
//!
//! - **Job files** ([`JobSpec`]): a job is a DAG of tasks; each task is a
//!   sequence of [`Step`]s and may name tasks it must run [`TaskSpec::after`]
//!   and tasks whose output is its input ([`TaskSpec::inputs`]).
//! - **Task records**: each task is stored as a record (see `record.rs`) under
//!   the key [`task_key`]`(job, task id)` in the dedicated container
//!   [`JOBS_CONTAINER`]; a worker checks every record it gets against that key.
//! - **Messages**: a connection carries frames `[u32 LE length][JSON]`
//!   ([`write_frame`], [`read_frame`]); a worker or CLI sends [`ToEngine`],
//!   the job service answers with [`ToPeer`].
//! - **State files**: the `tasks` table ([`TASKS_TABLE_SQL`]) is the same in a
//!   job state object and in its task state objects, so rows move between them
//!   unchanged.
//!
//! ```
//! use ferrite_proto::rpc_jobs::{task_key, JobSpec, JOBS_CONTAINER};
//!
//! let spec: JobSpec = serde_json::from_str(
//!     r#"{"name":"j","task":[{"id":"a","steps":[{"kind":"noop"}]},
//!                            {"id":"b","after":["a"],"steps":[{"kind":"noop"}]}]}"#,
//! ).unwrap();
//! assert_eq!(spec.tasks[1].after, vec!["a".to_string()]);
//! let key = task_key(7, "b".as_bytes());
//! assert_eq!(key.container, JOBS_CONTAINER);
//! assert_eq!(key.object, 7);
//! ```

use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::key::RecordKey;

pub mod auth;

/// Container that holds every job's task records and outputs.
pub const JOBS_CONTAINER: u64 = 0x4a4f_4253; // "JOBS"
/// akey of a task's definition record.
pub const AKEY_TASK: &[u8] = b"task";
/// akey of a finished `exec` task's standard output.
pub const AKEY_STDOUT: &[u8] = b"stdout";
/// akey of a finished `exec` task's standard error.
pub const AKEY_STDERR: &[u8] = b"stderr";
/// akey of a finished task's exit code (4 bytes, i32 LE).
pub const AKEY_EXIT: &[u8] = b"exit";
/// Object under which the built-in storage steps (`put`, `get`, `copy`,
/// `scrub`) keep their records in a container ("STEP").
pub const STEP_OBJECT: u128 = 0x5354_4550;
/// akey of a storage step's record.
pub const AKEY_VALUE: &[u8] = b"value";
/// Largest frame accepted, in bytes.
pub const FRAME_MAX_BYTES: usize = 256 << 20;

/// The key of task `task_id` of job `job`: (JOBS_CONTAINER, job, task id, "task").
pub fn task_key(job: u128, task_id: &[u8]) -> RecordKey<'_> {
    RecordKey::new(JOBS_CONTAINER, job, task_id, AKEY_TASK)
}

/// The key of output `akey` ([`AKEY_STDOUT`], [`AKEY_STDERR`],
/// [`AKEY_EXIT`]) of task `task_id` of job `job`: the worker that ran the
/// task stores it there; `ferrite job status` and the task's consumers
/// (`inputs`) read it.
pub fn output_key<'a>(job: u128, task_id: &'a [u8], akey: &'a [u8]) -> RecordKey<'a> {
    RecordKey::new(JOBS_CONTAINER, job, task_id, akey)
}

/// The key of record `name` of a storage step in `container`:
/// (container, [`STEP_OBJECT`], name, [`AKEY_VALUE`]).
pub fn step_key(container: u64, name: &[u8]) -> RecordKey<'_> {
    RecordKey::new(container, STEP_OBJECT, name, AKEY_VALUE)
}

/// A job file, TOML (`[[task]]` tables) or JSON (`"task": [...]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    /// Default retry policy of every task.
    #[serde(default)]
    pub retry: RetryPolicy,
    #[serde(rename = "task", alias = "tasks")]
    pub tasks: Vec<TaskSpec>,
}

/// One node of the DAG.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    pub id: String,
    /// Tasks that must have finished before this one starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    /// Tasks whose standard output, concatenated in this order, is this
    /// task's standard input. Each is also an `after` constraint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    pub steps: Vec<Step>,
    /// Overrides the job's retry policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
}

/// How often a task is tried when its worker dies or it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub max_attempts: u32,
    /// Also retry a task whose step failed (non-zero exit), not only one
    /// whose worker was lost.
    #[serde(default)]
    pub on_failure: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            on_failure: false,
        }
    }
}

/// One step of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Does nothing (benchmarks, joins).
    Noop,
    /// Runs a command; its stdout, stderr and exit code are kept.
    Exec {
        cmd: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
        #[serde(default)]
        cwd: Option<String>,
        /// Seconds the command may run before its process group is killed
        /// and the step fails ("timed out after N s"); default
        /// `tasks::EXEC_TIMEOUT_S` (3600).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_s: Option<u64>,
    },
    /// Writes `count` values of `size_bytes` under keys `prefix{i}`.
    Put {
        container: u64,
        prefix: String,
        count: u64,
        size_bytes: u64,
    },
    /// Reads `count` keys `prefix{i}`.
    Get {
        container: u64,
        prefix: String,
        count: u64,
    },
    /// Copies `count` keys `prefix{i}` from one container to another.
    Copy {
        source: u64,
        target: u64,
        prefix: String,
        count: u64,
    },
    /// Reads every record of a container and checks its checksum.
    Scrub { container: u64 },
    /// One phase of the IO500-style benchmark (`ior-easy-write`, ..., or `setup`,
    /// `score`, `cleanup`; phases of one job share a run directory), or `all` of them in
    /// one process; `args` are `ferrite io500`'s.
    Io500 {
        phase: String,
        #[serde(default)]
        args: Vec<String>,
    },
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskPhase {
    /// Some constraint is not satisfied yet.
    Pending,
    /// Every constraint is satisfied; waiting for a resource.
    Ready,
    /// Granted to a resource.
    Running,
    Done,
    Failed,
    Cancelled,
}

impl TaskPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskPhase::Pending => "pending",
            TaskPhase::Ready => "ready",
            TaskPhase::Running => "running",
            TaskPhase::Done => "done",
            TaskPhase::Failed => "failed",
            TaskPhase::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => TaskPhase::Pending,
            "ready" => TaskPhase::Ready,
            "running" => TaskPhase::Running,
            "done" => TaskPhase::Done,
            "failed" => TaskPhase::Failed,
            "cancelled" => TaskPhase::Cancelled,
            _ => return None,
        })
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            TaskPhase::Done | TaskPhase::Failed | TaskPhase::Cancelled
        )
    }
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobPhase {
    Queued,
    Running,
    Done,
    Failed,
    Cancelled,
}

impl JobPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            JobPhase::Queued => "queued",
            JobPhase::Running => "running",
            JobPhase::Done => "done",
            JobPhase::Failed => "failed",
            JobPhase::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => JobPhase::Queued,
            "running" => JobPhase::Running,
            "done" => JobPhase::Done,
            "failed" => JobPhase::Failed,
            "cancelled" => JobPhase::Cancelled,
            _ => return None,
        })
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobPhase::Done | JobPhase::Failed | JobPhase::Cancelled
        )
    }
}

/// The `tasks` table of job and task state objects. Times are nanoseconds
/// since the Unix epoch; `ready_ns` is when the last constraint was satisfied.
pub const TASKS_TABLE_SQL: &str = "CREATE TABLE IF NOT EXISTS tasks (
    idx INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    state TEXT NOT NULL,
    node TEXT,
    xstream INTEGER,
    attempt INTEGER NOT NULL DEFAULT 0,
    ready_ns INTEGER,
    start_ns INTEGER,
    end_ns INTEGER,
    exit_code INTEGER,
    error TEXT
)";

/// One row of the `tasks` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRow {
    pub idx: u32,
    pub id: String,
    pub state: TaskPhase,
    pub node: Option<String>,
    pub xstream: Option<u32>,
    pub attempt: u32,
    pub ready_ns: Option<u64>,
    pub start_ns: Option<u64>,
    pub end_ns: Option<u64>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
}

/// A task handed to a resource (one execution stream of a node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskGrant {
    #[serde(with = "job_hex")]
    pub job: u128,
    pub idx: u32,
    /// The task's id: the dkey of its record.
    pub id: String,
    pub attempt: u32,
    /// The execution stream of the node that runs it.
    pub xstream: u32,
    pub ready_ns: u64,
    /// Log address the task record claims; checked with the key.
    pub addr: u64,
    /// The task record (`record.rs` layout), value = JSON [`TaskSpec`].
    #[serde(with = "hex_bytes")]
    pub record: Vec<u8>,
    /// Standard input: the outputs of the task's `inputs` (jobs without
    /// an engine store; with one, the worker reads them from `inputs`).
    #[serde(with = "hex_bytes", default, skip_serializing_if = "Vec::is_empty")]
    pub stdin: Vec<u8>,
    /// Ids of the tasks whose stdout records, in this order, are this
    /// task's standard input (jobs with an engine store).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
}

/// What a resource reports when it has run a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskResult {
    #[serde(with = "job_hex")]
    pub job: u128,
    pub idx: u32,
    pub attempt: u32,
    pub xstream: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub exit_code: i32,
    /// Why the task failed, if it did.
    pub error: Option<String>,
    #[serde(with = "hex_bytes", default, skip_serializing_if = "Vec::is_empty")]
    pub stdout: Vec<u8>,
    #[serde(with = "hex_bytes", default, skip_serializing_if = "Vec::is_empty")]
    pub stderr: Vec<u8>,
}

/// Format of a submitted job file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecFormat {
    Toml,
    Json,
}

/// A job's gathered state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStatus {
    #[serde(with = "job_hex")]
    pub job: u128,
    pub name: String,
    pub state: JobPhase,
    pub cause: Option<String>,
    pub tasks: Vec<TaskRow>,
    /// (before, after) task indices.
    pub edges: Vec<(u32, u32)>,
    /// Nodes that answered the status query.
    pub answered: Vec<String>,
    /// URL of the engine holding the job's output records
    /// ([`output_key`]), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// The coordinator slot that split the job into tasks
    /// (`engine/coordinator-N`), once one was granted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator: Option<String>,
}

/// One line of `ferrite job list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSummary {
    #[serde(with = "job_hex")]
    pub job: u128,
    pub name: String,
    pub state: JobPhase,
    pub tasks: u32,
    pub done: u32,
}

/// Messages from a worker or a CLI to the job service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToEngine {
    /// A worker offers `xstreams` execution streams as resources.
    Offer {
        node: String,
        xstreams: u32,
    },
    /// A worker ran these tasks.
    Finished {
        results: Vec<TaskResult>,
    },
    /// A worker's answer to [`ToPeer::StatusQuery`]: rows of its task state object.
    StatusRows {
        query: u64,
        #[serde(with = "job_hex")]
        job: u128,
        rows: Vec<TaskRow>,
    },
    Submit {
        text: String,
        format: SpecFormat,
        /// The job id the submitter chose, when it already stored the task
        /// records under `task_key(job, task id)` in the engine at `store`.
        #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_job_hex")]
        job: Option<u128>,
        /// URL of the engine holding the task records (value = JSON
        /// [`TaskSpec`]); workers fetch them from there by key.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        store: Option<String>,
    },
    /// Asks for a job's state; `watch` keeps sending it as it changes until
    /// the job ends.
    Status {
        #[serde(with = "job_hex")]
        job: u128,
        watch: bool,
    },
    List,
    /// Answered with [`ToPeer::Ended`] when the job ends.
    Wait {
        #[serde(with = "job_hex")]
        job: u128,
    },
    /// Answered with [`ToPeer::Resources`] once at least `nodes` nodes
    /// (workers, and the engine itself when it has task slots) have
    /// offered their execution streams.
    WaitResources {
        nodes: u32,
    },
    Cancel {
        #[serde(with = "job_hex")]
        job: u128,
    },
}

/// Messages from the job service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToPeer {
    /// Answer to [`ToEngine::Offer`].
    Welcome {
        node: String,
    },
    /// Run these tasks. With `store`, their `record`s are empty: fetch each
    /// from that engine under `task_key(job, id)`.
    Grant {
        tasks: Vec<TaskGrant>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        store: Option<String>,
    },
    /// Stop running tasks of this job; drop their results.
    Revoke {
        #[serde(with = "job_hex")]
        job: u128,
    },
    /// Send your task state object rows of this job.
    StatusQuery {
        query: u64,
        #[serde(with = "job_hex")]
        job: u128,
    },
    Submitted {
        #[serde(with = "job_hex")]
        job: u128,
    },
    Status {
        status: JobStatus,
    },
    Jobs {
        jobs: Vec<JobSummary>,
    },
    /// Answer to [`ToEngine::Wait`].
    Ended {
        #[serde(with = "job_hex")]
        job: u128,
        state: JobPhase,
        cause: Option<String>,
    },
    /// Worker nodes and their execution streams.
    Resources {
        nodes: Vec<(String, u32)>,
    },
    Cancelled {
        #[serde(with = "job_hex")]
        job: u128,
    },
    Error {
        message: String,
    },
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("frame i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {0} bytes exceeds the limit")]
    TooLong(usize),
    #[error("frame does not decode: {0}")]
    Decode(#[from] serde_json::Error),
}

/// Writes one `[u32 LE length][JSON]` frame (not flushed).
pub fn write_frame<W: Write, T: Serialize>(out: &mut W, msg: &T) -> Result<(), FrameError> {
    let body = serde_json::to_vec(msg)?;
    if body.len() > FRAME_MAX_BYTES {
        return Err(FrameError::TooLong(body.len()));
    }
    out.write_all(&(body.len() as u32).to_le_bytes())?;
    out.write_all(&body)?;
    Ok(())
}

/// Reads one frame; `Ok(None)` at a clean end of stream.
pub fn read_frame<R: Read, T: for<'de> Deserialize<'de>>(
    input: &mut R,
) -> Result<Option<T>, FrameError> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > FRAME_MAX_BYTES {
        return Err(FrameError::TooLong(len));
    }
    let mut body = vec![0u8; len];
    input.read_exact(&mut body)?;
    Ok(Some(serde_json::from_slice(&body)?))
}

/// Job ids as 32 hex digits in JSON (serde_json's tagged enums cannot
/// carry u128 numbers).
mod job_hex {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(job: &u128, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{job:032x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u128, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        u128::from_str_radix(&text, 16).map_err(serde::de::Error::custom)
    }
}

/// Optional job ids as hex strings.
mod opt_job_hex {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(job: &Option<u128>, s: S) -> Result<S::Ok, S::Error> {
        match job {
            Some(j) => s.serialize_str(&format!("{j:032x}")),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u128>, D::Error> {
        let text = <Option<std::borrow::Cow<'de, str>>>::deserialize(d)?;
        text.map(|t| u128::from_str_radix(&t, 16).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Bytes as a lowercase hex string in JSON.
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    const DIGITS: &[u8; 16] = b"0123456789abcdef";

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        let mut out = String::with_capacity(bytes.len() * 2);
        for b in bytes {
            out.push(DIGITS[usize::from(b >> 4)] as char);
            out.push(DIGITS[usize::from(b & 15)] as char);
        }
        s.serialize_str(&out)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let text = text.as_bytes();
        if text.len() % 2 != 0 {
            return Err(serde::de::Error::custom("odd hex length"));
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(serde::de::Error::custom("bad hex digit")),
        };
        text.chunks_exact(2)
            .map(|p| Ok((nibble(p[0])? << 4) | nibble(p[1])?))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bytes_survive() {
        let msg = ToPeer::Grant {
            tasks: vec![TaskGrant {
                job: u128::MAX - 3,
                idx: 9,
                id: "t9".into(),
                attempt: 2,
                xstream: 1,
                ready_ns: 77,
                addr: 4096,
                record: vec![0, 1, 0xfe, 0xff, 0x7a],
                stdin: b"in".to_vec(),
                inputs: vec!["t1".into()],
            }],
            store: Some("unix:///x".into()),
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &msg).unwrap();
        write_frame(&mut buf, &ToEngine::List).unwrap();
        let mut r = &buf[..];
        let back: ToPeer = read_frame(&mut r).unwrap().unwrap();
        assert_eq!(back, msg);
        let list: ToEngine = read_frame(&mut r).unwrap().unwrap();
        assert_eq!(list, ToEngine::List);
        assert!(read_frame::<_, ToEngine>(&mut r).unwrap().is_none());
    }

    #[test]
    fn oversized_and_bad_hex_frames_are_refused() {
        let mut buf = ((FRAME_MAX_BYTES + 1) as u32).to_le_bytes().to_vec();
        buf.extend_from_slice(b"{}");
        assert!(matches!(
            read_frame::<_, ToEngine>(&mut &buf[..]),
            Err(FrameError::TooLong(_))
        ));
        let body = br#"{"type":"finished","results":[{"job":"1","idx":0,"attempt":0,"xstream":0,"start_ns":1,"end_ns":2,"exit_code":0,"error":null,"stdout":"0g"}]}"#;
        let mut buf = (body.len() as u32).to_le_bytes().to_vec();
        buf.extend_from_slice(body);
        assert!(matches!(
            read_frame::<_, ToEngine>(&mut &buf[..]),
            Err(FrameError::Decode(_))
        ));
    }

    #[test]
    fn step_kinds_parse_and_unknown_fields_are_refused() {
        let t: TaskSpec = serde_json::from_str(
            r#"{"id":"x","steps":[{"kind":"exec","cmd":"echo","args":["a"],"env":{"K":"V"}},{"kind":"scrub","container":3}]}"#,
        )
        .unwrap();
        assert_eq!(t.steps.len(), 2);
        assert!(matches!(&t.steps[1], Step::Scrub { container: 3 }));
        let bad = serde_json::from_str::<TaskSpec>(r#"{"id":"x","steps":[],"aftr":["y"]}"#);
        assert!(bad.is_err());
        for p in [TaskPhase::Pending, TaskPhase::Done, TaskPhase::Cancelled] {
            assert_eq!(TaskPhase::parse(p.as_str()), Some(p));
        }
        assert_eq!(JobPhase::parse("failed"), Some(JobPhase::Failed));
    }
}
