//! Reopen after an unclean stop on a real file through io_uring (O_DIRECT):
//! the store is dropped without any shutdown step while updates are in
//! flight, which is what a killed process leaves behind; every acknowledged
//! update must be found after reopening, twice.

use ferrite_engine::store::{Store, StoreConfig};
use ferrite_proto::key::RecordKey;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

fn spec(dir: &std::path::Path) -> String {
    format!(
        "uring:{}?size=64M&direct=1",
        dir.join("store.img").display()
    )
}

/// The update number `i` a value `"{k}:{i};..."` carries.
fn seq_of(v: &[u8]) -> u32 {
    let s = String::from_utf8_lossy(v);
    s.split([':', ';'])
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn acknowledged_updates_survive_an_unclean_stop_on_a_uring_file() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let s1 = spec.clone();
    let acked_out = glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let acked: Rc<RefCell<HashMap<u32, Vec<u8>>>> = Rc::default();
            let s = Rc::new(
                Store::open(ferrite_bdev::open(&s1).unwrap(), StoreConfig::small())
                    .await
                    .unwrap(),
            );
            let tasks: Vec<_> = (0..8u32)
                .map(|t| {
                    let (s, acked) = (s.clone(), acked.clone());
                    glommio::spawn_local(async move {
                        for i in 0..200u32 {
                            let k = t * 1000 + i % 50;
                            let kb = k.to_le_bytes();
                            let v: Vec<u8> = format!("{k}:{i};")
                                .bytes()
                                .cycle()
                                .take(100 + i as usize * 11)
                                .collect();
                            s.update(&RecordKey::new(2, 2, b"u", &kb), &v)
                                .await
                                .unwrap();
                            acked.borrow_mut().insert(k, v);
                        }
                    })
                })
                .collect();
            // Stop while the last updates are still in flight: wait for
            // most of them, then drop everything.
            for t in tasks.into_iter().take(6) {
                t.await;
            }
            let out = acked.borrow().clone();
            out
        })
        .unwrap()
        .join()
        .unwrap();
    assert!(acked_out.len() >= 300);
    for _ in 0..2 {
        let spec = spec.clone();
        let acked = acked_out.clone();
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let s = Store::open(ferrite_bdev::open(&spec).unwrap(), StoreConfig::small())
                    .await
                    .unwrap();
                for (k, v) in &acked {
                    let kb = k.to_le_bytes();
                    let got = s.fetch(&RecordKey::new(2, 2, b"u", &kb)).await.unwrap();
                    let got = got.map(|g| g.1);
                    // The acknowledged value, or a later one of the same
                    // key that was in flight when the process stopped.
                    let ok = got.as_ref().is_some_and(|g| seq_of(g) >= seq_of(v));
                    assert!(ok, "key {k} lost");
                }
                s.update(&RecordKey::new(2, 2, b"u", b"again"), b"x")
                    .await
                    .unwrap();
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
