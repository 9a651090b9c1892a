//! Guards the limits a connection lives under. Before its login a peer may
//! announce no frame bigger than a handshake frame: a header announcing
//! 65 bytes, 8 MiB or 4 GiB, as a Hello or as the Login after one, on TCP
//! or the Unix socket, gets error 2 (oversized) at once, with no body sent
//! (an engine waiting for the body would close it at the login deadline
//! with error 3 instead), and many such peers at once leave the engine
//! serving others. With `--idle-timeout-s`, a logged-in connection that
//! sends nothing is closed with error 9 while one that keeps sending is
//! served throughout.

mod server_support;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferrite_proto::rpc::{ErrorCode, FrameHeader, Hello, MessageType, Reply, Request};
use server_support::*;

/// A header of `kind` announcing `body_len` bytes, and no body.
fn announce(c: &mut RawClient, kind: MessageType, body_len: u32) {
    let mut head = FrameHeader::request(kind, 1, 0).encode();
    head[16..20].copy_from_slice(&body_len.to_le_bytes());
    c.stream.write_all(&head).unwrap();
}

/// A fresh connection past its Hello (the engine's Challenge read).
fn after_hello(mut c: RawClient) -> RawClient {
    let hello = Request::Hello(Hello {
        flags: 0,
        client_nonce: [9; 16],
    });
    assert!(matches!(c.call(&hello).unwrap(), Reply::Challenge(_)));
    c
}

#[test]
fn huge_frames_before_login_are_refused_at_the_header() {
    let dir = temp_dir();
    let engine = EngineProcess::start(dir.path(), &[]);
    let mut good = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    healthy(&mut good, 0);
    for (i, len) in [65u32, 8 << 20, u32::MAX].into_iter().enumerate() {
        let mut c = RawClient::tcp(engine.tcp).unwrap();
        announce(&mut c, MessageType::Hello, len);
        assert_eq!(
            closing_error(&mut c),
            ErrorCode::Oversized,
            "tcp Hello {len}"
        );
        let mut c = after_hello(RawClient::tcp(engine.tcp).unwrap());
        announce(&mut c, MessageType::Login, len);
        assert_eq!(
            closing_error(&mut c),
            ErrorCode::Oversized,
            "tcp Login {len}"
        );
        let mut c = RawClient::unix(&engine.unix).unwrap();
        announce(&mut c, MessageType::Hello, len);
        assert_eq!(
            closing_error(&mut c),
            ErrorCode::Oversized,
            "unix Hello {len}"
        );
        healthy(&mut good, 1 + i as u64);
    }
    // Many at once, each announcing 8 MiB.
    let mut peers: Vec<RawClient> = (0..64)
        .map(|_| RawClient::tcp(engine.tcp).unwrap())
        .collect();
    for c in &mut peers {
        announce(c, MessageType::Hello, 8 << 20);
    }
    for c in &mut peers {
        assert_eq!(closing_error(c), ErrorCode::Oversized);
    }
    healthy(&mut good, 100);
    let mut late = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    healthy(&mut late, 101);
    assert_eq!(engine.terminate(), Some(0), "engine shut down cleanly");
}

#[test]
fn idle_connections_are_closed_and_active_ones_are_not() {
    let dir = temp_dir();
    let engine = EngineProcess::start(dir.path(), &["--idle-timeout-s", "2"]);
    let mut idle = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    healthy(&mut idle, 0);
    let mut active = RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    // Keeps `active` busy (a round trip every 50 ms) until told to stop,
    // at most 1200 rounds.
    let worker = std::thread::spawn(move || {
        let mut rounds = 0u64;
        while !stopping.load(Ordering::SeqCst) && rounds < 1200 {
            healthy(&mut active, rounds);
            rounds += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        (active, rounds)
    });
    // The idle one is closed (within the clients' read timeout), with a
    // frame saying why.
    let frames = idle.drain_until_closed();
    stop.store(true, Ordering::SeqCst);
    let (mut active, rounds) = worker.join().unwrap();
    match frames.as_slice() {
        [Reply::Error { code, message }] => {
            assert_eq!(*code, ErrorCode::ShuttingDown);
            assert!(message.contains("idle"), "{message}");
        }
        other => panic!("expected one closing error frame, got {other:?}"),
    }
    assert!(rounds > 0);
    healthy(&mut active, 5000);
    assert_eq!(engine.terminate(), Some(0), "engine shut down cleanly");
}
