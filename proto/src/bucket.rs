//! The metadata bucket: one 64-byte unit of a target's hash map, read by
//! clients straight out of the bucket region.
//!
//! ```text
//! bytes  0..4   seq       u32  bumped by the (single) writer on every change
//! bytes  4..8   crc32     u32  over bytes 0..4 and 8..64
//! bytes  8..12  next      u32  index of the chained overflow bucket, 0 = none
//! bytes 12..16  reserved  u32  0
//! bytes 16..64  3 slots of 16 bytes:
//!        0..4   fingerprint u32  high 32 bits of the key hash, 0 = empty slot
//!        4..8   length      u32  record bytes in the log (header..padding)
//!        8..16  pointer     u64  log address (bits 0..48) | version low 16 bits (48..64)
//! ```
//!
//! A reader copies the 64 bytes (eight atomic 64-bit loads on shared memory)
//! and checks the CRC; a copy that mixed two generations of the bucket fails
//! it and is read again. See `FORMAT.md`.

use crate::FormatError;
use std::sync::atomic::{AtomicU64, Ordering};

pub const BUCKET_BYTES: usize = 64;
pub const SLOTS_PER_BUCKET: usize = 3;
pub const SLOT_BYTES: usize = 16;
pub const OFF_SEQ: usize = 0;
pub const OFF_CRC: usize = OFF_SEQ + 4;
pub const OFF_NEXT: usize = OFF_CRC + 4;
pub const OFF_RESERVED: usize = OFF_NEXT + 4;
pub const OFF_SLOTS: usize = OFF_RESERVED + 4;
/// Log addresses must fit in the pointer's low 48 bits.
pub const ADDR_BITS: u32 = 48;
pub const ADDR_MASK: u64 = (1 << ADDR_BITS) - 1;

const _: () = assert!(OFF_SLOTS + SLOTS_PER_BUCKET * SLOT_BYTES == BUCKET_BYTES);
const _: () = assert!(std::mem::size_of::<Bucket>() == BUCKET_BYTES);

/// One slot: where the newest record of a key lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Slot {
    pub fingerprint: u32,
    pub length: u32,
    pub addr: u64,
    /// Low 16 bits of the record's version.
    pub version_low: u16,
}

impl Slot {
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.fingerprint == 0
    }
    fn encode(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&self.fingerprint.to_le_bytes());
        out[4..8].copy_from_slice(&self.length.to_le_bytes());
        let ptr = (self.addr & ADDR_MASK) | (u64::from(self.version_low) << ADDR_BITS);
        out[8..16].copy_from_slice(&ptr.to_le_bytes());
    }
    #[inline]
    fn decode(b: &[u8]) -> Self {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[8..16]);
        let ptr = u64::from_le_bytes(w);
        Self {
            fingerprint: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            length: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            addr: ptr & ADDR_MASK,
            version_low: (ptr >> ADDR_BITS) as u16,
        }
    }
}

/// A bucket's 64 bytes, aligned as in the region.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Bucket(pub [u8; BUCKET_BYTES]);

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("seq", &self.seq())
            .field("next", &self.next())
            .field("slots", &self.slots())
            .finish()
    }
}

impl Default for Bucket {
    fn default() -> Self {
        let mut b = Self([0; BUCKET_BYTES]);
        b.seal();
        b
    }
}

impl Bucket {
    #[inline]
    pub fn seq(&self) -> u32 {
        u32::from_le_bytes([self.0[0], self.0[1], self.0[2], self.0[3]])
    }
    #[inline]
    pub fn stored_crc(&self) -> u32 {
        u32::from_le_bytes([self.0[4], self.0[5], self.0[6], self.0[7]])
    }
    #[inline]
    pub fn next(&self) -> u32 {
        u32::from_le_bytes([self.0[8], self.0[9], self.0[10], self.0[11]])
    }
    #[inline]
    pub fn slot(&self, i: usize) -> Slot {
        let s = OFF_SLOTS + i * SLOT_BYTES;
        Slot::decode(&self.0[s..s + SLOT_BYTES])
    }
    #[inline]
    pub fn slots(&self) -> [Slot; SLOTS_PER_BUCKET] {
        [self.slot(0), self.slot(1), self.slot(2)]
    }
    pub fn set_slot(&mut self, i: usize, slot: Slot) {
        let s = OFF_SLOTS + i * SLOT_BYTES;
        slot.encode(&mut self.0[s..s + SLOT_BYTES]);
    }
    pub fn set_next(&mut self, next: u32) {
        self.0[OFF_NEXT..OFF_NEXT + 4].copy_from_slice(&next.to_le_bytes());
    }

    /// CRC over everything but the CRC field.
    #[inline]
    pub fn compute_crc(&self) -> u32 {
        let mut h = crc32fast::Hasher::new();
        h.update(&self.0[..OFF_CRC]);
        h.update(&self.0[OFF_NEXT..]);
        h.finalize()
    }

    /// Bumps `seq` and stores the CRC: call after changing slots or `next`.
    pub fn seal(&mut self) {
        let seq = self.seq().wrapping_add(1);
        self.0[OFF_SEQ..OFF_SEQ + 4].copy_from_slice(&seq.to_le_bytes());
        self.0[OFF_RESERVED..OFF_SLOTS].fill(0);
        let crc = self.compute_crc();
        self.0[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Checks the CRC of a copy read from a region.
    #[inline]
    pub fn check(&self) -> Result<(), FormatError> {
        let stored = self.stored_crc();
        let computed = self.compute_crc();
        if stored != computed {
            return Err(FormatError::Checksum {
                what: "bucket",
                stored,
                computed,
            });
        }
        Ok(())
    }

    /// Slots whose fingerprint matches.
    #[inline]
    pub fn matching(&self, fingerprint: u32) -> impl Iterator<Item = Slot> + '_ {
        (0..SLOTS_PER_BUCKET)
            .map(|i| self.slot(i))
            .filter(move |s| s.fingerprint == fingerprint)
    }

    /// Copies a bucket out of shared memory with eight relaxed atomic loads.
    ///
    /// # Safety
    /// `src` must be valid for reads of 64 bytes and 8-byte aligned for the
    /// duration of the call; other processes may write it concurrently.
    pub unsafe fn load_shared(src: *const u8) -> Self {
        let mut out = [0u8; BUCKET_BYTES];
        for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
            // SAFETY: the caller guarantees 64 readable, aligned bytes; an
            // AtomicU64 has the size and alignment of u64.
            let word = unsafe { (*(src.add(i * 8) as *const AtomicU64)).load(Ordering::Acquire) };
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        Self(out)
    }

    /// Stores this bucket into shared memory with eight relaxed atomic stores.
    ///
    /// # Safety
    /// `dst` must be valid for writes of 64 bytes and 8-byte aligned, and the
    /// caller must be the only writer of that bucket.
    pub unsafe fn store_shared(&self, dst: *mut u8) {
        for (i, chunk) in self.0.chunks_exact(8).enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            // SAFETY: as for load_shared; single writer by contract.
            unsafe {
                (*(dst.add(i * 8) as *const AtomicU64))
                    .store(u64::from_le_bytes(w), Ordering::Release)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_roundtrip_and_crc_checks() {
        let mut b = Bucket::default();
        b.check().unwrap();
        let s = Slot {
            fingerprint: 0xdead_beef,
            length: 128,
            addr: 0x0012_3456_789a,
            version_low: 0xbeef,
        };
        b.set_slot(1, s);
        b.set_next(7);
        b.seal();
        b.check().unwrap();
        assert_eq!(b.slot(1), s);
        assert_eq!(b.next(), 7);
        assert_eq!(b.matching(0xdead_beef).count(), 1);
        let mut torn = b;
        torn.0[20] ^= 4;
        assert!(torn.check().is_err());
    }

    #[test]
    fn torn_copy_of_two_generations_is_detected() {
        let mut a = Bucket::default();
        let mut b = a;
        b.set_slot(
            0,
            Slot {
                fingerprint: 5,
                length: 72,
                addr: 4096,
                version_low: 2,
            },
        );
        b.seal();
        a.set_slot(
            0,
            Slot {
                fingerprint: 5,
                length: 80,
                addr: 8192,
                version_low: 3,
            },
        );
        a.seal();
        a.seal();
        for split in (8..64).step_by(8) {
            let mut mix = a;
            mix.0[split..].copy_from_slice(&b.0[split..]);
            if mix != a && mix != b {
                assert!(mix.check().is_err(), "split at {split} passed");
            }
        }
    }

    #[test]
    fn shared_load_store_roundtrip() {
        let mut region = [Bucket::default(); 2];
        let mut b = Bucket::default();
        b.set_slot(
            2,
            Slot {
                fingerprint: 9,
                length: 88,
                addr: 64,
                version_low: 1,
            },
        );
        b.seal();
        let dst = region[1].0.as_mut_ptr();
        // SAFETY: dst points to an aligned 64-byte bucket we own.
        unsafe { b.store_shared(dst) };
        // SAFETY: same bucket.
        let back = unsafe { Bucket::load_shared(region[1].0.as_ptr()) };
        assert_eq!(back, b);
        back.check().unwrap();
    }
}
