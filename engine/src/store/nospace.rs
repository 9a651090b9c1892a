//! A group commit that finds no space on the device (the file system under
//! a file bdev is full) is rolled back instead of poisoning the store:
//! nothing of it is published, its waiters get [`StoreError::NoSpace`],
//! and the log goes on from where the last successful commit left it.
//!
//! A rollback drops every record appended since the last successful
//! commit captured the log (this commit's and those appended during it):
//! the heads go back to where that commit captured them, the segments
//! opened since are freed, the pending records are forgotten (their
//! append numbers are remembered as dropped, so that their waiters fail
//! rather than succeed) and the ring bytes are written over by the next
//! appends.
//!
//! Some blocks of the failed commit may have reached the device (one of its
//! writes succeeded, or a write was cut short). Replay must never take them
//! for records: before the next commit writes anything, the byte ranges the
//! failed one wrote are overwritten with zeros (their first block's start
//! rewritten as it was last written), durably under device durability.
//! Until that succeeds — it needs space too, for blocks the file system
//! never allocated — every commit fails with `NoSpace` again. A crash
//! before it leaves those blocks behind the last durable record, where a
//! crash in any commit leaves a torn one: never acknowledged, never after an
//! acknowledged record.

use super::log::{ColdSeg, LogState};
use super::{Durability, Store, StoreError};
use crate::store::error::Result;

/// Dropped append ranges kept at most (a waiter older than the oldest has
/// long since woken).
const DROPPED_MAX: usize = 4096;

/// Where a group commit captured the heads.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Mark {
    head: u64,
    hot_end: u64,
    cold: Option<ColdSeg>,
}

impl Mark {
    pub(crate) fn of(log: &LogState) -> Self {
        Self {
            head: log.head,
            hot_end: log.hot_end,
            cold: log.cold,
        }
    }
}

/// What a rollback needs ([`LogState::undo`]).
#[derive(Debug, Default)]
pub(crate) struct Undo {
    /// The last successful commit's capture.
    mark: Mark,
    /// Slots of the segments opened since `mark`, in order.
    pub opened: Vec<usize>,
    /// `(from, to]` ranges of append numbers dropped by rollbacks.
    dropped: Vec<(u64, u64)>,
    /// Log byte ranges a failed commit wrote, to zero before the next.
    scrub: Vec<(u64, u64)>,
}

impl Undo {
    /// A commit that captured the log at `mark`, when the first `opened`
    /// of [`Undo::opened`] were open, succeeded.
    pub(crate) fn committed(&mut self, mark: Mark, opened: usize) {
        self.mark = mark;
        self.opened.drain(..opened.min(self.opened.len()));
    }

    fn drop_appends(&mut self, from: u64, to: u64) {
        if from >= to {
            return;
        }
        match self.dropped.last_mut() {
            Some(last) if last.1 == from => last.1 = to,
            _ => self.dropped.push((from, to)),
        }
        if self.dropped.len() > DROPPED_MAX {
            self.dropped.remove(0);
        }
    }
}

impl Store {
    pub(crate) fn no_space_error(&self, op: &'static str, offset: u64) -> StoreError {
        StoreError::NoSpace {
            device: self.device.clone(),
            op,
            offset,
        }
    }

    /// `Err(NoSpace)` if a rollback dropped any of the appends numbered
    /// `(from, to]`.
    pub(crate) fn check_not_dropped(&self, from: u64, to: u64) -> Result<()> {
        let log = self.log.borrow();
        if (log.undo.dropped.iter()).any(|&(a, b)| a < to && b > from) {
            return Err(self.no_space_error("group commit", log.undo.mark.head));
        }
        Ok(())
    }

    /// A group commit that wrote `ranges` failed with `e`: a `NoSpace`
    /// rolls it back (with `tails`, the blocks' starts as they were before
    /// it), any other error has poisoned the store already. Returns `e`.
    pub(crate) fn commit_failed(
        &self,
        e: StoreError,
        ranges: &[(u64, u64)],
        tails: Vec<(u64, Vec<u8>)>,
    ) -> StoreError {
        if !matches!(e, StoreError::NoSpace { .. }) {
            return e;
        }
        let mut guard = self.log.borrow_mut();
        let log = &mut *guard;
        let mark = log.undo.mark;
        for slot in std::mem::take(&mut log.undo.opened) {
            log.slots.release(slot);
        }
        log.undo.scrub.extend_from_slice(ranges);
        log.head = mark.head;
        log.durable = mark.head;
        log.hot_end = mark.hot_end;
        log.cold = mark.cold;
        log.unwritten.clear();
        log.cold_unwritten = 0;
        log.tail_blocks = tails;
        log.pending.clear();
        log.pending_hashes.clear();
        log.pending_punches = 0;
        log.pending_new_keys = 0;
        log.pending_new_bytes = 0;
        let (from, to) = (log.committed_appends, log.appends);
        log.undo.drop_appends(from, to);
        log.committed_appends = to;
        drop(guard);
        tracing::warn!(device = %self.device, error = %e, dropped = to - from,
            "group commit found no space: rolled back");
        e
    }

    /// Zeros the log ranges failed commits wrote (see the module docs).
    /// On failure the ranges stay to zero.
    pub(crate) async fn scrub_failed(&self) -> Result<()> {
        let ranges = std::mem::take(&mut self.log.borrow_mut().undo.scrub);
        for (i, &(from, to)) in ranges.iter().enumerate() {
            if let Err(e) = self.scrub_range(from, to).await {
                self.log
                    .borrow_mut()
                    .undo
                    .scrub
                    .extend_from_slice(&ranges[i..]);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Writes zeros over the log bytes `[from, to)`, the bytes before
    /// `from` in its block as last written.
    async fn scrub_range(&self, from: u64, to: u64) -> Result<()> {
        let bs = u64::from(self.geo.block_size);
        let seg = self.geo.segment_bytes;
        let prefix = {
            let log = self.log.borrow();
            let start = from / bs * bs;
            let pre = (from - start) as usize;
            (log.tail_blocks.iter())
                .find(|(b, bytes)| *b == start && bytes.len() == pre)
                .map(|(_, bytes)| bytes.clone())
        };
        // Without its start, a partial first block is left: the next
        // commit of that head rewrites it.
        let mut at = match &prefix {
            Some(_) => from / bs * bs,
            None => from.next_multiple_of(bs),
        };
        let mut first = prefix;
        while at < to {
            let seg_end = (at / seg + 1) * seg;
            let end = to
                .next_multiple_of(bs)
                .min(seg_end)
                .min(at + self.geo.max_commit_bytes);
            let mut buf = self.io_buffer(None, (end - at) as usize)?;
            let out = buf.as_mut_slice();
            out.fill(0);
            if let Some(pre) = first.take() {
                out[..pre.len()].copy_from_slice(&pre);
            }
            let offset = self.geo.log_device_offset(at);
            self.wait_prepared(at).await;
            let written = match self.config.durability {
                Durability::Device => self.chan.write_durable(offset, buf).await,
                Durability::Process => self.chan.write(offset, buf).await,
            };
            match written {
                Ok(_) => {}
                Err(ferrite_bdev::BdevError::NoSpace { .. }) => {
                    return Err(self.no_space_error("log scrub", offset));
                }
                Err(e) => {
                    self.set_poison(format!("log scrub at {offset}: {e}"));
                    return Err(self.device_error("log scrub", e));
                }
            }
            at = end;
        }
        Ok(())
    }
}
