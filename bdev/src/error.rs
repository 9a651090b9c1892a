//! Errors of the bdev layer. I/O errors carry the operation, the device, the
//! offset and the source.

pub type Result<T> = std::result::Result<T, BdevError>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BdevError {
    #[error("bad bdev spec {spec:?}: {reason}")]
    BadSpec { spec: String, reason: String },
    #[error(
        "{device}: {op} at offset {offset} len {len} is not aligned to the block size {block_size}"
    )]
    Misaligned {
        device: String,
        op: &'static str,
        offset: u64,
        len: u64,
        block_size: u32,
    },
    #[error(
        "{device}: {op} at offset {offset} len {len} is outside the device ({size_bytes} bytes)"
    )]
    OutOfRange {
        device: String,
        op: &'static str,
        offset: u64,
        len: u64,
        size_bytes: u64,
    },
    #[error("{device}: buffer at {addr:#x} len {len} is not aligned to {align}")]
    BufferMisaligned {
        device: String,
        addr: usize,
        len: usize,
        align: usize,
    },
    #[error("{device}: {op} at offset {offset}: {source}")]
    Io {
        device: String,
        op: &'static str,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("{device}: {op} is not supported by this device")]
    Unsupported { device: String, op: &'static str },
    #[error("{device}: {reason}")]
    Other { device: String, reason: String },
}
