//! The hot-record keeper: keeps small live records in the memory ring.
//!
//! The ring holds the newest `ring_bytes` of the log; a record that falls out
//! of it is still served, but by RPC from the device (shm clients of a
//! file-backed device read it one-sided from the file's mapping). Bulk
//! data passing through (an IO500 ior phase writes gigabytes) would push out
//! every small record written before it: a file namespace's entries and small
//! files, 64-byte key-value records — the records clients look up one-sided
//! most and the cheapest to keep. So the keeper copies each live record whose
//! value (or extent) is at most `hot_value_max` bytes forward — the
//! cleaner's relocation: same key, value and version at a new address (for an
//! extent, its first live piece), published in log order and only while no
//! update of the key is pending — once the record is half a ring old, before
//! the ring overwrites it.
//!
//! Cost and bound: a kept record is written again every half ring of log
//! (its copy is half a ring old in turn), twice a lap. Each
//! copy is charged its bytes but at least [`KEEP_CHARGE_MIN_BYTES`] against a
//! budget of a quarter of each lap's bytes; past that budget the oldest small
//! records leave the ring as before (a hot set larger than the ring cannot
//! turn the log into copies only). The floor bounds the keeper's work, not
//! only its bytes: a copy costs a directory seek, an append and a publish
//! whatever its size, and a lap of bulk data with a million 100-byte entries
//! behind it would otherwise spend more time copying them than writing the
//! bulk. The keeper reads only the ring, never the device, and skips superseded
//! records by their state word.

use super::cleaner::Step;
use super::Store;
use crate::store::error::Result;
use ferrite_proto::record::{
    RecordFlags, RecordView, HEADER_BYTES, OFF_AKEY_LEN, OFF_DKEY_LEN, OFF_FLAGS, OFF_MAGIC,
    OFF_STATE, OFF_VALUE_LEN, RECORD_ALIGN, RECORD_MAGIC, STATE_SUPERSEDED,
};
use std::rc::Rc;
use std::time::Duration;

/// Shares of the keeper's task queue (foreground queues default to 1000).
pub const KEEPER_SHARES: usize = 250;
/// Live pieces of one extent record copied at most (the rest leave the ring).
const KEEP_PIECES_MAX: usize = 16;
/// What one copy step costs the lap's budget at least (module doc): with a
/// 1 GiB ring, at most 65,536 copy steps a lap (~32,768 small records kept,
/// each copied twice a lap). A copy step
/// took ~2.9 us in the timing of commit 0135c88; a target writing bulk data
/// at 0.5 GiB/s spends ~7.6 us on 4 KiB of it, so the keeper's time stays
/// under a quarter of the lap's.
pub const KEEP_CHARGE_MIN_BYTES: u64 = 4096;
/// Pause after a failed keeper pass.
const KEEPER_BACKOFF: Duration = Duration::from_millis(40);

/// The keeper's position, carried between passes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct KeeperState {
    /// Next record to look at (a record boundary).
    pub cursor: u64,
    /// Ring lap (`cursor / ring_bytes`) the budget counts for.
    pub lap: u64,
    /// Budget charged in that lap (bytes copied, each copy step at least
    /// [`KEEP_CHARGE_MIN_BYTES`]).
    pub lap_copied: u64,
}

/// The header fields the keeper decides on.
struct Peek {
    len: u64,
    /// A value or extent no bigger than the limit, not superseded.
    candidate: bool,
}

impl Store {
    /// Reads the header of the record at `at` straight from the ring.
    /// `None` if the bytes there are not a record (never written).
    fn peek(&self, at: u64, max_value: usize) -> Option<Peek> {
        let h = self.ring_slice(at, HEADER_BYTES);
        let u16_at = |o: usize| u16::from_le_bytes([h[o], h[o + 1]]) as usize;
        let u32_at = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        if u32_at(OFF_MAGIC) != RECORD_MAGIC {
            return None;
        }
        let value_len = u32_at(OFF_VALUE_LEN) as usize;
        let body = u16_at(OFF_DKEY_LEN) + u16_at(OFF_AKEY_LEN) + value_len;
        let len = (HEADER_BYTES + body).div_ceil(RECORD_ALIGN) * RECORD_ALIGN;
        let flags = RecordFlags(h[OFF_FLAGS]);
        let plain = !(flags.has(RecordFlags::PAD)
            || flags.has(RecordFlags::TOMBSTONE)
            || flags.has(RecordFlags::PUNCH_DKEY)
            || flags.has(RecordFlags::PUNCH_OBJECT));
        let superseded = u32_at(OFF_STATE) & STATE_SUPERSEDED != 0;
        Some(Peek {
            len: len as u64,
            candidate: plain && !superseded && value_len <= max_value,
        })
    }

    /// Copies the record at `at` (a candidate, `len` bytes) forward if it
    /// is still live — each live piece of an extent. Returns the bytes
    /// appended and what they cost the lap's budget (each step at least
    /// [`KEEP_CHARGE_MIN_BYTES`]).
    async fn keep_one(&self, at: u64, len: u64) -> Result<(u64, u64)> {
        // A private copy: the ring bytes may be overwritten while we wait
        // for space.
        let bytes = self.ring_slice(at, len as usize).to_vec();
        let Ok(view) = RecordView::parse(&bytes) else {
            return Ok((0, 0));
        };
        let (mut copied, mut charged) = (0, 0);
        for _ in 0..KEEP_PIECES_MAX {
            self.reserve_space(len, None, false).await?;
            match self.relocate_step(at, &view, len, false)? {
                Step::Appended { bytes, more } => {
                    copied += bytes;
                    charged += bytes.max(KEEP_CHARGE_MIN_BYTES);
                    if !more {
                        break;
                    }
                }
                Step::Done => break,
                // An update of the key (or this record's previous piece)
                // is waiting to be published: let it, then look again.
                Step::Blocked => {
                    self.wait_all_durable().await?;
                }
            }
        }
        Ok((copied, charged))
    }

    /// Looks at every record between the keeper's cursor and half a ring
    /// behind the head, copying the small live ones forward (counted in
    /// [`StoreStats`](super::StoreStats)' `keeper_*` fields).
    pub async fn keep_hot(&self) -> Result<()> {
        let ring = self.geo.ring_bytes;
        let max_value = self.config.hot_value_max as usize;
        let budget = ring / 4;
        loop {
            self.check_writable()?;
            let head = self.log.borrow().head;
            let mut st = self.keeper.get();
            if st.cursor + ring <= head {
                // Fell behind: the oldest lap still whole in the ring starts
                // at the next ring boundary past the overwritten bytes.
                let resume = (head - ring).div_ceil(ring) * ring;
                self.counters.borrow_mut().keeper_skipped_bytes += resume - st.cursor;
                st.cursor = resume;
            }
            if st.cursor + ring / 2 > head {
                self.keeper.set(st);
                return Ok(());
            }
            let at = st.cursor;
            if st.lap != at / ring {
                st.lap = at / ring;
                st.lap_copied = 0;
            }
            let seg = self.geo.segment_bytes;
            let left = seg - at % seg;
            let peek = if left < HEADER_BYTES as u64 {
                None
            } else {
                self.peek(at, max_value)
            };
            // Not a record: the rest of this segment was never written
            // (records never cross a segment's end).
            let Some(peek) = peek.filter(|p| p.len <= left) else {
                st.cursor += left;
                self.keeper.set(st);
                continue;
            };
            st.cursor += peek.len;
            let copy = peek.candidate && st.lap_copied < budget;
            self.keeper.set(st);
            if copy {
                let (n, charged) = self.keep_one(at, peek.len).await?;
                if n > 0 {
                    let mut st = self.keeper.get();
                    st.lap_copied += charged;
                    self.keeper.set(st);
                    let mut c = self.counters.borrow_mut();
                    c.keeper_records_kept += 1;
                    c.keeper_bytes_kept += n;
                }
            }
            glommio::yield_if_needed().await;
        }
    }

    /// Runs [`Store::keep_hot`] as the head moves, until
    /// [`Store::stop_cleaner`] (which stops the keeper too) or poisoning.
    pub async fn run_keeper(self: Rc<Self>) {
        while !self.cleaner_stop.get() && self.check_writable().is_ok() {
            if let Err(e) = self.keep_hot().await {
                tracing::warn!(device = %self.device, error = %e, "keeper pass failed");
                glommio::timer::sleep(KEEPER_BACKOFF).await;
                continue;
            }
            // Sleep until there is half a ring behind the head to look at.
            let mark = self.keeper.get().cursor + self.geo.ring_bytes / 2;
            self.head_watch.wait(mark, || self.log.borrow().head).await;
        }
    }

    /// Starts the keeper (if `hot_value_max` > 0) at the current head on a
    /// latency-insensitive task queue of the current executor.
    pub fn spawn_keeper(self: &Rc<Self>) {
        if self.config.hot_value_max == 0 {
            return;
        }
        let head = self.log.borrow().head;
        self.keeper.set(KeeperState {
            cursor: head,
            lap: head / self.geo.ring_bytes,
            lap_copied: 0,
        });
        self.spawn_background(
            glommio::Shares::Static(KEEPER_SHARES),
            "store-keeper",
            || Rc::clone(self).run_keeper(),
        );
    }
}
