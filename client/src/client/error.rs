//! The one error type of the client library.

use ferrite_proto::FormatError;

use crate::client::url::EngineUrl;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a client call can fail with. Errors that mean "the engine is
/// gone" ([`Error::Disconnected`], [`Error::Connect`]) say which engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An engine URL that does not parse.
    #[error("bad engine URL {url:?}: {reason}")]
    Url { url: String, reason: &'static str },

    /// Could not reach the engine at all.
    #[error("cannot connect to engine at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: std::io::Error,
    },

    /// The connection to the engine broke (engine killed, restarted, network).
    #[error("connection to engine at {url} lost during {op}: {detail}")]
    Disconnected {
        url: String,
        op: &'static str,
        detail: String,
    },

    /// No usable token for a TCP engine, or an engine that does not prove
    /// it holds the token (or offers no authentication at all).
    #[error("authentication: {0}")]
    Unauthenticated(String),

    /// The engine answered something this client does not understand.
    #[error("protocol error from engine at {url}: {detail}")]
    Protocol { url: String, detail: String },

    /// The engine refused the request.
    #[error("engine refused {op}: {message} (status {status})")]
    Remote {
        op: &'static str,
        status: u16,
        message: String,
    },

    /// The engine has no room for the update (its device's file system is
    /// full, or its log or index is): it was not applied. Reads still
    /// work, and the same update succeeds once space returns.
    #[error("{op}: {message}")]
    NoSpace { op: &'static str, message: String },

    /// A conditional update found another version.
    #[error("conditional update failed: expected version {expected}, found {found:?}")]
    VersionMismatch { expected: u64, found: Option<u64> },

    /// A one-sided read outside what a region descriptor allows, or of a
    /// region this client cannot reach.
    #[error("region {region_id}: {reason}")]
    Region { region_id: u32, reason: String },

    /// A system call on a fabric endpoint failed.
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// Bytes that did not decode (from a region or a frame).
    #[error(transparent)]
    Format(#[from] FormatError),

    /// A caller-supplied argument is not acceptable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// No reply within the client's request timeout.
    #[error("engine at {url} did not answer {op} within {timeout_ms} ms")]
    Timeout {
        url: String,
        op: &'static str,
        timeout_ms: u64,
    },

    /// The embedded engine could not start.
    #[error("embedded engine: {0}")]
    Embedded(String),
}

impl Error {
    pub(crate) fn url(url: &str, reason: &'static str) -> Self {
        Self::Url {
            url: url.to_string(),
            reason,
        }
    }

    pub(crate) fn connect(url: &EngineUrl, source: std::io::Error) -> Self {
        Self::Connect {
            url: url.to_string(),
            source,
        }
    }

    pub(crate) fn io(op: &'static str, source: std::io::Error) -> Self {
        Self::Io { op, source }
    }

    /// True when the engine is unreachable or went away mid-request.
    pub fn is_disconnect(&self) -> bool {
        matches!(self, Self::Disconnected { .. } | Self::Connect { .. })
    }
}

impl Error {
    /// The error of a request `op` the engine refused with `code`:
    /// [`Error::NoSpace`] for `NoSpace`, else [`Error::Remote`].
    pub fn refused(op: &'static str, code: ferrite_proto::rpc::ErrorCode, message: String) -> Self {
        match code {
            ferrite_proto::rpc::ErrorCode::NoSpace => Error::NoSpace { op, message },
            _ => Error::Remote {
                op,
                status: code as u16,
                message,
            },
        }
    }
}
