//! DMA-aligned I/O buffers.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of every [`IoBuf`]: enough for O_DIRECT on any device here.
pub const IO_ALIGN: usize = 4096;

/// An owned, aligned, zero-initialised byte buffer handed to a channel and
/// back. Ownership moves into the operation so the device may use it until
/// completion.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
}

// SAFETY: IoBuf uniquely owns its allocation, like Vec<u8>.
unsafe impl Send for IoBuf {}
// SAFETY: shared access only reads, like &Vec<u8>.
unsafe impl Sync for IoBuf {}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl IoBuf {
    /// A zeroed buffer of `len` bytes, capacity rounded up to [`IO_ALIGN`].
    pub fn new(len: usize) -> Self {
        let capacity = len.max(1).div_ceil(IO_ALIGN) * IO_ALIGN;
        let layout =
            Layout::from_size_align(capacity, IO_ALIGN).expect("IoBuf layout: capacity overflow");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self { ptr, len, capacity }
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
        let layout = Layout::from_size_align(self.capacity, IO_ALIGN)
            .expect("layout was valid at allocation");
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) };
    }
}
