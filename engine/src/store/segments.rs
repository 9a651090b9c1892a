//! The device slots of the log: which segment each holds, how much of it is
//! live, and which are free.
//!
//! Segment `n` (log addresses `[n·seg, (n+1)·seg)`) can only live in slot
//! `n % slots`, so a log address still names its device offset
//! (`log_offset + addr % log_bytes`) and readers of the device log need no
//! table. A head that reaches an occupied slot skips that segment number:
//! the address space has holes, the device has none. Slots are freed out of
//! order, by the checkpoint after the cleaner has copied their live records
//! away ([`Store::free_dead_slots`]).

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
    pub free: usize,
}

impl Slots {
    pub fn new(count: u64) -> Self {
        let n = count as usize;
        Self {
            held: vec![FREE; n],
            live: vec![0; n],
            born: vec![0; n],
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
    }

    pub fn release(&mut self, slot: usize) {
        if self.held[slot] != FREE {
            self.free += 1;
        }
        self.held[slot] = FREE;
        self.live[slot] = 0;
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
        self.live[s] = self.live[s].saturating_sub(bytes);
    }

    /// Replaces the estimates with exact per-slot live bytes.
    pub fn set_exact(&mut self, exact: &[u64]) {
        self.live.copy_from_slice(exact);
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
