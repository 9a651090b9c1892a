//! `pmem`: a file mapped into memory with memmap2.
//!
//! On a DAX file system the file is mapped with `MAP_SYNC`, so a store that
//! reaches the CPU caches is made durable by flushing its cache lines
//! (`clwb`, else `clflushopt`, else `clflush`) and a store fence: every
//! write is durable when it completes. Elsewhere (tmpfs, hugetlbfs, ext4) the
//! file is an ordinary shared mapping and [`Channel::flush`] runs `msync`
//! over the range written since the last flush, on the executor's blocking
//! thread (glommio's `spawn_blocking`): the xstream runs its other tasks
//! while the kernel writes the pages back.
//!
//! Besides the block interface the store can read and write the mapping in
//! place through [`PmemBdev::slice`] and [`PmemBdev::write_at`]; reach a
//! `PmemBdev` behind a [`crate::BdevRef`] with [`Bdev::as_pmem`].
//!
//! ```
//! use ferrite_bdev::pmem::PmemBdev;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("pmem0");
//! let dev = PmemBdev::open("pmem0", &path, Some(1 << 20), false).unwrap();
//! dev.write_at(100, b"record").unwrap();
//! dev.persist(100, 6).unwrap();
//! let s = dev.slice(100, 6).unwrap();
//! let mut back = [0u8; 6];
//! s.read_into(&mut back);
//! assert_eq!(&back, b"record");
//! ```

use crate::mem::{copy_in, copy_out, MemBacking, MemChannel};
use crate::{Bdev, BdevError, Channel, IoType, Result};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub const PMEM_BLOCK_SIZE: u32 = 4096;
const PMEM_QUEUE_DEPTH: usize = 128;
const CACHE_LINE: usize = 64;

/// How writes reach the media.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersistMode {
    /// DAX with `MAP_SYNC`: cache-line flush and fence after each write.
    CacheFlush,
    /// Page cache: `msync` on flush.
    Msync,
}

impl PersistMode {
    /// `map_sync` or `msync`, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            PersistMode::CacheFlush => "map_sync",
            PersistMode::Msync => "msync",
        }
    }
}

enum Mapping {
    /// `MAP_SYNC` mapping made by hand (memmap2 has no flag for it).
    Sync {
        base: *mut u8,
        len: usize,
    },
    Plain(memmap2::MmapRaw),
}

struct PmemMemory {
    name: Arc<str>,
    mapping: Mapping,
    /// Range written since the last msync: `dirty_lo..dirty_hi` (empty when
    /// lo ≥ hi). Unused in `CacheFlush` mode.
    dirty_lo: AtomicU64,
    dirty_hi: AtomicU64,
}

// SAFETY: the mapping is shared memory reached by raw copies; see mem.rs.
unsafe impl Send for PmemMemory {}
// SAFETY: as above.
unsafe impl Sync for PmemMemory {}

impl Drop for PmemMemory {
    fn drop(&mut self) {
        if let Mapping::Sync { base, len } = self.mapping {
            // SAFETY: mapped in map_sync with this base and length.
            unsafe { libc::munmap(base.cast(), len) };
        }
    }
}

impl PmemMemory {
    fn mode(&self) -> PersistMode {
        match self.mapping {
            Mapping::Sync { .. } => PersistMode::CacheFlush,
            Mapping::Plain(_) => PersistMode::Msync,
        }
    }
}

impl MemBacking for PmemMemory {
    fn base(&self) -> *mut u8 {
        match &self.mapping {
            Mapping::Sync { base, .. } => *base,
            Mapping::Plain(m) => m.as_mut_ptr(),
        }
    }
    fn len(&self) -> usize {
        match &self.mapping {
            Mapping::Sync { len, .. } => *len,
            Mapping::Plain(m) => m.len(),
        }
    }
    fn persist(&self, offset: usize, len: usize) -> Result<()> {
        match self.mapping {
            Mapping::Sync { base, .. } => {
                // SAFETY: the caller wrote this range, so it is mapped.
                unsafe { flush_cache_lines(base.add(offset), len) };
            }
            Mapping::Plain(_) => {
                self.dirty_lo.fetch_min(offset as u64, Ordering::AcqRel);
                self.dirty_hi
                    .fetch_max((offset + len) as u64, Ordering::AcqRel);
            }
        }
        Ok(())
    }
    fn flush_waits(&self) -> bool {
        self.mode() == PersistMode::Msync
    }
    fn flush(&self) -> Result<()> {
        let Mapping::Plain(map) = &self.mapping else {
            return Ok(());
        };
        let lo = self.dirty_lo.swap(u64::MAX, Ordering::AcqRel);
        let hi = self.dirty_hi.swap(0, Ordering::AcqRel);
        if lo >= hi {
            return Ok(());
        }
        map.flush_range(lo as usize, (hi - lo) as usize)
            .inspect_err(|_| {
                // Put the range back so a retry flushes it again.
                self.dirty_lo.fetch_min(lo, Ordering::AcqRel);
                self.dirty_hi.fetch_max(hi, Ordering::AcqRel);
            })
            .map_err(|e| BdevError::Io {
                device: self.name.to_string(),
                op: "msync",
                offset: lo,
                source: e,
            })
    }
}

/// (clwb, clflushopt) support, from CPUID leaf 7 (EBX bits 24 and 23).
#[cfg(target_arch = "x86_64")]
fn cache_flush_features() -> (bool, bool) {
    static FEATURES: std::sync::OnceLock<(bool, bool)> = std::sync::OnceLock::new();
    *FEATURES.get_or_init(|| {
        // SAFETY: CPUID is available on every x86_64 CPU; leaf 7 reads as
        // zeros where it is not implemented.
        #[allow(unused_unsafe)]
        let ebx = unsafe { std::arch::x86_64::__cpuid_count(7, 0) }.ebx;
        (ebx & (1 << 24) != 0, ebx & (1 << 23) != 0)
    })
}

/// Writes back the cache lines of `ptr..ptr+len` and fences.
///
/// # Safety
/// The range must be mapped.
unsafe fn flush_cache_lines(ptr: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let start = ptr as usize & !(CACHE_LINE - 1);
        let end = ptr as usize + len;
        let (clwb, clflushopt) = cache_flush_features();
        for line in (start..end).step_by(CACHE_LINE) {
            // SAFETY: the line lies in the mapped range (caller's contract);
            // these instructions only write back the line.
            unsafe {
                if clwb {
                    std::arch::asm!("clwb [{0}]", in(reg) line, options(nostack));
                } else if clflushopt {
                    std::arch::asm!("clflushopt [{0}]", in(reg) line, options(nostack));
                } else {
                    std::arch::x86_64::_mm_clflush(line as *const u8);
                }
            }
        }
        // SAFETY: a fence has no memory-safety requirement.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // Elsewhere use msync, which is correct (if slower) on DAX too.
        let page = 4096usize;
        let start = ptr as usize & !(page - 1);
        // SAFETY: the range is mapped (caller's contract).
        unsafe { libc::msync(start as *mut _, ptr as usize + len - start, libc::MS_SYNC) };
    }
}

/// A memory-mapped file device.
pub struct PmemBdev {
    name: Arc<str>,
    memory: Arc<PmemMemory>,
    /// The mapped file (for [`Bdev::read_only_file`]).
    file: Arc<std::fs::File>,
}

/// A read-only view of a range of the mapping, without copying.
#[derive(Debug, Clone, Copy)]
pub struct PmemSlice<'a> {
    ptr: *const u8,
    len: usize,
    _device: std::marker::PhantomData<&'a PmemBdev>,
}

impl PmemSlice<'_> {
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The bytes in place.
    ///
    /// # Safety
    /// Nobody may write this range (through a channel or
    /// [`PmemBdev::write_at`]) while the returned slice is alive; in the
    /// store, only the owning xstream writes its range.
    pub unsafe fn as_bytes(&self) -> &[u8] {
        // SAFETY: in range of a live mapping; no writer (caller's contract).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    /// Copies the bytes out (may see a concurrent write half done, like a
    /// one-sided read: check the record afterwards).
    pub fn read_into(&self, dst: &mut [u8]) {
        let n = dst.len().min(self.len);
        // SAFETY: ptr..ptr+n is in a live mapping; dst is distinct memory.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, dst.as_mut_ptr(), n) };
    }
}

fn open_error(name: &str, op: &'static str, e: std::io::Error) -> BdevError {
    BdevError::Io {
        device: name.to_string(),
        op,
        offset: 0,
        source: e,
    }
}

/// Opens (or with `size` creates/extends) `path`; its size must be a
/// positive multiple of [`PMEM_BLOCK_SIZE`].
pub(crate) fn open_sized_file(
    name: &str,
    path: &Path,
    size: Option<u64>,
    block_size: u32,
) -> Result<(std::fs::File, u64)> {
    let bad = |reason: String| BdevError::BadSpec {
        spec: name.to_string(),
        reason,
    };
    if let Some(s) = size {
        if s == 0 || s % u64::from(block_size) != 0 {
            return Err(bad(format!(
                "size {s} is not a positive multiple of the block size {block_size}"
            )));
        }
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(size.is_some())
        .truncate(false)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => bad(format!(
                "{} does not exist (add ?size= to create it)",
                path.display()
            )),
            _ => open_error(name, "open", e),
        })?;
    let meta = file.metadata().map_err(|e| open_error(name, "stat", e))?;
    let mut len = meta.len();
    if let Some(s) = size {
        if s > len {
            file.set_len(s).map_err(|e| open_error(name, "extend", e))?;
            len = s;
        }
    }
    if len == 0 || len % u64::from(block_size) != 0 {
        return Err(bad(format!(
            "{} is {len} bytes, not a positive multiple of the block size {block_size}",
            path.display()
        )));
    }
    Ok((file, len))
}

fn map_sync(file: &std::fs::File, len: usize) -> Option<*mut u8> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain mmap of an open file; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
            file.as_raw_fd(),
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

impl PmemBdev {
    /// Maps `path`; `size` creates or extends the file. On DAX the mapping
    /// uses `MAP_SYNC`; elsewhere `populate` pre-faults every page.
    pub fn open(name: &str, path: &Path, size: Option<u64>, populate: bool) -> Result<Self> {
        let (file, len) = open_sized_file(name, path, size, PMEM_BLOCK_SIZE)?;
        let len = usize::try_from(len).map_err(|_| BdevError::BadSpec {
            spec: name.to_string(),
            reason: "file too large to map".into(),
        })?;
        let mapping = match map_sync(&file, len) {
            Some(base) => Mapping::Sync { base, len },
            None => {
                let mut opts = memmap2::MmapOptions::new();
                if populate {
                    opts.populate();
                }
                Mapping::Plain(
                    opts.map_raw(&file)
                        .map_err(|e| open_error(name, "mmap", e))?,
                )
            }
        };
        Ok(Self {
            name: name.into(),
            memory: Arc::new(PmemMemory {
                name: name.into(),
                mapping,
                dirty_lo: AtomicU64::new(u64::MAX),
                dirty_hi: AtomicU64::new(0),
            }),
            file: Arc::new(file),
        })
    }

    pub fn persist_mode(&self) -> PersistMode {
        self.memory.mode()
    }

    fn check(&self, op: &'static str, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.memory.len() as u64 => Ok(()),
            _ => Err(BdevError::OutOfRange {
                device: self.name.to_string(),
                op,
                offset,
                len,
                size_bytes: self.memory.len() as u64,
            }),
        }
    }

    /// A zero-copy view of `offset..offset+len` (any alignment).
    pub fn slice(&self, offset: u64, len: u64) -> Result<PmemSlice<'_>> {
        self.check("slice", offset, len)?;
        Ok(PmemSlice {
            // SAFETY: in range (checked above).
            ptr: unsafe { self.memory.base().add(offset as usize) },
            len: len as usize,
            _device: std::marker::PhantomData,
        })
    }

    /// Copies `data` into the mapping at `offset` (any alignment). Durable
    /// after [`PmemBdev::persist`] of the range (or a channel flush).
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check("write_at", offset, data.len() as u64)?;
        copy_in(&*self.memory, offset as usize, data);
        Ok(())
    }

    /// Copies `dst.len()` bytes at `offset` out of the mapping.
    pub fn read_at(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.check("read_at", offset, dst.len() as u64)?;
        copy_out(&*self.memory, offset as usize, dst);
        Ok(())
    }

    /// Makes `offset..offset+len` durable now.
    pub fn persist(&self, offset: u64, len: u64) -> Result<()> {
        self.check("persist", offset, len)?;
        self.memory.persist(offset as usize, len as usize)?;
        self.memory.flush()
    }
}

impl Bdev for PmemBdev {
    fn name(&self) -> &str {
        &self.name
    }
    fn block_size(&self) -> u32 {
        PMEM_BLOCK_SIZE
    }
    fn block_count(&self) -> u64 {
        self.memory.len() as u64 / u64::from(PMEM_BLOCK_SIZE)
    }
    fn io_type_supported(&self, _io_type: IoType) -> bool {
        true
    }
    fn channel(&self) -> Result<Box<dyn Channel>> {
        Ok(Box::new(MemChannel {
            name: Arc::clone(&self.name),
            block_size: PMEM_BLOCK_SIZE,
            backing: Arc::clone(&self.memory),
            queue_depth: PMEM_QUEUE_DEPTH,
            _not_send: std::marker::PhantomData,
        }))
    }
    fn as_pmem(&self) -> Option<&PmemBdev> {
        Some(self)
    }
    fn read_only_file(&self) -> Option<std::io::Result<std::fs::File>> {
        Some(crate::reopen_read_only(&*self.file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        assert!(PmemBdev::open("p", &path, None, false).is_err());
        assert!(PmemBdev::open("p", &path, Some(1000), false).is_err());
        let dev = PmemBdev::open("p", &path, Some(64 << 10), true).unwrap();
        assert_eq!(dev.block_count(), 16);
        dev.write_at(5, b"abc").unwrap();
        let mut out = [0u8; 3];
        dev.read_at(5, &mut out).unwrap();
        assert_eq!(&out, b"abc");
        // SAFETY: no writer while the slice lives.
        assert_eq!(unsafe { dev.slice(5, 3).unwrap().as_bytes() }, b"abc");
        assert!(dev.slice(64 << 10, 1).is_err());
        assert!(dev.write_at(u64::MAX, b"x").is_err());
        dev.persist(0, 64 << 10).unwrap();
        assert!(dev.as_pmem().is_some());
    }
}
