//! A file namespace on a nearly full engine: writing a file past what the
//! store admits fails with ENOSPC (the engine's "no space", not EIO and
//! not a wait), every byte written before it reads back, and removing the
//! file makes room for new writes. And a file of whole 1 MiB chunks reads
//! back over tcp.

use std::sync::Arc;

use ferrite_client::client::{Client, ClientOptions};
use ferrite_client::fs::{Namespace, ROOT_OBJECT};
use ferrite_engine::config::EngineConfig;
use ferrite_engine::{Engine, EngineHandle};

/// Writes per file before the test gives up on seeing ENOSPC.
const WRITES_MAX: usize = 1024;
const PIECE: usize = 1 << 20;

fn piece(i: usize) -> Vec<u8> {
    (0..PIECE)
        .map(|j| ((i * 7 + j / 4096) % 251) as u8)
        .collect()
}

/// Writes `name` a MiB at a time until the first error, then closes it;
/// returns the pieces written and the error's errno.
fn fill(ns: &Namespace, name: &str) -> (usize, i32) {
    let fh = ns.create(ROOT_OBJECT, name, 0o644).unwrap();
    for i in 0..WRITES_MAX {
        if let Err(e) = ns.write(&fh, (i * PIECE) as u64, &piece(i)) {
            println!("fs_full: {name}: {i} MiB written, then: {e}");
            // Publishing the size rewrites the entry, no bigger: admitted.
            ns.close(fh).unwrap();
            return (i, e.errno());
        }
    }
    panic!("{WRITES_MAX} MiB fit in a 128 MiB device");
}

/// An engine on one 128 MiB device in `dir`, and a namespace on it over
/// tcp.
fn small_engine(dir: &tempfile::TempDir) -> (EngineHandle, Namespace) {
    let mut config = EngineConfig::for_temp_dir(dir.path());
    config.bdev = "uring:{dir}/target-{i}.bdev?size=128M".into();
    let engine = Engine::start(config).unwrap();
    let url = format!("tcp://{}", engine.tcp_addr().unwrap());
    let options = ClientOptions {
        token: Some(engine.token().to_vec()),
        ..ClientOptions::default()
    };
    let ns = Namespace::new(Arc::new(Client::connect_with(&url, options).unwrap()), 7);
    (engine, ns)
}

#[test]
fn writes_past_the_store_ceiling_fail_with_enospc_and_deleting_makes_room() {
    let dir = tempfile::tempdir().unwrap();
    let (_engine, ns) = small_engine(&dir);
    let empty = ns.space().unwrap();
    let (written, errno) = fill(&ns, "big");
    // The namespace's space (statfs through a mount) says it is full.
    let full = ns.space().unwrap();
    assert_eq!(full.total_bytes, empty.total_bytes);
    assert!(empty.free_bytes() > (written * PIECE) as u64, "{empty:?}");
    assert!(full.free_bytes() < 2 * PIECE as u64, "{full:?}");
    assert_eq!(errno, libc::ENOSPC, "after {written} MiB");
    assert!(written >= 16, "only {written} MiB before ENOSPC");
    let fh = ns.open(ROOT_OBJECT, "big").unwrap();
    let mut buf = vec![0u8; PIECE];
    for i in 0..written {
        let n = ns.read(&fh, (i * PIECE) as u64, &mut buf).unwrap();
        assert_eq!(n, PIECE, "piece {i}");
        assert!(buf == piece(i), "piece {i} reads back different bytes");
    }
    ns.close(fh).unwrap();
    ns.unlink(ROOT_OBJECT, "big").unwrap();
    // The punches free the file's records; a new file takes their room.
    let (again, errno) = fill(&ns, "again");
    assert_eq!(errno, libc::ENOSPC);
    assert!(
        again + 2 >= written,
        "{again} MiB after the delete, {written} before"
    );
}

/// Over tcp a 1 MiB chunk's record (its header and 1 MiB of data) is read
/// one-sided in pieces: asked for whole, it passed a request's limit and
/// the engine dropped the connection as malformed.
#[test]
fn whole_chunk_records_read_back_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let (_engine, ns) = small_engine(&dir);
    let fh = ns.create(ROOT_OBJECT, "f", 0o644).unwrap();
    for i in 0..20 {
        ns.write(&fh, (i * PIECE) as u64, &piece(i)).unwrap();
    }
    ns.close(fh).unwrap();
    let fh = ns.open(ROOT_OBJECT, "f").unwrap();
    let mut buf = vec![0u8; PIECE];
    for i in 0..20 {
        let n = ns.read(&fh, (i * PIECE) as u64, &mut buf).unwrap();
        assert_eq!(n, PIECE);
        assert!(buf == piece(i));
    }
}
