//! Damage in the log: telling a record that was written and later damaged
//! from the torn end of the last commits, skipping past it, and keeping a
//! durable count of what was lost (`engine/FORMAT.md`, *Recovery*).
//!
//! Every record carries the low 16 bits of the store's *flush epoch* when
//! it was appended. The epoch moves by one when a flush completes that
//! made durable every record appended before the epoch last moved: once
//! epoch `e` is reached, everything appended before epoch `e - 1` was
//! reached is on the device. A record `A` appended at epoch `s` was
//! appended before epoch `s + 1`, and so were the bytes before it in its
//! segment; a record stamped `s + 2` or more proves them durable. Once
//! some record of the replay is stamped that, bytes lost before `A` had
//! been flushed (and acknowledged), and their loss is damage. Otherwise
//! they may be the part of a torn last commit that did not reach the
//! device, and the records after them in their segment are not replayed
//! either.

use super::format::{CheckpointHeader, DAMAGE_RANGES_MAX};
use super::recover::LogReader;
use super::Store;
use crate::store::error::Result;
use ferrite_proto::record::{
    get_u128, get_u16, get_u32, get_u64, RecordView, HEADER_BYTES, OFF_ADDR, OFF_AKEY_LEN,
    OFF_CONTAINER, OFF_DKEY_LEN, OFF_MAGIC, OFF_OBJECT, OFF_VALUE_LEN, RECORD_ALIGN, RECORD_MAGIC,
};
use std::collections::VecDeque;

/// Damage this store has found, carried from checkpoint to checkpoint.
#[derive(Debug, Default)]
pub(crate) struct Damage {
    /// Damaged records every recovery so far skipped.
    pub corrupt_records: u64,
    /// The most recent ranges (log address, bytes), oldest first.
    pub ranges: VecDeque<(u64, u64)>,
    /// The flush epoch: what records appended now are stamped with.
    pub epoch: u64,
    /// Appends made when the epoch last moved: a flush covering as many
    /// moves it again ([`Damage::flushed`]).
    pub epoch_mark: u64,
}

impl Damage {
    /// What a loaded checkpoint says.
    pub fn from_checkpoint(h: &CheckpointHeader) -> Self {
        Self {
            corrupt_records: h.corrupt_records,
            ranges: h.damaged[..h.damaged_count as usize]
                .iter()
                .copied()
                .collect(),
            epoch: h.commit_epoch,
            epoch_mark: 0,
        }
    }

    /// A flush made the first `upto` appends durable; `appends` have been
    /// made so far.
    pub fn flushed(&mut self, upto: u64, appends: u64) {
        if upto >= self.epoch_mark {
            self.epoch += 1;
            self.epoch_mark = appends;
        }
    }

    /// Counts one damaged range of `records` records.
    pub fn note(&mut self, start: u64, len: u64, records: u64) {
        self.corrupt_records += records;
        if self.ranges.len() == DAMAGE_RANGES_MAX {
            self.ranges.pop_front();
        }
        self.ranges.push_back((start, len));
    }

    /// Fills a checkpoint header's damage record.
    pub fn fill(&self, h: &mut CheckpointHeader, commit_epoch: u64) {
        h.commit_epoch = commit_epoch;
        h.corrupt_records = self.corrupt_records;
        h.damaged_count = self.ranges.len() as u32;
        for (slot, r) in h.damaged.iter_mut().zip(&self.ranges) {
            *slot = *r;
        }
    }
}

/// A range of a segment replay skipped: no record that checks starts in
/// `[start, end)`, and one does at `end`.
#[derive(Debug, Clone)]
pub(crate) struct Gap {
    pub start: u64,
    pub end: u64,
    /// Damaged records it seems to hold (at least 1).
    pub records: u64,
    /// The key its first damaged record's header names, if it looks sane
    /// (not checked: the record failed its CRC).
    pub key: Option<String>,
    /// The (unwrapped) commit epoch of the record at `end`.
    pub after: u64,
}

/// What one replay learned that a second one needs: where the torn ends
/// of segments are, the epochs it saw and how far it probed.
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    /// Gap starts that end their segment (a torn last commit).
    pub cuts: Vec<u64>,
    /// The highest commit epoch the earlier replay saw.
    pub epoch_floor: u64,
    /// The first segment number past every one it probed.
    pub probed_past: u64,
}

/// The state of one replay.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    pub cuts: Vec<u64>,
    pub gaps: Vec<Gap>,
    /// The start of a gap whose end is the next record replayed, the
    /// damaged records it seems to hold and the key it may have held.
    pub open_gap: Option<(u64, u64, Option<String>)>,
    /// The highest version replayed.
    pub max_version: u64,
    /// The highest commit epoch seen, unwrapped.
    pub epoch_max: u64,
}

impl Replay {
    pub fn new(plan: &Plan, checkpoint_epoch: u64, max_version: u64) -> Self {
        Self {
            cuts: plan.cuts.clone(),
            max_version,
            epoch_max: plan.epoch_floor.max(checkpoint_epoch),
            ..Self::default()
        }
    }

    /// A record replayed at `at`: closes the open gap, if any.
    pub fn replayed(&mut self, at: u64, view: &RecordView<'_>) {
        self.max_version = self.max_version.max(view.version());
        let epoch = unwrap_epoch(self.epoch_max, view.epoch());
        self.epoch_max = self.epoch_max.max(epoch);
        if let Some((start, records, key)) = self.open_gap.take() {
            self.gaps.push(Gap {
                start,
                end: at,
                records,
                key,
                after: epoch,
            });
        }
    }

    /// The gaps that are damage (some record proves their commit was
    /// done) and those that may be a torn last commit.
    pub fn classify(&self) -> (Vec<Gap>, Vec<Gap>) {
        self.gaps
            .iter()
            .cloned()
            .partition(|g| self.epoch_max >= g.after + 2)
    }
}

/// The key a damaged record's header names, for the error log: `None`
/// unless its magic is right and its key lengths fit in `bytes` (the
/// record's bytes from its start).
pub(crate) fn key_hint(bytes: &[u8]) -> Option<String> {
    if bytes.len() < HEADER_BYTES || get_u32(bytes, OFF_MAGIC) != RECORD_MAGIC {
        return None;
    }
    let dkey = usize::from(get_u16(bytes, OFF_DKEY_LEN));
    let akey = usize::from(get_u16(bytes, OFF_AKEY_LEN));
    let keys = bytes.get(HEADER_BYTES..HEADER_BYTES + dkey + akey)?;
    Some(format!(
        "container {} object {:#x} dkey {:?} akey {:?}",
        get_u64(bytes, OFF_CONTAINER),
        get_u128(bytes, OFF_OBJECT),
        String::from_utf8_lossy(&keys[..dkey]),
        String::from_utf8_lossy(&keys[dkey..]),
    ))
}

/// The 64-bit epoch nearest to `near` whose low 16 bits are `low`.
pub(crate) fn unwrap_epoch(near: u64, low: u16) -> u64 {
    let diff = i64::from(low.wrapping_sub(near as u16) as i16);
    near.checked_add_signed(diff).unwrap_or(u64::from(low))
}

impl Store {
    /// The store's flush epoch: what a record appended now is stamped
    /// with (its low 16 bits).
    pub(crate) fn commit_epoch(&self) -> u64 {
        self.damage.borrow().epoch
    }

    /// The record at `at` if one that checks starts there (any address
    /// field), reading windows of at least `min` bytes.
    pub(crate) async fn record_at<'r>(
        &self,
        reader: &'r mut LogReader,
        at: u64,
        seg_end: u64,
        min: u64,
    ) -> Result<Option<RecordView<'r>>> {
        let Some(head) = reader.get_min(self, at, HEADER_BYTES, min).await? else {
            return Ok(None);
        };
        let value_len = u64::from(get_u32(head, OFF_VALUE_LEN));
        let max_len = (seg_end - at).min(HEADER_BYTES as u64 + 8192 + value_len + 8);
        let Some(bytes) = reader.get_min(self, at, max_len as usize, min).await? else {
            return Ok(None);
        };
        Ok(RecordView::parse(bytes).ok())
    }

    /// The first address at or after `from` (on the record alignment) and
    /// before `seg_end` where a record that checks and carries its own
    /// address starts: past a damaged record, the next one; and how many
    /// damaged records the bytes skipped seem to hold besides the one
    /// before `from` (headers with the magic and their own address whose
    /// record fails its CRC). Only records of this very segment carry
    /// these addresses, so stale bytes of an earlier segment in the slot
    /// never match.
    pub(crate) async fn next_record(
        &self,
        reader: &mut LogReader,
        from: u64,
        seg_end: u64,
    ) -> Result<(Option<u64>, u64)> {
        let mut at = from.next_multiple_of(RECORD_ALIGN as u64);
        let mut damaged = 0;
        while at + HEADER_BYTES as u64 <= seg_end {
            let Some(head) = reader.get(self, at, HEADER_BYTES).await? else {
                break;
            };
            if get_u32(head, OFF_MAGIC) == RECORD_MAGIC && get_u64(head, OFF_ADDR) == at {
                let chunk = reader.chunk();
                if self.record_at(reader, at, seg_end, chunk).await?.is_some() {
                    return Ok((Some(at), damaged));
                }
                damaged += 1;
            }
            at += RECORD_ALIGN as u64;
        }
        Ok((None, damaged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_header_names_its_key_when_it_can() {
        let key = ferrite_proto::key::RecordKey::new(7, 9, b"dk", b"ak");
        let mut b = vec![0u8; ferrite_proto::record::record_len(&key, 3)];
        ferrite_proto::record::encode_record(&mut b, &key, b"xyz", 1, 0, Default::default(), 0)
            .unwrap();
        b[HEADER_BYTES + 5] ^= 1; // the value: the CRC fails, the key is intact
        let hint = key_hint(&b).unwrap();
        assert_eq!(hint, r#"container 7 object 0x9 dkey "dk" akey "ak""#);
        b[OFF_MAGIC] ^= 1;
        assert_eq!(key_hint(&b), None);
    }

    #[test]
    fn epochs_unwrap_to_the_nearest() {
        assert_eq!(unwrap_epoch(0, 5), 5);
        assert_eq!(unwrap_epoch(70_000, (70_001 & 0xffff) as u16), 70_001);
        assert_eq!(unwrap_epoch(70_000, (69_990 & 0xffff) as u16), 69_990);
        // Just past a wrap, and just before one.
        assert_eq!(unwrap_epoch(65_540, 65_530), 65_530);
        assert_eq!(unwrap_epoch(65_530, (65_541 & 0xffff) as u16), 65_541);
    }

    #[test]
    fn a_gap_is_damage_only_when_a_later_commit_proves_it_written() {
        let mut r = Replay {
            epoch_max: 10,
            ..Replay::default()
        };
        r.gaps.push(Gap {
            start: 0,
            end: 80,
            records: 1,
            key: None,
            after: 8,
        });
        r.gaps.push(Gap {
            start: 800,
            end: 880,
            records: 1,
            key: None,
            after: 9,
        });
        let (damage, torn) = r.classify();
        assert_eq!((damage.len(), torn.len()), (1, 1));
        assert_eq!((damage[0].start, torn[0].start), (0, 800));
    }

    /// The epoch moves only at a flush that covers every append made
    /// before it last moved.
    #[test]
    fn the_epoch_moves_at_flushes_covering_the_last_mark() {
        let mut d = Damage::default();
        d.flushed(0, 10);
        assert_eq!((d.epoch, d.epoch_mark), (1, 10));
        d.flushed(5, 20);
        assert_eq!(d.epoch, 1, "appends 5..10 are not durable yet");
        d.flushed(10, 30);
        assert_eq!((d.epoch, d.epoch_mark), (2, 30));
    }

    #[test]
    fn damage_keeps_the_latest_ranges() {
        let mut d = Damage::default();
        for i in 0..20 {
            d.note(i * 100, 72, 1);
        }
        assert_eq!(d.corrupt_records, 20);
        assert_eq!(d.ranges.len(), DAMAGE_RANGES_MAX);
        assert_eq!(d.ranges.back(), Some(&(1900, 72)));
        let mut h = CheckpointHeader::default();
        d.fill(&mut h, 42);
        let back = Damage::from_checkpoint(&h);
        assert_eq!((back.corrupt_records, back.epoch), (20, 42));
        assert_eq!(back.ranges, d.ranges);
    }
}
