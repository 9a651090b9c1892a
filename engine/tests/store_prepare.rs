//! Guards the preparation of log slots (`store::prepare`): at device
//! durability, on a sparse file, the slots the log is about to open get
//! their holes filled in the background, so the log's durable writes land
//! on allocated blocks; every update still reads back; at process
//! durability nothing is prepared.

use std::os::unix::fs::MetadataExt;
use std::rc::Rc;

use ferrite_engine::store::{Durability, Store, StoreConfig, StoreStats};
use ferrite_proto::key::RecordKey;

/// Updates of `VALUE` bytes: about 12 segments of `StoreConfig::small()`.
const UPDATES: u32 = 3000;
const VALUE: usize = 1000;

/// Runs `UPDATES` updates at `durability` on a new sparse 64 MiB file and
/// checks they read back; returns the store's counters and the file's
/// allocated bytes.
fn run(durability: Durability) -> (StoreStats, u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.img");
    let spec = format!("uring:{}?size=64M&direct=1", path.display());
    let stats = glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let config = StoreConfig {
                durability,
                ..StoreConfig::small()
            };
            let bdev = ferrite_bdev::open(&spec).unwrap();
            let s = Rc::new(Store::open(bdev, config).await.unwrap());
            s.spawn_cleaner();
            for i in 0..UPDATES {
                let v = vec![(i % 251) as u8; VALUE];
                s.update(&RecordKey::new(1, 1, &i.to_le_bytes(), b""), &v)
                    .await
                    .unwrap();
            }
            for i in 0..UPDATES {
                let got = s
                    .fetch(&RecordKey::new(1, 1, &i.to_le_bytes(), b""))
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(got.1, vec![(i % 251) as u8; VALUE], "key {i}");
            }
            s.stop_cleaner();
            s.stats()
        })
        .unwrap()
        .join()
        .unwrap();
    let allocated = std::fs::metadata(&path).unwrap().blocks() * 512;
    (stats, allocated)
}

#[test]
fn device_durability_prepares_the_slots_ahead_of_the_log() {
    let (stats, allocated) = run(Durability::Device);
    let seg = stats.segment_bytes;
    let opened = stats.bytes_appended / seg;
    assert!(opened >= 8, "{stats:?}");
    // Every segment the log opened after the first was prepared first, and
    // the next one too (at least most of them: the cleaner's and the hot
    // head's openings can come close together).
    assert!(stats.slots_prepared >= opened - 2, "{stats:?}");
    assert!(
        stats.prepare_bytes_filled >= (opened - 2) * seg,
        "{stats:?}"
    );
    assert_eq!(stats.prepare_failures, 0, "{stats:?}");
    assert!(
        allocated >= stats.prepare_bytes_filled,
        "{allocated} bytes allocated"
    );
}

#[test]
fn process_durability_prepares_nothing() {
    let (stats, _) = run(Durability::Process);
    assert!(stats.bytes_appended / stats.segment_bytes >= 8, "{stats:?}");
    assert_eq!(stats.slots_prepared, 0, "{stats:?}");
    assert_eq!(stats.prepare_bytes_filled, 0, "{stats:?}");
}
