//! Process-wide allocator settings for Ferrite's binaries.
//!
//! Requests and replies carry buffers of up to a few MiB (file chunks, ior
//! transfers). With glibc's defaults a buffer above the (adaptive) mmap
//! threshold is a fresh mapping, and free memory at the top of a heap is
//! given back once it passes the trim threshold, so requests keep paying
//! page faults and the kernel zeroing pages again. Profiled in an io500 run
//! (4 tasks, 3 s stonewall): page-fault handling fell from 1.3–1.7 % of the
//! client's samples to 0.02–0.04 % with these settings.

/// Buffers below this come from the heap and are reused after a free.
const MMAP_THRESHOLD_BYTES: libc::c_int = 32 << 20;
/// Free memory at a heap's top is kept up to this much before it is trimmed.
const TRIM_THRESHOLD_BYTES: libc::c_int = 512 << 20;

/// Applies the settings; call once at the start of `main`, before threads
/// start. Returns `false` if the allocator refused them (not glibc, or an
/// out-of-range value): nothing breaks, requests are just slower.
pub fn tune_allocator() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only changes allocator parameters; called before
        // other threads allocate.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
        }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

#[cfg(all(test, target_env = "gnu"))]
mod tests {
    use super::*;

    /// Was the buffer given its own mapping (glibc's `IS_MMAPPED` bit in
    /// the chunk's size word, just before the pointer)?
    fn own_mapping(len: usize) -> bool {
        let v: Vec<u8> = Vec::with_capacity(len);
        // SAFETY: glibc puts the chunk's size word in the 8 bytes before
        // every pointer it returns; they are mapped and not ours to write,
        // only to read.
        let size_word = unsafe { (v.as_ptr() as *const usize).sub(1).read() };
        size_word & 2 != 0
    }

    #[test]
    fn big_buffers_come_from_the_heap_once_tuned() {
        // glibc's default: a fresh 16 MiB buffer is mapped (and unmapped
        // on free, faulting its pages in again next time); freeing it
        // raises the threshold to 16 MiB only.
        assert!(own_mapping(16 << 20));
        assert!(tune_allocator());
        assert!(!own_mapping(24 << 20));
        assert!(own_mapping(64 << 20));
    }
}
