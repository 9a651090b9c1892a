//! Errors of the job service.

use ferrite_proto::rpc_jobs::FrameError;

/// Why a job file was refused: every variant names the offending tasks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    #[error("job file does not parse as {format}: {message}")]
    Syntax {
        format: &'static str,
        message: String,
    },
    #[error("job {0:?} has no tasks")]
    NoTasks(String),
    #[error("duplicate task ids: {}", .0.join(", "))]
    DuplicateIds(Vec<String>),
    #[error("unknown task references: {}", fmt_refs(.0))]
    UnknownReferences(Vec<(String, String)>),
    #[error("constraints form a cycle: {}", .0.join(" -> "))]
    Cycle(Vec<String>),
    #[error("tasks without steps: {}", .0.join(", "))]
    NoSteps(Vec<String>),
    #[error("task {0:?}: retry max_attempts must be at least 1")]
    BadRetry(String),
    #[error("task id {0:?} is empty or longer than 1024 bytes")]
    BadId(String),
    #[error("task {0:?}: an exec step's timeout_s must be at least 1")]
    BadTimeout(String),
}

fn fmt_refs(refs: &[(String, String)]) -> String {
    refs.iter()
        .map(|(task, missing)| format!("{task:?} -> {missing:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Errors of the job service.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("job state file {path}: {source}")]
    State {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("job state file {path}: {what}")]
    Corrupt { path: String, what: String },
    #[error("job service i/o ({what}): {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("task record: {0}")]
    Record(#[from] ferrite_proto::FormatError),
    #[error("no job {0:032x}")]
    NoSuchJob(u128),
    #[error("job id {0:032x} is taken")]
    JobIdTaken(u128),
    #[error("job service xstream: {0}")]
    Xstream(String),
    #[error(
        "job service: no token (set listen.token or listen.token_file; an empty token is refused)"
    )]
    NoToken,
    #[error(
        "job refused: task {0:?} has an exec step and this engine runs none ([jobs] exec = false)"
    )]
    ExecDisabled(String),
}

impl JobError {
    pub(crate) fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> JobError {
        move |source| JobError::Io { what, source }
    }

    pub(crate) fn xstream(e: ferrite_xstream::Error) -> JobError {
        JobError::Xstream(e.to_string())
    }
}
