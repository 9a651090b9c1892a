//! The record: one entry of a target's log, self-describing so that a reader
//! holding only a remote pointer can check it is the record it wants.
//!
//! Layout (little-endian, see `FORMAT.md`): a 72-byte header, the dkey, the
//! akey, the value, zero padding to a multiple of 8 bytes. The CRC32 covers
//! header bytes 0..64, key and value; the 4-byte `state` word after it is
//! mutable in memory (the superseded bit) and always 0 on the device.

use crate::key::RecordKey;
use crate::FormatError;

pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"FREC");
pub const RECORD_FORMAT_VERSION: u8 = 1;
/// Largest single value, in bytes.
pub const VALUE_MAX_BYTES: usize = 1 << 20;
/// Records start at multiples of this in the log.
pub const RECORD_ALIGN: usize = 8;

pub const OFF_MAGIC: usize = 0;
pub const OFF_FORMAT: usize = OFF_MAGIC + 4;
pub const OFF_FLAGS: usize = OFF_FORMAT + 1;
pub const OFF_DKEY_LEN: usize = OFF_FLAGS + 1;
pub const OFF_AKEY_LEN: usize = OFF_DKEY_LEN + 2;
/// The flush epoch (a reserved 0 before it; readers other than the
/// engine's recovery ignore it).
pub const OFF_EPOCH: usize = OFF_AKEY_LEN + 2;
pub const OFF_VALUE_LEN: usize = OFF_EPOCH + 2;
pub const OFF_ADDR: usize = OFF_VALUE_LEN + 4;
pub const OFF_VERSION: usize = OFF_ADDR + 8;
pub const OFF_CONTAINER: usize = OFF_VERSION + 8;
pub const OFF_OBJECT: usize = OFF_CONTAINER + 8;
pub const OFF_EXTENT_OFFSET: usize = OFF_OBJECT + 16;
pub const OFF_CRC: usize = OFF_EXTENT_OFFSET + 8;
pub const OFF_STATE: usize = OFF_CRC + 4;
pub const HEADER_BYTES: usize = OFF_STATE + 4;

const _: () = assert!(OFF_EPOCH == 10);
const _: () = assert!(OFF_CRC == 64);
const _: () = assert!(HEADER_BYTES == 72);
const _: () = assert!(HEADER_BYTES % RECORD_ALIGN == 0);

/// `state` bit: a newer record for the same key has been published.
pub const STATE_SUPERSEDED: u32 = 1;

/// Flag bits of byte 5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordFlags(pub u8);

impl RecordFlags {
    /// The key is deleted (value empty).
    pub const TOMBSTONE: u8 = 1;
    /// The value is an extent of a byte array, at `extent_offset`.
    pub const EXTENT: u8 = 1 << 1;
    /// Punch of every akey under the dkey.
    pub const PUNCH_DKEY: u8 = 1 << 2;
    /// Punch of the whole object.
    pub const PUNCH_OBJECT: u8 = 1 << 3;
    /// Filler up to the end of the memory ring; carries no key.
    pub const PAD: u8 = 1 << 4;
    const KNOWN: u8 = 0x1f;

    pub const fn empty() -> Self {
        Self(0)
    }
    pub const fn with(self, bit: u8) -> Self {
        Self(self.0 | bit)
    }
    #[inline]
    pub const fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
}

#[inline]
fn align_up(n: usize) -> usize {
    n.div_ceil(RECORD_ALIGN) * RECORD_ALIGN
}

/// Total bytes of a record (header, key, value, padding).
#[inline]
pub fn record_len(key: &RecordKey<'_>, value_len: usize) -> usize {
    align_up(HEADER_BYTES + key.dkey.len() + key.akey.len() + value_len)
}

/// The little-endian `u16` at byte `off` of `b` (panics past the end).
#[inline]
pub fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
/// The little-endian `u32` at byte `off` of `b` (panics past the end).
#[inline]
pub fn get_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}
/// The little-endian `u64` at byte `off` of `b` (panics past the end).
#[inline]
pub fn get_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}
/// The little-endian `u128` at byte `off` of `b` (panics past the end).
#[inline]
pub fn get_u128(b: &[u8], off: usize) -> u128 {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[off..off + 16]);
    u128::from_le_bytes(a)
}

/// `a == b`, by 8-byte words and then bytes. A record's key is compared
/// right after the record was copied into the caller's buffer: glibc's
/// `memcmp` reads short keys with masked vector loads, which cannot take
/// their bytes from stores still in flight and wait for them (a third of
/// a one-sided GET's CPU time in `ferrite bench kv`); plain loads do not.
#[inline]
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (wa, wb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (wa.remainder(), wb.remainder());
    let word = |c: &[u8]| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
    wa.zip(wb).all(|(x, y)| word(x) == word(y)) && ra.iter().zip(rb).all(|(x, y)| x == y)
}

/// Computes the CRC32 of a complete record's covered bytes.
#[inline]
pub fn record_crc(record: &[u8], body_len: usize) -> u32 {
    crate::crc::crc32_of([
        &record[..OFF_CRC],
        &record[HEADER_BYTES..HEADER_BYTES + body_len],
    ])
}

/// [`record_crc`] of a record read in parts: `head` is its header and key
/// parts, `value` its value's bytes in order, in as many slices as they
/// were read in.
pub fn record_crc_parts(head: &[u8], value: &[&[u8]]) -> u32 {
    let head_parts = [&head[..OFF_CRC], &head[HEADER_BYTES..]];
    crate::crc::crc32_of(head_parts.into_iter().chain(value.iter().copied()))
}

/// Writes a record into `out` (exactly [`record_len`] bytes) and returns its
/// length. `addr` is the log address the record will live at. Its
/// epoch is 0 ([`encode_record_stamped`]).
pub fn encode_record(
    out: &mut [u8],
    key: &RecordKey<'_>,
    value: &[u8],
    version: u64,
    addr: u64,
    flags: RecordFlags,
    extent_offset: u64,
) -> Result<usize, FormatError> {
    encode_record_stamped(out, key, value, version, addr, flags, extent_offset, 0)
}

/// [`encode_record`] with an epoch: the low 16 bits of the engine's flush
/// epoch when it appended the record (its recovery uses it to tell damage
/// from a torn last commit, `engine/FORMAT.md`).
#[allow(clippy::too_many_arguments)]
pub fn encode_record_stamped(
    out: &mut [u8],
    key: &RecordKey<'_>,
    value: &[u8],
    version: u64,
    addr: u64,
    flags: RecordFlags,
    extent_offset: u64,
    epoch: u16,
) -> Result<usize, FormatError> {
    key.validate()?;
    if value.len() > VALUE_MAX_BYTES {
        return Err(FormatError::Range {
            what: "record",
            field: "value_len",
            value: value.len() as u64,
        });
    }
    let len = record_len(key, value.len());
    if out.len() < len {
        return Err(FormatError::Short {
            what: "record buffer",
            need: len,
            have: out.len(),
        });
    }
    let out = &mut out[..len];
    out[OFF_MAGIC..OFF_MAGIC + 4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    out[OFF_FORMAT] = RECORD_FORMAT_VERSION;
    out[OFF_FLAGS] = flags.0;
    out[OFF_DKEY_LEN..OFF_DKEY_LEN + 2].copy_from_slice(&(key.dkey.len() as u16).to_le_bytes());
    out[OFF_AKEY_LEN..OFF_AKEY_LEN + 2].copy_from_slice(&(key.akey.len() as u16).to_le_bytes());
    out[OFF_EPOCH..OFF_EPOCH + 2].copy_from_slice(&epoch.to_le_bytes());
    out[OFF_VALUE_LEN..OFF_VALUE_LEN + 4].copy_from_slice(&(value.len() as u32).to_le_bytes());
    out[OFF_ADDR..OFF_ADDR + 8].copy_from_slice(&addr.to_le_bytes());
    out[OFF_VERSION..OFF_VERSION + 8].copy_from_slice(&version.to_le_bytes());
    out[OFF_CONTAINER..OFF_CONTAINER + 8].copy_from_slice(&key.container.to_le_bytes());
    out[OFF_OBJECT..OFF_OBJECT + 16].copy_from_slice(&key.object.to_le_bytes());
    out[OFF_EXTENT_OFFSET..OFF_EXTENT_OFFSET + 8].copy_from_slice(&extent_offset.to_le_bytes());
    let mut p = HEADER_BYTES;
    for part in [key.dkey, key.akey, value] {
        out[p..p + part.len()].copy_from_slice(part);
        p += part.len();
    }
    out[p..].fill(0);
    let body = p - HEADER_BYTES;
    let crc = record_crc(out, body);
    out[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    out[OFF_STATE..OFF_STATE + 4].fill(0);
    Ok(len)
}

/// A parsed, CRC-checked record borrowed from a buffer.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    bytes: &'a [u8],
    dkey_len: usize,
    akey_len: usize,
    value_len: usize,
}

impl<'a> RecordView<'a> {
    /// Parses the record at the start of `bytes` and checks magic, format,
    /// lengths and CRC. Bytes after the record are ignored.
    #[inline]
    pub fn parse(bytes: &'a [u8]) -> Result<Self, FormatError> {
        if bytes.len() < HEADER_BYTES {
            return Err(FormatError::Short {
                what: "record header",
                need: HEADER_BYTES,
                have: bytes.len(),
            });
        }
        let magic = get_u32(bytes, OFF_MAGIC);
        if magic != RECORD_MAGIC {
            return Err(FormatError::BadMagic {
                what: "record",
                found: magic,
            });
        }
        if bytes[OFF_FORMAT] != RECORD_FORMAT_VERSION {
            return Err(FormatError::BadVersion {
                what: "record",
                found: bytes[OFF_FORMAT],
            });
        }
        if bytes[OFF_FLAGS] & !RecordFlags::KNOWN != 0 {
            return Err(FormatError::Range {
                what: "record",
                field: "flags",
                value: u64::from(bytes[OFF_FLAGS]),
            });
        }
        let dkey_len = usize::from(get_u16(bytes, OFF_DKEY_LEN));
        let akey_len = usize::from(get_u16(bytes, OFF_AKEY_LEN));
        let value_len = get_u32(bytes, OFF_VALUE_LEN) as usize;
        if value_len > VALUE_MAX_BYTES {
            return Err(FormatError::Range {
                what: "record",
                field: "value_len",
                value: value_len as u64,
            });
        }
        let body = dkey_len + akey_len + value_len;
        let total = align_up(HEADER_BYTES + body);
        if bytes.len() < total {
            return Err(FormatError::Short {
                what: "record",
                need: total,
                have: bytes.len(),
            });
        }
        let stored = get_u32(bytes, OFF_CRC);
        let computed = record_crc(bytes, body);
        if stored != computed {
            return Err(FormatError::Checksum {
                what: "record",
                stored,
                computed,
            });
        }
        Ok(Self {
            bytes: &bytes[..total],
            dkey_len,
            akey_len,
            value_len,
        })
    }

    /// Checks that this is the record for `key` stored at log address `addr`.
    #[inline]
    pub fn verify_for(&self, key: &RecordKey<'_>, addr: u64) -> Result<(), FormatError> {
        if self.addr() != addr {
            return Err(FormatError::Mismatch("log address"));
        }
        if self.flags().has(RecordFlags::PAD) {
            return Err(FormatError::Mismatch("padding record"));
        }
        if self.container() != key.container || self.object() != key.object {
            return Err(FormatError::Mismatch("container or object"));
        }
        if !same_bytes(self.dkey(), key.dkey) || !same_bytes(self.akey(), key.akey) {
            return Err(FormatError::Mismatch("dkey or akey"));
        }
        Ok(())
    }

    /// The epoch the writer stamped ([`encode_record_stamped`]).
    pub fn epoch(&self) -> u16 {
        get_u16(self.bytes, OFF_EPOCH)
    }

    /// Total length including padding.
    #[inline]
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    #[inline]
    pub fn flags(&self) -> RecordFlags {
        RecordFlags(self.bytes[OFF_FLAGS])
    }
    #[inline]
    pub fn addr(&self) -> u64 {
        get_u64(self.bytes, OFF_ADDR)
    }
    #[inline]
    pub fn version(&self) -> u64 {
        get_u64(self.bytes, OFF_VERSION)
    }
    #[inline]
    pub fn container(&self) -> u64 {
        get_u64(self.bytes, OFF_CONTAINER)
    }
    #[inline]
    pub fn object(&self) -> u128 {
        get_u128(self.bytes, OFF_OBJECT)
    }
    #[inline]
    pub fn extent_offset(&self) -> u64 {
        get_u64(self.bytes, OFF_EXTENT_OFFSET)
    }
    /// The in-memory state word (not covered by the CRC).
    #[inline]
    pub fn state(&self) -> u32 {
        get_u32(self.bytes, OFF_STATE)
    }
    #[inline]
    pub fn is_superseded(&self) -> bool {
        self.state() & STATE_SUPERSEDED != 0
    }
    #[inline]
    pub fn dkey(&self) -> &'a [u8] {
        &self.bytes[HEADER_BYTES..HEADER_BYTES + self.dkey_len]
    }
    #[inline]
    pub fn akey(&self) -> &'a [u8] {
        let s = HEADER_BYTES + self.dkey_len;
        &self.bytes[s..s + self.akey_len]
    }
    #[inline]
    pub fn key(&self) -> RecordKey<'a> {
        RecordKey::new(self.container(), self.object(), self.dkey(), self.akey())
    }
    #[inline]
    pub fn value(&self) -> &'a [u8] {
        let s = HEADER_BYTES + self.dkey_len + self.akey_len;
        &self.bytes[s..s + self.value_len]
    }
    #[inline]
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// Writes a padding record filling all of `out` (length ≥ header, a
/// multiple of 8): a record with no key whose zero value covers the rest.
pub fn encode_pad(out: &mut [u8], addr: u64) -> Result<usize, FormatError> {
    let len = out.len();
    if len < HEADER_BYTES || len % RECORD_ALIGN != 0 || len - HEADER_BYTES > VALUE_MAX_BYTES {
        return Err(FormatError::Range {
            what: "pad record",
            field: "len",
            value: len as u64,
        });
    }
    let fill = len - HEADER_BYTES;
    out.fill(0);
    out[OFF_MAGIC..OFF_MAGIC + 4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    out[OFF_FORMAT] = RECORD_FORMAT_VERSION;
    out[OFF_FLAGS] = RecordFlags::PAD;
    out[OFF_VALUE_LEN..OFF_VALUE_LEN + 4].copy_from_slice(&(fill as u32).to_le_bytes());
    out[OFF_ADDR..OFF_ADDR + 8].copy_from_slice(&addr.to_le_bytes());
    let crc = record_crc(out, fill);
    out[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn make(key: &RecordKey<'_>, v: &[u8], version: u64, addr: u64) -> Vec<u8> {
        let mut b = vec![0u8; record_len(key, v.len())];
        encode_record(&mut b, key, v, version, addr, RecordFlags::empty(), 0).unwrap();
        b
    }

    #[test]
    fn roundtrip_and_verify() {
        let k = RecordKey::new(3, 99, b"dk", b"ak");
        let b = make(&k, b"value", 5, 800);
        assert_eq!(b.len() % 8, 0);
        let v = RecordView::parse(&b).unwrap();
        v.verify_for(&k, 800).unwrap();
        assert_eq!(v.value(), b"value");
        assert!(v.verify_for(&k, 808).is_err());
        let other = RecordKey::new(3, 99, b"dk", b"ax");
        assert_eq!(
            v.verify_for(&other, 800),
            Err(FormatError::Mismatch("dkey or akey"))
        );
    }

    #[test]
    fn state_word_is_outside_crc() {
        let k = RecordKey::new(1, 1, b"d", b"a");
        let mut b = make(&k, b"x", 1, 0);
        b[OFF_STATE] = STATE_SUPERSEDED as u8;
        let v = RecordView::parse(&b).unwrap();
        assert!(v.is_superseded());
    }

    #[test]
    fn crc_of_a_record_read_in_parts_is_its_crc() {
        let k = RecordKey::new(1, 1, b"dk", b"a");
        let b = make(&k, b"0123456789", 3, 0);
        let head = HEADER_BYTES + 3;
        let value = &b[head..head + 10];
        let stored = get_u32(&b, OFF_CRC);
        assert_eq!(record_crc(&b, 13), stored);
        let parts = [&value[..4], &value[4..4], &value[4..]];
        assert_eq!(record_crc_parts(&b[..head], &parts), stored);
        let mut other = value.to_vec();
        other[9] ^= 1;
        assert_ne!(record_crc_parts(&b[..head], &[&other]), stored);
    }

    #[test]
    fn pad_record_never_matches_a_key() {
        let mut b = vec![0u8; 128];
        encode_pad(&mut b, 64).unwrap();
        let v = RecordView::parse(&b).unwrap();
        assert!(v.flags().has(RecordFlags::PAD));
        assert_eq!(v.len(), 128);
        let k = RecordKey::new(0, 0, b"", b"");
        assert!(v.verify_for(&k, 64).is_err());
    }

    #[test]
    fn oversized_value_is_refused() {
        let k = RecordKey::new(1, 1, b"d", b"a");
        let v = vec![0u8; VALUE_MAX_BYTES + 1];
        let mut b = vec![0u8; record_len(&k, v.len())];
        assert!(encode_record(&mut b, &k, &v, 1, 0, RecordFlags::empty(), 0).is_err());
    }

    proptest! {
        /// `same_bytes` is slice equality, at every length and at the
        /// first differing byte wherever it is.
        #[test]
        fn same_bytes_is_equality(
            a in proptest::collection::vec(any::<u8>(), 0..40),
            flip in any::<usize>(),
            longer in any::<bool>(),
        ) {
            prop_assert!(same_bytes(&a, &a.clone()));
            let mut b = a.clone();
            if let Some(n) = (!a.is_empty()).then(|| flip % a.len()) {
                b[n] ^= 1 << (flip % 8);
                prop_assert!(!same_bytes(&a, &b));
            }
            let mut c = a.clone();
            if longer {
                c.push(0);
            } else {
                c.pop();
            }
            prop_assert_eq!(same_bytes(&a, &c), a == c);
        }

        #[test]
        fn any_flipped_bit_is_detected(
            dkey in proptest::collection::vec(any::<u8>(), 0..40),
            value in proptest::collection::vec(any::<u8>(), 0..300),
            bit in any::<usize>(),
        ) {
            let k = RecordKey::new(9, 77, &dkey, b"a");
            let mut b = make(&k, &value, 3, 4096);
            let covered = HEADER_BYTES + dkey.len() + 1 + value.len();
            let bit = bit % (covered * 8);
            let byte = bit / 8;
            prop_assume!(!(OFF_CRC + 4..HEADER_BYTES).contains(&byte));
            b[byte] ^= 1 << (bit % 8);
            let ok = RecordView::parse(&b).and_then(|v| v.verify_for(&k, 4096));
            prop_assert!(ok.is_err());
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = RecordView::parse(&bytes);
        }
    }
}
