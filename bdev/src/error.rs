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
    /// The file system under a file device has no room for the write
    /// (`ENOSPC`, or a write cut short): nothing past what completed
    /// reached the device, and it may succeed once space returns.
    #[error("{device}: {op} at offset {offset}: no space left on device")]
    NoSpace {
        device: String,
        op: &'static str,
        offset: u64,
    },
    #[error("{device}: {op} is not supported by this device")]
    Unsupported { device: String, op: &'static str },
    #[error("{device}: {reason}")]
    Other { device: String, reason: String },
}

impl BdevError {
    /// The error of a failed `op` at `offset` on `device`: [`BdevError::NoSpace`]
    /// for `ENOSPC`, else [`BdevError::Io`].
    pub fn io(device: &str, op: &'static str, offset: u64, source: std::io::Error) -> Self {
        if source.raw_os_error() == Some(libc::ENOSPC) {
            return Self::NoSpace {
                device: device.to_string(),
                op,
                offset,
            };
        }
        Self::Io {
            device: device.to_string(),
            op,
            offset,
            source,
        }
    }

    /// Is this a write refused for lack of space ([`BdevError::NoSpace`])?
    pub fn is_no_space(&self) -> bool {
        matches!(self, Self::NoSpace { .. })
    }
}
