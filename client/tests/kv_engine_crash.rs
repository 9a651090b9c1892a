//! Guards what clients see when the engine dies under load, and what
//! survives: SIGKILL mid-run makes in-flight and later calls fail with a
//! clear disconnection error (GETs included, although the shm regions stay
//! mapped); a restarted engine on the same device has every acknowledged
//! write.
//!
//! Each writer owns its own keys: with two writers on one key the last
//! write wins, which need not be the larger counter.

mod kv_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrite_client::client::{Client, Key};
use kv_support::EngineProc;

/// Keys per writer.
const KEYS: u64 = 64;
const WRITERS: u64 = 3;

fn key(k: u64) -> Key {
    Key::new(3, 1, format!("crash-{k}").as_bytes(), b"")
}

#[test]
fn kill_gives_clear_errors_and_restart_keeps_acknowledged_writes() {
    kill_and_restart(&[]);
}

/// `process` durability acknowledges before the flush: a killed engine
/// still loses nothing it acknowledged (the kernel holds the bytes).
#[test]
fn kill_under_process_durability_keeps_acknowledged_writes() {
    kill_and_restart(&["--durability", "process"]);
}

fn kill_and_restart(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = EngineProc::start_with(dir.path(), extra);
    let url = engine.unix.clone();
    let client = Arc::new(Client::connect(&url).unwrap());
    let acked: Arc<Mutex<HashMap<u64, u64>>> = Arc::new(Mutex::new(HashMap::new()));
    let count = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (client, acked, count) = (client.clone(), acked.clone(), count.clone());
            std::thread::spawn(move || {
                for n in 0..1_000_000u64 {
                    let k = w * KEYS + n % KEYS;
                    match client.put(&key(k), &n.to_le_bytes()) {
                        Ok(_) => {
                            let mut a = acked.lock().unwrap();
                            let e = a.entry(k).or_insert(n);
                            *e = (*e).max(n);
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => return e,
                    }
                }
                panic!("writer {w} never saw the engine die");
            })
        })
        .collect();
    let started = Instant::now();
    while count.load(Ordering::Relaxed) < 2000 && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        count.load(Ordering::Relaxed) >= 2000,
        "writers made no progress"
    );
    engine.kill();
    for w in writers {
        let e = w.join().unwrap();
        assert!(
            e.is_disconnect(),
            "writer error is not a disconnection: {e}"
        );
        assert!(e.to_string().contains("engine"), "{e}");
    }
    let g = client.get(&key(0)).unwrap_err();
    assert!(g.is_disconnect(), "GET after kill: {g}");
    assert!(client.put(&key(0), b"x").unwrap_err().is_disconnect());

    let _engine = EngineProc::start_with(dir.path(), extra);
    let fresh = Client::connect(&_engine.unix).unwrap();
    assert_ne!(
        fresh.incarnation(),
        client.incarnation(),
        "restart not visible"
    );
    let acked = acked.lock().unwrap();
    assert!(!acked.is_empty());
    for (&k, &n) in acked.iter() {
        let v = fresh
            .get(&key(k))
            .unwrap()
            .unwrap_or_else(|| panic!("key {k} lost"));
        let got = u64::from_le_bytes(v.as_slice().try_into().expect("8-byte value"));
        assert!(got >= n, "key {k}: acknowledged {n}, found {got}");
    }
}
