//! The cleaner case of `ferrite bench store`: 4 KiB overwrites of a 16 MiB
//! live set (4096 keys) on a 96 MiB device, with the cleaner idle (nothing
//! to clean) and busy, to compare foreground latency, and the log's use
//! over the live data.
//!
//! Phases, in order, on one xstream with `--concurrency` update tasks:
//! 1. Two closed-loop rounds over every key, no cleaner running (the log
//!    ends at twice the live data): `idle_*`, `idle_update`.
//! 2. Open loop, no cleaner running: one update per key's worth (4096) of
//!    the skewed pattern below, arriving at a fixed rate, half of
//!    `idle_update` (the rate is `open_rate`): `open_idle_*`.
//! 3. The cleaner starts and catches up with the backlog phases 1 and 2
//!    left (their old records are dead: it copies next to nothing), until
//!    cleaning is no longer wanted. The log's use is sampled from here on.
//! 4. Six closed-loop skewed rounds (nine updates in ten go to a tenth of
//!    the keys, so the oldest segments keep live cold records to copy)
//!    with the cleaner running: `busy_*`, `busy_update`.
//! 5. Open loop at `open_rate` with the same skewed pattern and the
//!    cleaner running: `open_busy_*`.
//!
//! Closed loop (`idle_*`, `busy_*`): every task issues its next update when
//! the last one returns. At saturation this measures throughput: whatever
//! work the cleaner adds, a closed loop waits for (Little's law: latency =
//! tasks / throughput), so `busy_over_idle_p99` is close to the cleaner's
//! write amplification. Open loop (`open_*`): updates arrive on a fixed
//! schedule whatever the store does, each in its own task, and latency
//! counts from the scheduled arrival, so time spent queued behind the
//! cleaner (or behind a late arrival) counts: no coordinated omission.
//! `open_busy_over_idle_p99` is the foreground latency a client below
//! saturation sees with the cleaner busy over with it idle.
//!
//! Space: `log_used_over_live` is the log's use over the live data at the
//! end, `log_used_over_live_peak` the highest sampled (every 2 ms) during
//! phases 4 and 5. `passes` and `bytes_copied` are the cleaner's work in
//! phases 3 to 5; `wait_timeouts` counts writes that waited the longest
//! time for the cleaner and went on.

use super::imp::{
    config, device_spec, histogram, key, key_bytes, on_xstream, update_all, update_keys,
};
use super::{BenchStoreArgs, Figure};
use anyhow::Context;
use ferrite_engine::store::{Store, StoreConfig};
use hdrhistogram::Histogram;
use std::cell::{Cell, RefCell};
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Open-loop updates in flight at most (the arrival schedule goes on; a
/// late arrival's wait counts in its latency).
const OPEN_IN_FLIGHT_MAX: usize = 4096;
/// Longest the cleaner may take to catch up before the busy phases.
const CATCH_UP_MAX: Duration = Duration::from_secs(60);

/// Nine updates in ten go to a tenth of the keys (410 of 4096).
fn skewed(i: usize) -> usize {
    let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 7;
    if i % 10 == 0 {
        h
    } else {
        h % 410
    }
}

/// Samples the store's log use over its live data every 2 ms (on the
/// store's xstream) until the task is cancelled; the cell holds the
/// highest ratio.
fn sample_peak_used_over_live(s: &Rc<Store>) -> (Rc<Cell<f64>>, glommio::task::JoinHandle<()>) {
    let peak = Rc::new(Cell::new(0.0f64));
    let (s, cell) = (s.clone(), peak.clone());
    let task = glommio::spawn_local(async move {
        loop {
            let st = s.stats();
            if st.live_bytes > 0 {
                let ratio = st.log_used_bytes as f64 / st.live_bytes as f64;
                cell.set(cell.get().max(ratio));
            }
            glommio::timer::sleep(Duration::from_millis(2)).await;
        }
    })
    .detach();
    (peak, task)
}

/// Issues `n` updates of `size` bytes, the i-th to key `pick(i) % keys`,
/// arriving `rate` per second from now on, each in its own task; returns
/// their latencies (ns) counted from each scheduled arrival.
async fn open_loop(
    s: &Rc<Store>,
    (keys, size): (usize, usize),
    n: usize,
    rate: f64,
    pick: fn(usize) -> usize,
) -> anyhow::Result<Histogram<u64>> {
    let hist = Rc::new(RefCell::new(histogram()));
    let in_flight = Rc::new(Cell::new(0usize));
    let value = Rc::new(vec![0xA5u8; size]);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        let now = Instant::now();
        if due > now {
            glommio::timer::sleep(due - now).await;
        }
        while in_flight.get() >= OPEN_IN_FLIGHT_MAX {
            glommio::timer::sleep(Duration::from_micros(100)).await;
        }
        in_flight.set(in_flight.get() + 1);
        let (s, hist, in_flight, value) =
            (s.clone(), hist.clone(), in_flight.clone(), value.clone());
        tasks.push(glommio::spawn_local(async move {
            let k = key_bytes(pick(i) % keys);
            let r = s.update(&key(&k), &value).await;
            let _ = hist.borrow_mut().record(due.elapsed().as_nanos() as u64);
            in_flight.set(in_flight.get() - 1);
            r.map(|_| ())
        }));
    }
    for t in tasks {
        t.await?;
    }
    let h = hist.borrow().clone();
    Ok(h)
}

/// Waits (polling every millisecond) until cleaning is no longer due.
async fn catch_up(s: &Store) -> anyhow::Result<()> {
    let start = Instant::now();
    while s.cleaning_due() {
        anyhow::ensure!(
            start.elapsed() < CATCH_UP_MAX,
            "the cleaner did not catch up in {CATCH_UP_MAX:?}"
        );
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// The latency figures of the four phases, as histograms in ns.
struct Phases {
    idle: Histogram<u64>,
    open_idle: Histogram<u64>,
    busy: Histogram<u64>,
    open_busy: Histogram<u64>,
    idle_update: f64,
    busy_update: f64,
    open_rate: f64,
}

/// Runs the phases of the module doc on `s`; also returns the peak of the
/// log's use over the live data.
async fn run_phases(
    s: &Rc<Store>,
    keys: usize,
    concurrency: usize,
) -> anyhow::Result<(Phases, f64)> {
    let size = 4096;
    let mut idle = histogram();
    let mut idle_secs = 0.0;
    for round in 0..2 {
        let (secs, h) = update_all(s, keys, size, concurrency, round).await?;
        idle.add(&h).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        idle_secs += secs;
    }
    let idle_update = (2 * keys) as f64 / idle_secs;
    let open_rate = idle_update / 2.0;
    let open_idle = open_loop(s, (keys, size), keys, open_rate, skewed).await?;
    let cleaner = s.spawn_cleaner();
    catch_up(s).await?;
    let (peak, sampler) = sample_peak_used_over_live(s);
    let mut busy = histogram();
    let start = Instant::now();
    for round in 2..8 {
        let (_, h) = update_keys(s, keys, size, concurrency, round, skewed).await?;
        busy.add(&h).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    let busy_update = (6 * keys) as f64 / start.elapsed().as_secs_f64();
    let open_busy = open_loop(s, (keys, size), keys, open_rate, skewed).await?;
    let peak_used_over_live = peak.get();
    sampler.cancel();
    s.stop_cleaner();
    cleaner.await;
    let phases = Phases {
        idle,
        open_idle,
        busy,
        open_busy,
        idle_update,
        busy_update,
        open_rate,
    };
    Ok((phases, peak_used_over_live))
}

/// The cleaner case (module doc) on a device of `kind`.
pub(super) fn cleaner_case(
    args: &BenchStoreArgs,
    kind: &str,
    dir: &Path,
) -> anyhow::Result<Vec<Figure>> {
    let keys = 4096usize;
    let spec = device_spec(kind, dir, &format!("{kind}-cleaner"), 96 << 20)?;
    let concurrency = args.concurrency.max(1);
    let label = kind.to_string();
    let args_load = args.load;
    on_xstream(move || {
        Box::new(async move {
            let bdev = ferrite_bdev::open(&spec).with_context(|| format!("opening {spec}"))?;
            let cfg = StoreConfig {
                ring_bytes: 16 << 20,
                checkpoint_bytes: 4 << 20,
                ..config(keys, args_load, 16 << 20)
            };
            let s = Rc::new(Store::open(bdev, cfg).await?);
            let (p, peak) = run_phases(&s, keys, concurrency).await?;
            let st = s.stats();
            anyhow::ensure!(st.cleaner_passes > 0, "the cleaner never ran");
            let f = |name: &str, unit: &'static str, v: f64| Figure {
                name: format!("store.cleaner.{name}.{label}.4KiB"),
                unit,
                ferrite: v,
            };
            let q = |h: &Histogram<u64>, p| h.value_at_quantile(p) as f64 / 1e3;
            let over = |a: &Histogram<u64>, b: &Histogram<u64>| q(a, 0.99) / q(b, 0.99).max(1e-9);
            Ok(vec![
                f("idle_p50", "us", q(&p.idle, 0.5)),
                f("idle_p99", "us", q(&p.idle, 0.99)),
                f("busy_p50", "us", q(&p.busy, 0.5)),
                f("busy_p99", "us", q(&p.busy, 0.99)),
                f("busy_over_idle_p99", "ratio", over(&p.busy, &p.idle)),
                f("idle_update", "ops/s", p.idle_update),
                f("busy_update", "ops/s", p.busy_update),
                f("open_rate", "ops/s", p.open_rate),
                f("open_idle_p50", "us", q(&p.open_idle, 0.5)),
                f("open_idle_p99", "us", q(&p.open_idle, 0.99)),
                f("open_busy_p50", "us", q(&p.open_busy, 0.5)),
                f("open_busy_p99", "us", q(&p.open_busy, 0.99)),
                f(
                    "open_busy_over_idle_p99",
                    "ratio",
                    over(&p.open_busy, &p.open_idle),
                ),
                f("passes", "count", st.cleaner_passes as f64),
                f("bytes_copied", "B", st.cleaner_bytes_copied as f64),
                f("wait_timeouts", "count", st.cleaner_wait_timeouts as f64),
                f(
                    "log_used_over_live",
                    "ratio",
                    st.log_used_bytes as f64 / st.live_bytes.max(1) as f64,
                ),
                f("log_used_over_live_peak", "ratio", peak),
            ])
        })
    })
}
