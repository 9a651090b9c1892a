//! A look at a big record's header before reading all of it.
//!
//! A file chunk's slot points at an extent record of up to 1 MiB. When that
//! record has left the memory ring (bulk data written since), when it is an
//! older piece that does not cover the bytes wanted (ior-hard's 47,008-byte
//! extents), or when it is superseded, reading it whole only to find that
//! out costs its full length — twice, with the retry a failed check earns.
//! So a record of at least [`PEEK_MIN_BYTES`] is first read up to the end of
//! its keys, and the header decides whether the rest is worth reading.
//!
//! The header is not checked by its CRC at this point (the CRC covers the
//! whole record), so it may only ever make a lookup give up early: every
//! verdict [`peek`] returns leads to a bucket re-read or to the RPC
//! fallback, never to an answer. A header that looks right is read whole and
//! checked as before.

use ferrite_proto::bucket::Slot;
use ferrite_proto::key::RecordKey;
use ferrite_proto::record::{
    get_u128, get_u16, get_u32, get_u64, record_len, same_bytes, RecordFlags, HEADER_BYTES,
    OFF_ADDR, OFF_AKEY_LEN, OFF_CONTAINER, OFF_DKEY_LEN, OFF_EXTENT_OFFSET, OFF_FLAGS, OFF_FORMAT,
    OFF_MAGIC, OFF_OBJECT, OFF_STATE, OFF_VALUE_LEN, OFF_VERSION, RECORD_FORMAT_VERSION,
    RECORD_MAGIC, STATE_SUPERSEDED,
};

use super::SlotCheck;

/// Records at least this long are peeked at before being read whole (a
/// header read is a second round trip over tcp and verbs: worth it only when
/// it can save many bytes).
pub(super) const PEEK_MIN_BYTES: usize = 16 << 10;

/// Bytes to read for the peek: the header and the key's two parts.
pub(super) fn head_len(key: &RecordKey<'_>) -> usize {
    HEADER_BYTES + key.dkey.len() + key.akey.len()
}

/// Bytes to read first of a `len`-byte record of `key`: all of it, or for
/// a big record its head.
pub(super) fn first_read_len(key: &RecordKey<'_>, len: usize) -> usize {
    read_len(key.dkey.len() + key.akey.len(), len)
}

/// [`first_read_len`] for a key whose dkey and akey are `key_bytes` long.
pub(super) fn read_len(key_bytes: usize, len: usize) -> usize {
    if len >= PEEK_MIN_BYTES {
        (HEADER_BYTES + key_bytes).min(len)
    } else {
        len
    }
}

/// Whether the header and keys in `head` name `key`.
fn same_key(key: &RecordKey<'_>, head: &[u8], dkey_len: u16, akey_len: u16) -> bool {
    let (d, a) = (key.dkey.len(), key.akey.len());
    usize::from(dkey_len) == d
        && usize::from(akey_len) == a
        && get_u64(head, OFF_CONTAINER) == key.container
        && get_u128(head, OFF_OBJECT) == key.object
        && same_bytes(&head[HEADER_BYTES..HEADER_BYTES + d], key.dkey)
        && same_bytes(&head[HEADER_BYTES + d..HEADER_BYTES + d + a], key.akey)
}

/// What the unchecked header `head` ([`head_len`] bytes read at `slot`'s
/// address) says about the record: `Some` of `Evicted`, `Stale` or
/// `NotPlain` when the rest need not be read; `None` when the record may
/// be the one wanted (read it whole) or when only a checked record may say
/// what it is (another key's record, a deletion).
pub(super) fn peek(
    key: &RecordKey<'_>,
    slot: Slot,
    range: Option<(u64, u32)>,
    head: &[u8],
) -> Option<SlotCheck> {
    if head.len() < head_len(key) {
        return None;
    }
    if get_u32(head, OFF_MAGIC) != RECORD_MAGIC || head[OFF_FORMAT] != RECORD_FORMAT_VERSION {
        return Some(SlotCheck::Stale);
    }
    let addr = get_u64(head, OFF_ADDR);
    if addr != slot.addr {
        return Some(if addr > slot.addr {
            SlotCheck::Evicted
        } else {
            SlotCheck::Stale
        });
    }
    let (dkey_len, akey_len) = (get_u16(head, OFF_DKEY_LEN), get_u16(head, OFF_AKEY_LEN));
    if !same_key(key, head, dkey_len, akey_len) {
        return None;
    }
    // The key's parts are the header's (same_key), so this is its length.
    let value_len = get_u32(head, OFF_VALUE_LEN) as usize;
    let flags = RecordFlags(head[OFF_FLAGS]);
    if record_len(key, value_len) != slot.length as usize
        || flags.has(RecordFlags::PAD)
        || get_u32(head, OFF_STATE) & STATE_SUPERSEDED != 0
        || get_u64(head, OFF_VERSION) as u16 != slot.version_low
    {
        return Some(SlotCheck::Stale);
    }
    if flags.has(RecordFlags::TOMBSTONE) {
        return None;
    }
    let punch = flags.0 & (RecordFlags::PUNCH_DKEY | RecordFlags::PUNCH_OBJECT) != 0;
    if punch || flags.has(RecordFlags::EXTENT) != range.is_some() {
        return Some(SlotCheck::NotPlain);
    }
    if let Some((offset, len)) = range {
        let first = get_u64(head, OFF_EXTENT_OFFSET);
        if offset < first || offset + u64::from(len) > first + value_len as u64 {
            return Some(SlotCheck::NotPlain);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_proto::record::{encode_record, record_len, OFF_STATE};

    const KEY: RecordKey<'static> = RecordKey {
        container: 7,
        object: 9,
        dkey: b"chunk-3",
        akey: b"",
    };

    /// A 40,000-byte extent at offset 1000, stored at log address 4096.
    fn extent_record() -> (Vec<u8>, Slot) {
        let value = vec![0xabu8; 40_000];
        let mut rec = vec![0u8; record_len(&KEY, value.len())];
        let flags = RecordFlags::empty().with(RecordFlags::EXTENT);
        let len = encode_record(&mut rec, &KEY, &value, 0x1_0005, 4096, flags, 1000).unwrap();
        let slot = Slot {
            fingerprint: 1,
            addr: 4096,
            length: len as u32,
            version_low: 5,
        };
        (rec, slot)
    }

    fn peek_at(rec: &[u8], slot: Slot, range: Option<(u64, u32)>) -> Option<SlotCheck> {
        peek(&KEY, slot, range, &rec[..head_len(&KEY)])
    }

    #[test]
    fn a_header_that_may_serve_the_range_is_read_whole() {
        let (rec, slot) = extent_record();
        assert!(rec.len() >= PEEK_MIN_BYTES);
        assert!(peek_at(&rec, slot, Some((1000, 40_000))).is_none());
        assert!(peek_at(&rec, slot, Some((5000, 47))).is_none());
    }

    #[test]
    fn a_range_the_extent_does_not_cover_goes_to_the_engine() {
        let (rec, slot) = extent_record();
        for range in [(999, 10), (30_000, 20_000), (41_000, 1)] {
            assert!(
                matches!(peek_at(&rec, slot, Some(range)), Some(SlotCheck::NotPlain)),
                "{range:?}"
            );
        }
        // A single-value GET of an array.
        assert!(matches!(
            peek_at(&rec, slot, None),
            Some(SlotCheck::NotPlain)
        ));
    }

    #[test]
    fn a_record_the_ring_overwrote_is_found_out_by_its_header() {
        let (mut rec, slot) = extent_record();
        // The ring moved on: a newer record now starts there.
        rec[OFF_ADDR..OFF_ADDR + 8].copy_from_slice(&(4096u64 + (1 << 30)).to_le_bytes());
        assert!(matches!(
            peek_at(&rec, slot, Some((1000, 8))),
            Some(SlotCheck::Evicted)
        ));
        // Or other bytes altogether.
        rec[OFF_MAGIC] ^= 0xff;
        assert!(matches!(
            peek_at(&rec, slot, Some((1000, 8))),
            Some(SlotCheck::Stale)
        ));
    }

    #[test]
    fn superseded_or_renumbered_records_are_stale() {
        let (mut rec, slot) = extent_record();
        rec[OFF_STATE] |= STATE_SUPERSEDED as u8;
        assert!(matches!(
            peek_at(&rec, slot, Some((1000, 8))),
            Some(SlotCheck::Stale)
        ));
        let (rec, mut slot) = extent_record();
        slot.version_low = 6;
        assert!(matches!(
            peek_at(&rec, slot, Some((1000, 8))),
            Some(SlotCheck::Stale)
        ));
        slot.version_low = 5;
        slot.length += 8;
        assert!(matches!(
            peek_at(&rec, slot, Some((1000, 8))),
            Some(SlotCheck::Stale)
        ));
    }

    #[test]
    fn only_a_checked_record_may_say_deleted_or_another_key() {
        let mut rec = vec![0u8; record_len(&KEY, 0)];
        let flags = RecordFlags::empty().with(RecordFlags::TOMBSTONE);
        let len = encode_record(&mut rec, &KEY, &[], 0x1_0005, 4096, flags, 0).unwrap();
        let slot = Slot {
            fingerprint: 1,
            addr: 4096,
            length: len as u32,
            version_low: 5,
        };
        assert!(peek(&KEY, slot, None, &rec[..head_len(&KEY)]).is_none());
        let (rec, slot) = extent_record();
        let other = RecordKey {
            dkey: b"chunk-4",
            ..KEY
        };
        for range in [(1000, 8), (0, 8)] {
            assert!(peek(&other, slot, Some(range), &rec[..head_len(&other)]).is_none());
        }
    }
}
