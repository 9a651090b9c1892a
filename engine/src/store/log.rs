//! The record log: appends into the memory ring, group commit to the device,
//! and publishing committed records in log order.
//!
//! Log addresses grow without bound (48 bits); address `a` lives at ring
//! offset `a % ring_bytes` and device offset `log_offset + a % log_bytes`.
//! The log is allocated in segments (`segments.rs`): a record never crosses
//! a segment's end, so never a ring end or the device log's end either.
//! Foreground appends go to the hot head, but for single values of keys
//! not written for two rings' worth of log (`cold.rs`), which go to the
//! cold segment with the cleaner's copies; both heads write into the ring at
//! their addresses, and a group commit writes every appended range that is
//! not yet on the device.
//!
//! Invariants: no append overwrites ring bytes not yet on the device
//! (`reserve_space`); records are published in append order, a cold
//! segment is opened at the hot head, and a record goes to the cold
//! segment only above the one it copies or replaces (and never while a
//! write of its key is pending), so address order is, key by key, the order
//! records were made in (what replay relies on).

use super::ops::Held;
use super::segments::Slots;
use super::{Durability, Store, StoreError};
use crate::store::error::Result;
use ferrite_bdev::IoBuf;
use ferrite_proto::key::RecordKey;
use ferrite_proto::record::{
    encode_record_stamped, record_len, RecordFlags, OFF_STATE, RECORD_ALIGN, STATE_SUPERSEDED,
};
use futures::channel::oneshot;
use glommio::{Latency, Shares};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};

/// Free slots only the cleaner may open a segment in.
pub(crate) const CLEANER_SLOTS: usize = 2;
/// Writes of a device-durability commit up to which each carries its own
/// flush (a commit with cleaner copies has two: the hot head's and the
/// cold segment's); a commit cut into more writes flushes once after them.
const DURABLE_WRITES_MAX: usize = 4;
/// Waits for space (1 ms each) before giving up with `LogFull`.
const SPACE_WAIT_ROUNDS: u32 = 20_000;
/// How long a write waits for a running cleaner to bring disk use back
/// under budget before writing past it anyway. (A count of waits ran out
/// in well under this: every segment freed ends a wait, also one that
/// leaves the log over budget.)
const CLEANER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// One foreground write counted in [`Store::wall_waiters`] while it lives.
struct WallWait<'a>(&'a std::cell::Cell<usize>);

impl<'a> WallWait<'a> {
    fn enter(count: &'a std::cell::Cell<usize>) -> Self {
        count.set(count.get() + 1);
        Self(count)
    }
}

impl Drop for WallWait<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

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

/// The open cold segment: where the cleaner's copies and cold keys'
/// updates go.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ColdSeg {
    pub head: u64,
    pub end: u64,
}

#[derive(Debug, Default)]
pub(crate) struct LogState {
    /// The hot head: hot appends go here. Every append so far, cold ones
    /// included, is committed once `durable` reaches it.
    pub head: u64,
    /// The head the last completed group commit captured.
    pub durable: u64,
    /// Records appended so far, and how many of them are committed.
    pub appends: u64,
    pub committed_appends: u64,
    /// End of the open hot segment (0: none open; the next hot append
    /// opens the first free segment at or after the head).
    pub hot_end: u64,
    pub cold: Option<ColdSeg>,
    /// Segments are opened at or after this address (set by recovery past
    /// every segment it probed; replay starts there until the next append).
    pub fresh_from: u64,
    /// Ring bytes before this address were never filled since open.
    pub ring_valid_from: u64,
    /// Appended byte ranges not yet written to the device, in append order
    /// of their first byte (a commit trims them once written).
    pub unwritten: Vec<(u64, u64)>,
    /// Bytes of cleaner copies appended since the last group commit
    /// captured the log
    /// ([`super::StoreConfig::cleaner_commit_bytes`]).
    pub cold_unwritten: u64,
    /// `(block, bytes)`: the bytes `[block, block + len)` as last written
    /// (state words 0), for the next write that continues that block.
    pub tail_blocks: Vec<(u64, Vec<u8>)>,
    pub slots: Slots,
    pub pending: VecDeque<Pending>,
    pub pending_hashes: HashMap<u64, u32, BuildHasherDefault<KeyHashHasher>>,
    pub pending_punches: u32,
    pub pending_new_keys: usize,
    /// Record bytes of those new keys (`space.rs` counts them as live).
    pub pending_new_bytes: u64,
    /// Group commits done when the hot head last opened a segment.
    pub commits_at_open: u64,
    /// The hot head filled its last segment with big commits: slots are
    /// not prepared ([`Store::prepare_next`]).
    pub big_commits: bool,
    /// What a group commit that fails for lack of space rolls back to
    /// (`nospace.rs`).
    pub undo: super::nospace::Undo,
}

impl LogState {
    /// The lowest log address not yet on the device (`None`: all are).
    pub fn unwritten_floor(&self) -> Option<u64> {
        self.unwritten.iter().map(|r| r.0).min()
    }

    /// The lowest address of a record waiting to be published, else the
    /// head: every record below it is published.
    pub fn published(&self) -> u64 {
        let head = self.head.max(self.fresh_from);
        self.pending.iter().map(|p| p.addr).min().unwrap_or(head)
    }

    /// Where a checkpoint of the index as it is now replays from:
    /// [`LogState::published`], or the open cold segment's head if lower.
    /// Records appended to the cold segment later lie below the hot head,
    /// and replay must meet them: they supersede records whose segments
    /// may be freed before the next checkpoint.
    pub fn replay_start(&self) -> u64 {
        let published = self.published();
        self.cold.map_or(published, |c| c.head.min(published))
    }

    /// Segment numbers of the open hot and cold segments.
    pub fn open_segments(&self, segment_bytes: u64) -> (Option<u64>, Option<u64>) {
        let hot = (self.hot_end > 0).then(|| self.hot_end / segment_bytes - 1);
        (hot, self.cold.map(|c| c.end / segment_bytes - 1))
    }

    /// Bytes of the slots in use, less the unwritten rest of the open
    /// segments.
    pub fn used_bytes(&self, segment_bytes: u64) -> u64 {
        let open_rest =
            self.hot_end.saturating_sub(self.head) + self.cold.map_or(0, |c| c.end - c.head);
        (self.slots.used() * segment_bytes).saturating_sub(open_rest)
    }

    fn note_unwritten(&mut self, from: u64, to: u64) {
        match self.unwritten.iter_mut().rev().find(|r| r.1 == from) {
            Some(r) => r.1 = to,
            None => self.unwritten.push((from, to)),
        }
    }
}

/// Where an append of `len` bytes goes, and whether it opens a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    pub addr: u64,
    pub opens: bool,
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
    /// Goes to the cold segment, above this address: a cleaner copy's
    /// original, or the key's newest record for a foreground single
    /// value ([`Store::stream_for`]).
    pub cold: Option<u64>,
}

/// Where [`Store::append_now`] put a record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Appended {
    pub len: u32,
    pub version: u64,
    /// Its place in append order: it is durable and published once a
    /// commit covers this many appends ([`Store::wait_durable`]).
    pub seq: u64,
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

    /// Where an append of `len` bytes would go now, `None` if it needs a segment and no slot is free. A hot
    /// append continues the open hot segment or opens the first free
    /// segment at or after the head; a cold one (`cold`: `Some(above)`)
    /// continues the open cold segment while it fits and its head is above
    /// `above` (the record copied or replaced: replay must meet the new
    /// one after it, and after every older record of its key), else opens
    /// one at the hot head (the hot segment's rest is abandoned: everything
    /// appended later lies after the cold records, so replay in address
    /// order sees each key's records in the order they were made).
    pub(crate) fn placement(
        &self,
        log: &LogState,
        len: u64,
        cold: Option<u64>,
    ) -> Option<Placement> {
        let seg = self.geo.segment_bytes;
        if let Some(above) = cold {
            if let Some(c) = log.cold {
                if c.head + len <= c.end && c.head > above {
                    return Some(Placement {
                        addr: c.head,
                        opens: false,
                    });
                }
            }
        } else if log.head + len <= log.hot_end {
            return Some(Placement {
                addr: log.head,
                opens: false,
            });
        }
        let n = log
            .slots
            .next_free(log.head.max(log.fresh_from).div_ceil(seg))?;
        Some(Placement {
            addr: n * seg,
            opens: true,
        })
    }

    /// Takes the place [`Store::placement`] chose for `len` bytes.
    fn place(&self, log: &mut LogState, len: u64, cold: Option<u64>) -> Result<u64> {
        let seg = self.geo.segment_bytes;
        let p = self
            .placement(log, len, cold)
            .ok_or_else(|| self.log_full(log))?;
        if p.opens {
            let n = p.addr / seg;
            let born = log.head;
            log.slots.occupy(n, born);
            log.undo.opened.push((n % self.geo.slots()) as usize);
            self.prepare_next(log, n, cold.is_none());
            if cold.is_some() {
                log.cold = Some(ColdSeg {
                    head: p.addr,
                    end: p.addr + seg,
                });
                log.head = p.addr + seg;
                log.hot_end = 0;
            } else {
                log.head = p.addr;
                log.hot_end = p.addr + seg;
            }
        }
        // A hot append about to overwrite the ring bytes the cold segment
        // would fill next closes it (the rest of it stays unused).
        let ring = self.geo.ring_bytes;
        if let Some(c) = log.cold {
            if cold.is_none() && p.addr + len > c.head + ring {
                log.cold = None;
            }
        }
        Ok(p.addr)
    }

    fn log_full(&self, log: &LogState) -> StoreError {
        self.no_room(self.live_bytes.get() + log.pending_new_bytes)
    }

    /// Disk use foreground writes wait at while a cleaner runs
    /// ([`super::band::disk_budget`]).
    pub(crate) fn disk_budget(&self) -> u64 {
        super::band::disk_budget(self.live_bytes.get(), self.geo.segment_bytes)
    }

    /// Device log bytes in use: the slots that hold a segment, less the
    /// unwritten rest of the open ones.
    pub(crate) fn log_used(&self) -> u64 {
        self.log.borrow().used_bytes(self.geo.segment_bytes)
    }

    /// Waits until `len` bytes can be appended (`cold`: to the cold
    /// segment above that address; `copy`: by the cleaner) without an
    /// await in between: a free slot if the append opens a segment (other
    /// appends leave [`CLEANER_SLOTS`] to the cleaner), no ring bytes that
    /// are not yet on the device overwritten, and while a cleaner runs,
    /// disk use within [`Store::disk_budget`] (but for the cleaner).
    pub(crate) async fn reserve_space(
        &self,
        len: u64,
        cold: Option<u64>,
        copy: bool,
    ) -> Result<()> {
        let max = self.geo.segment_bytes.min(self.geo.ring_bytes / 2);
        if len > max {
            return Err(StoreError::Invalid(format!(
                "record of {len} bytes exceeds a log segment ({max} bytes)"
            )));
        }
        if !copy && self.cleaner_active.get() && self.cleaner_behind() {
            // Let the scheduler weigh the cleaner's risen shares
            // ([`Store::cleaner_shares`]): on a device whose I/O completes
            // at once the foreground queue never runs dry, and glommio
            // switches queues only at its preemption deadline (5 ms), so the
            // cleaner ran 100 µs in 5 ms whatever its shares.
            glommio::executor().yield_task_queue_now().await;
        }
        // Until when a write over budget waits for the cleaner.
        let mut cleaner_deadline: Option<std::time::Instant> = None;
        let mut space_waits = 0;
        while space_waits < SPACE_WAIT_ROUNDS {
            self.check_writable()?;
            let (place, floor, free) = {
                let l = self.log.borrow();
                let place = self.placement(&l, len, cold);
                (place, l.unwritten_floor(), l.slots.free)
            };
            let reserve = if copy { 1 } else { 1 + CLEANER_SLOTS };
            let Some(place) = place.filter(|p| !p.opens || free >= reserve) else {
                self.head_watch.wake_all();
                self.wait_for_space().await;
                space_waits += 1;
                continue;
            };
            if floor.is_some_and(|f| place.addr + len > f + self.geo.ring_bytes) {
                self.wait_all_durable().await?;
                space_waits += 1;
                continue;
            }
            let used = self.log_used() + u64::from(place.opens) * self.geo.segment_bytes;
            let over_budget =
                !copy && place.opens && self.cleaner_active.get() && used > self.disk_budget();
            if over_budget {
                let now = std::time::Instant::now();
                // Cleaning is due while this write waits, whatever the
                // cleaner's marks say (they may lie above the budget when
                // the live data is a few segments, or have been computed
                // with more live data than is left): wake it.
                let _waiting = WallWait::enter(&self.wall_waiters);
                let deadline = *cleaner_deadline.get_or_insert_with(|| {
                    self.head_watch.wake_all();
                    self.counters.borrow_mut().cleaner_wall_waits += 1;
                    now + CLEANER_WAIT
                });
                if now < deadline {
                    self.wait_for_space().await;
                    continue;
                }
                self.counters.borrow_mut().cleaner_wait_timeouts += 1;
            }
            return Ok(());
        }
        Err(self.log_full(&self.log.borrow()))
    }

    /// Waits until a checkpoint frees log segments, or 1 ms.
    async fn wait_for_space(&self) {
        let (tx, rx) = oneshot::channel();
        self.space_waiters.borrow_mut().push(tx);
        let tick = glommio::timer::sleep(std::time::Duration::from_millis(1));
        futures::future::select(rx, std::pin::pin!(tick)).await;
    }

    /// Wakes the writes waiting for free segments.
    pub(crate) fn space_freed(&self) {
        for w in self.space_waiters.borrow_mut().drain(..) {
            let _ = w.send(());
        }
    }

    /// Appends a record to the ring now (space reserved by the caller with no
    /// await since).
    pub(crate) fn append_now(&self, spec: &AppendSpec<'_>) -> Result<Appended> {
        let len = record_len(spec.key, spec.value.len());
        let punch =
            spec.flags.has(RecordFlags::PUNCH_DKEY) || spec.flags.has(RecordFlags::PUNCH_OBJECT);
        let new_key = !punch
            && !spec.flags.has(RecordFlags::TOMBSTONE)
            && spec.held.unwrap_or_else(|| self.held(spec.key)) == Held::Absent;
        let mut log = self.log.borrow_mut();
        let addr = self.place(&mut log, len as u64, spec.cold)?;
        let version = spec.version.unwrap_or_else(|| {
            let v = self.next_version.get();
            self.next_version.set(v + 1);
            v
        });
        let off = (addr % self.geo.ring_bytes) as usize;
        // SAFETY: the record fits before the segment's end, so before the
        // ring's end (segments divide the ring), and the bytes are not yet
        // durable, so nothing reads them but one-sided readers, who check
        // the CRC.
        let out = unsafe { std::slice::from_raw_parts_mut(self.ring.as_ptr().add(off), len) };
        let (key, value, flags, extent) = (spec.key, spec.value, spec.flags, spec.extent_offset);
        let epoch = self.commit_epoch() as u16;
        encode_record_stamped(out, key, value, version, addr, flags, extent, epoch)
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        debug_assert_eq!(len % RECORD_ALIGN, 0);
        let end = addr + len as u64;
        match (spec.cold, log.cold.as_mut()) {
            (Some(_), Some(c)) => c.head = end,
            _ => log.head = end,
        }
        log.note_unwritten(addr, end);
        if spec.cold.is_some() && spec.origin.is_some() {
            log.cold_unwritten += len as u64;
        }
        if punch || spec.flags.has(RecordFlags::TOMBSTONE) || spec.flags.has(RecordFlags::EXTENT) {
            log.slots.pin(addr / self.geo.segment_bytes);
        }
        log.appends += 1;
        let hash = spec.key.hash().0;
        if punch {
            log.pending_punches += 1;
        } else {
            *log.pending_hashes.entry(hash).or_default() += 1;
        }
        if new_key {
            log.pending_new_keys += 1;
            log.pending_new_bytes += len as u64;
        }
        log.pending.push_back(Pending {
            addr,
            len: len as u32,
            hash,
            origin: spec.origin,
            punch,
            new_key,
        });
        let (head, seq) = (log.head, log.appends);
        drop(log);
        self.head_watch.advanced(head);
        let mut c = self.counters.borrow_mut();
        c.records_appended += 1;
        c.cold_writes += u64::from(spec.cold.is_some() && spec.origin.is_none());
        c.bytes_appended += len as u64;
        Ok(Appended {
            len: len as u32,
            version,
            seq,
        })
    }

    /// Is an update or punch of this key hash waiting to be published?
    pub(crate) fn has_pending(&self, hash: u64) -> bool {
        let log = self.log.borrow();
        log.pending_punches > 0 || log.pending_hashes.contains_key(&hash)
    }

    /// Returns once the first `seq` appends ([`Appended::seq`]) are
    /// durable (written, and flushed under [`Durability::Device`]) and
    /// published. See [`Store::wait_committed`].
    pub(crate) async fn wait_durable(&self, seq: u64) -> Result<()> {
        self.wait_committed(|l| l.committed_appends >= seq).await?;
        self.check_not_dropped(seq - 1, seq)
    }

    /// Returns once every record appended so far (cold ones too) is
    /// durable and published.
    /// Fails with `NoSpace` if any of them was dropped by a commit that
    /// found no space (the caller cannot tell whether its own were).
    pub(crate) async fn wait_all_durable(&self) -> Result<()> {
        let (floor, want) = {
            let log = self.log.borrow();
            (log.committed_appends, log.appends)
        };
        self.wait_committed(|l| l.committed_appends >= want).await?;
        self.check_not_dropped(floor, want)
    }

    /// Returns once `done` holds, committing (as the leader) or waiting for
    /// the leader's commit. The leader runs in the store's home task queue:
    /// a leader in the cleaner's low-share queue would hold every
    /// foreground request that joined its commit until the scheduler came
    /// back to that queue.
    async fn wait_committed(&self, done: impl Fn(&LogState) -> bool) -> Result<()> {
        loop {
            self.check_writable()?;
            if done(&self.log.borrow()) {
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
        shares: Shares,
        name: &'static str,
        make: impl Fn() -> F,
    ) -> glommio::task::JoinHandle<()>
    where
        F: std::future::Future<Output = ()> + 'static,
    {
        *self.me.borrow_mut() = Rc::downgrade(self);
        let tq = glommio::executor().create_task_queue(shares, Latency::NotImportant, name);
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

    /// The ring's bytes `[addr, addr + n)` (resident: the caller checked,
    /// with no await since) in a device buffer of whole blocks (`reuse`
    /// when big enough) whose length is `n`.
    pub(crate) fn ring_window(&self, addr: u64, n: usize, reuse: Option<IoBuf>) -> Result<IoBuf> {
        let bs = self.geo.block_size as usize;
        let mut b = self.io_buffer(reuse, n.next_multiple_of(bs))?;
        b.set_len(n);
        self.copy_from_ring(addr, addr + n as u64, b.as_mut_slice());
        Ok(b)
    }

    /// A block-aligned buffer of `len` bytes for a group commit: the kept
    /// heap buffer when it is big enough, else a new one (a pool slot when
    /// one fits).
    pub(super) fn commit_buffer(&self, len: usize) -> Result<IoBuf> {
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

    /// One group commit: writes every range appended since the last commit
    /// (in writes of at most `max_commit_bytes`), flushes, then publishes
    /// the records it covered in append order.
    async fn commit_once(&self) -> Result<()> {
        let (ranges, covered, head) = {
            let log = self.log.borrow();
            if log.unwritten.is_empty() && log.pending.is_empty() {
                drop(log);
                let mut log = self.log.borrow_mut();
                log.durable = log.head;
                log.committed_appends = log.appends;
                log.cold_unwritten = 0;
                let mark = super::nospace::Mark::of(&log);
                log.undo.committed(mark, usize::MAX);
                return Ok(());
            }
            (log.unwritten.clone(), log.pending.len(), log.head)
        };
        let (mark, opened, tails) = {
            let log = self.log.borrow();
            let m = super::nospace::Mark::of(&log);
            (m, log.undo.opened.len(), log.tail_blocks.clone())
        };
        if let Err(e) = self.scrub_failed().await {
            return Err(self.commit_failed(e, &[], tails));
        }
        let (appends, cold) = {
            let log = self.log.borrow();
            (log.appends, log.cold_unwritten)
        };
        let device = self.config.durability == Durability::Device;
        // The ranges (the hot head's, the cold segment's) and the writes
        // each is cut into are written at once: a commit waits for one
        // device write, not one per range or per `max_commit_bytes` (every
        // write but a range's first starts on a block boundary, so none
        // needs another's last block). A crash between them leaves a torn
        // commit, which recovery cuts.
        let mut chunks = Vec::new();
        for &(from, to) in &ranges {
            let mut at = from;
            while at < to {
                chunks.push((at, to));
                at = self.chunk_end(at, to);
            }
        }
        // A commit of a few writes has each carry its flush
        // (Channel::write_durable): they run at once, so the commit waits
        // for one device round trip, not a write and then a flush.
        let durable = device && chunks.len() <= DURABLE_WRITES_MAX;
        // Every write is let finish before a failure is acted on: one
        // still in flight could land after a rollback's rewrite.
        let writes = (chunks.into_iter()).map(|(at, to)| self.write_chunk(at, to, durable));
        let results = futures::future::join_all(writes).await;
        if let Some(e) = results.into_iter().find_map(|r| r.err()) {
            return Err(self.commit_failed(e, &ranges, tails));
        }
        if durable {
            self.note_flushed(appends);
        } else if device {
            if let Err(e) = self.chan.flush().await {
                if e.is_no_space() {
                    let e = self.no_space_error("log flush", 0);
                    return Err(self.commit_failed(e, &ranges, tails));
                }
                self.set_poison(format!("log flush: {e}"));
                return Err(self.device_error("flush", e));
            }
            self.note_flushed(appends);
        }
        {
            let mut log = self.log.borrow_mut();
            for &(from, to) in &ranges {
                if let Some(i) = log.unwritten.iter().position(|r| r.0 == from) {
                    log.unwritten[i].0 = to;
                    if log.unwritten[i].0 >= log.unwritten[i].1 {
                        log.unwritten.remove(i);
                    }
                }
            }
            log.durable = head;
            log.committed_appends = appends;
            log.cold_unwritten -= cold;
            log.undo.committed(mark, opened);
        }
        let mut c = self.counters.borrow_mut();
        c.commits += 1;
        c.commit_cold_bytes_max = c.commit_cold_bytes_max.max(cold);
        drop(c);
        self.publish_first(covered)
    }

    /// Publishes the first `n` pending records (those a commit covered).
    fn publish_first(&self, n: usize) -> Result<()> {
        for _ in 0..n {
            let p = {
                let mut log = self.log.borrow_mut();
                let Some(p) = log.pending.pop_front() else {
                    break;
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
                    log.pending_new_bytes -= u64::from(p.len);
                }
                p
            };
            let bytes = self.ring_slice(p.addr, p.len as usize);
            if let Err(e) = self.apply_record(bytes, p.addr, p.origin) {
                self.set_poison(format!("publishing record at {}: {e}", p.addr));
                return Err(e);
            }
        }
        self.free_zero_slots();
        Ok(())
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
