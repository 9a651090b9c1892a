//! `CrashBdev`: simulated power loss (redb `CrashBackend`, FoundationDB
//! `AsyncFileNonDurable`).
//!
//! The device below holds the *live* image: what reads see. The wrapper
//! keeps, in memory, the *durable* image of every block written through it
//! (its content as of the last completed flush, read from the device before
//! the first write to it) and the list of completed writes not yet flushed.
//!
//! - A write (also `write_zeroes`, `unmap`: as writes of zeros) goes to the
//!   device and, once complete, joins the unflushed list.
//! - A flush makes every write completed before it began durable.
//! - [`CrashBdev::crash`] is the power loss: it waits for writes in flight,
//!   then decides the fate of each unflushed write with a PRNG seeded by the
//!   caller ([`Fate`]: kept, dropped, or torn after a whole number of
//!   [`TEAR_SECTOR`]-byte sectors), writes the resulting image back to the
//!   device below, and reports what it did. Channels opened before the crash
//!   fail from then on (the process "died"); open new ones to recover.
//!
//! Memory use: one block of durable image per distinct block written, plus a
//! copy of each unflushed write.

use super::forward_geometry;
use crate::{Bdev, BdevError, BdevRef, Channel, IoBuf, IoFuture, Result};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A torn write keeps a prefix of this many bytes times n (n < sectors).
pub const TEAR_SECTOR: u64 = 512;
/// How long `crash` waits for writes in flight on other xstreams.
const CRASH_WAIT_LIMIT: Duration = Duration::from_secs(10);

/// What a simulated power loss did to one unflushed write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Reached the media whole.
    Kept,
    /// Never reached the media.
    Dropped,
    /// Its first `kept_bytes` (a multiple of [`TEAR_SECTOR`], less than its
    /// length, possibly zero) reached the media, the rest did not.
    Torn { kept_bytes: u64 },
    /// The sectors `lost_from..lost_from + lost_bytes` (from the write's
    /// start) did not reach the media, every other one did, later ones
    /// included ([`CrashMode::LoseEarlierSector`]).
    Holed { lost_from: u64, lost_bytes: u64 },
}

/// How [`CrashBdev::crash`] picks the fate of each unflushed write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CrashMode {
    /// Kept, dropped or torn, a third each.
    #[default]
    Random,
    /// A device that writes sectors out of order: each write of two or more
    /// sectors loses one sector (not its last) and keeps every later one;
    /// a single-sector write is kept.
    LoseEarlierSector,
}

/// One unflushed write and its fate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteFate {
    pub offset: u64,
    pub len: u64,
    pub fate: Fate,
}

/// What [`CrashBdev::crash`] did, in the order the writes completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashReport {
    pub seed: u64,
    pub writes: Vec<WriteFate>,
}

struct Unflushed {
    seq: u64,
    offset: u64,
    data: Vec<u8>,
}

struct CrashState {
    epoch: u64,
    crashing: bool,
    writes_in_flight: usize,
    next_seq: u64,
    unflushed: Vec<Unflushed>,
    /// Durable content of each block ever written, by block index.
    durable: BTreeMap<u64, Box<[u8]>>,
    mode: CrashMode,
    /// Writes that may still complete before the device dies
    /// ([`CrashBdev::die_after_writes`]); `None`: no limit.
    writes_left: Option<u64>,
}

impl CrashState {
    /// Copies `data` at byte `offset` into the durable blocks (which exist:
    /// they were read before the write was issued).
    fn apply(&mut self, block_size: u64, offset: u64, data: &[u8]) {
        let mut pos = 0u64;
        while pos < data.len() as u64 {
            let at = offset + pos;
            let (block, within) = (at / block_size, at % block_size);
            let n = (block_size - within).min(data.len() as u64 - pos);
            if let Some(b) = self.durable.get_mut(&block) {
                b[within as usize..(within + n) as usize]
                    .copy_from_slice(&data[pos as usize..(pos + n) as usize]);
            }
            pos += n;
        }
    }
}

/// A device that can lose its unflushed writes on demand.
pub struct CrashBdev {
    inner: BdevRef,
    state: Arc<Mutex<CrashState>>,
}

fn lock(state: &Mutex<CrashState>) -> MutexGuard<'_, CrashState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl CrashBdev {
    /// Wraps `inner`, whose current content counts as durable.
    pub fn new(inner: BdevRef) -> Self {
        Self {
            inner,
            state: Arc::new(Mutex::new(CrashState {
                epoch: 0,
                crashing: false,
                writes_in_flight: 0,
                next_seq: 0,
                unflushed: Vec::new(),
                durable: BTreeMap::new(),
                mode: CrashMode::Random,
                writes_left: None,
            })),
        }
    }

    /// Sets how the next crashes pick the fates of unflushed writes.
    pub fn set_mode(&self, mode: CrashMode) {
        lock(&self.state).mode = mode;
    }

    /// Lets `n` more writes complete, then fails every later write and
    /// flush (the process died right after the `n`-th write): a crash
    /// targeted at a point of a run (a checkpoint's write, a cleaner pass,
    /// a recovery). [`CrashBdev::crash`] lifts the limit.
    pub fn die_after_writes(&self, n: u64) {
        lock(&self.state).writes_left = Some(n);
    }

    /// Has a [`CrashBdev::die_after_writes`] limit been reached?
    pub fn died(&self) -> bool {
        lock(&self.state).writes_left == Some(0)
    }

    /// Completed writes not yet made durable by a flush.
    pub fn unflushed_writes(&self) -> usize {
        lock(&self.state).unflushed.len()
    }

    /// Simulates a power loss and restart; see the module guide. Call it from
    /// an executor; writes in flight on other xstreams are waited for (up to
    /// 10 s). Afterwards the device below holds the post-crash image and
    /// every channel opened before fails with [`BdevError::Other`].
    pub async fn crash(&self, seed: u64) -> Result<CrashReport> {
        lock(&self.state).crashing = true;
        let start = Instant::now();
        while lock(&self.state).writes_in_flight > 0 {
            if start.elapsed() > CRASH_WAIT_LIMIT {
                lock(&self.state).crashing = false;
                return Err(self.error("crash: writes in flight did not complete in 10 s"));
            }
            ferrite_xstream::yield_now().await;
        }
        let bs = u64::from(self.inner.block_size());
        let (report, blocks) = {
            let mut st = lock(&self.state);
            st.epoch += 1;
            st.writes_left = None;
            let mut rng = StdRng::seed_from_u64(seed);
            let mut writes = Vec::new();
            let mut touched = BTreeSet::new();
            let mode = st.mode;
            for w in std::mem::take(&mut st.unflushed) {
                let len = w.data.len() as u64;
                let fate = pick_fate(&mut rng, mode, len);
                match fate {
                    Fate::Kept => st.apply(bs, w.offset, &w.data),
                    Fate::Dropped => {}
                    Fate::Torn { kept_bytes } => {
                        st.apply(bs, w.offset, &w.data[..kept_bytes as usize])
                    }
                    Fate::Holed {
                        lost_from,
                        lost_bytes,
                    } => {
                        st.apply(bs, w.offset, &w.data[..lost_from as usize]);
                        let after = (lost_from + lost_bytes) as usize;
                        st.apply(bs, w.offset + after as u64, &w.data[after..]);
                    }
                }
                touched.extend(w.offset / bs..(w.offset + len).div_ceil(bs));
                writes.push(WriteFate {
                    offset: w.offset,
                    len,
                    fate,
                });
            }
            let blocks: Vec<(u64, Box<[u8]>)> = touched
                .iter()
                .filter_map(|b| st.durable.get(b).map(|d| (*b, d.clone())))
                .collect();
            (CrashReport { seed, writes }, blocks)
        };
        let restored = self.restore(bs, blocks).await;
        lock(&self.state).crashing = false;
        restored.map(|()| report)
    }

    /// Writes the durable image of `blocks` to the device below and flushes.
    async fn restore(&self, bs: u64, blocks: Vec<(u64, Box<[u8]>)>) -> Result<()> {
        let ch = self.inner.channel()?;
        for (block, data) in blocks {
            let mut buf = ch.alloc(bs as usize)?;
            buf.as_mut_slice().copy_from_slice(&data);
            ch.write(block * bs, buf).await?;
        }
        ch.flush().await
    }

    fn error(&self, reason: &str) -> BdevError {
        BdevError::Other {
            device: self.inner.name().to_string(),
            reason: reason.to_string(),
        }
    }
}

impl Bdev for CrashBdev {
    forward_geometry!();
    fn channel(&self) -> Result<Box<dyn Channel>> {
        let epoch = lock(&self.state).epoch;
        Ok(Box::new(CrashChannel {
            inner: self.inner.channel()?,
            name: self.inner.name().to_string(),
            state: Arc::clone(&self.state),
            epoch,
            size_bytes: self.inner.size_bytes(),
        }))
    }
}

struct CrashChannel {
    inner: Box<dyn Channel>,
    name: String,
    state: Arc<Mutex<CrashState>>,
    epoch: u64,
    size_bytes: u64,
}

/// Counts a write in flight until dropped (also when its future is).
struct InFlight<'a>(&'a Mutex<CrashState>);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(self.0).writes_in_flight -= 1;
    }
}

impl CrashChannel {
    fn check_alive(&self, st: &CrashState) -> Result<()> {
        if st.crashing || st.epoch != self.epoch {
            return Err(BdevError::Other {
                device: self.name.clone(),
                reason: "the device crashed (CrashBdev::crash): open a new channel".into(),
            });
        }
        Ok(())
    }

    /// Counts a write against [`CrashBdev::die_after_writes`]'s limit.
    fn check_limit(&self, st: &mut CrashState) -> Result<()> {
        match &mut st.writes_left {
            Some(0) => Err(BdevError::Other {
                device: self.name.clone(),
                reason: "the device died (CrashBdev::die_after_writes)".into(),
            }),
            Some(n) => {
                *n -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn alive(&self) -> Result<()> {
        self.check_alive(&lock(&self.state))
    }

    /// Reads the blocks of `offset..offset+len` that have no durable image
    /// yet from the device below and keeps them.
    async fn capture(&self, offset: u64, len: u64) -> Result<()> {
        let bs = u64::from(self.inner.block_size());
        let missing: Vec<u64> = {
            let st = lock(&self.state);
            (offset / bs..(offset + len).div_ceil(bs))
                .filter(|b| !st.durable.contains_key(b))
                .collect()
        };
        let (Some(&first), Some(&last)) = (missing.first(), missing.last()) else {
            return Ok(());
        };
        // One read from the first to the last missing block.
        let n = (last - first + 1) * bs;
        let buf = self.inner.alloc(n as usize)?;
        let buf = self.inner.read(first * bs, buf).await?;
        let mut st = lock(&self.state);
        for block in missing {
            let at = ((block - first) * bs) as usize;
            st.durable
                .entry(block)
                .or_insert_with(|| buf.as_slice()[at..at + bs as usize].into());
        }
        Ok(())
    }

    /// Runs a write-like `op` on `offset..offset+len`, then records `data`
    /// of its result as unflushed.
    async fn tracked<'a, T>(
        &'a self,
        offset: u64,
        len: u64,
        op: impl FnOnce() -> IoFuture<'a, T>,
        data: impl FnOnce(&T) -> Vec<u8>,
    ) -> Result<T> {
        {
            let mut st = lock(&self.state);
            self.check_alive(&st)?;
            self.check_limit(&mut st)?;
            st.writes_in_flight += 1;
        }
        let _in_flight = InFlight(&self.state);
        let bs = self.inner.block_size();
        crate::check_range(&self.name, "write", bs, self.size_bytes, offset, len)?;
        self.capture(offset, len).await?;
        let out = op().await?;
        // No aliveness check here: `crash` waits for this write before it
        // moves to a new epoch, so the write is always recorded and its
        // fate decided like any other unflushed write.
        let mut st = lock(&self.state);
        let seq = st.next_seq;
        st.next_seq += 1;
        st.unflushed.push(Unflushed {
            seq,
            offset,
            data: data(&out),
        });
        Ok(out)
    }

    async fn flush_impl(&self) -> Result<()> {
        let upto = {
            let mut st = lock(&self.state);
            self.check_alive(&st)?;
            if st.writes_left == Some(0) {
                return self.check_limit(&mut st);
            }
            st.next_seq
        };
        self.inner.flush().await?;
        let mut st = lock(&self.state);
        self.check_alive(&st)?;
        let bs = u64::from(self.inner.block_size());
        let (done, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut st.unflushed)
            .into_iter()
            .partition(|w| w.seq < upto);
        st.unflushed = rest;
        for w in done {
            st.apply(bs, w.offset, &w.data);
        }
        Ok(())
    }
}

/// The fate of one unflushed write of `len` bytes.
fn pick_fate(rng: &mut StdRng, mode: CrashMode, len: u64) -> Fate {
    let sectors = len.div_ceil(TEAR_SECTOR);
    match mode {
        CrashMode::LoseEarlierSector if sectors < 2 => Fate::Kept,
        CrashMode::LoseEarlierSector => Fate::Holed {
            lost_from: rng.gen_range(0..sectors - 1) * TEAR_SECTOR,
            lost_bytes: TEAR_SECTOR,
        },
        CrashMode::Random => match rng.gen_range(0..3) {
            0 => Fate::Kept,
            1 => Fate::Dropped,
            _ => Fate::Torn {
                kept_bytes: rng.gen_range(0..sectors) * TEAR_SECTOR,
            },
        },
    }
}

fn concat(bufs: &[IoBuf]) -> Vec<u8> {
    bufs.iter()
        .flat_map(|b| b.as_slice().iter().copied())
        .collect()
}

impl Channel for CrashChannel {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn alloc(&self, len: usize) -> Result<IoBuf> {
        self.inner.alloc(len)
    }
    fn read(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        Box::pin(async move {
            self.alive()?;
            self.inner.read(offset, buf).await
        })
    }
    fn write(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        let len = buf.len() as u64;
        Box::pin(self.tracked(
            offset,
            len,
            move || self.inner.write(offset, buf),
            |b| b.as_slice().to_vec(),
        ))
    }
    fn readv(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        Box::pin(async move {
            self.alive()?;
            self.inner.readv(offset, bufs).await
        })
    }
    fn writev(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        Box::pin(self.tracked(
            offset,
            len,
            move || self.inner.writev(offset, bufs),
            |v| concat(v),
        ))
    }
    fn flush(&self) -> IoFuture<'_, ()> {
        Box::pin(self.flush_impl())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        Box::pin(self.tracked(
            offset,
            len,
            move || self.inner.write_zeroes(offset, len),
            move |_| vec![0; len as usize],
        ))
    }
    fn unmap(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        Box::pin(self.tracked(
            offset,
            len,
            move || self.inner.unmap(offset, len),
            move |_| vec![0; len as usize],
        ))
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
    fn queue_depth(&self) -> usize {
        self.inner.queue_depth()
    }
}
