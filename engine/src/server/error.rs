//! Errors of starting and running the engine server.

use std::path::PathBuf;

/// Why the engine could not start, or a server operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The configuration is invalid (names the key and the problem).
    #[error("config: {0}")]
    Config(String),
    /// The execution streams did not start or stop cleanly.
    #[error("xstreams: {0}")]
    Xstream(#[from] ferrite_xstream::Error),
    /// A target's store failed to open, flush or checkpoint.
    #[error("target {target}: {source}")]
    Store {
        target: usize,
        #[source]
        source: crate::store::StoreError,
    },
    /// A listener could not be set up.
    #[error("listen on {address}: {source}")]
    Listen {
        address: String,
        #[source]
        source: std::io::Error,
    },
    /// A file or directory the engine needs could not be prepared.
    #[error("{op} {}: {source}", path.display())]
    Path {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Another engine holds the data dir's lock file.
    #[error("data dir {} is in use by another engine{}", dir.display(),
        holder_pid.map_or(String::new(), |p| format!(" (pid {p})")))]
    DataDirInUse {
        dir: PathBuf,
        holder_pid: Option<u32>,
    },
    /// A region could not be registered with a provider.
    #[error("fabric: {0}")]
    Fabric(String),
    /// Bytes from a peer did not decode (e.g. the verbs side channel's
    /// queue pair info); names the layout and the field.
    #[error("{0}")]
    Format(#[from] ferrite_proto::FormatError),
}

pub type Result<T> = std::result::Result<T, ServerError>;
