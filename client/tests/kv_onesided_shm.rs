//! Guards the one-sided GET over shared memory against a live writer: the
//! reader must never return bytes that are not the key's value, must return a
//! value that was the latest acknowledged one at some moment during the GET,
//! follows overflow chains, skips fingerprint collisions, falls back when the
//! ring has moved past a record, and gives up (to RPC) on corrupt data.
//!
//! The writer here follows the publication protocol of `proto/FORMAT.md` on
//! two memfds: record complete in the ring → bucket stored → old record's
//! superseded bit set → acknowledged.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrite_client::client::counters::Counters;
use ferrite_client::client::onesided::{
    FallbackReason, Lookup, OneSidedReader, RetryPolicy, TargetRegions,
};
use ferrite_client::client::Result;
use ferrite_client::fabric::shm::{memfd, ShmEndpoint, ShmMapping};
use ferrite_client::fabric::{BatchRead, Endpoint};
use ferrite_proto::bucket::{
    Bucket, Slot, BUCKET_BYTES, OFF_CRC as BUCKET_OFF_CRC, SLOTS_PER_BUCKET,
};
use ferrite_proto::key::RecordKey;
use ferrite_proto::record::{
    encode_pad, encode_record, record_len, RecordFlags, HEADER_BYTES, OFF_CRC, STATE_SUPERSEDED,
};
use ferrite_proto::region::{Provider, RegionDescriptor, RegionKind};

/// A writable mapping of a memfd, written with atomic stores.
struct WMap {
    ptr: *mut u8,
    len: usize,
}
// SAFETY: only used through atomic stores by one writer thread at a time.
unsafe impl Send for WMap {}

impl WMap {
    fn new(fd: &OwnedFd, len: usize) -> Self {
        // SAFETY: mapping our own memfd read-write.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Self {
            ptr: p as *mut u8,
            len,
        }
    }
    fn store(&self, offset: usize, bytes: &[u8]) {
        assert!(offset % 8 == 0 && bytes.len() % 8 == 0 && offset + bytes.len() <= self.len);
        for (i, c) in bytes.chunks_exact(8).enumerate() {
            let w = u64::from_le_bytes(c.try_into().unwrap());
            // SAFETY: aligned and in bounds (asserted above).
            unsafe {
                (*(self.ptr.add(offset + i * 8) as *const AtomicU64)).store(w, Ordering::Release)
            };
        }
    }
    fn set_u32(&self, offset: usize, v: u32) {
        // SAFETY: 4-aligned, in bounds.
        unsafe { (*(self.ptr.add(offset) as *const AtomicU32)).store(v, Ordering::Release) };
    }
}

/// A single-target store on two memfds, written like the engine does.
struct Store {
    buckets: WMap,
    log: WMap,
    main: u64,
    total_buckets: u64,
    next_overflow: u64,
    ring: u64,
    tail: u64,
    /// key → (bucket index, slot, addr, version)
    index: HashMap<Vec<u8>, (u64, usize, u64, u64)>,
    image: Vec<Bucket>,
}

const CONTAINER: u64 = 5;
const OBJECT: u128 = 77;

fn key(dkey: &[u8]) -> RecordKey<'_> {
    RecordKey::new(CONTAINER, OBJECT, dkey, b"a")
}

/// The shm endpoint, counting the read lists it is given (`get_many_into`
/// reads buckets as one list, then records as another).
struct Batching {
    shm: ShmEndpoint,
    lists: Arc<AtomicU64>,
    longest: Arc<AtomicU64>,
}

impl Endpoint for Batching {
    fn read(&self, r: &RegionDescriptor, off: u64, len: usize, buf: &mut [u8]) -> Result<()> {
        self.shm.read(r, off, len, buf)
    }
    fn read_many(&self, reads: &mut [BatchRead<'_>]) -> Result<()> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        self.longest
            .fetch_max(reads.len() as u64, Ordering::Relaxed);
        self.shm.read_many(reads)
    }
    fn provider(&self) -> &'static str {
        "shm-batching"
    }
}

impl Store {
    fn new(main: u64, overflow: u64, ring: u64) -> (Self, OneSidedReader) {
        let (store, ep, descs) = Self::with_endpoint(main, overflow, ring);
        (store, reader(Box::new(ep), descs))
    }

    fn with_endpoint(main: u64, overflow: u64, ring: u64) -> (Self, ShmEndpoint, TargetRegions) {
        let total = main + overflow;
        let bfd = memfd("buckets", total * 64).unwrap();
        let lfd = memfd("log", ring).unwrap();
        let descs = TargetRegions {
            buckets: desc(RegionKind::Buckets, 1, total * 64, main),
            log: desc(RegionKind::Log, 2, ring, ring),
            device: None,
        };
        let mut ep = ShmEndpoint::new();
        ep.insert(&descs.buckets, ShmMapping::map(&bfd, total * 64).unwrap())
            .unwrap();
        ep.insert(&descs.log, ShmMapping::map(&lfd, ring).unwrap())
            .unwrap();
        let store = Self {
            buckets: WMap::new(&bfd, (total * 64) as usize),
            log: WMap::new(&lfd, ring as usize),
            main,
            total_buckets: total,
            next_overflow: main,
            ring,
            tail: 8,
            index: HashMap::new(),
            image: vec![Bucket::default(); total as usize],
        };
        for i in 0..total {
            store.publish_bucket(&store.image[i as usize], i);
        }
        (store, ep, descs)
    }

    fn publish_bucket(&self, b: &Bucket, i: u64) {
        self.buckets.store(i as usize * BUCKET_BYTES, &b.0);
    }

    fn append(
        &mut self,
        k: &RecordKey<'_>,
        value: &[u8],
        version: u64,
        flags: RecordFlags,
    ) -> (u64, u32) {
        let len = record_len(k, value.len()) as u64;
        if self.tail % self.ring + len > self.ring {
            let pad = self.ring - self.tail % self.ring;
            let mut buf = vec![0u8; pad as usize];
            if pad as usize >= HEADER_BYTES {
                encode_pad(&mut buf, self.tail).unwrap();
            }
            self.log.store((self.tail % self.ring) as usize, &buf);
            self.tail += pad;
        }
        let addr = self.tail;
        let mut buf = vec![0u8; len as usize];
        encode_record(&mut buf, k, value, version, addr, flags, 0).unwrap();
        self.log.store((addr % self.ring) as usize, &buf);
        self.tail += len;
        (addr, len as u32)
    }

    /// Finds a free slot along the chain of `main_index`, linking an overflow
    /// bucket when all are full.
    fn free_slot(&mut self, main_index: u64) -> (u64, usize) {
        let mut i = main_index;
        loop {
            let b = &self.image[i as usize];
            if let Some(s) = (0..SLOTS_PER_BUCKET).find(|&s| b.slot(s).is_empty()) {
                return (i, s);
            }
            match u64::from(b.next()) {
                0 => {
                    assert!(
                        self.next_overflow < self.total_buckets,
                        "overflow area full"
                    );
                    let o = self.next_overflow;
                    self.next_overflow += 1;
                    self.image[i as usize].set_next(o as u32);
                    self.image[i as usize].seal();
                    self.publish_bucket(&self.image[i as usize].clone(), i);
                    i = o;
                }
                n => i = n,
            }
        }
    }

    fn write(&mut self, dkey: &[u8], value: &[u8], flags: RecordFlags) -> u64 {
        let k = key(dkey);
        let h = k.hash();
        let old = self.index.get(dkey).copied();
        let version = old.map_or(1, |o| o.3 + 1);
        let (addr, len) = self.append(&k, value, version, flags);
        let (bi, si) = match old {
            Some((bi, si, _, _)) => (bi, si),
            None => self.free_slot(h.bucket_index(self.main)),
        };
        let slot = Slot {
            fingerprint: h.fingerprint(),
            length: len,
            addr,
            version_low: version as u16,
        };
        self.image[bi as usize].set_slot(si, slot);
        self.image[bi as usize].seal();
        let b = self.image[bi as usize];
        self.publish_bucket(&b, bi);
        if let Some((_, _, old_addr, _)) = old {
            if old_addr + self.ring >= self.tail {
                let state_off = (old_addr % self.ring) as usize + OFF_CRC + 4;
                self.log.set_u32(state_off, STATE_SUPERSEDED);
            }
        }
        self.index.insert(dkey.to_vec(), (bi, si, addr, version));
        version
    }
}

fn reader(endpoint: Box<dyn Endpoint>, regions: TargetRegions) -> OneSidedReader {
    reader_caching(endpoint, regions, 64)
}

/// A reader with a bucket cache of `buckets` (0: none, as a shm client's).
fn reader_caching(
    endpoint: Box<dyn Endpoint>,
    regions: TargetRegions,
    buckets: usize,
) -> OneSidedReader {
    let policy = RetryPolicy {
        budget: Duration::from_millis(50),
        max_attempts: 1000,
        absent_is_final: true,
    };
    OneSidedReader::new(endpoint, vec![regions], buckets, policy).unwrap()
}

fn desc(kind: RegionKind, id: u32, length: u64, param: u64) -> RegionDescriptor {
    RegionDescriptor {
        provider: Provider::Shm,
        kind,
        target: 0,
        region_id: id,
        length,
        param,
        access_key: 0,
        remote_addr: 0,
    }
}

fn get(reader: &OneSidedReader, counters: &Counters, dkey: &[u8]) -> (Lookup, Vec<u8>) {
    let mut out = Vec::new();
    let l = reader.get_into(&key(dkey), &mut out, counters).unwrap();
    (l, out)
}

#[test]
fn reads_values_chains_collisions_and_absence() {
    // One main bucket: every key shares it, so chains and fingerprint
    // comparisons are exercised.
    let (mut store, reader) = Store::new(1, 16, 1 << 16);
    let counters = Counters::default();
    for i in 0..20u32 {
        store.write(
            format!("k{i}").as_bytes(),
            format!("value {i}").as_bytes(),
            RecordFlags::empty(),
        );
    }
    for i in 0..20u32 {
        let (l, v) = get(&reader, &counters, format!("k{i}").as_bytes());
        assert!(matches!(l, Lookup::Found { version: 1 }), "k{i}: {l:?}");
        assert_eq!(v, format!("value {i}").as_bytes());
    }
    assert_eq!(get(&reader, &counters, b"missing").0, Lookup::Absent);
    let names: Vec<Vec<u8>> = (0..20u32).map(|i| format!("k{i}").into_bytes()).collect();
    let mut keys: Vec<RecordKey<'_>> = names.iter().map(|n| key(n)).collect();
    keys.push(key(b"missing"));
    let mut outs = vec![Vec::new(); keys.len()];
    let many = reader.get_many_into(&keys, &mut outs, &counters).unwrap();
    for i in 0..20 {
        assert_eq!(many[i], Lookup::Found { version: 1 });
        assert_eq!(outs[i], format!("value {i}").as_bytes());
    }
    assert_eq!(many[20], Lookup::Absent);
    assert!(reader
        .get_many_into(&keys, &mut outs[..3], &counters)
        .is_err());
    store.write(
        b"k3",
        b"",
        RecordFlags::empty().with(RecordFlags::TOMBSTONE),
    );
    assert_eq!(get(&reader, &counters, b"k3").0, Lookup::Absent);
    store.write(b"k4", b"newer", RecordFlags::empty());
    let (l, v) = get(&reader, &counters, b"k4");
    assert_eq!(
        (l, v.as_slice()),
        (Lookup::Found { version: 2 }, &b"newer"[..])
    );
    let s = counters.snapshot();
    assert_eq!(s.fallbacks, 0);
    assert_eq!(s.one_sided_hits, 23 + 21);
}

#[test]
fn evicted_record_falls_back_and_corruption_never_returns_bytes() {
    let (mut store, reader) = Store::new(64, 16, 4096);
    let counters = Counters::default();
    store.write(b"old", b"first", RecordFlags::empty());
    for i in 0..200u32 {
        store.write(
            format!("filler{}", i % 8).as_bytes(),
            &[i as u8; 40],
            RecordFlags::empty(),
        );
    }
    assert_eq!(
        get(&reader, &counters, b"old").0,
        Lookup::Fallback(FallbackReason::NotInMemory)
    );
    // Corrupt one byte of the value of a live record: CRC fails every time,
    // so the reader exhausts its budget and asks for RPC.
    store.write(b"victim", b"abcdefgh", RecordFlags::empty());
    let (_, _, addr, _) = store.index[&b"victim"[..]];
    let off = (addr % store.ring) as usize + HEADER_BYTES;
    let word = off & !7;
    let mut bytes = [0u8; 8];
    // SAFETY: reading our own writable mapping, in bounds.
    unsafe { std::ptr::copy_nonoverlapping(store.log.ptr.add(word), bytes.as_mut_ptr(), 8) };
    bytes[off - word] ^= 0x40;
    store.log.store(word, &bytes);
    let (l, _) = get(&reader, &counters, b"victim");
    assert!(
        matches!(l, Lookup::Fallback(_)),
        "corrupt record gave {l:?}"
    );
    assert!(counters.snapshot().retries > 0);
}

#[test]
fn a_bucket_that_fails_its_check_is_trusted_only_where_the_record_proves_itself() {
    // One main bucket: every key is in it. No bucket cache, as a shm
    // client has: every GET reads its bucket.
    let (mut store, ep, regions) = Store::with_endpoint(1, 16, 1 << 16);
    let reader = reader_caching(Box::new(ep), regions, 0);
    let counters = Counters::default();
    store.write(b"plain", b"value", RecordFlags::empty());
    let tombstone = RecordFlags::empty().with(RecordFlags::TOMBSTONE);
    store.write(b"gone", b"", tombstone);
    store.write(
        b"array",
        b"extent bytes",
        RecordFlags::empty().with(RecordFlags::EXTENT),
    );
    let mut out = Vec::new();
    let array =
        |out: &mut Vec<u8>| (reader.get_extent_into(&key(b"array"), 0, 6, out, &counters)).unwrap();
    assert_eq!(array(&mut out), Lookup::Found { version: 1 });
    assert_eq!(out, b"extent");
    // The bucket as a copy that mixed two of its generations reads: its
    // CRC no longer matches its bytes.
    let mut torn = store.image[0];
    torn.0[BUCKET_OFF_CRC] ^= 1;
    store.publish_bucket(&torn, 0);
    // A single value's record (or tombstone) proves itself: no retry.
    let found = get(&reader, &counters, b"plain");
    assert_eq!(found, (Lookup::Found { version: 1 }, b"value".to_vec()));
    assert_eq!(get(&reader, &counters, b"gone").0, Lookup::Absent);
    assert_eq!(counters.snapshot().retries, 0);
    // Absence, and an array's bytes, rest on the bucket: never taken from
    // one that fails its check.
    let exhausted = Lookup::Fallback(FallbackReason::RetriesExhausted);
    assert_eq!(get(&reader, &counters, b"missing").0, exhausted);
    assert_eq!(array(&mut out), exhausted);
    // A batch (prefetched loads) the same.
    let keys = [key(b"plain"), key(b"gone"), key(b"missing")];
    let mut outs = vec![Vec::new(); keys.len()];
    let many = reader.get_many_into(&keys, &mut outs, &counters).unwrap();
    let want = [Lookup::Found { version: 1 }, Lookup::Absent, exhausted];
    assert_eq!(many, want);
    assert_eq!(outs[0], b"value");
    // The bucket whole again: absence is final.
    store.publish_bucket(&store.image[0].clone(), 0);
    assert_eq!(get(&reader, &counters, b"missing").0, Lookup::Absent);
}

#[test]
fn batched_gets_read_lists_and_match_single_gets() {
    // 4 main buckets, 40 keys: chains, collisions and absent keys; one key
    // deleted, one overwritten.
    let (mut store, shm, regions) = Store::with_endpoint(4, 32, 1 << 16);
    let (lists, longest) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let ep = Batching {
        shm,
        lists: lists.clone(),
        longest: longest.clone(),
    };
    let reader = reader(Box::new(ep), regions);
    let counters = Counters::default();
    for i in 0..40u32 {
        store.write(
            format!("k{i}").as_bytes(),
            format!("value {i}").as_bytes(),
            RecordFlags::empty(),
        );
    }
    store.write(
        b"k3",
        b"",
        RecordFlags::empty().with(RecordFlags::TOMBSTONE),
    );
    store.write(b"k4", b"newer", RecordFlags::empty());
    let names: Vec<Vec<u8>> = (0..44u32).map(|i| format!("k{i}").into_bytes()).collect();
    let keys: Vec<RecordKey<'_>> = names.iter().map(|n| key(n)).collect();
    for round in 0..2 {
        let mut outs = vec![Vec::new(); keys.len()];
        let many = reader.get_many_into(&keys, &mut outs, &counters).unwrap();
        for (i, name) in names.iter().enumerate() {
            let (single, value) = get(&reader, &counters, name);
            assert_eq!(many[i], single, "k{i}, round {round}");
            if let Lookup::Found { .. } = single {
                assert_eq!(outs[i], value, "k{i}, round {round}");
            }
        }
        assert_eq!(many[3], Lookup::Absent);
        assert_eq!(many[4], Lookup::Found { version: 2 });
        assert_eq!(many[43], Lookup::Absent);
    }
    assert!(
        lists.load(Ordering::Relaxed) >= 3,
        "buckets, then records, per batch"
    );
    assert!(longest.load(Ordering::Relaxed) >= 4, "reads went as lists");
    assert_eq!(counters.snapshot().fallbacks, 0);
}

/// Per key: (write start, ack) of each version, index = version - 1.
type History = Arc<Mutex<HashMap<u32, Vec<(Instant, Option<Instant>)>>>>;

#[test]
fn concurrent_writer_readers_see_only_acknowledged_or_in_flight_values() {
    const KEYS: u32 = 16;
    const WRITES: u32 = 20_000;
    let (mut store, reader) = Store::new(8, 64, 1 << 14);
    let reader = Arc::new(reader);
    let counters = Arc::new(Counters::default());
    let history: History = Arc::new(Mutex::new(HashMap::new()));
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (history, done) = (history.clone(), done.clone());
        std::thread::spawn(move || {
            for n in 0..WRITES {
                let k = n % KEYS;
                let start = Instant::now();
                history
                    .lock()
                    .unwrap()
                    .entry(k)
                    .or_default()
                    .push((start, None));
                let version = store.write(
                    &k.to_le_bytes(),
                    &value_of(k, n / KEYS + 1),
                    RecordFlags::empty(),
                );
                assert_eq!(version, u64::from(n / KEYS + 1));
                let acked = Instant::now();
                history.lock().unwrap().get_mut(&k).unwrap()[(version - 1) as usize].1 =
                    Some(acked);
            }
            done.store(true, Ordering::Release);
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (reader, counters, done) = (reader.clone(), counters.clone(), done.clone());
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut out = Vec::new();
                let started = Instant::now();
                for i in 0..2_000_000u32 {
                    if done.load(Ordering::Acquire) || started.elapsed() > Duration::from_secs(60) {
                        break;
                    }
                    let k = (i * 7 + r) % KEYS;
                    let t0 = Instant::now();
                    let l = reader
                        .get_into(&key(&k.to_le_bytes()), &mut out, &counters)
                        .unwrap();
                    let t1 = Instant::now();
                    if let Lookup::Found { version } = l {
                        assert_eq!(
                            out,
                            value_of(k, version as u32),
                            "bytes not the key's value"
                        );
                        seen.push((k, version, t0, t1));
                    }
                }
                seen
            })
        })
        .collect();
    writer.join().unwrap();
    let history = history.lock().unwrap();
    let mut checked = 0;
    for r in readers {
        for (k, version, t0, t1) in r.join().unwrap() {
            let h = &history[&k];
            let (start, _) = h[(version - 1) as usize];
            assert!(start <= t1, "key {k} v{version} read before it was written");
            if let Some((_, Some(next_ack))) = h.get(version as usize) {
                assert!(
                    *next_ack >= t0,
                    "key {k} v{version} returned although v{} was acknowledged before the GET",
                    version + 1
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 0, "no GET found a value");
    let s = counters.snapshot();
    eprintln!("checked {checked} GETs; counters {s:?}");
}

fn value_of(k: u32, version: u32) -> Vec<u8> {
    let mut v = format!("key {k} version {version} ").into_bytes();
    v.resize(24 + (version % 40) as usize, b'.');
    v
}
