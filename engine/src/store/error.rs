//! Errors of the record store.

use ferrite_bdev::BdevError;
use ferrite_proto::FormatError;

pub type Result<T> = std::result::Result<T, StoreError>;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A device operation failed. Writes and flushes also poison the store.
    #[error("store on {device}: {op} failed: {source}")]
    Device {
        device: String,
        op: &'static str,
        #[source]
        source: BdevError,
    },
    /// The file system under the device had no room for a group commit:
    /// its updates were not applied (nothing of them is published or
    /// replayed) and the store goes on serving; later writes succeed once
    /// space returns.
    #[error(
        "no space left on {device}: {op} at offset {offset} failed; the update was not applied"
    )]
    NoSpace {
        device: String,
        op: &'static str,
        offset: u64,
    },
    /// An earlier write or flush failed; the store refuses writes until it is
    /// reopened (what reached the media is unknown).
    #[error("store on {device} is poisoned by an earlier failure ({cause}); reopen it")]
    Poisoned { device: String, cause: String },
    /// A record read back from the device failed its checks (CRC, key, address).
    #[error("record at log address {addr} on {device} is corrupt: {source}")]
    Corrupt {
        device: String,
        addr: u64,
        #[source]
        source: FormatError,
    },
    /// Bad input from the caller (key or value too long, bad extent ...).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The key holds the other kind of value (single value vs byte array).
    #[error("key holds a {holds}, not a {wanted}")]
    WrongKind {
        holds: &'static str,
        wanted: &'static str,
    },
    /// No free bucket slot for a new key (grow `bucket_count`).
    #[error("bucket index is full ({keys} keys); configure more buckets")]
    IndexFull { keys: usize },
    /// No space: the update would take the live data past the store's
    /// ceiling (`space.rs`), or the log has no free segment even after
    /// cleaning. Nothing of it was applied; deletes are still admitted.
    #[error(
        "no space in the store on {device}: {live} bytes live, the ceiling is {ceiling} \
         of {capacity} bytes of log; delete data or give the target a bigger device"
    )]
    LogFull {
        device: String,
        live: u64,
        ceiling: u64,
        capacity: u64,
    },
    /// The checkpoint of the index does not fit its area on the device (a
    /// new key whose entry would not fit is refused up front, `space.rs`).
    #[error(
        "no space for the index: its checkpoint needs {need} bytes, the area holds {have}; \
         delete keys or configure a larger checkpoint area"
    )]
    CheckpointTooLarge { need: u64, have: u64 },
    /// Device geometry or on-device metadata is not what this store can use.
    #[error("store on {device}: {reason}")]
    Layout { device: String, reason: String },
    /// A region could not be created.
    #[error("region {name}: {source}")]
    Region {
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
}
