//! Guards the store's operations end to end on a malloc device: values,
//! extents, punches at every level, sorted paged listings, conditional
//! updates, evicted records read back from the device, and reopening; and
//! fetches of concurrent tasks: they overlap (each yields after starting its
//! bucket's and its record's loads), and a fetch suspended that way still
//! returns a whole value its key held, never older than its task saw before,
//! while updates overwrite the keys and wrap the ring under it.

use ferrite_bdev::BdevRef;
use ferrite_engine::store::{Condition, Conditional, Store, StoreConfig, StoreError};
use ferrite_proto::key::RecordKey;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move { f().await })
        .unwrap()
        .join()
        .unwrap();
}

fn dev() -> BdevRef {
    ferrite_bdev::open("malloc:16M").unwrap()
}

#[test]
fn update_fetch_punch_and_versions() {
    run(|| async {
        let s = Store::open(dev(), StoreConfig::small()).await.unwrap();
        let k = RecordKey::new(1, 2, b"d", b"a");
        assert!(s.fetch(&k).await.unwrap().is_none());
        let v1 = s.update(&k, b"one").await.unwrap();
        let v2 = s.update(&k, b"two").await.unwrap();
        assert!(v2 > v1);
        assert_eq!(s.fetch(&k).await.unwrap(), Some((v2, b"two".to_vec())));
        s.punch(&k).await.unwrap();
        assert!(s.fetch(&k).await.unwrap().is_none());
        assert_eq!(s.stats().keys, 0);
        assert_eq!(s.stats().bucket_slots_used, 0);
    });
}

#[test]
fn extents_assemble_newest_bytes_with_zero_holes() {
    run(|| async {
        let s = Store::open(dev(), StoreConfig::small()).await.unwrap();
        let k = RecordKey::new(1, 2, b"file", b"chunk0");
        s.update_extent(&k, 10, b"aaaaaaaaaa").await.unwrap();
        s.update_extent(&k, 15, b"bbb").await.unwrap();
        let (_, got) = s.fetch_extent(&k, 0, 30).await.unwrap().unwrap();
        let mut want = vec![0u8; 30];
        want[10..20].copy_from_slice(b"aaaaaaaaaa");
        want[15..18].copy_from_slice(b"bbb");
        assert_eq!(got, want);
        assert!(matches!(
            s.update(&k, b"x").await,
            Err(StoreError::WrongKind { .. })
        ));
        assert!(matches!(
            s.fetch(&k).await,
            Err(StoreError::WrongKind { .. })
        ));
        s.punch(&k).await.unwrap();
        assert!(s.fetch_extent(&k, 0, 30).await.unwrap().is_none());
    });
}

#[test]
fn listing_is_sorted_paged_and_punches_cascade() {
    run(|| async {
        let s = Store::open(dev(), StoreConfig::small()).await.unwrap();
        for d in [b"d3".as_slice(), b"d1", b"d2"] {
            for a in [b"a2".as_slice(), b"a1"] {
                s.update(&RecordKey::new(5, 6, d, a), b"v").await.unwrap();
            }
        }
        s.update(&RecordKey::new(5, 7, b"other", b"a"), b"v")
            .await
            .unwrap();
        assert_eq!(
            s.list_dkeys(5, 6, None, 2),
            vec![b"d1".to_vec(), b"d2".to_vec()]
        );
        assert_eq!(s.list_dkeys(5, 6, Some(b"d2"), 2), vec![b"d3".to_vec()]);
        assert_eq!(
            s.list_akeys(5, 6, b"d1", None, 10),
            vec![b"a1".to_vec(), b"a2".to_vec()]
        );
        s.punch_dkey(5, 6, b"d2").await.unwrap();
        assert_eq!(
            s.list_dkeys(5, 6, None, 10),
            vec![b"d1".to_vec(), b"d3".to_vec()]
        );
        assert!(s
            .fetch(&RecordKey::new(5, 6, b"d2", b"a1"))
            .await
            .unwrap()
            .is_none());
        s.punch_object(5, 6).await.unwrap();
        assert!(s.list_dkeys(5, 6, None, 10).is_empty());
        assert_eq!(s.stats().keys, 1);
        assert_eq!(s.stats().bucket_slots_used, 1);
    });
}

#[test]
fn conditional_updates() {
    run(|| async {
        let s = Store::open(dev(), StoreConfig::small()).await.unwrap();
        let k = RecordKey::new(1, 1, b"meta", b"lock");
        let Conditional::Applied(v1) = s.update_if(&k, b"a", Condition::Absent).await.unwrap()
        else {
            panic!("insert-if-absent on an absent key conflicted");
        };
        assert_eq!(
            s.update_if(&k, b"b", Condition::Absent).await.unwrap(),
            Conditional::Conflict(Some(v1))
        );
        assert_eq!(
            s.update_if(&k, b"b", Condition::Version(v1 + 100))
                .await
                .unwrap(),
            Conditional::Conflict(Some(v1))
        );
        let r = s.update_if(&k, b"c", Condition::Version(v1)).await.unwrap();
        let Conditional::Applied(v2) = r else {
            panic!("compare-version with the current version conflicted: {r:?}");
        };
        assert_eq!(s.fetch(&k).await.unwrap(), Some((v2, b"c".to_vec())));
    });
}

/// The kind check of a write (and the new-key count) is answered from the
/// buckets and the ring while a key's record is resident, and from the
/// directory once it was evicted: both give the same answer.
#[test]
fn kind_checks_hold_for_resident_and_evicted_keys() {
    run(|| async {
        let s = Store::open(dev(), StoreConfig::small()).await.unwrap();
        let single = RecordKey::new(3, 3, b"d", b"single");
        let array = RecordKey::new(3, 3, b"d", b"array");
        s.update(&single, b"v").await.unwrap();
        s.update_extent(&array, 0, b"bytes").await.unwrap();
        let check = |evicted: bool| {
            let s = &s;
            async move {
                let r = s.update_extent(&single, 0, b"x").await;
                assert!(
                    matches!(r, Err(StoreError::WrongKind { .. })),
                    "{evicted}: {r:?}"
                );
                let r = s.update(&array, b"x").await;
                assert!(
                    matches!(r, Err(StoreError::WrongKind { .. })),
                    "{evicted}: {r:?}"
                );
            }
        };
        check(false).await;
        let filler = vec![1u8; 3000];
        for i in 0..800u32 {
            let a = i.to_le_bytes();
            s.update(&RecordKey::new(4, 4, b"d", &a), &filler)
                .await
                .unwrap();
        }
        assert!(
            s.stats().head > 2 * s.stats().ring_bytes,
            "nothing was evicted"
        );
        check(true).await;
        let keys = s.stats().keys;
        // Rewriting evicted keys adds no key; a fresh key adds one.
        s.update(&single, b"w").await.unwrap();
        s.update_extent(&array, 2, b"yy").await.unwrap();
        assert_eq!(s.stats().keys, keys);
        s.update(&RecordKey::new(3, 3, b"d", b"fresh"), b"v")
            .await
            .unwrap();
        assert_eq!(s.stats().keys, keys + 1);
        let (_, got) = s.fetch_extent(&array, 0, 5).await.unwrap().unwrap();
        assert_eq!(got, b"byyys");
    });
}

#[test]
fn evicted_records_are_read_from_the_device_and_survive_reopen() {
    let bdev = dev();
    let b2 = bdev.clone();
    run(move || async move {
        let s = Store::open(bdev, StoreConfig::small()).await.unwrap();
        let value = vec![7u8; 3000];
        for i in 0..1000u32 {
            let a = i.to_le_bytes();
            let k = RecordKey::new(1, 1, b"d", &a);
            s.update(&k, &value).await.unwrap();
        }
        assert!(s.stats().head > 2 * s.stats().ring_bytes);
        let a0 = 0u32.to_le_bytes();
        let k0 = RecordKey::new(1, 1, b"d", &a0);
        assert_eq!(s.fetch(&k0).await.unwrap().unwrap().1, value);
        assert!(s.stats().device_reads > 0);
    });
    run(move || async move {
        let s = Store::open(b2, StoreConfig::small()).await.unwrap();
        assert_eq!(s.stats().keys, 1000);
        // The last ring's worth of replayed records is resident again.
        let reads = s.stats().device_reads;
        let last = 999u32.to_le_bytes();
        let got = s.fetch(&RecordKey::new(1, 1, b"d", &last)).await.unwrap();
        assert_eq!(got.unwrap().1, vec![7u8; 3000]);
        assert_eq!(s.stats().device_reads, reads);
        for i in (0..1000u32).step_by(37) {
            let a = i.to_le_bytes();
            let k = RecordKey::new(1, 1, b"d", &a);
            assert_eq!(s.fetch(&k).await.unwrap().unwrap().1, vec![7u8; 3000]);
        }
    });
}

/// Even bytes only: a superseded mark (bit 0 of a state word) shows.
fn fill_value(i: u32) -> Vec<u8> {
    (0..3000u32).map(|j| ((i + j) * 2) as u8).collect()
}

/// Writes fill records `from`, `from + 1`, … until the log head reaches
/// `upto`; returns the next fill number.
async fn fill(s: &Store, mut from: u32, upto: u64) -> u32 {
    while s.stats().head < upto {
        let b = from.to_le_bytes();
        s.update(&RecordKey::new(1, 1, b"f", &b), &fill_value(from))
            .await
            .unwrap();
        from += 1;
    }
    from
}

/// Replay marks the record a key's update supersedes. A record the
/// checkpoint references may sit where a later, replayed record now is in the
/// ring: marking it there flipped a bit of that record's value, which a
/// fetch then returned (the ring is trusted, not checked).
#[test]
fn replay_marks_only_records_still_in_the_ring() {
    let bdev = dev();
    let b2 = bdev.clone();
    run(move || async move {
        let s = Store::open(bdev, StoreConfig::small()).await.unwrap();
        let ring = s.stats().ring_bytes;
        let ka = RecordKey::new(1, 1, b"a", b"a");
        // Away from a multiple of the ring, so that the fill record at the
        // same ring bytes has value bytes there.
        s.update(&RecordKey::new(1, 1, b"a", b"pre"), &[1; 1000])
            .await
            .unwrap();
        s.update(&ka, b"first").await.unwrap();
        let a = s.stats().head;
        let n = fill(&s, 0, a + ring / 2).await;
        s.checkpoint().await.unwrap();
        // Fill records now cover the ring bytes the first record had.
        fill(&s, n, a + ring + 8192).await;
        s.update(&ka, b"second").await.unwrap();
    });
    run(move || async move {
        let s = Store::open(b2, StoreConfig::small()).await.unwrap();
        let ka = RecordKey::new(1, 1, b"a", b"a");
        assert_eq!(s.fetch(&ka).await.unwrap().unwrap().1, b"second");
        let mut n = 0u32;
        while let Some((_, v)) = s
            .fetch(&RecordKey::new(1, 1, b"f", &n.to_le_bytes()))
            .await
            .unwrap()
        {
            assert!(v == fill_value(n), "fill {n} came back changed");
            n += 1;
        }
        assert!(n > 300, "{n} fills");
    });
}

#[test]
fn bad_input_is_refused_without_harm() {
    run(|| async {
        let s = Store::open(dev(), StoreConfig::small()).await.unwrap();
        let long = vec![0u8; 5000];
        let k = RecordKey::new(1, 1, &long, b"a");
        assert!(matches!(
            s.update(&k, b"x").await,
            Err(StoreError::Invalid(_))
        ));
        let k = RecordKey::new(1, 1, b"d", b"a");
        let big = vec![0u8; (1 << 20) + 1];
        assert!(matches!(
            s.update(&k, &big).await,
            Err(StoreError::Invalid(_))
        ));
        s.update(&k, b"ok").await.unwrap();
        assert_eq!(s.fetch(&k).await.unwrap().unwrap().1, b"ok");
    });
}

#[test]
fn full_index_refuses_new_keys_only() {
    run(|| async {
        let cfg = StoreConfig {
            bucket_count: 4,
            overflow_buckets: 4,
            ..StoreConfig::small()
        };
        let s = Store::open(dev(), cfg).await.unwrap();
        let mut stored = 0u32;
        for i in 0..100u32 {
            let a = i.to_le_bytes();
            match s.update(&RecordKey::new(1, 1, b"d", &a), b"v").await {
                Ok(_) => stored += 1,
                Err(StoreError::IndexFull { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!((6..=24).contains(&stored), "stored {stored}");
        let a = 0u32.to_le_bytes();
        s.update(&RecordKey::new(1, 1, b"d", &a), b"again")
            .await
            .unwrap();
        assert_eq!(s.stats().keys, stored as usize);
        assert!(s.check_writable().is_ok());
    });
}

/// A table sized for 256 keys at a load of 0.6 (114 main buckets, 28
/// overflow) takes all of them from 16 writers of new keys at once: a new
/// key is refused only when the overflow pool could run out, counted chain
/// by chain, not whenever the pool is smaller than the new keys in flight
/// (that refused the last 27 keys here).
#[test]
fn small_table_fills_under_concurrent_new_keys() {
    run(|| async {
        let cfg = StoreConfig {
            bucket_count: 114,
            overflow_buckets: 28,
            ..StoreConfig::small()
        };
        let s = Rc::new(Store::open(dev(), cfg).await.unwrap());
        let writers = (0..16u32).map(|w| {
            let s = s.clone();
            async move {
                for i in (w..256).step_by(16) {
                    let name = format!("file.{i:05}");
                    let k = RecordKey::new(7, 9, b"dir", name.as_bytes());
                    s.update(&k, &i.to_le_bytes()).await.unwrap();
                }
            }
        });
        futures::future::join_all(writers).await;
        assert_eq!(s.stats().keys, 256);
        for i in 0..256u32 {
            let name = format!("file.{i:05}");
            let k = RecordKey::new(7, 9, b"dir", name.as_bytes());
            assert_eq!(s.fetch(&k).await.unwrap().unwrap().1, i.to_le_bytes());
        }
        assert!(s.check_writable().is_ok());
    });
}

/// `fetch_batch` gives, key by key and in order, what `fetch` gives: values
/// resident in the ring, values evicted to the device, absent keys, and the
/// wrong-kind error for a byte array.
#[test]
fn fetch_batch_matches_fetch() {
    run(|| async {
        let s = Store::open(dev(), StoreConfig::small()).await.unwrap();
        let names: Vec<[u8; 4]> = (0..600u32).map(u32::to_le_bytes).collect();
        for (i, n) in names.iter().enumerate().filter(|(i, _)| i % 5 != 0) {
            let value = vec![i as u8; 3000 + i % 100];
            s.update(&RecordKey::new(1, 3, b"d", n), &value)
                .await
                .unwrap();
        }
        let array = RecordKey::new(1, 3, b"d", b"array");
        s.update_extent(&array, 10, b"bytes").await.unwrap();
        assert!(s.stats().head > s.stats().ring_bytes, "nothing was evicted");
        let mut keys: Vec<RecordKey<'_>> = names
            .iter()
            .map(|n| RecordKey::new(1, 3, b"d", n))
            .collect();
        keys.push(array);
        let batch = s.fetch_batch(&keys).await;
        assert_eq!(batch.len(), keys.len());
        for (k, got) in keys.iter().zip(batch) {
            match (s.fetch(k).await, got) {
                (Ok(one), Ok(b)) => assert_eq!(one, b),
                (Err(StoreError::WrongKind { .. }), Err(StoreError::WrongKind { .. })) => {}
                (one, b) => panic!("fetch {one:?} but fetch_batch {b:?}"),
            }
        }
    });
}

/// `list_values`: the dkeys of an object that hold the akey, sorted and
/// paged, each with its value while the record is in the ring, and `None`
/// for a record only on the device, an array, or past the value budget;
/// dkeys without the akey and other objects are left out.
#[test]
fn listed_values_come_from_the_ring_only() {
    run(|| async {
        let s = Store::open(dev(), StoreConfig::small()).await.unwrap();
        let name = |i: u32| format!("n{i:04}").into_bytes();
        let value = |i: u32| vec![i as u8; 500 + i as usize];
        // Written first, then pushed out of the 1 MiB ring by the fill.
        for i in 0..10u32 {
            s.update(&RecordKey::new(1, 9, &name(i), b"e"), &value(i))
                .await
                .unwrap();
        }
        fill(&s, 0, 2 * s.stats().ring_bytes).await;
        for i in 10..40u32 {
            s.update(&RecordKey::new(1, 9, &name(i), b"e"), &value(i))
                .await
                .unwrap();
        }
        s.update(&RecordKey::new(1, 9, b"n0050", b"other"), b"x")
            .await
            .unwrap();
        s.update_extent(&RecordKey::new(1, 9, b"n0060", b"e"), 0, b"arr")
            .await
            .unwrap();
        s.update(&RecordKey::new(1, 8, b"n0000", b"e"), b"y")
            .await
            .unwrap();

        let all = s.list_values(1, 9, b"e", None, 100, usize::MAX);
        let names: Vec<Vec<u8>> = all.iter().map(|(d, _)| d.clone()).collect();
        let mut want: Vec<Vec<u8>> = (0..40).map(name).collect();
        want.push(b"n0060".to_vec());
        assert_eq!(names, want);
        for (i, (_, v)) in all.iter().take(40).enumerate() {
            let i = i as u32;
            let expect = (i >= 10).then(|| value(i));
            assert_eq!(v.as_ref(), expect.as_ref(), "entry {i}");
        }
        assert_eq!(all[40].1, None, "an array's value is not listed");

        // Paging: strictly after `after`, at most `limit`.
        let page = s.list_values(1, 9, b"e", Some(&name(11)), 3, usize::MAX);
        let got: Vec<_> = page.iter().map(|(d, _)| d.clone()).collect();
        assert_eq!(got, vec![name(12), name(13), name(14)]);

        // The budget: values past it are left out (their names stay).
        let budget = value(10).len() + value(11).len();
        let cut = s.list_values(1, 9, b"e", Some(&name(9)), 4, budget);
        let sent: Vec<bool> = cut.iter().map(|(_, v)| v.is_some()).collect();
        assert_eq!(sent, vec![true, true, false, false]);
    });
}

/// Keys the ring-wrap test overwrites round after round.
const KEYS: u32 = 64;

fn race_name(a: u32) -> [u8; 4] {
    a.to_le_bytes()
}

fn race_key(a: &[u8; 4]) -> RecordKey<'_> {
    RecordKey::new(3, 9, b"d", a)
}

/// Key `a`'s value in round `r`: its numbers, then bytes that depend on
/// both and on the position (a copy mixing two records shows).
fn race_value(a: u32, r: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(3000);
    v.extend_from_slice(&a.to_le_bytes());
    v.extend_from_slice(&r.to_le_bytes());
    v.extend((8..3000u32).map(|j| (a * 7 + r * 13 + j) as u8));
    v
}

#[test]
fn fetches_of_concurrent_tasks_overlap() {
    run(|| async {
        let s = Rc::new(
            Store::open(
                ferrite_bdev::open("malloc:16M").unwrap(),
                StoreConfig::small(),
            )
            .await
            .unwrap(),
        );
        for a in 0..2 {
            s.update(&race_key(&race_name(a)), &race_value(a, 0))
                .await
                .unwrap();
        }
        let log = Rc::new(RefCell::new(Vec::new()));
        let tasks: Vec<_> = (0..2u32)
            .map(|a| {
                let (s, log) = (s.clone(), log.clone());
                glommio::spawn_local(async move {
                    log.borrow_mut().push(format!("{a} starts"));
                    let got = s.fetch(&race_key(&race_name(a))).await.unwrap().unwrap();
                    assert_eq!(got.1, race_value(a, 0));
                    log.borrow_mut().push(format!("{a} ends"));
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
        // Without the overlap the first fetch ends before the second starts.
        assert_eq!(*log.borrow(), ["0 starts", "1 starts", "0 ends", "1 ends"]);
    });
}

#[test]
fn suspended_fetches_return_whole_current_values_while_the_ring_wraps() {
    const ROUNDS: u32 = 20;
    const READERS: u32 = 8;
    run(|| async {
        let dev = ferrite_bdev::open("malloc:64M").unwrap();
        let s = Rc::new(Store::open(dev, StoreConfig::small()).await.unwrap());
        // Keys from KEYS on are written once: the writer's rounds push
        // them out of the ring, and fetches read them from the device.
        for a in 0..2 * KEYS {
            s.update(&race_key(&race_name(a)), &race_value(a, 0))
                .await
                .unwrap();
        }
        let done = Rc::new(Cell::new(false));
        let writer = {
            let (s, done) = (s.clone(), done.clone());
            glommio::spawn_local(async move {
                for r in 1..=ROUNDS {
                    for a in 0..KEYS {
                        s.update(&race_key(&race_name(a)), &race_value(a, r))
                            .await
                            .unwrap();
                    }
                }
                done.set(true);
            })
        };
        let readers: Vec<_> = (0..READERS)
            .map(|t| {
                let (s, done) = (s.clone(), done.clone());
                glommio::spawn_local(async move { read_until(&s, &done, t).await })
            })
            .collect();
        writer.await;
        let mut fetched = 0;
        for r in readers {
            fetched += r.await;
        }
        // The writer wrapped the 1 MiB ring several times over.
        assert!(s.stats().head > 3 * s.stats().ring_bytes);
        assert!(s.stats().device_reads > 0, "no fetch left the ring");
        assert!(fetched > u64::from(READERS));
        for a in 0..KEYS {
            let got = s.fetch(&race_key(&race_name(a))).await.unwrap().unwrap();
            assert_eq!(got.1, race_value(a, ROUNDS));
        }
    });
}

/// Fetches keys until the writer is done (at most 200 000 fetches): each
/// value must be one the key held whole, and no key may go back to an
/// older round or version than this task saw before. Returns the count.
async fn read_until(s: &Store, done: &Cell<bool>, t: u32) -> u64 {
    let mut seen = vec![(0u64, 0u32); 2 * KEYS as usize];
    let mut n = 0u64;
    while !done.get() && n < 200_000 {
        let a = (t * 11 + n as u32 * 7) % (2 * KEYS);
        let (version, bytes) = s.fetch(&race_key(&race_name(a))).await.unwrap().unwrap();
        let r = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
        assert_eq!(bytes, race_value(a, r), "key {a}: a mixed or foreign value");
        let (v0, r0) = seen[a as usize];
        assert!(
            version >= v0 && r >= r0,
            "key {a}: went back from round {r0} to {r}"
        );
        seen[a as usize] = (version, r);
        n += 1;
    }
    n
}
