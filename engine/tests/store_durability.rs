//! Durability modes. `device`: nothing an update acknowledged is left
//! unflushed. `process`: updates are acknowledged once written, before any
//! flush; `sync` (or the background flush) makes them survive a power loss,
//! and a power loss before it leaves a prefix of the log: each key holds
//! its synced value or a later acknowledged one, never anything else, and
//! never a later value after an earlier key lost its own.

use ferrite_bdev::wrap::CrashBdev;
use ferrite_bdev::BdevRef;
use ferrite_engine::store::{Durability, Store, StoreConfig};
use ferrite_proto::key::RecordKey;
use std::sync::Arc;
use std::time::Duration;

const KEYS: u32 = 64;

fn cfg(durability: Durability, flush_interval: Duration) -> StoreConfig {
    StoreConfig {
        durability,
        flush_interval,
        ..StoreConfig::small()
    }
}

fn key(k: u32) -> Vec<u8> {
    k.to_le_bytes().to_vec()
}

fn value(k: u32, round: u32) -> Vec<u8> {
    format!("key {k} round {round}").into_bytes()
}

async fn write_round(store: &Store, crash: &CrashBdev, round: u32, unflushed: &mut usize) {
    for k in 0..KEYS {
        let kb = key(k);
        store
            .update(&RecordKey::new(1, 9, b"d", &kb), &value(k, round))
            .await
            .unwrap();
        *unflushed = (*unflushed).max(crash.unflushed_writes());
    }
}

fn run(seed: u64, durability: Durability) {
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let crash = Arc::new(CrashBdev::new(ferrite_bdev::open("malloc:8M").unwrap()));
            let bdev: BdevRef = crash.clone();
            let config = cfg(durability, Duration::from_secs(3600));
            let store = Store::open(bdev.clone(), config.clone()).await.unwrap();
            let mut most_unflushed = 0;
            write_round(&store, &crash, 1, &mut most_unflushed).await;
            match durability {
                Durability::Device => assert_eq!(most_unflushed, 0, "an ack left a write unflushed"),
                Durability::Process => {
                    assert!(most_unflushed > 0, "process durability flushed every commit");
                    assert!(store.stats().unflushed > 0);
                }
            }
            store.sync().await.unwrap();
            assert_eq!(crash.unflushed_writes(), 0, "sync left writes unflushed");
            assert_eq!(store.stats().unflushed, 0);
            write_round(&store, &crash, 2, &mut most_unflushed).await;
            let report = crash.crash(seed).await.unwrap();
            drop(store);
            let store = Store::open(bdev, config).await.unwrap();
            let mut lost_from = None;
            for k in 0..KEYS {
                let kb = key(k);
                let got = store
                    .fetch(&RecordKey::new(1, 9, b"d", &kb))
                    .await
                    .unwrap()
                    .map(|(_, v)| v);
                let got = got.unwrap_or_else(|| panic!("seed {seed}: synced key {k} lost"));
                if got == value(k, 2) {
                    assert!(
                        lost_from.is_none(),
                        "seed {seed}: key {k} kept round 2 after key {lost_from:?} lost it"
                    );
                } else {
                    assert_eq!(got, value(k, 1), "seed {seed}: key {k} holds foreign bytes");
                    assert!(durability == Durability::Process, "device mode lost key {k}");
                    lost_from.get_or_insert(k);
                }
            }
            eprintln!(
                "seed {seed}: {} unflushed writes at the crash; round 2 lost from key {lost_from:?}",
                report.writes.len()
            );
            if durability == Durability::Device {
                assert!(report.writes.is_empty());
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn device_durability_flushes_before_every_ack() {
    run(1, Durability::Device);
}

#[test]
fn process_durability_acks_before_the_flush_and_sync_survives_power_loss() {
    for seed in 0..8 {
        run(seed, Durability::Process);
    }
}

#[test]
fn background_flush_makes_process_durability_writes_stable() {
    glommio::LocalExecutorBuilder::default()
        .spawn(|| async move {
            let crash = Arc::new(CrashBdev::new(ferrite_bdev::open("malloc:8M").unwrap()));
            let bdev: BdevRef = crash.clone();
            let config = cfg(Durability::Process, Duration::from_millis(5));
            let store = std::rc::Rc::new(Store::open(bdev, config).await.unwrap());
            let flusher = glommio::spawn_local(Store::flush_loop(
                std::rc::Rc::downgrade(&store),
                store.flush_interval(),
            ));
            let mut unflushed = 0;
            write_round(&store, &crash, 1, &mut unflushed).await;
            assert!(unflushed > 0);
            let mut waited = 0;
            while crash.unflushed_writes() > 0 && waited < 2000 {
                glommio::timer::sleep(Duration::from_millis(1)).await;
                waited += 1;
            }
            assert_eq!(crash.unflushed_writes(), 0, "background flush never ran");
            assert_eq!(store.stats().unflushed, 0);
            drop(store);
            flusher.await;
        })
        .unwrap()
        .join()
        .unwrap();
}

/// `update_many` appends a group in order and acknowledges it after one
/// commit: every update it acknowledged is on the device (flushed, under
/// device durability) and survives a power loss; an update the store
/// refuses (a byte array's key, an oversized value) fails alone.
#[test]
fn a_group_of_updates_is_one_commit_and_survives_power_loss() {
    glommio::LocalExecutorBuilder::default()
        .spawn(|| async move {
            let crash = Arc::new(CrashBdev::new(ferrite_bdev::open("malloc:8M").unwrap()));
            let bdev: BdevRef = crash.clone();
            let config = cfg(Durability::Device, Duration::from_secs(3600));
            let store = Store::open(bdev.clone(), config.clone()).await.unwrap();
            let array = RecordKey::new(1, 9, b"d", b"array");
            store.update_extent(&array, 0, b"bytes").await.unwrap();
            let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
            let big = vec![0u8; ferrite_proto::record::VALUE_MAX_BYTES + 1];
            let values: Vec<Vec<u8>> = (0..KEYS).map(|k| value(k, 1)).collect();
            let mut items: Vec<(RecordKey<'_>, &[u8])> = keys
                .iter()
                .zip(&values)
                .map(|(k, v)| (RecordKey::new(1, 9, b"d", k), v.as_slice()))
                .collect();
            items.insert(3, (array, b"single"));
            items.insert(7, (RecordKey::new(1, 9, b"d", b"big"), &big));
            let commits = store.stats().commits;
            let results = store.update_many(&items).await;
            assert_eq!(store.stats().commits, commits + 1, "not one commit");
            assert_eq!(crash.unflushed_writes(), 0, "acknowledged before the flush");
            assert_eq!(results.len(), items.len());
            let mut last = 0;
            for (i, r) in results.iter().enumerate() {
                match (i, r) {
                    (3, r) => assert!(r.is_err(), "an array's key took a single value"),
                    (7, r) => assert!(r.is_err(), "an oversized value was taken"),
                    (_, Ok(v)) => {
                        assert!(*v > last, "versions out of item order");
                        last = *v;
                    }
                    (_, Err(e)) => panic!("item {i}: {e}"),
                }
            }
            let report = crash.crash(3).await.unwrap();
            assert!(report.writes.is_empty());
            drop(store);
            let store = Store::open(bdev, config).await.unwrap();
            for k in 0..KEYS {
                let got = store.fetch(&RecordKey::new(1, 9, b"d", &key(k))).await;
                assert_eq!(got.unwrap().map(|(_, v)| v), Some(value(k, 1)), "key {k}");
            }
            let got = store.fetch_extent(&array, 0, 5).await.unwrap();
            assert_eq!(got.map(|(_, v)| v), Some(b"bytes".to_vec()));
        })
        .unwrap()
        .join()
        .unwrap();
}
