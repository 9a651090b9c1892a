//! The device slots of the log: which segment each holds, how much of it is
//! live, and which are free.
//!
//! Segment `n` (log addresses `[n·seg, (n+1)·seg)`) can only live in slot
//! `n % slots`, so a log address still names its device offset
//! (`log_offset + addr % log_bytes`) and readers of the device log need no
//! table. A head that reaches an occupied slot skips that segment number:
//! the address space has holes, the device has none. Slots are freed out of
//! order, two ways:
//! - a sealed segment of single values only whose last live record was
//!   superseded or deleted is freed as soon as that is published
//!   ([`Store::free_zero_slots`]), with no checkpoint: replay from the last
//!   checkpoint meets each of its keys again later in the log (the records
//!   that superseded them are durable before they are published), so its
//!   records are no longer needed, whether replay finds them or the slot's
//!   next segment;
//! - any other slot (one holding a tombstone, a punch or a byte-array
//!   record, whose liveness the estimates do not know exactly, and whose
//!   tombstones must outlive every older record of their key) by the
//!   checkpoint that finds it without live records, once that is durable
//!   ([`Store::free_dead_slots`]).

use super::dir::Entry;
use super::Store;

/// The segment number of a free slot.
pub(crate) const FREE: u64 = u64::MAX;

/// Per device slot: the segment it holds, an estimate of its live bytes and
/// when it was opened.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    /// Segment number held by each slot, [`FREE`] if none.
    pub held: Vec<u64>,
    /// Live bytes of each slot's records: exact after each checkpoint
    /// ([`Slots::set_exact`]), kept up to date between them for single
    /// values (an estimate for byte arrays).
    pub live: Vec<u64>,
    /// The hot head when the slot was opened (its age for the cleaner).
    pub born: Vec<u64>,
    /// The slot holds a record that is not a single value (a tombstone, a
    /// punch, a byte-array piece): only a checkpoint may free it.
    pub pinned: Vec<bool>,
    /// Segments whose live bytes fell to 0, to free once sealed and
    /// published ([`Store::free_zero_slots`]).
    pub zero: Vec<u64>,
    pub free: usize,
}

impl Slots {
    pub fn new(count: u64) -> Self {
        let n = count as usize;
        Self {
            held: vec![FREE; n],
            live: vec![0; n],
            born: vec![0; n],
            pinned: vec![false; n],
            zero: Vec::new(),
            free: n,
        }
    }

    pub fn count(&self) -> u64 {
        self.held.len() as u64
    }

    pub fn slot_of(&self, segment: u64) -> usize {
        (segment % self.count()) as usize
    }

    /// The first segment number at or after `from` whose slot is free.
    pub fn next_free(&self, from: u64) -> Option<u64> {
        (from..from + self.count()).find(|&n| self.held[self.slot_of(n)] == FREE)
    }

    /// Marks segment `n`'s slot as holding it (the slot must be free).
    pub fn occupy(&mut self, n: u64, born: u64) {
        let s = self.slot_of(n);
        debug_assert_eq!(self.held[s], FREE, "slot {s} taken for segment {n}");
        if self.held[s] == FREE {
            self.free -= 1;
        }
        self.held[s] = n;
        self.live[s] = 0;
        self.born[s] = born;
        self.pinned[s] = false;
    }

    pub fn release(&mut self, slot: usize) {
        if self.held[slot] != FREE {
            self.free += 1;
        }
        self.held[slot] = FREE;
        self.live[slot] = 0;
        self.pinned[slot] = false;
    }

    /// Marks segment `n`'s slot as holding a record only a checkpoint can
    /// tell the liveness of.
    pub fn pin(&mut self, n: u64) {
        let s = self.slot_of(n);
        self.pinned[s] = true;
    }

    pub fn used(&self) -> u64 {
        self.count() - self.free as u64
    }

    /// Start address of the oldest segment held (0 when none).
    pub fn low_addr(&self, segment_bytes: u64) -> u64 {
        self.held
            .iter()
            .filter(|&&n| n != FREE)
            .min()
            .map_or(0, |n| n * segment_bytes)
    }

    /// Adds `bytes` of live data to segment `segment`'s slot.
    pub fn add_live(&mut self, segment: u64, bytes: u64) {
        let s = self.slot_of(segment);
        self.live[s] += bytes;
    }

    pub fn sub_live(&mut self, segment: u64, bytes: u64) {
        let s = self.slot_of(segment);
        let was = self.live[s];
        self.live[s] = was.saturating_sub(bytes);
        if was > 0 && self.live[s] == 0 && self.held[s] == segment && !self.pinned[s] {
            self.zero.push(segment);
        }
    }

    /// Replaces the estimates with exact per-slot live bytes.
    pub fn set_exact(&mut self, exact: &[u64]) {
        self.live.copy_from_slice(exact);
        for (s, &live) in exact.iter().enumerate() {
            let n = self.held[s];
            if live == 0 && n != FREE && !self.pinned[s] {
                self.zero.push(n);
            }
        }
    }
}

impl Store {
    /// Calls `f(address, bytes)` for each record `e` keeps live: a single
    /// value's record, each piece of a byte array.
    pub(crate) fn each_live_record(e: &Entry, mut f: impl FnMut(u64, u64)) {
        match &e.extents {
            None => f(e.addr, u64::from(e.len)),
            Some(m) => m.iter().for_each(|(start, p)| f(p.rec_addr, p.end - start)),
        }
    }

    /// Adds the live bytes of `e` to `live` (per slot; at least 1 per
    /// record, so a slot with a live record is never 0).
    pub(crate) fn add_slot_live(&self, live: &mut [u64], e: &Entry) {
        let (seg, slots) = (self.geo.segment_bytes, self.geo.slots());
        Self::each_live_record(e, |addr, bytes| {
            live[((addr / seg) % slots) as usize] += bytes.max(1);
        });
    }

    /// Frees the slots of [`Slots::zero`] that are still without live
    /// records, unpinned, sealed and published (all their records are then
    /// superseded by durable ones); keeps the others that may still be
    /// freed so (open or not yet published).
    pub(crate) fn free_zero_slots(&self) {
        let seg = self.geo.segment_bytes;
        let mut log = self.log.borrow_mut();
        if log.slots.zero.is_empty() {
            return;
        }
        let published = log.published();
        let (hot, cold) = log.open_segments(seg);
        let slots = &mut log.slots;
        let before = slots.free;
        let mut zero = std::mem::take(&mut slots.zero);
        zero.retain(|&n| {
            let s = slots.slot_of(n);
            if slots.held[s] != n || slots.live[s] != 0 || slots.pinned[s] {
                return false;
            }
            let open = Some(n) == hot || Some(n) == cold;
            if open || (n + 1) * seg > published {
                return true;
            }
            slots.release(s);
            false
        });
        slots.zero = zero;
        let freed = (slots.free - before) as u64;
        drop(log);
        if freed > 0 {
            self.counters.borrow_mut().segments_freed_early += freed;
            self.space_freed();
        }
    }

    /// Frees every slot that held no live record at a checkpoint whose
    /// replay starts at `replay_start` (now durable): a segment wholly
    /// before it, and not the open cold segment `keep`.
    pub(crate) fn free_dead_slots(&self, exact: &[u64], replay_start: u64, keep: Option<u64>) {
        let seg = self.geo.segment_bytes;
        let mut log = self.log.borrow_mut();
        let (hot_open, cold_open) = log.open_segments(seg);
        let slots = &mut log.slots;
        let before = slots.free;
        for (s, &live) in exact.iter().enumerate() {
            let n = slots.held[s];
            let open = Some(n) == hot_open || Some(n) == cold_open || Some(n) == keep;
            if n != FREE && live == 0 && !open && (n + 1) * seg <= replay_start {
                slots.release(s);
            }
        }
        let freed = slots.free > before;
        drop(log);
        if freed {
            self.space_freed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_free_skips_occupied_slots() {
        let mut s = Slots::new(4);
        s.occupy(0, 0);
        s.occupy(1, 0);
        assert_eq!(s.next_free(0), Some(2));
        s.occupy(6, 0);
        assert_eq!(s.next_free(5), Some(7));
        assert_eq!(s.next_free(4), Some(7));
        s.occupy(3, 0);
        assert_eq!(s.next_free(0), None);
        assert_eq!(s.used(), 4);
        s.release(1);
        assert_eq!(s.next_free(6), Some(9));
        assert_eq!(s.used(), 3);
    }
}
