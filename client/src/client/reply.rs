//! Turning replies into typed results.

use ferrite_proto::rpc::{Found, Reply, Verified};

use crate::client::error::{Error, Result};

pub(crate) fn unexpected(op: &'static str, other: Reply) -> Error {
    match other {
        Reply::Error { code, message } => Error::refused(op, code, message),
        other => Error::Protocol {
            url: String::new(),
            detail: format!("{op} answered with {other:?}"),
        },
    }
}

pub(crate) fn version(op: &'static str, r: Reply) -> Result<u64> {
    match r {
        Reply::Version(v) => Ok(v),
        other => Err(unexpected(op, other)),
    }
}

pub(crate) fn value(op: &'static str, r: Reply) -> Result<Option<Found>> {
    match r {
        Reply::Value(v) => Ok(v),
        other => Err(unexpected(op, other)),
    }
}

pub(crate) fn keys(op: &'static str, r: Reply) -> Result<(Vec<Vec<u8>>, bool)> {
    match r {
        Reply::Keys { keys, more } => Ok((keys, more)),
        other => Err(unexpected(op, other)),
    }
}

/// A ListObjects reply: object ids and whether more follow.
pub(crate) fn objects(r: Reply) -> Result<(Vec<u128>, bool)> {
    match r {
        Reply::Objects { objects, more } => Ok((objects, more)),
        other => Err(unexpected("list objects", other)),
    }
}

/// A Verify reply, as a batch item or alone.
pub(crate) fn verified(r: Reply) -> Result<Verified> {
    match r {
        Reply::Verified(v) => Ok(v),
        other => Err(unexpected("verify", other)),
    }
}

/// A conditional update's reply: the new version, or `VersionMismatch`.
pub(crate) fn cond(expected: u64, r: Reply) -> Result<u64> {
    match r {
        Reply::Cond {
            applied: true,
            version,
        } => Ok(version),
        Reply::Cond {
            applied: false,
            version,
        } => Err(Error::VersionMismatch {
            expected,
            found: (version != 0).then_some(version),
        }),
        other => Err(unexpected("conditional put", other)),
    }
}

pub(crate) fn batch(r: Reply) -> Result<Vec<Reply>> {
    match r {
        Reply::Batch(v) => Ok(v),
        other => Err(unexpected("batch", other)),
    }
}

pub(crate) fn synced(r: Reply) -> Result<()> {
    match r {
        Reply::Synced => Ok(()),
        other => Err(unexpected("sync", other)),
    }
}

pub(crate) fn stat(r: Reply) -> Result<Vec<ferrite_proto::rpc::TargetStat>> {
    match r {
        Reply::Stat(v) => Ok(v),
        other => Err(unexpected("stat", other)),
    }
}
