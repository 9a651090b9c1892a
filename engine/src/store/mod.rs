//! The record store of one target: a record log, lock-free metadata buckets,
//! group commit, checkpoints, recovery and a log cleaner.
//!
//! A [`Store`] lives on one xstream (it is `!Send`); all its methods take
//! `&self`, so many requests of that xstream run on it concurrently.
//!
//! An update appends a record (`ferrite_proto::record`) to the memory ring in
//! the log [`Region`], writes it to the device log, shares one flush with the
//! updates that arrived meanwhile (group commit; under [`Durability::Process`]
//! the flush is left to [`Store::sync`], checkpoints and a background
//! [`Store::flush_loop`]), then — once durable —
//! publishes the key's bucket slot (`ferrite_proto::bucket`) and sets the
//! superseded bit of the key's previous record, and only then returns. Clients
//! read buckets and records one-sided out of the two regions ([`Store::regions`]).
//! Records evicted from the ring are still reachable through the same slot:
//! their log address names their place on the device, and [`Store::fetch`]
//! reads them from there, checking the CRC.
//!
//! Checkpoints of the index ([`Store::checkpoint`]) bound recovery, which
//! replays the log after the last one, up to each segment's torn or unwritten
//! end. The cleaner ([`Store::spawn_cleaner`]) picks segments by
//! cost-benefit, copies their live records to cold segments apart from the
//! foreground's hot writes, and frees them; updates of keys long unwritten
//! go to the cold segments too ([`StoreConfig::cold_writes`]). Device
//! layout: `engine/FORMAT.md`.
//!
//! DRAM per key: the bucket region (64 bytes per 3 slots, so 21.3 / load
//! bytes per key at a load factor `load` of all slots; chaining with the
//! default overflow pool of a quarter of the main area reaches about 0.66,
//! 32 bytes per key) and the sorted key directory (packed blocks of
//! front-coded keys with their version, record pointer and extent pieces,
//! varint-coded, no allocation per key: `StoreStats::directory_bytes`, about
//! 22 to 24 bytes per key for 8-byte dkeys), which serves listings, conditional
//! updates, the cleaner and checkpoints. `ferrite bench store` prints both
//! per key, the heap growth per key over its load, and their total
//! `metadata_bytes_per_key` with the load it was measured at.
//!
//! ```
//! use ferrite_engine::store::{Store, StoreConfig};
//! use ferrite_proto::key::RecordKey;
//!
//! glommio::LocalExecutorBuilder::default()
//!     .spawn(|| async move {
//!         let bdev = ferrite_bdev::open("malloc:16M").unwrap();
//!         let store = Store::open(bdev, StoreConfig::small()).await.unwrap();
//!         let key = RecordKey::new(1, 7, b"dkey", b"akey");
//!         let v1 = store.update(&key, b"hello").await.unwrap();
//!         let (version, value) = store.fetch(&key).await.unwrap().unwrap();
//!         assert_eq!((version, value.as_slice()), (v1, b"hello".as_slice()));
//!         store.punch(&key).await.unwrap();
//!         assert!(store.fetch(&key).await.unwrap().is_none());
//!     })
//!     .unwrap()
//!     .join()
//!     .unwrap();
//! ```

mod apply;
mod band;
mod buckets;
mod checkpoint;
mod chunk;
mod cleaner;
mod cold;
mod damage;
mod dir;
mod error;
mod extents;
mod format;
mod keeper;
mod log;
mod many;
mod nospace;
mod ops;
mod prepare;
mod recover;
mod segments;
mod space;
mod sync;
mod verify;
mod watch;

pub use checkpoint::CheckpointInfo;

/// Most main-area buckets a table may have (bucket indexes are 32-bit).
pub const MAIN_BUCKETS_MAX: u64 = 1 << 31;
pub use cleaner::{CleanReport, CLEANER_SHARES};
pub use error::{Result, StoreError};
pub use format::Geometry;
pub use keeper::{KEEPER_SHARES, KEEP_CHARGE_MIN_BYTES};
pub use many::WriteOp;
pub use ops::{ExtentSink, EXTENT_READ_MAX_BYTES};
pub use sync::Durability;

use crate::region::Region;
use buckets::BucketTable;
use dir::Directory;
use ferrite_bdev::{BdevRef, Channel, IoBuf};
use ferrite_proto::region::{Provider, RegionDescriptor, RegionKind};
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::sync::Arc;

/// How to open a store. Geometry fields (`ring_bytes`, `checkpoint_bytes`,
/// `max_commit_bytes`) apply when the device is formatted (first open);
/// later opens use what the superblock says.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Target index (goes into region descriptors).
    pub target: u16,
    /// Region id of the bucket region; the log ring gets `region_id + 1`.
    pub region_id: u32,
    /// Main-area buckets (3 slots each): any count from 4 to
    /// [`MAIN_BUCKETS_MAX`]; a power of two indexes by mask.
    pub bucket_count: u64,
    /// Overflow buckets for chaining.
    pub overflow_buckets: u32,
    /// Memory ring bytes (multiple of 4096); records up to half of it.
    pub ring_bytes: u64,
    /// Bytes per checkpoint area; 0 = an eighth of the device (≤ 1 GiB).
    pub checkpoint_bytes: u64,
    /// Largest single log write of a group commit.
    pub max_commit_bytes: u64,
    /// Log segment size wanted (the unit of allocation and cleaning; the
    /// geometry takes the largest power of two at most this that divides
    /// the ring, at most half of it). Records never cross a segment's end,
    /// so it must be well above the largest record: the tail a record does
    /// not fit in is left unused.
    pub segment_bytes: u64,
    /// Back regions with 2 MiB huge pages.
    pub hugetlb: bool,
    /// Fault the regions in, writable, at open ([`Region::populate`]).
    pub populate: bool,
    /// When updates are acknowledged.
    pub durability: Durability,
    /// Background flush period under [`Durability::Process`].
    pub flush_interval: std::time::Duration,
    /// Live records with values up to this many bytes are kept in the ring
    /// by [`Store::spawn_keeper`]; 0 turns the keeper off.
    pub hot_value_max: u32,
    /// Bytes of cleaner copies a group commit carries, about (the copy
    /// that crosses the mark is the last): past it, the cleaner waits for
    /// a commit before it appends more. A foreground commit that carries
    /// copies writes them beside its own records and waits for both, so
    /// this bounds what the cleaner adds to a foreground write. Default
    /// 64 KiB: against 128 KiB, `ferrite bench store --cleaner-only` put
    /// the busy/idle p99 at 1.10-2.14 on pmem (msync) and 1.43-1.79 on
    /// uring, against 1.90-2.11 and 1.62-1.88.
    pub cleaner_commit_bytes: u64,
    /// Single values whose key's newest record is more than two rings of
    /// log old are appended to the cold segment, not the hot head
    /// (`cold.rs`).
    pub cold_writes: bool,
    /// The share of the device log's usable capacity, in percent, the live
    /// data may fill (`space.rs`): an update that would take it further
    /// fails at once with [`StoreError::LogFull`]. Default 85.
    pub fill_ceiling_percent: u8,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            target: 0,
            region_id: 0,
            bucket_count: 1 << 18,
            overflow_buckets: 1 << 16,
            ring_bytes: 64 << 20,
            checkpoint_bytes: 0,
            max_commit_bytes: 4 << 20,
            segment_bytes: 32 << 20,
            hugetlb: false,
            populate: false,
            durability: Durability::Device,
            flush_interval: std::time::Duration::from_secs(1),
            hot_value_max: 1024,
            cleaner_commit_bytes: 64 << 10,
            cold_writes: true,
            fill_ceiling_percent: 85,
        }
    }
}

impl StoreConfig {
    /// A configuration for small devices and tests: 4096 main buckets,
    /// a 1 MiB ring, 256 KiB cleaner segments.
    pub fn small() -> Self {
        Self {
            bucket_count: 1 << 12,
            overflow_buckets: 1 << 10,
            ring_bytes: 1 << 20,
            max_commit_bytes: 256 << 10,
            segment_bytes: 256 << 10,
            ..Self::default()
        }
    }
}

/// Outcome of a conditional update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conditional {
    /// Written; the new version.
    Applied(u64),
    /// Not written; the key's current version (`None`: absent).
    Conflict(Option<u64>),
}

/// Condition of [`Store::update_if`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Only if the key is absent.
    Absent,
    /// Only if the key's current version is this one.
    Version(u64),
}

/// The two regions a target exports and the parameters of their descriptors.
#[derive(Debug, Clone)]
pub struct StoreRegions {
    pub buckets: Arc<Region>,
    pub log: Arc<Region>,
    /// Main-area bucket count (descriptor `param` of the bucket region).
    pub main_bucket_count: u64,
    /// Ring bytes (descriptor `param` of the log region).
    pub ring_bytes: u64,
    pub target: u16,
    /// The device's log area, when the device is a regular file.
    pub device_log: Option<DeviceLog>,
}

/// The log area of a target's device file, for the shm provider to export
/// read-only (`RegionKind::DeviceLog`, `ferrite-proto`'s `FORMAT.md`).
#[derive(Debug, Clone)]
pub struct DeviceLog {
    /// The device file, opened read-only.
    pub file: Arc<std::fs::File>,
    /// File offset of log address 0 (the geometry's `log_offset`).
    pub file_offset: u64,
    /// Device log bytes: log address `a` is at `file_offset + a % log_bytes`.
    pub log_bytes: u64,
}

impl DeviceLog {
    /// Its descriptor for the shm provider, with region id `region_id`.
    pub fn descriptor(&self, target: u16, region_id: u32) -> RegionDescriptor {
        RegionDescriptor {
            provider: Provider::Shm,
            kind: RegionKind::DeviceLog,
            target,
            region_id,
            length: self.log_bytes,
            param: self.log_bytes,
            access_key: 0,
            remote_addr: self.file_offset,
        }
    }
}

impl StoreRegions {
    /// Descriptors of both regions for `provider` (access key and remote
    /// address left 0 for the provider to fill in).
    pub fn descriptors(&self, provider: Provider) -> [RegionDescriptor; 2] {
        let d = |r: &Region, kind, param| RegionDescriptor {
            provider,
            kind,
            target: self.target,
            region_id: r.id(),
            length: r.len() as u64,
            param,
            access_key: 0,
            remote_addr: 0,
        };
        [
            d(&self.buckets, RegionKind::Buckets, self.main_bucket_count),
            d(&self.log, RegionKind::Log, self.ring_bytes),
        ]
    }
}

/// Counters and sizes, for `ferrite bench store` and metrics.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StoreStats {
    pub keys: usize,
    pub live_bytes: u64,
    pub log_used_bytes: u64,
    pub log_capacity_bytes: u64,
    /// The log less the segments it needs besides the live data
    /// (`space.rs`): what live data could ever fill.
    pub log_usable_bytes: u64,
    /// The most live bytes the store admits (`space.rs`).
    pub live_ceiling_bytes: u64,
    /// Updates refused because they would pass the ceiling.
    pub writes_refused_full: u64,
    /// Cleaner bytes copied per byte the foreground wrote, since open.
    pub cleaner_write_amp: f64,
    pub head: u64,
    pub durable: u64,
    /// Records written but not yet flushed ([`Durability::Process`]).
    pub unflushed: u64,
    /// Start of the oldest segment the log holds.
    pub tail: u64,
    /// Bytes of a log segment (the unit of allocation and cleaning).
    pub segment_bytes: u64,
    pub ring_bytes: u64,
    pub commits: u64,
    pub records_appended: u64,
    pub bytes_appended: u64,
    pub device_reads: u64,
    pub cleaner_passes: u64,
    pub cleaner_records_copied: u64,
    pub cleaner_bytes_copied: u64,
    /// Scanned records the cleaner found dead by their bucket chain alone
    /// (no directory seek).
    pub cleaner_dead_by_slot: u64,
    /// Live-record windows the cleaner read (from the ring or the device).
    pub cleaner_windows_read: u64,
    /// Device buffers the cleaner allocated for those reads: a few when it
    /// is spawned, reused by every read after.
    pub cleaner_read_buffers: u64,
    /// Writes that waited at the disk budget for the cleaner (each counted
    /// once, however long it waited).
    pub cleaner_wall_waits: u64,
    /// Writes that stopped waiting for the cleaner (over the disk budget for
    /// the whole wait) and went on.
    pub cleaner_wait_timeouts: u64,
    /// Cleaning passes (or the checkpoints the cleaner takes) that failed
    /// with an error; the cleaner backs off and tries again.
    pub cleaner_failures: u64,
    /// Group commits led by a task outside the store's home task queue
    /// (the queue it was opened in). A commit the cleaner needs is led from
    /// home, so this stays 0 with a running cleaner.
    pub commits_led_off_home: u64,
    /// The most bytes of cleaner copies one group commit carried
    /// ([`StoreConfig::cleaner_commit_bytes`]).
    pub commit_cold_bytes_max: u64,
    /// Foreground records appended to the cold segment (`cold.rs`).
    pub cold_writes: u64,
    /// Log bytes written to the device straight from the ring, with no copy
    /// into a buffer (whole blocks of big writes).
    pub ring_write_bytes: u64,
    /// Small live records the keeper copied forward to keep them in the ring.
    pub keeper_records_kept: u64,
    pub keeper_bytes_kept: u64,
    /// Ring bytes the keeper gave up on because it fell behind.
    pub keeper_skipped_bytes: u64,
    pub checkpoints: u64,
    /// Segments freed as soon as their last live record died, with no
    /// checkpoint ([`Store::free_zero_slots`]).
    pub segments_freed_early: u64,
    /// [`Store::fetch_batch`] calls and the keys they fetched (the engine
    /// serves batch frames and bursts of pipelined GETs that way).
    pub fetch_batches: u64,
    pub fetch_batch_keys: u64,
    /// Device slots prepared ahead of the log (their holes filled, see
    /// `store::prepare`), the bytes of zeros that took, commits that waited
    /// for a preparation, and preparations that failed (the log's writes
    /// then allocate the slot themselves).
    pub slots_prepared: u64,
    pub prepare_bytes_filled: u64,
    pub prepare_waits: u64,
    pub prepare_failures: u64,
    pub bucket_slots_used: usize,
    pub bucket_count_total: u32,
    pub overflow_buckets_free: usize,
    pub bucket_region_bytes: usize,
    /// Heap bytes of the list of free overflow buckets.
    pub bucket_free_list_bytes: usize,
    /// Heap bytes of the key directory's packed blocks (sorted keys,
    /// versions, record pointers, extent pieces).
    pub directory_bytes: usize,
    pub poisoned: bool,
    /// Damaged log ranges (each at least one record) recovery found and
    /// skipped, over every recovery of this store (checkpoints carry it).
    pub corrupt_records: u64,
    /// Log addresses of the most recent of those ranges, oldest first.
    pub corrupt_offsets: Vec<u64>,
}

#[derive(Debug, Default)]
struct Counters {
    commits: u64,
    records_appended: u64,
    bytes_appended: u64,
    device_reads: u64,
    cleaner_passes: u64,
    cleaner_records_copied: u64,
    cleaner_bytes_copied: u64,
    cleaner_dead_by_slot: u64,
    cleaner_windows_read: u64,
    cleaner_read_buffers: u64,
    cleaner_wall_waits: u64,
    cleaner_wait_timeouts: u64,
    cleaner_failures: u64,
    commits_led_off_home: u64,
    commit_cold_bytes_max: u64,
    cold_writes: u64,
    ring_write_bytes: u64,
    keeper_records_kept: u64,
    keeper_bytes_kept: u64,
    keeper_skipped_bytes: u64,
    checkpoints: u64,
    segments_freed_early: u64,
    fetch_batches: u64,
    fetch_batch_keys: u64,
    slots_prepared: u64,
    prepare_bytes_filled: u64,
    prepare_waits: u64,
    prepare_failures: u64,
    writes_refused_full: u64,
}

/// The record store of one target. See the module docs.
pub struct Store {
    device: String,
    bdev: BdevRef,
    chan: Box<dyn Channel>,
    geo: Geometry,
    config: StoreConfig,
    ring: Arc<Region>,
    table: RefCell<BucketTable>,
    dir: RefCell<Directory>,
    log: RefCell<log::LogState>,
    committing: Cell<bool>,
    /// The biggest group commit buffer that came from the heap (bigger
    /// than a pool slot), reused by the next commits: commits are one at a
    /// time, and a fresh multi-megabyte buffer per commit costs page faults.
    commit_buf: RefCell<Option<IoBuf>>,
    /// The last checkpoint's body and device buffer, reused by the next
    /// (checkpoints are one at a time, under `checkpoint_lock`).
    checkpoint_bufs: RefCell<(Vec<u8>, Option<IoBuf>)>,
    /// The device buffers of the cleaner's window reads, allocated when it
    /// is spawned and reused ([`cleaner::CLEANER_READ_BYTES`]).
    cleaner_bufs: RefCell<Vec<IoBuf>>,
    waiters: RefCell<Vec<oneshot::Sender<()>>>,
    /// Writes waiting for a checkpoint to free log segments.
    space_waiters: RefCell<Vec<oneshot::Sender<()>>>,
    poison: RefCell<Option<String>>,
    next_version: Cell<u64>,
    live_bytes: Cell<u64>,
    counters: RefCell<Counters>,
    checkpoint_generation: Cell<u64>,
    /// Bytes the last checkpoint wrote: a cleaning pass scans several times
    /// as much, so that checkpoints stay a small part of its writes.
    checkpoint_bytes: Cell<u64>,
    /// Where replay would start from the last durable checkpoint.
    checkpoint_replay_start: Cell<u64>,
    checkpoint_lock: glommio::sync::Semaphore,
    cleaner_stop: Cell<bool>,
    /// Wakes the cleaner and the keeper as the head moves.
    head_watch: watch::HeadWatch,
    cleaner_active: Cell<bool>,
    /// Foreground writes waiting at the disk budget for the cleaner: while
    /// any do, cleaning is due whatever the cleaner's own marks say.
    wall_waiters: Cell<usize>,
    /// The task queue the store was opened in (its xstream's foreground),
    /// where group commits are led ([`Store::wait_durable`]).
    home_queue: Option<glommio::TaskQueueHandle>,
    /// The `Rc` the store lives in, once [`Store::spawn_cleaner`] has seen
    /// it: lets a cleaner's commit be led by a task in `home_queue`.
    me: RefCell<std::rc::Weak<Store>>,
    keeper: Cell<keeper::KeeperState>,
    /// This many of the appended records are on stable media.
    flushed_upto: Cell<u64>,
    flush_lock: glommio::sync::Semaphore,
    /// Which device slots are allocated ahead of the log ([`prepare`]).
    prep: RefCell<prepare::Preparation>,
    /// Damaged log ranges found by recoveries, and the commit epoch.
    damage: RefCell<damage::Damage>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("device", &self.device)
            .field("geometry", &self.geo)
            .finish()
    }
}

impl Store {
    /// The exported regions and their descriptor parameters.
    pub fn regions(&self) -> StoreRegions {
        StoreRegions {
            buckets: Arc::clone(self.table.borrow().region()),
            log: Arc::clone(&self.ring),
            main_bucket_count: self.table.borrow().main_count(),
            ring_bytes: self.geo.ring_bytes,
            target: self.config.target,
            device_log: self.device_log(),
        }
    }

    /// The device's log area as [`StoreRegions::device_log`] exports it:
    /// `None` when the device is not a regular file, or its file cannot be
    /// opened again (then logged; clients read evicted records by RPC).
    fn device_log(&self) -> Option<DeviceLog> {
        let file = match self.bdev.read_only_file()? {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(device = %self.device, error = %e, "device log not exported");
                return None;
            }
        };
        let aligned = self.geo.log_offset % ferrite_proto::region::DEVICE_LOG_ALIGN == 0;
        let fits = file
            .metadata()
            .is_ok_and(|m| m.len() >= self.geo.log_offset + self.geo.log_bytes);
        if !aligned || !fits {
            tracing::warn!(device = %self.device, "device log not exported: layout");
            return None;
        }
        Some(DeviceLog {
            file: Arc::new(file),
            file_offset: self.geo.log_offset,
            log_bytes: self.geo.log_bytes,
        })
    }

    /// Mean bucket reads a one-sided reader makes to reach a key's slot
    /// (walks the whole bucket table: for benchmarks).
    pub fn mean_bucket_reads(&self) -> f64 {
        self.table.borrow().mean_chain_reads()
    }

    /// Device layout in use.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    pub fn stats(&self) -> StoreStats {
        let log = self.log.borrow();
        let t = self.table.borrow();
        let c = self.counters.borrow();
        let dir = self.dir.borrow();
        StoreStats {
            keys: dir.len(),
            live_bytes: self.live_bytes.get(),
            log_used_bytes: log.used_bytes(self.geo.segment_bytes),
            log_capacity_bytes: self.geo.log_bytes,
            log_usable_bytes: self.log_usable(),
            live_ceiling_bytes: self.live_ceiling(),
            writes_refused_full: c.writes_refused_full,
            cleaner_write_amp: self.cleaner_write_amp_of(&c),
            head: log.head,
            durable: log.durable,
            unflushed: log
                .committed_appends
                .saturating_sub(self.flushed_upto.get()),
            tail: log.slots.low_addr(self.geo.segment_bytes),
            ring_bytes: self.geo.ring_bytes,
            segment_bytes: self.geo.segment_bytes,
            commits: c.commits,
            records_appended: c.records_appended,
            bytes_appended: c.bytes_appended,
            device_reads: c.device_reads,
            cleaner_passes: c.cleaner_passes,
            cleaner_records_copied: c.cleaner_records_copied,
            cleaner_bytes_copied: c.cleaner_bytes_copied,
            cleaner_dead_by_slot: c.cleaner_dead_by_slot,
            cleaner_windows_read: c.cleaner_windows_read,
            cleaner_read_buffers: c.cleaner_read_buffers,
            cleaner_wall_waits: c.cleaner_wall_waits,
            slots_prepared: c.slots_prepared,
            prepare_bytes_filled: c.prepare_bytes_filled,
            prepare_waits: c.prepare_waits,
            prepare_failures: c.prepare_failures,
            cleaner_wait_timeouts: c.cleaner_wait_timeouts,
            cleaner_failures: c.cleaner_failures,
            commits_led_off_home: c.commits_led_off_home,
            commit_cold_bytes_max: c.commit_cold_bytes_max,
            cold_writes: c.cold_writes,
            ring_write_bytes: c.ring_write_bytes,
            keeper_records_kept: c.keeper_records_kept,
            keeper_bytes_kept: c.keeper_bytes_kept,
            keeper_skipped_bytes: c.keeper_skipped_bytes,
            checkpoints: c.checkpoints,
            segments_freed_early: c.segments_freed_early,
            fetch_batches: c.fetch_batches,
            fetch_batch_keys: c.fetch_batch_keys,
            bucket_slots_used: t.used_slots(),
            bucket_count_total: t.total_count(),
            overflow_buckets_free: t.free_overflow(),
            bucket_region_bytes: t.region().len(),
            bucket_free_list_bytes: t.free_list_bytes(),
            directory_bytes: dir.estimated_bytes(),
            poisoned: self.poison.borrow().is_some(),
            corrupt_records: self.damage.borrow().corrupt_records,
            corrupt_offsets: self.damage.borrow().ranges.iter().map(|r| r.0).collect(),
        }
    }

    /// `Err(Poisoned)` once a write or flush has failed.
    pub fn check_writable(&self) -> Result<()> {
        match &*self.poison.borrow() {
            None => Ok(()),
            Some(cause) => Err(StoreError::Poisoned {
                device: self.device.clone(),
                cause: cause.clone(),
            }),
        }
    }

    pub(crate) fn set_poison(&self, cause: String) {
        let mut p = self.poison.borrow_mut();
        if p.is_none() {
            tracing::error!(device = %self.device, %cause, "store poisoned");
            *p = Some(cause);
        }
        drop(p);
        self.head_watch.wake_all();
    }

    pub(crate) fn device_error(
        &self,
        op: &'static str,
        source: ferrite_bdev::BdevError,
    ) -> StoreError {
        StoreError::Device {
            device: self.device.clone(),
            op,
            source,
        }
    }
}
