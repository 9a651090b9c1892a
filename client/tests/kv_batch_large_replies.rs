//! Guards that replies never outgrow the frame a client accepts (8 MiB):
//! a batch of 1 MiB values totalling 12 MiB comes back whole through the
//! client (the engine answers what passes the batch's reply budget with
//! "too large, ask alone" and the client asks those alone), by `batch` and
//! `batch_async`; a listing of 2100 keys of 4000 bytes asked for at once
//! (8.4 MiB of keys) comes back cut, with more to ask for, and paging
//! through it lists every key once. The connection keeps serving after each.

mod kv_support;

use ferrite_client::client::{Client, Key, Reply, Request};
use kv_support::EngineProc;

const VALUE_BYTES: usize = 1 << 20;
const VALUES: usize = 12;
const LONG_KEYS: usize = 2100;
const LONG_KEY_BYTES: usize = 4000;

fn value(i: usize) -> Vec<u8> {
    (0..VALUE_BYTES).map(|b| (b * 7 + i * 13) as u8).collect()
}

fn long_key(i: usize) -> Vec<u8> {
    let mut k = format!("{i:06}").into_bytes();
    k.resize(LONG_KEY_BYTES, b'k' + (i % 7) as u8);
    k
}

fn check_values(replies: Vec<Reply>, keys: &[Key]) {
    assert_eq!(replies.len(), keys.len());
    for (i, r) in replies.into_iter().enumerate() {
        match r {
            Reply::Value(Some(found)) => assert!(found.value == value(i), "value {i} differs"),
            other => panic!("item {i}: {other:?}"),
        }
    }
}

fn still_serves(client: &Client, tag: &str) {
    let k = Key::new(3, 3, tag.as_bytes(), b"a");
    client.put(&k, b"after").unwrap();
    assert_eq!(client.get(&k).unwrap().as_deref(), Some(&b"after"[..]));
}

#[test]
fn a_batch_of_values_past_the_frame_limit_comes_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let engine = EngineProc::start(dir.path());
    let client = engine.client(&engine.tcp);
    let keys: Vec<Key> = (0..VALUES)
        .map(|i| Key::new(1, 1, format!("big{i}").as_bytes(), b"v"))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        client.put(k, &value(i)).unwrap();
    }
    let fetches: Vec<Request> = keys
        .iter()
        .map(|k| Request::Fetch { key: k.clone() })
        .collect();
    check_values(client.batch(fetches.clone()).unwrap(), &keys);
    still_serves(&client, "after-batch");
    let replies = futures::executor::block_on(client.batch_async(fetches)).unwrap();
    check_values(replies, &keys);
    still_serves(&client, "after-batch-async");
}

#[test]
fn a_listing_past_the_frame_limit_is_cut_and_continues() {
    let dir = tempfile::tempdir().unwrap();
    let engine = EngineProc::start(dir.path());
    let client = engine.client(&engine.tcp);
    let updates: Vec<Request> = (0..LONG_KEYS)
        .map(|i| Request::Update {
            key: Key::new(2, 2, &long_key(i), b"a"),
            value: vec![1],
        })
        .collect();
    for r in client.batch(updates).unwrap() {
        assert!(matches!(r, Reply::Version(_)), "{r:?}");
    }
    let (mut listed, mut after, mut pages) = (Vec::new(), None, 0);
    loop {
        let page = Request::ListDkeys {
            container: 2,
            object: 2,
            after: after.clone(),
            limit: 4096,
        };
        let Reply::Keys { keys, more } = client.request(&page).unwrap() else {
            panic!("not keys");
        };
        assert!(!keys.is_empty() || !more, "an empty page with more");
        after = keys.last().cloned().or(after);
        listed.extend(keys);
        pages += 1;
        assert!(pages <= LONG_KEYS, "the listing does not end");
        if !more {
            break;
        }
    }
    assert!(pages > 1, "8.4 MiB of keys came in one page");
    let want: Vec<Vec<u8>> = (0..LONG_KEYS).map(long_key).collect();
    assert!(
        listed == want,
        "{} keys listed, {} written",
        listed.len(),
        want.len()
    );
    assert_eq!(client.list_dkeys(2, 2).unwrap().len(), LONG_KEYS);
    still_serves(&client, "after-listing");
}
