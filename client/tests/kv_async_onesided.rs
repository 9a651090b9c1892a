//! Guards the asynchronous one-sided GET (`Client::get_async`, and the
//! event-queue GET built on it) against a real engine over tcp, whose
//! endpoint has asynchronous reads as verbs does: many GETs in flight from
//! one thread are answered by one-sided reads (the hit counter rises by
//! one per GET, no RPC is sent), absent keys are absent, a cached bucket
//! made stale by an overwrite is read again (a retry) and the newest value
//! returned, and a key whose record is not plain (an extent) goes to the
//! engine by RPC. The same GETs over verbs run in the soft-RoCE guest
//! (`verbs_softroce.rs`).

mod kv_support;

use std::time::{Duration, Instant};

use ferrite_client::client::{Client, ClientEventQueue, Error, Key, Reply};
use kv_support::EngineProc;

fn key(i: u64) -> Key {
    Key::new(3, 3, format!("async-{i}").as_bytes(), b"")
}

fn value(i: u64, round: u64) -> Vec<u8> {
    format!("value {i} round {round}").into_bytes()
}

/// Issues every GET before awaiting any (one thread), then awaits them in
/// order; returns the values.
fn get_all(c: &Client, keys: &[Key]) -> Vec<Option<Vec<u8>>> {
    let futures: Vec<_> = keys.iter().map(|k| c.get_async(k)).collect();
    futures
        .into_iter()
        .map(|f| futures::executor::block_on(f).unwrap().map(|f| f.value))
        .collect()
}

#[test]
fn many_async_gets_from_one_thread_are_one_sided() {
    let dir = tempfile::tempdir().unwrap();
    let engine = EngineProc::start(dir.path());
    let c = engine.client(&engine.tcp);
    assert_eq!(c.one_sided_provider(), Some("tcp"));
    let keys: Vec<Key> = (0..64).map(key).collect();
    for (i, k) in keys.iter().enumerate().take(48) {
        c.put(k, &value(i as u64, 0)).unwrap();
    }
    for round in 0..2 {
        // Round 0: cold buckets (bucket read, then record read); round 1:
        // buckets cached (record read only).
        let before = c.counters();
        let got = get_all(&c, &keys);
        for (i, g) in got.iter().enumerate() {
            let want = (i < 48).then(|| value(i as u64, 0));
            assert_eq!(*g, want, "key {i}, round {round}");
        }
        let n = c.counters().since(&before);
        assert_eq!(n.one_sided_hits, 64, "round {round}: {n:?}");
        assert_eq!(
            (n.rpc_requests, n.fallbacks),
            (0, 0),
            "round {round}: {n:?}"
        );
        if round == 1 {
            assert!(n.cache_hits > 0, "round 1 used the bucket cache: {n:?}");
        }
    }
    // An overwrite makes the cached buckets lead to superseded records:
    // the GET reads the bucket again and returns the newest value.
    for (i, k) in keys.iter().enumerate().take(8) {
        c.put(k, &value(i as u64, 1)).unwrap();
    }
    let before = c.counters();
    let got = get_all(&c, &keys[..8]);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g, Some(value(i as u64, 1)), "key {i} after overwrite");
    }
    let n = c.counters().since(&before);
    assert_eq!((n.one_sided_hits, n.rpc_requests), (8, 0), "{n:?}");
    // Each GET whose bucket was still cached read it again (one whose cache
    // entry another key's bucket took read it fresh at once).
    assert!(n.retries > 0, "stale cached buckets were read again: {n:?}");
    // An extent record is assembled by the engine: RPC.
    let array = key(1000);
    c.write_extent(&array, 0, b"extent bytes").unwrap();
    let before = c.counters();
    let e = futures::executor::block_on(c.get_async(&array)).unwrap_err();
    let n = c.counters().since(&before);
    assert_eq!((n.fallbacks, n.rpc_requests), (1, 1), "{n:?}");
    assert!(
        matches!(&e, Error::Remote { message, .. } if message.contains("byte array")),
        "the engine's answer, as a blocking GET gets it: {e}"
    );
}

#[test]
fn event_queue_gets_are_driven_by_the_queue_poller() {
    let dir = tempfile::tempdir().unwrap();
    let engine = EngineProc::start(dir.path());
    let c = engine.client(&engine.tcp);
    for i in 0..16 {
        c.put(&key(i), &value(i, 0)).unwrap();
    }
    let eq = ClientEventQueue::new(32);
    let before = c.counters();
    let mut ids = Vec::new();
    for i in 0..20 {
        let ev = eq.event().unwrap();
        ids.push((ev.id(), i));
        c.get_event(&key(i), ev);
    }
    let mut seen = Vec::new();
    let limit = Instant::now() + Duration::from_secs(30);
    while seen.len() < ids.len() && Instant::now() < limit {
        for done in eq.poll(32, Duration::from_secs(5)) {
            let i = ids.iter().find(|(id, _)| *id == done.id).unwrap().1;
            match done.result.unwrap().unwrap() {
                Reply::Value(v) => seen.push((i, v.map(|f| f.value))),
                other => panic!("key {i}: {other:?}"),
            }
        }
    }
    seen.sort();
    let want: Vec<_> = (0..20)
        .map(|i| (i, (i < 16).then(|| value(i, 0))))
        .collect();
    assert_eq!(seen, want);
    let n = c.counters().since(&before);
    assert_eq!((n.one_sided_hits, n.rpc_requests), (20, 0), "{n:?}");
}
