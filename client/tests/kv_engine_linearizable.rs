//! Guards what a GET may return while writers run, against a real engine
//! process: over shm (Unix socket) and tcp, each GET returns a value that was
//! the latest acknowledged one at some moment during the GET (or one whose
//! PUT was in flight then). Each key has one writer doing sequential PUTs
//! whose (start, ack) instants are recorded; readers record (start, end) of
//! every GET and the sequence number in the value they got.

mod kv_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_client::client::{Client, Key};
use kv_support::EngineProc;

const WRITERS: u64 = 2;
const KEYS_PER_WRITER: u64 = 8;
const WRITES_PER_WRITER: u64 = 1500;

/// (writer, key) → per sequence number: (PUT start, ack).
type History = HashMap<u64, Vec<(Instant, Instant)>>;

fn key(k: u64) -> Key {
    Key::new(7, 7, format!("lin-{k}").as_bytes(), b"v")
}

fn value(k: u64, seq: u64) -> Vec<u8> {
    let mut v = format!("{k}:{seq}:").into_bytes();
    v.resize(16 + (seq % 64) as usize, b'#');
    v
}

fn parse(v: &[u8]) -> (u64, u64) {
    let s = String::from_utf8_lossy(v);
    let mut it = s.split(':');
    let k = it
        .next()
        .and_then(|x| x.parse().ok())
        .expect("key in value");
    let seq = it
        .next()
        .and_then(|x| x.parse().ok())
        .expect("seq in value");
    (k, seq)
}

fn writer(client: Arc<Client>, w: u64) -> History {
    let mut h: History = HashMap::new();
    for n in 0..WRITES_PER_WRITER {
        let k = w * KEYS_PER_WRITER + n % KEYS_PER_WRITER;
        let seq = n / KEYS_PER_WRITER;
        let t0 = Instant::now();
        client.put(&key(k), &value(k, seq)).expect("put");
        h.entry(k).or_default().push((t0, Instant::now()));
    }
    h
}

/// GETs until `done`: (key, seq or None, start, end).
fn reader(
    client: Arc<Client>,
    r: u64,
    done: Arc<AtomicBool>,
) -> Vec<(u64, Option<u64>, Instant, Instant)> {
    let mut seen = Vec::new();
    let started = Instant::now();
    let keys = WRITERS * KEYS_PER_WRITER;
    for i in 0..5_000_000u64 {
        if done.load(Ordering::Acquire) || started.elapsed() > Duration::from_secs(120) {
            break;
        }
        let k = (i * 5 + r) % keys;
        let t0 = Instant::now();
        let got = client.get(&key(k)).expect("get");
        let t1 = Instant::now();
        let seq = got.map(|v| {
            let (vk, seq) = parse(&v);
            assert_eq!(vk, k, "GET of key {k} returned key {vk}'s value");
            assert_eq!(v, value(k, seq), "bytes are not a value written to key {k}");
            seq
        });
        seen.push((k, seq, t0, t1));
    }
    seen
}

fn check(history: &History, seen: &[(u64, Option<u64>, Instant, Instant)]) -> usize {
    for &(k, seq, t0, t1) in seen {
        let h = &history[&k];
        let next = match seq {
            None => 0,
            Some(s) => {
                let (start, _) = h[s as usize];
                assert!(start <= t1, "key {k} seq {s} returned before its PUT began");
                s as usize + 1
            }
        };
        if let Some(&(_, ack)) = h.get(next) {
            assert!(
                ack >= t0,
                "key {k}: GET returned seq {seq:?} but seq {next} was acknowledged before the GET began"
            );
        }
    }
    seen.len()
}

#[test]
fn gets_return_latest_acknowledged_values_over_shm_and_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let engine = EngineProc::start(dir.path());
    let writer_client = Arc::new(Client::connect(&engine.unix).unwrap());
    let shm = Arc::new(Client::connect(&engine.unix).unwrap());
    let tcp = Arc::new(Client::connect(&engine.tcp).unwrap());
    assert_eq!(shm.one_sided_provider(), Some("shm"));
    assert_eq!(tcp.one_sided_provider(), Some("tcp"));
    let done = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let c = writer_client.clone();
            std::thread::spawn(move || writer(c, w))
        })
        .collect();
    let readers: Vec<_> = [shm.clone(), shm.clone(), tcp.clone()]
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            let done = done.clone();
            std::thread::spawn(move || reader(c, r as u64, done))
        })
        .collect();
    let mut history = History::new();
    for w in writers {
        history.extend(w.join().unwrap());
    }
    done.store(true, Ordering::Release);
    let seen: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let checked: usize = seen.iter().map(|s| check(&history, s)).sum();
    let found = seen.iter().flatten().filter(|s| s.1.is_some()).count();
    assert!(found > 0, "no GET found a value among {checked}");
    let (s, t) = (shm.counters(), tcp.counters());
    assert!(
        s.one_sided_hits > 0 && t.one_sided_hits > 0,
        "shm {s:?} tcp {t:?}"
    );
    eprintln!("checked {checked} GETs ({found} values); shm {s:?}; tcp {t:?}");
}
