//! Guards one-sided reads of records that have left the memory ring, from
//! the target's device file mapped read-only (shm on a file-backed device),
//! against a real engine process:
//! - values whose records were pushed out of a small ring are read from the
//!   device mapping (device hits counted, no RPC fallback), whole values and
//!   extents of arrays; a tcp client on the same engine still falls back;
//! - while writers overwrite keys and the cleaner moves records and reuses
//!   device space under the readers, every GET of a cold key returns a value
//!   that was the key's latest acknowledged one at some moment during the
//!   GET (or one in flight), never other bytes;
//! - a target on a device that is not a file (malloc) exports no device log,
//!   and its evicted records are still read, by RPC.

mod kv_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_client::client::{Client, Key};
use ferrite_proto::region::RegionKind;
use kv_support::linearizable::{check, History, Seen};
use kv_support::EngineProc;

/// Values are above the engine's keeper limit (4 KiB: smaller live values
/// are kept in the ring).
fn value(k: u64, seq: u64) -> Vec<u8> {
    let mut v = format!("{k}:{seq}:").into_bytes();
    let len = 6000 + (seq % 7) as usize * 512;
    let fill = (k * 31 + seq * 7) as u8;
    v.extend((v.len()..len).map(|i| fill.wrapping_add(i as u8)));
    v
}

fn parse(v: &[u8]) -> (u64, u64) {
    let s = String::from_utf8_lossy(&v[..v.len().min(40)]).into_owned();
    let mut it = s.split(':');
    let mut num = || {
        it.next()
            .and_then(|x| x.parse().ok())
            .expect("k:seq: in value")
    };
    (num(), num())
}

fn key(k: u64) -> Key {
    Key::new(9, 9, format!("dev-{k}").as_bytes(), b"v")
}

fn device_logs(client: &Client) -> usize {
    let regions = client.regions();
    regions
        .iter()
        .filter(|r| r.kind == RegionKind::DeviceLog)
        .count()
}

#[test]
fn records_out_of_the_ring_are_read_from_the_device_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let engine = EngineProc::start_with(dir.path(), &["--ring-bytes", "1M"]);
    let writer = Client::connect(&engine.unix).unwrap();
    // 600 values of 6-9 KiB: about 4 MiB through a 1 MiB ring.
    let keys = 600;
    for k in 0..keys {
        writer.put(&key(k), &value(k, 0)).unwrap();
    }
    // Arrays of 64 KiB extents, written before more values push them out.
    let array = |a: u64| Key::new(9, 10, format!("arr-{a}").as_bytes(), b"x");
    let extent = |a: u64| value(a, a).repeat(12)[..64 << 10].to_vec();
    for a in 0..8 {
        writer.write_extent(&array(a), 0, &extent(a)).unwrap();
    }
    for k in keys..keys + 200 {
        writer.put(&key(k), &value(k, 0)).unwrap();
    }
    let shm = Client::connect(&engine.unix).unwrap();
    assert_eq!(shm.one_sided_provider(), Some("shm"));
    assert_eq!(device_logs(&shm), 1, "one file-backed target");
    for k in 0..keys {
        assert_eq!(shm.get(&key(k)).unwrap(), Some(value(k, 0)), "key {k}");
    }
    let mut buf = vec![0u8; 20_000];
    for a in 0..8 {
        let got = shm
            .read_extent_one_sided_into(&array(a), 1000, &mut buf)
            .unwrap();
        assert_eq!(got, Some(true), "array {a} read one-sided");
        assert_eq!(buf[..], extent(a)[1000..21_000], "array {a}");
    }
    let c = shm.counters();
    eprintln!("shm {c:?}");
    assert!(c.device_hits >= 400 + 8, "most keys left the ring: {c:?}");
    assert_eq!(c.fallbacks, 0, "nothing went by RPC: {c:?}");
    // tcp has no device log: the same keys fall back to RPC there.
    let tcp = engine.client(&engine.tcp);
    assert_eq!(device_logs(&tcp), 0);
    for k in 0..keys {
        assert_eq!(
            tcp.get(&key(k)).unwrap(),
            Some(value(k, 0)),
            "key {k} over tcp"
        );
    }
    let t = tcp.counters();
    assert!(t.fallbacks >= 400 && t.device_hits == 0, "tcp {t:?}");
}

#[test]
fn malloc_targets_export_no_device_log_and_read_by_rpc() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--ring-bytes", "1M", "--bdev", "malloc:64M"];
    let engine = EngineProc::start_with(dir.path(), &args);
    let writer = Client::connect(&engine.unix).unwrap();
    for k in 0..600 {
        writer.put(&key(k), &value(k, 1)).unwrap();
    }
    let shm = Client::connect(&engine.unix).unwrap();
    assert_eq!(shm.one_sided_provider(), Some("shm"));
    assert_eq!(device_logs(&shm), 0);
    for k in 0..600 {
        assert_eq!(shm.get(&key(k)).unwrap(), Some(value(k, 1)), "key {k}");
    }
    let c = shm.counters();
    assert!(c.fallbacks >= 400 && c.device_hits == 0, "{c:?}");
}

/// Writers per key group and the shape of the racing run.
const WRITERS: u64 = 2;
const HOT_KEYS: u64 = 4;
const COLD_KEYS: u64 = 8;
/// One write in this many goes to a cold key.
const COLD_EVERY: u64 = 40;
const WRITES: u64 = 8000;

/// Writer `w`'s keys: hot ones (most writes, pushing data through the ring
/// and the device log) and cold ones (rarely written, so their latest
/// record is out of the ring, moved by the cleaner, its old space reused).
fn racing_writer(client: &Client, w: u64) -> History {
    let mut h = History::new();
    let base = w * (HOT_KEYS + COLD_KEYS);
    for n in 0..WRITES {
        let k = match n % COLD_EVERY {
            0 => base + HOT_KEYS + (n / COLD_EVERY) % COLD_KEYS,
            _ => base + n % HOT_KEYS,
        };
        let seq = h.get(&k).map_or(0, Vec::len) as u64;
        let t0 = Instant::now();
        client.put(&key(k), &value(k, seq)).expect("put");
        h.entry(k).or_default().push((t0, Instant::now()));
    }
    h
}

fn racing_reader(client: &Client, r: u64, done: &AtomicBool) -> Seen {
    let mut seen = Seen::new();
    let cold: Vec<u64> = (0..WRITERS)
        .flat_map(|w| (0..COLD_KEYS).map(move |c| w * (HOT_KEYS + COLD_KEYS) + HOT_KEYS + c))
        .collect();
    let started = Instant::now();
    let mut i = r;
    while !done.load(Ordering::Acquire) && started.elapsed() < Duration::from_secs(300) {
        let k = cold[(i % cold.len() as u64) as usize];
        i += 1;
        let t0 = Instant::now();
        let got = client.get(&key(k)).expect("get");
        let t1 = Instant::now();
        let seq = got.map(|v| {
            let (vk, seq) = parse(&v);
            assert_eq!(vk, k, "GET of key {k} returned key {vk}'s value");
            assert!(
                v == value(k, seq),
                "bytes are not a value written to key {k}"
            );
            seq
        });
        seen.push((k, seq, t0, t1));
    }
    seen
}

#[test]
fn cold_reads_race_overwrites_and_the_cleaner_safely() {
    let dir = tempfile::tempdir().unwrap();
    // A 32 MiB device (a log of about 23 MiB) under ~50 MiB of writes: the
    // cleaner runs and the log wraps, reusing space records were read from.
    let args = [
        "--ring-bytes",
        "1M",
        "--durability",
        "process",
        "--bdev",
        "uring:{dir}/target-{i}.bdev?size=32M&direct=0",
    ];
    let engine = EngineProc::start_with(dir.path(), &args);
    let writer = Arc::new(Client::connect(&engine.unix).unwrap());
    let readers: Vec<Arc<Client>> = (0..2)
        .map(|_| Arc::new(Client::connect(&engine.unix).unwrap()))
        .collect();
    assert_eq!(device_logs(&readers[0]), 1);
    let done = Arc::new(AtomicBool::new(false));
    let writing: Vec<_> = (0..WRITERS)
        .map(|w| {
            let c = writer.clone();
            std::thread::spawn(move || racing_writer(&c, w))
        })
        .collect();
    let reading: Vec<_> = (readers.iter().enumerate())
        .map(|(r, c)| {
            let (c, done) = (c.clone(), done.clone());
            std::thread::spawn(move || racing_reader(&c, r as u64, &done))
        })
        .collect();
    let mut history: History = HashMap::new();
    for w in writing {
        history.extend(w.join().unwrap());
    }
    done.store(true, Ordering::Release);
    let seen: Vec<Seen> = reading.into_iter().map(|r| r.join().unwrap()).collect();
    for s in &seen {
        check(&history, s);
    }
    let stat = writer.stat().unwrap();
    let counter = |name: &str| {
        let t = &stat.target_counters[0].counters;
        t.iter().find(|(n, _)| n == name).map_or(0, |c| c.1)
    };
    let (head, capacity) = (counter("head"), counter("log_capacity_bytes"));
    let copied = counter("cleaner_records_copied");
    eprintln!("engine: head {head}, log {capacity}, cleaner copied {copied} records");
    assert!(
        head > capacity && copied > 0,
        "the log wrapped and the cleaner moved records"
    );
    let gets: usize = seen.iter().map(Vec::len).sum();
    let device_hits: u64 = readers.iter().map(|r| r.counters().device_hits).sum();
    eprintln!(
        "checked {gets} GETs; readers {:?}",
        readers.iter().map(|r| r.counters()).collect::<Vec<_>>()
    );
    assert!(device_hits > 0, "no GET was served from the device mapping");
}
