//! The `shm` endpoint: regions are memfd (or hugetlbfs) files the engine
//! hands over its Unix socket with `SCM_RIGHTS`; the client maps them
//! read-only (page tables populated) and a one-sided read is a copy out of
//! the mapping by atomic loads (from 256 bytes on x86-64, one `rep movsb`).
//! A read of a device log window (a file in the page cache, gigabytes long,
//! not mapped) is a `pread` of the file instead: one kernel copy, with no
//! page table work for pages this process never mapped (an ior read touches
//! each page once). For the populated
//! memory regions loads are faster than `pread` (ior-easy-read 9.2-10.6 vs
//! 5.8-7.8 GiB/s from a ring). The engine's CPU does nothing for either.
//!
//! ```
//! use ferrite_client::fabric::{shm::{ShmEndpoint, ShmMapping}, Endpoint};
//! use ferrite_proto::region::{Provider, RegionDescriptor, RegionKind};
//! use std::io::Write;
//!
//! let mut file = tempfile::tempfile().unwrap();
//! file.write_all(&[7u8; 4096]).unwrap();
//! let desc = RegionDescriptor {
//!     provider: Provider::Shm, kind: RegionKind::Log, target: 0, region_id: 3,
//!     length: 4096, param: 4096, access_key: 0, remote_addr: 0,
//! };
//! let mut ep = ShmEndpoint::new();
//! ep.insert(&desc, ShmMapping::map(&file, desc.length).unwrap()).unwrap();
//! let mut buf = [0u8; 16];
//! ep.read(&desc, 8, 16, &mut buf).unwrap();
//! assert_eq!(buf, [7u8; 16]);
//! assert!(ep.read(&desc, 4090, 16, &mut buf).is_err());
//! ```

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};

use ferrite_proto::region::RegionDescriptor;

use crate::client::error::{Error, Result};
use crate::fabric::{check_bounds, Endpoint};

/// Largest region id an [`ShmEndpoint`] accepts (ids index a table).
pub const REGION_ID_MAX: u32 = 1 << 16;
/// Most descriptors passed in one `recvmsg`.
pub const FDS_PER_MESSAGE_MAX: usize = 256;

/// A read-only view of `len` bytes of a region file.
pub struct ShmMapping {
    view: View,
    len: usize,
}

enum View {
    /// Memory regions: a shared mapping with populated page tables (loads).
    Mapped(*const u8),
    /// A device file window, read by `pread` of the file from `file_offset`.
    Window { fd: OwnedFd, file_offset: u64 },
}

impl std::fmt::Debug for ShmMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmMapping")
            .field("len", &self.len)
            .field("mapped", &matches!(self.view, View::Mapped(_)))
            .finish()
    }
}

// SAFETY: the mapping is read-only for this process and only ever read with
// atomic loads; the pointer stays valid until drop (munmap).
unsafe impl Send for ShmMapping {}
// SAFETY: as above; concurrent atomic reads are fine.
unsafe impl Sync for ShmMapping {}

impl ShmMapping {
    /// Maps the first `len` bytes of `fd` read-only and shared, page tables
    /// populated (a memory region). The file must be at least `len` bytes
    /// long (checked with fstat).
    pub fn map(fd: impl AsFd, len: u64) -> Result<Self> {
        Self::map_at(fd, 0, len, true)
    }

    /// A view of `len` bytes of `fd` from file offset `offset`. `populate`:
    /// a read-only shared mapping (`offset` a multiple of the page size) with
    /// its page tables filled now, for memory files (a GET must not take
    /// page faults). Otherwise no mapping: a window of a device file, read
    /// by `pread` only (mapping it would cost a fault per page read). The
    /// file must reach `offset + len` (checked with fstat), so no read in the
    /// mapping can fault past its end as long as the file does not shrink.
    pub fn map_at(fd: impl AsFd, offset: u64, len: u64, populate: bool) -> Result<Self> {
        let fd = fd.as_fd();
        // SAFETY: fstat writes into the zeroed struct we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is a valid descriptor borrowed for this call.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(Error::io(
                "fstat of shm region",
                std::io::Error::last_os_error(),
            ));
        }
        let end = offset.checked_add(len);
        if end.is_none_or(|e| (st.st_size as u64) < e) || len == 0 {
            return Err(Error::Region {
                region_id: 0,
                reason: format!(
                    "shm file holds {} bytes, descriptor says {len} from {offset}",
                    st.st_size
                ),
            });
        }
        let too_big = || Error::Region {
            region_id: 0,
            reason: format!("region of {len} bytes at {offset} does not fit the address space"),
        };
        let len = usize::try_from(len).map_err(|_| too_big())?;
        let file_offset = libc::off_t::try_from(offset).map_err(|_| too_big())?;
        if !populate {
            let fd = fd
                .try_clone_to_owned()
                .map_err(|e| Error::io("dup of shm region descriptor", e))?;
            return Ok(Self {
                view: View::Window {
                    fd,
                    file_offset: offset,
                },
                len,
            });
        }
        // SAFETY: mapping a valid fd read-only; the kernel chooses the address
        // (and refuses an offset that is not page aligned).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                file_offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::io(
                "mmap of shm region",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Self {
            view: View::Mapped(ptr as *const u8),
            len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Prefetches the cache lines of `len` bytes at `offset` (clamped to
    /// the mapping).
    fn prefetch(&self, offset: usize, len: usize) {
        let View::Mapped(ptr) = self.view else {
            return;
        };
        let end = offset.saturating_add(len).min(self.len);
        let mut at = offset & !63;
        while at < end {
            // SAFETY: `at` is inside the mapping; a prefetch never faults
            // and reads nothing architecturally.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(ptr.add(at) as *const i8);
            }
            at += 64;
        }
    }

    /// Copies `dst.len()` bytes at `offset` with atomic loads: single
    /// bytes up to the first 8-aligned source address and after the last,
    /// 8-byte words in between (so an unaligned range, like a value behind
    /// a record's key, is still copied a word at a time). Bounds are checked
    /// by the caller.
    fn copy_out(&self, offset: usize, dst: &mut [u8]) {
        let View::Mapped(ptr) = self.view else {
            unreachable!("copy_out of an unmapped window");
        };
        debug_assert!(offset + dst.len() <= self.len);
        // SAFETY: offset + len is within the mapping (checked by callers).
        let src = unsafe { ptr.add(offset) };
        #[cfg(target_arch = "x86_64")]
        if dst.len() >= STRING_COPY_FROM {
            // SAFETY: src..src+len is mapped (above), dst is ours.
            unsafe { string_copy(src, dst) };
            fence(Ordering::Acquire);
            return;
        }
        let lead = ((8 - src as usize % 8) % 8).min(dst.len());
        let (head, rest) = dst.split_at_mut(lead);
        let words = rest.len() / 8 * 8;
        let (body, tail) = rest.split_at_mut(words);
        let load_byte = |at: usize| {
            // SAFETY: in bounds; AtomicU8 has u8's layout.
            unsafe { (*(src.add(at) as *const AtomicU8)).load(Ordering::Relaxed) }
        };
        for (i, b) in head.iter_mut().enumerate() {
            *b = load_byte(i);
        }
        for (i, chunk) in body.chunks_exact_mut(8).enumerate() {
            // SAFETY: src + lead is 8-aligned and the word is in bounds;
            // AtomicU64 has u64's layout.
            let w =
                unsafe { (*(src.add(lead + i * 8) as *const AtomicU64)).load(Ordering::Relaxed) };
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        for (i, b) in tail.iter_mut().enumerate() {
            *b = load_byte(lead + words + i);
        }
        fence(Ordering::Acquire);
    }
}

/// Copies from this size up are one `rep movsb` ([`string_copy`]); below,
/// the word loads' start-up cost is lower.
#[cfg(target_arch = "x86_64")]
const STRING_COPY_FROM: usize = 256;

/// Copies `dst.len()` bytes from `src` with one `rep movsb`: the engine may
/// write those bytes meanwhile, and an assembly copy is, like the atomic
/// loads, not a data race in Rust's sense (the bytes may be torn, which the
/// reader's checks catch). With the fast string operations of every x86-64
/// CPU of the last decade it copies at memcpy's speed, where word-by-word
/// atomic loads, which the compiler may not widen, ran at half of it
/// (ior-easy-read spent a quarter of its CPU in them).
///
/// # Safety
/// `src..src + dst.len()` must be mapped and readable.
#[cfg(target_arch = "x86_64")]
unsafe fn string_copy(src: *const u8, dst: &mut [u8]) {
    // SAFETY: the caller guarantees the source range; `dst` is an exclusive
    // borrow of its length. The direction flag is clear on entry (Rust's
    // inline assembly rules), so the copy goes upward.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") dst.len() => _,
            inout("rsi") src => _,
            inout("rdi") dst.as_mut_ptr() => _,
            options(nostack, preserves_flags)
        );
    }
}

impl ShmMapping {
    /// Copies `dst.len()` bytes at `offset` of the view (in bounds, checked
    /// by the caller): loads from the mapping, `pread` for a window.
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        match &self.view {
            View::Mapped(_) => {
                self.copy_out(offset, dst);
                Ok(())
            }
            View::Window { fd, file_offset } => pread(fd, file_offset + offset as u64, dst),
        }
    }
}

/// `pread`s of `fd` from `offset` until `dst` is full. The engine may write
/// the bytes meanwhile: the copy may be torn (the reader's checks catch
/// that), never undefined behaviour.
fn pread(fd: &OwnedFd, offset: u64, dst: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let at = offset + done as u64;
        let rest = &mut dst[done..];
        // SAFETY: pread into the unfilled part of `dst`, which we own.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                rest.as_mut_ptr().cast(),
                rest.len(),
                at as libc::off_t,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => {
                return Err(Error::Region {
                    region_id: 0,
                    reason: format!("shm file ends before byte {at}"),
                })
            }
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(Error::io("pread of shm region", e));
                }
            }
        }
    }
    Ok(())
}

impl Drop for ShmMapping {
    fn drop(&mut self) {
        if let View::Mapped(ptr) = self.view {
            // SAFETY: ptr/len are exactly what mmap returned.
            unsafe { libc::munmap(ptr as *mut libc::c_void, self.len) };
        }
    }
}

/// Reads regions through their shared mappings. Built once after the
/// handshake, then shared read-only by every thread of a client.
#[derive(Debug, Default)]
pub struct ShmEndpoint {
    regions: Vec<Option<ShmMapping>>,
}

impl ShmEndpoint {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the mapping of a region; the mapping must cover the
    /// descriptor's length.
    pub fn insert(&mut self, region: &RegionDescriptor, mapping: ShmMapping) -> Result<()> {
        if region.region_id >= REGION_ID_MAX {
            return Err(Error::Region {
                region_id: region.region_id,
                reason: format!("region id above {REGION_ID_MAX}"),
            });
        }
        if (mapping.len as u64) < region.length {
            return Err(Error::Region {
                region_id: region.region_id,
                reason: format!(
                    "mapping of {} bytes is shorter than the region ({})",
                    mapping.len, region.length
                ),
            });
        }
        let i = region.region_id as usize;
        if self.regions.len() <= i {
            self.regions.resize_with(i + 1, || None);
        }
        self.regions[i] = Some(mapping);
        Ok(())
    }

    pub fn has(&self, region_id: u32) -> bool {
        matches!(self.regions.get(region_id as usize), Some(Some(_)))
    }
}

impl Endpoint for ShmEndpoint {
    fn read(
        &self,
        region: &RegionDescriptor,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> Result<()> {
        check_bounds(region, offset, len, buf.len())?;
        let mapping = match self.regions.get(region.region_id as usize) {
            Some(Some(m)) => m,
            _ => {
                return Err(Error::Region {
                    region_id: region.region_id,
                    reason: "not mapped by this client".into(),
                })
            }
        };
        // In bounds of the descriptor, and the mapping covers the descriptor.
        mapping.read(offset as usize, &mut buf[..len])
    }

    fn prefetch(&self, region: &RegionDescriptor, offset: u64, len: usize) {
        if let Some(Some(m)) = self.regions.get(region.region_id as usize) {
            m.prefetch(offset as usize, len);
        }
    }

    fn prefetches(&self) -> bool {
        true
    }

    fn provider(&self) -> &'static str {
        "shm"
    }
}

/// Receives one message and the descriptors passed with it (`SCM_RIGHTS`).
/// Returns the bytes read into `buf` (0 at end of stream) and the fds.
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE((FDS_PER_MESSAGE_MAX * 4) as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: zeroed msghdr is a valid starting point.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    // SAFETY: msg points at live buffers of the stated sizes.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(Error::io(
            "recvmsg (SCM_RIGHTS)",
            std::io::Error::last_os_error(),
        ));
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control buffer the kernel filled, with libc macros.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                let bytes = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                for i in 0..bytes / 4 {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(Error::Region {
            region_id: 0,
            reason: format!("more than {FDS_PER_MESSAGE_MAX} descriptors in one message"),
        });
    }
    Ok((n as usize, fds))
}

/// Sends `bytes` with `fds` attached (`SCM_RIGHTS`). The engine has its own
/// sender; this one serves tests and tools.
pub fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> Result<usize> {
    if fds.len() > FDS_PER_MESSAGE_MAX || bytes.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "send_with_fds: {} fds (max {FDS_PER_MESSAGE_MAX}), {} bytes (min 1)",
            fds.len(),
            bytes.len()
        )));
    }
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let payload = std::mem::size_of_val(fds) as u32;
    // SAFETY: pure computations.
    let (space, cmsg_len) = unsafe { (libc::CMSG_SPACE(payload), libc::CMSG_LEN(payload)) };
    let mut control = vec![0u64; (space as usize).div_ceil(8)];
    // SAFETY: zeroed msghdr is a valid starting point.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer has room for one header and the fds.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = cmsg_len as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg) as *mut RawFd,
                fds.len(),
            );
        }
    }
    // SAFETY: msg points at live buffers.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(Error::io(
            "sendmsg (SCM_RIGHTS)",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(n as usize)
}

/// A memfd of `len` bytes that may be sealed (the bulk region, tests).
pub fn memfd(name: &str, len: u64) -> Result<OwnedFd> {
    let cname = std::ffi::CString::new(name)
        .map_err(|_| Error::InvalidArgument(format!("memfd name {name:?} has a NUL")))?;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: cname is a valid C string.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    if fd < 0 {
        return Err(Error::io("memfd_create", std::io::Error::last_os_error()));
    }
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fd is valid.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(Error::io(
            "ftruncate of memfd",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_proto::region::{Provider, RegionKind};

    fn desc(id: u32, len: u64) -> RegionDescriptor {
        RegionDescriptor {
            provider: Provider::Shm,
            kind: RegionKind::Log,
            target: 0,
            region_id: id,
            length: len,
            param: len,
            access_key: 0,
            remote_addr: 0,
        }
    }

    /// Every start and length around the word boundaries copies exactly the
    /// bytes of the range (lead bytes, words, tail bytes).
    #[test]
    fn unaligned_ranges_copy_exactly() {
        let fd = memfd("u", 4096).unwrap();
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        // SAFETY: pwrite of our own buffer into our own memfd.
        let n = unsafe { libc::pwrite(fd.as_raw_fd(), pattern.as_ptr().cast(), 4096, 0) };
        assert_eq!(n, 4096);
        let m = ShmMapping::map(&fd, 4096).unwrap();
        let mut out = [0u8; 64];
        for start in 0..17 {
            for len in 0..40 {
                m.copy_out(start, &mut out[..len]);
                assert_eq!(&out[..len], &pattern[start..start + len], "{start}+{len}");
            }
        }
        // Around the size from which one string copy does it (x86-64).
        let mut big = vec![0u8; 1100];
        for start in [0, 1, 7, 8, 9, 2995] {
            for len in [255, 256, 257, 1000, 1100] {
                big.fill(0);
                m.copy_out(start, &mut big[..len]);
                assert_eq!(&big[..len], &pattern[start..start + len], "{start}+{len}");
                assert!(
                    big[len..].iter().all(|&b| b == 0),
                    "{start}+{len}: wrote past"
                );
            }
        }
    }

    /// A mapped view (loads) and an unmapped window of the same file (pread)
    /// return the same bytes, for large and unaligned reads, also after the
    /// file changed.
    #[test]
    fn mapped_and_pread_views_read_the_same_bytes() {
        let len = 64 << 10;
        let fd = memfd("p", len as u64).unwrap();
        let write = |byte: u8| {
            let v: Vec<u8> = (0..len).map(|i| (i as u8) ^ byte).collect();
            // SAFETY: pwrite of our own buffer into our own memfd.
            let n = unsafe { libc::pwrite(fd.as_raw_fd(), v.as_ptr().cast(), len, 0) };
            assert_eq!(n as usize, len);
            v
        };
        let pattern = write(0);
        let d = desc(2, len as u64);
        let mut ep = ShmEndpoint::new();
        ep.insert(&d, ShmMapping::map(&fd, len as u64).unwrap())
            .unwrap();
        let mut out = vec![0u8; len];
        let unmapped = ShmMapping::map_at(&fd, 0, len as u64, false).unwrap();
        for (at, n) in [
            (0, 16 << 10),
            (3, 5 + (16 << 10)),
            (1, len - 1),
            (0, len),
            (100, 8),
        ] {
            ep.read(&d, at as u64, n, &mut out).unwrap();
            assert_eq!(&out[..n], &pattern[at..at + n], "{at}+{n}");
            unmapped.read(at, &mut out[..n]).unwrap();
            assert_eq!(&out[..n], &pattern[at..at + n], "window {at}+{n}");
        }
        let changed = write(0x5a);
        ep.read(&d, 7, len - 7, &mut out).unwrap();
        assert_eq!(&out[..len - 7], &changed[7..]);
        unmapped.read(7, &mut out[..len - 7]).unwrap();
        assert_eq!(&out[..len - 7], &changed[7..]);
    }

    #[test]
    fn memfd_passed_over_socket_is_readable_and_read_only() {
        let fd = memfd("t", 8192).unwrap();
        // SAFETY: writable shared mapping of our own memfd, for the test writer.
        let w = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        } as *mut u8;
        assert_ne!(w as *mut libc::c_void, libc::MAP_FAILED);
        // SAFETY: in bounds of the 8192-byte mapping.
        unsafe { std::ptr::write_bytes(w.add(100), 0xab, 50) };
        let (a, b) = UnixStream::pair().unwrap();
        send_with_fds(&a, b"regions", &[fd.as_raw_fd()]).unwrap();
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"regions"[..], 1));
        let d = desc(5, 8192);
        let mut ep = ShmEndpoint::new();
        ep.insert(&d, ShmMapping::map(&fds[0], 8192).unwrap())
            .unwrap();
        let mut out = [0u8; 60];
        ep.read(&d, 96, 60, &mut out).unwrap();
        assert_eq!(&out[..4], &[0; 4]);
        assert_eq!(&out[4..54], &[0xab; 50][..]);
        // unaligned path
        ep.read(&d, 99, 3, &mut out).unwrap();
        assert_eq!(&out[..3], &[0, 0xab, 0xab]);
        assert!(
            ep.read(&desc(6, 8192), 0, 8, &mut out).is_err(),
            "unmapped id"
        );
        assert!(ShmMapping::map(&fds[0], 8193).is_err(), "file too short");
        // A window of the file from a page offset, as device logs are mapped.
        let window = ShmMapping::map_at(&fds[0], 4096, 4096, false).unwrap();
        let mut ep = ShmEndpoint::new();
        ep.insert(&desc(7, 4096), window).unwrap();
        // SAFETY: in bounds of the 8192-byte mapping.
        unsafe { std::ptr::write_bytes(w.add(4096 + 10), 0xcd, 2) };
        ep.read(&desc(7, 4096), 8, 4, &mut out).unwrap();
        assert_eq!(&out[..4], &[0, 0, 0xcd, 0xcd]);
        assert!(
            ShmMapping::map_at(&fds[0], 4096, 4097, false).is_err(),
            "past the end"
        );
        assert!(
            ShmMapping::map_at(&fds[0], 100, 4096, true).is_err(),
            "an unaligned mapping"
        );
        // A window that is not mapped (as device logs are) needs no alignment.
        let window = ShmMapping::map_at(&fds[0], 4096 + 9, 64, false).unwrap();
        let mut ep = ShmEndpoint::new();
        ep.insert(&desc(8, 64), window).unwrap();
        ep.read(&desc(8, 64), 0, 4, &mut out).unwrap();
        assert_eq!(&out[..4], &[0, 0xcd, 0xcd, 0]);
        // SAFETY: unmapping the test writer's mapping.
        unsafe { libc::munmap(w as *mut libc::c_void, 8192) };
    }
}
