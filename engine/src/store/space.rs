//! Admission by space. The live data may fill the device log only up to a
//! ceiling: [`StoreConfig::fill_ceiling_percent`] of its usable capacity,
//! the log less the room it needs besides the live data (the open hot and
//! cold segments, the cleaner's slots and a segment of copies in flight),
//! which no live record can ever use. An
//! update that would take the live data past it fails at once with
//! [`StoreError::LogFull`] ("no space"), before it reserves anything;
//! punches and tombstones add no live data and are always admitted, and an
//! overwrite of a single value is charged only what it adds to the key's
//! old one, so a full store can be emptied and rewritten.
//!
//! Why a ceiling: the cleaner frees a segment by copying its live records
//! forward, `u / (1 - u)` bytes copied per byte freed for a segment `u`
//! full. With live data close to the capacity every segment is nearly
//! full, each pass copies almost as much as it frees, and a write that
//! waits for room waits behind an unbounded amount of copying (a store
//! three quarters full of live data ran 13 000 cleaner passes and as many
//! checkpoints while one `dd` made no progress for 11 minutes). Below the
//! ceiling the free and dead bytes are at least `1 - ceiling` of the log,
//! which bounds the copying; at it, writers get an answer.
//!
//! [`StoreConfig::fill_ceiling_percent`]: super::StoreConfig::fill_ceiling_percent

use super::format::{checkpoint_entry_bytes, HEADER_UNIT_BYTES, PIECE_BYTES};
use super::log::CLEANER_SLOTS;
use super::{Store, StoreError};
use crate::store::error::Result;
use ferrite_proto::key::RecordKey;

/// Segments of the log kept out of the ceiling besides the cleaner's slots:
/// the open hot and cold segments, and one of copies whose victims are not
/// yet freed.
const RESERVED_SEGMENTS: u64 = 3;
/// The share of the checkpoint area new keys may fill ([`Store::admit_index`]).
const INDEX_SHARE: (u64, u64) = (15, 16);

impl Store {
    /// The most live bytes the store admits (see the module docs).
    pub fn live_ceiling(&self) -> u64 {
        self.log_usable() / 100 * u64::from(self.config.fill_ceiling_percent.min(100))
    }

    /// The device log less the segments the log needs besides the live
    /// data (see the module docs), or half of it if that is less (a log of
    /// a few big segments: 128 MiB in 32 MiB segments had nothing left).
    pub fn log_usable(&self) -> u64 {
        let (log, seg) = (self.geo.log_bytes, self.geo.segment_bytes);
        let room = (RESERVED_SEGMENTS + CLEANER_SLOTS as u64) * seg;
        log - room.min(log / 2)
    }

    /// Admits an update that adds `grows` bytes of live data, or refuses it
    /// with [`StoreError::LogFull`] when the live data, with what appended
    /// new keys will add once published, would pass [`Store::live_ceiling`].
    pub(crate) fn admit(&self, grows: u64) -> Result<()> {
        if grows == 0 {
            return Ok(());
        }
        let (live, fits) = self.live_need(grows);
        if fits {
            return Ok(());
        }
        self.counters.borrow_mut().writes_refused_full += 1;
        Err(self.no_room(live))
    }

    /// The live data with what appended new keys will add once published,
    /// and whether `grows` bytes more stay within [`Store::live_ceiling`].
    fn live_need(&self, grows: u64) -> (u64, bool) {
        let live = self.live_bytes.get() + self.log.borrow().pending_new_bytes;
        (live, live + grows <= self.live_ceiling())
    }

    /// The error of a store whose live data (`live` bytes, counting
    /// appends not yet published) leaves no room.
    pub(crate) fn no_room(&self, live: u64) -> StoreError {
        StoreError::LogFull {
            device: self.device.clone(),
            live,
            ceiling: self.live_ceiling(),
            capacity: self.geo.log_bytes,
        }
    }

    /// Admits a write of a record of `len` bytes to `key` ([`Store::admit`]):
    /// a single value (`extent` false) replaces the key's old one, whose
    /// live bytes it frees; a piece of a byte array may replace nothing, so
    /// it is charged in full.
    /// New keys and new pieces of byte arrays are also refused once their
    /// entries would not fit the checkpoint area ([`Store::admit_index`]).
    /// The key's entry is looked up only when the write would not be
    /// admitted as a new key (the most it can add): not on every update.
    pub(crate) fn admit_write(&self, key: &RecordKey<'_>, len: u64, extent: bool) -> Result<()> {
        let new_entry = checkpoint_entry_bytes(key.dkey.len(), key.akey.len(), usize::from(extent));
        if self.index_need(new_entry).1 && self.live_need(len).1 {
            return Ok(());
        }
        let (old, index) = {
            let dir = self.dir.borrow();
            let entry = dir.get((key.container, key.object), key.dkey, key.akey);
            let index = match &entry {
                None => new_entry,
                Some(_) if extent => PIECE_BYTES as u64,
                Some(_) => 0,
            };
            let single = entry.filter(|e| e.extents.is_none() && !extent);
            (single.map_or(0, |e| e.live_bytes()), index)
        };
        self.admit_index(index)?;
        self.admit(len.saturating_sub(old))
    }

    /// Admits `grows` more bytes of checkpointed index, or refuses them with
    /// [`StoreError::CheckpointTooLarge`]: the checkpoint of every entry, a
    /// new key appended but not yet published counted as this one, must fit
    /// [`INDEX_SHARE`] of the checkpoint area (the rest is for pieces of
    /// byte arrays not yet published). A checkpoint that does not fit
    /// fails every cleaning pass, and the log would fill for good.
    fn admit_index(&self, grows: u64) -> Result<()> {
        if grows == 0 {
            return Ok(());
        }
        let (need, fits) = self.index_need(grows);
        if fits {
            return Ok(());
        }
        self.counters.borrow_mut().writes_refused_full += 1;
        let have = self.index_room();
        Err(StoreError::CheckpointTooLarge { need, have })
    }

    /// What the checkpoint would need with `grows` bytes more ([`Store::admit_index`]),
    /// and whether that fits.
    fn index_need(&self, grows: u64) -> (u64, bool) {
        let pending = self.log.borrow().pending_new_keys as u64 * grows;
        let need = self.dir.borrow().checkpoint_bytes() + pending + grows;
        (need, need <= self.index_room())
    }

    /// [`INDEX_SHARE`] of the checkpoint area.
    fn index_room(&self) -> u64 {
        let area = self.geo.checkpoint_bytes - HEADER_UNIT_BYTES;
        area / INDEX_SHARE.1 * INDEX_SHARE.0
    }

    /// Does the log hold a segment's worth of bytes that are not live
    /// (dead records, tombstones, abandoned rests of segments)? If not, no
    /// pass can free a segment: it would copy live records forward and
    /// checkpoint for nothing, again and again (a store three quarters
    /// full of live data once ran 13 000 passes so while a write waited).
    pub(super) fn reclaimable(&self) -> bool {
        let dead = self.log_used().saturating_sub(self.live_bytes.get());
        dead >= self.geo.segment_bytes
    }

    /// Cleaner bytes copied per byte the foreground wrote (the keeper's
    /// copies counted as neither), from the counters `c`.
    pub(super) fn cleaner_write_amp_of(&self, c: &super::Counters) -> f64 {
        let foreground = c
            .bytes_appended
            .saturating_sub(c.cleaner_bytes_copied)
            .saturating_sub(c.keeper_bytes_kept);
        if foreground == 0 {
            return 0.0;
        }
        c.cleaner_bytes_copied as f64 / foreground as f64
    }
}
