//! What the cases of `ferrite bench store` share: the store they open
//! (its device and bucket table), the xstream they run on, keys, and the
//! clocks and histograms they measure with.

use anyhow::Context;
use ferrite_engine::store::StoreConfig;
use ferrite_proto::bucket::SLOTS_PER_BUCKET;
use ferrite_proto::key::RecordKey;
use hdrhistogram::Histogram;
use std::path::Path;

pub(super) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3)
        .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!()))
}

pub(super) fn device_file(dir: &Path, tag: &str) -> std::path::PathBuf {
    dir.join(format!("bench-store-{tag}.img"))
}

pub(super) fn device_spec(kind: &str, dir: &Path, tag: &str, bytes: u64) -> anyhow::Result<String> {
    let file = device_file(dir, tag);
    let _ = std::fs::remove_file(&file);
    Ok(match kind {
        "malloc" => format!("malloc:{bytes}"),
        "pmem" => format!("pmem:{}?size={bytes}", file.display()),
        "uring" => format!("uring:{}?size={bytes}&direct=1", file.display()),
        other => anyhow::bail!("unknown device kind {other:?} (malloc, pmem, uring)"),
    })
}

pub(super) fn key_bytes(i: usize) -> [u8; 8] {
    (i as u64).to_le_bytes()
}

pub(super) fn key(d: &[u8; 8]) -> RecordKey<'_> {
    RecordKey::new(1, 7, d, b"v")
}

pub(super) type Job<T> = Box<dyn std::future::Future<Output = anyhow::Result<T>>>;

/// Runs the future `make` builds on a new xstream pinned to core 0, in
/// its foreground queue, configured as the engine's are (its preempt
/// deadline, its default spin before parking). A real xstream, not a
/// bare glommio executor (as until 2026-12-06): a `uring` channel's
/// reaper sleeps on an eventfd only on an xstream, and elsewhere waits
/// for completions in the kernel, holding the core, so the figures were
/// not the engine's. With the cleaner running, those waits kept it off
/// the core while commits were on the device. `--cleaner-only` on a
/// uring file, 8 runs of each alternating: busy p50 329-340 µs on a
/// bare executor, 303-329 µs on an xstream; idle p50 229-238 and
/// 235-250 µs (a sleep and wake through glommio costs system calls);
/// the median block's busy/idle p99 1.66-2.03 (median 1.78) and
/// 1.43-1.85 (1.66). The update and fetch figures of a full run moved
/// within their run-to-run noise.
pub(super) fn on_xstream<T: Send + 'static>(
    make: impl FnOnce() -> Job<T> + Send + 'static,
) -> anyhow::Result<T> {
    use ferrite_xstream::{TaskClass, XstreamConfig, XstreamId, XstreamSet};
    let spin = std::time::Duration::from_micros(ferrite_engine::config::DEFAULT_SPIN_US);
    let config = XstreamConfig {
        name: "bench-store".into(),
        ..XstreamConfig::default().with_cores([0]).with_spin(spin)
    };
    let set = XstreamSet::start(config).context("starting the xstream")?;
    let run = set
        .mesh()
        .run_on(XstreamId(0), TaskClass::Foreground, move || {
            Box::into_pin(make())
        });
    let out = futures::executor::block_on(run).context("running on the xstream");
    set.shutdown().context("stopping the xstream")?;
    out?
}

/// Overflow buckets per main bucket, as `StoreConfig::default()` and
/// the engine's config have them.
pub(super) const OVERFLOW_SHARE: f64 = 0.25;

/// The smallest main area the bench opens.
pub(super) const MAIN_BUCKETS_MIN: u64 = 16;

/// A store whose bucket table holds `keys` at a load of `load` (at
/// most): the smallest main area (any count, at least `MAIN_BUCKETS_MIN`)
/// with a quarter of it as overflow pool. Sized
/// for the keys even when they are few (values of 1 MiB), so that
/// the DRAM metadata per key is that of a table at that load, not of an
/// oversized one.
pub(super) fn config(keys: usize, load: f64, ring_bytes: u64) -> StoreConfig {
    let slots_per_main = SLOTS_PER_BUCKET as f64 * (1.0 + OVERFLOW_SHARE);
    let main = (keys as f64 / (slots_per_main * load.clamp(0.05, 1.0))).ceil() as u64;
    let main = main.max(MAIN_BUCKETS_MIN);
    StoreConfig {
        bucket_count: main,
        overflow_buckets: (main as f64 * OVERFLOW_SHARE) as u32,
        ring_bytes,
        ..StoreConfig::default()
    }
}

/// CPU seconds this thread has used (its per-core cost, whatever else
/// the machine runs).
pub(super) fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid pointer to a timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Writes `bytes` of zeros to `file` and syncs it: every block
/// allocated before the store opens it. Then drops the file's pages
/// from the page cache: a direct write over cached pages also
/// invalidates them, which a device's first lap would pay and later
/// ones not.
pub(super) fn write_whole(file: &Path, bytes: u64) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let zeros = vec![0u8; 1 << 20];
    let mut f = std::fs::File::create(file).with_context(|| format!("creating {file:?}"))?;
    for _ in 0..bytes.div_ceil(zeros.len() as u64) {
        std::io::Write::write_all(&mut f, &zeros)?;
    }
    f.sync_all()?;
    // SAFETY: a plain advice call on an open descriptor.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    anyhow::ensure!(rc == 0, "posix_fadvise on {file:?}: error {rc}");
    Ok(())
}
