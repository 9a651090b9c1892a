//! Guards how the engine serves GETs that come together: the fetches of a
//! batch frame, and a burst of pipelined Fetch frames read in at once, run
//! on each target as one `Store::fetch_batch` (seen in the targets'
//! `fetch_batch_keys` counter), and every key's reply is exactly what a
//! lone Fetch of it gets: values from the ring and from the device, absent
//! keys, and the error for a byte array read as a single value. A lone
//! Fetch does not take the batch path.

mod server_support;

use ferrite_engine::config::{EngineConfig, Size};
use ferrite_engine::Engine;
use ferrite_proto::rpc::{Key, Reply, Request};
use server_support::*;
use std::collections::HashMap;

/// Sum over targets of a store counter.
fn counter(c: &mut RawClient, name: &str) -> u64 {
    let Reply::Stat(targets) = c.call(&Request::Stat).unwrap() else {
        panic!("stat")
    };
    targets
        .iter()
        .flat_map(|t| t.counters.iter().filter(|(n, _)| n == name))
        .map(|(_, v)| *v)
        .sum()
}

fn update(c: &mut RawClient, k: &Key, value: Vec<u8>) {
    let r = c
        .call(&Request::Update {
            key: k.clone(),
            value,
        })
        .unwrap();
    assert!(matches!(r, Reply::Version(_)), "{r:?}");
}

/// Keys whose records left the 1 MiB ring, keys still in it, an array, and
/// keys never written.
fn load(c: &mut RawClient) -> Vec<Key> {
    let mut keys = Vec::new();
    for i in 0..40u8 {
        let k = key(1, &format!("cold{i}"), "a");
        update(c, &k, vec![i; 3000 + usize::from(i)]);
        keys.push(k);
    }
    // 2.4 MiB more: the cold records are only on the device now.
    for i in 0..300u32 {
        update(c, &key(2, &format!("fill{i}"), "a"), vec![7; 8 << 10]);
    }
    for i in 0..40u8 {
        let k = key(1, &format!("hot{i}"), "a");
        update(c, &k, vec![i; 1 + usize::from(i)]);
        keys.push(k);
    }
    let array = key(1, "array", "a");
    let r = c
        .call(&Request::ExtentWrite {
            key: array.clone(),
            offset: 5,
            data: b"bytes".to_vec(),
        })
        .unwrap();
    assert!(matches!(r, Reply::Version(_)), "{r:?}");
    keys.push(array);
    keys.extend((0..8).map(|i| key(1, &format!("absent{i}"), "a")));
    keys
}

#[test]
fn batched_and_pipelined_fetches_return_what_single_fetches_do() {
    let dir = temp_dir();
    let cores = ferrite_xstream::allowed_cores().unwrap().len();
    let mut config = EngineConfig::for_temp_dir(dir.path());
    config.xstreams = Some(cores.clamp(1, 2));
    config.cache.ring_bytes = Size(1 << 20);
    config.cache.hot_value_max = Size(0);
    let engine = Engine::start(config).unwrap();
    let mut c = RawClient::connect_tcp(engine.tcp_addr().unwrap(), Some(engine.token())).unwrap();
    let keys = load(&mut c);
    let fetches: Vec<Request> = keys
        .iter()
        .map(|k| Request::Fetch { key: k.clone() })
        .collect();

    let singles: Vec<Reply> = fetches.iter().map(|f| c.call(f).unwrap()).collect();
    assert_eq!(
        counter(&mut c, "fetch_batch_keys"),
        0,
        "a lone Fetch is batched"
    );
    let found = |r: &Reply| matches!(r, Reply::Value(Some(_)));
    assert_eq!(singles.iter().filter(|r| found(r)).count(), 80);
    assert!(
        matches!(singles[80], Reply::Error { .. }),
        "{:?}",
        singles[80]
    );
    assert!(singles[81..].iter().all(|r| *r == Reply::Value(None)));

    let reads = counter(&mut c, "device_reads");
    let r = c.call(&Request::Batch(fetches.clone())).unwrap();
    assert_eq!(r, Reply::Batch(singles.clone()));
    assert_eq!(counter(&mut c, "fetch_batch_keys"), keys.len() as u64);
    assert!(
        counter(&mut c, "device_reads") >= reads + 40,
        "the batch read the cold keys from the device"
    );

    // A burst of 48 pipelined frames (the first 40 cold, then hot ones),
    // sent in one write.
    let burst = &fetches[..48];
    let ids = c.send_all(burst).unwrap();
    let mut replies = HashMap::new();
    for _ in 0..burst.len() {
        let (h, r) = c.recv().unwrap();
        assert!(replies.insert(h.request_id, r).is_none());
    }
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(replies.get(id), Some(&singles[i]), "frame {i}");
    }
    assert_eq!(
        counter(&mut c, "fetch_batch_keys"),
        (keys.len() + burst.len()) as u64,
        "the burst ran as batches"
    );
    drop(c);
    engine.shutdown().unwrap();
}
