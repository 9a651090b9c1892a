//! Durability modes. `device`: nothing an update acknowledged is left
//! unflushed. `process`: updates are acknowledged once written, before any
//! flush; `sync` (or the background flush) makes them survive a power loss,
//! and a power loss before it leaves a prefix of the log: each key holds
//! its synced value or a later acknowledged one, never anything else, and
//! never a later value after an earlier key lost its own.

use ferrite_bdev::wrap::CrashBdev;
use ferrite_bdev::BdevRef;
use ferrite_engine::store::{Condition, Conditional, Durability, Store, StoreConfig, WriteOp};
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

/// `write_many` appends a group in order and acknowledges it after one
/// commit: every write it acknowledged (updates, conditional inserts,
/// extent writes, punches) is on the device (flushed, under device
/// durability) and survives a power loss; a write the store refuses (a
/// byte array's key, a single value's key, an oversized value, an empty
/// extent) fails alone, and an insert of a name that exists
/// conflicts without a record.
#[test]
fn a_group_of_writes_is_one_commit_and_survives_power_loss() {
    glommio::LocalExecutorBuilder::default()
        .spawn(|| async move {
            let crash = Arc::new(CrashBdev::new(ferrite_bdev::open("malloc:8M").unwrap()));
            let bdev: BdevRef = crash.clone();
            let config = cfg(Durability::Device, Duration::from_secs(3600));
            let store = Store::open(bdev.clone(), config.clone()).await.unwrap();
            let array = RecordKey::new(1, 9, b"d", b"array");
            store.update_extent(&array, 0, b"bytes").await.unwrap();
            let (gone, taken) = (
                RecordKey::new(1, 9, b"d", b"gone"),
                RecordKey::new(1, 9, b"d", b"taken"),
            );
            store.update(&gone, b"old").await.unwrap();
            let taken_version = store.update(&taken, b"first").await.unwrap();
            let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
            let big = vec![0u8; ferrite_proto::record::VALUE_MAX_BYTES + 1];
            let values: Vec<Vec<u8>> = (0..KEYS).map(|k| value(k, 1)).collect();
            // Even keys are plain updates, odd ones inserts of new names.
            let mut ops: Vec<WriteOp<'_>> = keys
                .iter()
                .zip(&values)
                .enumerate()
                .map(|(k, (kb, v))| {
                    let key = RecordKey::new(1, 9, b"d", kb);
                    match k % 2 {
                        0 => WriteOp::Update { key, value: v },
                        _ => WriteOp::UpdateIf {
                            key,
                            value: v,
                            cond: Condition::Absent,
                        },
                    }
                })
                .collect();
            ops.insert(
                3,
                WriteOp::Update {
                    key: array,
                    value: b"single",
                },
            );
            let big_key = RecordKey::new(1, 9, b"d", b"big");
            ops.insert(
                7,
                WriteOp::Update {
                    key: big_key,
                    value: &big,
                },
            );
            ops.insert(
                9,
                WriteOp::Punch {
                    key: gone,
                    dkey: false,
                },
            );
            let insert_taken = WriteOp::UpdateIf {
                key: taken,
                value: b"second",
                cond: Condition::Absent,
            };
            ops.insert(11, insert_taken);
            // Extent writes: one that applies, one to a single value's key
            // and an empty one (both refused).
            let extent_at = ops.len();
            ops.push(WriteOp::Extent {
                key: array,
                offset: 5,
                bytes: b"-more",
            });
            ops.push(WriteOp::Extent {
                key: taken,
                offset: 0,
                bytes: b"x",
            });
            ops.push(WriteOp::Extent {
                key: array,
                offset: 9,
                bytes: b"",
            });
            let commits = store.stats().commits;
            let results = store.write_many(&ops).await;
            assert_eq!(store.stats().commits, commits + 1, "not one commit");
            assert_eq!(crash.unflushed_writes(), 0, "acknowledged before the flush");
            assert_eq!(results.len(), ops.len());
            let mut last = 0;
            for (i, r) in results.iter().enumerate() {
                match (i, r) {
                    (3, r) => assert!(r.is_err(), "an array's key took a single value"),
                    (7, r) => assert!(r.is_err(), "an oversized value was taken"),
                    (i, r) if i == extent_at + 1 => {
                        assert!(r.is_err(), "a single value's key took an extent")
                    }
                    (i, r) if i == extent_at + 2 => assert!(r.is_err(), "an empty extent"),
                    (11, r) => assert_eq!(
                        r.as_ref().ok(),
                        Some(&Conditional::Conflict(Some(taken_version)))
                    ),
                    (_, Ok(Conditional::Applied(v))) => {
                        assert!(*v > last, "versions out of item order");
                        last = *v;
                    }
                    (_, r) => panic!("item {i}: {r:?}"),
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
            let got = store.fetch_extent(&array, 0, 10).await.unwrap();
            assert_eq!(got.map(|(_, v)| v), Some(b"bytes-more".to_vec()));
            assert_eq!(
                store.fetch(&gone).await.unwrap(),
                None,
                "the punch was lost"
            );
            let got = store.fetch(&taken).await.unwrap();
            assert_eq!(got.map(|(_, v)| v), Some(b"first".to_vec()));
        })
        .unwrap()
        .join()
        .unwrap();
}

/// A group's outcomes are those of its writes run in order, also when
/// several touch one key: of two inserts of one name the first wins; an
/// insert after a punch of its name in the same group succeeds; an insert
/// whose name's fate is pending waits for it, and the writes after it
/// still apply after it (the last update of a key is its value).
#[test]
fn a_group_with_writes_of_one_key_runs_them_in_order() {
    glommio::LocalExecutorBuilder::default()
        .spawn(|| async move {
            let bdev = ferrite_bdev::open("malloc:8M").unwrap();
            let config = cfg(Durability::Device, Duration::from_secs(3600));
            let store = Store::open(bdev, config).await.unwrap();
            let k = |name: &'static [u8]| RecordKey::new(1, 9, b"d", name);
            store.update(&k(b"old"), b"x").await.unwrap();
            let absent = Condition::Absent;
            let ops = [
                WriteOp::UpdateIf {
                    key: k(b"new"),
                    value: b"a",
                    cond: absent,
                },
                WriteOp::UpdateIf {
                    key: k(b"new"),
                    value: b"b",
                    cond: absent,
                },
                WriteOp::Punch {
                    key: k(b"old"),
                    dkey: false,
                },
                WriteOp::UpdateIf {
                    key: k(b"old"),
                    value: b"y",
                    cond: absent,
                },
                WriteOp::Update {
                    key: k(b"new"),
                    value: b"c",
                },
                WriteOp::UpdateIf {
                    key: k(b"late"),
                    value: b"z",
                    cond: absent,
                },
            ];
            let out: Vec<_> = store
                .write_many(&ops)
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
            let applied = |c: &Conditional| matches!(c, Conditional::Applied(_));
            assert!(applied(&out[0]), "{out:?}");
            assert!(matches!(out[1], Conditional::Conflict(Some(_))), "{out:?}");
            assert!(
                out.iter()
                    .enumerate()
                    .filter(|(i, _)| *i != 1)
                    .all(|(_, c)| applied(c)),
                "{out:?}"
            );
            for (name, want) in [(&b"new"[..], &b"c"[..]), (b"old", b"y"), (b"late", b"z")] {
                let got = store
                    .fetch(&RecordKey::new(1, 9, b"d", name))
                    .await
                    .unwrap();
                assert_eq!(got.map(|(_, v)| v).as_deref(), Some(want));
            }
        })
        .unwrap()
        .join()
        .unwrap();
}
