//! Guards one-sided reads of file-chunk pieces that are not in the chunk's
//! newest extent record (ior-hard: ~22 interleaved writers' extents per
//! 1 MiB chunk), through the chunk's extent list asked of the engine once
//! and kept by the client:
//! - every interleaved 47008-byte transfer reads back byte for byte, those
//!   still in the memory ring and those only on the device, with one
//!   ExtentList per chunk (asked 8 chunks at a time) and no read by RPC;
//! - a transfer overwritten after its chunk's list was kept reads back as
//!   the new bytes (the kept list is found stale at its bucket check);
//! - readers racing a writer that keeps overwriting one transfer in a
//!   chunk of others only ever see a whole version, never one older than
//!   the last acknowledged before their read began.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use ferrite_client::client::Client;
use ferrite_client::fs::{Namespace, ROOT_OBJECT};
use ferrite_engine::config::EngineConfig;
use ferrite_engine::{Engine, EngineHandle};

const TRANSFER: usize = 47008;
const WRITERS: u64 = 4;

/// An engine on file bdevs (a 16 MiB ring, a device log exported over shm).
fn engine(dir: &tempfile::TempDir) -> EngineHandle {
    let mut config = EngineConfig::for_temp_dir(dir.path());
    config.listen.unix = dir.path().join("e.sock").to_string_lossy().into_owned();
    Engine::start(config).unwrap()
}

fn client(e: &EngineHandle) -> Arc<Client> {
    let url = format!("unix://{}", e.unix_path().unwrap().display());
    Arc::new(Client::connect(&url).unwrap())
}

/// The bytes of transfer `t` at version `v`: `v` in the first 8 bytes, then
/// a pattern of both.
fn transfer(t: u64, v: u64) -> Vec<u8> {
    let mut b = v.to_le_bytes().to_vec();
    b.extend((8..TRANSFER as u64).map(|i| (i * 13 + t * 7 + v * 101) as u8));
    b
}

fn offset(t: u64) -> u64 {
    t * TRANSFER as u64
}

#[test]
fn interleaved_pieces_are_read_one_sided_through_the_extent_list() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&dir);
    let writer = client(&e);
    let ns = Namespace::new(writer, 7);
    // 4 writers × 120 segments, interleaved: 22.5 MB through a 16 MiB ring.
    let transfers = WRITERS * 120;
    let fh = ns.create(ROOT_OBJECT, "hard", 0o644).unwrap();
    for segment in 0..transfers / WRITERS {
        for w in 0..WRITERS {
            let t = segment * WRITERS + w;
            ns.write(&fh, offset(t), &transfer(t, 1)).unwrap();
        }
    }
    ns.close(fh).unwrap();
    let reader = client(&e);
    let rns = Namespace::new(reader.clone(), 7);
    let fh = rns.open(ROOT_OBJECT, "hard").unwrap();
    let before = reader.counters();
    let mut buf = vec![0u8; TRANSFER];
    let chunks = (transfers * TRANSFER as u64).div_ceil(1 << 20);
    // The first read asks for chunk 0's list, and the next 7 chunks' come along.
    rns.read(&fh, offset(0), &mut buf).unwrap();
    assert_eq!(reader.extent_lists().len() as u64, chunks.min(8));
    for t in 0..transfers {
        assert_eq!(rns.read(&fh, offset(t), &mut buf).unwrap(), TRANSFER);
        assert!(buf == transfer(t, 1), "transfer {t}");
    }
    let c = reader.counters().since(&before);
    eprintln!("{c:?}");
    assert!(
        c.listed_reads + c.one_sided_hits >= transfers && c.listed_reads >= transfers * 3 / 4,
        "pieces in older records were read through the lists: {c:?}"
    );
    assert!(
        c.extent_lists <= chunks + 2,
        "one list per chunk ({chunks}): {c:?}"
    );
    assert_eq!(c.rpc_requests, c.extent_lists, "no read went by RPC: {c:?}");
    // Overwrite a few transfers: the kept lists are stale now.
    let ns2 = Namespace::new(client(&e), 7);
    let fh2 = ns2.open(ROOT_OBJECT, "hard").unwrap();
    for t in [0, 5, 77, transfers - 1] {
        ns2.write(&fh2, offset(t), &transfer(t, 2)).unwrap();
    }
    ns2.close(fh2).unwrap();
    for t in [0, 5, 77, transfers - 1] {
        rns.read(&fh, offset(t), &mut buf).unwrap();
        assert!(buf == transfer(t, 2), "overwritten transfer {t}");
        let next = (t + 1) % transfers;
        rns.read(&fh, offset(next), &mut buf).unwrap();
        let v = if [0, 5, 77].contains(&next) { 2 } else { 1 };
        assert!(buf == transfer(next, v), "its neighbour {next}");
    }
}

#[test]
fn readers_racing_overwrites_see_whole_acknowledged_versions() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&dir);
    let ns = Namespace::new(client(&e), 7);
    let fh = ns.create(ROOT_OBJECT, "race", 0o644).unwrap();
    for t in 0..20 {
        ns.write(&fh, offset(t), &transfer(t, 1)).unwrap();
    }
    ns.close(fh).unwrap();
    // Transfer 9 lies inside chunk 0 among the others' extents; after each
    // of its versions transfer 10 is written again (same bytes), so the
    // chunk's newest record is never the hot one and its reads go through
    // the list, which every write makes stale.
    let hot = 9;
    let acked = Arc::new(AtomicU64::new(1));
    let done = Arc::new(AtomicBool::new(false));
    let reader = client(&e);
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (acked, done) = (acked.clone(), done.clone());
            let rns = Namespace::new(reader.clone(), 7);
            std::thread::spawn(move || {
                let fh = rns.open(ROOT_OBJECT, "race").unwrap();
                let mut buf = vec![0u8; TRANSFER];
                let mut reads = 0u64;
                while !done.load(Ordering::Acquire) || reads < 50 {
                    let floor = acked.load(Ordering::Acquire);
                    rns.read(&fh, offset(hot), &mut buf).unwrap();
                    let v = u64::from_le_bytes(buf[..8].try_into().unwrap());
                    assert!(
                        v >= floor,
                        "read version {v} after {floor} was acknowledged"
                    );
                    assert!(buf == transfer(hot, v), "a whole version {v}");
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let wns = Namespace::new(client(&e), 7);
    let wfh = wns.open(ROOT_OBJECT, "race").unwrap();
    for v in 2..300 {
        wns.write(&wfh, offset(hot), &transfer(hot, v)).unwrap();
        acked.store(v, Ordering::Release);
        wns.write(&wfh, offset(10), &transfer(10, 1)).unwrap();
    }
    done.store(true, Ordering::Release);
    for r in readers {
        assert!(r.join().unwrap() >= 50);
    }
    let c = reader.counters();
    eprintln!("{c:?}");
    assert!(c.listed_reads > 0, "some reads went through a list: {c:?}");
}
