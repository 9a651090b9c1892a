//! `ferrite bench store --fill-levels 0,10,50,70,85`: 4 KiB overwrites of
//! keys picked uniformly at random on a store filled to each level (percent
//! of the log's usable capacity, `log_usable_bytes`), every level on a
//! fresh store over a device of `--fill-device-mib`, side by side in one
//! run: overwrites/s, their ratio to the lowest level's, and the bytes the
//! cleaner copied per byte written. The overwrites of each level write
//! twice the log's capacity, so the cleaner runs at its steady state. Then
//! new keys until the store refuses one: the refused write's latency (how
//! long from the ceiling to the first "no space").

use super::common::{config, device_file, device_spec, key, key_bytes, on_xstream, write_whole};
use anyhow::Context;
use ferrite_engine::store::{Store, StoreConfig, StoreError};
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

const VALUE_BYTES: usize = 4096;
/// Keys of the lowest level when it is 0 %: a store next to empty.
const EMPTY_KEYS: usize = 256;

/// One figure: its name, unit and value.
pub(super) type FillFigure = (String, &'static str, f64);

/// What one level measured.
struct Level {
    percent: u8,
    updates_per_sec: f64,
    copied_per_written: f64,
    refused_us: Option<f64>,
}

/// The fill case on device `kind` at each of `levels`.
pub(super) fn fill_case(
    kind: &str,
    dir: &Path,
    levels: &[u8],
    device_mib: u64,
    concurrency: usize,
) -> anyhow::Result<Vec<FillFigure>> {
    let mut measured = Vec::new();
    for (i, &percent) in levels.iter().enumerate() {
        let tag = format!("{kind}-fill-{percent}");
        let bytes = device_mib << 20;
        let spec = device_spec(kind, dir, &tag, bytes)?;
        if kind != "malloc" {
            write_whole(&device_file(dir, &tag), bytes)?;
        }
        let last = i + 1 == levels.len();
        let level = on_xstream(move || Box::new(level(spec, percent, concurrency, last)));
        let _ = std::fs::remove_file(device_file(dir, &tag));
        measured.push(level?);
    }
    Ok(figures(kind, &measured))
}

fn figures(kind: &str, measured: &[Level]) -> Vec<FillFigure> {
    let base = measured.first().map_or(f64::NAN, |l| l.updates_per_sec);
    let mut out = Vec::new();
    let fig = |name: String, unit, value| (name, unit, value);
    for l in measured {
        let p = l.percent;
        out.push(fig(
            format!("fill_{kind}_{p}pct_overwrites"),
            "ops/s",
            l.updates_per_sec,
        ));
        out.push(fig(
            format!("fill_{kind}_{p}pct_vs_{}pct", measured[0].percent),
            "ratio",
            l.updates_per_sec / base,
        ));
        out.push(fig(
            format!("fill_{kind}_{p}pct_copied_per_written"),
            "ratio",
            l.copied_per_written,
        ));
        if let Some(us) = l.refused_us {
            out.push(fig(format!("fill_{kind}_first_no_space_latency"), "us", us));
        }
    }
    out
}

/// One level on a fresh store over `spec`; with `refuse`, then fills it to
/// its first refusal.
async fn level(
    spec: String,
    percent: u8,
    concurrency: usize,
    refuse: bool,
) -> anyhow::Result<Level> {
    let bdev = ferrite_bdev::open(&spec).with_context(|| format!("opening {spec}"))?;
    let cfg = StoreConfig {
        ring_bytes: 16 << 20,
        checkpoint_bytes: 4 << 20,
        segment_bytes: 2 << 20,
        ..config(1 << 20, 0.6, 16 << 20)
    };
    let s = Rc::new(Store::open(bdev, cfg).await?);
    let cleaner = s.spawn_cleaner();
    let rec = ferrite_proto::record::record_len(&key(&key_bytes(0)), VALUE_BYTES) as u64;
    let st = s.stats();
    let keys = (st.log_usable_bytes * u64::from(percent) / 100 / rec) as usize;
    let keys = keys.saturating_sub(4).max(EMPTY_KEYS);
    let value = vec![0x5au8; VALUE_BYTES];
    for k in 0..keys {
        s.update(&key(&key_bytes(k)), &value).await?;
    }
    let before = s.stats();
    let updates = (2 * st.log_capacity_bytes / rec) as usize;
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| glommio::spawn_local(overwrite(s.clone(), t, updates / concurrency, keys)))
        .collect();
    for t in tasks {
        t.await?;
    }
    let secs = start.elapsed().as_secs_f64();
    let after = s.stats();
    let copied = after.cleaner_bytes_copied - before.cleaner_bytes_copied;
    let written = (after.bytes_appended - before.bytes_appended).saturating_sub(copied);
    let refused_us = match refuse {
        true => Some(first_refusal(&s, keys).await?),
        false => None,
    };
    s.stop_cleaner();
    cleaner.await;
    Ok(Level {
        percent,
        updates_per_sec: (updates / concurrency * concurrency) as f64 / secs,
        copied_per_written: copied as f64 / written.max(1) as f64,
        refused_us,
    })
}

/// `n` overwrites of keys below `keys`, picked by a xorshift seeded by `task`.
async fn overwrite(s: Rc<Store>, task: usize, n: usize, keys: usize) -> anyhow::Result<()> {
    let value = vec![0xa5u8; VALUE_BYTES];
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (task as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.update(&key(&key_bytes((x % keys as u64) as usize)), &value)
            .await?;
    }
    Ok(())
}

/// Writes new keys after the first `keys` until one is refused; returns how
/// long the refused write took, in µs.
async fn first_refusal(s: &Store, keys: usize) -> anyhow::Result<f64> {
    let value = vec![0x3cu8; VALUE_BYTES];
    let limit = (s.stats().log_capacity_bytes / VALUE_BYTES as u64) as usize;
    for k in keys..keys + limit {
        let start = Instant::now();
        match s.update(&key(&key_bytes(k)), &value).await {
            Ok(_) => {}
            Err(StoreError::LogFull { .. }) => return Ok(start.elapsed().as_secs_f64() * 1e6),
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("{limit} new keys of {VALUE_BYTES} bytes all fit")
}
