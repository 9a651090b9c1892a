//! `ferrite bench store`: the record store in-process, no network.
//!
//! For each device (`malloc`, `pmem`, `uring`) and value size (64 B, 4 KiB,
//! 1 MiB by default) on one xstream: durable updates/s with `--concurrency`
//! tasks updating at once (group commit), fetches/s of resident records on
//! the xstream (per wall second and per CPU second of the xstream's thread)
//! and their p50/p99 latency (per call), three ways: `fetch_one_per_call`,
//! one task, one key per `Store::fetch` call (what a lone RPC GET costs the
//! target); `fetch_concurrent`, `--concurrency` tasks at once (the updates'
//! concurrency), each one key per `Store::fetch` call (GETs of as many
//! connections: each fetch yields after starting its bucket's and its
//! record's loads, so the tasks' cache misses overlap); and
//! `fetch_served_batch16`, one task, 16 keys per `Store::fetch_batch` call, the path
//! the engine serves batch frames and bursts of pipelined GETs with (each
//! target's fetches of a batch, or of the requests read in together, go to
//! one `fetch_batch`: `target::handle_fetches`), here with a client
//! pipelining 16; and DRAM metadata bytes per key: the bucket region, the
//! key directory's own count, the heap growth (glibc `mallinfo2`, all
//! arenas, glibc's per-thread cache of free chunks filled before both
//! readings) over the load (the bench's own latency histogram dropped first), and
//! their total `metadata_bytes_per_key` (bucket region + bucket free list +
//! the larger of the directory's count and the heap growth), with the load
//! factor it was measured at (`bucket_load`: used slots over all slots) and
//! the mean buckets a one-sided reader walks to a key's slot. Beside the
//! fetch rates, the host's dependent-load latency over a buffer the size of
//! the fetches' working set (bucket region and live records), measured on
//! the same core in the same run, and the one-per-call rate of fetches that
//! were nothing but their two dependent loads over it
//! (`fetch_one_per_call_memory_only`): a resident fetch is a bucket load,
//! then a load of the record the slot points at.
//! The bucket table has the engine's default shape (overflow pool a quarter
//! of the main area) and the smallest main area (any count) that holds the
//! keys at a load of at most `--load`, so the measured load is `--load`
//! (within 1 %). Then, per device, 4 KiB overwrites with the cleaner idle and
//! with the cleaner busy, to compare foreground latency, and the log's use
//! over the live data at the end (`log_used_over_live`) and at its highest
//! during the busy rounds (`log_used_over_live_peak`, sampled every 2 ms).
//!
//! With `--json` each figure is one line
//! `{"name","unit","ferrite","peer","peer_name","ratio"}` (peer fields null;
//! `hack/bench-rocksdb` fills them with RocksDB's figures).

use std::path::PathBuf;

mod chase;
#[cfg(feature = "embedded")]
mod common;
#[cfg(feature = "embedded")]
mod fetch;
#[cfg(feature = "embedded")]
mod fill;

/// Arguments of `ferrite bench store`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchStoreArgs {
    #[arg(long)]
    pub json: bool,
    /// Devices to run on: malloc, pmem, uring.
    #[arg(long, value_delimiter = ',', default_value = "malloc,pmem,uring")]
    pub bdevs: Vec<String>,
    /// Value sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "64,4096,1048576")]
    pub sizes: Vec<usize>,
    /// Update tasks in flight on the xstream.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Keys per case: at most this many ...
    #[arg(long, default_value_t = 100_000)]
    pub max_keys: usize,
    /// ... and at most this many MiB of values (1000: a thousand 1 MiB
    /// values, all resident in a 1 GiB ring; with 256 the bucket region's
    /// last page alone was 16 bytes per key).
    #[arg(long, default_value_t = 1000)]
    pub data_mib: usize,
    /// Directory for the pmem and uring files (default: a new temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Skip the cleaner idle-vs-busy case.
    #[arg(long)]
    pub no_cleaner: bool,
    /// Run only the fill case at these levels (percent of the log's usable
    /// capacity, e.g. 0,10,50,70,85): 4 KiB overwrites/s on a store that
    /// full against the first level's, the cleaner's bytes copied per byte
    /// written, and the latency of the first write refused at the ceiling
    /// (`bench_store/fill.rs`).
    #[arg(long, value_delimiter = ',', conflicts_with = "cleaner_only")]
    pub fill_levels: Vec<u8>,
    /// Device size of the fill case, MiB.
    #[arg(long, default_value_t = 256)]
    pub fill_device_mib: u64,
    /// Run only the cleaner idle-vs-busy case (no update/fetch cases).
    #[arg(long, conflicts_with = "no_cleaner")]
    pub cleaner_only: bool,
    /// Blocks of the cleaner case: each two rounds of updates to a store
    /// whose cleaner runs, then one to a store that needs none. The
    /// device's own speed drifts over tenths of a second, so the more
    /// blocks, the less that drift weighs on one side of the comparison.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u8).range(1..=50))]
    pub cleaner_blocks: u8,
    /// Keys of the cleaner case (4 KiB values each). With 4096 (16 MiB,
    /// eight log segments) a segment is an eighth of the live data, and the
    /// room a cleaning pass needs pushes writes against the disk budget.
    #[arg(long, default_value_t = 16384, value_parser = clap::value_parser!(u64).range(1024..=262_144))]
    pub cleaner_keys: u64,
    /// Keys of the cleaner case's updates that do not go to its hot tenth
    /// of the keys (one in ten): `random`, a different random key each
    /// time; `fixed`, the same keys every round (as until 2026-12-07),
    /// whose records then all die a round after they are written.
    #[arg(long, value_enum, default_value_t = ColdKeys::Random)]
    pub cleaner_cold_keys: ColdKeys,
    /// Both stores of the cleaner case append every update at the hot head
    /// (`StoreConfig::cold_writes` off), for a side-by-side comparison.
    #[arg(long)]
    pub no_cold_writes: bool,
    /// Fetches per fetch figure (default: 4 GiB of values, at least every
    /// key once, at most 4 million).
    #[arg(long)]
    pub fetches: Option<u64>,
    /// Largest fill of the bucket table (keys over all slots) to size it
    /// for; chaining with the default overflow pool fills to about 0.66.
    #[arg(long, default_value_t = 0.6)]
    pub load: f64,
}

/// Which keys the cleaner case's one update in ten goes to.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColdKeys {
    Random,
    Fixed,
}

/// One figure of the run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Figure {
    pub name: String,
    pub unit: &'static str,
    pub ferrite: f64,
}

/// Runs the benchmark and prints its figures.
pub fn run(args: BenchStoreArgs) -> anyhow::Result<()> {
    #[cfg(feature = "embedded")]
    {
        let figures = imp::run_all(&args)?;
        for f in &figures {
            if args.json {
                let line = serde_json::json!({
                    "name": f.name, "unit": f.unit, "ferrite": f.ferrite,
                    "peer": null, "peer_name": null, "ratio": null,
                });
                println!("{line}");
            } else {
                let digits = if f.unit == "ratio" { 3 } else { 1 };
                println!("{:<44} {:>16.digits$} {}", f.name, f.ferrite, f.unit);
            }
        }
        Ok(())
    }
    #[cfg(not(feature = "embedded"))]
    {
        let _ = args;
        anyhow::bail!(
            "bench store needs the engine: build ferrite-client with the `embedded` feature"
        )
    }
}

#[cfg(feature = "embedded")]
mod imp {
    use super::common::{
        config, device_file, device_spec, histogram, key, key_bytes, on_xstream, write_whole,
    };
    use super::fetch::{fetch_concurrent, fetch_many, FETCH_BATCH};
    use super::fill::fill_case;
    use super::{BenchStoreArgs, ColdKeys, Figure};
    use anyhow::Context;
    use ferrite_engine::store::{Store, StoreConfig, StoreStats};
    use ferrite_proto::bucket::SLOTS_PER_BUCKET;
    use hdrhistogram::Histogram;
    use std::cell::RefCell;
    use std::path::Path;
    use std::rc::Rc;
    use std::time::Instant;

    pub fn run_all(args: &BenchStoreArgs) -> anyhow::Result<Vec<Figure>> {
        let tmp;
        let dir = match &args.dir {
            Some(d) => d.clone(),
            None => {
                tmp = tempfile::tempdir().context("creating a temp dir for device files")?;
                tmp.path().to_path_buf()
            }
        };
        let mut figures = Vec::new();
        if !args.fill_levels.is_empty() {
            for kind in &args.bdevs {
                let (levels, mib) = (&args.fill_levels, args.fill_device_mib);
                let measured = fill_case(kind, &dir, levels, mib, args.concurrency.max(1))?;
                figures.extend(measured.into_iter().map(|(name, unit, ferrite)| Figure {
                    name,
                    unit,
                    ferrite,
                }));
            }
            return Ok(figures);
        }
        for kind in &args.bdevs {
            for &size in args.sizes.iter().filter(|_| !args.cleaner_only) {
                let r = case(args, kind, size, &dir);
                let _ = std::fs::remove_file(device_file(&dir, &format!("{kind}-{size}")));
                figures.extend(r?);
            }
            if !args.no_cleaner {
                let r = cleaner_case(args, kind, &dir);
                let _ = std::fs::remove_file(device_file(&dir, &format!("{kind}-cleaner")));
                figures.extend(r?);
            }
        }
        Ok(figures)
    }

    /// Samples the store's log use over its live data every 2 ms (on the
    /// store's xstream) until the task is cancelled; the cell holds the
    /// highest ratio. (Dead segments of single values are freed as their
    /// last record dies, so the idle rounds before leave the log at about
    /// the live data, and the whole busy phase is sampled.)
    fn sample_peak_used_over_live(
        s: &Rc<Store>,
    ) -> (Rc<std::cell::Cell<f64>>, glommio::task::JoinHandle<()>) {
        let peak = Rc::new(std::cell::Cell::new(0.0f64));
        let (s, cell) = (s.clone(), peak.clone());
        let task = glommio::spawn_local(async move {
            loop {
                let st = s.stats();
                if st.live_bytes > 0 {
                    let ratio = st.log_used_bytes as f64 / st.live_bytes as f64;
                    cell.set(cell.get().max(ratio));
                }
                glommio::timer::sleep(std::time::Duration::from_millis(2)).await;
            }
        })
        .detach();
        (peak, task)
    }

    /// Updates every key once with `concurrency` tasks; returns (elapsed s,
    /// latency histogram in ns).
    async fn update_all(
        s: &Rc<Store>,
        keys: usize,
        size: usize,
        concurrency: usize,
        round: u8,
    ) -> anyhow::Result<(f64, Histogram<u64>)> {
        update_keys(s, keys, size, concurrency, round, |i: usize| i).await
    }

    /// Updates `keys` keys, the i-th being `pick(i)`.
    async fn update_keys(
        s: &Rc<Store>,
        keys: usize,
        size: usize,
        concurrency: usize,
        round: u8,
        pick: impl Fn(usize) -> usize + Copy + 'static,
    ) -> anyhow::Result<(f64, Histogram<u64>)> {
        let hist = Rc::new(RefCell::new(histogram()));
        let start = Instant::now();
        let tasks: Vec<_> = (0..concurrency)
            .map(|t| {
                let (s, hist) = (s.clone(), hist.clone());
                glommio::spawn_local(async move {
                    let value = vec![round.wrapping_add(t as u8); size];
                    for i in (t..keys).step_by(concurrency) {
                        let k = key_bytes(pick(i) % keys);
                        let t0 = Instant::now();
                        s.update(&key(&k), &value).await?;
                        let _ = hist.borrow_mut().record(t0.elapsed().as_nanos() as u64);
                    }
                    anyhow::Ok(())
                })
            })
            .collect();
        for t in tasks {
            t.await?;
        }
        let elapsed = start.elapsed().as_secs_f64();
        let h = hist.borrow().clone();
        Ok((elapsed, h))
    }

    /// Bytes the C allocator has handed out and not taken back, over all
    /// arenas (glibc `mallinfo2`), with the thread's cache of free chunks
    /// filled first ([`fill_thread_cache`]); `None` elsewhere.
    fn heap_in_use() -> Option<usize> {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            fill_thread_cache();
            // SAFETY: mallinfo2 has no preconditions.
            let m = unsafe { libc::mallinfo2() };
            Some(m.uordblks + m.hblkhd)
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        None
    }

    /// Fills glibc's per-thread cache of free chunks (tcache: up to 7 free
    /// chunks of each size up to about 1 KiB by default, which `mallinfo2`
    /// counts as in use), so that two heap readings each taken right after
    /// this differ by what was allocated in between, not by what that cache
    /// happened to hold (up to ~240 KiB, whatever the key count: 1.9 bytes
    /// per key at 65 536 keys).
    fn fill_thread_cache() {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            // Requests of 24 + 16 k bytes take chunks of 32 + 16 k: every
            // size the cache keeps (up to 1,040-byte chunks).
            let mut held = Vec::with_capacity(64 * 16);
            for size in (24..=1032).step_by(16) {
                for _ in 0..16 {
                    // SAFETY: malloc has no preconditions; each pointer is
                    // freed below exactly once (free(NULL) is a no-op).
                    held.push(unsafe { libc::malloc(size) });
                }
            }
            for p in held {
                // SAFETY: p came from malloc above and is freed once.
                unsafe { libc::free(p) };
            }
        }
    }

    fn case(
        args: &BenchStoreArgs,
        kind: &str,
        size: usize,
        dir: &Path,
    ) -> anyhow::Result<Vec<Figure>> {
        let keys = (args.data_mib << 20)
            .div_euclid(size)
            .clamp(1, args.max_keys);
        let record = size + 128;
        let ring = ((keys * record) as u64 + (8 << 20))
            .next_power_of_two()
            .clamp(64 << 20, 1 << 30);
        let device_bytes = (4 * (keys * record) as u64 + 4 * ring).max(256 << 20);
        let device_bytes = device_bytes.div_ceil(1 << 20) << 20;
        let spec = device_spec(kind, dir, &format!("{kind}-{size}"), device_bytes)?;
        let concurrency = args.concurrency.max(1);
        let fetch_ops = args
            .fetches
            .unwrap_or_else(|| ((4u64 << 30) / size as u64).clamp(keys as u64, 4_000_000));
        let label = format!("{kind}.{}", size_label(size));
        let load = args.load;
        let figures = on_xstream(move || {
            Box::new(async move {
                let bdev = ferrite_bdev::open(&spec).with_context(|| format!("opening {spec}"))?;
                let s = Rc::new(Store::open(bdev, config(keys, load, ring)).await?);
                let heap0 = heap_in_use();
                let (secs, up) = update_all(&s, keys, size, concurrency, 1).await?;
                let q = |h: &Histogram<u64>, p| h.value_at_quantile(p) as f64 / 1e3;
                let (up50, up99) = (q(&up, 0.5), q(&up, 0.99));
                // The latency histogram (~250 KiB) is the bench's, not the
                // store's: gone before the heap is measured.
                drop(up);
                let heap = heap_in_use().zip(heap0).map(|(a, b)| a.saturating_sub(b));
                let one = fetch_many(&s, keys, size, fetch_ops, 1).await?;
                let concurrent = fetch_concurrent(&s, keys, size, fetch_ops, concurrency).await?;
                let served = fetch_many(&s, keys, size, fetch_ops, FETCH_BATCH).await?;
                let st = s.stats();
                let f = |name: &str, unit: &'static str, v: f64| Figure {
                    name: format!("store.{name}.{label}"),
                    unit,
                    ferrite: v,
                };
                let mut out = vec![
                    f("update", "ops/s", keys as f64 / secs),
                    f("update_p50", "us", up50),
                    f("update_p99", "us", up99),
                ];
                for (name, run) in [
                    ("fetch_one_per_call", &one),
                    ("fetch_concurrent", &concurrent),
                    ("fetch_served_batch16", &served),
                ] {
                    out.extend([
                        f(name, "ops/s", run.ops as f64 / run.secs),
                        f(
                            &format!("{name}_per_cpu"),
                            "ops/cpu-s",
                            run.ops as f64 / run.cpu_secs,
                        ),
                        f(&format!("{name}_p50"), "us", q(&run.hist, 0.5)),
                        f(&format!("{name}_p99"), "us", q(&run.hist, 0.99)),
                    ]);
                }
                out.push(f(
                    "commits_per_update",
                    "ratio",
                    st.commits as f64 / keys as f64,
                ));
                for (name, unit, v) in memory_figures(&s, heap) {
                    out.push(f(name, unit, v));
                }
                for (name, unit, v) in memory_only(&st) {
                    out.push(f(name, unit, v));
                }
                Ok(out)
            })
        })?;
        Ok(figures)
    }

    /// DRAM metadata per key, its parts, the load of the bucket table and
    /// the mean buckets a reader walks; `heap`: heap growth over the load.
    fn memory_figures(s: &Store, heap: Option<usize>) -> Vec<(&'static str, &'static str, f64)> {
        let st = s.stats();
        let per_key = |b: usize| b as f64 / st.keys.max(1) as f64;
        let heap_side = st.directory_bytes.max(heap.unwrap_or(0));
        let total = st.bucket_region_bytes + st.bucket_free_list_bytes + heap_side;
        let slots = st.bucket_count_total as usize * SLOTS_PER_BUCKET;
        let mut out = vec![
            ("bucket_bytes_per_key", "B", per_key(st.bucket_region_bytes)),
            ("directory_bytes_per_key", "B", per_key(st.directory_bytes)),
        ];
        if let Some(h) = heap {
            out.push(("heap_bytes_per_key", "B", per_key(h)));
        }
        out.extend([
            ("metadata_bytes_per_key", "B", per_key(total)),
            (
                "bucket_load",
                "ratio",
                st.bucket_slots_used as f64 / slots.max(1) as f64,
            ),
            ("bucket_reads_per_key", "ratio", s.mean_bucket_reads()),
        ]);
        out
    }

    /// Dependent loads timed per latency figure.
    const CHASE_LOADS: usize = 2_000_000;

    /// The host's dependent-load latency over a buffer the size of the
    /// bucket region and the live records together (the fetches' working
    /// set), and the one-per-call rate of fetches that were nothing but
    /// their loads: a resident fetch loads the key's bucket, then the record
    /// whose address the bucket holds, two dependent loads over that set.
    fn memory_only(st: &StoreStats) -> [(&'static str, &'static str, f64); 2] {
        let set = st.bucket_region_bytes + st.live_bytes as usize;
        let ns = super::chase::dependent_load_ns(set, CHASE_LOADS);
        [
            ("host_load_ns_over_working_set", "ns", ns),
            ("fetch_one_per_call_memory_only", "ops/s", 1e9 / (2.0 * ns)),
        ]
    }

    fn size_label(size: usize) -> String {
        match size {
            s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{}MiB", s >> 20),
            s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{}KiB", s >> 10),
            s => format!("{s}B"),
        }
    }

    /// The median of `v` (the mean of the middle two if even; 0 if empty).
    fn median(v: &mut [f64]) -> f64 {
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => 0.0,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    /// Nine updates in ten go to a tenth of the `keys`. The tenth goes,
    /// with [`ColdKeys::Random`], to any key, a different one each round
    /// (the round is hashed in), so records of every age die at random
    /// and the cleaner has live records of every age to copy; with
    /// [`ColdKeys::Fixed`], to the same keys every round. (Until 2026-12-07
    /// only the latter: once the store put those keys' records in segments
    /// of their own, `cold.rs`, they died whole a round later and the
    /// cleaner seldom ran.)
    fn skewed(keys: usize, round: u8, cold: ColdKeys) -> impl Fn(usize) -> usize + Copy + 'static {
        let hot = (keys / 10).max(1);
        move |i| {
            let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 7;
            match (i % 10, cold) {
                (0, ColdKeys::Fixed) => h,
                // The high bits of the product depend on every input bit.
                (0, ColdKeys::Random) => {
                    (i << 8 | usize::from(round)).wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 24
                }
                _ => h % hot,
            }
        }
    }

    /// 4 KiB overwrites of `--cleaner-keys` keys (64 MiB by default), 90 %
    /// of them to a tenth of the keys and the rest to any key
    /// (`--cleaner-cold-keys`, [`skewed`]), on two stores side by side on the
    /// same kind of device: one whose log is four times the live data,
    /// where the cleaner runs and copies cold keys to keep disk use within
    /// twice the live data, and one whose log holds every round the bench
    /// writes, where the cleaner is never started. Each is first loaded
    /// with every key, then `blocks` times: two skewed rounds on the
    /// cleaned store ("busy") and one on the other ("idle"). Both see the
    /// same workload, and the rounds alternate so that both see the same
    /// device: run after run on one host, the idle p99 of three idle
    /// rounds run first ranged 377-1025 us, and the ratio with it. And many
    /// blocks, because the device's speed drifts within a run too: 64 KiB
    /// synchronous writes one at a time ran at 245-545 MB/s from one tenth
    /// of a second to the next (fio on the test host); a block of the
    /// default size takes about a second. (Until 2026-12 the idle rounds
    /// rewrote every key of the cleaned store with its cleaner stopped,
    /// which also freed every segment the cold keys had been copied to, so
    /// that each block's cleaner copied the cold data again.)
    fn cleaner_case(args: &BenchStoreArgs, kind: &str, dir: &Path) -> anyhow::Result<Vec<Figure>> {
        let (keys, size) = (args.cleaner_keys as usize, 4096usize);
        let live = (keys * size) as u64;
        // The idle store's log takes the first round and one a block.
        let (bytes, idle_bytes) = (6 * live, (u64::from(args.cleaner_blocks) + 4) * live);
        let spec = device_spec(kind, dir, &format!("{kind}-cleaner"), bytes)?;
        let idle_spec = device_spec(kind, dir, &format!("{kind}-no-cleaner"), idle_bytes)?;
        if kind != "malloc" {
            // Every block allocated before a store opens it, as on a
            // deployed device: the first writes into a sparse file pay for
            // allocating it.
            write_whole(&device_file(dir, &format!("{kind}-cleaner")), bytes)?;
            write_whole(&device_file(dir, &format!("{kind}-no-cleaner")), idle_bytes)?;
        }
        let concurrency = args.concurrency.max(1);
        let label = kind.to_string();
        let (args_load, blocks) = (args.load, args.cleaner_blocks);
        let (cold_keys, no_cold_writes) = (args.cleaner_cold_keys, args.no_cold_writes);
        on_xstream(move || {
            Box::new(async move {
                let cfg = StoreConfig {
                    ring_bytes: 16 << 20,
                    checkpoint_bytes: 4 << 20,
                    // The log is allocated and cleaned by segment, and 2 MiB
                    // still holds 1 MiB values.
                    segment_bytes: 2 << 20,
                    cold_writes: !no_cold_writes,
                    ..config(keys, args_load, 16 << 20)
                };
                let open = |spec: String, cfg: StoreConfig| async move {
                    let bdev =
                        ferrite_bdev::open(&spec).with_context(|| format!("opening {spec}"))?;
                    anyhow::Ok(Rc::new(Store::open(bdev, cfg).await?))
                };
                let s = open(spec, cfg.clone()).await?;
                let uncleaned = open(idle_spec, cfg).await?;
                update_all(&s, keys, size, concurrency, 0).await?;
                update_all(&uncleaned, keys, size, concurrency, 0).await?;
                let (peak, sampler) = sample_peak_used_over_live(&s);
                let (mut idle, mut busy) = (histogram(), histogram());
                // Store counters before and after each busy pair of rounds.
                let mut windows = Vec::new();
                let mut block_ratios = Vec::new();
                let mut busy_secs = 0.0;
                let q = |h: &Histogram<u64>, p| h.value_at_quantile(p) as f64 / 1e3;
                for block in 0..blocks {
                    let before = s.stats();
                    let cleaner = s.spawn_cleaner();
                    let start = Instant::now();
                    let mut block_busy = histogram();
                    for round in [1 + 3 * block, 2 + 3 * block] {
                        let pick = skewed(keys, round, cold_keys);
                        let (_, h) = update_keys(&s, keys, size, concurrency, round, pick).await?;
                        block_busy.add(&h).map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    }
                    busy_secs += start.elapsed().as_secs_f64();
                    s.stop_cleaner();
                    cleaner.await;
                    windows.push((before, s.stats()));
                    let round = 3 + 3 * block;
                    let pick = skewed(keys, round, cold_keys);
                    let (_, h) =
                        update_keys(&uncleaned, keys, size, concurrency, round, pick).await?;
                    block_ratios.push(q(&block_busy, 0.99) / q(&h, 0.99).max(1e-9));
                    busy.add(&block_busy)
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    idle.add(&h).map_err(|e| anyhow::anyhow!("{e:?}"))?;
                }
                let peak_used_over_live = peak.get();
                sampler.cancel();
                let st = s.stats();
                // How much a counter grew over the busy rounds.
                let grew = |c: fn(&StoreStats) -> u64| {
                    windows.iter().map(|(b, a)| c(a) - c(b)).sum::<u64>() as f64
                };
                if grew(|c| c.cleaner_passes) == 0.0 {
                    // Overwrites freed every segment whole: busy and idle
                    // are then the same store.
                    tracing::warn!("cleaner case on {label}: the cleaner never ran a pass");
                }
                let f = |name: &str, unit: &'static str, v: f64| Figure {
                    name: format!("store.cleaner.{name}.{label}.4KiB"),
                    unit,
                    ferrite: v,
                };
                Ok(vec![
                    f("idle_p50", "us", q(&idle, 0.5)),
                    f("idle_p99", "us", q(&idle, 0.99)),
                    f("busy_p50", "us", q(&busy, 0.5)),
                    f("busy_p99", "us", q(&busy, 0.99)),
                    f(
                        "busy_over_idle_p99",
                        "ratio",
                        q(&busy, 0.99) / q(&idle, 0.99).max(1e-9),
                    ),
                    // A device stall lands in one block's busy or idle
                    // rounds and sways the pooled p99s; the median block
                    // does not see it.
                    f(
                        "busy_over_idle_p99_block_median",
                        "ratio",
                        median(&mut block_ratios),
                    ),
                    f("busy_update", "ops/s", busy.len() as f64 / busy_secs),
                    f("passes", "count", grew(|c| c.cleaner_passes)),
                    f("wall_waits", "count", grew(|c| c.cleaner_wall_waits)),
                    f("wait_timeouts", "count", grew(|c| c.cleaner_wait_timeouts)),
                    f("checkpoints", "count", grew(|c| c.checkpoints)),
                    f("commits", "count", grew(|c| c.commits)),
                    f("bytes_copied", "B", grew(|c| c.cleaner_bytes_copied)),
                    f("cold_writes", "count", grew(|c| c.cold_writes)),
                    f("bytes_appended", "B", grew(|c| c.bytes_appended)),
                    f(
                        "log_used_over_live",
                        "ratio",
                        st.log_used_bytes as f64 / st.live_bytes.max(1) as f64,
                    ),
                    f("log_used_over_live_peak", "ratio", peak_used_over_live),
                ])
            })
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The bench runs where the engine's stores run: on an xstream, so
        /// that a `uring` channel's reaper sleeps without holding the core
        /// as it does there.
        #[test]
        fn the_bench_runs_on_an_xstream_pinned_to_core_0() {
            let on = on_xstream(|| {
                Box::new(async {
                    // SAFETY: sched_getcpu takes nothing and only reads.
                    let cpu = unsafe { libc::sched_getcpu() };
                    anyhow::Ok((ferrite_xstream::current(), cpu))
                })
            })
            .unwrap();
            assert_eq!(on, (Some(ferrite_xstream::XstreamId(0)), 0));
        }

        #[test]
        fn median_of_odd_even_and_no_values() {
            assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
            assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
            assert_eq!(median(&mut []), 0.0);
        }

        /// Chunks freed into glibc's per-thread cache between two heap
        /// readings do not count as growth (without filling the cache
        /// first they read as ~240 KiB in use).
        #[test]
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        fn heap_readings_ignore_the_thread_cache() {
            let Some(before) = heap_in_use() else {
                return;
            };
            for size in (24..=1032).step_by(16) {
                let held: Vec<Vec<u8>> = (0..16).map(|_| Vec::with_capacity(size)).collect();
                drop(held);
            }
            let grown = heap_in_use().unwrap_or(0).saturating_sub(before);
            assert!(grown < 32 << 10, "{grown} bytes counted");
        }

        /// The table the bench opens has the engine's default shape and
        /// holds the keys at the stated load, within 1 % below it: main
        /// areas need not be powers of two.
        #[test]
        fn table_is_sized_for_the_stated_load() {
            for load in [0.5, 0.6] {
                for keys in [10_000usize, 100_000, 1_000_000, 1_179_648, 3_000_000] {
                    let c = config(keys, load, 64 << 20);
                    assert_eq!(c.overflow_buckets, (c.bucket_count / 4) as u32);
                    let slots =
                        (c.bucket_count + u64::from(c.overflow_buckets)) * SLOTS_PER_BUCKET as u64;
                    let fill = keys as f64 / slots as f64;
                    assert!(fill <= load && fill > load * 0.99, "{keys} keys: {fill}");
                }
            }
        }

        /// Few keys (the 1 MiB case has 1000) get a table sized for them:
        /// under 36 bytes of buckets per key at the default load (a floor of
        /// 1024 main buckets made 256 keys' 320).
        #[test]
        fn few_keys_get_a_table_sized_for_them() {
            for keys in [256usize, 1000, 4096] {
                let c = config(keys, 0.6, 64 << 20);
                let buckets = c.bucket_count + u64::from(c.overflow_buckets);
                let per_key = (buckets * 64) as f64 / keys as f64;
                assert!(per_key < 36.0, "{keys} keys: {per_key} B of buckets each");
            }
        }
    }
}
