//! Cold writes: a single value whose key's newest record is more than two
//! rings of log old goes to the cold segment, not the hot head. Its value
//! reads back, also after a reopen; an update racing it on the same key
//! goes to the hot head; and replay reaches the same state as the running
//! store had, key by key.

use ferrite_engine::store::{Store, StoreConfig};
use ferrite_proto::key::RecordKey;
use std::rc::Rc;

const RING: u64 = 256 << 10;

fn cfg(cold_writes: bool) -> StoreConfig {
    StoreConfig {
        ring_bytes: RING,
        segment_bytes: 64 << 10,
        max_commit_bytes: 64 << 10,
        checkpoint_bytes: 512 << 10,
        cold_writes,
        ..StoreConfig::small()
    }
}

fn key(k: u32) -> [u8; 4] {
    k.to_le_bytes()
}

async fn put(s: &Store, k: u32, v: &[u8]) {
    let kb = key(k);
    s.update(&RecordKey::new(1, 1, b"d", &kb), v).await.unwrap();
}

async fn get(s: &Store, k: u32) -> Option<Vec<u8>> {
    let kb = key(k);
    let got = s.fetch(&RecordKey::new(1, 1, b"d", &kb)).await.unwrap();
    got.map(|g| g.1)
}

fn value(k: u32, seq: u32) -> Vec<u8> {
    format!("{k}/{seq}|").bytes().cycle().take(1000).collect()
}

/// Rewrites the hot keys `1000..1016` until the log has grown by three
/// rings: every other key's newest record is then over two rings old.
async fn churn(s: &Store, seq: u32) {
    let start = s.stats().bytes_appended;
    let mut i = 0;
    while s.stats().bytes_appended < start + 3 * RING {
        put(s, 1000 + i % 16, &value(1000 + i % 16, seq)).await;
        i += 1;
    }
}

/// Runs `body` on a store over `bdev`, then reopens it and runs `after`.
fn with_reopen<B, BF, A, AF>(cold_writes: bool, body: B, after: A)
where
    B: FnOnce(Rc<Store>) -> BF + Send + 'static,
    BF: std::future::Future<Output = ()> + 'static,
    A: FnOnce(Store) -> AF + Send + 'static,
    AF: std::future::Future<Output = ()> + 'static,
{
    let bdev = ferrite_bdev::open("malloc:16M").unwrap();
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let s = Rc::new(Store::open(bdev.clone(), cfg(cold_writes)).await.unwrap());
            body(s.clone()).await;
            drop(s);
            after(Store::open(bdev, cfg(cold_writes)).await.unwrap()).await;
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn an_old_keys_update_goes_to_the_cold_segment_and_a_recent_ones_does_not() {
    with_reopen(
        true,
        |s| async move {
            put(&s, 1, &value(1, 0)).await;
            churn(&s, 0).await;
            assert_eq!(s.stats().cold_writes, 0);
            put(&s, 1, &value(1, 1)).await;
            assert_eq!(s.stats().cold_writes, 1, "{:?}", s.stats());
            // Written a moment ago: hot again.
            put(&s, 1, &value(1, 2)).await;
            assert_eq!(s.stats().cold_writes, 1);
            assert_eq!(get(&s, 1).await, Some(value(1, 2)));
            // Cold once more, and the last write the key gets.
            churn(&s, 1).await;
            put(&s, 1, &value(1, 3)).await;
            assert_eq!(s.stats().cold_writes, 2);
            assert_eq!(get(&s, 1).await, Some(value(1, 3)));
        },
        |s| async move {
            assert_eq!(get(&s, 1).await, Some(value(1, 3)));
        },
    );
}

#[test]
fn with_cold_writes_off_every_update_goes_to_the_hot_head() {
    with_reopen(
        false,
        |s| async move {
            put(&s, 1, &value(1, 0)).await;
            churn(&s, 0).await;
            put(&s, 1, &value(1, 1)).await;
            assert_eq!(s.stats().cold_writes, 0);
        },
        |s| async move {
            assert_eq!(get(&s, 1).await, Some(value(1, 1)));
        },
    );
}

/// Two tasks write the same old keys at once, in the same order: the
/// first punches every other key and updates the rest, the second updates
/// them all. The first write of a key may go cold; the one racing it
/// finds it pending and goes to the hot head, above it. (A second write
/// placed in the cold segment below a pending punch at the hot head would
/// be published after the punch but replayed before it.) The reopened
/// store holds what the running one held for every key.
#[test]
fn racing_writes_of_old_keys_replay_to_the_state_they_left() {
    const KEYS: u32 = 64;
    with_reopen(
        true,
        |s| async move {
            for k in 0..KEYS {
                put(&s, k, &value(k, 0)).await;
            }
            for round in 1..4u32 {
                churn(&s, round).await;
                let tasks: Vec<_> = (0..2u32)
                    .map(|t| {
                        let s = s.clone();
                        glommio::spawn_local(async move {
                            for k in 0..KEYS {
                                let kb = key(k);
                                let rk = RecordKey::new(1, 1, b"d", &kb);
                                if t == 0 && k % 2 == 0 {
                                    s.punch(&rk).await.unwrap();
                                } else {
                                    s.update(&rk, &value(k, round * 10 + t)).await.unwrap();
                                }
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await;
                }
            }
            let st = s.stats();
            assert!(st.cold_writes >= u64::from(KEYS / 2), "{st:?}");
            // What each key holds, stashed in a new key of its own.
            for k in 0..KEYS {
                let v = get(&s, k).await.unwrap_or_else(|| b"absent".to_vec());
                put(&s, 6000 + k, &v).await;
            }
        },
        |s| async move {
            for k in 0..KEYS {
                let v = get(&s, k).await.unwrap_or_else(|| b"absent".to_vec());
                assert_eq!(Some(v), get(&s, 6000 + k).await, "key {k}");
            }
        },
    );
}
