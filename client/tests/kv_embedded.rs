//! Guards embedded mode: `embedded::connect` starts an engine in this
//! process on a temp directory and GETs on it are one-sided over shm; the
//! `ferrite` CLI without `--engine` works on such an engine.

#![cfg(feature = "embedded")]

use ferrite_client::client::Key;

#[test]
fn embedded_engine_serves_one_sided_gets() {
    let client = ferrite_client::embedded::connect().unwrap();
    assert_eq!(client.one_sided_provider(), Some("shm"));
    for i in 0..100u32 {
        client
            .put(
                &Key::new(0, 0, format!("e{i}").as_bytes(), b""),
                &i.to_le_bytes(),
            )
            .unwrap();
    }
    for i in 0..100u32 {
        let v = client
            .get(&Key::new(0, 0, format!("e{i}").as_bytes(), b""))
            .unwrap();
        assert_eq!(v, Some(i.to_le_bytes().to_vec()));
    }
    assert_eq!(client.counters().one_sided_hits, 100);
}

#[test]
fn cli_without_engine_uses_an_embedded_one() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["put", "--json", "k", "v"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["version"].as_u64().unwrap() > 0);
    assert!(String::from_utf8_lossy(&out.stderr).contains("embedded"));
}

/// A byte-array read is one-sided when the array's newest extent covers the
/// range; otherwise the engine assembles it. Either way the bytes are the
/// newest, holes read as zero, and an absent array is `None`.
#[test]
fn extent_reads_are_one_sided_when_the_newest_extent_covers_them() {
    let client = ferrite_client::embedded::connect().unwrap();
    let key = Key::new(0, 7, b"c0", b"d");
    let first = vec![0x11u8; 4000];
    client.write_extent(&key, 0, &first).unwrap();
    let rpc = |c: &ferrite_client::client::Client| c.counters().rpc_requests;

    let before = rpc(&client);
    let found = client.read_extent(&key, 0, 4000).unwrap().unwrap();
    assert_eq!(found.value, first);
    let found = client.read_extent(&key, 1000, 10).unwrap().unwrap();
    assert_eq!(found.value, vec![0x11u8; 10]);
    assert_eq!(rpc(&client), before, "covered reads went to the engine");

    client.write_extent(&key, 100, &[0xee; 50]).unwrap();
    let before = rpc(&client);
    let found = client.read_extent(&key, 100, 50).unwrap().unwrap();
    assert_eq!(found.value, vec![0xee; 50]);
    assert_eq!(rpc(&client), before);

    // The newest extent covers only part of this: the engine answers.
    let mut expected = first.clone();
    expected[100..150].fill(0xee);
    let found = client.read_extent(&key, 0, 4000).unwrap().unwrap();
    assert_eq!(found.value, expected);
    assert_eq!(rpc(&client), before + 1);

    assert!(client
        .read_extent(&Key::new(0, 7, b"c1", b"d"), 0, 10)
        .unwrap()
        .is_none());
}

/// A batch whose keys live on two targets goes out as one frame per
/// connection serving them (each part runs on its owning xstream); replies
/// come back in request order.
#[test]
fn batches_are_split_by_the_xstream_serving_each_key() {
    use ferrite_client::client::{ClientOptions, Reply, Request};
    let client = ferrite_client::embedded::connect_with(ClientOptions::default(), |c| {
        c.xstreams = Some(2);
    })
    .unwrap();
    let targets = client.targets().len() as u32;
    assert_eq!(targets, 2);
    let keys: Vec<Key> = (0..32u32)
        .map(|i| Key::new(0, 0, format!("b{i}").as_bytes(), b""))
        .collect();
    let owners: std::collections::BTreeSet<u32> = keys
        .iter()
        .map(|k| Request::Fetch { key: k.clone() }.owner(targets).unwrap())
        .collect();
    assert_eq!(owners.len(), 2, "the keys should cover both targets");
    let puts: Vec<Request> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| Request::Update {
            key: k.clone(),
            value: (i as u32).to_le_bytes().to_vec(),
        })
        .collect();
    let before = client.counters();
    let replies = client.batch(puts).unwrap();
    assert_eq!(client.counters().since(&before).rpc_requests, 2);
    assert!(replies.iter().all(|r| matches!(r, Reply::Version(_))));
    let gets: Vec<Request> = keys
        .iter()
        .map(|k| Request::Fetch { key: k.clone() })
        .collect();
    for (i, r) in client.batch(gets).unwrap().into_iter().enumerate() {
        match r {
            Reply::Value(Some(f)) => assert_eq!(f.value, (i as u32).to_le_bytes()),
            other => panic!("item {i}: {other:?}"),
        }
    }
}
