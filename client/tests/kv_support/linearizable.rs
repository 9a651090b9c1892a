//! The GET-while-writing check the kv tests share (shm, tcp, verbs): each
//! key has one writer doing sequential PUTs whose (start, ack) instants are
//! recorded; readers record (start, end) of every GET and the sequence
//! number in the value they got. Every GET must return a value that was the
//! latest acknowledged one at some moment during the GET (or one whose PUT
//! was in flight then).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_client::client::{Client, Key};

/// key → per sequence number: (PUT start, ack).
pub type History = HashMap<u64, Vec<(Instant, Instant)>>;
/// (key, seq or None, GET start, GET end).
pub type Seen = Vec<(u64, Option<u64>, Instant, Instant)>;

/// The shape of one run.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// dkeys are `{prefix}-{k}`.
    pub prefix: &'static str,
    pub writers: u64,
    pub keys_per_writer: u64,
    pub writes_per_writer: u64,
    /// Bounds of each reader: GETs and time.
    pub max_gets: u64,
    pub limit: Duration,
}

/// The value of sequence number `seq` of key `k` (its length varies).
pub fn value(k: u64, seq: u64) -> Vec<u8> {
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

impl Workload {
    pub fn key(&self, k: u64) -> Key {
        Key::new(7, 7, format!("{}-{k}", self.prefix).as_bytes(), b"v")
    }

    fn writer(&self, client: &Client, w: u64) -> History {
        let mut h = History::new();
        for n in 0..self.writes_per_writer {
            let k = w * self.keys_per_writer + n % self.keys_per_writer;
            let seq = n / self.keys_per_writer;
            let t0 = Instant::now();
            client.put(&self.key(k), &value(k, seq)).expect("put");
            h.entry(k).or_default().push((t0, Instant::now()));
        }
        h
    }

    /// GETs until `done` (or the bounds).
    fn reader(&self, client: &Client, r: u64, done: &AtomicBool) -> Seen {
        let (mut seen, started) = (Seen::new(), Instant::now());
        let keys = self.writers * self.keys_per_writer;
        for i in 0..self.max_gets {
            if done.load(Ordering::Acquire) || started.elapsed() > self.limit {
                break;
            }
            let k = (i * 5 + r) % keys;
            let t0 = Instant::now();
            let got = client.get(&self.key(k)).expect("get");
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

    /// Runs the writers on `writer` and one reader thread per client of
    /// `readers` until the writers finish, checks every GET against the
    /// history, and returns what each reader saw.
    pub fn run(self, writer: &Arc<Client>, readers: &[Arc<Client>]) -> Vec<Seen> {
        let done = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..self.writers)
            .map(|w| {
                let c = writer.clone();
                std::thread::spawn(move || self.writer(&c, w))
            })
            .collect();
        let reading: Vec<_> = (readers.iter().enumerate())
            .map(|(r, c)| {
                let (c, done) = (c.clone(), done.clone());
                std::thread::spawn(move || self.reader(&c, r as u64, &done))
            })
            .collect();
        let mut history = History::new();
        for w in writers {
            history.extend(w.join().unwrap());
        }
        done.store(true, Ordering::Release);
        let seen: Vec<Seen> = reading.into_iter().map(|r| r.join().unwrap()).collect();
        seen.iter().for_each(|s| check(&history, s));
        seen
    }
}

/// Each GET returned a value that was the latest acknowledged one at some
/// moment during the GET (or one whose PUT was in flight).
pub fn check(history: &History, seen: &Seen) {
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
}
