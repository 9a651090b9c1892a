//! Guards the engine as a library (what the client's embedded mode uses):
//! `Engine::start` on a temp dir serves TCP and the Unix socket in-process,
//! `shutdown` checkpoints and removes the socket, and a second start on the
//! same directory recovers every acknowledged write; a bad config is refused
//! before anything is created.

mod server_support;

use ferrite_engine::config::EngineConfig;
use ferrite_engine::Engine;
use ferrite_proto::rpc::{ErrorCode, Reply, Request};
use server_support::*;

#[test]
fn embedded_engine_serves_and_recovers_after_shutdown() {
    let dir = temp_dir();
    let engine = Engine::start(EngineConfig::for_temp_dir(dir.path())).unwrap();
    assert_eq!(engine.target_count(), 1);
    let tcp = engine.tcp_addr().expect("tcp listener");
    assert!(tcp.ip().is_loopback());
    let unix = engine.unix_path().expect("unix listener").to_path_buf();
    assert_eq!(engine.urls().len(), 2);
    let regions = engine.regions();
    let kinds: Vec<_> = regions.iter().map(|r| (r.provider, r.kind)).collect();
    use ferrite_proto::region::{Provider::*, RegionKind::*};
    assert_eq!(
        kinds,
        [
            (Shm, Buckets),
            (Shm, Log),
            (Shm, DeviceLog),
            (Tcp, Buckets),
            (Tcp, Log)
        ],
        "buckets and log over shm and tcp, and the file device's log over shm"
    );

    let mut c = RawClient::connect_tcp(tcp, Some(engine.token())).unwrap();
    let mut versions = Vec::new();
    for i in 0..100 {
        let r = c
            .call(&Request::Update {
                key: key(1, &format!("k{i}"), "a"),
                value: vec![i as u8; i + 1],
            })
            .unwrap();
        let Reply::Version(v) = r else {
            panic!("{r:?}")
        };
        versions.push(v);
    }
    let mut u = RawClient::connect_unix(&unix, true).unwrap();
    assert_eq!(
        u.fds.len(),
        3,
        "shm fds of the target's regions and device file"
    );
    let r = u
        .call(&Request::Fetch {
            key: key(1, "k7", "a"),
        })
        .unwrap();
    assert!(
        matches!(r, Reply::Value(Some(ref f)) if f.value == vec![7u8; 8]),
        "{r:?}"
    );
    drop((c, u));
    engine.shutdown().unwrap();
    assert!(!unix.exists(), "the socket file is removed at shutdown");

    let engine = Engine::start(EngineConfig::for_temp_dir(dir.path())).unwrap();
    let mut c = RawClient::connect_tcp(engine.tcp_addr().unwrap(), Some(engine.token())).unwrap();
    for (i, v) in versions.iter().enumerate() {
        let r = c
            .call(&Request::Fetch {
                key: key(1, &format!("k{i}"), "a"),
            })
            .unwrap();
        match r {
            Reply::Value(Some(f)) => {
                assert_eq!(f.version, *v);
                assert_eq!(f.value, vec![i as u8; i + 1]);
            }
            other => panic!("key {i} after restart: {other:?}"),
        }
    }
}

#[test]
fn connections_over_the_limit_are_refused_and_slots_come_back() {
    let dir = temp_dir();
    let mut config = EngineConfig::for_temp_dir(dir.path());
    config.limits.max_connections = 2;
    let engine = Engine::start(config).unwrap();
    let tcp = engine.tcp_addr().unwrap();
    let first = RawClient::connect_tcp(tcp, Some(engine.token())).unwrap();
    let mut second = RawClient::connect_tcp(tcp, Some(engine.token())).unwrap();
    let mut third = RawClient::tcp(tcp).unwrap();
    let frames = third.drain_until_closed();
    assert!(
        matches!(
            frames.last(),
            Some(Reply::Error {
                code: ErrorCode::NoSpace,
                ..
            })
        ),
        "{frames:?}"
    );
    assert!(matches!(
        second.call(&Request::Stat).unwrap(),
        Reply::Stat(_)
    ));
    // Once a client leaves, its slot is free again (the engine notices the
    // close asynchronously: try a bounded number of times).
    drop(first);
    let mut admitted = false;
    for _ in 0..200 {
        if RawClient::connect_tcp(tcp, Some(engine.token())).is_ok() {
            admitted = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(admitted, "a freed slot admits a new connection");
}

#[test]
fn bad_config_is_refused_before_anything_starts() {
    let dir = temp_dir();
    let mut config = EngineConfig::for_temp_dir(dir.path());
    config.fabric.providers = vec!["infiniband".into()];
    let err = Engine::start(config).unwrap_err();
    assert!(err.to_string().contains("infiniband"), "{err}");
    assert!(!dir.path().join("target-0.bdev").exists());
}

/// `size=auto` (the default bdev): a new target file is created sparse with
/// the size the free space gives it (at least 1 GiB), and kept at its size
/// when the engine starts again.
#[test]
fn auto_sized_bdev_files_are_sparse_and_keep_their_size() {
    use std::os::unix::fs::MetadataExt;
    let dir = temp_dir();
    let mut config = EngineConfig::for_temp_dir(dir.path());
    config.bdev = "uring:{dir}/target-{i}.bdev?size=auto".into();
    let file = dir.path().join("target-0.bdev");
    let engine = Engine::start(config.clone()).unwrap();
    let meta = std::fs::metadata(&file).unwrap();
    assert!(
        meta.len() >= ferrite_engine::capacity::AUTO_SIZE_FLOOR,
        "{}",
        meta.len()
    );
    assert!(
        meta.blocks() * 512 < meta.len() / 4,
        "not sparse: {} blocks",
        meta.blocks()
    );
    engine.shutdown().unwrap();
    // The file is there: it keeps its size, whatever the free space is now.
    let len = meta.len();
    let engine = Engine::start(config).unwrap();
    assert_eq!(std::fs::metadata(&file).unwrap().len(), len);
    engine.shutdown().unwrap();
}
