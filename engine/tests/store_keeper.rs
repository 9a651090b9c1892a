//! The hot-record keeper: small live records — single values and the
//! extents of small byte arrays — stay in the memory ring while bulk writes
//! lap it several times, so fetching them reads no device; the copies never
//! resurrect older bytes, neither live nor after recovery; with the keeper
//! off the same workload does read the device (the check has teeth); and a
//! lap's copies are bounded in number, not only in bytes, when more small
//! records pass than its budget keeps.

use ferrite_bdev::BdevRef;
use ferrite_engine::store::{Store, StoreConfig, KEEP_CHARGE_MIN_BYTES};
use ferrite_proto::key::RecordKey;

// Small records and array pieces (28 copy steps, 8 for the arrays) that a
// lap of the 1 MiB ring keeps whole: its budget is 64 copy steps (a quarter
// of it at KEEP_CHARGE_MIN_BYTES each), and a record at the start of a lap
// is copied twice in it (once half a ring old, its copy again).
const SMALL_KEYS: u32 = 20;
const ARRAYS: u32 = 4;
const ARRAY_BYTES: usize = 3901;
const BIG_VALUE: usize = 48 << 10;

fn cfg(hot_value_max: u32) -> StoreConfig {
    StoreConfig {
        hot_value_max,
        ..StoreConfig::small()
    }
}

fn small_key(k: u32) -> Vec<u8> {
    format!("entry-{k}").into_bytes()
}

fn small_value(k: u32, round: u32) -> Vec<u8> {
    format!("entry {k} written in round {round}").into_bytes()
}

/// Writes `laps` ring's worth of big values, letting the keeper look after
/// each one (as its background task would between commits).
async fn lap_the_ring(store: &Store, laps: u64, keep: bool) {
    let ring = store.stats().ring_bytes;
    let big = vec![0xb5u8; BIG_VALUE];
    let n = (laps * ring).div_ceil(BIG_VALUE as u64);
    for i in 0..n {
        let akey = (i % 8).to_le_bytes();
        let key = RecordKey::new(1, 2, b"bulk", &akey);
        store.update(&key, &big).await.unwrap();
        if keep {
            store.keep_hot().await.unwrap();
        }
    }
}

fn array_key(a: u32) -> Vec<u8> {
    format!("file-{a}").into_bytes()
}

/// Array `a` as written: `ARRAY_BYTES` of `a`, then bytes 100..200 of the
/// even ones overwritten with 0xee.
fn array_bytes(a: u32) -> Vec<u8> {
    let mut b = vec![a as u8; ARRAY_BYTES];
    if a % 2 == 0 {
        b[100..200].fill(0xee);
    }
    b
}

async fn write_arrays(store: &Store) {
    for a in 0..ARRAYS {
        let kb = array_key(a);
        let key = RecordKey::new(1, 3, b"c0", &kb);
        store
            .update_extent(&key, 0, &vec![a as u8; ARRAY_BYTES])
            .await
            .unwrap();
        if a % 2 == 0 {
            store.update_extent(&key, 100, &[0xee; 100]).await.unwrap();
        }
    }
}

async fn check_arrays(store: &Store) {
    for a in 0..ARRAYS {
        let kb = array_key(a);
        let key = RecordKey::new(1, 3, b"c0", &kb);
        let (_, bytes) = store
            .fetch_extent(&key, 0, ARRAY_BYTES as u64)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("array {a} lost"));
        assert_eq!(bytes, array_bytes(a), "array {a}");
    }
}

/// Fetches every small key and array, checks them, returns the device reads
/// it took.
async fn check_small(store: &Store, latest: &[u32]) -> u64 {
    let before = store.stats().device_reads;
    check_arrays(store).await;
    let arrays = store.stats().device_reads - before;
    arrays + check_keys(store, latest).await
}

/// Fetches every small key, checks it is the value of round `latest[k]`,
/// returns the device reads it took.
async fn check_keys(store: &Store, latest: &[u32]) -> u64 {
    let before = store.stats().device_reads;
    for (k, round) in latest.iter().enumerate() {
        let k = k as u32;
        let kb = small_key(k);
        let (_, value) = store
            .fetch(&RecordKey::new(1, 1, b"dir", &kb))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("key {k} lost"));
        assert_eq!(value, small_value(k, *round), "key {k}");
    }
    store.stats().device_reads - before
}

async fn write_small(
    store: &Store,
    keys: impl Iterator<Item = u32>,
    round: u32,
    latest: &mut [u32],
) {
    for k in keys {
        let kb = small_key(k);
        store
            .update(&RecordKey::new(1, 1, b"dir", &kb), &small_value(k, round))
            .await
            .unwrap();
        latest[k as usize] = round;
    }
}

/// Writes every small key (round 1) and array, laps the ring twice, then
/// rewrites every `step`-th key (round 2) while older copies may be
/// mid-keep and laps `laps_after` more times. Returns each key's round.
async fn workload(store: &Store, step: usize, laps_after: u64, keep: bool) -> Vec<u32> {
    let mut latest = vec![0u32; SMALL_KEYS as usize];
    write_small(store, 0..SMALL_KEYS, 1, &mut latest).await;
    write_arrays(store).await;
    lap_the_ring(store, 2, keep).await;
    write_small(store, (0..SMALL_KEYS).step_by(step), 2, &mut latest).await;
    lap_the_ring(store, laps_after, keep).await;
    latest
}

fn run(keep: bool) -> (u64, u64) {
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let bdev: BdevRef = ferrite_bdev::open("malloc:32M").unwrap();
            let config = cfg(if keep { 4096 } else { 0 });
            let store = Store::open(bdev.clone(), config.clone()).await.unwrap();
            let latest = workload(&store, 3, 3, keep).await;
            let reads = check_small(&store, &latest).await;
            let kept = store.stats().keeper_records_kept;
            store.checkpoint().await.unwrap();
            drop(store);
            // Recovery replays the copies too; each key has its newest value.
            let store = Store::open(bdev, config).await.unwrap();
            check_small(&store, &latest).await;
            (reads, kept)
        })
        .unwrap()
        .join()
        .unwrap()
}

#[test]
fn small_records_stay_in_the_ring_while_bulk_writes_lap_it() {
    let (reads, kept) = run(true);
    assert_eq!(reads, 0, "fetching kept records read the device");
    assert!(kept >= u64::from(SMALL_KEYS), "kept {kept} records");
}

#[test]
fn without_the_keeper_the_same_records_are_read_from_the_device() {
    let (reads, kept) = run(false);
    assert_eq!(kept, 0);
    assert!(
        reads >= u64::from(SMALL_KEYS + ARRAYS),
        "only {reads} device reads"
    );
}

/// A power loss while the keeper's latest copies are not yet flushed (they
/// are never acknowledged to anyone): recovery still gives every key its
/// newest acknowledged value and every array its bytes.
#[test]
fn power_loss_during_keeping_loses_nothing_acknowledged() {
    for seed in 0..4u64 {
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let crash = std::sync::Arc::new(ferrite_bdev::wrap::CrashBdev::new(
                    ferrite_bdev::open("malloc:32M").unwrap(),
                ));
                let bdev: BdevRef = crash.clone();
                let config = cfg(4096);
                let store = Store::open(bdev.clone(), config.clone()).await.unwrap();
                let latest = workload(&store, 2, 1, true).await;
                // The last pass's copies sit in the ring or unflushed on the device.
                let ring = store.stats().ring_bytes as usize;
                // Half a ring of bulk, in records that fit a segment.
                let eighth = vec![0x5au8; ring / 8 - 1024];
                let bulk = RecordKey::new(1, 2, b"bulk", b"eighth");
                for _ in 0..4 {
                    store.update(&bulk, &eighth).await.unwrap();
                }
                let kept_before = store.stats().keeper_records_kept;
                store.keep_hot().await.unwrap();
                assert!(
                    store.stats().keeper_records_kept > kept_before,
                    "seed {seed}"
                );
                crash.crash(seed).await.unwrap();
                drop(store);
                let store = Store::open(bdev, config).await.unwrap();
                check_small(&store, &latest).await;
            })
            .unwrap()
            .join()
            .unwrap();
    }
}

/// Far more small records than a lap's budget keeps (1000 against 64 per lap
/// of the 1 MiB ring): the keeper copies at most a quarter lap's worth of
/// [`KEEP_CHARGE_MIN_BYTES`] per lap, however small the records, and every
/// key still reads back its value, those not kept from the device.
#[test]
fn a_lap_keeps_a_bounded_number_of_small_records() {
    const MANY: u32 = 1000;
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let bdev: BdevRef = ferrite_bdev::open("malloc:32M").unwrap();
            let store = Store::open(bdev, cfg(4096)).await.unwrap();
            let mut latest = vec![0u32; MANY as usize];
            write_small(&store, 0..MANY, 1, &mut latest).await;
            lap_the_ring(&store, 3, true).await;
            let st = store.stats();
            let laps = st.head.div_ceil(st.ring_bytes);
            let per_lap = st.ring_bytes / 4 / KEEP_CHARGE_MIN_BYTES + 1;
            let kept = st.keeper_records_kept;
            assert!(kept > 0, "nothing kept");
            assert!(
                kept <= laps * per_lap,
                "kept {kept} records in {laps} laps (at most {per_lap} each)"
            );
            let reads = check_keys(&store, &latest).await;
            assert!(reads >= u64::from(MANY) / 2, "only {reads} device reads");
        })
        .unwrap()
        .join()
        .unwrap();
}
