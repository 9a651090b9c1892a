//! Bulk regions: a local client's own memory, mapped by the engine, that
//! file-chunk reads and writes refer to by `(region_offset, len)` instead of
//! carrying the bytes in the frame (`BulkRead`, `BulkWrite`).
//!
//! The client creates a memory file (`memfd_create`), seals it against
//! shrinking (`F_SEAL_SHRINK`) and sends its fd with its Login frame over
//! the Unix socket (`SCM_RIGHTS`). The engine accepts only a sealed memfd
//! of a sane size and maps it `MAP_SHARED` read-write for the life of the
//! connection: the mapping is dropped (unmapped) once the connection closed
//! and its last request finished.
//!
//! Safety against a client that lies or dies:
//! - Every `(region_offset, len)` is checked against the mapped length
//!   ([`BulkRegion::slice`]) before a target sees it; a bad one gets error
//!   10 (bad region) and the connection goes on.
//! - The file cannot shrink under the mapping (the seal), so no access
//!   faults with `SIGBUS`.
//! - The client may change the bytes while the engine copies them: a write
//!   then stores whatever the copy saw (the record's CRC is computed over
//!   the copy in the log ring, so it is consistent), a read hands back
//!   whatever the client scribbled over. Only the client's own data is
//!   affected.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;

use ferrite_proto::rpc::handshake::REGIONS_MAX;

/// Largest bulk region the engine maps for one connection.
pub(crate) const BULK_REGION_MAX_BYTES: u64 = 1 << 30;

/// A client's bulk region, mapped read-write into the engine.
pub(crate) struct BulkRegion {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping lives as long as the value and holds no thread-bound
// state; every access goes through raw pointers within `len` (see `slice`),
// like the engine's own regions shared with clients.
unsafe impl Send for BulkRegion {}
// SAFETY: as for Send; `&BulkRegion` only hands out bounds-checked slices.
unsafe impl Sync for BulkRegion {}

impl std::fmt::Debug for BulkRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BulkRegion")
            .field("len", &self.len)
            .finish()
    }
}

impl BulkRegion {
    /// Maps the client's memfd after checking it is one, sealed against
    /// shrinking, and of a size in (0, [`BULK_REGION_MAX_BYTES`]].
    pub(crate) fn map(fd: OwnedFd) -> Result<Self, String> {
        let raw = fd.as_raw_fd();
        // SAFETY: fcntl on an fd we own; F_GET_SEALS takes no argument.
        let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(format!(
                "the bulk region is not a memfd ({})",
                std::io::Error::last_os_error()
            ));
        }
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err("the bulk region is not sealed against shrinking".into());
        }
        // SAFETY: fstat fills a plain struct for an fd we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `st` is a valid out pointer.
        if unsafe { libc::fstat(raw, &mut st) } != 0 {
            return Err(format!(
                "fstat of the bulk region: {}",
                std::io::Error::last_os_error()
            ));
        }
        let len = st.st_size as u64;
        if len == 0 || len > BULK_REGION_MAX_BYTES {
            return Err(format!(
                "bulk region of {len} bytes (1 to {BULK_REGION_MAX_BYTES} accepted)"
            ));
        }
        let len = len as usize;
        // The file holds at least `len` bytes and cannot shrink (sealed).
        let ptr = crate::region::map_shared(fd.as_fd(), len, true)
            .map_err(|e| format!("mapping the bulk region: {e}"))?;
        // The mapping keeps the file alive; the fd is closed here.
        drop(fd);
        Ok(Self { ptr, len })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The `len` bytes at `offset`, if they lie inside the region.
    pub(crate) fn slice(self: &Arc<Self>, offset: u64, len: u32) -> Result<BulkSlice, String> {
        let end = offset.checked_add(u64::from(len));
        match end {
            Some(end) if end <= self.len as u64 => Ok(BulkSlice {
                region: self.clone(),
                offset: offset as usize,
                len: len as usize,
            }),
            _ => Err(format!(
                "bulk range of {len} bytes at offset {offset} is outside this connection's \
                 bulk region ({} bytes)",
                self.len
            )),
        }
    }
}

impl Drop for BulkRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no slice
        // outlives the region (each holds an Arc to it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A bounds-checked range of a bulk region; keeps the region mapped.
#[derive(Debug, Clone)]
pub(crate) struct BulkSlice {
    region: Arc<BulkRegion>,
    offset: usize,
    len: usize,
}

impl BulkSlice {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn ptr(&self) -> *mut u8 {
        // SAFETY: offset + len ≤ region length (checked in `slice`).
        unsafe { self.region.ptr.as_ptr().add(self.offset) }
    }

    /// The bytes, for a write to copy into the log ring.
    ///
    /// The client may change them while the engine holds this view (another
    /// process writing shared memory, as with every shm transport); the
    /// copy then takes a mix of old and new bytes, which only the client
    /// can observe, and the record's CRC covers the copy actually stored.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped at `ptr()` for as long as `self` holds
        // the region; see above for writers in the client's process.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// Copies `bytes` to `at` within the slice (no reference to the shared
    /// memory is formed, so overlapping slices of concurrent requests are
    /// fine). Panics if the copy would leave the slice: a caller bug.
    pub(crate) fn put(&self, at: usize, bytes: &[u8]) {
        assert!(
            at <= self.len && bytes.len() <= self.len - at,
            "bulk put out of its slice"
        );
        // SAFETY: in bounds (asserted); `bytes` is engine memory, distinct
        // from the client's region.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr().add(at), bytes.len()) };
    }

    /// Zeroes `len` bytes at `at` within the slice.
    pub(crate) fn zero(&self, at: usize, len: usize) {
        assert!(
            at <= self.len && len <= self.len - at,
            "bulk zero out of its slice"
        );
        // SAFETY: in bounds (asserted).
        unsafe { std::ptr::write_bytes(self.ptr().add(at), 0, len) };
    }
}

impl crate::store::ExtentSink for BulkSlice {
    fn put(&mut self, at: usize, bytes: &[u8]) {
        BulkSlice::put(self, at, bytes);
    }
    fn zero(&mut self, at: usize, len: usize) {
        BulkSlice::zero(self, at, len);
    }
}

/// One `recvmsg` on socket `fd` into `buf` with `flags` (e.g.
/// `MSG_DONTWAIT`), and the fds of any `SCM_RIGHTS` message it carried
/// (close-on-exec; at most [`REGIONS_MAX`], the kernel closes the rest).
/// The engine reads a bulk region's fd with it; tests read shm fds.
pub fn recvmsg_fds(
    fd: RawFd,
    buf: &mut [u8],
    flags: libc::c_int,
) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    let fd_bytes = REGIONS_MAX * std::mem::size_of::<RawFd>();
    // SAFETY: CMSG_SPACE is a pure computation on a length.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg points at live buffers of the stated sizes.
    let n = unsafe { libc::recvmsg(fd, &mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control buffer the kernel filled, with the libc
    // macros; each SCM_RIGHTS entry is an fd now owned by this process.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let bytes = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((n as usize, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd(len: i64, seals: i32) -> OwnedFd {
        // SAFETY: memfd_create with a static name; the fd is owned below.
        let fd = unsafe { libc::memfd_create(c"bulk-test".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(fd >= 0);
        // SAFETY: fd is a fresh memfd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain fcntl/ftruncate calls on our fd.
        unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), len), 0);
            if seals != 0 {
                assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals), 0);
            }
        }
        fd
    }

    #[test]
    fn only_sealed_memfds_of_sane_size_are_mapped() {
        assert!(BulkRegion::map(memfd(4096, 0))
            .unwrap_err()
            .contains("sealed"));
        assert!(BulkRegion::map(memfd(0, libc::F_SEAL_SHRINK)).is_err());
        let file = tempfile::tempfile().unwrap();
        assert!(BulkRegion::map(OwnedFd::from(file))
            .unwrap_err()
            .contains("memfd"));
        let r = Arc::new(BulkRegion::map(memfd(8192, libc::F_SEAL_SHRINK)).unwrap());
        assert_eq!(r.len(), 8192);
    }

    #[test]
    fn slices_are_bounds_checked_and_reach_the_memory() {
        let fd = memfd(8192, libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL);
        let r = Arc::new(BulkRegion::map(fd.try_clone().unwrap()).unwrap());
        assert!(r.slice(8192, 1).is_err());
        assert!(r.slice(8000, 193).is_err());
        assert!(r.slice(u64::MAX, 2).is_err());
        assert_eq!(r.slice(8192, 0).unwrap().len(), 0);
        let s = r.slice(4095, 3).unwrap();
        s.put(0, &[1, 2, 3]);
        assert_eq!(s.bytes(), [1, 2, 3]);
        s.zero(1, 2);
        assert_eq!(s.bytes(), [1, 0, 0]);
        // The bytes are in the file: another mapping of it sees them.
        let mut back = [9u8; 3];
        // SAFETY: pread into a local buffer from our fd.
        let n = unsafe { libc::pread(fd.as_raw_fd(), back.as_mut_ptr().cast(), 3, 4095) };
        assert_eq!(n, 3);
        assert_eq!(back, [1, 0, 0]);
    }
}
