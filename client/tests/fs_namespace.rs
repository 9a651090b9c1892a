//! Guards the file namespace on a real (embedded) engine: creates, EEXIST
//! races, rename, rmdir of non-empty directories, paged readdir, truncate,
//! sparse files, symlinks, and the IO500 rule between two clients.

use ferrite_client::client::Client;
use ferrite_client::fs::{EntryKind, FsError, Namespace, ROOT_OBJECT};
use std::sync::Arc;

fn namespace() -> Namespace {
    let client = ferrite_client::embedded::connect().expect("embedded engine");
    Namespace::new(Arc::new(client), 7)
}

#[test]
fn create_lookup_and_exclusive_create() {
    let ns = namespace();
    let d = ns.mkdir(ROOT_OBJECT, "dir", 0o755).unwrap();
    let f = ns.create(d.object, "a", 0o644).unwrap();
    ns.close(f).unwrap();
    assert_eq!(ns.lookup(d.object, "a").unwrap().kind, EntryKind::File);
    assert!(matches!(
        ns.create(d.object, "a", 0o644),
        Err(FsError::Exists(_))
    ));
    assert!(matches!(
        ns.lookup(d.object, "nope"),
        Err(FsError::NotFound(_))
    ));
    let (_, e) = ns.resolve("/dir/a").unwrap();
    assert_eq!(e.size, 0);
    assert!(matches!(ns.resolve("/dir/a/x"), Err(FsError::NotDir(_))));
}

#[test]
fn racing_creates_one_wins() {
    let ns = namespace();
    let d = ns.mkdir(ROOT_OBJECT, "race", 0o755).unwrap();
    let wins: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let ns = ns.clone();
                s.spawn(move || match ns.create(d.object, "same", 0o644) {
                    Ok(_) => 1,
                    Err(FsError::Exists(_)) => 0,
                    Err(e) => panic!("unexpected {e}"),
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(wins, 1);
}

/// A file created with its own chunk size (any size, not a power of two)
/// keeps it, whatever the namespace's: a handle with another setting reads
/// across its chunk boundaries exactly what was written; bad sizes are
/// refused.
#[test]
fn a_file_keeps_the_chunk_size_it_was_created_with() {
    let ns = namespace();
    let fh = ns.create_chunked(ROOT_OBJECT, "odd", 0o644, 47008).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    ns.write(&fh, 1000, &data).unwrap();
    ns.close(fh).unwrap();
    let other = ns.clone().with_chunk_bytes(4096).unwrap();
    let fh = other.open(ROOT_OBJECT, "odd").unwrap();
    assert_eq!(fh.entry().chunk_size, 47008);
    let mut buf = vec![0xffu8; 201_000];
    assert_eq!(other.read(&fh, 0, &mut buf).unwrap(), 201_000);
    assert!(buf[..1000].iter().all(|&b| b == 0));
    assert_eq!(&buf[1000..], &data[..]);
    for bad in [0, (1 << 20) + 1] {
        let r = ns.create_chunked(ROOT_OBJECT, "bad", 0o644, bad);
        assert!(matches!(r, Err(FsError::Invalid(..))), "{bad}: {r:?}");
    }
}

#[test]
fn write_read_sparse_and_truncate() {
    let ns = namespace().with_chunk_bytes(4096).unwrap();
    let fh = ns.create(ROOT_OBJECT, "f", 0o644).unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    ns.write(&fh, 3000, &data).unwrap();
    ns.write(&fh, 50_000, b"tail").unwrap();
    ns.close(fh).unwrap();
    let fh = ns.open(ROOT_OBJECT, "f").unwrap();
    assert_eq!(fh.size(), 50_004);
    let mut buf = vec![0xffu8; 50_004];
    assert_eq!(ns.read(&fh, 0, &mut buf).unwrap(), 50_004);
    assert!(
        buf[..3000].iter().all(|&b| b == 0),
        "hole before data reads zero"
    );
    assert_eq!(&buf[3000..13_000], &data[..]);
    assert!(
        buf[13_000..50_000].iter().all(|&b| b == 0),
        "sparse middle reads zero"
    );
    assert_eq!(&buf[50_000..], b"tail");
    ns.truncate(ROOT_OBJECT, "f", 5000).unwrap();
    ns.truncate(ROOT_OBJECT, "f", 9000).unwrap();
    let fh = ns.open(ROOT_OBJECT, "f").unwrap();
    assert_eq!(fh.size(), 9000);
    let mut buf = vec![0xffu8; 9000];
    ns.read(&fh, 0, &mut buf).unwrap();
    assert_eq!(&buf[3000..5000], &data[..2000]);
    assert!(
        buf[5000..].iter().all(|&b| b == 0),
        "truncated bytes read zero after growth"
    );
}

#[test]
fn rename_rmdir_symlink_unlink() {
    let ns = namespace();
    let a = ns.mkdir(ROOT_OBJECT, "a", 0o755).unwrap();
    let b = ns.mkdir(ROOT_OBJECT, "b", 0o755).unwrap();
    let fh = ns.create(a.object, "x", 0o600).unwrap();
    ns.write(&fh, 0, b"hello").unwrap();
    ns.close(fh).unwrap();
    assert!(matches!(
        ns.rmdir(ROOT_OBJECT, "a"),
        Err(FsError::NotEmpty(_))
    ));
    ns.rename(a.object, "x", b.object, "y").unwrap();
    assert!(matches!(
        ns.lookup(a.object, "x"),
        Err(FsError::NotFound(_))
    ));
    let fh = ns.open(b.object, "y").unwrap();
    let mut buf = [0u8; 5];
    ns.read(&fh, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    ns.rmdir(ROOT_OBJECT, "a").unwrap();
    ns.symlink(b.object, "l", b"y").unwrap();
    assert_eq!(ns.lookup(b.object, "l").unwrap().link, b"y");
    assert!(matches!(
        ns.rmdir(ROOT_OBJECT, "b"),
        Err(FsError::NotEmpty(_))
    ));
    ns.unlink(b.object, "y").unwrap();
    ns.unlink(b.object, "l").unwrap();
    ns.rmdir(ROOT_OBJECT, "b").unwrap();
    assert!(matches!(
        ns.lookup(ROOT_OBJECT, "b"),
        Err(FsError::NotFound(_))
    ));
}

#[test]
fn readdir_pages_through_every_entry() {
    let ns = namespace();
    let d = ns.mkdir(ROOT_OBJECT, "many", 0o755).unwrap();
    let n = 2500; // more than two readdir pages
    for i in 0..n {
        ns.close(ns.create(d.object, &format!("f{i:05}"), 0o644).unwrap())
            .unwrap();
    }
    let before = ns.client().counters();
    let mut names = Vec::new();
    ns.readdir(d.object, |name, e| {
        assert_eq!(e.kind, EntryKind::File);
        names.push(name.to_string());
        Ok(())
    })
    .unwrap();
    // The entries, all in the engine's memory rings, came with the
    // listing: no GET looked any of them up (one-sided or by RPC).
    let after = ns.client().counters();
    assert_eq!(after.one_sided_hits, before.one_sided_hits);
    assert_eq!(after.fallbacks, before.fallbacks);
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n);
    assert_eq!(names[0], "f00000");
}

#[test]
fn written_and_closed_by_one_client_is_read_by_another() {
    let ns = namespace();
    let url = ns.client().url();
    let other = Namespace::new(Arc::new(Client::connect(&url).unwrap()), 7);
    let fh = ns.create(ROOT_OBJECT, "shared", 0o644).unwrap();
    let data = vec![42u8; 3 << 20];
    ns.write(&fh, 0, &data).unwrap();
    ns.close(fh).unwrap();
    let fh = other.open(ROOT_OBJECT, "shared").unwrap();
    assert_eq!(fh.size(), 3 << 20);
    let mut buf = vec![0u8; 3 << 20];
    other.read(&fh, 0, &mut buf).unwrap();
    assert!(buf == data);
}

#[test]
fn unlink_removes_the_file_data() {
    use ferrite_client::client::Key;
    let ns = namespace().with_chunk_bytes(4096).unwrap();
    let fh = ns.create(ROOT_OBJECT, "gone", 0o644).unwrap();
    ns.write(&fh, 0, &[7u8; 10_000]).unwrap();
    let object = fh.entry().object;
    ns.close(fh).unwrap();
    let chunk = |i: u64| {
        let mut d = vec![b'c'];
        d.extend_from_slice(&i.to_be_bytes());
        Key::new(7, object, &d, b"d")
    };
    for i in 0..3 {
        assert!(ns.client().read_extent(&chunk(i), 0, 16).unwrap().is_some());
    }
    ns.unlink(ROOT_OBJECT, "gone").unwrap();
    for i in 0..3 {
        assert!(
            ns.client().read_extent(&chunk(i), 0, 16).unwrap().is_none(),
            "chunk {i} survived unlink"
        );
    }
}
