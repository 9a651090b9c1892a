//! The bucket cache: a bounded, direct-mapped copy of the buckets this
//! client has read, shared by all threads of a client without locks.
//!
//! An entry is a tag (target, bucket index) and the bucket's eight words,
//! all atomics. Writers clear the tag, store the words, then set the tag;
//! readers load tag, words, tag, and accept the copy only if both tags match
//! and the bucket's own CRC checks. Two writers racing on one entry can
//! leave a mix, which then fails the CRC (or, at worst, is a valid bucket
//! under the wrong tag): a cached bucket is only ever a hint, since every
//! record it leads to is checked against the key.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use ferrite_proto::bucket::{Bucket, BUCKET_BYTES};

const WORDS: usize = BUCKET_BYTES / 8;

#[derive(Default)]
#[repr(C, align(64))]
struct Entry {
    tag: AtomicU64,
    words: [AtomicU64; WORDS],
}

/// A bounded cache of buckets keyed by (target, bucket index).
pub struct BucketCache {
    entries: Box<[Entry]>,
    mask: usize,
}

impl std::fmt::Debug for BucketCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketCache")
            .field("capacity", &self.capacity())
            .finish()
    }
}

fn tag_of(target: u16, index: u64) -> u64 {
    // index < 2^47 (bucket regions are far smaller); +1 keeps 0 = empty.
    ((u64::from(target) << 47) | (index & ((1 << 47) - 1))) + 1
}

impl BucketCache {
    /// A cache of `capacity` buckets (rounded up to a power of two; 0
    /// disables caching).
    pub fn new(capacity: usize) -> Self {
        let n = if capacity == 0 {
            0
        } else {
            capacity.next_power_of_two()
        };
        Self {
            entries: (0..n).map(|_| Entry::default()).collect(),
            mask: n.saturating_sub(1),
        }
    }

    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    fn entry(&self, tag: u64) -> Option<&Entry> {
        if self.entries.is_empty() {
            return None;
        }
        let h = tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 17;
        self.entries.get(h as usize & self.mask)
    }

    /// The cached copy of a bucket, if any (CRC-checked).
    #[inline]
    pub fn get(&self, target: u16, index: u64) -> Option<Bucket> {
        let tag = tag_of(target, index);
        let e = self.entry(tag)?;
        if e.tag.load(Ordering::Acquire) != tag {
            return None;
        }
        let mut b = Bucket([0; BUCKET_BYTES]);
        for (chunk, w) in b.0.chunks_exact_mut(8).zip(&e.words) {
            chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        fence(Ordering::Acquire);
        if e.tag.load(Ordering::Relaxed) != tag || b.check().is_err() {
            return None;
        }
        Some(b)
    }

    /// Stores a bucket (replacing whatever shared its entry).
    pub fn put(&self, target: u16, index: u64, bucket: &Bucket) {
        let tag = tag_of(target, index);
        let Some(e) = self.entry(tag) else { return };
        e.tag.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        for (chunk, w) in bucket.0.chunks_exact(8).zip(&e.words) {
            let mut a = [0u8; 8];
            a.copy_from_slice(chunk);
            w.store(u64::from_le_bytes(a), Ordering::Relaxed);
        }
        e.tag.store(tag, Ordering::Release);
    }

    /// Forgets a bucket.
    pub fn invalidate(&self, target: u16, index: u64) {
        let tag = tag_of(target, index);
        if let Some(e) = self.entry(tag) {
            let _ = e
                .tag
                .compare_exchange(tag, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_proto::bucket::Slot;

    fn bucket(fp: u32) -> Bucket {
        let mut b = Bucket::default();
        b.set_slot(
            0,
            Slot {
                fingerprint: fp,
                length: 80,
                addr: 8,
                version_low: 1,
            },
        );
        b.seal();
        b
    }

    #[test]
    fn put_get_invalidate_and_bounded() {
        let c = BucketCache::new(3);
        assert_eq!(c.capacity(), 4);
        assert_eq!(c.get(0, 1), None);
        c.put(0, 1, &bucket(9));
        assert_eq!(c.get(0, 1), Some(bucket(9)));
        assert_eq!(c.get(1, 1), None, "other target");
        for i in 0..100 {
            c.put(2, i, &bucket(i as u32 + 1));
        }
        let held = (0..100).filter(|&i| c.get(2, i).is_some()).count();
        assert!(held <= 4 && held > 0, "held {held}");
        c.put(0, 7, &bucket(3));
        c.invalidate(0, 7);
        assert_eq!(c.get(0, 7), None);
        let off = BucketCache::new(0);
        off.put(0, 1, &bucket(1));
        assert_eq!(off.get(0, 1), None);
    }

    #[test]
    fn racing_writers_never_yield_a_bucket_that_was_not_put() {
        let c = std::sync::Arc::new(BucketCache::new(1));
        let valid: Vec<Bucket> = (1..=4).map(bucket).collect();
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let c = c.clone();
                let valid = valid.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000 {
                        c.put(0, 5, &valid[(i + w) % valid.len()]);
                    }
                })
            })
            .collect();
        for _ in 0..20_000 {
            if let Some(b) = c.get(0, 5) {
                assert!(valid.contains(&b), "mixed bucket {b:?}");
            }
        }
        for w in writers {
            w.join().unwrap();
        }
    }
}
