//! The log cleaner: picks the log segments that free the most for what they
//! cost to copy, copies their live records to the cold segment, checkpoints,
//! and so frees them. (A segment of single values whose records all die is
//! freed without it: [`Store::free_zero_slots`].)
//!
//! Victims are chosen by cost-benefit (free bytes × age / (1 + live bytes),
//! as in LFS): a segment of long-lived records is cleaned only once it has
//! lost much of them, and the copies go to cold segments, away from hot
//! writes (only updates of keys long unwritten join them, `cold.rs`).
//! While the log is well over the cleaning band (the cleaner is behind), the
//! emptiest segments go first ([`victim_score`]), for the room they free now.
//! A record is live if the key directory still points at it; it is copied
//! (same key, value and version, new address) and published like any update,
//! in append order. A cold segment is opened at the hot head, so every record
//! appended after a copy lies after it in address order, and a copy goes to
//! the open one only if its head is above the original, so it lies after
//! every older record of its key too. A copy is only appended while no update
//! or punch of its key is waiting to be published, and in the same
//! synchronous step as the liveness check, so in log order the copy is still
//! the key's newest record and replay reaches the same state. Byte arrays are copied piece by piece (only their live bytes),
//! so an older array record never overwrites newer extents on replay.
//! Tombstones are never copied: the checkpoint written at the end of each pass
//! covers them, and a segment holding one is only freed once that checkpoint
//! is durable. The cleaner also checkpoints every lap of the log the head moves
//! ([`Store::checkpoint_due`]), so replay stays bounded without passes.

use super::band::victim_score;
use super::checkpoint::CheckpointInfo;
use super::log::AppendSpec;
use super::ops::Held;
use super::recover::LogReader;
use super::segments::FREE;
use super::{Store, StoreError};
use crate::store::error::Result;
use ferrite_bdev::IoBuf;
use ferrite_proto::bucket::BUCKET_BYTES;
use ferrite_proto::record::{record_len, RecordFlags, RecordView, HEADER_BYTES, OFF_VALUE_LEN};
use futures::StreamExt;
use std::rc::Rc;
use std::time::Duration;

/// Attempts to relocate one record before the pass gives up.
const RELOCATE_ROUNDS: u32 = 64;
/// Longest sleep of an idle cleaner between looks at the log.
const CLEANER_RECHECK: Duration = Duration::from_millis(100);
/// Pause after a failed cleaning pass.
const CLEANER_BACKOFF: Duration = Duration::from_millis(40);
/// A cleaning pass that ends with a checkpoint scans at least this many
/// times the bytes of the last checkpoint (at most a quarter of the log).
const CHECKPOINT_AMORTIZE: u64 = 8;
/// A pass stops choosing victims once they free this many segments: its
/// copies need room until the checkpoint that ends it frees the victims,
/// so short passes keep the log's peak low.
const PASS_FREE_SEGMENTS: u64 = 2;
/// Segments more live than this are never worth cleaning.
const VICTIM_USE_MAX: f64 = 0.95;
/// Shares of the cleaner's task queue while the log is within the
/// cleaning band's bottom (`band.rs`; foreground queues default to
/// 1000).
pub const CLEANER_SHARES: usize = 50;
/// How often the executor asks [`CleanerShares`] for the cleaner's shares.
const SHARES_PERIOD: Duration = Duration::from_micros(500);
/// The cleaner's device reads: a read the page cache holds completes in
/// the submitting thread (io_uring copies it inline), so it is one of the
/// cleaner's slices, and a 4 MiB one held every foreground request on the
/// xstream for milliseconds. Their buffers ([`WINDOWS_IN_FLIGHT`] and one
/// being copied from) are allocated once, when the cleaner is spawned:
/// a new buffer of this size for every read cost the xstream 250-300 µs
/// (a fresh zeroed mapping faulted in page by page; the allocator returns
/// it to the system when freed), in the cleaner's slices that foreground
/// updates wait behind: about 29 reads a pass in `ferrite bench store
/// --cleaner-only`, and the first allocation took 5 ms.
pub(super) const CLEANER_READ_BYTES: u64 = 128 << 10;
/// Reads of listed live records one pass keeps in flight (at most
/// [`CLEANER_READ_BYTES`] each): 256 KiB in flight at most, beside the
/// foreground's writes on the same device. (With 4 reads of 256 KiB in
/// flight, foreground updates waited behind them: p99 700-830 µs against
/// 550-720 µs with 256 KiB in flight, `ferrite bench store --cleaner-only`
/// on a file, 3 runs each.)
const WINDOWS_IN_FLIGHT: usize = 2;
/// Buckets the cleaner's walk of the bucket table reads between looks at
/// its time slice (128 KiB).
const WALK_BUCKETS: u32 = 2048;
/// Longest the cleaner runs before it lets the foreground run: the delay it
/// can add to a foreground request (the xstream's preempt timer is
/// milliseconds long). `ferrite bench store --cleaner-only` (64 MiB of
/// 4 KiB values, skewed overwrites): on a malloc device, where no device
/// waits hide it, 100 µs slices raised the busy p99 from about 120 µs idle
/// to 181-197 µs and 30 µs ones to 144-157 µs (4 runs each; updates/s
/// alike, the busy p50 53-54 µs and 56-64 µs). On a uring file the
/// device's own share of the busy tail hides most of it: in one batch of
/// 8 runs each the busy p99 median fell from 904 to 758 µs and the median
/// block's busy/idle p99 from 1.96 to 1.84; in a second batch of 6 each,
/// 788 and 788 µs, 1.87 and 1.83.
const CLEANER_SLICE: Duration = Duration::from_micros(30);

/// What one cleaning pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanReport {
    /// Segments the pass chose to clean (0: none could be; no checkpoint).
    pub victims: u64,
    pub scanned_bytes: u64,
    pub records_copied: u64,
    pub bytes_copied: u64,
    /// Records found dead by their key's bucket chain alone.
    pub records_dead_by_slot: u64,
    /// Live records left in place because an update or punch of their key
    /// was waiting to be published.
    pub records_skipped_pending: u64,
    pub checkpoint: Option<CheckpointInfo>,
}

pub(super) enum Step {
    Done,
    /// Copies appended (bytes); `more`: live pieces left for another step.
    Appended {
        bytes: u64,
        more: bool,
    },
    Blocked,
}

impl Store {
    /// Is the log using much more than the live data (over the cleaning
    /// band's bottom, [`Store::band`]), or over three quarters of the
    /// device log, or is a foreground write waiting at the disk budget?
    /// (The band's segment of slack keeps a store with little live data
    /// from cleaning, and checkpointing, all the time.) A cleaning run,
    /// once [due](Self::cleaning_due), goes on while this holds.
    pub fn cleaning_wanted(&self) -> bool {
        self.reclaimable() && (self.cleaner_behind() || self.wall_waiters.get() > 0)
    }

    /// Should the background cleaner start a cleaning run: is the log over
    /// the band's top ([`Store::band`]), or over three quarters of the
    /// device log, or is a foreground write waiting at the disk budget
    /// (which the marks may lie above when the live data is a few
    /// segments)? The gap to the band's bottom is hysteresis: deletes that
    /// shrink the live data a little do not start a run (and its
    /// checkpoint) to free what they freed.
    pub fn cleaning_due(&self) -> bool {
        self.reclaimable() && (self.log_used() > self.band().1 || self.wall_waiters.get() > 0)
    }

    /// The cleaning band's marks (bottom, top) as disk use (`band.rs`):
    /// a quarter and a third over the live data plus a segment, raised
    /// towards the wall when the live data spans many segments; at most
    /// three quarters of the device log.
    fn band(&self) -> (u64, u64) {
        super::band::band_marks(
            self.live_bytes.get(),
            self.geo.segment_bytes,
            self.geo.log_bytes,
        )
    }

    /// One relocation step of the record `view` found at `origin`: appends
    /// a copy of every live piece of it (a single value is one piece) that
    /// fits in `room` bytes, which the caller reserved (at least the
    /// record's length, so the first piece always fits), to the cold
    /// segment if `cold`. `Appended` says whether pieces were left for
    /// another step.
    pub(super) fn relocate_step(
        &self,
        origin: u64,
        view: &RecordView<'_>,
        room: u64,
        cold: bool,
    ) -> Result<Step> {
        let key = view.key();
        let extent = view.flags().has(RecordFlags::EXTENT);
        // The live parts of the record: (value bytes, extent offset).
        let parts: Vec<(&[u8], u64)> = {
            let dir = self.dir.borrow();
            let Some(e) = dir.get((key.container, key.object), key.dkey, key.akey) else {
                return Ok(Step::Done);
            };
            match (&e.extents, extent) {
                (None, false) if e.addr == origin => vec![(view.value(), 0)],
                (Some(m), true) => {
                    let first = view.extent_offset();
                    let piece = |s: u64, e: u64| {
                        let bytes = view.value().get((s - first) as usize..(e - first) as usize);
                        bytes.map(|b| (b, s)).ok_or_else(|| {
                            StoreError::Invalid(format!("extent piece outside record at {origin}"))
                        })
                    };
                    m.iter()
                        .filter(|(_, p)| p.rec_addr == origin)
                        .map(|(s, p)| piece(*s, p.end))
                        .collect::<Result<_>>()?
                }
                _ => return Ok(Step::Done),
            }
        };
        if parts.is_empty() {
            return Ok(Step::Done);
        }
        // Live now, and an update or punch of the key is waiting to be
        // published: a copy appended now would follow it in log order and
        // undo it on replay. (A record already dead stays dead whatever is
        // pending, so that case is answered above without waiting for a
        // commit: the cleaner met it for every hot key's old records.)
        if self.has_pending(key.hash().0) {
            return Ok(Step::Blocked);
        }
        let (mut appended, mut used) = (0u64, 0u64);
        for (i, &(value, extent_offset)) in parts.iter().enumerate() {
            let need = record_len(&key, value.len()) as u64;
            if i > 0 && used + need > room {
                return Ok(Step::Appended {
                    bytes: appended,
                    more: true,
                });
            }
            let spec = AppendSpec {
                key: &key,
                value,
                flags: view.flags(),
                extent_offset,
                version: Some(view.version()),
                origin: Some(origin),
                // The directory lookup above found the key (with no await
                // since): no bucket walk to learn it again.
                held: Some(if extent { Held::Array } else { Held::Single }),
                cold: cold.then_some(origin),
            };
            let len = self.append_now(&spec)?.len;
            appended += u64::from(len);
            used += need;
        }
        Ok(Step::Appended {
            bytes: appended,
            more: false,
        })
    }

    /// Is the single value at `origin` surely dead? No slot of its key's
    /// bucket chain points at it (a single value's slot moves with its
    /// directory entry) and no update of the key waits to be published.
    /// Most records a pass scans are dead; this answers for them with one
    /// bucket chain walk instead of a directory seek.
    fn surely_dead(&self, origin: u64, view: &RecordView<'_>) -> bool {
        if view.flags().has(RecordFlags::EXTENT) {
            return false;
        }
        let hash = view.key().hash();
        !self.has_pending(hash.0)
            && self
                .table
                .borrow()
                .locate(hash.0, hash.fingerprint(), origin)
                .is_none()
    }

    /// Copies the record at `origin` forward if it is live; bytes copied
    /// (`None`: skipped, an update or punch of its key is waiting to be
    /// published). The copies are committed with the next group commit:
    /// waiting for each (as the step after an append did, finding its own
    /// copy pending) cost a commit, a block write, per relocated record.
    /// A record whose key has a foreground update pending is about to die:
    /// waiting for that commit cost the cleaner a turn of the foreground's
    /// queue (milliseconds) for each hot key's record, and once it is
    /// published the segment is freed without the copy (or, if the record
    /// outlives it, cleaned by a later pass).
    async fn relocate(&self, origin: u64, view: &RecordView<'_>) -> Result<Option<u64>> {
        let mut copied = 0;
        let room = view.len() as u64;
        for _ in 0..RELOCATE_ROUNDS {
            if self.log.borrow().cold_unwritten >= self.config.cleaner_commit_bytes {
                self.wait_all_durable().await?;
            }
            self.reserve_space(room, Some(origin), true).await?;
            match self.relocate_step(origin, view, room, true)? {
                Step::Done => return Ok(Some(copied)),
                Step::Appended { bytes, more } => {
                    copied += bytes;
                    if !more {
                        return Ok(Some(copied));
                    }
                }
                Step::Blocked if copied == 0 => return Ok(None),
                // The pieces copied so far wait to be published.
                Step::Blocked => {
                    self.wait_all_durable().await?;
                }
            }
        }
        Err(StoreError::Invalid(format!(
            "cleaner: record at {origin} kept changing"
        )))
    }

    /// The segments one cleaning pass copies out, best first: sealed and
    /// published ones (not an open head, wholly before the first record
    /// waiting to be published), by [`victim_score`] (cost-benefit, or the
    /// emptiest first while the cleaner is behind), until they free what
    /// the log is over its target (at least a segment), and, if one is pinned
    /// (the pass then ends with a checkpoint), amount to at least
    /// [`CHECKPOINT_AMORTIZE`] times the last checkpoint (at most a
    /// quarter of the log); else no more victims than hold about a
    /// segment of live records, the room [`Store::disk_budget`] leaves the
    /// copies.
    fn choose_victims(&self) -> Vec<(u64, u64)> {
        let seg = self.geo.segment_bytes;
        let log = self.log.borrow();
        let published = log.published();
        let (hot, cold) = log.open_segments(seg);
        let slots = &log.slots;
        let used = log.used_bytes(seg);
        let (bottom, top) = self.band();
        let behind = super::band::behind(used, top, seg);
        let mut scored: Vec<(f64, u64, u64)> = (0..slots.held.len())
            .filter_map(|s| {
                let n = slots.held[s];
                let live = slots.live[s].min(seg);
                let open = Some(n) == hot || Some(n) == cold;
                let sealed = n != FREE && !open && (n + 1) * seg <= published;
                let u = live as f64 / seg as f64;
                let age = (log.head - slots.born[s].min(log.head) + 1) as f64;
                (sealed && u < VICTIM_USE_MAX).then(|| (victim_score(u, age, behind), n, live))
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        let want_free = used
            .saturating_sub(bottom)
            .clamp(seg, PASS_FREE_SEGMENTS * seg);
        let want_scan =
            (CHECKPOINT_AMORTIZE * self.checkpoint_bytes.get()).min(self.geo.log_bytes / 4);
        let (mut freed, mut scanned, mut copies) = (0, 0, 0);
        let mut pinned = false;
        let mut victims = Vec::new();
        for (_, n, live) in scored {
            // A checkpoint ends the pass only if a victim is pinned: only
            // then is it worth scanning more to amortize it.
            let enough = freed >= want_free && (!pinned || scanned >= want_scan);
            // The copies take room before their victims are freed: a pass
            // of victims freed as their copies are published copies about a
            // segment at most, so the log does not swell by several
            // segments of copies while the foreground waits at its budget
            // (old segments of cold records are nearly all live).
            let swells = !victims.is_empty() && !pinned && copies + live > seg;
            if enough || swells || scanned >= self.geo.log_bytes / 4 {
                break;
            }
            victims.push((n, live));
            pinned |= slots.pinned[slots.slot_of(n)];
            freed += seg - live;
            scanned += seg;
            copies += live;
        }
        victims
    }

    /// One cleaning pass: copies the live records of the segments
    /// [`Store::choose_victims`] picks to the cold segment. Victims of
    /// single values only are freed as their copies are published
    /// ([`Store::free_zero_slots`]); if any victim is pinned, the pass ends
    /// with a checkpoint, which frees it.
    pub async fn clean(&self) -> Result<CleanReport> {
        self.check_writable()?;
        let mut report = CleanReport::default();
        let mut pass = Pass {
            reader: LogReader::with_chunk(CLEANER_READ_BYTES),
            slice: Slice::start(),
        };
        let victims = self.choose_victims();
        if victims.is_empty() {
            // Only open segments to clean (or none): nothing to free until
            // they are sealed, so no checkpoint either.
            return Ok(report);
        }
        report.victims = victims.len() as u64;
        let (listed, scanned, pinned) = self.split_victims(&victims);
        if !listed.is_empty() {
            self.clean_listed(&listed, &mut pass, &mut report).await?;
        }
        for n in scanned {
            self.clean_scanned(n, &mut pass, &mut report).await?;
        }
        self.wait_all_durable().await?;
        if pinned {
            report.checkpoint = Some(self.checkpoint().await?);
        }
        let mut c = self.counters.borrow_mut();
        c.cleaner_passes += 1;
        c.cleaner_records_copied += report.records_copied;
        c.cleaner_bytes_copied += report.bytes_copied;
        c.cleaner_dead_by_slot += report.records_dead_by_slot;
        Ok(report)
    }

    /// Splits the victims with live records into those whose live records
    /// one walk of the bucket table lists (sorted segment numbers: single
    /// values only, when the walk reads fewer bytes than their segments
    /// hold) and those read whole; and says whether any victim is pinned.
    /// (Victims without live records need neither: freed at once, or by the
    /// checkpoint if pinned.)
    fn split_victims(&self, victims: &[(u64, u64)]) -> (Vec<u64>, Vec<u64>, bool) {
        let seg = self.geo.segment_bytes;
        let log = self.log.borrow();
        let is_pinned = |n: u64| log.slots.pinned[log.slots.slot_of(n)];
        let pinned = victims.iter().any(|&(n, _)| is_pinned(n));
        let (mut listed, mut scanned): (Vec<u64>, Vec<u64>) = victims
            .iter()
            .filter(|&&(_, live)| live > 0)
            .map(|&(n, _)| n)
            .partition(|&n| !is_pinned(n));
        let walk = u64::from(self.table.borrow().touched()) * BUCKET_BYTES as u64;
        if walk > listed.len() as u64 * seg {
            scanned.append(&mut listed);
        }
        listed.sort_unstable();
        (listed, scanned, pinned)
    }

    /// Copies out the live records of the segments `victims` (sorted; single
    /// values only), found by one walk of the bucket table: a live single
    /// value is exactly a record a bucket slot points at. Only those are
    /// read, never the dead records between them, in windows (a run of them
    /// in one segment) that are all read at once, [`WINDOWS_IN_FLIGHT`] at
    /// a time: each await costs the cleaner a turn of the foreground's
    /// queue, so reading window after window made a pass as slow as the
    /// sum of its device reads and their turns.
    async fn clean_listed(
        &self,
        victims: &[u64],
        pass: &mut Pass,
        report: &mut CleanReport,
    ) -> Result<()> {
        let live = self.walk_live(victims, pass).await;
        let windows = windows(&live, self.geo.segment_bytes);
        let mut reads = futures::stream::iter(windows.iter().map(|w| self.read_window(w)))
            .buffered(WINDOWS_IN_FLIGHT);
        for w in &windows {
            let (buf, off) = reads.next().await.expect("one read per window")?;
            for &(addr, len) in &live[w.records.clone()] {
                let at = off + (addr - w.start) as usize;
                let bytes = &buf.as_slice()[at..at + len as usize];
                // A record that moved or died since the walk: nothing to copy.
                let Some(view) = RecordView::parse(bytes).ok() else {
                    continue;
                };
                if view.addr() != addr || view.flags().has(RecordFlags::EXTENT) {
                    continue;
                }
                report.scanned_bytes += len;
                self.relocate_counted(addr, &view, report).await?;
                pass.slice.tick().await;
            }
            self.keep_cleaner_buf(buf);
        }
        Ok(())
    }

    /// The records (address, length) of the segments `victims` (sorted) that
    /// bucket slots point at, sorted: one walk of the bucket table, a slice
    /// at a time.
    async fn walk_live(&self, victims: &[u64], pass: &mut Pass) -> Vec<(u64, u64)> {
        let seg = self.geo.segment_bytes;
        let mut live: Vec<(u64, u64)> = Vec::new();
        let touched = self.table.borrow().touched();
        let mut from = 0;
        while from < touched {
            let to = touched.min(from + WALK_BUCKETS);
            self.table.borrow().for_each_slot(from..to, |s| {
                if victims.binary_search(&(s.addr / seg)).is_ok() {
                    live.push((s.addr, u64::from(s.length)));
                }
            });
            from = to;
            pass.slice.tick().await;
        }
        live.sort_unstable();
        live
    }

    /// The bytes of `w`: copied from the memory ring if it still holds them
    /// (no await between the check and the copy), else read from the
    /// device, into one of the cleaner's kept buffers (hand it back with
    /// [`Store::keep_cleaner_buf`] once its records are copied). Returns
    /// the buffer and the window's offset in it.
    async fn read_window(&self, w: &Window) -> Result<(IoBuf, usize)> {
        let end = w.start + w.len;
        let kept = self.cleaner_bufs.borrow_mut().pop();
        {
            let mut c = self.counters.borrow_mut();
            c.cleaner_windows_read += 1;
            c.cleaner_read_buffers += u64::from(kept.is_none());
        }
        if end <= self.log.borrow().head && self.resident(w.start) {
            return Ok((self.ring_window(w.start, w.len as usize, kept)?, 0));
        }
        self.read_log_into(w.start, w.len as usize, kept).await
    }

    /// Keeps `buf` for the cleaner's next window read, up to
    /// [`WINDOWS_IN_FLIGHT`] + 1 heap buffers of a whole window each (not
    /// the channel's pool slots, which the foreground's reads need).
    fn keep_cleaner_buf(&self, buf: IoBuf) {
        let mut kept = self.cleaner_bufs.borrow_mut();
        let whole = buf.capacity() >= self.cleaner_buf_bytes();
        if kept.len() <= WINDOWS_IN_FLIGHT && whole && !buf.is_pooled() {
            kept.push(buf);
        }
    }

    /// Bytes a window read takes at most: [`CLEANER_READ_BYTES`] and the
    /// partial blocks at either end.
    fn cleaner_buf_bytes(&self) -> usize {
        (CLEANER_READ_BYTES + 2 * u64::from(self.geo.block_size)) as usize
    }

    /// Reads segment `n` record by record, copying out the live ones.
    async fn clean_scanned(&self, n: u64, pass: &mut Pass, report: &mut CleanReport) -> Result<()> {
        let seg = self.geo.segment_bytes;
        let (mut at, end) = (n * seg, (n + 1) * seg);
        while at + (HEADER_BYTES as u64) <= end {
            let bytes = self.read_for_clean(&mut pass.reader, at, end - at).await?;
            // The segment's records end where none checks past (damage
            // recovery skipped is skipped again, `damage.rs`).
            let Some(view) = RecordView::parse(bytes).ok().filter(|v| v.addr() == at) else {
                let (Some(next), _) = self.next_record(&mut pass.reader, at + 8, end).await? else {
                    break;
                };
                at = next;
                continue;
            };
            let f = view.flags();
            let dead = f.has(RecordFlags::PAD) || f.has(RecordFlags::TOMBSTONE);
            if !dead && self.surely_dead(at, &view) {
                report.records_dead_by_slot += 1;
            } else if !dead {
                self.relocate_counted(at, &view, report).await?;
            }
            report.scanned_bytes += view.len() as u64;
            at += view.len() as u64;
            pass.slice.tick().await;
        }
        Ok(())
    }

    /// [`Store::relocate`], counted in `report`.
    async fn relocate_counted(
        &self,
        at: u64,
        view: &RecordView<'_>,
        report: &mut CleanReport,
    ) -> Result<()> {
        match self.relocate(at, view).await? {
            Some(0) => {}
            Some(n) => {
                report.records_copied += 1;
                report.bytes_copied += n;
            }
            None => report.records_skipped_pending += 1,
        }
        Ok(())
    }

    /// The bytes of the record at `at` (and possibly some after it), `left`
    /// bytes before the ring's end, in `reader`'s window (no copy).
    async fn read_for_clean<'r>(
        &self,
        reader: &'r mut LogReader,
        at: u64,
        left: u64,
    ) -> Result<&'r [u8]> {
        let corrupt = |what: &'static str| StoreError::Corrupt {
            device: self.device.clone(),
            addr: at,
            source: ferrite_proto::FormatError::Mismatch(what),
        };
        let head = reader
            .get(self, at, HEADER_BYTES)
            .await?
            .ok_or_else(|| corrupt("record crosses the log end"))?;
        let vl = u32::from_le_bytes([
            head[OFF_VALUE_LEN],
            head[OFF_VALUE_LEN + 1],
            head[OFF_VALUE_LEN + 2],
            head[OFF_VALUE_LEN + 3],
        ]) as u64;
        let n = left.min(HEADER_BYTES as u64 + 8192 + vl + 8) as usize;
        reader
            .get(self, at, n)
            .await?
            .ok_or_else(|| corrupt("record crosses the log end"))
    }

    /// The head at which [`Store::cleaning_due`] turns true if neither
    /// the tail nor the live data move meanwhile.
    fn cleaning_mark(&self) -> u64 {
        let head = self.log.borrow().head;
        head + self.band().1.saturating_sub(self.log_used()) + 1
    }

    /// The head at which [`Store::checkpoint_due`] turns true.
    fn checkpoint_mark(&self) -> u64 {
        self.checkpoint_replay_start.get() + self.geo.log_bytes
    }

    /// Has the head moved a lap of the device log past where the last
    /// checkpoint's replay starts? Recovery then replays at most about a
    /// lap, as when only checkpoints freed segments, and a workload that
    /// frees none early gets no more checkpoints than before. (Segments
    /// freed as their records die need no checkpoint, so without this an
    /// overwrite workload would never take one and replay would grow
    /// without bound.)
    pub fn checkpoint_due(&self) -> bool {
        self.log.borrow().head >= self.checkpoint_mark()
    }

    /// Once [`Store::cleaning_due`], runs cleaning passes while
    /// [`Store::cleaning_wanted`], until [`Store::stop_cleaner`] or the store
    /// is poisoned; in between it sleeps until appends take the head to
    /// where cleaning is due (after a failed pass, `backoff`), and
    /// checkpoints when [`Store::checkpoint_due`]. While it runs, foreground writes
    /// that would take the log past [`Store::disk_budget`] wait for it (up
    /// to 10 s).
    pub async fn run_cleaner(self: Rc<Self>, backoff: Duration) {
        self.cleaner_active.set(true);
        while !self.cleaner_stop.get() && self.check_writable().is_ok() {
            if !self.cleaning_due() && self.checkpoint_due() {
                // Overwrites free their segments with no pass: replay's
                // length is bounded here.
                if let Err(e) = self.checkpoint().await {
                    tracing::warn!(device = %self.device, error = %e, "checkpoint failed");
                    self.counters.borrow_mut().cleaner_failures += 1;
                    glommio::timer::sleep(backoff).await;
                }
                continue;
            }
            if !self.cleaning_due() {
                // Deletes shrink the live data without moving the head far:
                // a write over its disk budget wakes the cleaner, and it
                // looks again at least every CLEANER_RECHECK anyway.
                self.idle_until(self.cleaning_mark().min(self.checkpoint_mark()))
                    .await;
                continue;
            }
            while self.cleaning_wanted() && !self.cleaner_stop.get() {
                match self.clean().await {
                    Err(e) => {
                        tracing::warn!(device = %self.device, error = %e, "cleaning pass failed");
                        self.counters.borrow_mut().cleaner_failures += 1;
                        glommio::timer::sleep(backoff).await;
                        break;
                    }
                    Ok(r) if r.victims == 0 => {
                        // What is over the mark is in open segments: wait
                        // for the head to seal one.
                        let mark = self.log.borrow().head + self.geo.segment_bytes / 4;
                        self.idle_until(mark).await;
                        break;
                    }
                    // Each pass lets the foreground in: on a device whose
                    // I/O completes at once, nothing else would.
                    Ok(_) => glommio::executor().yield_task_queue_now().await,
                }
            }
        }
        self.cleaner_active.set(false);
    }

    /// Sleeps until the head reaches `mark`, or [`CLEANER_RECHECK`].
    async fn idle_until(&self, mark: u64) {
        let moved = self.head_watch.wait(mark, || self.log.borrow().head);
        let recheck = glommio::timer::sleep(CLEANER_RECHECK);
        futures::future::select(std::pin::pin!(moved), std::pin::pin!(recheck)).await;
    }

    /// Spawns [`Store::run_cleaner`] on a low-share, latency-insensitive task
    /// queue of the current executor.
    pub fn spawn_cleaner(self: &Rc<Self>) -> glommio::task::JoinHandle<()> {
        self.cleaner_stop.set(false);
        self.cleaner_active.set(true);
        let shares = glommio::Shares::Dynamic(Rc::new(CleanerShares(Rc::downgrade(self))));
        let cleaner = self.spawn_background(shares, "store-cleaner", || {
            Rc::clone(self).run_cleaner(CLEANER_BACKOFF)
        });
        let have = self.cleaner_bufs.borrow().len();
        for _ in have..=WINDOWS_IN_FLIGHT {
            // (If none can be had, the reads allocate their own.)
            if let Ok(b) = self.io_buffer(None, self.cleaner_buf_bytes()) {
                self.counters.borrow_mut().cleaner_read_buffers += 1;
                self.keep_cleaner_buf(b);
            }
        }
        // The store's `Rc` is known from here on: prepare the slot the log
        // opens next (later ones as segments open).
        let log = self.log.borrow();
        self.prepare_after(&log, log.head / self.geo.segment_bytes);
        drop(log);
        cleaner
    }

    /// The cleaner's shares for its backlog: [`CLEANER_SHARES`] while the
    /// log is within the band's bottom ([`Store::band`]), rising linearly to
    /// a foreground queue's 1000 at the [disk budget](Self::disk_budget),
    /// and 1000 while a write waits there. (With fixed low shares a busy
    /// foreground left the cleaner too little of the core, so it got its
    /// time only by writes waiting at the budget: a stall of a whole pass
    /// for about one write in a hundred.)
    pub fn cleaner_shares(&self) -> usize {
        if self.wall_waiters.get() > 0 {
            return 1000;
        }
        let (low, high, used) = (self.band().0, self.disk_budget(), self.log_used());
        if used <= low || high <= low {
            return CLEANER_SHARES;
        }
        let over = (used - low).min(high - low) as f64 / (high - low) as f64;
        CLEANER_SHARES + ((1000 - CLEANER_SHARES) as f64 * over) as usize
    }

    /// Is the log over the cleaning band's bottom ([`Store::band`])?
    pub(super) fn cleaner_behind(&self) -> bool {
        self.log_used() > self.band().0
    }

    /// Asks a running cleaner to stop after its current pass.
    pub fn stop_cleaner(&self) {
        self.cleaner_stop.set(true);
        self.head_watch.wake_all();
    }
}

/// The cleaner queue's shares, read by the executor every
/// [`SHARES_PERIOD`] from [`Store::cleaner_shares`].
struct CleanerShares(std::rc::Weak<Store>);

impl glommio::SharesManager for CleanerShares {
    fn shares(&self) -> usize {
        self.0
            .upgrade()
            .map_or(CLEANER_SHARES, |s| s.cleaner_shares())
    }

    fn adjustment_period(&self) -> Duration {
        SHARES_PERIOD
    }
}

/// A run of listed live records in one segment that one read serves.
struct Window {
    start: u64,
    len: u64,
    /// Their indices in the list of live records.
    records: std::ops::Range<usize>,
}

/// The windows that serve the sorted live records `live`: each runs from a
/// record through the last one in the same segment that ends within
/// [`CLEANER_READ_BYTES`] of its start.
fn windows(live: &[(u64, u64)], seg: u64) -> Vec<Window> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < live.len() {
        let start = live[i].0;
        let mut j = i + 1;
        while j < live.len()
            && live[j].0 / seg == start / seg
            && live[j].0 + live[j].1 - start <= CLEANER_READ_BYTES
        {
            j += 1;
        }
        let last = live[j - 1];
        out.push(Window {
            start,
            len: last.0 + last.1 - start,
            records: i..j,
        });
        i = j;
    }
    out
}

/// A pass's reader and time slice.
struct Pass {
    reader: LogReader,
    slice: Slice,
}

/// The cleaner's time slice: [`Slice::tick`] yields the task queue once the
/// slice has run [`CLEANER_SLICE`] (or the executor wants to preempt).
struct Slice(std::time::Instant);

impl Slice {
    fn start() -> Self {
        Self(std::time::Instant::now())
    }

    async fn tick(&mut self) {
        if self.0.elapsed() >= CLEANER_SLICE || glommio::executor().need_preempt() {
            glommio::executor().yield_task_queue_now().await;
            self.0 = std::time::Instant::now();
        }
    }
}
