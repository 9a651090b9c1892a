//! Guards `Bdev::read_only_file`: file-backed devices (uring on a file,
//! buffered and O_DIRECT, and pmem) hand out a read-only descriptor of their
//! file in which a completed write is visible at its device offset, through
//! a read and through a shared mapping; devices that are not a plain file
//! (malloc, wrappers) have none.

mod common;

use std::io::Write;
use std::os::fd::AsRawFd;

use common::run;
use ferrite_bdev::wrap::DelayBdev;
use ferrite_bdev::{open, Bdev, BdevRef};

const DEV_SIZE: u64 = 1 << 20;

/// Writes a block at 64 KiB through a channel, then checks the device's
/// read-only file.
fn written_block_is_in_the_file(spec: String) {
    run(move || async move {
        let dev: BdevRef = open(&spec).unwrap();
        let ch = dev.channel().unwrap();
        let mut buf = ch.alloc(4096).unwrap();
        buf.as_mut_slice().fill(0x5a);
        ch.write(64 << 10, buf).await.unwrap();
        let file = dev.read_only_file().expect("a file-backed device").unwrap();
        assert_eq!(file.metadata().unwrap().len(), DEV_SIZE);
        let mut back = vec![0u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, 64 << 10).unwrap();
        assert!(back.iter().all(|&b| b == 0x5a), "{spec}: read of the file");
        // SAFETY: a read-only shared mapping of 1 MiB of a 1 MiB file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                DEV_SIZE as usize,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: in bounds of the mapping.
        let mapped = unsafe { std::slice::from_raw_parts(p.cast::<u8>().add(64 << 10), 4096) };
        assert!(mapped.iter().all(|&b| b == 0x5a), "{spec}: mapping");
        // SAFETY: unmapping what was mapped above.
        unsafe { libc::munmap(p, DEV_SIZE as usize) };
        let mut w = &file;
        assert!(w.write_all(b"x").is_err(), "{spec}: the file is read-only");
    });
}

#[test]
fn uring_buffered_file_is_shared_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev");
    written_block_is_in_the_file(format!("uring:{}?size=1M&direct=0", path.display()));
}

#[test]
fn uring_direct_file_is_shared_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev");
    written_block_is_in_the_file(format!("uring:{}?size=1M&direct=1", path.display()));
}

#[test]
fn pmem_file_is_shared_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev");
    written_block_is_in_the_file(format!("pmem:{}?size=1M", path.display()));
}

#[test]
fn malloc_and_wrappers_have_no_file() {
    let dev = open("malloc:1M").unwrap();
    assert!(dev.read_only_file().is_none());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev");
    let file_dev = open(&format!("uring:{}?size=1M&direct=0", path.display())).unwrap();
    let delayed = DelayBdev::new(file_dev, Default::default());
    assert!(
        delayed.read_only_file().is_none(),
        "wrappers do not forward"
    );
}
