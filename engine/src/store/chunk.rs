//! One write of a group commit: the log bytes from an address, at most
//! `max_commit_bytes` of them, in whole blocks. Small writes are copied out
//! of the ring into a buffer; big ones go to the device from the ring
//! itself (its whole blocks), so a commit of ior's 2 MiB transfers is not
//! copied once more on its way to the device.

use super::Store;
use crate::store::error::Result;
use crate::store::StoreError;
use ferrite_bdev::IoBuf;
use std::sync::Arc;

/// Log writes of at least this many bytes go to the device from the ring
/// itself, without a copy into a buffer ([`Store::write_chunk`]): an
/// embedded io500's ior-easy-write spent a quarter of the engine's time
/// copying its 2 MiB commits out of the ring.
const RING_WRITE_FROM: u64 = 64 << 10;

impl Store {
    /// Where the write of [`Self::write_chunk`] from `at` stops, short of
    /// `to`: at most `max_commit_bytes` from the block holding `at`, and
    /// never past its segment.
    pub(super) fn chunk_end(&self, at: u64, to: u64) -> u64 {
        let bs = u64::from(self.geo.block_size);
        let seg_end = (at / self.geo.segment_bytes + 1) * self.geo.segment_bytes;
        to.min(at / bs * bs + self.geo.max_commit_bytes)
            .min(seg_end)
    }

    /// Writes the log bytes from `at` (at most `max_commit_bytes`, up to
    /// `to`) with one write starting at the block holding `at`: the bytes
    /// before `at` in that block are rewritten as they were last written
    /// (a torn rewrite never damages durable records). Returns where it
    /// stopped. `durable`: the write is durable when it completes
    /// ([`ferrite_bdev::Channel::write_durable`]). A write of at least
    /// [`RING_WRITE_FROM`] goes to the device from the ring itself, its
    /// whole blocks with no copy ([`Store::ring_write_bufs`]).
    pub(super) async fn write_chunk(&self, at: u64, to: u64, durable: bool) -> Result<u64> {
        let bs = u64::from(self.geo.block_size);
        let start = at / bs * bs;
        let end = self.chunk_end(at, to);
        let len = (end - start).div_ceil(bs) * bs;
        let bufs = if len >= RING_WRITE_FROM && self.ring_blocks_aligned() {
            self.ring_write_bufs(at, end)?
        } else {
            vec![self.copied_write_buf(at, end)?]
        };
        if let Some(last) = bufs.last() {
            self.keep_tail_block(end, last);
        }
        let offset = self.geo.log_device_offset(start);
        self.wait_prepared(start).await;
        let written = match (durable, bufs.len()) {
            (true, 1) => self
                .chan
                .write_durable(offset, single(bufs))
                .await
                .map(|b| vec![b]),
            (false, 1) => self.chan.write(offset, single(bufs)).await.map(|b| vec![b]),
            (true, _) => self.chan.writev_durable(offset, bufs).await,
            (false, _) => self.chan.writev(offset, bufs).await,
        };
        let bufs = match written {
            Ok(b) => b,
            Err(ferrite_bdev::BdevError::NoSpace { op, .. }) => {
                return Err(self.no_space_error(op, offset));
            }
            Err(e) => {
                self.set_poison(format!("log write at {offset}: {e}"));
                return Err(self.device_error("log write", e));
            }
        };
        for buf in bufs {
            if !buf.is_pooled() && !buf.is_foreign() {
                let mut kept = self.commit_buf.borrow_mut();
                if kept.as_ref().is_none_or(|k| k.capacity() < buf.capacity()) {
                    *kept = Some(buf);
                }
            }
        }
        Ok(end)
    }

    /// The bytes `[start, at)` of the block `start` (`at` inside it), as
    /// they were last written ([`LogState::tail_blocks`](super::log::LogState::tail_blocks)).
    fn written_block_start(&self, start: u64, at: u64) -> Result<Vec<u8>> {
        let pre = (at - start) as usize;
        let mut log = self.log.borrow_mut();
        let i = (log.tail_blocks.iter())
            .position(|(b, bytes)| *b == start && bytes.len() == pre)
            .ok_or_else(|| {
                StoreError::Invalid(format!(
                    "log write at {at}: the start of its block was never written"
                ))
            })?;
        Ok(log.tail_blocks.swap_remove(i).1)
    }

    /// One buffer of the whole blocks holding `[at, end)`: the block
    /// start before `at` as last written, the ring's bytes, zeros after.
    fn copied_write_buf(&self, at: u64, end: u64) -> Result<IoBuf> {
        let bs = u64::from(self.geo.block_size);
        let start = at / bs * bs;
        let len = (end - start).div_ceil(bs) * bs;
        let mut buf = self.commit_buffer(len as usize)?;
        let out = buf.as_mut_slice();
        let pre = (at - start) as usize;
        if pre > 0 {
            out[..pre].copy_from_slice(&self.written_block_start(start, at)?);
        }
        let used = (end - start) as usize;
        self.copy_from_ring(at, end, &mut out[pre..used]);
        // A reused buffer holds an earlier commit's bytes past `end`.
        out[used..].fill(0);
        Ok(buf)
    }

    /// The buffers of a write of `[at, end)` from the ring: the first block
    /// copied if `at` is inside it (its start as last written: the ring may
    /// have been written over there), the whole blocks after it straight
    /// from the ring (they hold bytes not yet on the device, which the ring
    /// keeps until the commit ends: [`Store::reserve_space`]), the last
    /// partial block copied with zeros after `end` (the ring holds whatever
    /// is appended next there).
    fn ring_write_bufs(&self, at: u64, end: u64) -> Result<Vec<IoBuf>> {
        let bs = u64::from(self.geo.block_size);
        let start = at / bs * bs;
        let mut bufs = Vec::with_capacity(4);
        let mut from = start;
        if at > start {
            from = (start + bs).min(end);
            bufs.push(self.copied_write_buf(at, from)?);
        }
        let full = (end / bs * bs).max(from);
        let ring = self.geo.ring_bytes;
        while from < full {
            let n = (ring - from % ring).min(full - from);
            let ptr = std::ptr::NonNull::new(self.ring_ptr(from)).expect("ring mapped");
            let keep: Arc<dyn std::any::Any + Send + Sync> = self.ring.clone();
            // SAFETY: `[from, from + n)` lies in the mapped ring (no ring
            // end crossed) and holds unwritten bytes that no append
            // overwrites until the commit that writes them ends; appends
            // only write past the head, beyond them.
            bufs.push(unsafe { IoBuf::foreign(ptr, n as usize, keep) });
            self.counters.borrow_mut().ring_write_bytes += n;
            from += n;
        }
        if end > from {
            let mut buf = self.io_buffer(None, bs as usize)?;
            let out = buf.as_mut_slice();
            let used = (end - from) as usize;
            self.copy_from_ring(from, end, &mut out[..used]);
            out[used..].fill(0);
            bufs.push(buf);
        }
        Ok(bufs)
    }

    /// Can whole blocks be written straight from the ring: is every block
    /// of it at a block-aligned address?
    fn ring_blocks_aligned(&self) -> bool {
        let bs = u64::from(self.geo.block_size);
        self.geo.ring_bytes % bs == 0 && self.ring.as_ptr() as usize % bs as usize == 0
    }

    /// Before a write up to `end` whose last buffer is `last`: keeps the
    /// bytes of its last block before `end` (if `end` is inside a block:
    /// the last block of `last`) for the next write of that block, while a
    /// write may still continue it, dropping those of blocks no write
    /// continues.
    fn keep_tail_block(&self, end: u64, last: &IoBuf) {
        let bs = self.geo.block_size as usize;
        let keep = (end % bs as u64) as usize;
        if keep == 0 {
            return;
        }
        let block = last.len() - bs;
        let bytes = last.as_slice()[block..block + keep].to_vec();
        let mut log = self.log.borrow_mut();
        // A partial block is continued only in an open segment, or
        // in one with bytes still to write: the others' are dropped.
        let seg = self.geo.segment_bytes;
        let (hot, cold) = log.open_segments(seg);
        let pending: Vec<u64> = log.unwritten.iter().map(|r| r.0 / seg).collect();
        let open = |b: u64| {
            let n = b / seg;
            Some(n) == hot || Some(n) == cold || pending.contains(&n)
        };
        let mut kept = std::mem::take(&mut log.tail_blocks);
        kept.retain(|(b, _)| open(*b));
        kept.push((end - keep as u64, bytes));
        log.tail_blocks = kept;
    }
}

/// The only buffer of `bufs` (one).
fn single(mut bufs: Vec<IoBuf>) -> IoBuf {
    bufs.pop().expect("one buffer")
}
