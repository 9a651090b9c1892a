//! The record log: appends into the memory ring, group commit to the device,
//! and publishing committed records in log order.
//!
//! Log addresses grow without bound (48 bits); address `a` lives at ring
//! offset `a % ring_bytes` and device offset `log_offset + a % log_bytes`.
//! Records never cross a multiple of `ring_bytes` (the rest of the ring is
//! filled with padding records, or left zero when less than a header remains),
//! and `log_bytes` is a multiple of `ring_bytes`, so they never cross the end
//! of the device log either.
//!
//! Invariants: `tail ≤ durable ≤ head`; `head - durable ≤ ring_bytes` (bytes
//! not yet on the device are still in the ring); `head - tail` stays below
//! `log_bytes` minus a reserve, so that recovery may zero `max_commit_bytes`
//! past a cut without touching live records.

use super::ops::Held;
use super::{Durability, Store, StoreError};
use crate::store::error::Result;
use ferrite_bdev::IoBuf;
use ferrite_proto::key::RecordKey;
use ferrite_proto::record::{
    encode_pad, encode_record, record_len, RecordFlags, HEADER_BYTES, OFF_STATE, RECORD_ALIGN,
    STATE_SUPERSEDED, VALUE_MAX_BYTES,
};
use futures::channel::oneshot;
use glommio::{Latency, Shares};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};

/// Waits for space (1 ms each) before giving up with `LogFull`.
const SPACE_WAIT_ROUNDS: u32 = 20_000;
/// Waits (1 ms each) for a running cleaner to bring disk use back under
/// budget before writing past it anyway.
const CLEANER_WAIT_ROUNDS: u32 = 10_000;

/// Hashes a key hash (already an xxh3 digest) to itself: `pending_hashes`
/// took a SipHash of it on every append and publish.
#[derive(Debug, Default)]
pub(crate) struct KeyHashHasher(u64);

impl Hasher for KeyHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A record appended and not yet published.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    pub addr: u64,
    pub len: u32,
    pub hash: u64,
    /// Copied forward by the cleaner from this address.
    pub origin: Option<u64>,
    pub punch: bool,
    pub new_key: bool,
}

#[derive(Debug, Default)]
pub(crate) struct LogState {
    pub head: u64,
    pub durable: u64,
    pub tail: u64,
    /// Everything live before this has been copied forward by the cleaner.
    pub clean_upto: u64,
    /// Ring bytes before this address were never filled since open.
    pub ring_valid_from: u64,
    /// Bytes `[round_down(durable), durable)` as last written (state words 0).
    pub tail_block: Vec<u8>,
    pub pending: VecDeque<Pending>,
    pub pending_hashes: HashMap<u64, u32, BuildHasherDefault<KeyHashHasher>>,
    pub pending_punches: u32,
    pub pending_new_keys: usize,
}

/// What an append writes.
pub(crate) struct AppendSpec<'a> {
    pub key: &'a RecordKey<'a>,
    pub value: &'a [u8],
    pub flags: RecordFlags,
    pub extent_offset: u64,
    /// Keep this version (cleaner copies); else a new one is assigned.
    pub version: Option<u64>,
    pub origin: Option<u64>,
    /// What the key held when the caller checked it (with no await since);
    /// `None`: `append_now` looks.
    pub held: Option<Held>,
}

impl Store {
    pub(crate) fn ring_ptr(&self, addr: u64) -> *mut u8 {
        let ring = self.geo.ring_bytes;
        let off = if ring.is_power_of_two() {
            (addr & (ring - 1)) as usize
        } else {
            (addr % ring) as usize
        };
        // SAFETY: off < ring_bytes ≤ ring region length.
        unsafe { self.ring.as_ptr().add(off) }
    }

    /// The ring bytes of `[addr, addr+len)` (must not cross a ring boundary).
    pub(crate) fn ring_slice(&self, addr: u64, len: usize) -> &[u8] {
        debug_assert!((addr % self.geo.ring_bytes) as usize + len <= self.geo.ring_bytes as usize);
        // SAFETY: in bounds by the no-crossing rule; only this xstream writes
        // the ring and it does not while the slice is in use (no await).
        unsafe { std::slice::from_raw_parts(self.ring_ptr(addr), len) }
    }

    /// Is the record at `addr` still in the ring?
    pub(crate) fn resident(&self, addr: u64) -> bool {
        let log = self.log.borrow();
        addr >= log.ring_valid_from && addr + self.geo.ring_bytes >= log.head
    }

    /// Sets the superseded bit of the record at `addr` if it is in the ring.
    pub(crate) fn mark_superseded(&self, addr: u64) {
        if !self.resident(addr) {
            return;
        }
        let p = self.ring_ptr(addr + OFF_STATE as u64);
        // SAFETY: records are 8-aligned, the state word is 4-aligned and in
        // the ring; readers in other processes load it concurrently.
        let word = unsafe { &*(p as *const AtomicU32) };
        word.fetch_or(STATE_SUPERSEDED, Ordering::Release);
    }

    /// Bytes an append of `len` needs at `head` (padding to the ring end
    /// included).
    fn need(&self, head: u64, len: u64) -> u64 {
        let left = self.geo.ring_bytes - head % self.geo.ring_bytes;
        if len > left {
            len + left
        } else {
            len
        }
    }

    fn log_limit(&self, for_cleaner: bool) -> u64 {
        let reserve = self.geo.max_commit_bytes + 2 * u64::from(self.geo.block_size);
        let cleaner = if for_cleaner {
            0
        } else {
            2 * self.config.segment_bytes.max(self.geo.max_commit_bytes)
        };
        self.geo.log_bytes.saturating_sub(reserve + cleaner)
    }

    /// Disk use foreground writes wait at while a cleaner runs: twice the
    /// live data plus four cleaner segments.
    pub(crate) fn disk_budget(&self) -> u64 {
        2 * self.live_bytes.get() + 4 * self.config.segment_bytes
    }

    /// Waits until `len` bytes can be appended without an await in between.
    pub(crate) async fn reserve_space(&self, len: u64, for_cleaner: bool) -> Result<()> {
        if len > self.geo.ring_bytes / 2 {
            return Err(StoreError::Invalid(format!(
                "record of {len} bytes exceeds half the ring ({} bytes)",
                self.geo.ring_bytes
            )));
        }
        let mut waited_for_cleaner = 0;
        for _ in 0..SPACE_WAIT_ROUNDS {
            self.check_writable()?;
            let (head, durable, tail) = {
                let l = self.log.borrow();
                (l.head, l.durable, l.tail)
            };
            let need = self.need(head, len);
            if head + need - durable > self.geo.ring_bytes {
                self.wait_durable(head).await?;
                continue;
            }
            let over_budget = !for_cleaner
                && self.cleaner_active.get()
                && head + need - tail > self.disk_budget()
                && waited_for_cleaner < CLEANER_WAIT_ROUNDS;
            if over_budget {
                if waited_for_cleaner == 0 {
                    // The cleaner may sleep until a head mark computed with
                    // more live data than is left (deletes): look now.
                    self.head_watch.wake_all();
                }
                waited_for_cleaner += 1;
                if waited_for_cleaner == CLEANER_WAIT_ROUNDS {
                    self.counters.borrow_mut().cleaner_wait_timeouts += 1;
                }
                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                continue;
            }
            if head + need - tail > self.log_limit(for_cleaner) {
                self.head_watch.wake_all();
                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                continue;
            }
            return Ok(());
        }
        let l = self.log.borrow();
        Err(StoreError::LogFull {
            device: self.device.clone(),
            used: l.head - l.tail,
            capacity: self.geo.log_bytes,
            live: self.live_bytes.get(),
        })
    }

    /// Fills the rest of the ring with padding so the next record starts at
    /// the ring's beginning.
    fn pad_to_ring_end(&self, log: &mut LogState) -> Result<()> {
        let ring = self.geo.ring_bytes;
        let mut left = ring - log.head % ring;
        while left > 0 {
            let max_pad = (HEADER_BYTES + VALUE_MAX_BYTES) as u64;
            let n = if left < HEADER_BYTES as u64 || left <= max_pad {
                left
            } else {
                max_pad - 256
            };
            let off = (log.head % ring) as usize;
            // SAFETY: [off, off+n) is inside the ring (n ≤ left).
            let out =
                unsafe { std::slice::from_raw_parts_mut(self.ring.as_ptr().add(off), n as usize) };
            if n < HEADER_BYTES as u64 {
                out.fill(0);
            } else {
                encode_pad(out, log.head).map_err(|e| StoreError::Invalid(e.to_string()))?;
            }
            log.head += n;
            left -= n;
        }
        Ok(())
    }

    /// Appends a record to the ring now (space reserved by the caller with no
    /// await since). Returns (address, length, version).
    pub(crate) fn append_now(&self, spec: &AppendSpec<'_>) -> Result<(u64, u32, u64)> {
        let len = record_len(spec.key, spec.value.len());
        let punch =
            spec.flags.has(RecordFlags::PUNCH_DKEY) || spec.flags.has(RecordFlags::PUNCH_OBJECT);
        let new_key = !punch
            && !spec.flags.has(RecordFlags::TOMBSTONE)
            && spec.held.unwrap_or_else(|| self.held(spec.key)) == Held::Absent;
        let mut log = self.log.borrow_mut();
        let ring = self.geo.ring_bytes;
        if log.head % ring + len as u64 > ring {
            self.pad_to_ring_end(&mut log)?;
        }
        let addr = log.head;
        let version = spec.version.unwrap_or_else(|| {
            let v = self.next_version.get();
            self.next_version.set(v + 1);
            v
        });
        let off = (addr % ring) as usize;
        // SAFETY: the record fits before the ring end (checked above) and the
        // bytes are not yet durable, so nothing reads them but one-sided
        // readers, who check the CRC.
        let out = unsafe { std::slice::from_raw_parts_mut(self.ring.as_ptr().add(off), len) };
        encode_record(
            out,
            spec.key,
            spec.value,
            version,
            addr,
            spec.flags,
            spec.extent_offset,
        )
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
        debug_assert_eq!(len % RECORD_ALIGN, 0);
        log.head += len as u64;
        let hash = spec.key.hash().0;
        if punch {
            log.pending_punches += 1;
        } else {
            *log.pending_hashes.entry(hash).or_default() += 1;
        }
        if new_key {
            log.pending_new_keys += 1;
        }
        log.pending.push_back(Pending {
            addr,
            len: len as u32,
            hash,
            origin: spec.origin,
            punch,
            new_key,
        });
        let head = log.head;
        drop(log);
        self.head_watch.advanced(head);
        let mut c = self.counters.borrow_mut();
        c.records_appended += 1;
        c.bytes_appended += len as u64;
        Ok((addr, len as u32, version))
    }

    /// Is an update or punch of this key hash waiting to be published?
    pub(crate) fn has_pending(&self, hash: u64) -> bool {
        let log = self.log.borrow();
        log.pending_punches > 0 || log.pending_hashes.contains_key(&hash)
    }

    /// Returns once every byte before `end` is durable (written, and flushed
    /// under [`Durability::Device`]) and published,
    /// committing (as the leader) or waiting for the leader's commit.
    /// The leader runs in the store's home task queue: a leader in the
    /// cleaner's low-share queue would hold every foreground request that
    /// joined its commit until the scheduler came back to that queue.
    pub(crate) async fn wait_durable(&self, end: u64) -> Result<()> {
        loop {
            self.check_writable()?;
            if self.log.borrow().durable >= end {
                return Ok(());
            }
            if self.committing.get() {
                let (tx, rx) = oneshot::channel();
                self.waiters.borrow_mut().push(tx);
                let _ = rx.await;
                continue;
            }
            self.committing.set(true);
            match self.leader_at_home() {
                Some(task) => task.await?,
                None => self.lead_commit().await?,
            }
        }
    }

    /// A commit led by a new task in the home queue, when the caller runs
    /// in another queue (the cleaner's) and the store can be reached from
    /// a task (it is in an `Rc`: [`Store::spawn_cleaner`]).
    fn leader_at_home(&self) -> Option<glommio::Task<Result<()>>> {
        if !self.off_home() {
            return None;
        }
        let me = self.me.borrow().upgrade()?;
        glommio::spawn_local_into(async move { me.lead_commit().await }, self.home_queue?).ok()
    }

    /// Is the caller running outside the store's home task queue?
    fn off_home(&self) -> bool {
        self.home_queue
            .is_some_and(|home| glommio::executor().current_task_queue() != home)
    }

    /// Spawns the future `make` builds, detached, on a new
    /// latency-insensitive task queue of the current executor with `shares`
    /// (on the current queue if that fails), and records the store's `Rc`
    /// so that the group commits the task needs are led from the home
    /// queue ([`Store::wait_durable`]).
    pub(super) fn spawn_background<F>(
        self: &Rc<Self>,
        shares: usize,
        name: &'static str,
        make: impl Fn() -> F,
    ) -> glommio::task::JoinHandle<()>
    where
        F: std::future::Future<Output = ()> + 'static,
    {
        *self.me.borrow_mut() = Rc::downgrade(self);
        let tq = glommio::executor().create_task_queue(
            Shares::Static(shares),
            Latency::NotImportant,
            name,
        );
        match glommio::spawn_local_into(make(), tq) {
            Ok(t) => t.detach(),
            Err(_) => glommio::spawn_local(make()).detach(),
        }
    }

    /// One group commit as the leader (`committing` already set): lets the
    /// other ready tasks of this xstream append first, so that they share
    /// this commit even on devices that complete at once (malloc, pmem),
    /// then commits and wakes the followers.
    async fn lead_commit(&self) -> Result<()> {
        if self.off_home() {
            self.counters.borrow_mut().commits_led_off_home += 1;
        }
        ferrite_xstream::yield_now().await;
        let r = self.commit_once().await;
        self.committing.set(false);
        for w in self.waiters.borrow_mut().drain(..) {
            let _ = w.send(());
        }
        r
    }

    /// Copies `[from, to)` out of the ring into `out` (may cross ring ends).
    pub(crate) fn copy_from_ring(&self, from: u64, to: u64, out: &mut [u8]) {
        let ring = self.geo.ring_bytes;
        let mut a = from;
        let mut o = 0usize;
        while a < to {
            let chunk = (ring - a % ring).min(to - a) as usize;
            out[o..o + chunk].copy_from_slice(self.ring_slice(a, chunk));
            a += chunk as u64;
            o += chunk;
        }
    }

    /// A block-aligned buffer of `len` bytes for a group commit: the kept
    /// heap buffer when it is big enough, else a new one (a pool slot when
    /// one fits).
    fn commit_buffer(&self, len: usize) -> Result<IoBuf> {
        let kept = self.commit_buf.borrow_mut().take();
        self.io_buffer(kept, len)
    }

    /// `kept` holding `len` bytes when its capacity allows, else a new
    /// buffer from the channel (a pool slot when one fits).
    pub(crate) fn io_buffer(&self, kept: Option<IoBuf>, len: usize) -> Result<IoBuf> {
        match kept {
            Some(mut b) if b.capacity() >= len => {
                b.set_len(len);
                Ok(b)
            }
            _ => self
                .chan
                .alloc(len)
                .map_err(|e| self.device_error("alloc", e)),
        }
    }

    /// One group commit: writes everything appended since the last commit
    /// (up to `max_commit_bytes`), flushes, then publishes in log order.
    async fn commit_once(&self) -> Result<()> {
        let bs = u64::from(self.geo.block_size);
        let (start, end, buf) = {
            let log = self.log.borrow();
            if log.head == log.durable {
                return Ok(());
            }
            let start = log.durable / bs * bs;
            let lap_end = (start / self.geo.log_bytes + 1) * self.geo.log_bytes;
            let end = log.head.min(start + self.geo.max_commit_bytes).min(lap_end);
            let len = (end - start).div_ceil(bs) * bs;
            let mut buf = self.commit_buffer(len as usize)?;
            let out = buf.as_mut_slice();
            let pre = (log.durable - start) as usize;
            out[..pre].copy_from_slice(&log.tail_block[..pre]);
            let used = (end - start) as usize;
            self.copy_from_ring(log.durable, end, &mut out[pre..used]);
            // A reused buffer holds an earlier commit's bytes past `end`.
            out[used..].fill(0);
            (start, end, buf)
        };
        let offset = self.geo.log_device_offset(start);
        let buf = match self.chan.write(offset, buf).await {
            Ok(b) => b,
            Err(e) => {
                self.set_poison(format!("log write at {offset}: {e}"));
                return Err(self.device_error("log write", e));
            }
        };
        if self.config.durability == Durability::Device {
            if let Err(e) = self.chan.flush().await {
                self.set_poison(format!("log flush: {e}"));
                return Err(self.device_error("flush", e));
            }
            self.note_flushed(end);
        }
        {
            let mut log = self.log.borrow_mut();
            log.durable = end;
            let keep = (end - end / bs * bs) as usize;
            let from = (end - start) as usize - keep;
            log.tail_block = buf.as_slice()[from..from + keep].to_vec();
        }
        if !buf.is_pooled() {
            let mut kept = self.commit_buf.borrow_mut();
            if kept.as_ref().is_none_or(|k| k.capacity() < buf.capacity()) {
                *kept = Some(buf);
            }
        }
        self.counters.borrow_mut().commits += 1;
        self.publish_upto(end)
    }

    /// Publishes every pending record that ends at or before `end`.
    fn publish_upto(&self, end: u64) -> Result<()> {
        loop {
            let p = {
                let mut log = self.log.borrow_mut();
                match log.pending.front() {
                    Some(p) if p.addr + u64::from(p.len) <= end => {}
                    _ => return Ok(()),
                }
                let Some(p) = log.pending.pop_front() else {
                    return Ok(());
                };
                if p.punch {
                    log.pending_punches -= 1;
                } else if let Some(n) = log.pending_hashes.get_mut(&p.hash) {
                    *n -= 1;
                    if *n == 0 {
                        log.pending_hashes.remove(&p.hash);
                    }
                }
                if p.new_key {
                    log.pending_new_keys -= 1;
                }
                p
            };
            let bytes = self.ring_slice(p.addr, p.len as usize);
            if let Err(e) = self.apply_record(bytes, p.addr, p.origin) {
                self.set_poison(format!("publishing record at {}: {e}", p.addr));
                return Err(e);
            }
        }
    }

    /// Reads `len` bytes of log starting at `addr` from the device. Returns
    /// the buffer and the offset of `addr` in it.
    pub(crate) async fn read_log(&self, addr: u64, len: usize) -> Result<(IoBuf, usize)> {
        self.read_log_into(addr, len, None).await
    }

    /// [`Store::read_log`] into `reuse` when it is big enough.
    pub(crate) async fn read_log_into(
        &self,
        addr: u64,
        len: usize,
        reuse: Option<IoBuf>,
    ) -> Result<(IoBuf, usize)> {
        let bs = u64::from(self.geo.block_size);
        let dev = self.geo.log_device_offset(addr);
        let start = dev / bs * bs;
        let end = (dev + len as u64).div_ceil(bs) * bs;
        let buf = self.io_buffer(reuse, (end - start) as usize)?;
        self.counters.borrow_mut().device_reads += 1;
        let buf = self
            .chan
            .read(start, buf)
            .await
            .map_err(|e| self.device_error("log read", e))?;
        Ok((buf, (dev - start) as usize))
    }
}
