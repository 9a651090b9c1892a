//! The fetch runs of `ferrite bench store`: one task fetching one key per
//! call or a batch per call, and several tasks fetching one key per call
//! at once (the xstream's concurrency, as the update figures have it).

use super::common::{histogram, key, key_bytes, thread_cpu_secs};
use ferrite_engine::store::Store;
use hdrhistogram::Histogram;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

/// Fetches timed one by one: every this many-th (clock reads cost as
/// much as a resident fetch).
const FETCH_SAMPLE_EVERY: u64 = 16;
/// Keys per `fetch_batch` call in the served fetch figures.
pub(super) const FETCH_BATCH: usize = 16;
/// Stride through the keys (prime: every key is visited, in an order the
/// hardware prefetchers do not follow).
const STRIDE: usize = 7919;

/// Fetch run: ops, wall seconds, thread CPU seconds, sampled latency.
pub(super) struct FetchRun {
    pub ops: u64,
    pub secs: f64,
    pub cpu_secs: f64,
    pub hist: Histogram<u64>,
}

/// Checks a fetched value is there and `size` bytes long.
fn check(i: usize, got: Option<(u64, Vec<u8>)>, size: usize) -> anyhow::Result<()> {
    match got {
        Some((_, v)) if v.len() == size => Ok(()),
        other => anyhow::bail!("key {i}: fetched {:?} bytes", other.map(|o| o.1.len())),
    }
}

/// Fetches `ops` keys from one task, `batch` at a time through
/// `fetch_batch` (1: one `fetch` each). Latency samples are per call.
pub(super) async fn fetch_many(
    s: &Store,
    keys: usize,
    size: usize,
    ops: u64,
    batch: usize,
) -> anyhow::Result<FetchRun> {
    if batch <= 1 {
        let hist = RefCell::new(histogram());
        let (start, cpu0) = (Instant::now(), thread_cpu_secs());
        fetch_one_by_one(s, keys, size, ops, 0, &hist).await?;
        return Ok(finish(ops, start, cpu0, hist.into_inner()));
    }
    let mut hist = histogram();
    let mut i = 0usize;
    let (start, cpu0) = (Instant::now(), thread_cpu_secs());
    let mut names = vec![[0u8; 8]; batch];
    let mut n = 0u64;
    while n < ops {
        for k in names.iter_mut() {
            i = (i + STRIDE) % keys;
            *k = key_bytes(i);
        }
        let ks: Vec<_> = names.iter().map(key).collect();
        let timed = (n / batch as u64) % FETCH_SAMPLE_EVERY == 0;
        let t0 = timed.then(Instant::now);
        let got = s.fetch_batch(&ks).await;
        if let Some(t0) = t0 {
            let _ = hist.record(t0.elapsed().as_nanos() as u64);
        }
        for (r, k) in got.into_iter().zip(&names) {
            check(u64::from_le_bytes(*k) as usize, r?, size)?;
        }
        n += batch as u64;
    }
    Ok(finish(n, start, cpu0, hist))
}

/// Fetches `ops` keys in all from `tasks` tasks on this xstream at once,
/// each one `fetch` per call, starting at spread-out keys. Latency samples
/// are per call.
pub(super) async fn fetch_concurrent(
    s: &Rc<Store>,
    keys: usize,
    size: usize,
    ops: u64,
    tasks: usize,
) -> anyhow::Result<FetchRun> {
    let hist = Rc::new(RefCell::new(histogram()));
    let per_task = ops / tasks as u64;
    let (start, cpu0) = (Instant::now(), thread_cpu_secs());
    let running: Vec<_> = (0..tasks)
        .map(|t| {
            let (s, hist) = (s.clone(), hist.clone());
            let first = t * keys / tasks;
            glommio::spawn_local(async move {
                fetch_one_by_one(&s, keys, size, per_task, first, &hist).await
            })
        })
        .collect();
    for r in running {
        r.await?;
    }
    let hist = hist.borrow().clone();
    Ok(finish(per_task * tasks as u64, start, cpu0, hist))
}

/// `ops` fetches of one key each, from key `first` on by the stride.
async fn fetch_one_by_one(
    s: &Store,
    keys: usize,
    size: usize,
    ops: u64,
    first: usize,
    hist: &RefCell<Histogram<u64>>,
) -> anyhow::Result<()> {
    let mut i = first % keys;
    for n in 0..ops {
        i = (i + STRIDE) % keys;
        let k = key_bytes(i);
        let timed = n % FETCH_SAMPLE_EVERY == 0;
        let t0 = timed.then(Instant::now);
        let got = s.fetch(&key(&k)).await?;
        if let Some(t0) = t0 {
            let _ = hist.borrow_mut().record(t0.elapsed().as_nanos() as u64);
        }
        check(i, got, size)?;
    }
    Ok(())
}

/// The run of `ops` fetches started at `start` (thread CPU time `cpu0`).
fn finish(ops: u64, start: Instant, cpu0: f64, hist: Histogram<u64>) -> FetchRun {
    FetchRun {
        ops,
        secs: start.elapsed().as_secs_f64(),
        cpu_secs: thread_cpu_secs() - cpu0,
        hist,
    }
}
