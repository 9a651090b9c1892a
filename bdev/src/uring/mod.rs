//! `uring`: files and block devices through io_uring, with O_DIRECT.
//!
//! Shaped like SPDK's `bdev_uring`: one ring per channel (so per xstream),
//! polled by the xstream (see `ring.rs` for how without blocking it or
//! spinning when idle). Each channel allocates its buffer pool at start-up
//! and registers it with its ring (fixed buffers), and registers the file
//! (fixed file); when RLIMIT_MEMLOCK or the kernel refuses, it falls back to
//! plain buffers and descriptors. With `sqpoll=1` a kernel thread polls the
//! submission queue.
//!
//! Spec: `uring:/path[?size=64G&direct=1&sqpoll=0&qd=128&fixed=1&buf=64K&park_us=50&direct_from=]`.
//! `size=` creates the file or extends it; `direct=0` goes through the page
//! cache (needed on tmpfs, which refuses O_DIRECT); its writes of up to
//! 64 KiB are copied in by a `pwrite` on the calling xstream rather than
//! through the ring, which would hand each to an io-wq thread.
//! `direct_from=256K` (with `direct=0`): writes of at least that many bytes
//! go through a second, O_DIRECT descriptor of the same file, so bulk data
//! is not copied into the page cache while small writes still are. The
//! kernel keeps the two coherent (a direct write first writes back and then
//! drops the cached pages of its range), and reads stay buffered.
//!
//! ```
//! use ferrite_bdev::uring::{UringBdev, UringOptions};
//! use ferrite_bdev::Bdev;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let opts = UringOptions { size: Some(1 << 20), ..UringOptions::default() };
//! let dev = UringBdev::open("disk0", &dir.path().join("disk0"), &opts).unwrap();
//! assert_eq!(dev.size_bytes(), 1 << 20);
//! glommio::LocalExecutorBuilder::default()
//!     .spawn(move || async move {
//!         let ch = dev.channel().unwrap();
//!         let mut buf = ch.alloc(4096).unwrap();
//!         buf.as_mut_slice().fill(9);
//!         ch.write(8192, buf).await.unwrap();
//!         ch.flush().await.unwrap();
//!         let back = ch.read(8192, ch.alloc(4096).unwrap()).await.unwrap();
//!         assert!(back.as_slice().iter().all(|&b| b == 9));
//!     })
//!     .unwrap()
//!     .join()
//!     .unwrap();
//! ```

mod channel;
mod ring;
mod wakeup;

use crate::pmem::open_sized_file;
use crate::{Bdev, BdevError, Channel, IoType, Result};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

/// Block size used for regular files (safe for O_DIRECT on any file system).
pub const URING_FILE_BLOCK_SIZE: u32 = 4096;

/// How to open a `uring` device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UringOptions {
    /// Create the file, or extend it, to this many bytes.
    pub size: Option<u64>,
    /// Open with O_DIRECT (bypass the page cache).
    pub direct: bool,
    /// A kernel thread polls each ring's submission queue.
    pub sqpoll: bool,
    /// Operations in flight per channel (ring size and buffer slots).
    pub queue_depth: u32,
    /// Register the pool and the file with each ring when allowed.
    pub fixed: bool,
    /// Bytes per pool buffer; larger `alloc`s come from the heap.
    pub buf_size: usize,
    /// With `direct: false`, writes of at least this many bytes bypass the
    /// page cache through an O_DIRECT descriptor (module docs).
    pub direct_from: Option<usize>,
    /// Zero: the reaper only spins. Otherwise the longest one wait in the
    /// kernel for a completion (the xstream's other tasks run between
    /// waits); on an xstream, after a few waits that found nothing, the
    /// reaper sleeps without blocking it until the kernel signals
    /// completions (see `ring.rs`).
    pub park: std::time::Duration,
}

impl Default for UringOptions {
    fn default() -> Self {
        Self {
            size: None,
            direct: true,
            sqpoll: false,
            queue_depth: 128,
            fixed: true,
            buf_size: 64 << 10,
            direct_from: None,
            park: std::time::Duration::from_micros(50),
        }
    }
}

/// A file or block device driven by io_uring.
pub struct UringBdev {
    name: Arc<str>,
    file: Arc<std::fs::File>,
    /// `direct_from`: the same file opened with O_DIRECT.
    direct_file: Option<Arc<std::fs::File>>,
    block_size: u32,
    size_bytes: u64,
    block_device: bool,
    opts: UringOptions,
}

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

fn io_err(name: &str, op: &'static str, source: std::io::Error) -> BdevError {
    BdevError::Io {
        device: name.to_string(),
        op,
        offset: 0,
        source,
    }
}

fn block_device_geometry(name: &str, file: &std::fs::File) -> Result<(u32, u64)> {
    let mut size: u64 = 0;
    let mut logical: libc::c_int = 0;
    // SAFETY: both ioctls write one integer of the given type.
    let rc = unsafe {
        libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size)
            | libc::ioctl(file.as_raw_fd(), libc::BLKSSZGET as _, &mut logical)
    };
    if rc < 0 {
        return Err(io_err(
            name,
            "block device ioctl",
            std::io::Error::last_os_error(),
        ));
    }
    let block = (logical.max(1) as u32).max(URING_FILE_BLOCK_SIZE);
    Ok((block, size - size % u64::from(block)))
}

impl UringBdev {
    /// Opens a file or block device. Errors name the path and the reason:
    /// missing file without `size`, a size that is not a block multiple,
    /// O_DIRECT refused by the file system.
    pub fn open(name: &str, path: &Path, opts: &UringOptions) -> Result<Self> {
        let bad = |reason: String| BdevError::BadSpec {
            spec: name.to_string(),
            reason,
        };
        if opts.queue_depth == 0 || opts.queue_depth > 4096 {
            return Err(bad(format!("qd={} is not in 1..=4096", opts.queue_depth)));
        }
        let is_block = std::fs::metadata(path)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        let (file, block_size, size_bytes) = if is_block {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| io_err(name, "open", e))?;
            let (bs, size) = block_device_geometry(name, &file)?;
            (file, bs, size)
        } else {
            let (file, size) = open_sized_file(name, path, opts.size, URING_FILE_BLOCK_SIZE)?;
            (file, URING_FILE_BLOCK_SIZE, size)
        };
        drop(file);
        let open = |direct: bool| {
            let mut oo = std::fs::OpenOptions::new();
            oo.read(true).write(true);
            if direct {
                oo.custom_flags(libc::O_DIRECT);
            }
            oo.open(path).map_err(|e| match e.raw_os_error() {
                Some(libc::EINVAL) if direct => bad(format!(
                    "{}: the file system refuses O_DIRECT (tmpfs?); use direct=0 without \
                     direct_from, or another file system",
                    path.display()
                )),
                _ => io_err(name, "open", e),
            })
        };
        let file = open(opts.direct)?;
        let direct_file = match opts.direct_from {
            Some(from) if !opts.direct => {
                if from == 0 || from % block_size as usize != 0 {
                    return Err(bad(format!(
                        "direct_from={from} is not a positive multiple of the block size \
                         ({block_size})"
                    )));
                }
                Some(Arc::new(open(true)?))
            }
            _ => None,
        };
        Ok(Self {
            name: name.into(),
            file: Arc::new(file),
            direct_file,
            block_size,
            size_bytes,
            block_device: is_block,
            opts: opts.clone(),
        })
    }

    pub fn options(&self) -> &UringOptions {
        &self.opts
    }
}

impl Bdev for UringBdev {
    fn name(&self) -> &str {
        &self.name
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn block_count(&self) -> u64 {
        self.size_bytes / u64::from(self.block_size)
    }
    fn io_type_supported(&self, io_type: IoType) -> bool {
        // Unmap punches a hole: reads zero on files and on block devices
        // that support it; write_zeroes falls back to writing zeros.
        match io_type {
            IoType::Unmap => !self.block_device,
            _ => true,
        }
    }
    fn read_only_file(&self) -> Option<std::io::Result<std::fs::File>> {
        (!self.block_device).then(|| crate::reopen_read_only(&*self.file))
    }
    fn channel(&self) -> Result<Box<dyn Channel>> {
        Ok(Box::new(channel::UringChannel::new(
            Arc::clone(&self.name),
            Arc::clone(&self.file),
            self.direct_file.clone(),
            self.block_size,
            self.size_bytes,
            &self.opts,
        )?))
    }
}
