//! Preparing device slots before the log writes into them.
//!
//! A file bdev starts sparse. The first write into a hole makes the file
//! system allocate blocks, and with O_DIRECT convert the extent when the
//! write completes; the flush after it then commits that to the journal. On
//! the machines this was measured on, that made a durable group commit into
//! fresh space cost 1.5 times one into allocated space (`ferrite bench kv
//! --op put` at device durability: 42 k/s against 62 k/s on a file filled
//! beforehand).
//!
//! So, at `device` durability (where every commit flushes; at `process`
//! durability the page cache allocates lazily and the background flush
//! takes the journal commits, so preparing would only add writes), whenever
//! the hot head opens a segment after filling the one before with small
//! commits (big ones pay the allocation once for much data, and zeros
//! would double their writes), the slot the log will open next (the next
//! free one after it) is prepared in the background: its holes are written
//! with zeros ([`Channel::fill_holes`]; a slot already written, as every
//! slot is after the log's first lap, has none and costs one `lseek`). A
//! commit that reaches a slot still being prepared waits for it, so no
//! record write ever races a zero write. Preparing changes no byte a reader
//! could see (holes read as zero), so it needs no ordering with flushes or
//! checkpoints, and a crash in the middle of it loses nothing.
//!
//! [`Channel::fill_holes`]: ferrite_bdev::Channel::fill_holes

use futures::channel::oneshot;

use super::log::LogState;
use super::{Durability, Store};

/// Where a device slot stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Prep {
    /// Not looked at since the store opened.
    #[default]
    Unknown,
    /// Its holes are being filled: log writes into it wait.
    Filling,
    /// Allocated (or being written by the log already).
    Ready,
}

/// The preparation state of every slot, and the commits waiting for one.
#[derive(Debug)]
pub(crate) struct Preparation {
    slots: Vec<Prep>,
    waiters: Vec<(usize, oneshot::Sender<()>)>,
    /// The background task queue preparations run in, made at the first.
    queue: Option<glommio::TaskQueueHandle>,
}

impl Preparation {
    /// Nothing known yet about any of `slots` slots.
    pub(crate) fn new(slots: u64) -> Self {
        Self {
            slots: vec![Prep::Unknown; slots as usize],
            waiters: Vec::new(),
            queue: None,
        }
    }
}

impl Store {
    /// Segment `n` was just opened (by the hot head if `hot`): prepares the
    /// next free slot, unless the hot head filled its last segment with big
    /// commits, fewer than one per [`PREPARE_COMMIT_BYTES`] on average.
    /// Zeros cost a write of the whole slot; that pays when commits are many
    /// and small (each would pay the allocation), not when a few big ones
    /// stream data (ior: preparing every slot cost ior-easy-write a third
    /// of its bandwidth at device durability).
    pub(crate) fn prepare_next(&self, log: &mut LogState, n: u64, hot: bool) {
        if hot {
            let commits = self.counters.borrow().commits;
            let since = commits - log.commits_at_open;
            log.commits_at_open = commits;
            log.big_commits = since < self.geo.segment_bytes / PREPARE_COMMIT_BYTES;
        }
        if !log.big_commits {
            self.prepare_after(log, n);
        }
    }

    /// Starts preparing the slot of the first free segment after segment
    /// `n`: the one the log opens next.
    pub(crate) fn prepare_after(&self, log: &LogState, n: u64) {
        if let Some(next) = log.slots.next_free(n + 1) {
            self.prepare_slot(next);
        }
    }

    /// The device slot segment `n` lives in.
    fn slot_of(&self, n: u64) -> usize {
        (n % self.geo.slots()) as usize
    }

    /// Starts preparing the slot of segment `next`, which is free (the
    /// log's next to open), if it was never looked at. Needs the store's
    /// `Rc` ([`Store::spawn_cleaner`] records it): without it nothing is
    /// prepared, which costs only speed.
    fn prepare_slot(&self, next: u64) {
        if self.config.durability != Durability::Device {
            return;
        }
        let Some(me) = self.me.borrow().upgrade() else {
            return;
        };
        let slot = self.slot_of(next);
        let queue = {
            let mut prep = self.prep.borrow_mut();
            if prep.slots[slot] != Prep::Unknown {
                return;
            }
            prep.slots[slot] = Prep::Filling;
            *prep.queue.get_or_insert_with(|| {
                glommio::executor().create_task_queue(
                    glommio::Shares::Static(PREPARE_SHARES),
                    glommio::Latency::NotImportant,
                    "store-prepare",
                )
            })
        };
        let seg = self.geo.segment_bytes;
        let offset = self.geo.log_device_offset(next * seg);
        let task = async move {
            let outcome = me.chan.fill_holes(offset, seg).await;
            me.prepared(slot, outcome);
        };
        match glommio::spawn_local_into(task, queue) {
            Ok(t) => {
                t.detach();
            }
            // Left to be allocated by the log's own writes.
            Err(_) => self.prep.borrow_mut().slots[slot] = Prep::Ready,
        }
    }

    /// Records the end of slot `slot`'s preparation and wakes the commits
    /// waiting for it. A failure only costs speed: the log's own writes
    /// allocate the slot (and report any device error themselves).
    fn prepared(&self, slot: usize, outcome: ferrite_bdev::Result<u64>) {
        match outcome {
            Ok(filled) => {
                let mut c = self.counters.borrow_mut();
                c.slots_prepared += 1;
                c.prepare_bytes_filled += filled;
            }
            Err(e) => {
                tracing::warn!(device = %self.device, slot, error = %e, "preparing a log slot failed");
                self.counters.borrow_mut().prepare_failures += 1;
            }
        }
        let woken: Vec<_> = {
            let mut prep = self.prep.borrow_mut();
            prep.slots[slot] = Prep::Ready;
            let (now, later) = std::mem::take(&mut prep.waiters)
                .into_iter()
                .partition(|(s, _)| *s == slot);
            prep.waiters = later;
            now
        };
        for (_, tx) in woken {
            let _ = tx.send(());
        }
    }

    /// Waits until the slot holding log address `addr` is not being
    /// prepared (at once, unless the log caught up with its preparation).
    pub(crate) async fn wait_prepared(&self, addr: u64) {
        let slot = self.slot_of(addr / self.geo.segment_bytes);
        let rx = {
            let mut prep = self.prep.borrow_mut();
            if prep.slots[slot] != Prep::Filling {
                return;
            }
            let (tx, rx) = oneshot::channel();
            prep.waiters.push((slot, tx));
            rx
        };
        self.counters.borrow_mut().prepare_waits += 1;
        let _ = rx.await;
    }
}

/// Commits of at most this many bytes on average over a segment make
/// preparing the next slot worth its zeros (see
/// [`Store::prepare_next`]): a commit into a hole costs the file system
/// about what writing this much does.
const PREPARE_COMMIT_BYTES: u64 = 64 << 10;

/// Shares of the preparing task queue: background work, like the cleaner's.
const PREPARE_SHARES: usize = 50;
