//! Guards the `Channel` contract on every backend: the same suite runs on
//! malloc, uring (O_DIRECT and buffered, on a temp file of the real disk),
//! pmem (temp file, and tmpfs), and the error/delay/crash wrappers in
//! pass-through mode. Read-after-write, vectored I/O, flush, unmap and
//! write_zeroes reading zero, bounds and alignment errors, back-pressure past
//! the queue depth (all on an xstream), and channels on several bare glommio
//! executors at once (where a uring poller waits in the kernel instead).

mod common;

use common::run;
use ferrite_bdev::wrap::{CrashBdev, DelayBdev, Delays, ErrorBdev};
use ferrite_bdev::{open, BdevError, BdevRef, Channel, IoBuf, IoType};
use futures::future::join_all;
use std::sync::Arc;
use std::time::Duration;

const DEV_SIZE: u64 = 4 << 20;

fn pattern(ch: &dyn Channel, len: usize, seed: u8) -> IoBuf {
    let mut b = ch.alloc(len).unwrap();
    for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
        *x = seed.wrapping_add((i % 251) as u8);
    }
    b
}

fn is_pattern(buf: &IoBuf, seed: u8) -> bool {
    buf.as_slice()
        .iter()
        .enumerate()
        .all(|(i, &x)| x == seed.wrapping_add((i % 251) as u8))
}

async fn read_after_write(dev: &BdevRef) {
    let ch = dev.channel().unwrap();
    let bs = ch.block_size() as usize;
    let last = dev.size_bytes() - bs as u64;
    for (i, off) in [0, bs as u64 * 3, last].into_iter().enumerate() {
        let buf = ch.write(off, pattern(&*ch, bs, i as u8)).await.unwrap();
        assert!(
            is_pattern(&buf, i as u8),
            "write must hand the buffer back intact"
        );
        let back = ch.read(off, ch.alloc(bs).unwrap()).await.unwrap();
        assert!(is_pattern(&back, i as u8), "read-after-write at {off}");
    }
    // Vectored: three buffers written at once, read back as one and as three.
    let bufs = vec![
        pattern(&*ch, bs, 10),
        pattern(&*ch, 2 * bs, 20),
        pattern(&*ch, bs, 30),
    ];
    let off = 16 * bs as u64;
    ch.writev(off, bufs).await.unwrap();
    let whole = ch.read(off, ch.alloc(4 * bs).unwrap()).await.unwrap();
    assert_eq!(
        &whole.as_slice()[bs..2 * bs],
        pattern(&*ch, bs, 20).as_slice()
    );
    let parts = vec![
        ch.alloc(bs).unwrap(),
        ch.alloc(2 * bs).unwrap(),
        ch.alloc(bs).unwrap(),
    ];
    let parts = ch.readv(off, parts).await.unwrap();
    assert!(is_pattern(&parts[0], 10) && is_pattern(&parts[1], 20) && is_pattern(&parts[2], 30));
}

async fn flush_and_other_channel(dev: &BdevRef) {
    let a = dev.channel().unwrap();
    let b = dev.channel().unwrap();
    let bs = a.block_size() as usize;
    a.write(5 * bs as u64, pattern(&*a, bs, 77)).await.unwrap();
    a.flush().await.unwrap();
    let back = b.read(5 * bs as u64, b.alloc(bs).unwrap()).await.unwrap();
    assert!(
        is_pattern(&back, 77),
        "a completed write is visible on another channel"
    );
    assert_eq!(a.in_flight(), 0);
}

async fn zeroing(dev: &BdevRef) {
    let ch = dev.channel().unwrap();
    let bs = ch.block_size() as usize;
    let off = 32 * bs as u64;
    ch.write(off, pattern(&*ch, 4 * bs, 1)).await.unwrap();
    ch.write_zeroes(off, bs as u64).await.unwrap();
    if dev.io_type_supported(IoType::Unmap) {
        ch.unmap(off + 2 * bs as u64, 2 * bs as u64).await.unwrap();
    }
    let back = ch.read(off, ch.alloc(4 * bs).unwrap()).await.unwrap();
    assert!(
        back.as_slice()[..bs].iter().all(|&x| x == 0),
        "write_zeroes reads zero"
    );
    assert!(
        back.as_slice()[bs..2 * bs].iter().any(|&x| x != 0),
        "next block untouched"
    );
    if dev.io_type_supported(IoType::Unmap) {
        assert!(
            back.as_slice()[2 * bs..].iter().all(|&x| x == 0),
            "unmap reads zero"
        );
    }
}

async fn bounds_and_alignment(dev: &BdevRef) {
    let ch = dev.channel().unwrap();
    let bs = ch.block_size() as u64;
    let size = dev.size_bytes();
    let e = ch
        .read(size, ch.alloc(bs as usize).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(e, BdevError::OutOfRange { .. }), "{e}");
    let e = ch
        .write(size - bs, ch.alloc(2 * bs as usize).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(e, BdevError::OutOfRange { .. }), "{e}");
    let e = ch
        .read(u64::MAX - bs + 1, ch.alloc(bs as usize).unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            BdevError::Misaligned { .. } | BdevError::OutOfRange { .. }
        ),
        "{e}"
    );
    let e = ch
        .write(1, ch.alloc(bs as usize).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(e, BdevError::Misaligned { .. }), "{e}");
    let mut short = ch.alloc(bs as usize).unwrap();
    short.set_len(100);
    let e = ch.write(0, short).await.unwrap_err();
    assert!(matches!(e, BdevError::Misaligned { .. }), "{e}");
    assert!(ch.alloc(100).is_err());
    assert!(ch.unmap(size, bs).await.is_err());
    assert!(ch.write_zeroes(3, bs).await.is_err());
}

async fn past_queue_depth(dev: &BdevRef) {
    let ch = dev.channel().unwrap();
    let bs = ch.block_size() as usize;
    let n = (ch.queue_depth() + 5).min(dev.block_count() as usize);
    let writes = (0..n).map(|i| ch.write((i * bs) as u64, pattern(&*ch, bs, i as u8)));
    for r in join_all(writes).await {
        r.unwrap();
    }
    assert_eq!(ch.in_flight(), 0);
    let reads = (0..n).map(|i| ch.read((i * bs) as u64, ch.alloc(bs).unwrap()));
    for (i, r) in join_all(reads).await.into_iter().enumerate() {
        assert!(is_pattern(&r.unwrap(), i as u8), "block {i}");
    }
}

/// Two executors (threads) write their own halves through their own
/// channels, then each reads the other's half.
fn several_executors(dev: BdevRef) {
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let threads: Vec<_> = (0..2u8)
        .map(|me| {
            let (dev, barrier) = (dev.clone(), barrier.clone());
            std::thread::spawn(move || {
                run(move || async move {
                    let ch = dev.channel().unwrap();
                    let bs = ch.block_size() as usize;
                    let half = dev.size_bytes() / 2;
                    let base = |who: u8| u64::from(who) * half;
                    let writes = (0..16).map(|i| {
                        ch.write(
                            base(me) + (i * bs) as u64,
                            pattern(&*ch, bs, me * 16 + i as u8),
                        )
                    });
                    join_all(writes).await.into_iter().for_each(|r| {
                        r.unwrap();
                    });
                    barrier.wait();
                    let other = 1 - me;
                    for i in 0..16usize {
                        let b = ch.read(base(other) + (i * bs) as u64, ch.alloc(bs).unwrap());
                        assert!(is_pattern(&b.await.unwrap(), other * 16 + i as u8));
                    }
                })
            })
        })
        .collect();
    for t in threads {
        t.join().expect("executor thread panicked");
    }
}

fn suite(make: fn(&std::path::Path) -> BdevRef) {
    let dir = tempfile::tempdir().unwrap();
    let dev = make(dir.path());
    assert_eq!(dev.size_bytes(), DEV_SIZE);
    let d = dev.clone();
    run(move || async move {
        read_after_write(&d).await;
        flush_and_other_channel(&d).await;
        zeroing(&d).await;
        bounds_and_alignment(&d).await;
        past_queue_depth(&d).await;
    });
    several_executors(dev);
}

fn uring(dir: &std::path::Path, opts: &str) -> BdevRef {
    open(&format!(
        "uring:{}?size=4M{opts}",
        dir.join("dev").display()
    ))
    .unwrap()
}

#[test]
fn malloc() {
    suite(|_| open("malloc:4M").unwrap());
}

#[test]
fn uring_direct() {
    suite(|d| uring(d, "&qd=8"));
}

#[test]
fn uring_buffered_sqpoll_no_fixed() {
    suite(|d| uring(d, "&direct=0&sqpoll=1&fixed=0&qd=16&park_us=0"));
}

/// SQPOLL rings have no `DEFER_TASKRUN`: their pollers sleep on the
/// eventfd with completions posted by the kernel thread.
#[test]
fn uring_sqpoll_sleeping_poller() {
    suite(|d| uring(d, "&sqpoll=1&qd=16"));
}

#[test]
fn pmem_file() {
    suite(|d| open(&format!("pmem:{}?size=4M", d.join("pmem").display())).unwrap());
}

/// tmpfs, where the pmem figures are taken (skipped where absent).
#[test]
fn pmem_tmpfs_and_uring_refuses_direct_there() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let spec = format!("pmem:{}?size=4M", dir.path().join("pmem").display());
    let dev = open(&spec).unwrap();
    run(move || async move {
        read_after_write(&dev).await;
        flush_and_other_channel(&dev).await;
    });
    let spec = format!("uring:{}?size=4M", dir.path().join("u").display());
    // A tmpfs that accepts O_DIRECT (newer kernels) may open; else a clear error.
    if let Err(e) = open(&spec) {
        assert!(e.to_string().contains("O_DIRECT"), "{e}");
    }
}

/// On a DAX file system (`FERRITE_DAX_DIR`, set by hack/dax in its qemu
/// guest) the file is mapped with `MAP_SYNC` and the suite passes there;
/// tmpfs (where present) is never DAX and persists with msync.
#[test]
fn pmem_maps_sync_exactly_on_dax() {
    use ferrite_bdev::pmem::PersistMode;
    fn on_dax(_: &std::path::Path) -> BdevRef {
        let dir = std::env::var("FERRITE_DAX_DIR").unwrap();
        open(&format!("pmem:{dir}/conformance?size=4M")).unwrap()
    }
    if std::env::var_os("FERRITE_DAX_DIR").is_some() {
        let dev = on_dax(std::path::Path::new(""));
        let mode = dev.as_pmem().unwrap().persist_mode();
        assert_eq!(mode, PersistMode::CacheFlush, "no MAP_SYNC on DAX");
        drop(dev);
        suite(on_dax);
    }
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        let dir = tempfile::tempdir_in(shm).unwrap();
        let dev = open(&format!("pmem:{}?size=4M", dir.path().join("p").display())).unwrap();
        assert_eq!(dev.as_pmem().unwrap().persist_mode(), PersistMode::Msync);
    }
}

#[test]
fn error_bdev_without_rules() {
    suite(|_| Arc::new(ErrorBdev::new(open("malloc:4M").unwrap(), 1)));
}

#[test]
fn delay_bdev() {
    suite(|_| {
        let d = Delays::all(Duration::from_micros(20));
        Arc::new(DelayBdev::new(open("malloc:4M").unwrap(), d))
    });
}

#[test]
fn crash_bdev_on_uring() {
    suite(|d| Arc::new(CrashBdev::new(uring(d, ""))));
}

/// Stress for the ring's hand-over of polling: rounds of concurrent writes
/// that all finish together with nothing new submitted, then read back. A
/// stall of that kind once hung `bdevperf` at the end of its runs (fixed in
/// `ring.rs::release`); this test did not reproduce it deterministically, so
/// it guards the data and a bound of 120 s, not that exact interleaving.
#[test]
fn uring_rounds_of_concurrent_writes_never_stall() {
    let dir = tempfile::tempdir().unwrap();
    let dev = uring(dir.path(), "&qd=64");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        run(move || async move {
            let ch = dev.channel().unwrap();
            let len = 256 << 10;
            for round in 0..40u8 {
                let writes =
                    (0..16u64).map(|i| ch.write(i * len as u64, pattern(&*ch, len, round)));
                for r in join_all(writes).await {
                    r.unwrap();
                }
                let reads = (0..16u64).map(|i| ch.read(i * len as u64, ch.alloc(len).unwrap()));
                for r in join_all(reads).await {
                    assert!(is_pattern(&r.unwrap(), round));
                }
            }
        });
        let _ = tx.send(());
    });
    let done = rx.recv_timeout(Duration::from_secs(120));
    assert!(
        done.is_ok(),
        "uring operations stalled (or the executor panicked)"
    );
}

/// A pmem device without MAP_SYNC persists with `msync`, which waits for
/// the kernel to write the pages back: the flush runs off the xstream, so
/// a task waiting for its next turn gets it while the flush is in flight (a
/// flush that ran on the xstream would complete before that task is polled
/// again).
#[test]
fn pmem_msync_flush_leaves_the_xstream_running() {
    // tmpfs is never DAX (the temp dir is, in hack/dax's guest).
    let shm = std::path::Path::new("/dev/shm");
    let dir = match shm.is_dir() {
        true => tempfile::tempdir_in(shm).unwrap(),
        false => tempfile::tempdir().unwrap(),
    };
    let dev = open(&format!("pmem:{}?size=4M", dir.path().join("p").display())).unwrap();
    if dev.as_pmem().unwrap().persist_mode() != ferrite_bdev::pmem::PersistMode::Msync {
        // A guest with no /dev/shm whose temp dir is DAX: flushes are
        // cache-line flushes there, with nothing to wait for.
        eprintln!("pmem maps with MAP_SYNC here: no msync to move off the xstream");
        return;
    }
    run(move || async move {
        let ch = dev.channel().unwrap();
        ch.write(0, pattern(&*ch, 1 << 20, 7)).await.unwrap();
        let ran = std::rc::Rc::new(std::cell::Cell::new(false));
        let flag = ran.clone();
        // Spawned tasks run at once up to their first yield.
        glommio::spawn_local(async move {
            glommio::executor().yield_task_queue_now().await;
            flag.set(true)
        })
        .detach();
        ch.flush().await.unwrap();
        assert!(ran.get(), "the flush held the xstream until it was done");
        let back = ch.read(0, ch.alloc(1 << 20).unwrap()).await.unwrap();
        assert!(is_pattern(&back, 7));
    });
}
