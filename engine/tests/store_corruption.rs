//! Device faults (ErrorBdev): bits flipped on reads or writes of the log are
//! detected by the record CRC and reported as errors, never returned as a
//! value; a failed write or flush poisons the store (every later write fails
//! with a clear error, reads go on) until it is reopened.

use ferrite_bdev::wrap::{ErrorBdev, ErrorRule};
use ferrite_bdev::{BdevRef, IoType};
use ferrite_engine::store::{Store, StoreConfig, StoreError};
use ferrite_proto::key::RecordKey;
use std::sync::Arc;

const KEYS: u32 = 300;

fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move { f().await })
        .unwrap()
        .join()
        .unwrap();
}

/// A ring of 256 KiB keeps under a third of the 900 KiB written resident,
/// so most fetches read the device.
fn cfg() -> StoreConfig {
    StoreConfig {
        ring_bytes: 256 << 10,
        max_commit_bytes: 64 << 10,
        ..StoreConfig::small()
    }
}

fn value(k: u32, round: u32) -> Vec<u8> {
    format!("key {k} round {round}|")
        .bytes()
        .cycle()
        .take(3000)
        .collect()
}

async fn fill(s: &Store, round: u32) {
    for k in 0..KEYS {
        let kb = k.to_le_bytes();
        s.update(&RecordKey::new(1, 1, b"d", &kb), &value(k, round))
            .await
            .unwrap();
    }
}

#[test]
fn flipped_bits_on_read_are_detected_never_returned() {
    let errors = Arc::new(ErrorBdev::new(
        ferrite_bdev::open("malloc:16M").unwrap(),
        11,
    ));
    run(move || async move {
        let bdev: BdevRef = errors.clone();
        let s = Store::open(bdev, cfg()).await.unwrap();
        fill(&s, 0).await;
        let log = s.geometry().log_offset;
        errors.add_rule(
            ErrorRule::corrupt(&[IoType::Read])
                .range(log..u64::MAX)
                .probability(0.5),
        );
        let mut detected = 0;
        for k in 0..KEYS {
            let kb = k.to_le_bytes();
            match s.fetch(&RecordKey::new(1, 1, b"d", &kb)).await {
                Ok(Some((_, v))) => assert_eq!(v, value(k, 0), "key {k}: wrong bytes returned"),
                Err(StoreError::Corrupt { .. }) => detected += 1,
                other => panic!("key {k}: unexpected {other:?}"),
            }
        }
        assert!(detected > 0, "no corruption was detected");
        errors.clear_rules();
        for k in 0..KEYS {
            let kb = k.to_le_bytes();
            let got = s.fetch(&RecordKey::new(1, 1, b"d", &kb)).await.unwrap();
            assert_eq!(got.unwrap().1, value(k, 0));
        }
    });
}

#[test]
fn flipped_bits_on_write_are_detected_after_reopen() {
    let errors = Arc::new(ErrorBdev::new(ferrite_bdev::open("malloc:16M").unwrap(), 5));
    let e2 = errors.clone();
    run(move || async move {
        let bdev: BdevRef = errors.clone();
        let s = Store::open(bdev, cfg()).await.unwrap();
        fill(&s, 0).await;
        let log = s.geometry().log_offset;
        errors.add_rule(
            ErrorRule::corrupt(&[IoType::Write])
                .range(log..u64::MAX)
                .probability(0.3),
        );
        fill(&s, 1).await;
        errors.clear_rules();
        assert!(errors.injected() > 0);
        let mut detected = 0;
        for k in 0..KEYS {
            let kb = k.to_le_bytes();
            match s.fetch(&RecordKey::new(1, 1, b"d", &kb)).await {
                Ok(Some((_, v))) => assert_eq!(v, value(k, 1), "key {k}: wrong bytes"),
                Err(StoreError::Corrupt { .. }) => detected += 1,
                other => panic!("key {k}: unexpected {other:?}"),
            }
        }
        assert!(detected > 0, "no corruption was detected");
    });
    run(move || async move {
        // Recovery skips each record that fails its CRC and keeps every
        // other: a key whose newest record was damaged on its way to the
        // device holds its older value (or none, if that was damaged too),
        // never other bytes, and every damaged record before the last
        // commits is counted. (Each corrupted write flips one byte, so
        // damages at most one record.)
        let injected = e2.injected();
        let bdev: BdevRef = e2;
        let s = Store::open(bdev, cfg()).await.unwrap();
        let mut lost_early = 0;
        for k in 0..KEYS {
            let kb = k.to_le_bytes();
            match s.fetch(&RecordKey::new(1, 1, b"d", &kb)).await.unwrap() {
                Some((_, v)) if v == value(k, 1) => {}
                Some((_, v)) => assert_eq!(v, value(k, 0), "key {k}: wrong bytes"),
                None => {}
            }
            let intact = s.fetch(&RecordKey::new(1, 1, b"d", &kb)).await.unwrap();
            // Damage in the last commits (one update each) may be their
            // torn end: it is not counted (`engine/FORMAT.md`, Recovery).
            if intact.is_none_or(|(_, v)| v != value(k, 1)) && k + 3 < KEYS {
                lost_early += 1;
            }
        }
        let counted = s.stats().corrupt_records;
        assert!(
            lost_early <= counted,
            "{lost_early} keys lost, {counted} counted"
        );
        assert!(
            counted <= injected,
            "{counted} counted, {injected} injected"
        );
    });
}

#[test]
fn failed_write_or_flush_poisons_until_reopen() {
    for io in [IoType::Write, IoType::Flush] {
        let errors = Arc::new(ErrorBdev::new(ferrite_bdev::open("malloc:16M").unwrap(), 1));
        let e2 = errors.clone();
        run(move || async move {
            let bdev: BdevRef = errors.clone();
            let s = Store::open(bdev, cfg()).await.unwrap();
            let k = RecordKey::new(1, 1, b"d", b"a");
            s.update(&k, b"before").await.unwrap();
            errors.add_rule(ErrorRule::fail(&[io]).max_hits(1));
            assert!(matches!(
                s.update(&k, b"lost").await,
                Err(StoreError::Device { .. })
            ));
            let again = s.update(&RecordKey::new(1, 1, b"d", b"b"), b"x").await;
            let Err(StoreError::Poisoned { cause, .. }) = again else {
                panic!("{io:?}: a write after the failure was not refused: {again:?}");
            };
            assert!(!cause.is_empty());
            assert!(matches!(
                s.checkpoint().await,
                Err(StoreError::Poisoned { .. })
            ));
            assert_eq!(s.fetch(&k).await.unwrap().unwrap().1, b"before");
        });
        run(move || async move {
            let bdev: BdevRef = e2;
            let s = Store::open(bdev, cfg()).await.unwrap();
            let k = RecordKey::new(1, 1, b"d", b"a");
            let v = s.fetch(&k).await.unwrap().unwrap().1;
            assert!(v == b"before" || v == b"lost");
            s.update(&k, b"after").await.unwrap();
            assert_eq!(s.fetch(&k).await.unwrap().unwrap().1, b"after");
        });
    }
}

/// Verify (what a scrub asks for) reads every record of a key back from the
/// device and checks it, where a fetch of a record still in the memory ring
/// never looks at the device: bits flipped on the way back from the device
/// are reported with the record's address, and the listing of a
/// container's objects names every object holding a key.
#[test]
fn verify_reads_each_record_back_from_the_device() {
    use ferrite_proto::rpc::Verified;
    let errors = Arc::new(ErrorBdev::new(ferrite_bdev::open("malloc:16M").unwrap(), 3));
    run(move || async move {
        let bdev: BdevRef = errors.clone();
        let s = Store::open(bdev, cfg()).await.unwrap();
        let single = RecordKey::new(4, 1, b"d", b"a");
        let array = RecordKey::new(4, 9, b"d", b"arr");
        let big = value(1, 0);
        s.update(&single, &big).await.unwrap();
        for (offset, len) in [(0, 100), (50, 100), (400, 10)] {
            let data = vec![7u8; len];
            s.update_extent(&array, offset, &data).await.unwrap();
        }
        s.update(&RecordKey::new(5, 2, b"d", b"a"), b"x")
            .await
            .unwrap();
        assert_eq!(s.list_objects(4, None, 10), vec![1, 9]);
        assert_eq!(s.list_objects(4, Some(1), 10), vec![9]);
        let intact = |records, value_bytes| Verified::Intact {
            records,
            value_bytes,
        };
        assert_eq!(s.verify(&single).await.unwrap(), intact(1, 3000));
        assert_eq!(s.verify(&array).await.unwrap(), intact(3, 210));
        let absent = RecordKey::new(4, 1, b"d", b"b");
        assert_eq!(s.verify(&absent).await.unwrap(), Verified::Absent);

        let log = s.geometry().log_offset;
        // Every device read of the log comes back with one byte inverted
        // somewhere in the blocks read: in the record most of the time.
        errors.add_rule(ErrorRule::corrupt(&[IoType::Read]).range(log..u64::MAX));
        let mut found = 0;
        for _ in 0..50 {
            let fetched = s.fetch(&single).await.unwrap().unwrap().1;
            assert_eq!(fetched, big, "the fetch reads the ring");
            match s.verify(&single).await.unwrap() {
                Verified::Corrupt {
                    records: 0, reason, ..
                } => {
                    assert!(reason.contains("on the device"), "{reason}");
                    found += 1;
                }
                other => assert_eq!(other, intact(1, 3000)),
            }
        }
        assert!(found > 0, "no flipped byte was found");
        errors.clear_rules();
        assert_eq!(s.verify(&single).await.unwrap(), intact(1, 3000));
    });
}
