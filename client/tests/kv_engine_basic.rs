//! Guards the client against a real engine process over both transports:
//! put/get/delete/list, conditional update, extents, batches, async and
//! event-queue calls, and that GETs over a Unix socket are one-sided (shm)
//! while tcp ones use the tcp endpoint.

mod kv_support;

use std::time::Duration;

use ferrite_client::client::{Client, ClientEventQueue, Error, Key, Reply, Request};
use kv_support::EngineProc;

fn exercise(client: &Client, tag: &str) {
    let k = Key::new(1, 2, format!("dkey-{tag}").as_bytes(), b"a");
    assert_eq!(client.get(&k).unwrap(), None);
    let v1 = client.put(&k, b"one").unwrap();
    assert_eq!(client.get(&k).unwrap().as_deref(), Some(&b"one"[..]));
    let v2 = client.put(&k, b"two").unwrap();
    assert!(v2 > v1);
    let found = client.get_versioned(&k).unwrap().unwrap();
    assert_eq!((found.version, found.value.as_slice()), (v2, &b"two"[..]));
    // conditional update
    assert!(matches!(
        client.put_if_version(&k, v1, b"stale"),
        Err(Error::VersionMismatch { .. })
    ));
    let v3 = client.put_if_version(&k, v2, b"three").unwrap();
    assert!(v3 > v2);
    // delete
    client.delete(&k).unwrap();
    assert_eq!(client.get(&k).unwrap(), None);
    // list
    for i in 0..5 {
        client
            .put(&Key::new(9, 9, format!("{tag}-{i}").as_bytes(), b""), b"x")
            .unwrap();
    }
    let names = client.list_dkeys(9, 9).unwrap();
    let mine: Vec<_> = names
        .iter()
        .filter(|n| n.starts_with(tag.as_bytes()))
        .collect();
    assert_eq!(mine.len(), 5, "{names:?}");
    // extents
    let e = Key::new(3, 3, format!("file-{tag}").as_bytes(), b"data");
    client.write_extent(&e, 4096, b"hello").unwrap();
    let got = client.read_extent(&e, 4094, 9).unwrap().unwrap();
    assert_eq!(got.value, b"\0\0hello\0\0");
    // batch
    let reqs: Vec<Request> = (0..50)
        .map(|i| Request::Update {
            key: Key::new(4, 4, format!("b{tag}{i}").as_bytes(), b""),
            value: vec![i as u8; 10],
        })
        .collect();
    let replies = client.batch(reqs).unwrap();
    assert!(replies.iter().all(|r| matches!(r, Reply::Version(_))));
    assert_eq!(
        client
            .get(&Key::new(4, 4, format!("b{tag}7").as_bytes(), b""))
            .unwrap(),
        Some(vec![7u8; 10])
    );
    // many GETs at once (one-sided with prefetch, or RPC)
    let names: Vec<Vec<u8>> = (0..50).map(|i| format!("b{tag}{i}").into_bytes()).collect();
    let keys: Vec<_> = names
        .iter()
        .map(|n| ferrite_proto::key::RecordKey::new(4, 4, n, b""))
        .collect();
    let mut outs = vec![Vec::new(); keys.len()];
    let got = client.get_many_into(&keys, &mut outs).unwrap();
    for (i, (r, out)) in got.iter().zip(&outs).enumerate() {
        assert!(matches!(r, Ok(Some(_))), "{r:?}");
        assert_eq!(out, &vec![i as u8; 10]);
    }
    // async, pipelined
    let futs: Vec<_> = (0..64)
        .map(|i| {
            client.put_async(
                &Key::new(5, 5, format!("p{tag}{i}").as_bytes(), b""),
                &[i as u8],
            )
        })
        .collect();
    for f in futs {
        futures::executor::block_on(f).unwrap();
    }
    let g = futures::executor::block_on(client.get_async(&Key::new(
        5,
        5,
        format!("p{tag}9").as_bytes(),
        b"",
    )))
    .unwrap()
    .unwrap();
    assert_eq!(g.value, vec![9u8]);
    // event queue
    let eq = ClientEventQueue::new(8);
    client.submit(
        &Request::Fetch {
            key: Key::new(5, 5, format!("p{tag}3").as_bytes(), b""),
        },
        eq.event().unwrap(),
    );
    client.get_event(
        &Key::new(5, 5, format!("p{tag}4").as_bytes(), b""),
        eq.event().unwrap(),
    );
    let mut values = Vec::new();
    for _ in 0..10 {
        for c in eq.poll(8, Duration::from_secs(5)) {
            match c.result.unwrap().unwrap() {
                Reply::Value(Some(f)) => values.push(f.value),
                other => panic!("unexpected {other:?}"),
            }
        }
        if values.len() == 2 {
            break;
        }
    }
    values.sort();
    assert_eq!(values, vec![vec![3u8], vec![4u8]]);
}

#[test]
fn kv_operations_over_unix_and_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let _engine = EngineProc::start(dir.path());
    let engine = &_engine;
    let unix = Client::connect(&engine.unix).unwrap();
    assert_eq!(unix.one_sided_provider(), Some("shm"));
    exercise(&unix, "u");
    let s = unix.counters();
    assert!(s.one_sided_hits > 0, "{s:?}");

    let tcp = engine.client(&engine.tcp);
    assert_eq!(tcp.one_sided_provider(), Some("tcp"));
    exercise(&tcp, "t");
    let s = tcp.counters();
    assert!(s.one_sided_hits > 0, "{s:?}");
    // each sees the other's writes
    assert_eq!(
        tcp.get(&Key::new(4, 4, b"bu7", b"")).unwrap(),
        Some(vec![7u8; 10])
    );
    let stat = unix.stat().unwrap();
    assert_eq!(stat.targets.len(), 1);
    assert!(!stat.regions.is_empty());
    // Every message to the target's xstream woke its pump itself.
    let lost = stat.target_counters[0]
        .counters
        .iter()
        .find(|(n, _)| n == "xstream_lost_wakes");
    assert_eq!(lost.map(|c| c.1), Some(0), "{:?}", stat.target_counters[0]);
}

#[test]
fn bad_url_and_absent_engine_are_clear_errors() {
    assert!(matches!(
        Client::connect("http://x"),
        Err(Error::Url { .. })
    ));
    let dir = tempfile::tempdir().unwrap();
    let path = format!("unix://{}/nothing.sock", dir.path().display());
    let e = Client::connect(&path).unwrap_err();
    assert!(e.is_disconnect(), "{e}");
    assert!(e.to_string().contains("nothing.sock"), "{e}");
}
