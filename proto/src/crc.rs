//! CRC32 (IEEE, as `crc32fast`) of bytes given in parts.
//!
//! `crc32fast` takes its carry-less-multiply path only for slices of 128
//! bytes or more and walks a table a byte at a time below that. A record's
//! covered bytes come in two parts (the header before its CRC field, then
//! key and value): for a 64-byte value those are 64 and 80 bytes, two table
//! walks that were a quarter of a one-sided GET's CPU time. Short parts are
//! therefore gathered into one stack buffer and hashed together; a part
//! that starts on an empty buffer and fills it goes to `crc32fast` as is.

/// Bytes gathered before they are hashed (at least 128: the fast path).
const GATHER_BYTES: usize = 256;

/// The CRC32 of the concatenation of `parts`.
pub fn crc32_of<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u32 {
    let mut h = crc32fast::Hasher::new();
    let mut buf = [0u8; GATHER_BYTES];
    let mut n = 0;
    for mut part in parts {
        while !part.is_empty() {
            if n == 0 && part.len() >= GATHER_BYTES {
                h.update(part);
                break;
            }
            let take = part.len().min(GATHER_BYTES - n);
            buf[n..n + take].copy_from_slice(&part[..take]);
            n += take;
            part = &part[take..];
            if n == GATHER_BYTES {
                h.update(&buf);
                n = 0;
            }
        }
    }
    h.update(&buf[..n]);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// However the bytes are cut, the CRC is the CRC of the whole.
        #[test]
        fn parts_hash_as_their_concatenation(
            bytes in proptest::collection::vec(any::<u8>(), 0..1200),
            cuts in proptest::collection::vec(0usize..1200, 0..6),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort_unstable();
            let mut parts = Vec::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([bytes.len()]) {
                parts.push(&bytes[at..c]);
                at = c;
            }
            prop_assert_eq!(crc32_of(parts.iter().copied()), crc32fast::hash(&bytes));
        }
    }
}
