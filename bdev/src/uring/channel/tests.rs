//! Tests of the io_uring channel on files in a temp directory: which writes
//! go direct and carry their flush, coherence of direct and buffered
//! writes, hole filling, and completions reaching operations not polled.

use super::super::{UringBdev, UringOptions};
use crate::{Bdev, Channel};
use futures::FutureExt;

/// The device's channel as the concrete type (its flush counter).
fn channel_of(dev: &UringBdev) -> super::UringChannel {
    super::UringChannel::new(
        dev.name.clone(),
        dev.file.clone(),
        dev.direct_file.clone(),
        dev.block_size,
        dev.size_bytes,
        &dev.opts,
    )
    .unwrap()
}

/// Which of the first `pages` pages of `path` are in the page cache.
fn resident(path: &std::path::Path, pages: usize) -> Vec<bool> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let len = pages * 4096;
    // SAFETY: a read-only shared mapping of our own file, only given to
    // mincore and unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let mut v = vec![0u8; pages];
    // SAFETY: `v` has one byte per page of the mapping.
    assert_eq!(unsafe { libc::mincore(p, len, v.as_mut_ptr()) }, 0);
    // SAFETY: unmapping what mmap returned.
    unsafe { libc::munmap(p, len) };
    v.iter().map(|b| b & 1 == 1).collect()
}

/// `write_durable` on a channel whose writes are all O_DIRECT is one
/// write with `RWF_DSYNC`, no flush; through the page cache it is a
/// write, then a flush (a sync of its range alone would leave the other
/// dirty pages out). Either way the bytes read back.
#[test]
fn a_durable_write_carries_its_flush_only_where_every_write_is_direct() {
    for (direct, flushes) in [(true, 0), (false, 1)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let opts = UringOptions {
            size: Some(1 << 20),
            direct,
            ..UringOptions::default()
        };
        let dev = UringBdev::open("durable", &path, &opts).unwrap();
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let ch = channel_of(&dev);
                let mut b = ch.alloc(8192).unwrap();
                b.as_mut_slice().fill(7);
                ch.write_durable(4096, b).await.unwrap();
                assert_eq!(ch.flushes(), flushes, "direct={direct}");
                let back = ch.read(0, ch.alloc(16384).unwrap()).await.unwrap();
                let mut want = vec![0u8; 16384];
                want[4096..12288].fill(7);
                assert!(
                    back.as_slice() == &want[..],
                    "direct={direct}: read back differs"
                );
            })
            .unwrap()
            .join()
            .unwrap();
    }
}

/// With `direct_from`, big writes bypass the page cache (their pages
/// are not cached afterwards) and small ones do not; writes of either
/// kind over the other's blocks read back as the newest, through the
/// channel and through another descriptor.
#[test]
fn big_writes_go_direct_and_stay_coherent_with_small_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev");
    let opts = UringOptions {
        size: Some(4 << 20),
        direct: false,
        direct_from: Some(64 << 10),
        ..UringOptions::default()
    };
    let dev = UringBdev::open("hybrid", &path, &opts).unwrap();
    let p = path.clone();
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let ch = dev.channel().unwrap();
            let write = |offset: u64, len: usize, byte: u8| {
                let mut b = ch.alloc(len).unwrap();
                b.as_mut_slice().fill(byte);
                ch.write(offset, b)
            };
            write(0, 8192, 1).await.unwrap(); // buffered
            write(1 << 20, 256 << 10, 2).await.unwrap(); // direct
            let cached = resident(&p, 512);
            assert!(cached[0] && cached[1], "small write not in the page cache");
            assert!(
                !cached[256..320].iter().any(|&c| c),
                "big write went through the cache"
            );
            write(1 << 20, 4096, 3).await.unwrap(); // buffered over direct
            write(0, 128 << 10, 4).await.unwrap(); // direct over dirty cached pages
            write(4096, 4096, 5).await.unwrap(); // buffered again
            ch.flush().await.unwrap();
            let mut want = vec![0u8; 2 << 20];
            want[..128 << 10].fill(4);
            want[4096..8192].fill(5);
            want[1 << 20..(1 << 20) + (256 << 10)].fill(2);
            want[1 << 20..(1 << 20) + 4096].fill(3);
            let back = ch.read(0, ch.alloc(2 << 20).unwrap()).await.unwrap();
            assert!(back.as_slice() == &want[..], "channel read differs");
            let file = std::fs::read(&p).unwrap();
            assert!(file[..2 << 20] == want[..], "file read differs");
        })
        .unwrap()
        .join()
        .unwrap();
    let bad = UringOptions {
        direct_from: Some(1000),
        ..opts
    };
    assert!(UringBdev::open("bad", &path, &bad).is_err());
}

/// A vectored write of memory owned elsewhere ([`IoBuf::foreign`]) and
/// of a buffer: with `direct_from` a big one bypasses the page cache as
/// a single big write does; on a direct file `writev_durable` carries
/// its flush (no separate one). Both read back.
#[test]
fn big_vectored_writes_of_foreign_memory_go_direct() {
    for (direct, flushes) in [(false, 1), (true, 0)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let opts = UringOptions {
            size: Some(4 << 20),
            direct,
            direct_from: (!direct).then_some(64 << 10),
            ..UringOptions::default()
        };
        let dev = UringBdev::open("vectored", &path, &opts).unwrap();
        let p = path.clone();
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let ch = channel_of(&dev);
                let mut owner = crate::IoBuf::new(128 << 10);
                owner.as_mut_slice().fill(6);
                let ptr = std::ptr::NonNull::new(owner.as_mut_ptr()).unwrap();
                let keep: std::sync::Arc<dyn std::any::Any + Send + Sync> =
                    std::sync::Arc::new(owner);
                // SAFETY: `keep` owns the 128 KiB at `ptr`; nothing
                // writes them while the write runs.
                let foreign = unsafe { crate::IoBuf::foreign(ptr, 128 << 10, keep) };
                assert!(foreign.is_foreign() && !foreign.is_pooled());
                let mut tail = ch.alloc(4096).unwrap();
                tail.as_mut_slice().fill(7);
                ch.writev_durable(1 << 20, vec![foreign, tail])
                    .await
                    .unwrap();
                assert_eq!(ch.flushes(), flushes, "direct={direct}");
                if !direct {
                    let cached = resident(&p, 1024);
                    let range = (1 << 20) / 4096..((1 << 20) + (128 << 10)) / 4096;
                    assert!(!cached[range].iter().any(|&c| c), "went through the cache");
                }
                let mut want = vec![6u8; (128 << 10) + 4096];
                want[128 << 10..].fill(7);
                let back = ch
                    .read(1 << 20, ch.alloc(want.len()).unwrap())
                    .await
                    .unwrap();
                assert!(
                    back.as_slice() == &want[..],
                    "direct={direct}: read back differs"
                );
            })
            .unwrap()
            .join()
            .unwrap();
    }
}

/// With `direct=0` a small write is done when first polled (copied
/// into the page cache on the caller's thread, no trip through io-wq);
/// a big one goes through the ring; both read back, and flush works.
#[test]
fn small_buffered_writes_complete_inline() {
    let dir = tempfile::tempdir().unwrap();
    let opts = UringOptions {
        size: Some(4 << 20),
        direct: false,
        ..UringOptions::default()
    };
    let dev = UringBdev::open("buffered", &dir.path().join("dev"), &opts).unwrap();
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let ch = dev.channel().unwrap();
            let mut small = ch.alloc(8192).unwrap();
            small.as_mut_slice().fill(3);
            let done = ch.write(4096, small).now_or_never();
            assert!(matches!(done, Some(Ok(_))), "not done at once: {done:?}");
            let mut big = ch.alloc(super::INLINE_WRITE_MAX * 2).unwrap();
            big.as_mut_slice().fill(5);
            ch.write(1 << 20, big).await.unwrap();
            ch.flush().await.unwrap();
            let back = ch.read(4096, ch.alloc(8192).unwrap()).await.unwrap();
            assert!(back.as_slice().iter().all(|&b| b == 3));
            let len = super::INLINE_WRITE_MAX * 2;
            let back = ch.read(1 << 20, ch.alloc(len).unwrap()).await.unwrap();
            assert!(back.as_slice().iter().all(|&b| b == 5));
        })
        .unwrap()
        .join()
        .unwrap();
}

/// `fill_holes` writes zeros into the holes of a sparse file only: the
/// data already there stays, the whole range ends up allocated, and a
/// second call finds nothing to fill.
#[test]
fn fill_holes_allocates_the_holes_and_keeps_the_data() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev");
    let opts = UringOptions {
        size: Some(4 << 20),
        ..UringOptions::default()
    };
    let dev = UringBdev::open("sparse", &path, &opts).unwrap();
    let p = path.clone();
    let allocated = move || std::fs::metadata(&p).unwrap().blocks() * 512;
    assert!(allocated() < 64 << 10, "a new device file is sparse");
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let ch = dev.channel().unwrap();
            let mut data = ch.alloc(8192).unwrap();
            data.as_mut_slice().fill(7);
            ch.write(1 << 20, data).await.unwrap();
            assert!(ch.fill_holes(100, 4096).await.is_err(), "misaligned");
            let filled = ch.fill_holes(0, 4 << 20).await.unwrap();
            assert_eq!(filled, (4 << 20) - 8192);
            ch.flush().await.unwrap();
            assert!(allocated() >= 4 << 20, "{} bytes allocated", allocated());
            assert_eq!(ch.fill_holes(0, 4 << 20).await.unwrap(), 0);
            let back = ch.read(0, ch.alloc(4 << 20).unwrap()).await.unwrap();
            let b = back.as_slice();
            assert!(b[1 << 20..(1 << 20) + 8192].iter().all(|&x| x == 7));
            assert!(b[..1 << 20].iter().all(|&x| x == 0));
            assert!(b[(1 << 20) + 8192..].iter().all(|&x| x == 0));
        })
        .unwrap()
        .join()
        .unwrap();
}

/// An operation completes while an earlier one of the same channel is
/// in flight and not polled (its task awaits something else, as the
/// cleaner awaits a commit with its reads in flight). When the future
/// that first found the ring idle was also the one that looked at it,
/// the write waited for a completion nobody reaped: bounded by a timer.
#[test]
fn an_operation_completes_while_an_earlier_one_is_not_polled() {
    let dir = tempfile::tempdir().unwrap();
    let opts = UringOptions {
        size: Some(4 << 20),
        ..UringOptions::default()
    };
    let dev = UringBdev::open("unpolled", &dir.path().join("dev"), &opts).unwrap();
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let ch = dev.channel().unwrap();
            let mut read = ch.read(0, ch.alloc(4096).unwrap());
            assert!(futures::poll!(&mut read).is_pending());
            for round in 0..20u8 {
                let mut data = ch.alloc(4096).unwrap();
                data.as_mut_slice().fill(round);
                let write = ch.write(4096, data);
                let timer = glommio::timer::sleep(std::time::Duration::from_secs(5));
                let timer = std::pin::pin!(timer);
                let done = futures::future::select(write, timer).await;
                assert!(
                    matches!(done, futures::future::Either::Left((Ok(_), _))),
                    "write {round} stalled behind a read nobody polls"
                );
            }
            assert!(read.await.is_ok());
        })
        .unwrap()
        .join()
        .unwrap();
}
