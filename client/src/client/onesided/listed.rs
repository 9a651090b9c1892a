//! One-sided reads of a byte array's pieces through its extent list
//! ([`ExtentList`], asked of the engine by an ExtentList request).
//!
//! The bucket slot of an array points only at its newest extent record; a
//! piece held by an older record (ior-hard: a 1 MiB chunk holds ~22
//! writers' extents) is found through the list, which names the record of
//! every piece and the record that was the newest when it was made.
//!
//! Why what is returned is the newest data of the range:
//! - **The list still holds.** A fresh read of the key's bucket chain (CRC
//!   checked, never the cache) finds a slot with the key's fingerprint
//!   pointing at the list's newest record (address and length). Log
//!   addresses are never reused and every change of the array — a write, a
//!   punch, the cleaner or keeper moving the newest record — points the
//!   slot elsewhere or removes it; and the engine publishes the directory
//!   the list came from together with the buckets. So no write to the array
//!   was published between the list and that bucket read, which is the
//!   moment the read answers for (any write acknowledged before the read
//!   began was published before it).
//! - **The bytes are the record's.** Each piece's record is read from the
//!   ring (or, once the ring moved past it, from the device log mapping)
//!   and checked whole as it is read: magic, format, flags, log address,
//!   key, length, extent range, and the CRC over the header, key and value.
//!   Each byte of shared memory is read exactly once: the wanted value
//!   bytes straight into the caller's buffer, the rest into a scratch
//!   buffer, and the CRC is computed over those copies, so the bytes handed
//!   back are exactly the bytes the CRC vouched for (a record overwritten
//!   while it was read fails the CRC). A record the cleaner moved may still
//!   be read at its old place: its bytes there are the same record's (same
//!   key, version and value), which the checks prove.
//!
//! Anything else (stale list, a record gone from both places, a bad CRC)
//! makes the read give up, and the caller asks the engine by RPC.

use ferrite_proto::bucket::{Bucket, ADDR_MASK, BUCKET_BYTES};
use ferrite_proto::key::RecordKey;
use ferrite_proto::record::{
    get_u128, get_u16, get_u32, get_u64, record_crc_parts, record_len, same_bytes, RecordFlags,
    HEADER_BYTES, OFF_ADDR, OFF_AKEY_LEN, OFF_CONTAINER, OFF_CRC, OFF_DKEY_LEN, OFF_EXTENT_OFFSET,
    OFF_FLAGS, OFF_FORMAT, OFF_MAGIC, OFF_OBJECT, OFF_VALUE_LEN, RECORD_FORMAT_VERSION,
    RECORD_MAGIC,
};
use ferrite_proto::region::RegionDescriptor;
use ferrite_proto::rpc::{ExtentList, ExtentSpan};

use super::{span_in, OneSidedReader, CHAIN_MAX};
use crate::client::error::Result;

/// Fresh reads of a bucket chain when one read a torn bucket.
const TORN_RETRIES: usize = 4;

/// How a listed read ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// Every byte of the range is in the caller's buffer.
    Read,
    /// The array changed since the list was made: ask for a new one.
    Stale,
    /// The list holds but a piece could not be read and checked one-sided
    /// (or the range is past what the list covers): ask the engine.
    Unreadable,
}

/// What reading one record for a piece found.
enum PieceRead {
    Done,
    /// The key's extent record, checked, but it does not hold the piece.
    Elsewhere,
    /// Not this record here (the ring moved on, or the bytes fail a check).
    Missing,
}

/// How a read of an array's newest record ([`OneSidedReader::read_newest`])
/// ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Newest {
    /// Every byte of the range is in the caller's buffer.
    Read,
    /// The newest record is the key's extent record but does not hold the
    /// whole range: its pieces are elsewhere (read them through the list).
    Elsewhere,
    /// Nothing learned (no slot, another kind of record, a failed check):
    /// the general lookup decides.
    Unknown,
}

impl OneSidedReader {
    /// Reads `dst.len()` bytes at `offset` of the array under `key` through
    /// its extent `list` (module docs); `scratch` is reused between calls.
    pub fn read_listed(
        &self,
        key: &RecordKey<'_>,
        list: &ExtentList,
        offset: u64,
        dst: &mut [u8],
        scratch: &mut Vec<u8>,
    ) -> Result<Listed> {
        let end = offset + dst.len() as u64;
        if end > list.covered_end {
            return Ok(Listed::Unreadable);
        }
        if !self.slot_points_at(key, list.newest_addr, list.newest_len)? {
            return Ok(Listed::Stale);
        }
        let first = list.pieces.partition_point(|p| p.end <= offset);
        let mut done = offset;
        for p in list.pieces[first..].iter().take_while(|p| p.start < end) {
            let (from, to) = (p.start.max(offset), p.end.min(end));
            if from > done {
                dst[(done - offset) as usize..(from - offset) as usize].fill(0);
            }
            let out = &mut dst[(from - offset) as usize..(to - offset) as usize];
            let read = self.read_piece(key, p, from, out, scratch)?;
            if !matches!(read, PieceRead::Done) {
                return Ok(Listed::Unreadable);
            }
            done = to;
        }
        dst[(done.max(offset) - offset) as usize..].fill(0);
        Ok(Listed::Read)
    }

    /// Reads `dst.len()` bytes at `offset` of the array under `key` from its
    /// newest extent record when that record holds them all, the value
    /// bytes straight into `dst` (a general lookup copies the whole record
    /// out first, then the bytes once more). The slot comes from a fresh
    /// read of the bucket chain, so its record is the newest the engine had
    /// published at that moment; the record is checked as in the module
    /// docs.
    pub fn read_newest(
        &self,
        key: &RecordKey<'_>,
        offset: u64,
        dst: &mut [u8],
        scratch: &mut Vec<u8>,
    ) -> Result<Newest> {
        let Some(slots) = self.fresh_slots(key)? else {
            return Ok(Newest::Unknown);
        };
        let end = offset + dst.len() as u64;
        let span = |s: &ferrite_proto::bucket::Slot| ExtentSpan {
            start: offset,
            end,
            rec_addr: s.addr,
            rec_len: s.length,
        };
        for slot in slots {
            match self.read_piece(key, &span(&slot), offset, dst, scratch)? {
                PieceRead::Done => return Ok(Newest::Read),
                PieceRead::Elsewhere => return Ok(Newest::Elsewhere),
                PieceRead::Missing => {}
            }
        }
        Ok(Newest::Unknown)
    }

    /// The slots with the key's fingerprint in a fresh read of its bucket
    /// chain (CRC checked); `None` when the chain kept reading torn.
    fn fresh_slots(&self, key: &RecordKey<'_>) -> Result<Option<Vec<ferrite_proto::bucket::Slot>>> {
        let (regions, main_index, fingerprint) = self.locate(key);
        let bucket_count = regions.buckets.length / BUCKET_BYTES as u64;
        let mut found = Vec::new();
        'walk: for _ in 0..TORN_RETRIES {
            found.clear();
            let mut index = main_index;
            for _ in 0..CHAIN_MAX {
                let mut bucket = Bucket([0; BUCKET_BYTES]);
                let at = index * BUCKET_BYTES as u64;
                self.endpoint
                    .read(&regions.buckets, at, BUCKET_BYTES, &mut bucket.0)?;
                if bucket.check().is_err() {
                    continue 'walk;
                }
                found.extend(bucket.matching(fingerprint));
                match u64::from(bucket.next()) {
                    0 => return Ok(Some(found)),
                    next if next >= bucket_count => continue 'walk,
                    next => index = next,
                }
            }
            return Ok(Some(found));
        }
        Ok(None)
    }

    /// Whether a fresh read of the key's bucket chain finds a slot with its
    /// fingerprint pointing at the record at `addr`, `len` bytes long.
    fn slot_points_at(&self, key: &RecordKey<'_>, addr: u64, len: u32) -> Result<bool> {
        let slots = self.fresh_slots(key)?.unwrap_or_default();
        Ok(slots
            .iter()
            .any(|s| s.addr == addr & ADDR_MASK && s.length == len))
    }

    /// Reads the bytes `[from, from + out.len())` of the array out of the
    /// record of piece `p`: from the ring, else from the device log.
    fn read_piece(
        &self,
        key: &RecordKey<'_>,
        p: &ExtentSpan,
        from: u64,
        out: &mut [u8],
        scratch: &mut Vec<u8>,
    ) -> Result<PieceRead> {
        let (regions, _, _) = self.locate(key);
        for log in std::iter::once(&regions.log).chain(regions.device.as_ref()) {
            match self.read_piece_in(log, key, p, from, out, scratch)? {
                PieceRead::Missing => {}
                found => return Ok(found),
            }
        }
        Ok(PieceRead::Missing)
    }

    /// [`read_piece`](Self::read_piece) from one log region (module docs:
    /// each byte read once, the CRC over what was read).
    fn read_piece_in(
        &self,
        log: &RegionDescriptor,
        key: &RecordKey<'_>,
        p: &ExtentSpan,
        from: u64,
        out: &mut [u8],
        scratch: &mut Vec<u8>,
    ) -> Result<PieceRead> {
        let slot = ferrite_proto::bucket::Slot {
            fingerprint: 0,
            length: p.rec_len,
            addr: p.rec_addr,
            version_low: 0,
        };
        let Some((at, len)) = span_in(log, slot) else {
            return Ok(PieceRead::Missing);
        };
        let head = HEADER_BYTES + key.dkey.len() + key.akey.len();
        if len < head {
            return Ok(PieceRead::Missing);
        }
        scratch.clear();
        scratch.resize(head, 0);
        self.endpoint.read(log, at, head, scratch)?;
        let first = match extent_head(key, p, &scratch[..head]) {
            Head::Holds(first) => first,
            Head::Elsewhere => return Ok(PieceRead::Elsewhere),
            Head::NotIt => return Ok(PieceRead::Missing),
        };
        let value_len = get_u32(scratch, OFF_VALUE_LEN) as usize;
        // Value bytes before the wanted ones, the wanted ones, those after.
        let skip = (from - first) as usize;
        let after = value_len - skip - out.len();
        let value_at = at + head as u64;
        scratch.resize(head + skip + after, 0);
        let (head_bytes, rest) = scratch.split_at_mut(head);
        let (before, tail) = rest.split_at_mut(skip);
        let wanted_at = value_at + skip as u64;
        let tail_at = wanted_at + out.len() as u64;
        for (region_at, buf) in [
            (value_at, &mut *before),
            (wanted_at, &mut *out),
            (tail_at, &mut *tail),
        ] {
            if !buf.is_empty() {
                self.endpoint.read(log, region_at, buf.len(), buf)?;
            }
        }
        let crc = record_crc_parts(head_bytes, &[before, out, tail]);
        Ok(match crc == get_u32(head_bytes, OFF_CRC) {
            true => PieceRead::Done,
            false => PieceRead::Missing,
        })
    }
}

/// What the unchecked head (header and key parts) of a record says.
enum Head {
    /// `key`'s extent record at `p.rec_addr`, `p.rec_len` bytes long,
    /// holding all of piece `p`; its extent starts at this array offset.
    Holds(u64),
    /// `key`'s extent record there, not holding all of `p`.
    Elsewhere,
    /// Not that record (yet to be proven by its CRC in either case above).
    NotIt,
}

fn extent_head(key: &RecordKey<'_>, p: &ExtentSpan, head: &[u8]) -> Head {
    let (d, a) = (key.dkey.len(), key.akey.len());
    let flags = RecordFlags(head[OFF_FLAGS]);
    let plain = RecordFlags::TOMBSTONE
        | RecordFlags::PUNCH_DKEY
        | RecordFlags::PUNCH_OBJECT
        | RecordFlags::PAD;
    let value_len = get_u32(head, OFF_VALUE_LEN) as usize;
    let same = get_u32(head, OFF_MAGIC) == RECORD_MAGIC
        && head[OFF_FORMAT] == RECORD_FORMAT_VERSION
        && flags.has(RecordFlags::EXTENT)
        && flags.0 & plain == 0
        && get_u64(head, OFF_ADDR) == p.rec_addr
        && usize::from(get_u16(head, OFF_DKEY_LEN)) == d
        && usize::from(get_u16(head, OFF_AKEY_LEN)) == a
        && get_u64(head, OFF_CONTAINER) == key.container
        && get_u128(head, OFF_OBJECT) == key.object
        && same_bytes(&head[HEADER_BYTES..HEADER_BYTES + d], key.dkey)
        && same_bytes(&head[HEADER_BYTES + d..HEADER_BYTES + d + a], key.akey)
        && record_len(key, value_len) == p.rec_len as usize;
    if !same {
        return Head::NotIt;
    }
    let first = get_u64(head, OFF_EXTENT_OFFSET);
    let holds = first <= p.start
        && first
            .checked_add(value_len as u64)
            .is_some_and(|end| end >= p.end);
    match holds {
        true => Head::Holds(first),
        false => Head::Elsewhere,
    }
}
