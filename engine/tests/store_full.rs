//! A store filled to its space ceiling: writes that would take the live
//! data past it fail at once with "no space" (`LogFull`, the RPC's
//! `NoSpace`), never by waiting; every acknowledged write reads back, also
//! after a reopen; deletes are admitted at the ceiling and make room, so
//! writes succeed again. And the cleaner's write amplification (bytes it
//! copies per byte the foreground writes) stays within what the fill level
//! allows, at 50, 70 and 85 % of the log's capacity.

use ferrite_engine::store::{Store, StoreConfig, StoreError};
use ferrite_proto::key::RecordKey;
use ferrite_proto::record::record_len;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Longest any one write may take: a write that waits this long instead of
/// failing is the livelock this test exists for.
const WRITE_DEADLINE: Duration = Duration::from_secs(30);

fn cfg() -> StoreConfig {
    StoreConfig {
        ring_bytes: 1 << 20,
        segment_bytes: 256 << 10,
        max_commit_bytes: 256 << 10,
        checkpoint_bytes: 1 << 20,
        ..StoreConfig::small()
    }
}

fn key_of(k: u32) -> [u8; 4] {
    k.to_le_bytes()
}

fn value(k: u32, round: u32, len: usize) -> Vec<u8> {
    format!("{k}/{round}|").bytes().cycle().take(len).collect()
}

/// One update, failing the test if it neither succeeds nor fails within
/// [`WRITE_DEADLINE`].
async fn put(s: &Store, k: u32, v: &[u8]) -> Result<u64, StoreError> {
    let kb = key_of(k);
    let key = RecordKey::new(1, 1, b"d", &kb);
    let write = std::pin::pin!(s.update(&key, v));
    let timer = std::pin::pin!(glommio::timer::sleep(WRITE_DEADLINE));
    match futures::future::select(write, timer).await {
        futures::future::Either::Left((r, _)) => r,
        futures::future::Either::Right(_) => {
            panic!(
                "a write of key {k} neither succeeded nor failed in {WRITE_DEADLINE:?}: {:?}",
                s.stats()
            )
        }
    }
}

async fn get(s: &Store, k: u32) -> Option<Vec<u8>> {
    let kb = key_of(k);
    let got = s.fetch(&RecordKey::new(1, 1, b"d", &kb)).await.unwrap();
    got.map(|g| g.1)
}

async fn punch(s: &Store, k: u32) {
    let kb = key_of(k);
    if let Err(e) = s.punch(&RecordKey::new(1, 1, b"d", &kb)).await {
        panic!("punch {k}: {e}: {:#?}", s.stats());
    }
}

/// Writes new keys of `len` bytes until the first failure (at most
/// `max_keys`); returns how many were acknowledged and the error.
async fn fill(s: &Store, len: usize, max_keys: u32) -> (u32, StoreError) {
    for k in 0..max_keys {
        if let Err(e) = put(s, k, &value(k, 0, len)).await {
            return (k, e);
        }
    }
    panic!("{max_keys} keys of {len} bytes all fit: {:?}", s.stats());
}

/// Fills a fresh store on a 16 MiB malloc device with values of `len`
/// bytes to its ceiling and checks everything the module doc says.
fn fill_to_no_space(len: usize) {
    let bdev = ferrite_bdev::open("malloc:16M").unwrap();
    let again = bdev.clone();
    // Slots for every key small values fit in (each takes one), and a
    // checkpoint area their index fits in.
    let config = StoreConfig {
        bucket_count: 1 << 15,
        overflow_buckets: 1 << 13,
        checkpoint_bytes: 2 << 20,
        ..cfg()
    };
    let config2 = config.clone();
    let acked = glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let s = Rc::new(Store::open(bdev, config).await.unwrap());
            let cleaner = s.spawn_cleaner();
            let start = Instant::now();
            let (acked, err) = fill(&s, len, 1_000_000).await;
            let st = s.stats();
            println!(
                "store_full: {len}-byte values: {acked} acknowledged in {:.2} s, then: {err}; \
                 live {} of log {} (ceiling {}), cleaner copied {} bytes",
                start.elapsed().as_secs_f64(),
                st.live_bytes,
                st.log_capacity_bytes,
                st.live_ceiling_bytes,
                st.cleaner_bytes_copied
            );
            assert!(matches!(err, StoreError::LogFull { .. }), "{err}");
            assert!(err.to_string().contains("no space"), "{err}");
            let rec = record_len(&RecordKey::new(1, 1, b"d", &key_of(0)), len) as u64;
            // Refused only once the next record would pass the ceiling,
            // and never let past it.
            assert!(st.live_bytes <= st.live_ceiling_bytes, "{st:?}");
            assert!(st.live_bytes + rec > st.live_ceiling_bytes, "{st:?}");
            assert_eq!(
                st.live_ceiling_bytes,
                st.log_usable_bytes / 100 * 85,
                "{st:?}"
            );
            assert!(
                st.log_usable_bytes >= st.log_capacity_bytes * 8 / 10,
                "{st:?}"
            );
            assert_eq!(st.writes_refused_full, 1, "{st:?}");
            // Nothing is dead, so no pass could free a segment: the cleaner
            // stays idle rather than copying and checkpointing for nothing.
            glommio::timer::sleep(Duration::from_millis(500)).await;
            let idle = s.stats();
            assert_eq!(idle.cleaner_passes, st.cleaner_passes, "{idle:?}");
            assert_eq!(idle.checkpoints, st.checkpoints, "{idle:?}");
            // A full store refuses again, at once.
            assert!(matches!(
                put(&s, acked, &value(acked, 0, len)).await,
                Err(StoreError::LogFull { .. })
            ));
            for k in 0..acked {
                assert_eq!(get(&s, k).await, Some(value(k, 0, len)), "key {k}");
            }
            // Deletes are admitted at the ceiling and make room.
            for k in (0..acked).step_by(2) {
                punch(&s, k).await;
            }
            for k in acked..acked + acked / 4 {
                put(&s, k, &value(k, 1, len)).await.unwrap();
            }
            // Overwrites of the same size are admitted too.
            for k in (1..acked).step_by(2).take(20) {
                put(&s, k, &value(k, 2, len)).await.unwrap();
            }
            s.stop_cleaner();
            cleaner.await;
            acked
        })
        .unwrap()
        .join()
        .unwrap();
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let s = Store::open(again, config2).await.unwrap();
            for k in 0..acked + acked / 4 {
                let want = if k >= acked {
                    Some(value(k, 1, len))
                } else if k % 2 == 0 {
                    None
                } else if k < 40 {
                    Some(value(k, 2, len))
                } else {
                    Some(value(k, 0, len))
                };
                assert_eq!(get(&s, k).await, want, "key {k} after reopen");
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

/// A checkpoint area too small for the index of every key that fits the
/// log: new keys are refused ("no space for the index") before the index
/// outgrows it, so the cleaner's checkpoints keep working, deletes are
/// admitted and make room.
#[test]
fn new_keys_are_refused_before_the_index_outgrows_its_checkpoint_area() {
    let bdev = ferrite_bdev::open("malloc:16M").unwrap();
    let config = StoreConfig {
        bucket_count: 1 << 15,
        overflow_buckets: 1 << 13,
        ..cfg()
    };
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let s = Rc::new(Store::open(bdev, config).await.unwrap());
            let cleaner = s.spawn_cleaner();
            let (acked, err) = fill(&s, 200, 1_000_000).await;
            println!(
                "store_full: 200-byte values, 1 MiB checkpoint area: {acked} keys, then: {err}"
            );
            assert!(
                matches!(err, StoreError::CheckpointTooLarge { .. }),
                "{err}"
            );
            assert!(err.to_string().contains("no space"), "{err}");
            for k in (0..acked).step_by(2) {
                punch(&s, k).await;
            }
            for k in acked..acked + acked / 4 {
                put(&s, k, &value(k, 1, 200)).await.unwrap();
            }
            s.checkpoint().await.unwrap();
            assert_eq!(s.stats().cleaner_failures, 0, "{:?}", s.stats());
            for k in 0..acked + acked / 4 {
                let want = (k >= acked).then(|| value(k, 1, 200));
                let want = if k < acked && k % 2 == 1 {
                    Some(value(k, 0, 200))
                } else {
                    want
                };
                assert_eq!(get(&s, k).await, want, "key {k}");
            }
            s.stop_cleaner();
            cleaner.await;
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn large_values_fill_to_no_space_and_every_acknowledged_one_reads_back() {
    fill_to_no_space(16 << 10);
}

#[test]
fn small_values_fill_to_no_space_and_every_acknowledged_one_reads_back() {
    fill_to_no_space(400);
}

/// Fills a fresh store to `percent` % of its log's usable capacity (the
/// log less the segments no live record can use, `log_usable_bytes`) with
/// 4 KiB values, then overwrites keys picked at random (uniformly) for
/// twice the log's capacity; returns the cleaner's bytes copied per byte written by
/// the overwrites.
fn write_amp_at(percent: u64) -> f64 {
    const LEN: usize = 4000;
    let bdev = ferrite_bdev::open("malloc:16M").unwrap();
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let s = Rc::new(Store::open(bdev, cfg()).await.unwrap());
            let cleaner = s.spawn_cleaner();
            let rec = record_len(&RecordKey::new(1, 1, b"d", &key_of(0)), LEN) as u64;
            let (cap, usable) = (s.stats().log_capacity_bytes, s.stats().log_usable_bytes);
            // (At 85 % a few records short: the ceiling is 85 %.)
            let keys = (usable * percent / 100 / rec) as u32 - 4;
            for k in 0..keys {
                put(&s, k, &value(k, 0, LEN)).await.unwrap();
            }
            let before = s.stats();
            let updates = 2 * cap / rec;
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            for i in 0..updates {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let k = (x % u64::from(keys)) as u32;
                if let Err(e) = put(&s, k, &value(k, i as u32 + 1, LEN)).await {
                    panic!("overwrite {i}: {e}: {:#?}", s.stats());
                }
            }
            let after = s.stats();
            let written = after.bytes_appended - before.bytes_appended;
            let copied = after.cleaner_bytes_copied - before.cleaner_bytes_copied;
            let amp = copied as f64 / (written - copied) as f64;
            println!(
                "store_full: {percent} % full ({keys} keys of {LEN} bytes): {updates} overwrites, \
                 cleaner copied {copied} bytes per {} written: write amplification {amp:.2} \
                 (cleaner_write_amp {:.2}), {} passes, {} checkpoints",
                written - copied,
                after.cleaner_write_amp,
                after.cleaner_passes - before.cleaner_passes,
                after.checkpoints - before.checkpoints,
            );
            s.stop_cleaner();
            cleaner.await;
            amp
        })
        .unwrap()
        .join()
        .unwrap()
}

/// Uniform overwrites leave every sealed segment about as full as the log
/// on average, so the emptiest segment (what the cleaner copies, when it
/// is behind) is at most that full: copying `u` of a segment frees `1 - u`,
/// at most `u / (1 - u)` bytes copied per byte written at utilisation `u`
/// (the live data over the log's usable capacity). A cleaner that copies the same
/// live data again and again, or cleans segments it cannot free, passes it.
#[test]
fn the_cleaner_copies_no_more_than_the_fill_level_allows() {
    for percent in [50u64, 70, 85] {
        let amp = write_amp_at(percent);
        let u = percent as f64 / 100.0;
        let bound = u / (1.0 - u);
        assert!(
            amp <= bound,
            "{percent} % full: write amplification {amp:.2} over {bound:.2}"
        );
    }
}
