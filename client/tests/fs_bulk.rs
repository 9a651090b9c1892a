//! Guards the bulk data path (file data through the client's own memory
//! region instead of the frames, on the Unix socket): bytes written and read
//! through it round-trip, also at odd offsets, across holes (which the engine
//! must zero: a slot holds old bytes) and with 47008-byte ior-hard transfers
//! across chunk boundaries; a bulk request naming a range outside the region
//! gets a clear error while the connection keeps serving; an unsealed region
//! is refused at login and the connection works without it; and clients
//! without a region (none offered, or over tcp) fall back to the frames and
//! read the same data.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use ferrite_client::client::bulk::BulkArea;
use ferrite_client::client::conn::{ConnectOptions, Connection};
use ferrite_client::client::{Client, ClientOptions, Key, Reply, Request};
use ferrite_client::fs::{Namespace, ROOT_OBJECT};
use ferrite_engine::config::EngineConfig;
use ferrite_engine::{Engine, EngineHandle};
use ferrite_proto::rpc::{ErrorCode, Placed};

/// An engine listening on a Unix socket and on loopback tcp.
fn engine(dir: &tempfile::TempDir) -> EngineHandle {
    let mut config = EngineConfig::for_temp_dir(dir.path());
    config.listen.unix = dir.path().join("e.sock").to_string_lossy().into_owned();
    Engine::start(config).unwrap()
}

fn unix_url(e: &EngineHandle) -> String {
    format!("unix://{}", e.unix_path().unwrap().display())
}

/// Default options holding the engine's token (TCP requires it).
fn with_token(e: &EngineHandle) -> ClientOptions {
    ClientOptions {
        token: Some(e.token().to_vec()),
        ..ClientOptions::default()
    }
}

fn tcp_url(e: &EngineHandle) -> String {
    format!("tcp://{}", e.tcp_addr().unwrap())
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8)
        .collect()
}

/// A bulk request through a raw slot of the client's area.
fn bulk(client: &Client, req: Request) -> Reply {
    client.request(&req).unwrap()
}

#[test]
fn bulk_requests_place_bytes_and_zero_holes() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&dir);
    let area = BulkArea::create(2).unwrap();
    let opts = ClientOptions {
        bulk_slots: 0,
        ..ClientOptions::default()
    };
    let client = Client::connect_with(&unix_url(&e), opts).unwrap();
    // One raw connection offering `area`, to drive the slots by hand.
    let url = unix_url(&e).parse().unwrap();
    let with_area = ConnectOptions {
        bulk_fd: Some(area.raw_fd()),
        ..ConnectOptions::default()
    };
    let (conn, session) = Connection::open(&url, &with_area, Duration::from_secs(10)).unwrap();
    assert!(session.bulk_mapped, "the engine maps a sealed memfd");
    let key = Key::new(3, 9, b"c1", b"d");
    let src = area.lease().unwrap();
    src.fill(&pattern(7, 1));
    // Two extents with holes around them: [3, 10) and [20, 27).
    for at in [3u64, 20] {
        let req = Request::BulkWrite {
            key: key.clone(),
            offset: at,
            region_offset: src.offset(),
            len: 7,
        };
        assert!(matches!(conn.request(&req).unwrap(), Reply::Version(_)));
    }
    let dst = area.lease().unwrap();
    dst.fill(&[0xee; 40]);
    let read = Request::BulkRead {
        key: key.clone(),
        offset: 1,
        region_offset: dst.offset(),
        len: 33,
    };
    match conn.request(&read).unwrap() {
        Reply::Placed(Some(Placed { len: 33, .. })) => {}
        other => panic!("{other:?}"),
    }
    let mut got = [0u8; 34];
    dst.copy_to(&mut got);
    let mut want = [0u8; 34];
    want[2..9].copy_from_slice(&pattern(7, 1));
    want[19..26].copy_from_slice(&pattern(7, 1));
    want[33] = 0xee; // past the read: untouched
    assert_eq!(got, want);
    // The same bytes over the frames, from a client without a region.
    let framed = client.read_extent(&key, 1, 33).unwrap().unwrap();
    assert_eq!(framed.value, want[..33]);
    // An absent array places nothing.
    let absent = Request::BulkRead {
        key: Key::new(3, 9, b"none", b"d"),
        offset: 0,
        region_offset: dst.offset(),
        len: 8,
    };
    assert_eq!(conn.request(&absent).unwrap(), Reply::Placed(None));
}

/// A batch of extent writes (bulk and framed, for both targets) runs as one
/// group per target: one reply per item, in order, each what the item gets
/// alone (a bulk range outside the region and a write to a single value's
/// key are refused alone), and the bytes read back.
#[test]
fn a_batch_of_bulk_and_framed_extent_writes_answers_as_its_items() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&dir);
    let area = BulkArea::create(2).unwrap();
    let url = unix_url(&e).parse().unwrap();
    let with_area = ConnectOptions {
        bulk_fd: Some(area.raw_fd()),
        ..ConnectOptions::default()
    };
    let (conn, session) = Connection::open(&url, &with_area, Duration::from_secs(10)).unwrap();
    assert!(session.bulk_mapped);
    let single = Key::new(3, 9, b"single", b"d");
    assert!(matches!(
        conn.request(&Request::Update {
            key: single.clone(),
            value: b"v".to_vec()
        })
        .unwrap(),
        Reply::Version(_)
    ));
    let src = area.lease().unwrap();
    src.fill(&pattern(64 * 100, 5));
    let key = |i: usize| Key::new(3, 9, format!("f{i}").as_bytes(), b"d");
    let mut batch: Vec<Request> = (0..40)
        .map(|i| match i % 2 {
            0 => Request::BulkWrite {
                key: key(i),
                offset: i as u64,
                region_offset: src.offset() + (i * 100) as u64,
                len: 100,
            },
            _ => Request::ExtentWrite {
                key: key(i),
                offset: i as u64,
                data: pattern(100, 5)[..].to_vec(),
            },
        })
        .collect();
    let outside = Request::BulkWrite {
        key: key(99),
        offset: 0,
        region_offset: area.len() as u64 - 10,
        len: 11,
    };
    batch.insert(7, outside);
    let on_single = Request::BulkWrite {
        key: single.clone(),
        offset: 0,
        region_offset: src.offset(),
        len: 4,
    };
    batch.insert(13, on_single);
    let owners: std::collections::HashSet<_> = batch.iter().map(|r| r.owner(2)).collect();
    assert_eq!(owners.len(), 2, "the batch did not span both targets");
    let Reply::Batch(replies) = conn.request(&Request::Batch(batch.clone())).unwrap() else {
        panic!("batch")
    };
    assert_eq!(replies.len(), batch.len());
    for (i, r) in replies.iter().enumerate() {
        match i {
            7 => assert!(
                matches!(
                    r,
                    Reply::Error {
                        code: ErrorCode::BadRegion,
                        ..
                    }
                ),
                "{r:?}"
            ),
            13 => assert!(matches!(r, Reply::Error { .. }), "{r:?}"),
            _ => assert!(matches!(r, Reply::Version(_)), "item {i}: {r:?}"),
        }
    }
    let client = Client::connect_with(&tcp_url(&e), with_token(&e)).unwrap();
    for i in 0..40 {
        let want = match i % 2 {
            0 => pattern(64 * 100, 5)[i * 100..(i + 1) * 100].to_vec(),
            _ => pattern(100, 5),
        };
        let got = client.read_extent(&key(i), i as u64, 100).unwrap().unwrap();
        assert_eq!(got.value, want, "file {i}");
    }
    assert!(client.read_extent(&key(99), 0, 11).unwrap().is_none());
}

#[test]
fn files_round_trip_through_the_bulk_region() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&dir);
    let client = Arc::new(Client::connect(&unix_url(&e)).unwrap());
    assert!(client.bulk_enabled(), "a local client gets the bulk path");
    let ns = Namespace::new(client.clone(), 7);
    // ior-hard: 47008-byte transfers, interleaved by two writers, across
    // 1 MiB chunk boundaries (64 transfers = 2.9 MiB).
    const T: usize = 47008;
    let fh = ns.create(ROOT_OBJECT, "hard", 0o644).unwrap();
    std::thread::scope(|s| {
        for w in 0..2 {
            let (ns, fh) = (&ns, &fh);
            s.spawn(move || {
                for i in (w..64).step_by(2) {
                    ns.write(fh, (i * T) as u64, &pattern(T, i as u32)).unwrap();
                }
            });
        }
    });
    // Odd offsets and a hole: a write at 3 MiB + 5 after a gap.
    let odd = pattern(100_003, 77);
    ns.write(&fh, (3 << 20) + 5, &odd).unwrap();
    ns.close(fh).unwrap();
    let area = client.bulk_area().unwrap();
    let written = area.leases_total();
    assert!(written > 64, "the writes went through the region");
    // Reads by a client without one-sided reads (which would serve these
    // chunks straight from the engine's memory) go through its region.
    let opts = ClientOptions {
        one_sided: false,
        ..ClientOptions::default()
    };
    let reader = Arc::new(Client::connect_with(&unix_url(&e), opts).unwrap());
    let reader_area = reader.bulk_area().unwrap().clone();
    let ns = Namespace::new(reader, 7);
    let fh = ns.open(ROOT_OBJECT, "hard").unwrap();
    let end = (3 << 20) + 5 + odd.len();
    assert_eq!(fh.size(), end as u64);
    for i in [0usize, 21, 22, 44, 63] {
        let mut buf = vec![0xffu8; T];
        assert_eq!(ns.read(&fh, (i * T) as u64, &mut buf).unwrap(), T);
        assert_eq!(buf, pattern(T, i as u32), "transfer {i}");
    }
    // Everything in one read: transfers, the hole, the odd extent.
    let mut all = vec![0xffu8; end];
    assert_eq!(ns.read(&fh, 0, &mut all).unwrap(), end);
    for i in 0..64 {
        assert_eq!(all[i * T..(i + 1) * T], pattern(T, i as u32)[..], "{i}");
    }
    assert!(all[64 * T..(3 << 20) + 5].iter().all(|&b| b == 0), "hole");
    assert_eq!(all[(3 << 20) + 5..], odd[..]);
    assert!(
        reader_area.leases_total() > 0,
        "reads went through the region"
    );
    assert_eq!(area.leases_total(), written);
    // A client without a region, and one over tcp, read the same bytes.
    for (url, slots) in [(unix_url(&e), 0), (tcp_url(&e), 8)] {
        let opts = ClientOptions {
            bulk_slots: slots,
            ..with_token(&e)
        };
        let other = Arc::new(Client::connect_with(&url, opts).unwrap());
        assert!(!other.bulk_enabled(), "{url} with {slots} slots");
        let ns2 = Namespace::new(other, 7);
        let fh2 = ns2.open(ROOT_OBJECT, "hard").unwrap();
        let mut again = vec![0u8; end];
        assert_eq!(ns2.read(&fh2, 0, &mut again).unwrap(), end);
        assert!(again == all, "{url}: same bytes without the bulk path");
    }
    assert_eq!(area.free_bytes(), area.len(), "every slot came back");
}

#[test]
fn bad_bulk_ranges_are_refused_and_the_connection_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&dir);
    let client = Client::connect(&unix_url(&e)).unwrap();
    let len = client.bulk_area().unwrap().len() as u64;
    let key = Key::new(1, 2, b"c", b"d");
    let bad = [(len - 10, 11), (len, 1), (u64::MAX - 3, 8)];
    for (region_offset, n) in bad {
        for req in [
            Request::BulkRead {
                key: key.clone(),
                offset: 0,
                region_offset,
                len: n,
            },
            Request::BulkWrite {
                key: key.clone(),
                offset: 0,
                region_offset,
                len: n,
            },
        ] {
            match bulk(&client, req) {
                Reply::Error { code, message } => {
                    assert_eq!(code, ErrorCode::BadRegion);
                    assert!(message.contains("outside"), "{message}");
                }
                other => panic!("{other:?}"),
            }
        }
    }
    // The engine and this client's connections go on.
    client.write_extent(&key, 0, b"still here").unwrap();
    let back = client.read_extent(&key, 0, 10).unwrap().unwrap();
    assert_eq!(back.value, b"still here");
}

#[test]
fn an_unsealed_region_is_refused_and_a_client_without_one_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&dir);
    // SAFETY: memfd_create with a static name; the fd is owned below.
    let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: a fresh fd nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sizing our own memfd.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 1 << 20) }, 0);
    let url = unix_url(&e).parse().unwrap();
    let opts = ConnectOptions {
        bulk_fd: Some(fd.as_raw_fd()),
        ..ConnectOptions::default()
    };
    let (conn, session) = Connection::open(&url, &opts, Duration::from_secs(10)).unwrap();
    assert!(!session.bulk_mapped, "a memfd that may shrink is refused");
    let key = Key::new(1, 2, b"c", b"d");
    let req = Request::BulkRead {
        key: key.clone(),
        offset: 0,
        region_offset: 0,
        len: 8,
    };
    match conn.request(&req).unwrap() {
        Reply::Error { code, message } => {
            assert_eq!(code, ErrorCode::BadRegion);
            assert!(message.contains("no bulk region"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let write = Request::ExtentWrite {
        key,
        offset: 0,
        data: b"framed".to_vec(),
    };
    assert!(matches!(conn.request(&write).unwrap(), Reply::Version(_)));
}
