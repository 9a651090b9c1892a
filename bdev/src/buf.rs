//! DMA-aligned I/O buffers and the per-channel pool they come from.
//!
//! An [`IoBuf`] is either a heap allocation of its own or a slot of a
//! [`BufPool`] slab. A pool slot goes back to its pool when the buffer is
//! dropped, so a channel allocates its buffers once, at start-up, and the
//! hot path never calls the allocator. The `uring` backend registers the slab
//! with its ring (fixed buffers).
//!
//! ```
//! use ferrite_bdev::buf::BufPool;
//!
//! let pool = BufPool::new(4096, 2).unwrap();
//! let a = pool.alloc(4096).unwrap();
//! let b = pool.alloc(512).unwrap();
//! assert!(pool.alloc(4096).is_none()); // both slots in use
//! drop(a);
//! assert!(pool.alloc(4096).is_some()); // back on drop
//! assert!(pool.contains(b.as_ptr()));
//! ```

use crossbeam_queue::ArrayQueue;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of every [`IoBuf`]: enough for O_DIRECT on any device here.
pub const IO_ALIGN: usize = 4096;

/// An owned, aligned, zero-initialised byte buffer handed to a channel and
/// back. Ownership moves into the operation so the device may use it until
/// completion.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
    backing: Backing,
}

/// Whose memory an [`IoBuf`] is.
enum Backing {
    /// Its own heap allocation.
    Heap,
    /// A slot of a pool slab.
    Pool(Arc<PoolShared>),
    /// Memory owned elsewhere ([`IoBuf::foreign`]), kept alive by this.
    Foreign {
        _keep: Arc<dyn std::any::Any + Send + Sync>,
    },
}

// SAFETY: IoBuf uniquely owns its allocation (or pool slot), like Vec<u8>.
unsafe impl Send for IoBuf {}
// SAFETY: shared access only reads, like &Vec<u8>.
unsafe impl Sync for IoBuf {}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field("pooled", &self.is_pooled())
            .field("foreign", &self.is_foreign())
            .finish()
    }
}

fn aligned_layout(capacity: usize) -> Layout {
    match Layout::from_size_align(capacity, IO_ALIGN) {
        Ok(l) => l,
        // Only reachable for sizes near usize::MAX, which no device accepts.
        Err(_) => panic!("IoBuf layout: capacity {capacity} overflows"),
    }
}

impl IoBuf {
    /// A zeroed heap buffer of `len` bytes, capacity rounded up to [`IO_ALIGN`].
    pub fn new(len: usize) -> Self {
        let capacity = len.max(1).div_ceil(IO_ALIGN) * IO_ALIGN;
        let layout = aligned_layout(capacity);
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self {
            ptr,
            len,
            capacity,
            backing: Backing::Heap,
        }
    }

    /// A buffer of `len` bytes at `ptr` in memory that `keep` owns (a
    /// mapped region, say): a device writes it from there, with no copy
    /// into a buffer of its own. Dropping it frees nothing but `keep`.
    ///
    /// # Safety
    /// The `len` bytes at `ptr` must stay mapped while `keep` lives, and
    /// nothing may write them while the buffer (or a device operation it
    /// was handed to) lives, nor read them while it is written into.
    pub unsafe fn foreign(
        ptr: NonNull<u8>,
        len: usize,
        keep: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        Self {
            ptr,
            len,
            capacity: len,
            backing: Backing::Foreign { _keep: keep },
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// True when the buffer is a slot of a [`BufPool`].
    pub fn is_pooled(&self) -> bool {
        matches!(self.backing, Backing::Pool(_))
    }
    /// True when the memory is owned elsewhere ([`IoBuf::foreign`]).
    pub fn is_foreign(&self) -> bool {
        matches!(self.backing, Backing::Foreign { .. })
    }
    /// Sets the length (≤ capacity); bytes past the old length keep their contents.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity,
            "IoBuf::set_len {len} > capacity {}",
            self.capacity
        );
        self.len = len;
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for capacity ≥ len initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        match &self.backing {
            // The queue has room for every slot, so the push cannot fail;
            // if it ever did the slot would merely leak until the slab dies.
            Backing::Pool(pool) => {
                let _ = pool.free.push(self.ptr.as_ptr() as usize);
            }
            // SAFETY: allocated in `new` with this layout.
            Backing::Heap => unsafe { dealloc(self.ptr.as_ptr(), aligned_layout(self.capacity)) },
            Backing::Foreign { .. } => {}
        }
    }
}

/// The slab and free list behind a [`BufPool`], kept alive by every
/// buffer handed out so that a slot never outlives its memory.
struct PoolShared {
    slab: NonNull<u8>,
    slab_len: usize,
    slot_size: usize,
    free: ArrayQueue<usize>,
}

// SAFETY: the slab is only reached through IoBufs, which own their slot.
unsafe impl Send for PoolShared {}
// SAFETY: as above; the free list is a lock-free queue.
unsafe impl Sync for PoolShared {}

impl Drop for PoolShared {
    fn drop(&mut self) {
        // SAFETY: allocated in BufPool::new with this layout; every IoBuf
        // holding a slot keeps this struct alive, so none is left.
        unsafe { dealloc(self.slab.as_ptr(), aligned_layout(self.slab_len)) };
    }
}

/// A fixed set of equal, aligned slots allocated once (one slab).
#[derive(Clone)]
pub struct BufPool {
    shared: Arc<PoolShared>,
}

impl std::fmt::Debug for BufPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufPool")
            .field("slot_size", &self.shared.slot_size)
            .field("slots", &self.slots())
            .field("free", &self.shared.free.len())
            .finish()
    }
}

impl BufPool {
    /// `slots` zeroed slots of `slot_size` bytes (rounded up to
    /// [`IO_ALIGN`]). `None` when either is zero or the slab size overflows.
    pub fn new(slot_size: usize, slots: usize) -> Option<Self> {
        let slot_size = slot_size.checked_next_multiple_of(IO_ALIGN)?;
        let slab_len = slot_size.checked_mul(slots)?;
        if slab_len == 0 || Layout::from_size_align(slab_len, IO_ALIGN).is_err() {
            return None;
        }
        // SAFETY: non-zero size, valid layout (checked above).
        let raw = unsafe { alloc_zeroed(aligned_layout(slab_len)) };
        let slab = NonNull::new(raw)?;
        let free = ArrayQueue::new(slots);
        for i in 0..slots {
            let _ = free.push(slab.as_ptr() as usize + i * slot_size);
        }
        Some(Self {
            shared: Arc::new(PoolShared {
                slab,
                slab_len,
                slot_size,
                free,
            }),
        })
    }

    /// A slot holding `len` zeroed bytes, or `None` if `len` is larger than
    /// a slot, zero, or every slot is in use.
    pub fn alloc(&self, len: usize) -> Option<IoBuf> {
        if len == 0 || len > self.shared.slot_size {
            return None;
        }
        let addr = self.shared.free.pop()?;
        let ptr = NonNull::new(addr as *mut u8)?;
        // SAFETY: the slot is ours until the IoBuf drops; len ≤ slot_size.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Some(IoBuf {
            ptr,
            len,
            capacity: self.shared.slot_size,
            backing: Backing::Pool(Arc::clone(&self.shared)),
        })
    }

    pub fn slot_size(&self) -> usize {
        self.shared.slot_size
    }
    pub fn slots(&self) -> usize {
        self.shared.slab_len / self.shared.slot_size
    }
    /// Start and length of the slab, e.g. to register it with a ring.
    pub fn slab(&self) -> (*mut u8, usize) {
        (self.shared.slab.as_ptr(), self.shared.slab_len)
    }
    /// True when `ptr` points inside this pool's slab.
    pub fn contains(&self, ptr: *const u8) -> bool {
        let start = self.shared.slab.as_ptr() as usize;
        let p = ptr as usize;
        p >= start && p < start + self.shared.slab_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_slots_are_aligned_zeroed_and_recycled() {
        let pool = BufPool::new(8192, 3).unwrap();
        let mut a = pool.alloc(8192).unwrap();
        assert_eq!(a.as_ptr() as usize % IO_ALIGN, 0);
        a.as_mut_slice().fill(0xAB);
        drop(a);
        let bufs: Vec<_> = (0..3).map(|_| pool.alloc(4096).unwrap()).collect();
        assert!(bufs.iter().all(|b| b.as_slice().iter().all(|&x| x == 0)));
        assert!(pool.alloc(1).is_none());
        assert!(pool.alloc(8193).is_none());
        drop(pool);
        // Buffers keep the slab alive after the pool handle is gone.
        assert_eq!(bufs[2].len(), 4096);
    }

    #[test]
    fn bad_pool_sizes_are_refused() {
        assert!(BufPool::new(0, 4).is_none());
        assert!(BufPool::new(4096, 0).is_none());
        assert!(BufPool::new(usize::MAX, 2).is_none());
    }
}
