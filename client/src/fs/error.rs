//! Errors of the file namespace, each with the errno a POSIX caller expects.

use crate::client::Error as ClientError;

pub type FsResult<T> = std::result::Result<T, FsError>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    #[error("{0}: no such file or directory")]
    NotFound(String),
    #[error("{0}: file exists")]
    Exists(String),
    #[error("{0}: not a directory")]
    NotDir(String),
    #[error("{0}: is a directory")]
    IsDir(String),
    #[error("{0}: directory not empty")]
    NotEmpty(String),
    #[error("{0}: invalid argument: {1}")]
    Invalid(String, &'static str),
    #[error("{0}: name too long")]
    NameTooLong(String),
    #[error("{0}: stored entry is corrupt: {1}")]
    Corrupt(String, super::entry::EntryError),
    #[error("{what}: {source}")]
    Client {
        what: String,
        #[source]
        source: ClientError,
    },
}

impl FsError {
    /// The errno for this error (FUSE replies and POSIX-shaped callers).
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound(_) => libc::ENOENT,
            FsError::Exists(_) => libc::EEXIST,
            FsError::NotDir(_) => libc::ENOTDIR,
            FsError::IsDir(_) => libc::EISDIR,
            FsError::NotEmpty(_) => libc::ENOTEMPTY,
            FsError::Invalid(..) => libc::EINVAL,
            FsError::NameTooLong(_) => libc::ENAMETOOLONG,
            // The store is at its space ceiling (or its index is full).
            FsError::Client {
                source: ClientError::NoSpace { .. },
                ..
            } => libc::ENOSPC,
            FsError::Corrupt(..) | FsError::Client { .. } => libc::EIO,
        }
    }

    /// As a `std::io::Error` with the matching kind.
    pub fn into_io(self) -> std::io::Error {
        let errno = self.errno();
        let kind = std::io::Error::from_raw_os_error(errno).kind();
        std::io::Error::new(kind, self)
    }
}

/// Wraps a client error with what was being done.
pub(crate) fn client_err(what: impl Into<String>) -> impl FnOnce(ClientError) -> FsError {
    let what = what.into();
    move |source| FsError::Client { what, source }
}

/// A reply of the wrong kind to `op`: the engine's refusal, or a protocol
/// error naming what came back.
pub(crate) fn unexpected_reply(
    what: impl Into<String>,
    op: &'static str,
    url: String,
    reply: crate::client::Reply,
) -> FsError {
    let source = match reply {
        crate::client::Reply::Error { code, message } => ClientError::refused(op, code, message),
        other => ClientError::Protocol {
            url,
            detail: format!("{op} answered with {other:?}"),
        },
    };
    FsError::Client {
        what: what.into(),
        source,
    }
}
