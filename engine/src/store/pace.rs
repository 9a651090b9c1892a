//! Pacing the cleaner against foreground writes, so the log stays within
//! twice the live data without the cleaner taking a bigger share.
//!
//! The cleaner runs on a low-share task queue: left alone it gets what the
//! foreground leaves, which under a saturating overwrite load is too little,
//! and the log grows until foreground writes meet a hard bound and stall
//! for a whole pass. Instead, once the log's use passes where a running
//! cleaner starts ([`Store::pace_start`]), every foreground append owes
//! the cleaner scanning: its length times the bytes the cleaner must scan
//! to free one byte (`1 / (1 - f)`, `f` the live fraction of what recent
//! passes scanned), times a ramp that grows from 0 at the pace start to
//! [`PACE_GAIN`] at the foreground bound. A foreground append waits (on
//! [`Store::pace_watch`], woken as the cleaner scans) while the debt
//! exceeds what the cleaner scanned by more than [`PACE_ALLOWANCE_BYTES`]
//! and the cleaner is scanning (a scan starts owing at most that much): the
//! foreground pays for its own
//! space in small steps, proportional to what it wrote, instead of in
//! stalls. The use settles where the ramp times the gain is 1, below
//! the bound.
//!
//! Bounds: foreground appends (the keeper's copies too) never take the
//! log's use past [`Store::foreground_bound`], `max(2 × live − P, live + 2
//! segments)` with `P` = [`Store::pass_bytes`] (one pass's scan); they wait
//! for the tail to move there (the last resort, up to
//! [`CLEANER_WAIT`]). A pass scans at most `P` bytes, so its copies add at
//! most `P` on top (plus padding to a ring end, less than one record), and
//! the log's use stays within [`Store::space_bound`], `max(2 × live, live +
//! 2 segments + P)`. A cleaner step appends at most [`COPY_STEP_BYTES`] of
//! copies before waiting for them to be durable, so one group commit carries
//! no more than that of the cleaner's bytes.

use super::Store;
use std::time::Duration;

/// Copies a cleaner step appends before it waits for their commit.
pub const COPY_STEP_BYTES: u64 = 128 << 10;
/// Scanning the foreground may owe the cleaner before it waits.
pub const PACE_ALLOWANCE_BYTES: u64 = 256 << 10;
/// Scan owed per byte needed to free one at the foreground bound.
const PACE_GAIN: f64 = 1.5;
/// Highest live fraction of scanned bytes the pacing assumes (it would owe
/// without bound as the fraction nears 1).
const LIVE_FRACTION_MAX: f64 = 0.9;
/// Longest a foreground write waits for the cleaner before going on.
pub(crate) const CLEANER_WAIT: Duration = Duration::from_secs(10);

/// The pacing's counters: both grow without bound.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PaceState {
    /// Scan bytes foreground appends have owed.
    pub owed: u64,
    /// Bytes the cleaner has scanned (every byte pays for one owed).
    pub paid: u64,
    /// Live fraction of the bytes recent passes scanned, if any pass ran.
    pub live_fraction: Option<f64>,
}

impl Store {
    /// The log bytes one cleaning pass scans at most: a segment, or an
    /// eighth of the live data when that is less (so that a pass's copies
    /// leave room under twice the live data), but a quarter segment at least.
    pub fn pass_bytes(&self) -> u64 {
        let seg = self.config.segment_bytes;
        (self.live_bytes.get() / 8).clamp(seg / 4, seg)
    }

    /// Log use foreground appends wait at while a cleaner runs (module doc).
    pub fn foreground_bound(&self) -> u64 {
        let live = self.live_bytes.get();
        let seg = self.config.segment_bytes;
        (2 * live)
            .saturating_sub(self.pass_bytes())
            .max(live + 2 * seg)
    }

    /// The log use a running cleaner keeps the store within (module doc),
    /// less the padding of one ring end.
    pub fn space_bound(&self) -> u64 {
        self.foreground_bound() + self.pass_bytes()
    }

    /// Log use from which a running cleaner cleans and foreground appends
    /// owe it scanning: two passes below the foreground bound, but at least
    /// halfway from the live data to it. (Cleaning as late as that makes the
    /// log's lap long: a lap copies the records that stayed live through
    /// it, cold ones every lap, so the longer the lap the fewer copies per
    /// byte written.)
    pub(crate) fn pace_start(&self) -> u64 {
        let live = self.live_bytes.get();
        let bound = self.foreground_bound();
        bound
            .saturating_sub(2 * self.pass_bytes())
            .max(live + (bound - live) / 2)
    }

    /// Does a running cleaner clean now: is the log's use over the pace
    /// start, or over three quarters of the device log?
    pub fn cleaning_due(&self) -> bool {
        let used = {
            let log = self.log.borrow();
            log.head - log.tail
        };
        used > self.pace_start().min(self.geo.log_bytes / 4 * 3)
    }

    /// Charges a foreground append of `len` bytes (about to be made) the
    /// scanning it owes; below the pace start, forgives what is still owed.
    pub(crate) fn charge_append(&self, len: u64) {
        let used = {
            let log = self.log.borrow();
            log.head - log.tail
        };
        let (start, bound) = (self.pace_start(), self.foreground_bound());
        let mut p = self.pace.get();
        if used <= start || !self.cleaner_active.get() {
            if p.owed > p.paid {
                p.owed = p.paid;
                self.pace.set(p);
            }
            return;
        }
        let ramp = ((used - start) as f64 / bound.saturating_sub(start).max(1) as f64).min(1.0);
        let live = self.live_bytes.get() as f64;
        let f = p
            .live_fraction
            .unwrap_or(live / used as f64)
            .clamp(0.0, LIVE_FRACTION_MAX);
        p.owed += (len as f64 * PACE_GAIN * ramp / (1.0 - f)) as u64;
        self.pace.set(p);
    }

    /// The scan count a foreground append must wait for before it goes on,
    /// if it must: the cleaner is scanning and owed more than the allowance.
    pub(crate) fn pace_mark(&self) -> Option<u64> {
        let p = self.pace.get();
        let mark = p.owed.saturating_sub(PACE_ALLOWANCE_BYTES);
        (self.cleaner_scanning.get() && mark > p.paid).then_some(mark)
    }

    /// The cleaner scanned `bytes` more: pays them and wakes the writers
    /// waiting for that.
    pub(crate) fn pay_scan(&self, bytes: u64) {
        let mut p = self.pace.get();
        p.paid += bytes;
        self.pace.set(p);
        self.pace_watch.advanced(p.paid);
    }

    /// A pass scanned `scanned` bytes and copied `copied` of them: the
    /// live fraction the pacing assumes moves halfway to this pass's.
    pub(crate) fn note_pass(&self, scanned: u64, copied: u64) {
        if scanned == 0 {
            return;
        }
        let mut p = self.pace.get();
        let now = copied as f64 / scanned as f64;
        p.live_fraction = Some(p.live_fraction.map_or(now, |f| (f + now) / 2.0));
        self.pace.set(p);
    }

    /// Marks the cleaner as scanning or not; writers waiting on the pace
    /// go on once it is not. A scan starts owing at most the allowance:
    /// what writers owed while the cleaner was checkpointing (or asleep) is
    /// not paid by stalling them at once (the foreground bound still holds).
    pub(crate) fn set_scanning(&self, on: bool) {
        self.cleaner_scanning.set(on);
        if on {
            let mut p = self.pace.get();
            p.owed = p.owed.min(p.paid + PACE_ALLOWANCE_BYTES);
            self.pace.set(p);
        } else {
            self.pace_watch.wake_all();
        }
    }
}
