//! One-sided readers racing the writer: another thread maps the bucket and
//! log regions read-only (as a local client does with the fds), and looks
//! keys up with the proto functions only — bucket copy + CRC, record copy,
//! parse, `verify_for` — while the store overwrites the keys and its small
//! ring wraps many times. Every value the reader accepts must be exactly one
//! the writer wrote for that key.

use ferrite_engine::region::{map_readonly, unmap_readonly};
use ferrite_engine::store::{Store, StoreConfig};
use ferrite_proto::bucket::{Bucket, BUCKET_BYTES};
use ferrite_proto::key::RecordKey;
use ferrite_proto::record::RecordView;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const KEYS: u32 = 32;
const UPDATES: u32 = 20_000;

fn value(k: u32, seq: u32) -> Vec<u8> {
    let len = 40 + (seq as usize * 7919) % 1800;
    format!("k{k}:s{seq};").bytes().cycle().take(len).collect()
}

/// Checks `v` is `value(k, seq)` for the seq it names.
fn is_written_value(k: u32, v: &[u8]) -> bool {
    let s = String::from_utf8_lossy(v);
    let Some(rest) = s.strip_prefix(&format!("k{k}:s")) else {
        return false;
    };
    let Some(seq) = rest.split(';').next().and_then(|n| n.parse::<u32>().ok()) else {
        return false;
    };
    value(k, seq) == v
}

struct Mapped {
    buckets: *const u8,
    buckets_len: usize,
    ring: *const u8,
    ring_len: usize,
    main: u64,
    ring_bytes: u64,
}

enum Lookup {
    Found(Vec<u8>),
    Retry,
    Absent,
}

fn copy_words(src: *const u8, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    for i in 0..len / 8 {
        // SAFETY: src..src+len lies in the mapping and is 8-aligned.
        let w = unsafe { (*(src.add(i * 8) as *const AtomicU64)).load(Ordering::Acquire) };
        out.extend_from_slice(&w.to_le_bytes());
    }
    out
}

fn lookup(m: &Mapped, key: &RecordKey<'_>) -> Lookup {
    let h = key.hash();
    let fp = h.fingerprint();
    let total = (m.buckets_len / BUCKET_BYTES) as u32;
    let mut i = h.bucket_index(m.main) as u32;
    for _ in 0..total {
        // SAFETY: i < total buckets of the mapping.
        let b = unsafe { Bucket::load_shared(m.buckets.add(i as usize * BUCKET_BYTES)) };
        if b.check().is_err() {
            return Lookup::Retry;
        }
        for slot in b.matching(fp) {
            let off = (slot.addr % m.ring_bytes) as usize;
            let len = slot.length as usize;
            if off + len > m.ring_len || len % 8 != 0 {
                return Lookup::Retry;
            }
            // SAFETY: in bounds (checked above).
            let bytes = copy_words(unsafe { m.ring.add(off) }, len);
            let Ok(view) = RecordView::parse(&bytes) else {
                return Lookup::Retry;
            };
            if view.verify_for(key, slot.addr).is_ok() {
                return Lookup::Found(view.value().to_vec());
            }
        }
        match b.next() {
            0 => return Lookup::Absent,
            n if n < total => i = n,
            _ => return Lookup::Retry,
        }
    }
    Lookup::Retry
}

#[test]
fn racing_one_sided_readers_never_accept_foreign_bytes() {
    let (tx, rx) = mpsc::channel::<(OwnedFd, usize, OwnedFd, usize, u64, u64)>();
    let done = Arc::new(AtomicBool::new(false));
    let done_w = done.clone();
    let writer = glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            // A main area that is not a power of two: readers and writer
            // index it by the scaled hash (proto KeyHash::bucket_index).
            let cfg = StoreConfig {
                bucket_count: 3000,
                ring_bytes: 64 << 10,
                max_commit_bytes: 16 << 10,
                ..StoreConfig::small()
            };
            let s = Store::open(ferrite_bdev::open("malloc:64M").unwrap(), cfg)
                .await
                .unwrap();
            let r = s.regions();
            tx.send((
                r.buckets.fd().try_clone_to_owned().unwrap(),
                r.buckets.len(),
                r.log.fd().try_clone_to_owned().unwrap(),
                r.log.len(),
                r.main_bucket_count,
                r.ring_bytes,
            ))
            .unwrap();
            for seq in 0..UPDATES {
                let k = seq % KEYS;
                let kb = k.to_le_bytes();
                s.update(&RecordKey::new(4, 4, b"d", &kb), &value(k, seq))
                    .await
                    .unwrap();
            }
            done_w.store(true, Ordering::Release);
            s.stats().head
        })
        .unwrap();
    let (bfd, blen, rfd, rlen, main, ring_bytes) = rx.recv().unwrap();
    let bptr = map_readonly(bfd.as_fd(), blen).unwrap();
    let rptr = map_readonly(rfd.as_fd(), rlen).unwrap();
    let m = Mapped {
        buckets: bptr.as_ptr(),
        buckets_len: blen,
        ring: rptr.as_ptr(),
        ring_len: rlen,
        main,
        ring_bytes,
    };
    let (mut found, mut retries) = (0u64, 0u64);
    let start = Instant::now();
    for n in 0..50_000_000u64 {
        if done.load(Ordering::Acquire) || start.elapsed() > Duration::from_secs(60) {
            break;
        }
        let k = (n % u64::from(KEYS)) as u32;
        let kb = k.to_le_bytes();
        match lookup(&m, &RecordKey::new(4, 4, b"d", &kb)) {
            Lookup::Found(v) => {
                assert!(is_written_value(k, &v), "key {k}: accepted foreign bytes");
                found += 1;
            }
            Lookup::Retry => retries += 1,
            Lookup::Absent => {}
        }
    }
    let head = writer.join().unwrap();
    println!("one-sided reads accepted {found}, retried {retries}; log head {head}");
    assert!(head > 20 * ring_bytes, "the ring did not wrap enough");
    assert!(found > 0, "the reader never found a key");
    // SAFETY: the mappings came from map_readonly and are no longer used.
    unsafe {
        unmap_readonly(bptr, blen);
        unmap_readonly(rptr, rlen);
    }
}
