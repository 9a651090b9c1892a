//! Opening a store: formatting a blank device, or loading the newest valid
//! checkpoint and replaying the log after it, cutting the torn tail.

use super::buckets::BucketTable;
use super::format::{Geometry, HEADER_UNIT_BYTES};
use super::log::LogState;
use super::{Counters, Store, StoreConfig, StoreError};
use crate::region::Region;
use crate::store::error::Result;
use ferrite_bdev::{BdevRef, Channel, IoBuf};
use ferrite_proto::bucket::BUCKET_BYTES;
use ferrite_proto::record::{RecordView, HEADER_BYTES, OFF_VALUE_LEN};
use std::cell::{Cell, RefCell};
use std::sync::Arc;

/// Bytes the replay reads from the device at a time.
const REPLAY_CHUNK_BYTES: u64 = 4 << 20;

fn region(id: u32, name: &'static str, len: usize, config: &StoreConfig) -> Result<Region> {
    let r = if config.hugetlb {
        Region::new_hugetlb(id, name, len)
    } else {
        Region::new(id, name, len)
    };
    let r = r.map_err(|source| StoreError::Region { name, source })?;
    if config.populate {
        r.populate()
            .map_err(|source| StoreError::Region { name, source })?;
    }
    Ok(r)
}

impl Store {
    /// Opens the store on `bdev`: formats a device whose first block is all
    /// zeros, else recovers it (checkpoint + log replay). Must run on the
    /// xstream that will own the store.
    pub async fn open(bdev: BdevRef, config: StoreConfig) -> Result<Self> {
        let device = bdev.name().to_string();
        let chan = bdev.channel().map_err(|source| StoreError::Device {
            device: device.clone(),
            op: "channel",
            source,
        })?;
        if !(4..=super::MAX_MAIN_BUCKETS).contains(&config.bucket_count) {
            return Err(StoreError::Invalid(format!(
                "bucket_count {} is not between 4 and {}",
                config.bucket_count,
                super::MAX_MAIN_BUCKETS
            )));
        }
        let block0 = read_at(&*chan, &device, 0, HEADER_UNIT_BYTES).await?;
        let (geo, fresh) = match Geometry::decode_superblock(&device, &block0)? {
            Some(g) => (g, false),
            None => {
                let g = Geometry::plan(
                    &device,
                    bdev.size_bytes(),
                    bdev.block_size(),
                    config.ring_bytes,
                    config.checkpoint_bytes,
                    config.max_commit_bytes,
                )?;
                (g, true)
            }
        };
        if geo.block_size != bdev.block_size() || geo.device_bytes > bdev.size_bytes() {
            return Err(StoreError::Layout {
                device,
                reason: format!("device changed since format: {geo:?}"),
            });
        }
        let total = config.bucket_count as usize + config.overflow_buckets as usize;
        let buckets = Arc::new(region(
            config.region_id,
            "buckets",
            total * BUCKET_BYTES,
            &config,
        )?);
        let ring = Arc::new(region(
            config.region_id + 1,
            "log",
            geo.ring_bytes as usize,
            &config,
        )?);
        let table = BucketTable::new(buckets, config.bucket_count, config.overflow_buckets);
        let store = Self {
            device,
            bdev,
            chan,
            geo,
            config,
            ring,
            table: RefCell::new(table),
            dir: RefCell::default(),
            log: RefCell::new(LogState::default()),
            committing: Cell::new(false),
            commit_buf: RefCell::new(None),
            checkpoint_bufs: RefCell::default(),
            waiters: RefCell::default(),
            poison: RefCell::new(None),
            next_version: Cell::new(1),
            live_bytes: Cell::new(0),
            counters: RefCell::new(Counters::default()),
            checkpoint_generation: Cell::new(0),
            checkpoint_lock: glommio::sync::Semaphore::new(1),
            cleaner_stop: Cell::new(false),
            head_watch: Default::default(),
            cleaner_active: Cell::new(false),
            home_queue: Some(glommio::executor().current_task_queue()),
            me: RefCell::default(),
            checkpoint_bytes: Cell::new(0),
            keeper: Cell::new(Default::default()),
            flushed_upto: Cell::new(0),
            flush_lock: glommio::sync::Semaphore::new(1),
        };
        if fresh {
            store.format().await?;
        } else {
            store.recover().await?;
        }
        Ok(store)
    }

    async fn write_zeroes_log(&self, from: u64, len: u64) -> Result<()> {
        let mut a = from;
        while a < from + len {
            let lap_end = (a / self.geo.log_bytes + 1) * self.geo.log_bytes;
            let n = (from + len - a).min(lap_end - a).min(1 << 20);
            let buf = self
                .chan
                .alloc(n as usize)
                .map_err(|e| self.device_error("alloc", e))?;
            self.chan
                .write(self.geo.log_device_offset(a), buf)
                .await
                .map_err(|e| self.device_error("zero log", e))?;
            a += n;
        }
        Ok(())
    }

    async fn format(&self) -> Result<()> {
        let unit = HEADER_UNIT_BYTES as usize;
        let mut sb = self
            .chan
            .alloc(unit)
            .map_err(|e| self.device_error("alloc", e))?;
        self.geo.encode_superblock(sb.as_mut_slice());
        for area in 0..2 {
            let z = self
                .chan
                .alloc(unit)
                .map_err(|e| self.device_error("alloc", e))?;
            self.chan
                .write(self.geo.checkpoint_area(area), z)
                .await
                .map_err(|e| self.device_error("format", e))?;
        }
        self.write_zeroes_log(
            0,
            self.geo.max_commit_bytes + 2 * u64::from(self.geo.block_size),
        )
        .await?;
        self.chan
            .flush()
            .await
            .map_err(|e| self.device_error("flush", e))?;
        self.chan
            .write(0, sb)
            .await
            .map_err(|e| self.device_error("format", e))?;
        self.chan
            .flush()
            .await
            .map_err(|e| self.device_error("flush", e))?;
        Ok(())
    }

    async fn recover(&self) -> Result<()> {
        let header = self.load_checkpoint().await?;
        let start = header.map_or(0, |h| h.replay_start);
        let tail = header.map_or(0, |h| h.log_tail);
        let mut max_version = header.map_or(0, |h| h.next_version.saturating_sub(1));
        let cut = self.replay(start, tail, &mut max_version).await?;
        self.next_version.set(max_version + 1);
        {
            let mut log = self.log.borrow_mut();
            log.head = cut;
            log.durable = cut;
            log.tail = tail;
            log.clean_upto = tail;
            // Replayed records at or after this address are in the ring.
            log.ring_valid_from = start.max(cut.saturating_sub(self.geo.ring_bytes));
        }
        self.seal_cut(cut).await?;
        self.note_flushed(cut);
        Ok(())
    }

    /// Replays records from `start`; returns the address of the first record
    /// that does not check (the cut).
    async fn replay(&self, start: u64, tail: u64, max_version: &mut u64) -> Result<u64> {
        let ring = self.geo.ring_bytes;
        let mut reader = LogReader::default();
        let mut at = start;
        while at < tail + self.geo.log_bytes {
            let left = ring - at % ring;
            if left < HEADER_BYTES as u64 {
                at += left;
                continue;
            }
            let Some(head) = reader.get(self, at, HEADER_BYTES).await? else {
                break;
            };
            let value_len = u32::from_le_bytes([
                head[OFF_VALUE_LEN],
                head[OFF_VALUE_LEN + 1],
                head[OFF_VALUE_LEN + 2],
                head[OFF_VALUE_LEN + 3],
            ]) as u64;
            let max_len = left.min(HEADER_BYTES as u64 + 8192 + value_len + 8);
            let Some(bytes) = reader.get(self, at, max_len as usize).await? else {
                break;
            };
            let Ok(view) = RecordView::parse(bytes) else {
                break;
            };
            if view.addr() != at {
                break;
            }
            let len = view.len();
            *max_version = (*max_version).max(view.version());
            {
                // The ring holds the replayed records of the last ring's
                // worth before `at`: only those may be marked superseded.
                let mut log = self.log.borrow_mut();
                log.ring_valid_from = start;
                log.head = at;
            }
            self.apply_record(view.bytes(), at, None)?;
            // Refill the ring as we go: the last ring's worth of replayed
            // records stays resident (see `recover`).
            // SAFETY: the record does not cross the ring's end and nothing
            // else uses the ring during recovery.
            unsafe { std::ptr::copy_nonoverlapping(view.bytes().as_ptr(), self.ring_ptr(at), len) };
            at += len as u64;
        }
        Ok(at)
    }

    /// Rewrites the block holding the cut with zeros after it and zeroes
    /// `max_commit_bytes` beyond, so no record of a torn commit can ever be
    /// replayed after records written from now on.
    async fn seal_cut(&self, cut: u64) -> Result<()> {
        let bs = u64::from(self.geo.block_size);
        let block = cut / bs * bs;
        let (mut buf, off) = self.read_log(block, bs as usize).await?;
        let keep = (cut - block) as usize;
        buf.as_mut_slice()[off + keep..off + bs as usize].fill(0);
        let tail_block = buf.as_slice()[off..off + keep].to_vec();
        let mut out = self
            .chan
            .alloc(bs as usize)
            .map_err(|e| self.device_error("alloc", e))?;
        out.as_mut_slice()[..keep].copy_from_slice(&tail_block);
        self.chan
            .write(self.geo.log_device_offset(block), out)
            .await
            .map_err(|e| self.device_error("seal log", e))?;
        self.write_zeroes_log(block + bs, self.geo.max_commit_bytes + bs)
            .await?;
        self.chan
            .flush()
            .await
            .map_err(|e| self.device_error("flush", e))?;
        self.log.borrow_mut().tail_block = tail_block;
        Ok(())
    }
}

async fn read_at(chan: &dyn Channel, device: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
    let buf = chan
        .alloc(len as usize)
        .map_err(|source| StoreError::Device {
            device: device.to_string(),
            op: "alloc",
            source,
        })?;
    let buf = chan
        .read(offset, buf)
        .await
        .map_err(|source| StoreError::Device {
            device: device.to_string(),
            op: "read",
            source,
        })?;
    Ok(buf.as_slice().to_vec())
}

/// Sequential reads of the device log through a window buffer, reused
/// from one window to the next.
pub(crate) struct LogReader {
    /// Log address of the window's first byte.
    start: u64,
    /// The window (its whole length); `None` before the first read.
    buf: Option<IoBuf>,
    /// Bytes a window holds at least (unless the log ends first).
    chunk: u64,
}

impl Default for LogReader {
    /// Windows of [`REPLAY_CHUNK_BYTES`], for recovery's replay.
    fn default() -> Self {
        Self::with_chunk(REPLAY_CHUNK_BYTES)
    }
}

impl LogReader {
    /// Windows of `chunk` bytes.
    pub fn with_chunk(chunk: u64) -> Self {
        Self {
            start: 0,
            buf: None,
            chunk,
        }
    }

    /// `len` bytes at log address `addr`, or `None` if they would cross the
    /// end of the device log (no record does).
    pub async fn get(&mut self, store: &Store, addr: u64, len: usize) -> Result<Option<&[u8]>> {
        let lap_end = (addr / store.geo.log_bytes + 1) * store.geo.log_bytes;
        if addr + len as u64 > lap_end {
            return Ok(None);
        }
        let window = self.buf.as_ref().map_or(0, |b| b.len() as u64);
        let have = addr >= self.start && addr + len as u64 <= self.start + window;
        let head = store.log.borrow().head;
        if !have && addr + len as u64 <= head && store.resident(addr) {
            // Still in the memory ring (the cleaner's common case once the
            // ring holds gigabytes, and bulk commits bypass the page cache):
            // copied out now, with no await between the check and the copy.
            let n = (len as u64)
                .max(self.chunk)
                .min(head - addr)
                .min(lap_end - addr) as usize;
            // A device buffer is whole blocks; the window is `n` bytes.
            let bs = store.geo.block_size as usize;
            let mut b = store.io_buffer(self.buf.take(), n.next_multiple_of(bs))?;
            b.set_len(n);
            store.copy_from_ring(addr, addr + n as u64, b.as_mut_slice());
            self.buf = Some(b);
            self.start = addr;
        } else if !have {
            let bs = u64::from(store.geo.block_size);
            let start = addr / bs * bs;
            let want = (addr + len as u64 - start).max(self.chunk);
            let n = want.min(lap_end - start).div_ceil(bs) * bs;
            let n = n.min(lap_end - start);
            let (buf, off) = store
                .read_log_into(start, n as usize, self.buf.take())
                .await?;
            debug_assert_eq!(off, 0);
            self.start = start;
            self.buf = Some(buf);
        }
        let o = (addr - self.start) as usize;
        Ok(self.buf.as_ref().map(|b| &b.as_slice()[o..o + len]))
    }
}
