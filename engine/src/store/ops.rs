//! The store's public operations: update, fetch, punch, list, conditional
//! update.

use super::apply::Head;
use super::buckets::prefetch;
use super::cold::Stream;
use super::dir::pieces_in;
use super::log::AppendSpec;
use super::{Condition, Conditional, Store, StoreError};
use crate::store::error::Result;
use ferrite_proto::bucket::SLOTS_PER_BUCKET;
use ferrite_proto::key::{KeyHash, RecordKey};
use ferrite_proto::record::{record_len, RecordFlags, RecordView, VALUE_MAX_BYTES};

/// Largest `fetch_extent` length, in bytes.
pub const EXTENT_READ_MAX_BYTES: u64 = 64 << 20;
/// Rounds a conditional update waits for a key's pending updates.
const CONDITIONAL_ROUNDS: u32 = 10_000;
/// Cache lines of each record `fetch_batch` prefetches.
const PREFETCH_LINES: u64 = 4;
/// Re-reads of a record the cleaner moved while it was being read.
pub(super) const MOVED_RETRIES: u32 = 8;

/// Where [`Store::fetch_extent_to`] puts the bytes it reads; positions are
/// relative to the read's offset.
pub trait ExtentSink {
    /// Copies `bytes` to `at`.
    fn put(&mut self, at: usize, bytes: &[u8]);
    /// Zeroes `len` bytes at `at` (a hole of the array).
    fn zero(&mut self, at: usize, len: usize);
}

impl ExtentSink for Vec<u8> {
    fn put(&mut self, at: usize, bytes: &[u8]) {
        self[at..at + bytes.len()].copy_from_slice(bytes);
    }
    fn zero(&mut self, at: usize, len: usize) {
        self[at..at + len].fill(0);
    }
}

/// What a key holds in the published state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    Absent,
    Single,
    Array,
}

impl Held {
    fn name(self) -> &'static str {
        match self {
            Held::Absent => "nothing",
            Held::Single => "single value",
            Held::Array => "byte array",
        }
    }
}

/// What [`Store::resident_record`] found.
enum Resident {
    /// The key's record, at this address (`array`: an extent of a byte
    /// array, the newest).
    Found { addr: u64, array: bool },
    /// No slot of the chain matches the key's fingerprint: absent.
    Absent,
    /// A slot with its fingerprint points at a record no longer in the
    /// ring: only the directory knows.
    Unsure,
}

/// Where `fetch` found a key.
enum Found {
    Absent,
    Value(u64, Vec<u8>),
    OnDevice(u64, u32),
}

impl<'a> AppendSpec<'a> {
    /// A foreground record: new version, not a cleaner copy.
    pub(super) fn new(
        key: &'a RecordKey<'a>,
        value: &'a [u8],
        flags: RecordFlags,
        extent_offset: u64,
    ) -> Self {
        Self {
            key,
            value,
            flags,
            extent_offset,
            version: None,
            origin: None,
            held: None,
            cold: None,
        }
    }
}

impl Store {
    pub(super) fn validate(key: &RecordKey<'_>, value_len: usize) -> Result<()> {
        key.validate()
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        if value_len > VALUE_MAX_BYTES {
            return Err(StoreError::Invalid(format!(
                "value of {value_len} bytes exceeds {VALUE_MAX_BYTES}"
            )));
        }
        Ok(())
    }

    /// What the key holds in the published state. Answered from its bucket
    /// chain and the ring when the key's record is resident, from the
    /// directory otherwise: the buckets and the directory are published
    /// together, so both give the same answer.
    pub(crate) fn held(&self, key: &RecordKey<'_>) -> Held {
        self.published_state(key).0
    }

    /// [`held`](Self::held), with the address of the key's record when it
    /// holds a single value.
    pub(crate) fn published_state(&self, key: &RecordKey<'_>) -> (Held, Option<u64>) {
        let entry = || (self.dir.borrow()).get((key.container, key.object), key.dkey, key.akey);
        match self.resident_record(key) {
            Resident::Found { array: true, .. } => (Held::Array, None),
            Resident::Found { addr, .. } => (Held::Single, Some(addr)),
            Resident::Absent => (Held::Absent, None),
            Resident::Unsure => match entry() {
                None => (Held::Absent, None),
                Some(e) if e.extents.is_some() => (Held::Array, None),
                Some(e) => (Held::Single, Some(e.addr)),
            },
        }
    }

    /// The key's published record, looked for in its bucket chain among
    /// the records still in the ring.
    fn resident_record(&self, key: &RecordKey<'_>) -> Resident {
        let hash = key.hash();
        let mut unsure = false;
        let hit = self
            .table
            .borrow()
            .find(hash.0, hash.fingerprint(), |_, slot| {
                if !self.resident(slot.addr) {
                    unsure = true;
                    return None;
                }
                let h = Head::peek(self.ring_slice(slot.addr, slot.length as usize))?;
                (h.key == *key).then_some(Resident::Found {
                    addr: slot.addr,
                    array: h.flags.has(RecordFlags::EXTENT),
                })
            });
        match hit {
            Some(found) => found,
            None if unsure => Resident::Unsure,
            None => Resident::Absent,
        }
    }

    /// Errs if the key holds the other kind of value, or if it is a new key
    /// and the overflow pool could run out before its slot is published
    /// (existing keys reuse their slot). Returns what the key holds.
    fn check_write(&self, key: &RecordKey<'_>, array: bool) -> Result<Held> {
        self.check_held(key, self.held(key), array)
    }

    /// [`check_write`](Self::check_write) of a key that holds `held`.
    fn check_held(&self, key: &RecordKey<'_>, held: Held, array: bool) -> Result<Held> {
        match held {
            Held::Absent => {
                if !self.room_for_new_key(key.hash().0) {
                    return Err(StoreError::IndexFull {
                        keys: self.dir.borrow().len(),
                    });
                }
                Ok(Held::Absent)
            }
            held if (held == Held::Array) != array => Err(StoreError::WrongKind {
                holds: held.name(),
                wanted: if array { "byte array" } else { "single value" },
            }),
            held => Ok(held),
        }
    }

    /// Will the bucket table hold a new key of `hash` besides the new keys
    /// appended and not yet published (their slots are inserted as they
    /// are published), with one overflow bucket to spare? Cheap while the
    /// free overflow buckets outnumber those keys (each takes at most one);
    /// else counted exactly: per chain, the keys beyond its free slots take
    /// a bucket per three. (A small table, 256 keys of 1 MiB, was refused
    /// new keys with a quarter of its slots free.)
    fn room_for_new_key(&self, hash: u64) -> bool {
        let log = self.log.borrow();
        let table = self.table.borrow();
        let free = table.free_overflow();
        if log.pending_new_keys + 1 < free {
            return true;
        }
        let pending = (log.pending.iter().filter(|p| p.new_key)).map(|p| p.hash);
        table.overflow_needed(pending.chain(std::iter::once(hash))) < free
    }

    /// Appends one record and returns its version once it is durable and
    /// published.
    async fn write(&self, spec: AppendSpec<'_>, array: Option<bool>) -> Result<u64> {
        let (seq, version) = self.append(spec, array).await?;
        self.wait_durable(seq).await?;
        Ok(version)
    }

    /// Appends one record (not yet durable), to the hot head or the cold
    /// segment ([`Store::stream_for`]), checking first that the key holds
    /// no value of the other kind when `array` says which this is. Returns
    /// its append sequence number and its version.
    pub(super) async fn append(
        &self,
        mut spec: AppendSpec<'_>,
        array: Option<bool>,
    ) -> Result<(u64, u64)> {
        let len = record_len(spec.key, spec.value.len()) as u64;
        let frees = spec.flags.has(RecordFlags::TOMBSTONE)
            || spec.flags.has(RecordFlags::PUNCH_DKEY)
            || spec.flags.has(RecordFlags::PUNCH_OBJECT);
        if !frees {
            self.admit_write(spec.key, len, spec.flags.has(RecordFlags::EXTENT))?;
        }
        let mut stream = self.stream_for(&spec);
        // Room for the cold segment, and the key's newest record may have
        // changed while it was reserved: then room at the hot head, which
        // lies above every record.
        loop {
            self.reserve_space(len, stream.floor(), false).await?;
            if stream == Stream::Hot || self.stream_for(&spec) == stream {
                break;
            }
            stream = Stream::Hot;
        }
        spec.cold = stream.floor();
        if let Some(array) = array {
            spec.held = Some(self.check_write(spec.key, array)?);
        }
        let a = self.append_now(&spec)?;
        Ok((a.seq, a.version))
    }

    /// Replaces the key's single value; returns the new version.
    pub async fn update(&self, key: &RecordKey<'_>, value: &[u8]) -> Result<u64> {
        Self::validate(key, value.len())?;
        let spec = AppendSpec::new(key, value, RecordFlags::empty(), 0);
        self.write(spec, Some(false)).await
    }

    /// Writes `bytes` at `offset` of the key's byte array; returns the new
    /// version.
    pub async fn update_extent(
        &self,
        key: &RecordKey<'_>,
        offset: u64,
        bytes: &[u8],
    ) -> Result<u64> {
        let spec = Self::extent_spec(key, offset, bytes)?;
        self.write(spec, Some(true)).await
    }

    /// The record of a write of `bytes` at `offset` of the key's byte
    /// array, checked: not empty, not past the end of the address space.
    pub(super) fn extent_spec<'a>(
        key: &'a RecordKey<'a>,
        offset: u64,
        bytes: &'a [u8],
    ) -> Result<AppendSpec<'a>> {
        Self::validate(key, bytes.len())?;
        if bytes.is_empty() || offset.checked_add(bytes.len() as u64).is_none() {
            return Err(StoreError::Invalid(format!(
                "extent of {} bytes at {offset} is empty or overflows",
                bytes.len()
            )));
        }
        let flags = RecordFlags::empty().with(RecordFlags::EXTENT);
        Ok(AppendSpec::new(key, bytes, flags, offset))
    }

    /// Writes the single value only if `cond` holds against the key's latest
    /// state (pending updates of the key are waited for first).
    pub async fn update_if(
        &self,
        key: &RecordKey<'_>,
        value: &[u8],
        cond: Condition,
    ) -> Result<Conditional> {
        Self::validate(key, value.len())?;
        let len = record_len(key, value.len()) as u64;
        for _ in 0..CONDITIONAL_ROUNDS {
            self.admit_write(key, len, false)?;
            self.reserve_space(len, None, false).await?;
            match self.append_if(key, value, cond)? {
                None => self.wait_all_durable().await?,
                Some((seq, applied @ Conditional::Applied(_))) => {
                    self.wait_durable(seq).await?;
                    return Ok(applied);
                }
                Some((_, conflict)) => return Ok(conflict),
            }
        }
        Err(StoreError::Invalid(
            "conditional update: the key never stopped changing".into(),
        ))
    }

    /// The synchronous step of [`update_if`](Self::update_if), after its
    /// room is reserved: `None` if an update or punch of the key waits to
    /// be published (its outcome decides the condition); else the outcome
    /// against the published state, with the appended record's sequence
    /// number when applied (not yet durable).
    pub(super) fn append_if(
        &self,
        key: &RecordKey<'_>,
        value: &[u8],
        cond: Condition,
    ) -> Result<Option<(u64, Conditional)>> {
        if self.has_pending(key.hash().0) {
            return Ok(None);
        }
        // A key no bucket slot holds has no directory entry either: a
        // new name (an mdtest create) costs no directory search here.
        let held = self.held(key);
        let current = match held {
            Held::Absent => None,
            _ => (self.dir.borrow())
                .get((key.container, key.object), key.dkey, key.akey)
                .map(|e| e.version),
        };
        let holds = match cond {
            Condition::Absent => current.is_none(),
            Condition::Version(v) => current == Some(v),
        };
        if !holds {
            return Ok(Some((0, Conditional::Conflict(current))));
        }
        let mut spec = AppendSpec::new(key, value, RecordFlags::empty(), 0);
        spec.held = Some(self.check_held(key, held, false)?);
        let a = self.append_now(&spec)?;
        Ok(Some((a.seq, Conditional::Applied(a.version))))
    }

    pub(super) async fn punch_with(&self, key: &RecordKey<'_>, flags: RecordFlags) -> Result<u64> {
        Self::validate(key, 0)?;
        let spec = AppendSpec::new(key, &[], flags.with(RecordFlags::TOMBSTONE), 0);
        self.write(spec, None).await
    }

    /// Deletes one akey (either kind of value). Returns the punch's version.
    pub async fn punch(&self, key: &RecordKey<'_>) -> Result<u64> {
        self.punch_with(key, RecordFlags::empty()).await
    }

    /// Deletes every akey of a dkey.
    pub async fn punch_dkey(&self, container: u64, object: u128, dkey: &[u8]) -> Result<u64> {
        let key = RecordKey::new(container, object, dkey, b"");
        self.punch_with(&key, RecordFlags::empty().with(RecordFlags::PUNCH_DKEY))
            .await
    }

    /// Deletes every key of an object.
    pub async fn punch_object(&self, container: u64, object: u128) -> Result<u64> {
        let key = RecordKey::new(container, object, b"", b"");
        self.punch_with(&key, RecordFlags::empty().with(RecordFlags::PUNCH_OBJECT))
            .await
    }

    /// Dkeys of an object strictly after `after`, sorted, at most `limit`.
    pub fn list_dkeys(
        &self,
        container: u64,
        object: u128,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Vec<Vec<u8>> {
        self.dir
            .borrow()
            .list_dkeys((container, object), after, limit)
    }

    /// Dkeys of an object that hold `akey`, strictly after `after`, sorted,
    /// at most `limit`, each with that akey's single value while its record
    /// is in the memory ring and `value_bytes` (the values' total) allows;
    /// `None` otherwise (an array, a record on the device only, or past the
    /// budget: the caller fetches it). One synchronous step: the values are
    /// the published ones at that moment.
    pub fn list_values(
        &self,
        container: u64,
        object: u128,
        akey: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        value_bytes: usize,
    ) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let listed = self
            .dir
            .borrow()
            .list_dkeys_holding((container, object), akey, after, limit);
        let mut left = value_bytes;
        listed
            .into_iter()
            .map(|(dkey, e)| {
                let value = (e.extents.is_none() && self.resident(e.addr))
                    .then(|| Head::peek(self.ring_slice(e.addr, e.len as usize)))
                    .flatten()
                    .filter(|h| {
                        let k = &h.key;
                        (k.container, k.object, k.dkey, k.akey)
                            == (container, object, &dkey[..], akey)
                            && h.value.len() <= left
                    })
                    .map(|h| h.value.to_vec());
                left -= value.as_ref().map_or(0, Vec::len);
                (dkey, value)
            })
            .collect()
    }

    /// Akeys of a dkey strictly after `after`, sorted, at most `limit`.
    pub fn list_akeys(
        &self,
        container: u64,
        object: u128,
        dkey: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Vec<Vec<u8>> {
        self.dir
            .borrow()
            .list_akeys((container, object), dkey, after, limit)
    }

    /// The key's current version, if present (no I/O).
    pub fn version_of(&self, key: &RecordKey<'_>) -> Option<u64> {
        self.dir
            .borrow()
            .get((key.container, key.object), key.dkey, key.akey)
            .map(|e| e.version)
    }

    /// Looks the key up through the buckets, as a one-sided reader would,
    /// resolving resident records from the ring without I/O.
    fn lookup(&self, key: &RecordKey<'_>, hash: KeyHash) -> Result<Found> {
        let fp = hash.fingerprint();
        let hit = self.table.borrow().find(hash.0, fp, |_, slot| {
            if !self.resident(slot.addr) {
                return None;
            }
            // Start every line of the record loading at once rather than
            // one after the other as parsing reaches them.
            self.prefetch_record(slot.addr, slot.length);
            let h = Head::peek(self.ring_slice(slot.addr, slot.length as usize))?;
            (h.key == *key).then_some(h)
        });
        if let Some(h) = hit {
            if h.flags.has(RecordFlags::EXTENT) {
                return Err(StoreError::WrongKind {
                    holds: "byte array",
                    wanted: "single value",
                });
            }
            return Ok(Found::Value(h.version, h.value.to_vec()));
        }
        let dir = self.dir.borrow();
        match dir.get((key.container, key.object), key.dkey, key.akey) {
            None => Ok(Found::Absent),
            Some(e) if e.extents.is_some() => Err(StoreError::WrongKind {
                holds: "byte array",
                wanted: "single value",
            }),
            Some(e) => Ok(Found::OnDevice(e.addr, e.len)),
        }
    }

    /// Reads a record from the device and checks it is `key`'s record at
    /// `addr`. Returns the parsed record's bytes buffer.
    pub(crate) async fn read_record(
        &self,
        key: &RecordKey<'_>,
        addr: u64,
        len: u32,
    ) -> Result<(ferrite_bdev::IoBuf, usize)> {
        let (buf, off) = self.read_log(addr, len as usize).await?;
        let check = RecordView::parse(&buf.as_slice()[off..off + len as usize])
            .and_then(|v| v.verify_for(key, addr));
        match check {
            Ok(()) => Ok((buf, off)),
            Err(source) => Err(StoreError::Corrupt {
                device: self.device.clone(),
                addr,
                source,
            }),
        }
    }

    /// Did the key's record move away from `addr` (cleaner) or vanish?
    pub(super) fn moved(&self, key: &RecordKey<'_>, addr: u64) -> bool {
        self.dir
            .borrow()
            .get((key.container, key.object), key.dkey, key.akey)
            .is_none_or(|e| !e.references(addr))
    }

    /// The key's single value and version; `None` if absent.
    ///
    /// A resident fetch is two dependent memory loads (the key's bucket,
    /// then the record its slot names), each a cache miss once the store
    /// outgrows the cache. So the fetch starts its bucket loading and lets
    /// the xstream's other ready tasks run, then starts its record loading
    /// and yields again, and only then looks the key up: the fetches of
    /// concurrent tasks (requests of other connections, say) overlap their
    /// misses instead of taking them one after the other. The lookup runs
    /// after the yields, on the state published then; the loads before are
    /// hints.
    pub async fn fetch(&self, key: &RecordKey<'_>) -> Result<Option<(u64, Vec<u8>)>> {
        let hash = key.hash();
        let hashes = std::slice::from_ref(&hash);
        self.prefetch_homes(hashes);
        ferrite_xstream::yield_now().await;
        self.prefetch_records(hashes);
        ferrite_xstream::yield_now().await;
        self.fetch_hashed(key, hash).await
    }

    /// Fetches several keys, overlapping their memory loads: every key's
    /// main bucket is prefetched, then every resident record its bucket
    /// names, then each key is looked up as by [`Store::fetch`]; the keys
    /// whose records left the ring are then read from the device together
    /// (their reads overlap too). Results are in the order of `keys` and are
    /// what [`Store::fetch`] of each key would return.
    pub async fn fetch_batch(&self, keys: &[RecordKey<'_>]) -> Vec<Result<Option<(u64, Vec<u8>)>>> {
        let hashes: Vec<KeyHash> = keys.iter().map(RecordKey::hash).collect();
        {
            let mut c = self.counters.borrow_mut();
            c.fetch_batches += 1;
            c.fetch_batch_keys += keys.len() as u64;
        }
        self.prefetch_keys(&hashes);
        let mut out = Vec::with_capacity(keys.len());
        let mut on_device = Vec::new();
        for (i, (k, h)) in keys.iter().zip(&hashes).enumerate() {
            match Self::validate(k, 0).and_then(|()| self.lookup(k, *h)) {
                Err(e) => out.push(Err(e)),
                Ok(Found::Absent) => out.push(Ok(None)),
                Ok(Found::Value(v, bytes)) => out.push(Ok(Some((v, bytes)))),
                Ok(found @ Found::OnDevice(..)) => {
                    out.push(Ok(None));
                    on_device.push((i, found));
                }
            }
        }
        if !on_device.is_empty() {
            let at: Vec<usize> = on_device.iter().map(|(i, _)| *i).collect();
            let reads = on_device
                .into_iter()
                .map(|(i, found)| self.fetch_found(&keys[i], hashes[i], found));
            for (i, r) in at.into_iter().zip(futures::future::join_all(reads).await) {
                out[i] = r;
            }
        }
        out
    }

    /// Prefetches the main bucket of every hash, then the resident record
    /// each of those buckets names for its key's fingerprint.
    pub(super) fn prefetch_keys(&self, hashes: &[KeyHash]) {
        self.prefetch_homes(hashes);
        self.prefetch_records(hashes);
    }

    /// Prefetches the main bucket of every hash.
    fn prefetch_homes(&self, hashes: &[KeyHash]) {
        let table = self.table.borrow();
        for h in hashes {
            table.prefetch_home(h.0);
        }
    }

    /// Prefetches the resident record the main bucket of each hash names
    /// for its fingerprint (the first match: a hint).
    fn prefetch_records(&self, hashes: &[KeyHash]) {
        let table = self.table.borrow();
        for h in hashes {
            let b = table.load(table.home(h.0));
            let fp = h.fingerprint();
            let hit = (0..SLOTS_PER_BUCKET)
                .map(|s| b.slot(s))
                .find(|s| s.fingerprint == fp);
            if let Some(slot) = hit.filter(|s| self.resident(s.addr)) {
                self.prefetch_record(slot.addr, slot.length);
            }
        }
    }

    /// Prefetches the first cache lines of the ring record at `addr`.
    fn prefetch_record(&self, addr: u64, len: u32) {
        let p = self.ring_ptr(addr);
        let lines = (addr % 64 + u64::from(len)).div_ceil(64);
        for line in 0..lines.min(PREFETCH_LINES) {
            prefetch(p.wrapping_add(line as usize * 64));
        }
    }

    async fn fetch_hashed(
        &self,
        key: &RecordKey<'_>,
        hash: KeyHash,
    ) -> Result<Option<(u64, Vec<u8>)>> {
        Self::validate(key, 0)?;
        let found = self.lookup(key, hash)?;
        self.fetch_found(key, hash, found).await
    }

    /// Finishes a fetch from what [`Store::lookup`] found: a record that
    /// left the ring is read from the device, and the key is looked up
    /// again (a bounded number of times) when the record moved meanwhile.
    async fn fetch_found(
        &self,
        key: &RecordKey<'_>,
        hash: KeyHash,
        mut found: Found,
    ) -> Result<Option<(u64, Vec<u8>)>> {
        for _ in 0..MOVED_RETRIES {
            let (addr, len) = match found {
                Found::Absent => return Ok(None),
                Found::Value(v, bytes) => return Ok(Some((v, bytes))),
                Found::OnDevice(addr, len) => (addr, len),
            };
            match self.read_record(key, addr, len).await {
                Ok((buf, off)) => {
                    let b = &buf.as_slice()[off..off + len as usize];
                    let v = RecordView::parse(b).map_err(|source| StoreError::Corrupt {
                        device: self.device.clone(),
                        addr,
                        source,
                    })?;
                    return Ok(Some((v.version(), v.value().to_vec())));
                }
                Err(_) if self.moved(key, addr) => found = self.lookup(key, hash)?,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Invalid("fetch: record kept moving".into()))
    }

    /// Copies the value bytes of piece `[s, e)` held by the record at `addr`
    /// into `out` (which starts at array offset `base`).
    async fn copy_piece(
        &self,
        key: &RecordKey<'_>,
        addr: u64,
        len: u32,
        range: (u64, u64),
        base: u64,
        out: &mut dyn ExtentSink,
    ) -> Result<()> {
        let mut copy = |b: &[u8]| -> Option<()> {
            let h = Head::peek(b)?;
            let from = (range.0 - h.extent_offset) as usize;
            let to = (range.1 - h.extent_offset) as usize;
            let dst = (range.0 - base) as usize;
            out.put(dst, h.value.get(from..to)?);
            Some(())
        };
        if self.resident(addr) {
            let done = copy(self.ring_slice(addr, len as usize));
            return done
                .ok_or_else(|| StoreError::Invalid("extent piece outside its record".into()));
        }
        let (buf, off) = self.read_record(key, addr, len).await?;
        copy(&buf.as_slice()[off..off + len as usize])
            .ok_or_else(|| StoreError::Invalid("extent piece outside its record".into()))
    }

    /// `len` bytes of the key's byte array from `offset`: the newest bytes
    /// written there, holes as zero. `None` if the key is absent.
    pub async fn fetch_extent(
        &self,
        key: &RecordKey<'_>,
        offset: u64,
        len: u64,
    ) -> Result<Option<(u64, Vec<u8>)>> {
        Self::validate_extent_read(offset, len)?;
        let mut out = vec![0u8; len as usize];
        let version = self.fetch_extent_to(key, offset, len, &mut out).await?;
        Ok(version.map(|v| (v, out)))
    }

    fn validate_extent_read(offset: u64, len: u64) -> Result<u64> {
        offset
            .checked_add(len)
            .filter(|_| len <= EXTENT_READ_MAX_BYTES)
            .ok_or_else(|| StoreError::Invalid(format!("extent read of {len} at {offset}")))
    }

    /// [`fetch_extent`](Self::fetch_extent) into `out` (`len` bytes: every
    /// one is written, holes as zero; nothing when the key is absent), one
    /// copy out of the ring or the device buffer after the record's checks.
    /// Returns the array's version, `None` if the key is absent.
    pub async fn fetch_extent_to(
        &self,
        key: &RecordKey<'_>,
        offset: u64,
        len: u64,
        out: &mut dyn ExtentSink,
    ) -> Result<Option<u64>> {
        Self::validate(key, 0)?;
        let end = Self::validate_extent_read(offset, len)?;
        'retry: for _ in 0..MOVED_RETRIES {
            let array = self.with_array(key, |e, map| (e.version, pieces_in(map, offset, end)))?;
            let Some((version, pieces)) = array else {
                return Ok(None);
            };
            // Pieces come in order and do not overlap: zero the gaps.
            let mut done = offset;
            for (s, p) in pieces {
                let range = (s.max(offset), p.end.min(end));
                if range.0 > done {
                    out.zero((done - offset) as usize, (range.0 - done) as usize);
                }
                let r = self
                    .copy_piece(key, p.rec_addr, p.rec_len, range, offset, out)
                    .await;
                match r {
                    Ok(()) => done = done.max(range.1),
                    Err(_) if self.moved(key, p.rec_addr) => continue 'retry,
                    Err(e) => return Err(e),
                }
            }
            if end > done {
                out.zero((done - offset) as usize, (end - done) as usize);
            }
            return Ok(Some(version));
        }
        Err(StoreError::Invalid(
            "fetch_extent: records kept moving".into(),
        ))
    }
}
