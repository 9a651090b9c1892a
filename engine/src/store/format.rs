//! On-device layouts of the store: the superblock and the checkpoint of the
//! index. Records in the log use the shared record format of
//! `ferrite_proto::record`. Every byte is described in `engine/FORMAT.md`.
//!
//! ```text
//! device: | superblock (1 header unit) | checkpoint area 0 | checkpoint area 1 | log ... |
//! ```

use crate::store::error::{Result, StoreError};

pub const SUPER_MAGIC: u32 = u32::from_le_bytes(*b"FSTO");
pub const CHECKPOINT_MAGIC: u32 = u32::from_le_bytes(*b"FCKP");
pub const STORE_FORMAT_VERSION: u32 = 2;
/// Bytes reserved for the superblock and for each checkpoint header.
pub const HEADER_UNIT_BYTES: u64 = 4096;

// Superblock offsets.
pub const SB_MAGIC: usize = 0;
pub const SB_FORMAT: usize = SB_MAGIC + 4;
pub const SB_BLOCK_SIZE: usize = SB_FORMAT + 4;
pub const SB_RESERVED: usize = SB_BLOCK_SIZE + 4;
pub const SB_CKPT_OFFSET: usize = SB_RESERVED + 4;
pub const SB_CKPT_BYTES: usize = SB_CKPT_OFFSET + 8;
pub const SB_LOG_OFFSET: usize = SB_CKPT_BYTES + 8;
pub const SB_LOG_BYTES: usize = SB_LOG_OFFSET + 8;
pub const SB_RING_BYTES: usize = SB_LOG_BYTES + 8;
pub const SB_MAX_COMMIT: usize = SB_RING_BYTES + 8;
pub const SB_DEVICE_BYTES: usize = SB_MAX_COMMIT + 8;
pub const SB_SEGMENT_BYTES: usize = SB_DEVICE_BYTES + 8;
pub const SB_CRC: usize = SB_SEGMENT_BYTES + 8;
pub const SB_BYTES: usize = SB_CRC + 8;
const _: () = assert!(SB_SEGMENT_BYTES == 72);
const _: () = assert!(SB_CRC == 80);
const _: () = assert!(SB_BYTES == 88);

// Checkpoint header offsets.
pub const CK_MAGIC: usize = 0;
pub const CK_FORMAT: usize = CK_MAGIC + 4;
pub const CK_GENERATION: usize = CK_FORMAT + 4;
pub const CK_REPLAY_START: usize = CK_GENERATION + 8;
pub const CK_LOG_TAIL: usize = CK_REPLAY_START + 8;
pub const CK_NEXT_VERSION: usize = CK_LOG_TAIL + 8;
pub const CK_ENTRY_COUNT: usize = CK_NEXT_VERSION + 8;
pub const CK_BODY_BYTES: usize = CK_ENTRY_COUNT + 8;
pub const CK_BODY_CRC: usize = CK_BODY_BYTES + 8;
pub const CK_HEADER_CRC: usize = CK_BODY_CRC + 4;
pub const CK_HEADER_BYTES: usize = CK_HEADER_CRC + 4;
const _: () = assert!(CK_HEADER_BYTES == 64);

/// Format of the checkpoint areas written now: 3 adds the damage record
/// after the header (format 2 areas are still read, as holding none).
pub const CHECKPOINT_FORMAT_VERSION: u32 = 3;
/// The checkpoint format before the damage record.
pub const CHECKPOINT_FORMAT_V2: u32 = 2;
/// Damaged log ranges a checkpoint keeps (the most recent).
pub const DAMAGE_RANGES_MAX: usize = 8;
// Damage record offsets (format 3), right after the header.
pub const CD_COMMIT_EPOCH: usize = CK_HEADER_BYTES;
pub const CD_CORRUPT_RECORDS: usize = CD_COMMIT_EPOCH + 8;
pub const CD_RANGE_COUNT: usize = CD_CORRUPT_RECORDS + 8;
pub const CD_RESERVED: usize = CD_RANGE_COUNT + 4;
pub const CD_RANGES: usize = CD_RESERVED + 4;
pub const CD_RANGE_BYTES: usize = 16;
pub const CD_CRC: usize = CD_RANGES + DAMAGE_RANGES_MAX * CD_RANGE_BYTES;
pub const CD_END: usize = CD_CRC + 8;
const _: () = assert!(CD_RANGES == 88);
const _: () = assert!(CD_CRC == 216);
const _: () = assert!(CD_END == 224);
const _: () = assert!(CD_END as u64 <= HEADER_UNIT_BYTES);

// Checkpoint entry offsets.
pub const CE_KIND: usize = 0;
pub const CE_RESERVED0: usize = CE_KIND + 1;
pub const CE_DKEY_LEN: usize = CE_RESERVED0 + 1;
pub const CE_AKEY_LEN: usize = CE_DKEY_LEN + 2;
pub const CE_RESERVED1: usize = CE_AKEY_LEN + 2;
pub const CE_CONTAINER: usize = CE_RESERVED1 + 2;
pub const CE_OBJECT: usize = CE_CONTAINER + 8;
pub const CE_VERSION: usize = CE_OBJECT + 16;
pub const CE_ADDR: usize = CE_VERSION + 8;
pub const CE_LEN: usize = CE_ADDR + 8;
pub const CE_PIECES: usize = CE_LEN + 4;
pub const CE_FIXED_BYTES: usize = CE_PIECES + 4;
pub const PIECE_BYTES: usize = 32;
const _: () = assert!(CE_FIXED_BYTES == 56);

/// Checkpoint bytes of an entry with keys of `dkey` and `akey` bytes and
/// `pieces` pieces of a byte array: the fixed part and the keys, padded to
/// 8 bytes, then the pieces.
pub fn checkpoint_entry_bytes(dkey: usize, akey: usize, pieces: usize) -> u64 {
    ((CE_FIXED_BYTES + dkey + akey).div_ceil(8) * 8 + pieces * PIECE_BYTES) as u64
}
/// Entry kinds.
pub const KIND_SINGLE: u8 = 1;
pub const KIND_ARRAY: u8 = 2;

pub(crate) fn get_u16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
pub(crate) fn get_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
pub(crate) fn get_u64(b: &[u8], o: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(w)
}
pub(crate) fn get_u128(b: &[u8], o: usize) -> u128 {
    let mut w = [0u8; 16];
    w.copy_from_slice(&b[o..o + 16]);
    u128::from_le_bytes(w)
}
pub(crate) fn put(b: &mut [u8], o: usize, v: &[u8]) {
    b[o..o + v.len()].copy_from_slice(v);
}

/// Where everything lives on the device; fixed when the device is formatted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub block_size: u32,
    pub checkpoint_offset: u64,
    /// Bytes of each of the two checkpoint areas (header unit included).
    pub checkpoint_bytes: u64,
    pub log_offset: u64,
    /// Bytes of the circular device log; a multiple of `ring_bytes`.
    pub log_bytes: u64,
    /// Bytes of the memory ring; records never cross a multiple of it.
    pub ring_bytes: u64,
    /// Largest single log write.
    pub max_commit_bytes: u64,
    pub device_bytes: u64,
    /// Bytes of a log segment: the unit the log is allocated and cleaned
    /// in (a power of two dividing `ring_bytes`, at most half of it).
    /// Segment `n` (addresses `[n·seg, (n+1)·seg)`) lives in device slot
    /// `n % (log_bytes / seg)`; no record crosses a segment's end.
    pub segment_bytes: u64,
}

impl Geometry {
    /// Lays out a device of `device_bytes`.
    pub fn plan(
        device: &str,
        device_bytes: u64,
        block_size: u32,
        ring_bytes: u64,
        checkpoint_bytes: u64,
        max_commit_bytes: u64,
        segment_bytes: u64,
    ) -> Result<Self> {
        let bad = |reason: String| StoreError::Layout {
            device: device.to_string(),
            reason,
        };
        let bs = u64::from(block_size);
        if bs == 0 || HEADER_UNIT_BYTES % bs != 0 {
            return Err(bad(format!("block size {bs} does not divide 4096")));
        }
        if ring_bytes < 4 * HEADER_UNIT_BYTES || ring_bytes % HEADER_UNIT_BYTES != 0 {
            return Err(bad(format!(
                "ring_bytes {ring_bytes} must be a multiple of 4096 and at least 16 KiB"
            )));
        }
        let ckpt = if checkpoint_bytes == 0 {
            (device_bytes / 8).clamp(64 << 10, 1 << 30)
        } else {
            checkpoint_bytes
        };
        let ckpt = ckpt.div_ceil(HEADER_UNIT_BYTES) * HEADER_UNIT_BYTES;
        let log_offset = HEADER_UNIT_BYTES + 2 * ckpt;
        let room = device_bytes.saturating_sub(log_offset);
        let log_bytes = room / ring_bytes * ring_bytes;
        if log_bytes < 2 * ring_bytes {
            return Err(bad(format!(
                "device of {device_bytes} bytes leaves {room} for the log, need at least 2 rings of {ring_bytes}"
            )));
        }
        let max_commit = max_commit_bytes.clamp(HEADER_UNIT_BYTES, ring_bytes / 2);
        let max_commit = max_commit / HEADER_UNIT_BYTES * HEADER_UNIT_BYTES;
        Ok(Self {
            segment_bytes: plan_segment(segment_bytes, ring_bytes),
            block_size,
            checkpoint_offset: HEADER_UNIT_BYTES,
            checkpoint_bytes: ckpt,
            log_offset,
            log_bytes,
            ring_bytes,
            max_commit_bytes: max_commit,
            device_bytes,
        })
    }

    /// Device slots of the log (segments it holds at once).
    pub fn slots(&self) -> u64 {
        self.log_bytes / self.segment_bytes
    }

    /// Segment number of log address `addr`.
    pub fn segment_of(&self, addr: u64) -> u64 {
        addr / self.segment_bytes
    }

    /// Device offset of log address `addr`.
    pub fn log_device_offset(&self, addr: u64) -> u64 {
        self.log_offset + addr % self.log_bytes
    }
    /// Device offset of checkpoint area `i` (0 or 1).
    pub fn checkpoint_area(&self, i: u64) -> u64 {
        self.checkpoint_offset + (i % 2) * self.checkpoint_bytes
    }

    pub fn encode_superblock(&self, out: &mut [u8]) {
        out[..SB_BYTES].fill(0);
        put(out, SB_MAGIC, &SUPER_MAGIC.to_le_bytes());
        put(out, SB_FORMAT, &STORE_FORMAT_VERSION.to_le_bytes());
        put(out, SB_BLOCK_SIZE, &self.block_size.to_le_bytes());
        put(out, SB_CKPT_OFFSET, &self.checkpoint_offset.to_le_bytes());
        put(out, SB_CKPT_BYTES, &self.checkpoint_bytes.to_le_bytes());
        put(out, SB_LOG_OFFSET, &self.log_offset.to_le_bytes());
        put(out, SB_LOG_BYTES, &self.log_bytes.to_le_bytes());
        put(out, SB_RING_BYTES, &self.ring_bytes.to_le_bytes());
        put(out, SB_MAX_COMMIT, &self.max_commit_bytes.to_le_bytes());
        put(out, SB_DEVICE_BYTES, &self.device_bytes.to_le_bytes());
        put(out, SB_SEGMENT_BYTES, &self.segment_bytes.to_le_bytes());
        let crc = crc32fast::hash(&out[..SB_CRC]);
        put(out, SB_CRC, &crc.to_le_bytes());
    }

    /// Decodes a superblock; `Ok(None)` if the block is all zeros (a device
    /// never formatted).
    pub fn decode_superblock(device: &str, b: &[u8]) -> Result<Option<Self>> {
        if b[..SB_BYTES].iter().all(|&x| x == 0) {
            return Ok(None);
        }
        let bad = |reason: String| StoreError::Layout {
            device: device.to_string(),
            reason,
        };
        if get_u32(b, SB_MAGIC) != SUPER_MAGIC {
            return Err(bad("block 0 is not a ferrite store superblock".into()));
        }
        let crc = crc32fast::hash(&b[..SB_CRC]);
        if get_u32(b, SB_CRC) != crc {
            return Err(bad("superblock checksum mismatch".into()));
        }
        let format = get_u32(b, SB_FORMAT);
        if format > STORE_FORMAT_VERSION {
            return Err(bad(format!(
                "store format {format} is newer than this engine reads (format \
                 {STORE_FORMAT_VERSION}): open it with a newer ferrite-engine"
            )));
        }
        if format != STORE_FORMAT_VERSION {
            return Err(bad(format!(
                "store format {format} is older than this engine reads (format \
                 {STORE_FORMAT_VERSION}): format 1 stores must be reformatted (zero block 0)"
            )));
        }
        let g = Self {
            block_size: get_u32(b, SB_BLOCK_SIZE),
            checkpoint_offset: get_u64(b, SB_CKPT_OFFSET),
            checkpoint_bytes: get_u64(b, SB_CKPT_BYTES),
            log_offset: get_u64(b, SB_LOG_OFFSET),
            log_bytes: get_u64(b, SB_LOG_BYTES),
            ring_bytes: get_u64(b, SB_RING_BYTES),
            max_commit_bytes: get_u64(b, SB_MAX_COMMIT),
            device_bytes: get_u64(b, SB_DEVICE_BYTES),
            segment_bytes: get_u64(b, SB_SEGMENT_BYTES),
        };
        let sane = g.ring_bytes >= 4 * HEADER_UNIT_BYTES
            && g.ring_bytes % HEADER_UNIT_BYTES == 0
            && g.log_bytes >= g.ring_bytes
            && g.log_bytes % g.ring_bytes == 0
            && g.log_offset
                .checked_add(g.log_bytes)
                .is_some_and(|e| e <= g.device_bytes)
            && g.checkpoint_offset >= HEADER_UNIT_BYTES
            && g.checkpoint_bytes
                .checked_mul(2)
                .and_then(|c| c.checked_add(g.checkpoint_offset))
                .is_some_and(|e| e <= g.log_offset)
            && g.max_commit_bytes >= HEADER_UNIT_BYTES
            && g.max_commit_bytes <= g.ring_bytes
            && g.segment_bytes.is_power_of_two()
            && g.segment_bytes >= HEADER_UNIT_BYTES
            && g.segment_bytes <= g.ring_bytes / 2
            && g.ring_bytes % g.segment_bytes == 0;
        if !sane {
            return Err(bad(format!("superblock geometry is inconsistent: {g:?}")));
        }
        Ok(Some(g))
    }
}

/// The segment size for `wanted` bytes and a ring of `ring_bytes`: the
/// largest power of two at most `wanted` (and at most half the ring) that
/// divides the ring, at least 4096 (a ring is a multiple of 4096).
fn plan_segment(wanted: u64, ring_bytes: u64) -> u64 {
    let cap = wanted.min(ring_bytes / 2).max(HEADER_UNIT_BYTES);
    let mut seg = 1u64 << (63 - cap.leading_zeros());
    while ring_bytes % seg != 0 {
        seg /= 2;
    }
    seg
}

/// Header of one checkpoint area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckpointHeader {
    pub generation: u64,
    /// Replay the log from here: every record before it is in the checkpoint.
    pub replay_start: u64,
    /// Lowest log address the checkpoint references (informational).
    pub log_tail: u64,
    pub next_version: u64,
    pub entry_count: u64,
    pub body_bytes: u64,
    pub body_crc: u32,
    /// The store's commit epoch when the checkpoint was taken (format 3).
    pub commit_epoch: u64,
    /// Damaged records every recovery so far found (format 3).
    pub corrupt_records: u64,
    /// The most recent damaged log ranges (start, bytes), oldest first.
    pub damaged: [(u64, u64); DAMAGE_RANGES_MAX],
    /// How many of `damaged` are used.
    pub damaged_count: u32,
}

impl CheckpointHeader {
    pub fn encode(&self, out: &mut [u8]) {
        out[..CK_HEADER_BYTES].fill(0);
        put(out, CK_MAGIC, &CHECKPOINT_MAGIC.to_le_bytes());
        put(out, CK_FORMAT, &CHECKPOINT_FORMAT_VERSION.to_le_bytes());
        put(out, CK_GENERATION, &self.generation.to_le_bytes());
        put(out, CK_REPLAY_START, &self.replay_start.to_le_bytes());
        put(out, CK_LOG_TAIL, &self.log_tail.to_le_bytes());
        put(out, CK_NEXT_VERSION, &self.next_version.to_le_bytes());
        put(out, CK_ENTRY_COUNT, &self.entry_count.to_le_bytes());
        put(out, CK_BODY_BYTES, &self.body_bytes.to_le_bytes());
        put(out, CK_BODY_CRC, &self.body_crc.to_le_bytes());
        let crc = crc32fast::hash(&out[..CK_HEADER_CRC]);
        put(out, CK_HEADER_CRC, &crc.to_le_bytes());
        out[CK_HEADER_BYTES..CD_END].fill(0);
        put(out, CD_COMMIT_EPOCH, &self.commit_epoch.to_le_bytes());
        put(out, CD_CORRUPT_RECORDS, &self.corrupt_records.to_le_bytes());
        let count = self.damaged_count.min(DAMAGE_RANGES_MAX as u32);
        put(out, CD_RANGE_COUNT, &count.to_le_bytes());
        for (i, (start, len)) in self.damaged.iter().enumerate().take(count as usize) {
            let o = CD_RANGES + i * CD_RANGE_BYTES;
            put(out, o, &start.to_le_bytes());
            put(out, o + 8, &len.to_le_bytes());
        }
        let crc = crc32fast::hash(&out[CK_HEADER_BYTES..CD_CRC]);
        put(out, CD_CRC, &crc.to_le_bytes());
    }

    /// The format of a header that checks (magic and CRC) but is newer
    /// than this engine reads: such an area must not be passed over as
    /// damaged, or recovery would fall back to an older state.
    pub fn newer_format(b: &[u8]) -> Option<u32> {
        let format = get_u32(b, CK_FORMAT);
        (get_u32(b, CK_MAGIC) == CHECKPOINT_MAGIC
            && format > CHECKPOINT_FORMAT_VERSION
            && get_u32(b, CK_HEADER_CRC) == crc32fast::hash(&b[..CK_HEADER_CRC]))
        .then_some(format)
    }

    /// `None` if the area holds no valid header.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let format = get_u32(b, CK_FORMAT);
        if get_u32(b, CK_MAGIC) != CHECKPOINT_MAGIC
            || !(format == CHECKPOINT_FORMAT_V2 || format == CHECKPOINT_FORMAT_VERSION)
            || get_u32(b, CK_HEADER_CRC) != crc32fast::hash(&b[..CK_HEADER_CRC])
        {
            return None;
        }
        let mut h = Self {
            generation: get_u64(b, CK_GENERATION),
            replay_start: get_u64(b, CK_REPLAY_START),
            log_tail: get_u64(b, CK_LOG_TAIL),
            next_version: get_u64(b, CK_NEXT_VERSION),
            entry_count: get_u64(b, CK_ENTRY_COUNT),
            body_bytes: get_u64(b, CK_BODY_BYTES),
            body_crc: get_u32(b, CK_BODY_CRC),
            ..Self::default()
        };
        if format == CHECKPOINT_FORMAT_VERSION {
            if get_u32(b, CD_CRC) != crc32fast::hash(&b[CK_HEADER_BYTES..CD_CRC]) {
                return None;
            }
            h.commit_epoch = get_u64(b, CD_COMMIT_EPOCH);
            h.corrupt_records = get_u64(b, CD_CORRUPT_RECORDS);
            h.damaged_count = get_u32(b, CD_RANGE_COUNT).min(DAMAGE_RANGES_MAX as u32);
            for i in 0..h.damaged_count as usize {
                let o = CD_RANGES + i * CD_RANGE_BYTES;
                h.damaged[i] = (get_u64(b, o), get_u64(b, o + 8));
            }
        }
        Some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_roundtrip_and_corruption() {
        let g = Geometry::plan("t", 64 << 20, 4096, 1 << 20, 0, 4 << 20, 4 << 20).unwrap();
        assert_eq!(g.log_bytes % g.ring_bytes, 0);
        assert_eq!(g.segment_bytes, 512 << 10);
        assert_eq!(g.max_commit_bytes, 512 << 10);
        let mut b = vec![0u8; 4096];
        assert!(Geometry::decode_superblock("t", &b).unwrap().is_none());
        g.encode_superblock(&mut b);
        assert_eq!(Geometry::decode_superblock("t", &b).unwrap(), Some(g));
        b[SB_LOG_BYTES] ^= 1;
        assert!(Geometry::decode_superblock("t", &b).is_err());
    }

    /// Guards the geometry check of a superblock whose CRC holds: areas
    /// that overlap the superblock or whose end overflows u64 (found by the
    /// `superblock` fuzz target: `2 * checkpoint_bytes` overflowed, a panic
    /// with overflow checks and a wrapped, accepted layout without) are
    /// refused with an error.
    #[test]
    fn superblock_with_impossible_checkpoint_areas_is_refused() {
        let g = Geometry::plan("t", 64 << 20, 4096, 1 << 20, 0, 4 << 20, 4 << 20).unwrap();
        let huge = Geometry {
            checkpoint_bytes: 1 << 63,
            ..g
        };
        let over_superblock = Geometry {
            checkpoint_offset: 0,
            ..g
        };
        for bad in [huge, over_superblock] {
            let mut b = vec![0u8; 4096];
            bad.encode_superblock(&mut b);
            let err = Geometry::decode_superblock("t", &b).unwrap_err();
            assert!(err.to_string().contains("inconsistent"), "{err}");
        }
    }

    #[test]
    fn checkpoint_header_roundtrip_and_corruption() {
        let h = CheckpointHeader {
            generation: 3,
            replay_start: 4096,
            log_tail: 0,
            next_version: 99,
            entry_count: 2,
            body_bytes: 200,
            body_crc: 7,
            commit_epoch: 70_000,
            corrupt_records: 2,
            damaged: [
                (8192, 80),
                (1 << 40, 4096),
                (0, 0),
                (0, 0),
                (0, 0),
                (0, 0),
                (0, 0),
                (0, 0),
            ],
            damaged_count: 2,
        };
        let mut b = vec![0u8; CD_END];
        h.encode(&mut b);
        assert_eq!(CheckpointHeader::decode(&b), Some(h));
        let good = b.clone();
        b[CK_GENERATION] ^= 0x10;
        assert_eq!(CheckpointHeader::decode(&b), None);
        // The damage record has its own CRC: a flipped count is refused.
        let mut b = good.clone();
        b[CD_CORRUPT_RECORDS] ^= 1;
        assert_eq!(CheckpointHeader::decode(&b), None);
        // A format 2 header (before the damage record) reads as no damage.
        let mut b = good;
        put(&mut b, CK_FORMAT, &CHECKPOINT_FORMAT_V2.to_le_bytes());
        let crc = crc32fast::hash(&b[..CK_HEADER_CRC]);
        put(&mut b, CK_HEADER_CRC, &crc.to_le_bytes());
        let old = CheckpointHeader::decode(&b).unwrap();
        assert_eq!(
            (old.generation, old.corrupt_records, old.commit_epoch),
            (3, 0, 0)
        );
    }

    #[test]
    fn tiny_device_is_refused() {
        assert!(Geometry::plan("t", 1 << 20, 4096, 1 << 20, 0, 1 << 20, 1 << 20).is_err());
    }

    #[test]
    fn segments_divide_the_ring() {
        assert_eq!(plan_segment(4 << 20, 64 << 20), 4 << 20);
        assert_eq!(plan_segment(3 << 20, 64 << 20), 2 << 20);
        assert_eq!(plan_segment(4 << 20, 47 * (64 << 20)), 4 << 20);
        assert_eq!(plan_segment(4 << 20, 1 << 20), 512 << 10);
        assert_eq!(plan_segment(64 << 10, 3 * 4096), 4096);
        assert_eq!(plan_segment(1, 16384), 4096);
    }
}
