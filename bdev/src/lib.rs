//! Block devices for the record store, shaped like SPDK's bdev layer: a
//! device ([`Bdev`]), a per-xstream [`Channel`] that owns its queue, and
//! submit/complete as futures.
//!
//! Backends, opened from a spec string by [`open`]:
//!
//! | spec | module | what |
//! |---|---|---|
//! | `malloc:1G` | [`malloc`] | RAM, for tests and emulation |
//! | `uring:/path[?size=64G&direct=1&sqpoll=0&qd=128&fixed=1&buf=64K&park_us=50]` | [`uring`] | file or block device through io_uring, O_DIRECT, one ring per channel |
//! | `pmem:/path[?size=1G&populate=1]` | [`pmem`] | memory-mapped file: MAP_SYNC + cache-line flushes on DAX, msync elsewhere; zero-copy [`pmem::PmemBdev::slice`] |
//! | `spdk:<bdev>?config=<json>` | `spdk` (feature `spdk`) | SPDK bdev through FFI, untested (see `SPDK.md`) |
//!
//! Wrappers for fault injection stack on any of them: [`wrap::ErrorBdev`],
//! [`wrap::DelayBdev`], [`wrap::CrashBdev`].
//!
//! ```
//! use ferrite_bdev::{open, IoBuf};
//!
//! glommio::LocalExecutorBuilder::default()
//!     .spawn(|| async move {
//!         let bdev = open("malloc:1M").unwrap();
//!         let ch = bdev.channel().unwrap();
//!         let mut buf = ch.alloc(4096).unwrap();
//!         buf.as_mut_slice().fill(7);
//!         let buf = ch.write(0, buf).await.unwrap();
//!         ch.flush().await.unwrap();
//!         let back = ch.read(0, ch.alloc(4096).unwrap()).await.unwrap();
//!         assert_eq!(back.as_slice(), buf.as_slice());
//!     })
//!     .unwrap()
//!     .join()
//!     .unwrap();
//! ```

pub mod buf;
pub mod error;
pub mod malloc;
mod mem;
pub mod pmem;
#[cfg(feature = "spdk")]
pub mod spdk;
pub mod spec;
pub mod spec_toml;
pub mod uring;
pub mod wrap;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use buf::{BufPool, IoBuf};
pub use error::{BdevError, Result};
pub use spec::{open, BdevSpec};
pub use spec_toml::open_toml;

/// The future every channel operation returns; completes when the device does.
pub type IoFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + 'a>>;

/// Kinds of I/O a device may support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoType {
    Read,
    Write,
    Flush,
    WriteZeroes,
    Unmap,
}

/// A block device. Shared by all xstreams (`Send + Sync`); each xstream
/// talks to it through its own [`Channel`].
pub trait Bdev: Send + Sync + 'static {
    /// Name for errors and logs (the spec it was opened with).
    fn name(&self) -> &str;
    /// Bytes per block; offsets and lengths are multiples of it.
    fn block_size(&self) -> u32;
    fn block_count(&self) -> u64;
    fn size_bytes(&self) -> u64 {
        u64::from(self.block_size()) * self.block_count()
    }
    /// I/O should not cross multiples of this many blocks (0 = no boundary).
    fn optimal_io_boundary_blocks(&self) -> u32 {
        0
    }
    fn io_type_supported(&self, io_type: IoType) -> bool;
    /// A channel for the calling xstream. Channels are `!Send`: create one
    /// on each xstream that does I/O.
    fn channel(&self) -> Result<Box<dyn Channel>>;
    /// The memory-mapped device behind this one, for zero-copy access
    /// ([`pmem::PmemBdev::slice`]); `None` for every other backend.
    fn as_pmem(&self) -> Option<&pmem::PmemBdev> {
        None
    }
    /// A new read-only descriptor of the regular file that holds this
    /// device byte for byte (device offset = file offset), for another
    /// process to map `MAP_SHARED` and read what completed writes put there.
    /// `None` when the device is not such a file (malloc, block devices,
    /// SPDK, wrappers). The file never shrinks while the device is open.
    fn read_only_file(&self) -> Option<std::io::Result<std::fs::File>> {
        None
    }
}

/// Opens the file behind `fd` again, read-only (through `/proc/self/fd`, so
/// that it works when the file was renamed or unlinked since).
pub(crate) fn reopen_read_only(fd: &impl std::os::fd::AsRawFd) -> std::io::Result<std::fs::File> {
    std::fs::File::open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Shared handle to an open device.
pub type BdevRef = Arc<dyn Bdev>;

/// A per-xstream queue to a device. Offsets and lengths must be multiples of
/// the block size and inside the device; buffers come from [`Channel::alloc`]
/// (DMA-aligned). Every operation errs with a clear [`BdevError`] on bad
/// arguments and never panics. At most [`Channel::queue_depth`] operations
/// are in flight; further submissions wait (back-pressure).
///
/// Contracts: a completed `write` is readable by any channel; it is durable
/// only after a later `flush` completes (a `write_durable`, when it
/// completes). New space and unmapped ranges (where
/// `Unmap` is supported) read as zero.
/// [`Channel::write_durable`] done as a `write`, then a `flush`.
pub fn write_then_flush<C: Channel + ?Sized>(
    ch: &C,
    offset: u64,
    buf: IoBuf,
) -> IoFuture<'_, IoBuf> {
    Box::pin(async move {
        let buf = ch.write(offset, buf).await?;
        ch.flush().await?;
        Ok(buf)
    })
}

/// [`Channel::writev_durable`] done as a `writev`, then a `flush`.
pub fn writev_then_flush<C: Channel + ?Sized>(
    ch: &C,
    offset: u64,
    bufs: Vec<IoBuf>,
) -> IoFuture<'_, Vec<IoBuf>> {
    Box::pin(async move {
        let bufs = ch.writev(offset, bufs).await?;
        ch.flush().await?;
        Ok(bufs)
    })
}

pub trait Channel {
    fn block_size(&self) -> u32;
    /// A DMA-aligned buffer of `len` bytes (a multiple of the block size).
    fn alloc(&self, len: usize) -> Result<IoBuf>;
    fn read(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf>;
    fn write(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf>;
    /// Reads consecutive buffers starting at `offset`.
    fn readv(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>>;
    /// Writes consecutive buffers starting at `offset`.
    fn writev(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>>;
    /// Makes every completed write durable.
    fn flush(&self) -> IoFuture<'_, ()>;
    /// A write that is durable when it completes, with every write
    /// completed before it: `write`, then `flush`. A device that can carry
    /// the flush with the write (io_uring's `RWF_DSYNC` on an O_DIRECT
    /// file) does so, in one operation: the flush then starts in the kernel
    /// as the write ends, with no round trip through the xstream.
    fn write_durable(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        write_then_flush(self, offset, buf)
    }
    /// [`writev`](Self::writev) that is durable when it completes, as
    /// [`write_durable`](Self::write_durable) is for one buffer.
    fn writev_durable(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        writev_then_flush(self, offset, bufs)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> IoFuture<'_, ()>;
    fn unmap(&self, offset: u64, len: u64) -> IoFuture<'_, ()>;
    /// Makes `[offset, offset + len)` allocated, its content unchanged:
    /// where the device is a sparse file, the holes in the range are written
    /// with zeros (which they read as already) and the bytes written are
    /// returned. The first write into a hole costs the file system an
    /// allocation (and, with O_DIRECT, an extent conversion when the write
    /// completes), and the flush after it a journal commit; filling a range
    /// before the log reaches it takes that cost off the write path. Nothing
    /// else may write the range meanwhile. The default, for devices without
    /// holes (memory, block devices, SPDK), does nothing.
    fn fill_holes(&self, offset: u64, len: u64) -> IoFuture<'_, u64> {
        let _ = (offset, len);
        Box::pin(async { Ok(0) })
    }
    /// Operations submitted and not yet completed.
    fn in_flight(&self) -> usize;
    fn queue_depth(&self) -> usize;
}

/// Checks a block-aligned range against a device; shared by the backends.
pub fn check_range(
    name: &str,
    op: &'static str,
    block_size: u32,
    size_bytes: u64,
    offset: u64,
    len: u64,
) -> Result<()> {
    let bs = u64::from(block_size);
    if offset % bs != 0 || len % bs != 0 {
        return Err(BdevError::Misaligned {
            device: name.to_string(),
            op,
            offset,
            len,
            block_size,
        });
    }
    match offset.checked_add(len) {
        Some(end) if end <= size_bytes => Ok(()),
        _ => Err(BdevError::OutOfRange {
            device: name.to_string(),
            op,
            offset,
            len,
            size_bytes,
        }),
    }
}
