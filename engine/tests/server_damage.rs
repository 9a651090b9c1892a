//! Guards the end-to-end case: 300 keys put through a real
//! `ferrite-engine` (Unix socket), the engine killed with SIGKILL, one byte
//! of an early record flipped in its bdev file, the engine restarted: the
//! 299 other keys are all there, the damaged one is absent (it had only
//! that record), never answered with other bytes, and `ferrite stat`'s
//! `corrupt_records` counts 1 with the record's log address.

mod server_support;

use std::os::unix::fs::FileExt;

use ferrite_proto::rpc::{Reply, Request};
use server_support::*;

const KEYS: usize = 300;
const DAMAGED: usize = 3;

fn value(i: usize) -> Vec<u8> {
    format!("e2e value {i:04}|")
        .bytes()
        .cycle()
        .take(200)
        .collect()
}

/// Flips one byte of the value of key `i`'s record in whichever bdev file
/// holds it.
fn flip_value_byte(dir: &std::path::Path, i: usize) {
    let v = value(i);
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "bdev") {
            continue;
        }
        let image = std::fs::read(&path).unwrap();
        if let Some(at) = image.windows(v.len()).position(|w| w == v.as_slice()) {
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_at(&[image[at + 20] ^ 0x08], (at + 20) as u64)
                .unwrap();
            f.sync_all().unwrap();
            return;
        }
    }
    panic!("the record of key {i} is in no bdev file");
}

#[test]
fn one_flipped_byte_loses_one_key_and_is_reported() {
    let dir = temp_dir();
    let engine = EngineProcess::start(dir.path(), &[]);
    let mut c = RawClient::connect_unix(&engine.unix, false).unwrap();
    for i in 0..KEYS {
        let update = Request::Update {
            key: key(1, &format!("k{i}"), "a"),
            value: value(i),
        };
        let r = c.call(&update).unwrap();
        assert!(matches!(r, Reply::Version(_)), "{r:?}");
    }
    drop(c);
    engine.kill9();
    flip_value_byte(dir.path(), DAMAGED);

    let engine = EngineProcess::start(dir.path(), &[]);
    let mut c = RawClient::connect_unix(&engine.unix, false).unwrap();
    let fetches: Vec<Request> = (0..KEYS)
        .map(|i| Request::Fetch {
            key: key(1, &format!("k{i}"), "a"),
        })
        .collect();
    let mut present = 0;
    for (i, fetch) in fetches.iter().enumerate() {
        match c.call(fetch).unwrap() {
            Reply::Value(Some(found)) => {
                assert_eq!(found.value, value(i), "key {i}: wrong bytes");
                present += 1;
            }
            Reply::Value(None) => assert_eq!(i, DAMAGED, "key {i} lost"),
            other => panic!("key {i}: {other:?}"),
        }
    }
    assert_eq!(present, KEYS - 1);
    let Reply::Stat(targets) = c.call(&Request::Stat).unwrap() else {
        panic!("no stat reply")
    };
    let counter = |name: &str| -> Vec<u64> {
        let of = |t: &ferrite_proto::rpc::TargetStat| {
            t.counters.iter().find(|(n, _)| n == name).map(|c| c.1)
        };
        targets.iter().filter_map(of).collect()
    };
    assert_eq!(counter("corrupt_records").iter().sum::<u64>(), 1);
    assert_eq!(counter("corrupt_offsets_0").len(), 1, "one target names it");
    drop(c);
    engine.terminate();
}
