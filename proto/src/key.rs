//! Keys and the hashes that place them.
//!
//! A record's key is (container, object, dkey, akey) as in DAOS. The dkey
//! hash decides the target; the full key hash decides the bucket and the
//! slot fingerprint. Both sides compute these with the functions here.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Longest dkey or akey accepted, in bytes.
pub const KEY_PART_MAX_BYTES: usize = 4096;

/// A record's full key, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordKey<'a> {
    pub container: u64,
    pub object: u128,
    pub dkey: &'a [u8],
    pub akey: &'a [u8],
}

impl<'a> RecordKey<'a> {
    #[inline]
    pub fn new(container: u64, object: u128, dkey: &'a [u8], akey: &'a [u8]) -> Self {
        Self {
            container,
            object,
            dkey,
            akey,
        }
    }

    /// Hash of (container, object, dkey): decides the owning target.
    #[inline]
    pub fn dkey_hash(&self) -> u64 {
        dkey_hash(self.container, self.object, self.dkey)
    }

    /// Hash of the whole key: decides bucket and fingerprint.
    #[inline]
    pub fn hash(&self) -> KeyHash {
        KeyHash(xxh3_64_with_seed(self.akey, self.dkey_hash()))
    }

    /// Checks the key parts' lengths.
    pub fn validate(&self) -> Result<(), crate::FormatError> {
        for (field, part) in [("dkey", self.dkey), ("akey", self.akey)] {
            if part.len() > KEY_PART_MAX_BYTES {
                return Err(crate::FormatError::Range {
                    what: "key",
                    field,
                    value: part.len() as u64,
                });
            }
        }
        Ok(())
    }
}

/// Hash of (container, object, dkey).
#[inline]
pub fn dkey_hash(container: u64, object: u128, dkey: &[u8]) -> u64 {
    let mut prefix = [0u8; 24];
    prefix[..8].copy_from_slice(&container.to_le_bytes());
    prefix[8..].copy_from_slice(&object.to_le_bytes());
    xxh3_64_with_seed(dkey, xxh3_64(&prefix))
}

/// The 64-bit hash of a full key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash(pub u64);

impl KeyHash {
    /// Main-area bucket index (`main_bucket_count` ≥ 1, < 2^32): the low
    /// bits of the hash when the count is a power of two; otherwise the
    /// low 32 bits scaled to the count (`low32 × count >> 32`, a multiply
    /// instead of a division), so that a table can be sized to any count.
    /// Both use only the low 32 bits, which the fingerprint does not.
    #[inline]
    pub fn bucket_index(self, main_bucket_count: u64) -> u64 {
        debug_assert!((1..=u64::from(u32::MAX)).contains(&main_bucket_count));
        if main_bucket_count.is_power_of_two() {
            self.0 & (main_bucket_count - 1)
        } else {
            (u64::from(self.0 as u32) * main_bucket_count) >> 32
        }
    }

    /// Slot fingerprint: the high 32 bits, never 0 (0 marks an empty slot).
    #[inline]
    pub fn fingerprint(self) -> u32 {
        match (self.0 >> 32) as u32 {
            0 => 1,
            f => f,
        }
    }
}

/// Jump consistent hash (Lamping & Veach): the target that owns a dkey hash.
#[inline]
pub fn target_of(dkey_hash: u64, target_count: u32) -> u32 {
    assert!(target_count > 0, "target_count must be positive");
    let mut key = dkey_hash;
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < i64::from(target_count) {
        b = j;
        key = key.wrapping_mul(2862933555777941757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A power-of-two count indexes by mask (the layout stores had before);
    /// any other count scales the low 32 bits: always in range, spread
    /// evenly, and blind to the high 32 bits (the fingerprint's).
    #[test]
    fn bucket_index_fits_any_main_count() {
        let h = |i: u64| KeyHash(xxh3_64(&i.to_le_bytes()));
        for i in 0..1000 {
            assert_eq!(h(i).bucket_index(1 << 12), h(i).0 & 0xfff);
        }
        for main in [3u64, 1000, 3000, 444_445, u64::from(u32::MAX)] {
            for i in 0..1000 {
                assert!(h(i).bucket_index(main) < main);
            }
        }
        let main = 3000u64;
        let mut counts = vec![0u32; main as usize];
        for i in 0..300_000 {
            counts[h(i).bucket_index(main) as usize] += 1;
        }
        let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(
            *lo >= 50 && *hi <= 160,
            "100 per bucket expected: {lo}..{hi}"
        );
        let k = KeyHash(0x1234_5678_9abc_def0);
        assert_eq!(
            k.bucket_index(main),
            KeyHash(0xffff_ffff_9abc_def0).bucket_index(main)
        );
    }

    #[test]
    fn jump_hash_is_stable_and_spreads() {
        let mut counts = [0u32; 4];
        for i in 0..4000u64 {
            let t = target_of(dkey_hash(1, u128::from(i), b"d"), 4);
            counts[t as usize] += 1;
        }
        for c in counts {
            assert!(c > 800, "uneven spread {counts:?}");
        }
        assert_eq!(target_of(12345, 1), 0);
    }

    #[test]
    fn jump_hash_moves_few_keys_when_growing() {
        let moved = (0..10_000u64)
            .filter(|i| {
                let h = dkey_hash(7, 0, &i.to_le_bytes());
                target_of(h, 4) != target_of(h, 5)
            })
            .count();
        assert!(moved < 3000, "moved {moved} of 10000");
    }

    #[test]
    fn fingerprint_never_zero() {
        assert_eq!(KeyHash(0x0000_0000_ffff_ffff).fingerprint(), 1);
        assert_eq!(KeyHash(0x1234_5678_0000_0000).fingerprint(), 0x1234_5678);
    }

    #[test]
    fn akey_changes_hash_not_target() {
        let a = RecordKey::new(1, 2, b"d", b"a1");
        let b = RecordKey::new(1, 2, b"d", b"a2");
        assert_eq!(a.dkey_hash(), b.dkey_hash());
        assert_ne!(a.hash(), b.hash());
    }
}
