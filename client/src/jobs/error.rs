//! Errors of the job client and the worker.

use ferrite_proto::rpc_jobs::FrameError;

/// What went wrong talking to the job service or running its tasks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobsError {
    #[error("job service at {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("job service i/o ({what}): {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("job service: {0}")]
    Service(String),
    #[error("job service closed the connection")]
    Closed,
    #[error("unexpected answer from the job service: {0}")]
    Unexpected(String),
    #[error(transparent)]
    State(#[from] ferrite_proto::tasks::state::TaskStateError),
    #[error("engine holding the task records: {0}")]
    Store(String),
    #[error(transparent)]
    Client(#[from] crate::client::Error),
    #[error("bad job id {0:?}: expected up to 32 hex digits")]
    BadJobId(String),
    #[error("job service at {addr}: authentication: {source}")]
    Auth {
        addr: String,
        #[source]
        source: ferrite_proto::rpc_jobs::auth::AuthError,
    },
}

impl JobsError {
    pub(crate) fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> JobsError {
        move |source| JobsError::Io { what, source }
    }
}
