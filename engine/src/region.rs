//! Registered memory regions: memfd-backed shared mappings.
//!
//! A target keeps its bucket array and its in-memory record log ring in
//! regions. Each region is an anonymous memory file (`memfd_create`, or a
//! hugetlbfs-backed one with [`Region::new_hugetlb`]) mapped `MAP_SHARED`
//! read-write into the engine. The server hands a read-only descriptor of the
//! file ([`Region::client_fd`]) to local clients over a Unix socket
//! (`SCM_RIGHTS`), who map it read-only, and registers the mapping with the
//! RDMA provider.
//!
//! Clients cannot change a region: once sized and mapped, its file is sealed
//! ([`REGION_SEALS`]) against shrinking and growing (no `ftruncate`, so no
//! access to the mapping can fault) and against any new write (`write(2)`,
//! or a writable mapping, even through a descriptor reopened read-write by
//! `/proc/self/fd`), while the engine keeps writing through the mapping it
//! made before sealing; and the descriptor clients get is opened read-only.
//!
//! ```
//! use ferrite_engine::region::Region;
//!
//! let r = Region::new(7, "doc", 8192).unwrap();
//! assert_eq!(r.id(), 7);
//! assert_eq!(r.len(), 8192);
//! // SAFETY: the mapping is 8192 bytes long and nobody else writes it.
//! unsafe { r.as_ptr().add(100).write(42) };
//! // SAFETY: as above.
//! assert_eq!(unsafe { r.as_ptr().add(100).read() }, 42);
//! ```

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

/// Huge page size used for hugetlbfs regions.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// `F_SEAL_FUTURE_WRITE` (Linux 5.1; not in every libc version): no new
/// write or writable mapping, while mappings made before keep writing.
const F_SEAL_FUTURE_WRITE: libc::c_int = 0x0010;

/// Seals every region's file carries once it is sized and mapped: no size
/// change, no write but through the engine's own mapping, no more seals.
pub const REGION_SEALS: libc::c_int =
    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;

/// A shared, file-backed memory region.
pub struct Region {
    id: u32,
    len: usize,
    ptr: NonNull<u8>,
    fd: OwnedFd,
    /// The same file opened read-only: what clients get.
    client_fd: OwnedFd,
    hugetlb: bool,
}

// SAFETY: the mapping lives as long as the Region; the Region itself holds no
// thread-bound state. Writers synchronise by contract (one writer per region,
// readers validate what they copy), as for memory shared with other processes.
unsafe impl Send for Region {}
// SAFETY: see Send; shared references only expose raw pointers.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.id)
            .field("len", &self.len)
            .field("fd", &self.fd.as_raw_fd())
            .field("hugetlb", &self.hugetlb)
            .finish()
    }
}

impl Region {
    /// A zero-filled region of `len` bytes (rounded up to the page size).
    pub fn new(id: u32, name: &str, len: usize) -> io::Result<Self> {
        Self::create(id, name, len, false)
    }

    /// Like [`Region::new`] but backed by 2 MiB huge pages (`MFD_HUGETLB`);
    /// fails if the system has no free huge pages.
    pub fn new_hugetlb(id: u32, name: &str, len: usize) -> io::Result<Self> {
        Self::create(id, name, len, true)
    }

    fn create(id: u32, name: &str, len: usize, hugetlb: bool) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "region length must be positive",
            ));
        }
        let page = if hugetlb {
            HUGE_PAGE_BYTES
        } else {
            page_size()
        };
        let len = len.div_ceil(page) * page;
        let cname = CString::new(format!("ferrite-{name}"))
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "region name has a NUL"))?;
        let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
        if hugetlb {
            flags |= libc::MFD_HUGETLB;
        }
        // SAFETY: cname is a valid C string; flags are valid memfd flags.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a freshly created descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "region too large"))?;
        // SAFETY: fd is a valid memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let ptr = map_shared(fd.as_fd(), len, true).map_err(|e| {
            if hugetlb && e.raw_os_error() == Some(libc::ENOMEM) {
                return io::Error::other(format!(
                    "{len} bytes of 2 MiB huge pages are not reserved ({} pages needed; \
                     raise vm.nr_hugepages): {e}",
                    len / HUGE_PAGE_BYTES
                ));
            }
            e
        })?;
        let sealed = seal(fd.as_fd()).and_then(|()| reopen_read_only(fd.as_fd()));
        let client_fd = match sealed {
            Ok(ro) => ro,
            Err(e) => {
                // SAFETY: ptr/len is the mapping just made; nothing uses it.
                unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
                return Err(e);
            }
        };
        Ok(Self {
            id,
            len,
            ptr,
            fd,
            client_fd,
            hugetlb,
        })
    }

    /// Faults every page of the mapping in, writable
    /// (`MADV_POPULATE_WRITE`, Linux 5.14): the memory is allocated and
    /// mapped now, so that the engine's first write to each page (an
    /// append to the ring) does not stop on a page fault, and a client's
    /// populated read-only mapping finds the pages already there.
    pub fn populate(&self) -> io::Result<()> {
        /// `MADV_POPULATE_WRITE` (the same on every Linux architecture).
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        // SAFETY: ptr/len are this region's own live mapping; populating
        // changes no byte of it.
        let rc = unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.len, MADV_POPULATE_WRITE) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Engine-wide region id (as in the region descriptor).
    pub fn id(&self) -> u32 {
        self.id
    }
    /// Bytes mapped (the requested length rounded up to the page size).
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn is_hugetlb(&self) -> bool {
        self.hugetlb
    }
    /// Start of the mapping. Valid for `len()` bytes while `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// The memory file as the engine opened it (read-write; sealed against
    /// new writes, so only the engine's own mapping writes it).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
    /// A read-only descriptor of the memory file: the one to pass to
    /// clients (they can map it read-only, nothing else).
    pub fn client_fd(&self) -> BorrowedFd<'_> {
        self.client_fd.as_fd()
    }
}

/// Adds [`REGION_SEALS`] to memory file `fd`.
fn seal(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fcntl on a valid descriptor with an int argument.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, REGION_SEALS) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("sealing a region: {e}")));
    }
    Ok(())
}

/// The file behind `fd` opened anew, read-only (by `/proc/self/fd`): a
/// descriptor that cannot write, map writable or truncate whatever the
/// file's own seals.
pub(crate) fn reopen_read_only(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|_| io::Error::other("fd path has a NUL"))?;
    // SAFETY: path is a valid C string; the result is checked.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if raw < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("reopening a region read-only: {e}"),
        ));
    }
    // SAFETY: raw is a freshly opened descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: ptr/len are the mapping created in `create`; nothing
        // borrowed from it outlives self.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096).max(4096)
}

/// Maps another process's region fd read-only, as a local client does.
/// Returns the mapping's start; unmap with [`unmap_readonly`].
pub fn map_readonly(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    map_shared(fd, len, false)
}

/// Maps `len` bytes of `fd` shared, read-only or read-write; the caller
/// unmaps (`munmap`) and keeps `len` within the file.
pub(crate) fn map_shared(fd: BorrowedFd<'_>, len: usize, write: bool) -> io::Result<NonNull<u8>> {
    let prot = if write {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: mapping a caller-provided fd; the kernel validates it and
    // picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// Unmaps a mapping made by [`map_readonly`].
///
/// # Safety
/// `ptr`/`len` must come from one `map_readonly` call and nothing borrowed
/// from the mapping may be used afterwards.
pub unsafe fn unmap_readonly(ptr: NonNull<u8>, len: usize) {
    // SAFETY: by the caller's contract.
    unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_mapping_sees_writes() {
        let r = Region::new(1, "t", 5000).unwrap();
        assert_eq!(r.len(), 8192);
        let ro = map_readonly(r.client_fd(), r.len()).unwrap();
        // SAFETY: both mappings are r.len() bytes.
        unsafe {
            r.as_ptr().add(4097).write(0xab);
            assert_eq!(ro.as_ptr().add(4097).read_volatile(), 0xab);
            unmap_readonly(ro, r.len());
        }
    }

    /// Pages of `r` in memory, by `mincore`.
    fn resident_pages(r: &Region) -> usize {
        let mut vec = vec![0u8; r.len() / page_size()];
        // SAFETY: the mapping is r.len() bytes; vec has a byte per page.
        let rc = unsafe { libc::mincore(r.as_ptr().cast(), r.len(), vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    /// A fresh region has no page in memory; populated, it has all of
    /// them, still reading as zeros.
    #[test]
    fn populate_makes_every_page_resident() {
        let r = Region::new(1, "t", 64 * page_size()).unwrap();
        assert_eq!(resident_pages(&r), 0);
        r.populate().unwrap();
        assert_eq!(resident_pages(&r), 64);
        // SAFETY: the mapping is r.len() bytes and nothing writes it.
        let bytes = unsafe { std::slice::from_raw_parts(r.as_ptr(), r.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
    }

    /// What a client can do with a region's file through `fd`: each of
    /// write(2), a writable shared mapping and ftruncate(0), with whether
    /// it succeeded.
    fn attempts(fd: BorrowedFd<'_>, len: usize) -> [(&'static str, bool); 3] {
        let raw = fd.as_raw_fd();
        // SAFETY: writes one byte from a live buffer to a valid fd.
        let wrote = unsafe { libc::pwrite(raw, [1u8].as_ptr().cast(), 1, 0) } == 1;
        let mapped = map_shared(fd, len, true).map(|p| {
            // SAFETY: the mapping was just made, len bytes.
            unsafe { libc::munmap(p.as_ptr().cast(), len) };
        });
        // SAFETY: ftruncate on a valid fd.
        let truncated = unsafe { libc::ftruncate(raw, 0) } == 0;
        [
            ("write", wrote),
            ("mmap writable", mapped.is_ok()),
            ("ftruncate", truncated),
        ]
    }

    /// Neither the descriptor clients get nor the engine's own read-write
    /// one reopened (as a client could, by /proc/self/fd) writes, maps
    /// writable or truncates the file; the engine's mapping still writes,
    /// and a read-only mapping of the client fd sees it.
    #[test]
    fn clients_cannot_write_map_writable_or_truncate() {
        let r = Region::new(1, "t", 8192).unwrap();
        for (what, ok) in attempts(r.client_fd(), r.len()) {
            assert!(!ok, "{what} through the client fd succeeded");
        }
        let path = CString::new(format!("/proc/self/fd/{}", r.client_fd().as_raw_fd())).unwrap();
        // SAFETY: valid C string; result checked.
        let rw = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        assert!(rw >= 0, "reopen: {}", io::Error::last_os_error());
        // SAFETY: rw is a fresh descriptor we own.
        let rw = unsafe { OwnedFd::from_raw_fd(rw) };
        for (what, ok) in attempts(rw.as_fd(), r.len()) {
            assert!(!ok, "{what} through a reopened read-write fd succeeded");
        }
        // SAFETY: a zeroed libc::stat is a valid value of that plain struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the fd is open for the region's life and `st` is a valid
        // out pointer.
        assert_eq!(unsafe { libc::fstat(r.raw_fd(), &mut st) }, 0);
        assert_eq!(st.st_size as usize, r.len(), "size unchanged");
        let ro = map_readonly(r.client_fd(), r.len()).unwrap();
        // SAFETY: both mappings are r.len() bytes.
        unsafe {
            r.as_ptr().add(8191).write(0x77);
            assert_eq!(ro.as_ptr().add(8191).read_volatile(), 0x77);
            unmap_readonly(ro, r.len());
        }
        r.populate().unwrap();
    }

    #[test]
    fn zero_length_is_refused() {
        assert!(Region::new(1, "t", 0).is_err());
    }

    /// Free 2 MiB huge pages of the machine (0 when unknown).
    fn free_huge_pages() -> usize {
        let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        (info.lines())
            .find_map(|l| l.strip_prefix("HugePages_Free:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn huge_pages_map_when_reserved_and_say_so_when_not() {
        let free = free_huge_pages();
        let err = Region::new_hugetlb(1, "t", (free + 1) * HUGE_PAGE_BYTES).unwrap_err();
        assert!(err.to_string().contains("vm.nr_hugepages"), "{err}");
        if free == 0 {
            return; // nothing reserved on this machine: only the error path runs
        }
        let r = Region::new_hugetlb(1, "t", 5000).unwrap();
        assert!(r.is_hugetlb());
        assert_eq!(r.len(), HUGE_PAGE_BYTES);
        let ro = map_readonly(r.client_fd(), r.len()).unwrap();
        // SAFETY: both mappings are r.len() bytes.
        unsafe {
            r.as_ptr().add(HUGE_PAGE_BYTES - 1).write(0x5a);
            assert_eq!(ro.as_ptr().add(HUGE_PAGE_BYTES - 1).read_volatile(), 0x5a);
            unmap_readonly(ro, r.len());
        }
    }
}
