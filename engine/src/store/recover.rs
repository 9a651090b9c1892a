//! Opening a store: formatting a blank device, or loading the newest valid
//! checkpoint and replaying the log after it, cutting the torn tail.

use super::buckets::BucketTable;
use super::damage::{key_hint, Gap, Plan, Replay};
use super::format::{Geometry, HEADER_UNIT_BYTES};
use super::log::LogState;
use super::segments::{Slots, FREE};
use super::{Counters, Store, StoreConfig, StoreError};
use crate::region::Region;
use crate::store::error::Result;
use ferrite_bdev::{BdevRef, Channel, IoBuf};
use ferrite_proto::bucket::BUCKET_BYTES;
use ferrite_proto::record::{get_u16, HEADER_BYTES, OFF_AKEY_LEN, OFF_DKEY_LEN, OFF_STATE};
use std::cell::{Cell, RefCell};
use std::sync::Arc;

/// Segments probed in a row without finding one before replay ends.
const PROBE_MISSES: u32 = 8;
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
        if !(4..=super::MAIN_BUCKETS_MAX).contains(&config.bucket_count) {
            return Err(StoreError::Invalid(format!(
                "bucket_count {} is not between 4 and {}",
                config.bucket_count,
                super::MAIN_BUCKETS_MAX
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
                    config.segment_bytes,
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
        if fresh {
            let store = Self::build(bdev, chan, device, geo, config)?;
            store.format().await?;
            return Ok(store);
        }
        // A replay that met a torn last commit with records past a lost
        // part of it runs again, ending those segments there.
        let (mut chan, mut plan) = (Some(chan), Plan::default());
        for _ in 0..3 {
            let chan = match chan.take() {
                Some(c) => c,
                None => bdev.channel().map_err(|source| StoreError::Device {
                    device: device.clone(),
                    op: "channel",
                    source,
                })?,
            };
            let store = Self::build(bdev.clone(), chan, device.clone(), geo, config.clone())?;
            match store.recover(&plan).await? {
                None => return Ok(store),
                Some(next) => plan = next,
            }
        }
        Err(StoreError::Layout {
            device,
            reason: "replay found new torn commits on every run".into(),
        })
    }

    /// The store's memory, before it is formatted or recovered.
    fn build(
        bdev: BdevRef,
        chan: Box<dyn Channel>,
        device: String,
        geo: Geometry,
        config: StoreConfig,
    ) -> Result<Self> {
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
        Ok(Self {
            device,
            bdev,
            chan,
            geo,
            config,
            ring,
            table: RefCell::new(table),
            dir: RefCell::default(),
            log: RefCell::new(LogState {
                slots: Slots::new(geo.slots()),
                ..LogState::default()
            }),
            committing: Cell::new(false),
            commit_buf: RefCell::new(None),
            checkpoint_bufs: RefCell::default(),
            cleaner_bufs: RefCell::default(),
            waiters: RefCell::default(),
            space_waiters: RefCell::default(),
            poison: RefCell::new(None),
            next_version: Cell::new(1),
            live_bytes: Cell::new(0),
            counters: RefCell::new(Counters::default()),
            checkpoint_generation: Cell::new(0),
            checkpoint_lock: glommio::sync::Semaphore::new(1),
            cleaner_stop: Cell::new(false),
            head_watch: Default::default(),
            cleaner_active: Cell::new(false),
            wall_waiters: Cell::new(0),
            home_queue: Some(glommio::executor().current_task_queue()),
            me: RefCell::default(),
            checkpoint_bytes: Cell::new(0),
            checkpoint_replay_start: Cell::new(0),
            keeper: Cell::new(Default::default()),
            flushed_upto: Cell::new(0),
            flush_lock: glommio::sync::Semaphore::new(1),
            prep: RefCell::new(super::prepare::Preparation::new(geo.slots())),
            damage: RefCell::default(),
        })
    }

    /// Zeroes the first block of every log slot that is not zero yet, so
    /// that no segment of an earlier store on the device can ever be taken
    /// for one of this one (replay looks for segments by their first
    /// record). Blocks already zero are not written: on a fresh sparse file
    /// a block written at every slot start slowed every later commit down
    /// (about 1.5x the update latency on a uring file).
    async fn zero_slot_starts(&self) -> Result<()> {
        let bs = self.geo.block_size as usize;
        let zero = |slot: u64| async move {
            let at = self.geo.log_device_offset(slot * self.geo.segment_bytes);
            let buf = self
                .chan
                .alloc(bs)
                .map_err(|e| self.device_error("alloc", e))?;
            let mut buf = self
                .chan
                .read(at, buf)
                .await
                .map_err(|e| self.device_error("read log", e))?;
            if buf.as_slice().iter().all(|&b| b == 0) {
                return Ok(());
            }
            buf.as_mut_slice().fill(0);
            self.chan
                .write(at, buf)
                .await
                .map_err(|e| self.device_error("zero log", e))?;
            Ok::<(), StoreError>(())
        };
        let slots: Vec<u64> = (0..self.geo.slots()).collect();
        for batch in slots.chunks(64) {
            futures::future::try_join_all(batch.iter().map(|&s| zero(s))).await?;
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
        self.zero_slot_starts().await?;
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

    /// Loads the newest checkpoint, replays the log after it, then starts
    /// the heads in fresh segments past everything replay looked at and
    /// checkpoints, so that no byte of a torn commit can ever be replayed
    /// after records written from now on, and every segment without live
    /// records is free again. Damaged ranges are counted and carried by
    /// that checkpoint. `Some(plan)`: replay met a torn last commit with
    /// records past its lost part, and must run again on a fresh store
    /// with `plan`, ending those segments where the loss starts.
    async fn recover(&self, plan: &Plan) -> Result<Option<Plan>> {
        let header = self.load_checkpoint().await?;
        let start = header.map_or(0, |h| h.replay_start);
        let max_version = header.map_or(0, |h| h.next_version.saturating_sub(1));
        let mut replay = Replay::new(plan, header.map_or(0, |h| h.commit_epoch), max_version);
        let old = self.slots_in_use();
        self.log.borrow_mut().ring_valid_from = start;
        let (end, next_segment) = self.replay(start, &old, &mut replay).await?;
        let next_segment = next_segment.max(plan.probed_past);
        let (damaged, torn) = replay.classify();
        if !torn.is_empty() {
            let mut cuts = plan.cuts.clone();
            cuts.extend(torn.iter().map(|g| g.start));
            tracing::warn!(device = %self.device, cuts = ?cuts, "torn last commit with records past its lost part: replaying again without them");
            return Ok(Some(Plan {
                cuts,
                epoch_floor: replay.epoch_max,
                probed_past: next_segment,
            }));
        }
        self.note_damage(&damaged);
        self.next_version.set(replay.max_version + 1);
        // Past every epoch replay saw: the next recovery unwraps the
        // stamps of records appended from now on above them.
        self.damage.borrow_mut().epoch = replay.epoch_max + 3;
        let seg = self.geo.segment_bytes;
        {
            let mut log = self.log.borrow_mut();
            log.head = end;
            log.durable = end;
            log.fresh_from = next_segment * seg;
            // Replayed records at or after this address are in the ring.
            log.ring_valid_from = start.max(end.saturating_sub(self.geo.ring_bytes));
            let mut slots = Slots::new(self.geo.slots());
            for (s, n) in self.slots_in_use().into_iter().enumerate() {
                if n != FREE {
                    slots.occupy(n, 0);
                    slots.live[s] = 1;
                    // What it holds besides single values is not known:
                    // only a checkpoint may free it.
                    slots.pinned[s] = true;
                }
            }
            log.slots = slots;
        }
        self.checkpoint().await?;
        Ok(None)
    }

    /// Reports and counts the damaged ranges a replay skipped.
    fn note_damage(&self, damaged: &[Gap]) {
        let mut d = self.damage.borrow_mut();
        for g in damaged {
            tracing::error!(
                device = %self.device,
                log_addr = g.start,
                device_offset = self.geo.log_device_offset(g.start),
                bytes = g.end - g.start,
                records = g.records,
                key = g.key.as_deref().unwrap_or("unknown (header damaged)"),
                "damaged log records skipped: the records before and after them are kept"
            );
            d.note(g.start, g.end - g.start, g.records);
        }
    }

    /// The segment each slot holds a live record of (from the key
    /// directory), [`FREE`] for none.
    fn slots_in_use(&self) -> Vec<u64> {
        let seg = self.geo.segment_bytes;
        let slots = self.geo.slots();
        let mut held = vec![FREE; slots as usize];
        self.dir.borrow().for_each(|_, _, _, e| {
            Self::each_live_record(e, |addr, _| {
                held[((addr / seg) % slots) as usize] = addr / seg;
            });
        });
        held
    }

    /// Replays the segments from the one holding `start`, in address
    /// order: each from its first record (from `start` in the first) up to
    /// the first record that does not check (its end: the rest was never
    /// written, or was torn). A segment number whose slot holds a newer
    /// segment was freed (or skipped) and its slot reused: the log goes on
    /// at least to that one. One whose slot holds a live older segment (one
    /// the checkpoint's index (`old`) or this replay found there) was
    /// skipped by the heads. Any other is a miss. Past the newest segment
    /// seen, replay ends after [`PROBE_MISSES`] misses in a row (a crash
    /// can leave only a few segments opened and never written), or a whole
    /// lap of numbers with none replayed (a head opens the first free slot
    /// within a lap of the last segment). Returns the end of the last
    /// record replayed and the first segment number past every one probed.
    async fn replay(&self, start: u64, old: &[u64], replay: &mut Replay) -> Result<(u64, u64)> {
        let seg = self.geo.segment_bytes;
        let slots = self.geo.slots();
        let mut reader = LogReader::default();
        let first = start / seg;
        let mut known = old.to_vec();
        let (mut end, mut newest, mut n) = (start, first, first);
        let (mut misses, mut idle) = (0, 0);
        while n <= newest || (idle < slots && misses < PROBE_MISSES) {
            let s = (n % slots) as usize;
            let from = if n == first { start } else { n * seg };
            match self.replay_segment(&mut reader, from, replay).await? {
                Probe::Replayed(e) => {
                    end = e;
                    (misses, idle) = (0, 0);
                    known[s] = n;
                    newest = newest.max(n);
                }
                // Read at `replay_start`, maybe mid-segment: bytes there
                // may be stale ones of any age, not a slot's first record.
                _ if n == first => {}
                Probe::Holds(Some(h)) if h > n => newest = newest.max(h),
                Probe::Holds(h) => {
                    idle += 1;
                    if h.is_none_or(|h| known[s] != h) {
                        misses += 1;
                    }
                }
            }
            n += 1;
        }
        Ok((end, n + 1))
    }

    /// Replays the records of one segment from `at`, if its first record
    /// checks and is at `at`. Past a position that holds no record of
    /// this segment, the next one that does is searched for: the range
    /// between is a gap (classified by [`Replay::classify`]), unless it
    /// is one of the plan's cuts; none found, the segment ends there.
    async fn replay_segment(
        &self,
        reader: &mut LogReader,
        mut at: u64,
        replay: &mut Replay,
    ) -> Result<Probe> {
        let seg = self.geo.segment_bytes;
        let seg_end = (at / seg + 1) * seg;
        let mut any = false;
        while at + (HEADER_BYTES as u64) <= seg_end {
            // Until the first record checks, this may not be the segment:
            // no window of the log is read for it.
            let min = if any { reader.chunk } else { 0 };
            let view = match self.record_at(reader, at, seg_end, min).await? {
                Some(v) if v.addr() == at => v,
                Some(v) if !any => return Ok(Probe::Holds(Some(v.addr() / seg))),
                _ => {
                    if replay.cuts.contains(&at) || (!any && self.never_written(reader, at).await?)
                    {
                        break;
                    }
                    let (Some(next), more) = self.next_record(reader, at + 8, seg_end).await?
                    else {
                        break;
                    };
                    replay.open_gap = Some((at, 1 + more, self.damaged_key(reader, at).await?));
                    at = next;
                    continue;
                }
            };
            let len = view.len();
            replay.replayed(at, &view);
            // The ring holds the replayed records of the last ring's worth
            // before `at`: only those may be marked superseded.
            self.log.borrow_mut().head = at;
            self.apply_record(view.bytes(), at, None)?;
            // Refill the ring as we go: the last ring's worth of replayed
            // records stays resident (see `recover`).
            // SAFETY: the record does not cross the ring's end and nothing
            // else uses the ring during recovery.
            unsafe { std::ptr::copy_nonoverlapping(view.bytes().as_ptr(), self.ring_ptr(at), len) };
            // The state word is not covered by the CRC: whatever the device
            // holds there, the ring starts it at 0 (not superseded).
            // SAFETY: as above; the word is 4-aligned inside the record.
            unsafe { self.ring_ptr(at + OFF_STATE as u64).cast::<u32>().write(0) };
            at += len as u64;
            any = true;
        }
        Ok(if any {
            Probe::Replayed(at)
        } else {
            Probe::Holds(None)
        })
    }

    /// The key the damaged record at `at` seems to be of ([`key_hint`]).
    async fn damaged_key(&self, reader: &mut LogReader, at: u64) -> Result<Option<String>> {
        let Some(head) = reader.get(self, at, HEADER_BYTES).await? else {
            return Ok(None);
        };
        let keys =
            usize::from(get_u16(head, OFF_DKEY_LEN)) + usize::from(get_u16(head, OFF_AKEY_LEN));
        Ok(match reader.get(self, at, HEADER_BYTES + keys).await? {
            Some(bytes) => key_hint(bytes),
            None => None,
        })
    }

    /// Are the record header's bytes at `at` all zero (a slot start that
    /// formatting zeroed and no segment wrote since)?
    async fn never_written(&self, reader: &mut LogReader, at: u64) -> Result<bool> {
        let head = reader.get_min(self, at, HEADER_BYTES, 0).await?;
        Ok(head.is_none_or(|h| h.iter().all(|&b| b == 0)))
    }
}

/// What replay found at a segment's start.
enum Probe {
    /// The segment's records, replayed up to this end.
    Replayed(u64),
    /// Not the segment: the number of the one whose first record is there
    /// instead, `None` if none checks.
    Holds(Option<u64>),
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

    /// Bytes a window holds at least.
    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// `len` bytes at log address `addr`, or `None` if they would cross the
    /// end of its segment (no record does).
    pub async fn get(&mut self, store: &Store, addr: u64, len: usize) -> Result<Option<&[u8]>> {
        self.get_min(store, addr, len, self.chunk).await
    }

    /// [`LogReader::get`], reading at least `min` bytes (whole blocks)
    /// when the window does not hold them: a probe of a segment's first
    /// record reads a block, not a window.
    pub async fn get_min(
        &mut self,
        store: &Store,
        addr: u64,
        len: usize,
        min: u64,
    ) -> Result<Option<&[u8]>> {
        let seg = store.geo.segment_bytes;
        let lap_end = (addr / seg + 1) * seg;
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
            let n = (len as u64).max(min).min(head - addr).min(lap_end - addr) as usize;
            self.buf = Some(store.ring_window(addr, n, self.buf.take())?);
            self.start = addr;
        } else if !have {
            let bs = u64::from(store.geo.block_size);
            let start = addr / bs * bs;
            let want = (addr + len as u64 - start).max(min);
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
