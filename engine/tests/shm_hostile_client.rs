//! Guards issue 48's "regions that clients cannot change": a client that
//! logs in over the Unix socket and receives the engine's region fds (the
//! memory regions and the file bdevs' device logs) can neither write them,
//! map them writable, nor truncate them, not even after reopening a memory
//! region's fd read-write through /proc/self/fd; and the engine keeps
//! serving afterwards, its regions intact (one-sided reads of a fresh
//! client still find every value).

mod server_support;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use ferrite_proto::region::{RegionDescriptor, RegionKind};
use ferrite_proto::rpc::{Reply, Request};
use server_support::*;

/// Each change a hostile client tries through `fd` on the region
/// `d` (`offset` is where the region starts in the file), with whether
/// it succeeded.
fn attempts(fd: RawFd, d: &RegionDescriptor, offset: u64) -> Vec<(&'static str, bool)> {
    let len = d.length as usize;
    let byte = [0xffu8];
    // SAFETY: one byte from a live buffer to a valid fd.
    let wrote = unsafe { libc::pwrite(fd, byte.as_ptr().cast(), 1, offset as i64) } == 1;
    // SAFETY: asks for a new writable shared mapping; unmapped at once if
    // the kernel made one.
    let mapped = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            offset as i64,
        );
        let ok = p != libc::MAP_FAILED;
        if ok {
            libc::munmap(p, len);
        }
        ok
    };
    // SAFETY: ftruncate on a valid fd.
    let truncated = unsafe { libc::ftruncate(fd, 0) } == 0;
    vec![
        ("write(2)", wrote),
        ("mmap(PROT_WRITE, MAP_SHARED)", mapped),
        ("ftruncate(0)", truncated),
    ]
}

/// `fd` opened anew read-write through /proc/self/fd, as a client may.
fn reopen_read_write(fd: &OwnedFd) -> Option<OwnedFd> {
    let path = std::ffi::CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    // SAFETY: valid C string; the result is checked.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    // SAFETY: a fresh descriptor we own.
    (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) })
}

fn fetch(c: &mut RawClient, k: &ferrite_proto::rpc::Key) -> Option<Vec<u8>> {
    match c.call(&Request::Fetch { key: k.clone() }).unwrap() {
        Reply::Value(v) => v.map(|f| f.value),
        other => panic!("fetch: {other:?}"),
    }
}

#[test]
fn a_client_cannot_write_map_writable_or_truncate_any_region_it_receives() {
    let dir = temp_dir();
    let engine = EngineProcess::start(dir.path(), &[]);
    let mut writer = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    let keys: Vec<_> = (0..40).map(|i| key(7, &format!("d{i}"), "a")).collect();
    for (i, k) in keys.iter().enumerate() {
        let value = vec![i as u8; 100 + i];
        let reply = writer.call(&Request::Update {
            key: k.clone(),
            value,
        });
        assert!(matches!(reply, Ok(Reply::Version(_))), "{reply:?}");
    }

    let hostile = RawClient::connect_unix(&engine.unix, true).unwrap();
    let regions = hostile.welcome.as_ref().unwrap().regions.clone();
    assert_eq!(hostile.fds.len(), regions.len(), "one fd per region");
    assert!(
        regions.iter().any(|d| d.kind == RegionKind::DeviceLog),
        "file bdevs export their device log: {regions:?}"
    );
    let mut tried = 0;
    for (fd, d) in hostile.fds.iter().zip(&regions) {
        let offset = match d.kind {
            RegionKind::DeviceLog => d.remote_addr,
            _ => 0,
        };
        for (what, ok) in attempts(fd.as_raw_fd(), d, offset) {
            assert!(!ok, "{what} succeeded on the received fd of {d:?}");
            tried += 1;
        }
        if d.kind == RegionKind::DeviceLog {
            // A device file's own permissions decide who may open it; the
            // test runs as the engine's user, who may.
            continue;
        }
        let rw = reopen_read_write(fd).expect("a memfd reopens");
        for (what, ok) in attempts(rw.as_raw_fd(), d, 0) {
            assert!(!ok, "{what} succeeded on a read-write reopen of {d:?}");
            tried += 1;
        }
    }
    assert!(tried >= 3 * regions.len());
    drop(hostile);

    // The engine serves on: writes land, and a new shm client reads every
    // value one-sided from regions of their full size.
    let extra = key(7, "after", "a");
    let reply = writer.call(&Request::Update {
        key: extra.clone(),
        value: b"still serving".to_vec(),
    });
    assert!(matches!(reply, Ok(Reply::Version(_))), "{reply:?}");
    let mut reader = RawClient::connect_unix(&engine.unix, true).unwrap();
    let welcome = reader.welcome.clone().unwrap();
    let maps: Vec<Mapping> = (reader.fds.iter().zip(&welcome.regions))
        .filter(|(_, d)| d.kind != RegionKind::DeviceLog)
        .map(|(fd, d)| Mapping::new(fd, d.length as usize).unwrap())
        .collect();
    let memory: Vec<RegionDescriptor> = (welcome.regions.iter())
        .filter(|d| d.kind != RegionKind::DeviceLog)
        .copied()
        .collect();
    let targets = welcome.targets.len() as u32;
    for (i, k) in keys.iter().enumerate() {
        let got = one_sided_get(&memory, targets, k, |d, off, len| {
            let at = memory
                .iter()
                .position(|m| m.region_id == d.region_id)
                .unwrap();
            maps[at].read(off as usize, len as usize)
        });
        assert_eq!(got.map(|(_, v)| v), Some(vec![i as u8; 100 + i]), "{k:?}");
        assert_eq!(fetch(&mut reader, k), Some(vec![i as u8; 100 + i]));
    }
    assert_eq!(fetch(&mut reader, &extra), Some(b"still serving".to_vec()));
}
