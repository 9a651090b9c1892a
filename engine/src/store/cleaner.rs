//! The log cleaner: copies live records from the oldest part of the log to
//! its head, checkpoints, and so frees the space behind them.
//!
//! The log is a circular FIFO: the cleaner always works at `clean_upto`, the
//! oldest address not yet relocated. A record there is live if the key
//! directory still points at it; it is copied forward (same key, value and
//! version, new address) and published like any update, in log order. A copy
//! is only appended while no update or punch of its key is waiting to be
//! published, and in the same synchronous step as the liveness check, so in
//! log order the copy is still the key's newest record and replay reaches the
//! same state. Byte arrays are copied piece by piece (only their live bytes),
//! so an older array record never overwrites newer extents on replay.
//! Tombstones are never copied: the checkpoint written at the end of each pass
//! covers them, and the tail only moves once that checkpoint is durable.

use super::checkpoint::CheckpointInfo;
use super::log::AppendSpec;
use super::ops::Held;
use super::recover::LogReader;
use super::{Store, StoreError};
use crate::store::error::Result;
use ferrite_proto::record::{record_len, RecordFlags, RecordView, HEADER_BYTES, OFF_VALUE_LEN};
use std::rc::Rc;
use std::time::Duration;

/// Attempts to relocate one record before the pass gives up.
const RELOCATE_ROUNDS: u32 = 64;
/// Longest sleep of an idle cleaner between looks at the log.
const CLEANER_RECHECK: Duration = Duration::from_millis(100);
/// Pause after a failed cleaning pass.
const CLEANER_BACKOFF: Duration = Duration::from_millis(40);
/// A cleaning pass scans at least this many times the bytes of the last
/// checkpoint (at most a quarter of the log).
const CHECKPOINT_AMORTIZE: u64 = 8;
/// Shares of the cleaner's task queue (foreground queues default to 1000).
pub const CLEANER_SHARES: usize = 50;
/// The cleaner's device reads: a read the page cache holds completes in
/// the submitting thread (io_uring copies it inline), so it is one of the
/// cleaner's slices, and a 4 MiB one held every foreground request on the
/// xstream for milliseconds.
const CLEANER_READ_BYTES: u64 = 256 << 10;
/// Longest the cleaner runs before it lets the foreground run: the delay it
/// can add to a foreground request (the xstream's preempt timer is
/// milliseconds long).
const CLEANER_SLICE: Duration = Duration::from_micros(100);

/// What one cleaning pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanReport {
    pub scanned_bytes: u64,
    pub records_copied: u64,
    pub bytes_copied: u64,
    /// Records found dead by their key's bucket chain alone.
    pub records_dead_by_slot: u64,
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
    /// Is the log using much more than the live data (1.25× plus a slack of
    /// two segments, down to one when that is over a quarter of the live
    /// data, so that a store of a few segments also stays within 2×), or
    /// over three quarters of the device log? (The slack keeps a store with
    /// little live data from cleaning, and checkpointing, all the time.)
    /// A cleaning run, once [due](Self::cleaning_due), goes on while this
    /// holds.
    pub fn cleaning_wanted(&self) -> bool {
        self.log_over(4)
    }

    /// Should the background cleaner start a cleaning run: is the log over
    /// 1.5× the live data plus the slack of [`Store::cleaning_wanted`], or
    /// over three quarters of the device log? The gap between the two is
    /// hysteresis: deletes that shrink the live data a little do not start a
    /// run that copies everything older forward to free what they freed.
    pub fn cleaning_due(&self) -> bool {
        self.log_over(2)
    }

    /// `used > live + live / over + slack`, or over 3/4 of the device log.
    fn log_over(&self, over: u64) -> bool {
        let log = self.log.borrow();
        let used = log.head - log.tail;
        let live = self.live_bytes.get();
        used > live + live / over + self.cleaning_slack(live) || used > self.geo.log_bytes / 4 * 3
    }

    fn cleaning_slack(&self, live: u64) -> u64 {
        let seg = self.config.segment_bytes;
        (2 * seg).min(live / 4).max(seg)
    }

    /// One relocation step of the record `view` found at `origin`: appends
    /// a copy of every live piece of it (a single value is one piece) that
    /// fits in `room` bytes, which the caller reserved (at least the
    /// record's length, so the first piece always fits). `Appended` says
    /// whether pieces were left for another step.
    pub(super) fn relocate_step(
        &self,
        origin: u64,
        view: &RecordView<'_>,
        room: u64,
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
            };
            let (_, len, _) = self.append_now(&spec)?;
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

    /// Copies the record at `origin` forward if it is live; bytes copied.
    /// The copies are committed with the next group commit: waiting for
    /// each (as the step after an append did, finding its own copy
    /// pending) cost a commit, a block write, per relocated record.
    async fn relocate(&self, origin: u64, view: &RecordView<'_>) -> Result<u64> {
        let mut copied = 0;
        let room = view.len() as u64;
        for _ in 0..RELOCATE_ROUNDS {
            self.reserve_space(room, true).await?;
            match self.relocate_step(origin, view, room)? {
                Step::Done => return Ok(copied),
                Step::Appended { bytes, more } => {
                    copied += bytes;
                    if !more {
                        return Ok(copied);
                    }
                }
                Step::Blocked => {
                    let head = self.log.borrow().head;
                    self.wait_durable(head).await?;
                }
            }
        }
        Err(StoreError::Invalid(format!(
            "cleaner: record at {origin} kept changing"
        )))
    }

    /// One cleaning pass: relocates live records from the oldest part of the
    /// log (at least one segment, at most a quarter of the log), then
    /// checkpoints so the space can be reused.
    pub async fn clean(&self) -> Result<CleanReport> {
        self.check_writable()?;
        let (start, limit, budget) = {
            let log = self.log.borrow();
            let published = log.pending.front().map_or(log.durable, |p| p.addr);
            let used = log.head - log.tail;
            let live = self.live_bytes.get();
            // Each pass ends with a checkpoint of the whole index: scan at
            // least CHECKPOINT_AMORTIZE times what the last one wrote.
            let budget = used
                .saturating_sub(live + live / 4)
                .max(CHECKPOINT_AMORTIZE * self.checkpoint_bytes.get())
                .clamp(self.config.segment_bytes, self.geo.log_bytes / 4);
            (log.clean_upto, published, budget)
        };
        let end = limit.min(start + budget);
        let ring = self.geo.ring_bytes;
        let mut report = CleanReport::default();
        let mut reader = LogReader::with_chunk(CLEANER_READ_BYTES);
        let mut at = start;
        let mut slice = Slice::start();
        while at < end {
            let left = ring - at % ring;
            if left < HEADER_BYTES as u64 {
                at += left;
                continue;
            }
            let bytes = self.read_for_clean(&mut reader, at, left).await?;
            let view = RecordView::parse(bytes).map_err(|source| StoreError::Corrupt {
                device: self.device.clone(),
                addr: at,
                source,
            })?;
            let f = view.flags();
            let dead = f.has(RecordFlags::PAD) || f.has(RecordFlags::TOMBSTONE);
            if !dead && self.surely_dead(at, &view) {
                report.records_dead_by_slot += 1;
            } else if !dead {
                let n = self.relocate(at, &view).await?;
                if n > 0 {
                    report.records_copied += 1;
                    report.bytes_copied += n;
                }
            }
            at += view.len() as u64;
            slice.tick().await;
        }
        let head = self.log.borrow().head;
        self.wait_durable(head).await?;
        report.scanned_bytes = at - start;
        self.log.borrow_mut().clean_upto = at;
        report.checkpoint = Some(self.checkpoint().await?);
        let mut c = self.counters.borrow_mut();
        c.cleaner_passes += 1;
        c.cleaner_records_copied += report.records_copied;
        c.cleaner_bytes_copied += report.bytes_copied;
        c.cleaner_dead_by_slot += report.records_dead_by_slot;
        Ok(report)
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
        let tail = self.log.borrow().tail;
        let live = self.live_bytes.get();
        let over = (live + live / 2 + self.cleaning_slack(live)).min(self.geo.log_bytes / 4 * 3);
        tail + over + 1
    }

    /// Once [`Store::cleaning_due`], runs cleaning passes while
    /// [`Store::cleaning_wanted`], until [`Store::stop_cleaner`] or the store
    /// is poisoned; in between it sleeps until appends take the head to
    /// where cleaning is due (after a failed pass, `backoff`). While it runs, foreground writes
    /// that would take the log past twice the live data (plus four
    /// segments) wait for it (up to 10 s).
    pub async fn run_cleaner(self: Rc<Self>, backoff: Duration) {
        self.cleaner_active.set(true);
        while !self.cleaner_stop.get() && self.check_writable().is_ok() {
            if !self.cleaning_due() {
                // Deletes shrink the live data without moving the head far:
                // a write over its disk budget wakes the cleaner, and it
                // looks again at least every CLEANER_RECHECK anyway.
                let mark = self.cleaning_mark();
                let moved = self.head_watch.wait(mark, || self.log.borrow().head);
                let recheck = glommio::timer::sleep(CLEANER_RECHECK);
                futures::future::select(std::pin::pin!(moved), std::pin::pin!(recheck)).await;
                continue;
            }
            while self.cleaning_wanted() && !self.cleaner_stop.get() {
                if let Err(e) = self.clean().await {
                    tracing::warn!(device = %self.device, error = %e, "cleaning pass failed");
                    glommio::timer::sleep(backoff).await;
                    break;
                }
            }
        }
        self.cleaner_active.set(false);
    }

    /// Spawns [`Store::run_cleaner`] on a low-share, latency-insensitive task
    /// queue of the current executor.
    pub fn spawn_cleaner(self: &Rc<Self>) -> glommio::task::JoinHandle<()> {
        self.cleaner_stop.set(false);
        self.cleaner_active.set(true);
        self.spawn_background(CLEANER_SHARES, "store-cleaner", || {
            Rc::clone(self).run_cleaner(CLEANER_BACKOFF)
        })
    }

    /// Asks a running cleaner to stop after its current pass.
    pub fn stop_cleaner(&self) {
        self.cleaner_stop.set(true);
        self.head_watch.wake_all();
    }
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
