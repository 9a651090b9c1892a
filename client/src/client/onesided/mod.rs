//! The one-sided GET: find a key's record in a target's bucket and log
//! regions without the engine's CPU, and prove it is the key's latest value.
//!
//! Steps (see `DESIGN.md`, "How a request flows"):
//! 1. hash the key → target, main bucket index, fingerprint;
//! 2. take the bucket from the [`BucketCache`] or read it (its CRC is
//!    checked before anything rests on it: absence, the chain, an array's
//!    extent, a record on the device; a single value's record proves itself);
//! 3. for each slot with the fingerprint, read the record at its remote
//!    pointer and check magic, format, CRC, log address, container, object,
//!    dkey and akey, the version's low bits, and the superseded bit;
//! 4. follow the overflow chain;
//! 5. on any mismatch read the bucket again, within a time and attempt
//!    budget; then give up and let the caller ask by RPC.
//!
//! A record that has left the memory ring is read from the target's device
//! log mapping instead, when the endpoint has one (shm on a file-backed
//! device), and checked the same way. The device holds no superseded bit,
//! so only a bucket read fresh, before the record, may lead there: the
//! value is then the one published when the bucket was read.
//!
//! What is returned was the key's published value when its superseded bit
//! was read as clear, a moment inside the call; the engine sets that bit on
//! the old record before it acknowledges the newer write, so it was also the
//! latest acknowledged one then (or a newer, not yet acknowledged one).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_proto::bucket::{Bucket, BUCKET_BYTES};
use ferrite_proto::key::{target_of, RecordKey};
use ferrite_proto::record::{
    RecordFlags, RecordView, HEADER_BYTES, OFF_EXTENT_OFFSET, VALUE_MAX_BYTES,
};
use ferrite_proto::region::RegionDescriptor;
use ferrite_proto::FormatError;

use crate::client::cache::BucketCache;
use crate::client::counters::{Counter, Counters};
use crate::client::error::Result;
use crate::fabric::{AsyncReads, BatchRead, DependentReads, Endpoint};

mod async_get;
mod batch;
mod listed;
mod peek;

pub use async_get::AsyncLookupFuture;
pub use listed::{Listed, Newest};

/// Longest record a slot may point to (header, two 4 KiB key parts, 1 MiB
/// value, padding).
pub const RECORD_MAX_BYTES: usize = HEADER_BYTES + 2 * 4096 + VALUE_MAX_BYTES + 8;
/// Overflow buckets followed at most per lookup.
pub const CHAIN_MAX: usize = 64;

/// The regions of one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetRegions {
    pub buckets: RegionDescriptor,
    pub log: RegionDescriptor,
    /// The log area of the target's device file (`RegionKind::DeviceLog`),
    /// when the endpoint maps it (shm only): records that have left the ring
    /// are read there, behind a bucket read fresh.
    pub device: Option<RegionDescriptor>,
}

/// How hard to try before falling back to RPC.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Time allowed for retries after the first mismatch.
    pub budget: Duration,
    /// Bucket reads allowed per GET.
    pub max_attempts: u32,
    /// Whether a key missing from a freshly read bucket chain is absent
    /// (true when the engine indexes every key in its buckets); otherwise the
    /// caller asks by RPC.
    pub absent_is_final: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            budget: Duration::from_millis(2),
            max_attempts: 32,
            absent_is_final: true,
        }
    }
}

/// Why a GET must be answered by RPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackReason {
    /// The record is older than the memory ring holds.
    NotInMemory,
    /// The time or attempt budget ran out.
    RetriesExhausted,
    /// Not in the bucket chain and the policy does not trust absence.
    NotIndexed,
    /// The record is an extent or punch; the engine assembles those.
    NotPlainValue,
}

/// Result of one one-sided lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The value is in the caller's buffer.
    Found { version: u64 },
    /// The key has no value (never written, or deleted).
    Absent,
    /// Ask the engine.
    Fallback(FallbackReason),
}

/// Reads records one-sided through an [`Endpoint`].
pub struct OneSidedReader {
    endpoint: Box<dyn Endpoint>,
    targets: Vec<TargetRegions>,
    cache: Arc<BucketCache>,
    policy: RetryPolicy,
    /// The endpoint's asynchronous reads, if it has them.
    async_reads: Option<Arc<dyn AsyncReads>>,
}

impl std::fmt::Debug for OneSidedReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneSidedReader")
            .field("provider", &self.endpoint.provider())
            .field("targets", &self.targets.len())
            .field("cache", &self.cache)
            .finish()
    }
}

/// What one pass over a bucket chain found.
enum Pass {
    Done(Lookup),
    /// Read the bucket again (and count a retry); carries the log address
    /// of a record that failed its check behind a freshly read bucket.
    Retry(Option<u64>),
}

impl OneSidedReader {
    /// `targets[i]` are the regions of target `i`; `cache_buckets` bounds the
    /// bucket cache.
    pub fn new(
        endpoint: Box<dyn Endpoint>,
        targets: Vec<TargetRegions>,
        cache_buckets: usize,
        policy: RetryPolicy,
    ) -> Result<Self> {
        if targets.is_empty() {
            return Err(crate::client::error::Error::InvalidArgument(
                "one-sided reader needs at least one target".into(),
            ));
        }
        for t in &targets {
            t.buckets.validate()?;
            t.log.validate()?;
            if let Some(device) = &t.device {
                device.validate()?;
            }
        }
        Ok(Self {
            async_reads: endpoint.async_reads(),
            endpoint,
            targets,
            cache: Arc::new(BucketCache::new(cache_buckets)),
            policy,
        })
    }

    pub fn provider(&self) -> &'static str {
        self.endpoint.provider()
    }

    /// Whether [`lookup_async`](Self::lookup_async) has an endpoint's
    /// asynchronous reads to run on.
    pub fn has_async_reads(&self) -> bool {
        self.async_reads.is_some()
    }

    /// Whether the endpoint's reads are CPU loads (shm), cheap enough to
    /// read a record in several pieces.
    pub fn reads_are_loads(&self) -> bool {
        self.endpoint.prefetches()
    }

    pub fn targets(&self) -> &[TargetRegions] {
        &self.targets
    }

    fn locate(&self, key: &RecordKey<'_>) -> (&TargetRegions, u64, u32) {
        let hash = key.hash();
        let target = match self.targets.len() {
            1 => 0,
            n => target_of(key.dkey_hash(), n as u32) as usize,
        };
        let regions = &self.targets[target];
        (
            regions,
            hash.bucket_index(regions.buckets.param),
            hash.fingerprint(),
        )
    }

    /// Looks `key` up; on `Found` its value is in `out` (replacing what was
    /// there). Errors only when the endpoint itself fails.
    pub fn get_into(
        &self,
        key: &RecordKey<'_>,
        out: &mut Vec<u8>,
        counters: &Counters,
    ) -> Result<Lookup> {
        self.lookup_into(key, None, false, out, counters)
    }

    /// Reads `len` bytes at `offset` of the byte array `key` when the
    /// array's newest extent record covers the whole range (its bytes are
    /// then the newest there); on `Found` they are in `out`. Anything else
    /// (the range needs older pieces, or holes) is a `Fallback` to the
    /// engine, which assembles arrays. Buckets are read fresh, never from
    /// the cache: an older extent is not marked superseded when a newer one
    /// covers part of it, so only a fresh slot proves a record is newest.
    pub fn get_extent_into(
        &self,
        key: &RecordKey<'_>,
        offset: u64,
        len: u32,
        out: &mut Vec<u8>,
        counters: &Counters,
    ) -> Result<Lookup> {
        self.lookup_into(key, Some((offset, len)), false, out, counters)
    }

    /// [`get_extent_into`](Self::get_extent_into) straight into `dst`
    /// (`dst.len()` bytes at `offset`): on `Found` they are in `dst`, copied
    /// once out of the checked record, which is read into `scratch` (kept
    /// by the caller from one call to the next, so that it is not allocated
    /// again). `dst` is untouched on any other outcome.
    pub fn get_extent_into_slice(
        &self,
        key: &RecordKey<'_>,
        offset: u64,
        dst: &mut [u8],
        scratch: &mut Vec<u8>,
        counters: &Counters,
    ) -> Result<Lookup> {
        let len = u32::try_from(dst.len()).map_err(|_| {
            crate::client::error::Error::InvalidArgument(format!(
                "extent read of {} bytes",
                dst.len()
            ))
        })?;
        let found = self.lookup_into(key, Some((offset, len)), true, scratch, counters)?;
        if let Lookup::Found { .. } = found {
            // Checked by the lookup: an extent record of the key covering
            // the range.
            let first = ferrite_proto::record::get_u64(scratch, OFF_EXTENT_OFFSET);
            let from = peek::head_len(key) + (offset - first) as usize;
            dst.copy_from_slice(&scratch[from..from + dst.len()]);
        }
        Ok(found)
    }

    /// A lookup; `keep_record`: on `Found`, leave the whole record in `out`
    /// (the value is then where the record says) instead of just the value.
    fn lookup_into(
        &self,
        key: &RecordKey<'_>,
        range: Option<(u64, u32)>,
        keep_record: bool,
        out: &mut Vec<u8>,
        counters: &Counters,
    ) -> Result<Lookup> {
        let (regions, main_index, fingerprint) = self.locate(key);
        let mut attempts = Attempts::new(self.policy);
        let (mut use_cache, mut failed_fresh) = (range.is_none(), None);
        while attempts.next(counters) {
            let probe = Probe {
                regions,
                main_index,
                fingerprint,
                use_cache,
                failed_fresh,
                range,
                keep_record,
                key_bytes: key.dkey.len() + key.akey.len(),
            };
            match self.pass(key, &probe, out, counters)? {
                Pass::Done(found) => return Ok(settle(found, counters)),
                Pass::Retry(failed) => (use_cache, failed_fresh) = (false, failed),
            }
        }
        Ok(settle(
            Lookup::Fallback(FallbackReason::RetriesExhausted),
            counters,
        ))
    }

    /// A bucket of a target's chain: from the cache when allowed (checked),
    /// else read fresh together with the record its first slot with
    /// `fingerprint` points to (into `out`; [`Endpoint::read_dependent`]:
    /// the record read is chosen from the bucket's bytes unchecked, and an
    /// endpoint whose second read is a round trip checks and caches the
    /// bucket while it is in flight). Nothing the fresh bucket says is
    /// trusted before [`Fetched::valid`] says so, except what the record it
    /// led to proves by itself (see [`proven_by_record`]).
    fn bucket(
        &self,
        regions: &TargetRegions,
        index: u64,
        probe: &Probe<'_>,
        out: &mut Vec<u8>,
        counters: &Counters,
    ) -> Result<Fetched> {
        let target = regions.buckets.target;
        if probe.use_cache {
            if let Some(bucket) = self.cache.get(target, index) {
                counters.add(Counter::CacheHit, 1);
                return Ok(Fetched {
                    bucket,
                    cached: true,
                    valid: Some(true),
                    first_read: false,
                });
            }
        }
        let mut bucket = Bucket([0; BUCKET_BYTES]);
        let mut valid = None;
        let first = BatchRead {
            region: &regions.buckets,
            offset: index * BUCKET_BYTES as u64,
            buf: &mut bucket.0,
        };
        let fingerprint = probe.fingerprint;
        let first_read = self.endpoint.read_dependent(DependentReads {
            first,
            second: &regions.log,
            pick: &mut |bytes| first_span(regions, bytes, fingerprint, probe.key_bytes),
            out,
            meanwhile: &mut |bytes| {
                valid = Some(
                    (bytes.try_into().ok().map(Bucket))
                        .and_then(|b| checked_bucket(&self.cache, target, index, b))
                        .is_some(),
                );
            },
        })?;
        Ok(Fetched {
            bucket,
            cached: false,
            valid,
            first_read,
        })
    }

    /// One walk of the bucket chain. A record that fails its check twice
    /// behind two fresh reads of an unchanged slot is no longer in the ring
    /// (published records are immutable until the ring overwrites them).
    fn pass(
        &self,
        key: &RecordKey<'_>,
        probe: &Probe<'_>,
        out: &mut Vec<u8>,
        counters: &Counters,
    ) -> Result<Pass> {
        let Probe {
            regions,
            main_index,
            fingerprint,
            failed_fresh,
            range,
            keep_record,
            ..
        } = *probe;
        let bucket_count = regions.buckets.length / BUCKET_BYTES as u64;
        let mut index = main_index;
        let mut any_cached = false;
        for _ in 0..CHAIN_MAX {
            let mut f = self.bucket(regions, index, probe, out, counters)?;
            any_cached |= f.cached;
            let target = regions.buckets.target;
            let bucket = f.bucket;
            for (i, slot) in bucket.matching(fingerprint).enumerate() {
                let log = &regions.log;
                // A fresh bucket's first match was read with it (or has no
                // span in the ring: stale, as check_read says).
                let found = match (i, f.cached, f.first_read) {
                    (0, false, true) => self.check_read(key, log, slot, range, keep_record, out)?,
                    (0, false, false) => SlotCheck::Stale,
                    _ => {
                        out.clear();
                        self.check_read(key, log, slot, range, keep_record, out)?
                    }
                };
                if !proven_by_record(&found, range) && !f.valid(&self.cache, target, index) {
                    return Ok(Pass::Retry(None));
                }
                let found = match (found, f.cached, regions.device) {
                    (SlotCheck::Evicted | SlotCheck::Stale, false, Some(device)) => {
                        out.clear();
                        let check = self.check_read(key, &device, slot, range, keep_record, out)?;
                        if let SlotCheck::Value(_) | SlotCheck::Deleted = check {
                            counters.add(Counter::DeviceHit, 1);
                        }
                        check
                    }
                    (found, ..) => found,
                };
                let invalidate = || self.cache.invalidate(target, index);
                if let Some(pass) = slot_step(found, slot.addr, f.cached, failed_fresh, invalidate)
                {
                    return Ok(pass);
                }
            }
            if !f.valid(&self.cache, regions.buckets.target, index) {
                return Ok(Pass::Retry(None));
            }
            match next_link(&f.bucket, bucket_count, any_cached, &self.policy) {
                Ok(next) => index = next,
                Err(end) => return Ok(end),
            }
        }
        Ok(not_found(any_cached, &self.policy))
    }

    /// Checks the record of `slot` in `log` (the ring, or the device log;
    /// not at all when the slot cannot point into it) from the bytes of it
    /// already in `out`: none (read first what [`peek::first_read_len`]
    /// says), its head, or all of it. A head that may lead to the value is
    /// followed by a read of the whole record. `keep_record`: see
    /// [`Self::lookup_into`].
    fn check_read(
        &self,
        key: &RecordKey<'_>,
        log: &RegionDescriptor,
        slot: ferrite_proto::bucket::Slot,
        range: Option<(u64, u32)>,
        keep_record: bool,
        out: &mut Vec<u8>,
    ) -> Result<SlotCheck> {
        let Some((offset, len)) = span_in(log, slot) else {
            return Ok(SlotCheck::Stale);
        };
        if out.is_empty() {
            let want = peek::first_read_len(key, len);
            out.resize(want, 0);
            (self.endpoint).read(log, offset, want, out)?;
        }
        if out.len() < len {
            if let Some(verdict) = peek::peek(key, slot, range, out) {
                return Ok(verdict);
            }
            out.resize(len, 0);
            (self.endpoint).read(log, offset, len, out)?;
        }
        let (check, value) = verify_record(key, slot, range, out);
        if let (Some((from, n)), false) = (value, keep_record) {
            out.copy_within(from..from + n, 0);
            out.truncate(n);
        }
        Ok(check)
    }
}

/// A bucket of a chain as [`OneSidedReader::bucket`] got it.
struct Fetched {
    bucket: Bucket,
    /// From the cache (checked when it was cached).
    cached: bool,
    /// Whether its CRC checks (always, when cached); `None` until checked.
    valid: Option<bool>,
    /// Read fresh, with the record of its first slot with the fingerprint.
    first_read: bool,
}

impl Fetched {
    /// Whether the bucket's CRC checks: checked on the first call (and the
    /// bucket then cached when it does).
    fn valid(&mut self, cache: &BucketCache, target: u16, index: u64) -> bool {
        let bucket = self.bucket;
        *(self.valid).get_or_insert_with(|| checked_bucket(cache, target, index, bucket).is_some())
    }
}

/// Whether `check` of a single value's record stands whatever the bucket
/// that led to it: the record is the key's, whole (its CRC), and was not
/// superseded when read, so it was the key's published value then; a torn
/// bucket can only have led to it the way a stale cached one does. A value
/// of an array (`range`) needs a slot of a bucket that checks: a newer
/// extent does not mark the older ones it covers superseded.
fn proven_by_record(check: &SlotCheck, range: Option<(u64, u32)>) -> bool {
    range.is_none() && matches!(check, SlotCheck::Value(_) | SlotCheck::Deleted)
}

/// Where the record of the first slot with `fingerprint` of the bucket
/// `bytes` lies in the log (offset, length), if it can lie in the ring.
/// The bytes are unchecked: this only chooses what to read.
/// A big record's head only (see [`peek`]): `key_bytes` is the key's dkey
/// and akey length.
fn first_span(
    regions: &TargetRegions,
    bytes: &[u8],
    fingerprint: u32,
    key_bytes: usize,
) -> Option<(u64, usize)> {
    let bucket = Bucket(bytes.try_into().ok()?);
    let slot = bucket.matching(fingerprint).next()?;
    let (offset, len) = record_span(regions, slot)?;
    Some((offset, peek::read_len(key_bytes, len)))
}

/// What a checked slot means for a walk of the chain: `None` to go on
/// (another key's record), else how the walk ends. `invalidate` drops the
/// cached bucket that led to a stale record.
fn slot_step(
    check: SlotCheck,
    slot_addr: u64,
    cached: bool,
    failed_fresh: Option<u64>,
    invalidate: impl FnOnce(),
) -> Option<Pass> {
    Some(match check {
        SlotCheck::OtherKey => return None,
        SlotCheck::Value(version) => Pass::Done(Lookup::Found { version }),
        SlotCheck::Deleted => Pass::Done(Lookup::Absent),
        SlotCheck::Evicted | SlotCheck::Stale if !cached && failed_fresh == Some(slot_addr) => {
            Pass::Done(Lookup::Fallback(FallbackReason::NotInMemory))
        }
        SlotCheck::NotPlain => Pass::Done(Lookup::Fallback(FallbackReason::NotPlainValue)),
        SlotCheck::Evicted | SlotCheck::Stale if cached => {
            invalidate();
            Pass::Retry(None)
        }
        SlotCheck::Evicted | SlotCheck::Stale => Pass::Retry(Some(slot_addr)),
    })
}

/// The bucket after `bucket` in its chain, or how the walk ends: at the
/// chain's end as [`not_found`] says, on a bad link with a retry.
fn next_link(
    bucket: &Bucket,
    bucket_count: u64,
    any_cached: bool,
    policy: &RetryPolicy,
) -> std::result::Result<u64, Pass> {
    match u64::from(bucket.next()) {
        0 => Err(not_found(any_cached, policy)),
        next if next >= bucket_count => Err(Pass::Retry(None)),
        next => Ok(next),
    }
}

/// How a walk ends when the chain did not have the key: a cached bucket
/// may be stale (read again), a fresh chain says the key is absent.
fn not_found(any_cached: bool, policy: &RetryPolicy) -> Pass {
    if any_cached {
        return Pass::Retry(None);
    }
    Pass::Done(if policy.absent_is_final {
        Lookup::Absent
    } else {
        Lookup::Fallback(FallbackReason::NotIndexed)
    })
}

/// A bucket just read, if its CRC checks (then also cached).
fn checked_bucket(cache: &BucketCache, target: u16, index: u64, b: Bucket) -> Option<Bucket> {
    b.check().ok()?;
    cache.put(target, index, &b);
    Some(b)
}

/// Counts a lookup's outcome.
fn settle(lookup: Lookup, counters: &Counters) -> Lookup {
    match lookup {
        Lookup::Fallback(_) => counters.add(Counter::Fallback, 1),
        _ => counters.add(Counter::OneSidedHit, 1),
    }
    lookup
}

/// The retry budget of one lookup: attempts, and time from the first retry.
struct Attempts {
    policy: RetryPolicy,
    done: u32,
    deadline: Option<Instant>,
}

impl Attempts {
    fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            done: 0,
            deadline: None,
        }
    }

    /// Whether another pass may run (counting it as a retry after the first).
    fn next(&mut self, counters: &Counters) -> bool {
        let attempt = self.done;
        if attempt >= self.policy.max_attempts {
            return false;
        }
        self.done += 1;
        if attempt == 0 {
            return true;
        }
        counters.add(Counter::Retry, 1);
        let now = Instant::now();
        match self.deadline {
            None => self.deadline = Some(now + self.policy.budget),
            Some(d) if now >= d => return false,
            Some(_) => {}
        }
        true
    }
}

/// Offset in the log region and length of the record `slot` points to, or
/// `None` when the slot cannot point to a record in the ring.
fn record_span(regions: &TargetRegions, slot: ferrite_proto::bucket::Slot) -> Option<(u64, usize)> {
    span_in(&regions.log, slot)
}

/// Offset in `log` (a ring, `param` bytes of which hold records, or a
/// device log) and length of the record `slot` points to, or `None` when the
/// slot cannot point to a record there.
fn span_in(log: &RegionDescriptor, slot: ferrite_proto::bucket::Slot) -> Option<(u64, usize)> {
    let ring = log.param;
    let len = slot.length as usize;
    let offset = slot.addr % ring;
    if !(HEADER_BYTES..=RECORD_MAX_BYTES).contains(&len) || offset + len as u64 > ring {
        return None;
    }
    Some((offset, len))
}

/// Checks the record bytes read for `slot` (in `out`); on `Value` leaves
/// just the value in `out` — or, with a `range` (offset, length) of a byte
/// array, just those bytes of an extent record that covers them.
fn check_record(
    key: &RecordKey<'_>,
    slot: ferrite_proto::bucket::Slot,
    range: Option<(u64, u32)>,
    out: &mut Vec<u8>,
) -> SlotCheck {
    let (check, value) = verify_record(key, slot, range, out);
    if let Some((from, n)) = value {
        out.copy_within(from..from + n, 0);
        out.truncate(n);
    }
    check
}

/// Checks the record bytes read for `slot` (in `record`); on `Value` also
/// says where the bytes wanted are in it (offset, length): the value, or
/// with a `range` (offset, length) of a byte array, those bytes of an
/// extent record that covers them.
fn verify_record(
    key: &RecordKey<'_>,
    slot: ferrite_proto::bucket::Slot,
    range: Option<(u64, u32)>,
    record: &[u8],
) -> (SlotCheck, Option<(usize, usize)>) {
    let check = |c| (c, None);
    let view = match RecordView::parse(record) {
        Ok(v) => v,
        Err(_) => return check(SlotCheck::Stale),
    };
    match view.verify_for(key, slot.addr) {
        Ok(()) => {}
        Err(FormatError::Mismatch("log address")) if view.addr() > slot.addr => {
            return check(SlotCheck::Evicted)
        }
        Err(FormatError::Mismatch("container or object"))
        | Err(FormatError::Mismatch("dkey or akey")) => return check(SlotCheck::OtherKey),
        Err(_) => return check(SlotCheck::Stale),
    }
    if view.is_superseded() || view.version() as u16 != slot.version_low {
        return check(SlotCheck::Stale);
    }
    let flags = view.flags();
    if flags.has(RecordFlags::TOMBSTONE) {
        return check(SlotCheck::Deleted);
    }
    let extent = flags.has(RecordFlags::EXTENT);
    if flags.0 & (RecordFlags::PUNCH_DKEY | RecordFlags::PUNCH_OBJECT) != 0
        || extent != range.is_some()
    {
        return check(SlotCheck::NotPlain);
    }
    let version = view.version();
    let start = HEADER_BYTES + key.dkey.len() + key.akey.len();
    let value_len = view.value().len();
    let (from, n) = match range {
        None => (0, value_len),
        Some((offset, len)) => {
            let first = view.extent_offset();
            let end = first + value_len as u64;
            if offset < first || offset + u64::from(len) > end {
                return check(SlotCheck::NotPlain);
            }
            ((offset - first) as usize, len as usize)
        }
    };
    (SlotCheck::Value(version), Some((start + from, n)))
}

/// Where one walk starts and what the previous walk learned.
#[derive(Clone, Copy)]
struct Probe<'a> {
    regions: &'a TargetRegions,
    main_index: u64,
    fingerprint: u32,
    use_cache: bool,
    failed_fresh: Option<u64>,
    /// The byte range wanted of an array (`None`: a single value).
    range: Option<(u64, u32)>,
    /// Leave a found record whole in the output ([`OneSidedReader::lookup_into`]).
    keep_record: bool,
    /// Length of the key's dkey and akey.
    key_bytes: usize,
}

enum SlotCheck {
    Value(u64),
    Deleted,
    /// A valid record of another key with the same fingerprint.
    OtherKey,
    /// The ring has moved past the record.
    Evicted,
    NotPlain,
    /// Torn, overwritten, superseded or otherwise not trustworthy now.
    Stale,
}
