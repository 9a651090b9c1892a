//! The client's bulk region: a memory file of its own that the engine maps
//! (on one host, over the Unix socket), so that extent data travels as
//! `(region_offset, len)` in `BulkWrite`/`BulkRead` frames instead of inside
//! them.
//!
//! [`BulkArea::create`] makes a memfd sealed against shrinking (the engine
//! accepts no other: a shrinking file would fault its accesses), maps it
//! read-write and cuts it into slots of [`BULK_SLOT_BYTES`] (one extent
//! piece each), followed by [`BULK_SMALL_PER_SLOT`] times as many small
//! slots of [`BULK_SMALL_SLOT_BYTES`] for small pieces (a 3901-byte
//! mdtest-hard file took a whole slot, so 128 slots served 128 of the 512
//! files 8 tasks had in flight, and the rest travelled inside the frames;
//! with 256 files a task, 1024 small slots still left 1024 of 2048 to the
//! frames, whose megabyte bodies the engine allocated and faulted in anew).
//! Every connection of a [`Client`](super::Client) sends the same fd with
//! its Login. A request takes a slot with [`BulkArea::lease`]
//! and gives it back when its reply arrived ([`BulkLease::settle`]); no free
//! slot means the request carries its bytes in the frame as before.
//!
//! ```
//! use ferrite_client::client::bulk::BulkArea;
//!
//! let area = BulkArea::create(4).unwrap();
//! let lease = area.lease().unwrap();
//! lease.fill(b"abc");
//! let mut back = [0u8; 3];
//! lease.copy_to(&mut back);
//! assert_eq!(&back, b"abc");
//! ```

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferrite_proto::record::VALUE_MAX_BYTES;

use ferrite_proto::rpc::{Key, Placed, Reply, Request};

use crate::client::error::{Error, Result};
use crate::client::{reply, Client};
use crate::fabric::shm::memfd;

/// Bytes of one slot: the largest extent piece (a chunk of at most 1 MiB).
pub const BULK_SLOT_BYTES: usize = VALUE_MAX_BYTES;
/// Slots of a client's bulk area by default (the area's pages are only
/// backed once a request used them).
pub const BULK_SLOTS_DEFAULT: usize = 128;
/// Bytes of a small slot: pieces up to this long take one.
pub const BULK_SMALL_SLOT_BYTES: usize = 8 << 10;
/// Small slots per slot of an area: 128 slots come with 4096 small ones
/// (32 MiB), room for the 2048 files 8 io500 tasks have in flight, twice.
pub const BULK_SMALL_PER_SLOT: usize = 32;

/// A mapped, sealed memory file cut into slots.
pub struct BulkArea {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
    /// Slots, then small slots (their offsets follow the slots').
    slots: usize,
    free: Mutex<Vec<u32>>,
    free_small: Mutex<Vec<u32>>,
    /// Leases handed out so far.
    leased: AtomicU64,
}

// SAFETY: the mapping lives as long as the value; slots are handed out to
// one lease at a time (the free list), so no two users write one slot.
unsafe impl Send for BulkArea {}
// SAFETY: as for Send.
unsafe impl Sync for BulkArea {}

impl std::fmt::Debug for BulkArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BulkArea")
            .field("len", &self.len)
            .field("fd", &self.fd.as_raw_fd())
            .finish()
    }
}

fn os_error(op: &'static str) -> Error {
    Error::io(op, std::io::Error::last_os_error())
}

impl BulkArea {
    /// A bulk area of `slots` slots and [`BULK_SMALL_PER_SLOT`] small
    /// slots per slot.
    pub fn create(slots: usize) -> Result<Arc<Self>> {
        let per_slot = BULK_SLOT_BYTES + BULK_SMALL_PER_SLOT * BULK_SMALL_SLOT_BYTES;
        let len = slots
            .checked_mul(per_slot)
            .filter(|&l| l > 0 && slots <= (u32::MAX as usize) / BULK_SMALL_PER_SLOT)
            .ok_or_else(|| Error::InvalidArgument(format!("bulk area of {slots} slots")))?;
        let fd = memfd("ferrite-bulk", len as u64)?;
        let raw = fd.as_raw_fd();
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on our own fd.
        if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, seals) } != 0 {
            return Err(os_error("sealing the bulk region"));
        }
        // SAFETY: a fresh shared mapping of the `len` bytes of our file.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(os_error("mmap (bulk region)"));
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| os_error("mmap (bulk region)"))?;
        // Lowest slots last, so they are handed out first and reused.
        let free = (0..slots as u32).rev().collect();
        let free_small = (0..(slots * BULK_SMALL_PER_SLOT) as u32).rev().collect();
        Ok(Arc::new(Self {
            fd,
            ptr,
            len,
            slots,
            free: Mutex::new(free),
            free_small: Mutex::new(free_small),
            leased: AtomicU64::new(0),
        }))
    }

    /// The memory file, to send to the engine with a Login.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Bytes of the area.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: an area has at least one slot.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slots (not small ones) free now.
    pub fn free_slots(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Bytes of the free slots, small ones included.
    pub fn free_bytes(&self) -> usize {
        let small = self.free_small.lock().unwrap_or_else(|e| e.into_inner());
        self.free_slots() * BULK_SLOT_BYTES + small.len() * BULK_SMALL_SLOT_BYTES
    }

    /// Leases handed out since the area was made (requests that went
    /// through it).
    pub fn leases_total(&self) -> u64 {
        self.leased.load(Ordering::Relaxed)
    }

    /// A free slot, or `None` when every slot is in use.
    pub fn lease(self: &Arc<Self>) -> Option<BulkLease> {
        let slot = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
        Some(self.leased(slot, false))
    }

    /// A free slot for `len` bytes: a small one when they fit one and one
    /// is free, else a slot; `None` when none is free or `len` is over a
    /// slot.
    pub fn lease_for(self: &Arc<Self>, len: usize) -> Option<BulkLease> {
        if len > BULK_SLOT_BYTES {
            return None;
        }
        if len <= BULK_SMALL_SLOT_BYTES {
            let small = self
                .free_small
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop();
            if let Some(slot) = small {
                return Some(self.leased(slot, true));
            }
        }
        self.lease()
    }

    fn leased(self: &Arc<Self>, slot: u32, small: bool) -> BulkLease {
        self.leased.fetch_add(1, Ordering::Relaxed);
        BulkLease {
            area: self.clone(),
            slot,
            small,
            lost: false,
        }
    }
}

impl Drop for BulkArea {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `create`; leases hold an Arc,
        // so none outlives it.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One slot of a bulk area, owned until dropped (then free again) or
/// leaked with [`BulkLease::settle`] when the engine may still use it.
#[derive(Debug)]
pub struct BulkLease {
    area: Arc<BulkArea>,
    slot: u32,
    /// A small slot (of [`BULK_SMALL_SLOT_BYTES`]).
    small: bool,
    /// Given up: not returned to the free list on drop.
    lost: bool,
}

impl BulkLease {
    /// The slot's offset in the area: the `region_offset` of a request.
    pub fn offset(&self) -> u64 {
        let slot = self.slot as u64;
        match self.small {
            true => {
                (self.area.slots * BULK_SLOT_BYTES) as u64 + slot * BULK_SMALL_SLOT_BYTES as u64
            }
            false => slot * BULK_SLOT_BYTES as u64,
        }
    }

    /// Bytes of the slot.
    pub fn capacity(&self) -> usize {
        match self.small {
            true => BULK_SMALL_SLOT_BYTES,
            false => BULK_SLOT_BYTES,
        }
    }

    fn ptr(&self) -> *mut u8 {
        // SAFETY: the slot (a small one after the slots) lies inside the
        // mapping: `create` sized it for every slot.
        unsafe { self.area.ptr.as_ptr().add(self.offset() as usize) }
    }

    /// Copies `data` (at most [`capacity`](Self::capacity)) to the start
    /// of the slot.
    pub fn fill(&self, data: &[u8]) {
        assert!(data.len() <= self.capacity(), "bulk fill over a slot");
        // SAFETY: in the slot (asserted); only this lease writes the slot,
        // and the engine reads it only while a request naming it runs.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr(), data.len()) };
    }

    /// Copies the first `out.len()` bytes of the slot into `out`.
    pub fn copy_to(&self, out: &mut [u8]) {
        assert!(out.len() <= self.capacity(), "bulk copy over a slot");
        // SAFETY: in the slot (asserted); the engine wrote it before its
        // reply, which happened before this call.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(), out.as_mut_ptr(), out.len()) };
    }

    /// Ends the lease once the outcome of the request that named it is
    /// known: an answer from the engine (even an error) means the engine is
    /// done with the slot, which is free again; no answer (the connection
    /// broke, the wait timed out) means it may still write there, so the
    /// slot is never reused.
    pub fn settle<T>(self, outcome: &Result<T>) {
        if outcome.is_err() {
            self.abandon();
        }
    }

    /// Gives the slot up for good (the engine may still write it; the area
    /// is still unmapped when the client goes).
    pub fn abandon(mut self) {
        self.lost = true;
    }
}

impl Drop for BulkLease {
    fn drop(&mut self) {
        if self.lost {
            return;
        }
        let list = match self.small {
            true => &self.area.free_small,
            false => &self.area.free,
        };
        list.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.slot);
    }
}

impl Client {
    /// Whether extent data can travel through the bulk region.
    pub fn bulk_enabled(&self) -> bool {
        self.bulk.is_some()
    }

    /// The bulk region every connection offered and the engine mapped.
    pub fn bulk_area(&self) -> Option<&Arc<BulkArea>> {
        self.bulk.as_ref()
    }

    fn bulk_lease(&self, len: usize) -> Option<BulkLease> {
        self.bulk.as_ref().and_then(|area| area.lease_for(len))
    }

    /// The request writing `data` at `offset` of the array under `key`: a
    /// BulkWrite with the bytes copied into a slot of the bulk region when
    /// one is free (and the lease on it, to [`settle`](BulkLease::settle)
    /// once answered), else an ExtentWrite carrying them.
    pub fn extent_write_request(
        &self,
        key: Key,
        offset: u64,
        data: &[u8],
    ) -> (Request, Option<BulkLease>) {
        match self.bulk_lease(data.len()) {
            Some(lease) => {
                lease.fill(data);
                let req = Request::BulkWrite {
                    key,
                    offset,
                    region_offset: lease.offset(),
                    len: data.len() as u32,
                };
                (req, Some(lease))
            }
            None => {
                let data = data.to_vec();
                (Request::ExtentWrite { key, offset, data }, None)
            }
        }
    }

    /// The request reading `len` bytes at `offset` of the array under
    /// `key`: a BulkRead into a free slot of the bulk region (with its
    /// lease), else an ExtentRead. Its outcome goes to
    /// [`extent_read_outcome`](Self::extent_read_outcome).
    pub fn extent_read_request(
        &self,
        key: Key,
        offset: u64,
        len: u32,
    ) -> (Request, Option<BulkLease>) {
        match self.bulk_lease(len as usize) {
            Some(lease) => {
                let region_offset = lease.offset();
                let req = Request::BulkRead {
                    key,
                    offset,
                    region_offset,
                    len,
                };
                (req, Some(lease))
            }
            None => (Request::ExtentRead { key, offset, len }, None),
        }
    }

    /// Fills `out` (the read's `len` bytes) from the outcome of an
    /// [`extent_read_request`](Self::extent_read_request), holes and an
    /// absent array as zeros, and settles its lease. Returns the array's
    /// version, `None` if it does not exist.
    pub fn extent_read_outcome(
        &self,
        lease: Option<BulkLease>,
        outcome: Result<Reply>,
        out: &mut [u8],
    ) -> Result<Option<u64>> {
        if let Some(lease) = lease {
            let reply = match outcome {
                Ok(reply) => reply,
                Err(e) => {
                    lease.abandon();
                    return Err(e);
                }
            };
            // An answer arrived: the engine is done with the slot, which
            // holds what it placed; the lease frees it once copied out.
            return match reply {
                Reply::Placed(Some(Placed { version, len })) if len as usize == out.len() => {
                    lease.copy_to(out);
                    Ok(Some(version))
                }
                Reply::Placed(None) => {
                    out.fill(0);
                    Ok(None)
                }
                Reply::Placed(Some(p)) => Err(Error::Protocol {
                    url: self.url(),
                    detail: format!("bulk read of {} bytes placed {}", out.len(), p.len),
                }),
                other => Err(reply::unexpected("extent read", other)),
            };
        }
        let found = reply::value("extent read", outcome?)?;
        let value = found.as_ref().map_or(&[][..], |f| &f.value[..]);
        let k = value.len().min(out.len());
        out[..k].copy_from_slice(&value[..k]);
        out[k..].fill(0);
        Ok(found.map(|f| f.version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_leased_once_and_come_back() {
        let area = BulkArea::create(2).unwrap();
        let a = area.lease().unwrap();
        let b = area.lease().unwrap();
        assert_ne!(a.offset(), b.offset());
        assert!(area.lease().is_none(), "both slots in use");
        drop(a);
        assert_eq!(area.free_slots(), 1);
        // A request without an answer keeps its slot out of use for good.
        let lost: Result<()> = Err(Error::InvalidArgument("gone".into()));
        b.settle(&lost);
        assert_eq!(area.free_slots(), 1);
        let c = area.lease().unwrap();
        c.fill(&[7; 10]);
        let mut back = [0; 10];
        c.copy_to(&mut back);
        assert_eq!(back, [7; 10]);
        c.settle(&Ok(()));
        assert_eq!(area.free_slots(), 1);
    }

    /// Pieces that fit a small slot take one (up to 8 per slot, past the
    /// slots), bigger ones or those that find no small slot free take a
    /// slot, and every slot comes back.
    #[test]
    fn small_pieces_take_small_slots() {
        let area = BulkArea::create(1).unwrap();
        let small: Vec<BulkLease> = (0..BULK_SMALL_PER_SLOT)
            .map(|_| area.lease_for(3901).unwrap())
            .collect();
        let mut offsets: Vec<u64> = small.iter().map(BulkLease::offset).collect();
        offsets.sort_unstable();
        offsets.dedup();
        assert_eq!(offsets.len(), BULK_SMALL_PER_SLOT);
        assert!(offsets[0] >= BULK_SLOT_BYTES as u64);
        let last = offsets[BULK_SMALL_PER_SLOT - 1] as usize + BULK_SMALL_SLOT_BYTES;
        assert_eq!(last, area.len());
        for (i, l) in small.iter().enumerate() {
            l.fill(&[i as u8; 3901]);
        }
        for (i, l) in small.iter().enumerate() {
            let mut back = vec![0; 3901];
            l.copy_to(&mut back);
            assert!(back.iter().all(|&b| b == i as u8), "small slot {i}");
        }
        // No small slot left: the next small piece takes the slot.
        let big = area.lease_for(10).unwrap();
        assert_eq!((big.offset(), big.capacity()), (0, BULK_SLOT_BYTES));
        assert!(area.lease_for(BULK_SMALL_SLOT_BYTES + 1).is_none());
        assert!(area.lease_for(BULK_SLOT_BYTES + 1).is_none());
        drop(small);
        drop(big);
        assert_eq!(area.free_bytes(), area.len());
        let again = area.lease_for(BULK_SMALL_SLOT_BYTES + 1).unwrap();
        assert_eq!(again.capacity(), BULK_SLOT_BYTES);
    }

    #[test]
    fn the_area_is_a_sealed_memfd() {
        let area = BulkArea::create(1).unwrap();
        // SAFETY: fcntl on the area's own fd.
        let seals = unsafe { libc::fcntl(area.raw_fd(), libc::F_GET_SEALS) };
        assert!(seals & libc::F_SEAL_SHRINK != 0);
        // SAFETY: as above; shrinking must fail.
        assert_ne!(unsafe { libc::ftruncate(area.raw_fd(), 0) }, 0);
    }
}
