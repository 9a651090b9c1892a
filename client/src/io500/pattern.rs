//! The data every write phase stores and every read phase checks.
//!
//! Each file gets a 64-bit *key* derived from the run, the phase, the writing task and the
//! file's index ([`file_key`]). The byte at file offset `o` is byte `o % 8` (little-endian) of
//! the word `key ^ ((o / 8) * ODD)`, where `ODD` is an odd constant. The word function is a
//! bijection of the word index for a fixed key, so data written at the wrong offset, into the
//! wrong file, or by an earlier run (another run seed) does not verify. Filling and checking
//! cost one add and one xor per 8 bytes.
//!
//! ```
//! use ferrite_client::io500::pattern::{file_key, fill, count_mismatches};
//! let key = file_key(7, 1, 0, 42);
//! let mut buf = vec![0u8; 100];
//! fill(&mut buf, key, 3);
//! assert_eq!(count_mismatches(&buf, key, 3), 0);
//! buf[50] ^= 1;
//! assert_eq!(count_mismatches(&buf, key, 3), 1);
//! ```

/// Step between consecutive words' values (odd, so `w * ODD` is a bijection mod 2^64).
const ODD: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finalizer: spreads every input bit over the output.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of one file: distinct for distinct (`run_seed`, `phase_tag`, `task`, `index`).
pub fn file_key(run_seed: u64, phase_tag: u8, task: u32, index: u64) -> u64 {
    let a = mix64(run_seed ^ (u64::from(phase_tag) << 56) ^ u64::from(task));
    mix64(a ^ mix64(index.wrapping_add(0x632B_E59B_D9B4_E019)))
}

fn word(key: u64, word_index: u64) -> u64 {
    key ^ word_index.wrapping_mul(ODD)
}

/// The expected byte at file offset `offset` of the file with `key`.
pub fn byte_at(key: u64, offset: u64) -> u8 {
    word(key, offset / 8).to_le_bytes()[(offset % 8) as usize]
}

/// Splits a buffer that starts at file offset `offset` into an unaligned head (bytes before
/// the first 8-aligned offset) and the rest.
fn head_len(len: usize, offset: u64) -> usize {
    let misalign = (offset % 8) as usize;
    if misalign == 0 {
        0
    } else {
        (8 - misalign).min(len)
    }
}

/// Fills `buf` with the pattern of the file with `key`, as if `buf` sits at `offset`.
pub fn fill(buf: &mut [u8], key: u64, offset: u64) {
    let head = head_len(buf.len(), offset);
    let (head_bytes, rest) = buf.split_at_mut(head);
    for (i, b) in head_bytes.iter_mut().enumerate() {
        *b = byte_at(key, offset + i as u64);
    }
    let start = offset + head as u64;
    let rest_len = rest.len();
    let mut chunks = rest.chunks_exact_mut(8);
    let mut step = (start / 8).wrapping_mul(ODD);
    for chunk in &mut chunks {
        chunk.copy_from_slice(&(key ^ step).to_le_bytes());
        step = step.wrapping_add(ODD);
    }
    let tail = chunks.into_remainder();
    let tail_start = start + (rest_len - tail.len()) as u64;
    for (i, b) in tail.iter_mut().enumerate() {
        *b = byte_at(key, tail_start + i as u64);
    }
}

/// Bytes compared per block by [`count_mismatches`]: the expected block is generated on the
/// stack and compared with `memcmp`; bytes are counted only in blocks that differ.
const VERIFY_BLOCK_BYTES: usize = 4096;

/// How many bytes of `buf` differ from the pattern of the file with `key` at `offset`.
pub fn count_mismatches(buf: &[u8], key: u64, offset: u64) -> u64 {
    let mut expected = [0u8; VERIFY_BLOCK_BYTES];
    let mut bad = 0u64;
    let mut block_offset = offset;
    for block in buf.chunks(VERIFY_BLOCK_BYTES) {
        let expected = &mut expected[..block.len()];
        fill(expected, key, block_offset);
        if block != expected {
            bad += block
                .iter()
                .zip(expected.iter())
                .filter(|(a, b)| a != b)
                .count() as u64;
        }
        block_offset += block.len() as u64;
    }
    bad
}

/// Checks a read that was asked for `expected_len` bytes and got `buf`: bytes that differ from
/// the pattern plus bytes missing because the read came back short.
pub fn verify_read(buf: &[u8], expected_len: usize, key: u64, offset: u64) -> u64 {
    let missing = expected_len.saturating_sub(buf.len()) as u64;
    count_mismatches(buf, key, offset) + missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_matches_byte_at_for_every_alignment() {
        let key = file_key(1, 2, 3, 4);
        for offset in 0..17u64 {
            for len in [0usize, 1, 5, 8, 9, 31, 64] {
                let mut buf = vec![0u8; len];
                fill(&mut buf, key, offset);
                for (i, &b) in buf.iter().enumerate() {
                    assert_eq!(b, byte_at(key, offset + i as u64), "offset {offset} i {i}");
                }
                assert_eq!(count_mismatches(&buf, key, offset), 0);
            }
        }
    }

    #[test]
    fn each_corrupted_byte_is_counted() {
        let key = file_key(9, 1, 0, 0);
        let mut buf = vec![0u8; 47008];
        fill(&mut buf, key, 47008 * 3);
        for (pos, count) in [(0usize, 1u64), (47007, 2), (12345, 3), (12346, 4)] {
            buf[pos] = buf[pos].wrapping_add(1);
            assert_eq!(count_mismatches(&buf, key, 47008 * 3), count);
        }
    }

    #[test]
    fn data_from_another_offset_file_task_or_run_does_not_verify() {
        let key = file_key(5, 1, 2, 3);
        let mut buf = vec![0u8; 4096];
        fill(&mut buf, key, 8192);
        assert_eq!(count_mismatches(&buf, key, 8192), 0);
        // A different key flips the same bytes of every word (those where the keys differ),
        // so at least one byte per 8 and in practice almost all.
        assert!(count_mismatches(&buf, key, 8200) > 512, "shifted offset");
        for other in [
            file_key(5, 1, 2, 4),
            file_key(5, 1, 3, 3),
            file_key(6, 1, 2, 3),
            file_key(5, 2, 2, 3),
        ] {
            assert_ne!(other, key);
            assert!(count_mismatches(&buf, other, 8192) >= 512);
        }
    }

    #[test]
    fn short_read_counts_missing_bytes() {
        let key = file_key(1, 1, 1, 1);
        let mut buf = vec![0u8; 3901];
        fill(&mut buf, key, 0);
        assert_eq!(verify_read(&buf[..3900], 3901, key, 0), 1);
        assert_eq!(verify_read(&buf, 3901, key, 0), 0);
    }
}
