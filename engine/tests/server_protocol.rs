//! Guards the RPC protocol end to end against a real `ferrite-engine`
//! process: every operation over TCP and the Unix socket, pipelining,
//! batches, and both one-sided read paths (tcp RegionRead and shm mappings)
//! returning exactly what the store acknowledged.

mod server_support;

use ferrite_proto::region::Provider;
use ferrite_proto::rpc::{ErrorCode, Found, PunchScope, Reply, Request, Verified};
use server_support::*;

fn update(c: &mut RawClient, k: &ferrite_proto::rpc::Key, v: &[u8]) -> u64 {
    match c
        .call(&Request::Update {
            key: k.clone(),
            value: v.to_vec(),
        })
        .unwrap()
    {
        Reply::Version(v) => v,
        other => panic!("update: {other:?}"),
    }
}

fn fetch(c: &mut RawClient, k: &ferrite_proto::rpc::Key) -> Option<Found> {
    match c.call(&Request::Fetch { key: k.clone() }).unwrap() {
        Reply::Value(v) => v,
        other => panic!("fetch: {other:?}"),
    }
}

#[test]
fn data_operations_over_tcp() {
    let dir = temp_dir();
    let engine = EngineProcess::start(dir.path(), &[]);
    let mut c = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    let w = c.welcome.clone().unwrap();
    assert_eq!(w.targets.len(), 2);
    assert!(w.regions.iter().all(|d| d.provider == Provider::Tcp));
    assert_eq!(w.regions.len(), 4, "buckets and log of two targets");

    let k = key(7, "d", "a");
    let v1 = update(&mut c, &k, b"one");
    let v2 = update(&mut c, &k, b"two");
    assert!(v2 > v1);
    assert_eq!(
        fetch(&mut c, &k),
        Some(Found {
            version: v2,
            value: b"two".to_vec()
        })
    );

    // Conditional update: wrong version refused, right version applied.
    let cond = |expected_version, value: &[u8]| Request::CondUpdate {
        key: k.clone(),
        expected_version,
        value: value.to_vec(),
    };
    assert_eq!(
        c.call(&cond(v1, b"x")).unwrap(),
        Reply::Cond {
            applied: false,
            version: v2
        }
    );
    let Reply::Cond {
        applied: true,
        version: v3,
    } = c.call(&cond(v2, b"three")).unwrap()
    else {
        panic!("conditional update with the right version must apply");
    };
    assert_eq!(fetch(&mut c, &k).unwrap().value, b"three");
    let fresh = key(7, "d", "new");
    assert!(matches!(
        c.call(&Request::CondUpdate {
            key: fresh.clone(),
            expected_version: 0,
            value: b"n".to_vec()
        })
        .unwrap(),
        Reply::Cond { applied: true, .. }
    ));

    // Extents: write two pieces, read across them with a hole.
    let arr = key(8, "file", "chunk");
    for (offset, data) in [(0u64, b"hello".to_vec()), (10, b"world".to_vec())] {
        let r = c
            .call(&Request::ExtentWrite {
                key: arr.clone(),
                offset,
                data,
            })
            .unwrap();
        assert!(matches!(r, Reply::Version(_)), "{r:?}");
    }
    match c
        .call(&Request::ExtentRead {
            key: arr.clone(),
            offset: 0,
            len: 15,
        })
        .unwrap()
    {
        Reply::Value(Some(f)) => assert_eq!(f.value, b"hello\0\0\0\0\0world"),
        other => panic!("extent read: {other:?}"),
    }
    // A single-value read of an array key is refused with a clear error.
    let r = c.call(&Request::Fetch { key: arr.clone() }).unwrap();
    assert!(
        matches!(
            r,
            Reply::Error {
                code: ErrorCode::InvalidArgument,
                ..
            }
        ),
        "{r:?}"
    );

    // Listing: dkeys over both targets, sorted, paged.
    for i in 0..20 {
        update(&mut c, &key(9, &format!("dk{i:02}"), "a"), b"v");
    }
    let mut all = Vec::new();
    let mut after = None;
    for _ in 0..10 {
        let r = c
            .call(&Request::ListDkeys {
                container: 1,
                object: 9,
                after: after.clone(),
                limit: 6,
            })
            .unwrap();
        let Reply::Keys { keys, more } = r else {
            panic!("{r:?}")
        };
        assert!(keys.len() <= 6);
        all.extend(keys.iter().cloned());
        after = keys.last().cloned();
        if !more {
            break;
        }
    }
    let want: Vec<Vec<u8>> = (0..20).map(|i| format!("dk{i:02}").into_bytes()).collect();
    assert_eq!(all, want);
    let r = c
        .call(&Request::ListAkeys {
            container: 1,
            object: 7,
            dkey: b"d".to_vec(),
            after: None,
            limit: 100,
        })
        .unwrap();
    assert_eq!(
        r,
        Reply::Keys {
            keys: vec![b"a".to_vec(), b"new".to_vec()],
            more: false
        }
    );

    // Punches: akey, then the whole object across targets.
    assert!(
        matches!(c.call(&Request::Punch { scope: PunchScope::Akey, key: k.clone() }).unwrap(), Reply::Version(v) if v > v3)
    );
    assert_eq!(fetch(&mut c, &k), None);
    assert!(matches!(
        c.call(&Request::Punch {
            scope: PunchScope::Object,
            key: key(9, "", "")
        })
        .unwrap(),
        Reply::Version(_)
    ));
    let r = c
        .call(&Request::ListDkeys {
            container: 1,
            object: 9,
            after: None,
            limit: 100,
        })
        .unwrap();
    assert_eq!(
        r,
        Reply::Keys {
            keys: vec![],
            more: false
        }
    );

    // Stat: one entry per target, with the store's counters.
    let Reply::Stat(targets) = c.call(&Request::Stat).unwrap() else {
        panic!("stat")
    };
    assert_eq!(targets.len(), 2);
    let keys: u64 = targets
        .iter()
        .flat_map(|t| {
            t.counters
                .iter()
                .filter(|(n, _)| n == "keys")
                .map(|(_, v)| *v)
        })
        .sum();
    assert!(keys >= 2, "keys of objects 7 and 8 remain, got {keys}");
    drop(c);
    assert_eq!(engine.terminate(), Some(0));
}

fn unflushed(c: &mut RawClient) -> u64 {
    let Reply::Stat(targets) = c.call(&Request::Stat).unwrap() else {
        panic!("stat")
    };
    targets
        .iter()
        .flat_map(|t| t.counters.iter().filter(|(n, _)| n == "unflushed"))
        .map(|(_, v)| *v)
        .sum()
}

#[test]
fn sync_flushes_what_process_durability_acknowledged() {
    let dir = temp_dir();
    let args = ["--durability", "process", "--flush-interval-ms", "3600000"];
    let engine = EngineProcess::start(dir.path(), &args);
    let mut c = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    for i in 0..16 {
        update(&mut c, &key(i, "d", "a"), b"value");
    }
    assert!(unflushed(&mut c) > 0, "process durability flushed at once");
    assert_eq!(c.call(&Request::Sync).unwrap(), Reply::Synced);
    assert_eq!(unflushed(&mut c), 0, "sync left bytes unflushed");
    drop(c);
    assert_eq!(engine.terminate(), Some(0));
}

#[test]
fn pipelined_requests_and_batches_are_answered_by_id() {
    let dir = temp_dir();
    let engine = EngineProcess::start(dir.path(), &[]);
    let mut c = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    let count = 300u64;
    let mut ids = std::collections::HashMap::new();
    for i in 0..count {
        let id = c
            .send(&Request::Update {
                key: key(1, &format!("p{i}"), "a"),
                value: i.to_le_bytes().to_vec(),
            })
            .unwrap();
        ids.insert(id, i);
    }
    for _ in 0..count {
        let (h, r) = c.recv().unwrap();
        assert!(
            ids.remove(&h.request_id).is_some(),
            "unknown or repeated id {}",
            h.request_id
        );
        assert!(matches!(r, Reply::Version(_)), "{r:?}");
    }
    assert!(ids.is_empty());

    let batch: Vec<Request> = (0..count)
        .map(|i| Request::Fetch {
            key: key(1, &format!("p{i}"), "a"),
        })
        .chain([Request::ExtentRead {
            key: key(1, "p0", "a"),
            offset: 0,
            len: 1,
        }])
        .collect();
    let Reply::Batch(replies) = c.call(&Request::Batch(batch)).unwrap() else {
        panic!("batch")
    };
    assert_eq!(replies.len() as u64, count + 1);
    for (i, r) in replies.iter().take(count as usize).enumerate() {
        match r {
            Reply::Value(Some(f)) => assert_eq!(f.value, (i as u64).to_le_bytes()),
            other => panic!("item {i}: {other:?}"),
        }
    }
    // The last item fails alone (a single value read as an array).
    assert!(matches!(replies[count as usize], Reply::Error { .. }));
    drop(engine);
}

/// A batch whose updates go to both targets (grouped per target by the
/// router), mixed with reads and with an update that fails: one reply per
/// item, in the items' order, each the one its item gets alone; afterwards
/// every key holds the value its update acknowledged.
#[test]
fn a_batch_of_updates_for_both_targets_answers_in_item_order() {
    let dir = temp_dir();
    let engine = EngineProcess::start(dir.path(), &[]);
    let mut c = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    let array = key(2, "arr", "a");
    let extent = Request::ExtentWrite {
        key: array.clone(),
        offset: 0,
        data: b"xx".to_vec(),
    };
    assert!(matches!(c.call(&extent).unwrap(), Reply::Version(_)));
    let before = update(&mut c, &key(2, "old", "a"), b"old");
    let mut batch = Vec::new();
    for i in 0..40u64 {
        batch.push(Request::Update {
            key: key(2, &format!("b{i}"), "a"),
            value: i.to_le_bytes().to_vec(),
        });
        match i {
            10 => batch.push(Request::Update {
                key: array.clone(),
                value: b"single".to_vec(),
            }),
            20 => batch.push(Request::Fetch {
                key: key(2, "old", "a"),
            }),
            _ => {}
        }
    }
    let Reply::Batch(replies) = c.call(&Request::Batch(batch)).unwrap() else {
        panic!("batch")
    };
    assert_eq!(replies.len(), 42);
    for (i, r) in replies.iter().enumerate() {
        match i {
            11 => assert!(matches!(r, Reply::Error { .. }), "item {i}: {r:?}"),
            22 => match r {
                Reply::Value(Some(f)) => {
                    assert_eq!((f.version, &f.value[..]), (before, &b"old"[..]))
                }
                other => panic!("item {i}: {other:?}"),
            },
            _ => assert!(matches!(r, Reply::Version(_)), "item {i}: {r:?}"),
        }
    }
    for i in 0..40u64 {
        let got = fetch(&mut c, &key(2, &format!("b{i}"), "a")).map(|f| f.value);
        assert_eq!(got, Some(i.to_le_bytes().to_vec()), "key b{i}");
    }
    let owners: std::collections::HashSet<_> = (0..40u64)
        .map(|i| {
            Request::Fetch {
                key: key(2, &format!("b{i}"), "a"),
            }
            .owner(2)
        })
        .collect();
    assert_eq!(owners.len(), 2, "the batch did not span both targets");
    drop(engine);
}

/// A batch of creates and deletes (conditional inserts and punches, as a
/// client's batch of files sends them) for both targets, grouped per target
/// by the router: one reply per item, in order, each what its item gets
/// alone run in order: of two inserts of one name the first wins, an insert
/// of an existing name conflicts with its version, punched keys are gone.
#[test]
fn a_batch_of_creates_and_deletes_answers_as_its_items_in_order() {
    let dir = temp_dir();
    let engine = EngineProcess::start(dir.path(), &[]);
    let mut c = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    let existing = update(&mut c, &key(3, "there", "e"), b"old");
    let doomed: Vec<_> = (0..8).map(|i| key(3, &format!("doomed{i}"), "e")).collect();
    for k in &doomed {
        update(&mut c, k, b"x");
    }
    update(&mut c, &key(3, "dk", "a1"), b"1");
    update(&mut c, &key(3, "dk", "a2"), b"2");
    let insert = |name: &str, value: &[u8]| Request::CondUpdate {
        key: key(3, name, "e"),
        expected_version: 0,
        value: value.to_vec(),
    };
    let mut batch: Vec<Request> = (0..40).map(|i| insert(&format!("n{i}"), b"new")).collect();
    batch.push(insert("n5", b"again"));
    batch.push(insert("there", b"taken"));
    batch.extend(doomed.iter().map(|k| Request::Punch {
        scope: PunchScope::Akey,
        key: k.clone(),
    }));
    batch.push(Request::Punch {
        scope: PunchScope::Dkey,
        key: key(3, "dk", ""),
    });
    let Reply::Batch(replies) = c.call(&Request::Batch(batch.clone())).unwrap() else {
        panic!("batch")
    };
    assert_eq!(replies.len(), batch.len());
    for (i, r) in replies.iter().enumerate() {
        match i {
            0..40 => assert!(
                matches!(r, Reply::Cond { applied: true, .. }),
                "item {i}: {r:?}"
            ),
            40 => assert!(
                matches!(r, Reply::Cond { applied: false, version } if *version > 0),
                "{r:?}"
            ),
            41 => assert_eq!(
                r,
                &Reply::Cond {
                    applied: false,
                    version: existing
                }
            ),
            _ => assert!(matches!(r, Reply::Version(_)), "item {i}: {r:?}"),
        }
    }
    for i in 0..40 {
        let got = fetch(&mut c, &key(3, &format!("n{i}"), "e")).map(|f| f.value);
        assert_eq!(got.as_deref(), Some(&b"new"[..]), "n{i}");
    }
    assert_eq!(fetch(&mut c, &key(3, "there", "e")).unwrap().value, b"old");
    for k in doomed
        .iter()
        .chain([&key(3, "dk", "a1"), &key(3, "dk", "a2")])
    {
        assert_eq!(fetch(&mut c, k), None, "{k:?} survived its punch");
    }
    let owners: std::collections::HashSet<_> = batch.iter().map(|r| r.owner(2)).collect();
    assert_eq!(owners.len(), 2, "the batch did not span both targets");
    drop(engine);
}

#[test]
fn one_sided_reads_over_tcp_and_shm_match_acknowledged_values() {
    let dir = temp_dir();
    let engine = EngineProcess::start(dir.path(), &[]);
    let mut c = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    let keys: Vec<_> = (0..50).map(|i| key(3, &format!("k{i}"), "v")).collect();
    let mut acked = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let value = format!("value-{i}").into_bytes();
        acked.push((update(&mut c, k, &value), value));
    }
    let w = c.welcome.clone().unwrap();
    let n = w.targets.len() as u32;

    // tcp provider: RegionRead served from the region.
    let mut tcp_reader = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    for (k, (version, value)) in keys.iter().zip(&acked) {
        let got = one_sided_get(&w.regions, n, k, |d, offset, len| {
            match tcp_reader
                .call(&Request::RegionRead {
                    region_id: d.region_id,
                    access_key: d.access_key,
                    offset,
                    len,
                })
                .unwrap()
            {
                Reply::Data(b) => b,
                other => panic!("region read: {other:?}"),
            }
        });
        assert_eq!(got, Some((*version, value.clone())));
    }
    // Wrong access key and out-of-bounds reads are refused, the connection stays.
    let d = w.regions[0];
    let r = tcp_reader
        .call(&Request::RegionRead {
            region_id: d.region_id,
            access_key: d.access_key ^ 1,
            offset: 0,
            len: 8,
        })
        .unwrap();
    assert!(
        matches!(
            r,
            Reply::Error {
                code: ErrorCode::BadRegion,
                ..
            }
        ),
        "{r:?}"
    );
    let r = tcp_reader
        .call(&Request::RegionRead {
            region_id: d.region_id,
            access_key: d.access_key,
            offset: d.length,
            len: 1,
        })
        .unwrap();
    assert!(
        matches!(
            r,
            Reply::Error {
                code: ErrorCode::BadRegion,
                ..
            }
        ),
        "{r:?}"
    );

    // shm provider: fds over the Unix socket, mapped read-only.
    let shm = RawClient::connect_unix(&engine.unix, true).unwrap();
    let sw = shm.welcome.clone().unwrap();
    assert!(sw.regions.iter().all(|d| d.provider == Provider::Shm));
    assert_eq!(shm.fds.len(), sw.regions.len(), "one fd per shm region");
    let maps: Vec<Mapping> = sw
        .regions
        .iter()
        .zip(&shm.fds)
        .map(|(d, fd)| Mapping::new(fd, d.length as usize).unwrap())
        .collect();
    for (k, (version, value)) in keys.iter().zip(&acked) {
        let got = one_sided_get(&sw.regions, n, k, |d, offset, len| {
            let i = sw
                .regions
                .iter()
                .position(|x| x.region_id == d.region_id)
                .unwrap();
            maps[i].read(offset as usize, len as usize)
        });
        assert_eq!(got, Some((*version, value.clone())));
    }
    // Without asking for shm, the Unix socket offers tcp descriptors, no fds.
    let plain = RawClient::connect_unix(&engine.unix, false).unwrap();
    assert!(plain.fds.is_empty());
    assert!(plain
        .welcome
        .unwrap()
        .regions
        .iter()
        .all(|d| d.provider == Provider::Tcp));
}

/// ListObjects merges every target's objects of a container (sorted by id,
/// paged, each once though its keys sit on both targets, no other
/// container's); Verify answers alone and inside a batch.
#[test]
fn objects_are_listed_from_every_target_and_records_verified() {
    let dir = temp_dir();
    let engine = EngineProcess::start(dir.path(), &[]);
    let mut c = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    let objects = [30u128, 5, 1 << 100, 17];
    for &object in &objects {
        for i in 0..8 {
            update(&mut c, &key(object, &format!("d{i}"), "a"), b"value");
        }
    }
    update(
        &mut c,
        &ferrite_proto::rpc::Key::new(2, 3, b"d", b"a"),
        b"x",
    );
    let list = |c: &mut RawClient, after, limit| match c
        .call(&Request::ListObjects {
            container: 1,
            after,
            limit,
        })
        .unwrap()
    {
        Reply::Objects { objects, more } => (objects, more),
        other => panic!("list objects: {other:?}"),
    };
    let (mut all, mut after) = (Vec::new(), None);
    for _ in 0..objects.len() {
        let (page, more) = list(&mut c, after, 3);
        assert!(page.len() <= 3);
        after = page.last().copied();
        all.extend(page);
        if !more {
            break;
        }
    }
    assert_eq!(all, vec![5, 17, 30, 1 << 100]);
    assert_eq!(list(&mut c, Some(30), 10), (vec![1 << 100], false));

    let verify = |k| Request::Verify { key: k };
    let intact = Reply::Verified(Verified::Intact {
        records: 1,
        value_bytes: 5,
    });
    assert_eq!(c.call(&verify(key(17, "d3", "a"))).unwrap(), intact);
    let r = c
        .call(&Request::Batch(vec![
            verify(key(5, "d0", "a")),
            verify(key(5, "d0", "absent")),
        ]))
        .unwrap();
    assert_eq!(
        r,
        Reply::Batch(vec![intact, Reply::Verified(Verified::Absent)])
    );

    c.call(&Request::Punch {
        scope: PunchScope::Object,
        key: key(17, "", ""),
    })
    .unwrap();
    assert_eq!(list(&mut c, None, 10), (vec![5, 30, 1 << 100], false));
}
