//! Fences: fixed-size, order-keeping summaries of the blocks' first keys,
//! which the block search compares instead of the keys.

use super::{first_key, OBJ_BYTES};

/// Bytes of a dkey, and of an akey, that a [`Fence`] keeps.
const FENCE_DKEY: usize = 16;
const FENCE_AKEY: usize = 8;
/// The summary's bytes: object, dkey, dkey length, akey, akey length.
const FENCE_BYTES: usize = OBJ_BYTES + FENCE_DKEY + 1 + FENCE_AKEY + 1;
const FENCE_WORDS: usize = FENCE_BYTES.div_ceil(8);

/// A fixed-size summary of a key that keeps its order: keys whose fences
/// differ are ordered as their fences; equal fences leave it to the keys.
/// Each part is the first bytes, zero-padded, then the length capped at
/// one more than what is kept; the akey counts only when the whole dkey is
/// kept (else two dkeys with the same first 16 bytes would be ordered by
/// their akeys). The parts' bytes are held as big-endian words, zero-padded
/// at the end, so that comparing the words compares the bytes in order
/// (a few integer compares where bytes took a `memcmp` per part).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Fence([u64; FENCE_WORDS]);

impl Fence {
    pub(super) fn new(obj: &[u8; OBJ_BYTES], dkey: &[u8], akey: &[u8]) -> Self {
        let mut b = [0u8; FENCE_WORDS * 8];
        b[..OBJ_BYTES].copy_from_slice(obj);
        let n = dkey.len().min(FENCE_DKEY);
        let at = OBJ_BYTES;
        b[at..at + n].copy_from_slice(&dkey[..n]);
        let at = at + FENCE_DKEY;
        b[at] = dkey.len().min(FENCE_DKEY + 1) as u8;
        if dkey.len() <= FENCE_DKEY {
            let m = akey.len().min(FENCE_AKEY);
            b[at + 1..at + 1 + m].copy_from_slice(&akey[..m]);
            b[at + 1 + FENCE_AKEY] = akey.len().min(FENCE_AKEY + 1) as u8;
        }
        let mut words = [0u64; FENCE_WORDS];
        for (w, chunk) in words.iter_mut().zip(b.chunks_exact(8)) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            *w = u64::from_be_bytes(word);
        }
        Fence(words)
    }

    /// The fence of a block: of its first key.
    pub(super) fn of_block(b: &[u8]) -> Self {
        let (c, dkey_len) = first_key(b);
        let d = OBJ_BYTES + dkey_len;
        let mut obj = [0u8; OBJ_BYTES];
        obj.copy_from_slice(&c[..OBJ_BYTES]);
        Self::new(&obj, &c[OBJ_BYTES..d], &c[d..])
    }
}
