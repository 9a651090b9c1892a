//! Guards the limits a connection lives under. Before its login a peer may
//! announce no frame bigger than a handshake frame: a header announcing
//! 65 bytes, 8 MiB or 4 GiB, as a Hello or as the Login after one, on TCP
//! or the Unix socket, gets error 2 (oversized) at once, with no body sent
//! (an engine waiting for the body would close it at the login deadline
//! with error 3 instead), and many such peers at once leave the engine
//! serving others.

mod server_support;

use std::io::Write;

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
