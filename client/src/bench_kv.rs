//! `ferrite bench kv`: GET/PUT throughput and latency against an engine.
//!
//! N client threads share one [`Client`]; each keeps `--pipeline` requests
//! in flight (PUTs and RPC GETs as one batch frame, or with `--frames` as
//! separate pipelined frames; one-sided GETs are looked up together: shm
//! with prefetching, verbs with one doorbell per list of RDMA READs). With
//! `--fabric verbs=...` the one-sided GETs are RDMA READs through the
//! engine's verbs side channel. Keys are `key:{i:012}` (dkey; akey
//! empty), uniformly random over `--keys`; values are `--value-size` bytes.
//! GET and mix runs first load every key with batched PUTs.
//!
//! Latency is sampled on every 8th one-sided GET and taken for every other
//! operation, in ticks of the CPU's time-stamp counter where there is one
//! (one instruction, as perftest times its reads; see `bench_kv/clock.rs`).
//!
//! `--async-gets` runs GETs as `Client::get_async` futures, `--pipeline` at
//! a time from each thread.
//!
//! `--bucket-cache 0` makes every one-sided GET read its bucket and then its
//! record (cold-bucket GETs); `--warm` GETs every key once before measuring,
//! so that with few keys the measured GETs find their buckets cached.
//!
//! JSON (`--json`, one object): `ops_per_sec`, `latency_us.{p50,p99,p999,max}`,
//! `one_sided_hit_rate`, `bucket_cache_hits_per_get`, `errors`, and the run's
//! parameters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ferrite_proto::key::RecordKey;
use ferrite_proto::rpc::{Key, Reply, Request};
use hdrhistogram::Histogram;

use crate::client::{Client, ClientOptions};

mod clock;

/// Arguments of `ferrite bench kv`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchKvArgs {
    /// Engine URL (tcp://host:port or unix:///path); none = embedded engine.
    #[arg(long)]
    pub engine: Option<String>,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// get, put or mix (90% get).
    #[arg(long, default_value = "get")]
    pub op: String,
    /// Bytes per value.
    #[arg(long, default_value_t = 64)]
    pub value_size: usize,
    /// Distinct keys (1M, 100K, ...).
    #[arg(long, default_value = "1M", value_parser = parse_count)]
    pub keys: u64,
    /// Seconds of measurement.
    #[arg(short = 't', long = "time", default_value_t = 10.0)]
    pub seconds: f64,
    /// Requests in flight per client thread: one-sided GETs are looked up
    /// together (prefetched); RPCs go as one batch frame of this many
    /// operations (like redis-benchmark -P), or with --frames as this many
    /// separate pipelined frames.
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,
    /// Pipeline RPCs as separate frames instead of one batch frame.
    #[arg(long)]
    pub frames: bool,
    /// Connections in the client's pool.
    #[arg(long, default_value_t = 2)]
    pub connections: usize,
    /// GETs by RPC only (no one-sided reads).
    #[arg(long)]
    pub no_one_sided: bool,
    /// One-sided GETs over this fabric instead of the one the engine's
    /// handshake offers: `verbs[=DEVICE[@HOST:PORT]]` (RDMA READ from the
    /// local DEVICE through the engine's verbs side channel at HOST:PORT,
    /// default the engine's host, port 7601; needs the `rdma` feature).
    /// RPCs stay on --engine.
    #[arg(long, conflicts_with = "no_one_sided", requires = "engine")]
    pub fabric: Option<String>,
    /// File holding a TCP engine's token (default: $FERRITE_TOKEN,
    /// $FERRITE_TOKEN_FILE, then /var/lib/ferrite/engine.token).
    #[arg(long, requires = "engine")]
    pub token_file: Option<std::path::PathBuf>,
    /// Skip loading the keys (they are already there).
    #[arg(long)]
    pub no_load: bool,
    /// Buckets in the client's bucket cache for remote one-sided reads
    /// (tcp, verbs; default 65536). 0: every one-sided GET reads its bucket
    /// before its record (a cold-bucket GET: two dependent reads).
    #[arg(long)]
    pub bucket_cache: Option<usize>,
    /// Before measuring, GET every key once, so the bucket cache holds the
    /// buckets of all of them (with --keys well under --bucket-cache, the
    /// measured one-sided GETs then read one record each).
    #[arg(long)]
    pub warm: bool,
    /// GETs as `Client::get_async` futures, `--pipeline` of them issued
    /// before any is awaited (one-sided over verbs and tcp: their reads in
    /// flight together, completions polled by the futures), instead of
    /// batched lookups.
    #[arg(long)]
    pub async_gets: bool,
    #[arg(long)]
    pub json: bool,
}

/// Parses `1M`, `100K`, `2G` or a plain number.
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1_000),
        Some('m' | 'M') => (&t[..t.len() - 1], 1_000_000),
        Some('g' | 'G') => (&t[..t.len() - 1], 1_000_000_000),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{s:?} is not a positive count like 1M"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Get,
    Put,
    Mix,
}

/// The key of index `i`: `key:` and 12 decimal digits.
pub fn key_name(i: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    write_key_name(&mut v, i);
    v
}

/// Writes the key of index `i` into `out` without allocating.
pub fn write_key_name(out: &mut Vec<u8>, mut i: u64) {
    out.clear();
    out.extend_from_slice(b"key:000000000000");
    for p in (4..16).rev() {
        out[p] = b'0' + (i % 10) as u8;
        i /= 10;
    }
}

/// splitmix64: a tiny, fast generator for picking keys.
struct KeyPicker(u64);

impl KeyPicker {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((u128::from(z ^ (z >> 31)) * u128::from(below)) >> 64) as u64
    }
}

/// Results of one run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KvReport {
    pub op: String,
    pub engine: String,
    pub clients: usize,
    pub pipeline: usize,
    pub value_size: usize,
    pub keys: u64,
    pub seconds: f64,
    pub ops: u64,
    pub ops_per_sec: f64,
    /// Operations per CPU second of the client threads (their own CPU time,
    /// so other load on the machine does not count against them). For RPC
    /// operations the connections' reader threads are not counted.
    pub ops_per_client_cpu_sec: f64,
    pub client_cpu_seconds: f64,
    pub latency_us: Latency,
    pub one_sided_hit_rate: f64,
    /// Buckets taken from the client's bucket cache per one-sided GET
    /// (about 1 when every bucket was cached, 0 with `--bucket-cache 0`).
    pub bucket_cache_hits_per_get: f64,
    pub one_sided_provider: Option<&'static str>,
    pub retries: u64,
    pub fallbacks: u64,
    pub errors: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// Runs the benchmark and prints its report.
pub fn run(args: BenchKvArgs) -> anyhow::Result<()> {
    let report = measure(&args)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "kv {} on {} ({} clients, pipeline {}, {} B values, {} keys): {:.0} ops/s \
             ({:.0} per client CPU second), p50 {:.2} us, p99 {:.1} us, one-sided hit rate {:.3} ({}), errors {}",
            report.op,
            report.engine,
            report.clients,
            report.pipeline,
            report.value_size,
            report.keys,
            report.ops_per_sec,
            report.ops_per_client_cpu_sec,
            report.latency_us.p50,
            report.latency_us.p99,
            report.one_sided_hit_rate,
            report.one_sided_provider.unwrap_or("off"),
            report.errors
        );
    }
    Ok(())
}

fn connect(args: &BenchKvArgs) -> anyhow::Result<(Client, String)> {
    let defaults = ClientOptions::default();
    let token = match (&args.token_file, &args.engine) {
        (Some(file), Some(_)) => crate::auth::find_token(Some(file.as_path()), None)?,
        _ => None,
    };
    let opts = ClientOptions {
        token,
        connections: args.connections.max(1),
        one_sided: !args.no_one_sided,
        bucket_cache: args.bucket_cache.unwrap_or(defaults.bucket_cache),
        ..defaults
    };
    match &args.engine {
        Some(url) => {
            let mut client = Client::connect_with(url, opts.clone())
                .with_context(|| format!("connecting to {url}"))?;
            if let Some(fabric) = &args.fabric {
                client.set_one_sided_reader(Some(fabric_reader(url, fabric, &opts)?));
            }
            Ok((client, url.clone()))
        }
        None => embedded(args, opts),
    }
}

/// The one-sided reader `--fabric` asks for.
#[cfg(feature = "rdma")]
fn fabric_reader(
    url: &str,
    fabric: &str,
    opts: &ClientOptions,
) -> anyhow::Result<crate::client::onesided::OneSidedReader> {
    use crate::fabric::verbs::{one_sided_reader, VerbsFabricArg};
    let arg = VerbsFabricArg::parse(fabric).ok_or_else(|| {
        anyhow::anyhow!("--fabric {fabric:?}: expected verbs[=DEVICE[@HOST:PORT]]")
    })??;
    one_sided_reader(url, &arg, opts.bucket_cache, opts.retry)
        .with_context(|| format!("--fabric {fabric}: connecting the verbs endpoint"))
}

#[cfg(not(feature = "rdma"))]
fn fabric_reader(
    _: &str,
    fabric: &str,
    _: &ClientOptions,
) -> anyhow::Result<crate::client::onesided::OneSidedReader> {
    anyhow::bail!("--fabric {fabric}: this ferrite was built without the `rdma` feature")
}

#[cfg(feature = "embedded")]
fn embedded(args: &BenchKvArgs, opts: ClientOptions) -> anyhow::Result<(Client, String)> {
    let record = (72 + 16 + args.value_size + 8) as u64;
    let ring = (args.keys * record * 2)
        .next_power_of_two()
        .clamp(16 << 20, 4 << 30);
    let buckets = (args.keys / 2).next_power_of_two().max(1 << 16);
    let device = (ring * 4).max(1 << 30);
    let client = crate::embedded::connect_with(opts, |c| {
        c.cache.ring_bytes = ferrite_engine::config::Size(ring);
        c.cache.buckets = buckets;
        c.cache.overflow_buckets = u32::try_from(buckets / 2).unwrap_or(u32::MAX);
        c.bdev = format!("uring:{{dir}}/target-{{i}}.bdev?size={device}");
    })
    .context("starting the embedded engine")?;
    Ok((client, "embedded".into()))
}

#[cfg(not(feature = "embedded"))]
fn embedded(_: &BenchKvArgs, _: ClientOptions) -> anyhow::Result<(Client, String)> {
    anyhow::bail!("built without the `embedded` feature: pass --engine URL")
}

/// Loads keys `0..keys` with batched PUTs from `threads` threads.
pub fn load(client: &Client, keys: u64, value_size: usize, threads: usize) -> anyhow::Result<()> {
    let value = vec![b'v'; value_size];
    let threads = threads.max(1) as u64;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let value = &value;
                s.spawn(move || -> anyhow::Result<()> {
                    let mut i = t * 256;
                    while i < keys {
                        let batch: Vec<Request> = (i..(i + 256).min(keys))
                            .map(|k| Request::Update {
                                key: Key::new(0, 0, &key_name(k), b""),
                                value: value.clone(),
                            })
                            .collect();
                        for r in client.batch(batch)? {
                            if let Reply::Error { code, message } = r {
                                anyhow::bail!("load failed: {code:?}: {message}");
                            }
                        }
                        i += threads * 256;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("load thread panicked"))??;
        }
        Ok(())
    })
}

/// GETs keys `0..keys` once each (filling the bucket cache).
fn warm(client: &Client, keys: u64) -> anyhow::Result<()> {
    let (mut name, mut out) = (Vec::with_capacity(16), Vec::new());
    for k in 0..keys {
        write_key_name(&mut name, k);
        client
            .get_into(&RecordKey::new(0, 0, &name, b""), &mut out)
            .with_context(|| format!("warming: GET of key {k}"))?;
    }
    Ok(())
}

/// Connects, loads and measures.
pub fn measure(args: &BenchKvArgs) -> anyhow::Result<KvReport> {
    let op = match args.op.as_str() {
        "get" => Op::Get,
        "put" => Op::Put,
        "mix" => Op::Mix,
        other => anyhow::bail!("--op must be get, put or mix, not {other:?}"),
    };
    let (client, engine) = connect(args)?;
    if op != Op::Put && !args.no_load {
        load(&client, args.keys, args.value_size, args.clients.max(2))?;
    }
    if op != Op::Put && args.warm {
        warm(&client, args.keys)?;
    }
    let before = client.counters();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let calibration = clock::Calibration::start();
    let results: Vec<WorkerResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.clients.max(1))
            .map(|c| {
                let (client, stop) = (&client, stop.clone());
                s.spawn(move || worker(client, args, op, c as u64, &stop))
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(args.seconds.max(0.01)));
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let ns_per_tick = calibration.ns_per_tick();
    let counters = client.counters().since(&before);
    let mut hist = new_histogram();
    let (mut ops, mut errors, mut cpu) = (0, 0, 0.0);
    for r in &results {
        let _ = hist.add(&r.latency_ns);
        ops += r.ops;
        errors += r.errors;
        cpu += r.cpu_seconds;
    }
    // Whole nanoseconds, as before the ticks.
    let to_us = |ticks: u64| (ticks as f64 * ns_per_tick).round() / 1000.0;
    let us = |q: f64| to_us(hist.value_at_quantile(q));
    Ok(KvReport {
        op: args.op.clone(),
        engine,
        clients: args.clients.max(1),
        pipeline: args.pipeline.max(1),
        value_size: args.value_size,
        keys: args.keys,
        seconds: elapsed,
        ops,
        ops_per_sec: ops as f64 / elapsed,
        ops_per_client_cpu_sec: if cpu > 0.0 { ops as f64 / cpu } else { 0.0 },
        client_cpu_seconds: cpu,
        latency_us: Latency {
            p50: us(0.5),
            p99: us(0.99),
            p999: us(0.999),
            max: to_us(hist.max()),
        },
        one_sided_hit_rate: counters.one_sided_hit_rate(),
        bucket_cache_hits_per_get: match counters.one_sided_hits + counters.fallbacks {
            0 => 0.0,
            n => counters.cache_hits as f64 / n as f64,
        },
        one_sided_provider: client.one_sided_provider(),
        retries: counters.retries,
        fallbacks: counters.fallbacks,
        errors,
    })
}

/// Latencies in ticks of `clock::ticks`.
fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap_or_else(|_| {
        Histogram::new(3).unwrap_or_else(|_| unreachable!("3 sig figs is valid"))
    })
}

/// Buffers of one batch of one-sided GETs.
struct Batch {
    names: Vec<Vec<u8>>,
    outs: Vec<Vec<u8>>,
}

/// Eight batches of `--pipeline` one-sided GETs with overlapped accesses
/// (shm: prefetched loads; verbs: one doorbell for the buckets, one for the
/// records); the first batch's time is recorded as each of its GETs'
/// latency. Returns (ops, errors).
fn get_batches(
    client: &Client,
    args: &BenchKvArgs,
    rng: &mut KeyPicker,
    hist: &mut Histogram<u64>,
    batch: &mut Batch,
) -> (u64, u64) {
    let (mut ops, mut errors) = (0, 0);
    for round in 0..8 {
        for name in batch.names.iter_mut() {
            write_key_name(name, rng.next(args.keys));
        }
        let keys: Vec<RecordKey<'_>> = batch
            .names
            .iter()
            .map(|n| RecordKey::new(0, 0, n, b""))
            .collect();
        let t0 = clock::ticks();
        let results = client.get_many_into(&keys, &mut batch.outs);
        if round == 0 {
            let _ = hist.record_n(clock::since(t0), keys.len() as u64);
        }
        ops += keys.len() as u64;
        match results {
            Ok(rs) => {
                for (r, out) in rs.iter().zip(&batch.outs) {
                    if !matches!(r, Ok(Some(_))) || out.len() != args.value_size {
                        errors += 1;
                    }
                }
            }
            Err(_) => errors += keys.len() as u64,
        }
    }
    (ops, errors)
}

/// `depth` GETs as futures, all issued before they are awaited together;
/// the time of the whole round is recorded as each GET's latency. Returns
/// (ops, errors).
fn get_async_round(
    client: &Client,
    args: &BenchKvArgs,
    rng: &mut KeyPicker,
    hist: &mut Histogram<u64>,
    depth: usize,
) -> (u64, u64) {
    let t0 = clock::ticks();
    let gets: Vec<_> = (0..depth)
        .map(|_| client.get_async(&Key::new(0, 0, &key_name(rng.next(args.keys)), b"")))
        .collect();
    let results = futures::executor::block_on(futures::future::join_all(gets));
    let _ = hist.record_n(clock::since(t0), depth as u64);
    let errors = results
        .iter()
        .filter(|r| !matches!(r, Ok(Some(f)) if f.value.len() == args.value_size))
        .count();
    (depth as u64, errors as u64)
}

/// Sends each request as its own frame, all before awaiting any.
fn pipelined(client: &Client, requests: &[Request]) -> Result<Vec<Reply>, ()> {
    let futures: Vec<_> = requests.iter().map(|r| client.request_async(r)).collect();
    futures
        .into_iter()
        .map(|f| f.wait().map_err(|_| ()))
        .collect()
}

struct WorkerResult {
    latency_ns: Histogram<u64>,
    ops: u64,
    errors: u64,
    cpu_seconds: f64,
}

/// CPU time this thread has used.
fn thread_cpu_seconds() -> f64 {
    // SAFETY: clock_gettime writes the zeroed timespec we own.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid clock id and out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// One client thread: ops until `stop`.
fn worker(client: &Client, args: &BenchKvArgs, op: Op, id: u64, stop: &AtomicBool) -> WorkerResult {
    let cpu_start = thread_cpu_seconds();
    let mut rng = KeyPicker(0x5eed_u64.wrapping_mul(id + 1));
    let mut hist = new_histogram();
    let (mut ops, mut errors) = (0u64, 0u64);
    let value = vec![b'w'; args.value_size];
    let mut out = Vec::with_capacity(args.value_size + 256);
    let mut name = Vec::with_capacity(32);
    let depth = args.pipeline.max(1);
    // Providers whose one-sided GETs batch well: shm (prefetched loads) and
    // verbs (one doorbell per list of reads).
    let one_sided_local = matches!(client.one_sided_provider(), Some("shm" | "verbs"));
    let mut batch = Batch {
        names: vec![Vec::with_capacity(16); depth],
        outs: vec![Vec::with_capacity(args.value_size + 256); depth],
    };
    while !stop.load(Ordering::Relaxed) {
        let is_get = match op {
            Op::Get => true,
            Op::Put => false,
            Op::Mix => rng.next(10) != 0,
        };
        if is_get && args.async_gets {
            let (g, e) = get_async_round(client, args, &mut rng, &mut hist, depth);
            ops += g;
            errors += e;
            continue;
        }
        if is_get && one_sided_local && depth > 1 {
            let (g, e) = get_batches(client, args, &mut rng, &mut hist, &mut batch);
            ops += g;
            errors += e;
            continue;
        }
        if is_get && (one_sided_local || depth == 1) {
            // Latency of every 8th GET (recording it costs about what a
            // one-sided GET does on an emulated CPU).
            for i in 0..64 {
                write_key_name(&mut name, rng.next(args.keys));
                let t0 = (i % 8 == 0).then(clock::ticks);
                let r = client.get_into(&RecordKey::new(0, 0, &name, b""), &mut out);
                if let Some(t0) = t0 {
                    let _ = hist.record(clock::since(t0));
                }
                ops += 1;
                match r {
                    Ok(Some(_)) if out.len() == args.value_size => {}
                    _ => errors += 1,
                }
            }
            continue;
        }
        let t0 = clock::ticks();
        let requests: Vec<Request> = (0..depth)
            .map(|_| {
                let key = Key::new(0, 0, &key_name(rng.next(args.keys)), b"");
                if is_get {
                    Request::Fetch { key }
                } else {
                    Request::Update {
                        key,
                        value: value.clone(),
                    }
                }
            })
            .collect();
        let replies = if args.frames || depth == 1 {
            pipelined(client, &requests)
        } else {
            client.batch(requests).map_err(|_| ())
        };
        let _ = hist.record_n(clock::since(t0), depth as u64);
        ops += depth as u64;
        match replies {
            Ok(rs) => {
                errors += rs
                    .iter()
                    .filter(|r| !matches!(r, Reply::Version(_) | Reply::Value(Some(_))))
                    .count() as u64;
            }
            Err(()) => errors += depth as u64,
        }
    }
    WorkerResult {
        latency_ns: hist,
        ops,
        errors,
        cpu_seconds: thread_cpu_seconds() - cpu_start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_parse() {
        assert_eq!(parse_count("1M"), Ok(1_000_000));
        assert_eq!(parse_count("100k"), Ok(100_000));
        assert_eq!(parse_count("42"), Ok(42));
        assert!(parse_count("0").is_err());
        assert!(parse_count("xM").is_err());
        assert_eq!(key_name(7), b"key:000000000007");
    }
}
