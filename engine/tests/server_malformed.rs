//! Guards that bad input costs only the connection that sent it: malformed,
//! oversized, out-of-order and unauthenticated frames (and a stream of
//! random ones) get one error frame with request id 0 and a close, while
//! another connection keeps being served; and that token login works and
//! refuses wrong proofs.

mod server_support;

use std::io::Write;

use ferrite_proto::rpc::handshake::{engine_proof, HELLO_WANT_SHM};
use ferrite_proto::rpc::{
    self, Challenge, ErrorCode, FrameHeader, Hello, MessageType, Reply, Request, HEADER_BYTES,
};
use rand::{Rng, SeedableRng};
use server_support::*;

fn logged_in(engine: &EngineProcess) -> RawClient {
    RawClient::connect_tcp(engine.tcp, Some(&engine.token)).unwrap()
}

#[test]
fn bad_frames_close_only_their_connection() {
    let dir = temp_dir();
    let engine = EngineProcess::start(dir.path(), &[]);
    let mut good = logged_in(&engine);
    healthy(&mut good, 0);

    // Garbage instead of a Hello.
    let mut c = RawClient::tcp(engine.tcp).unwrap();
    c.stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(closing_error(&mut c), ErrorCode::Malformed);
    healthy(&mut good, 1);

    // A data request before the handshake.
    let mut c = RawClient::tcp(engine.tcp).unwrap();
    c.send(&Request::Fetch {
        key: key(1, "d", "a"),
    })
    .unwrap();
    assert_eq!(closing_error(&mut c), ErrorCode::Unauthenticated);

    // A connection that never logs in is dropped after the handshake timeout.
    let mut c = RawClient::tcp(engine.tcp).unwrap();
    assert_eq!(closing_error(&mut c), ErrorCode::Unauthenticated);

    // After login: bad magic.
    let mut c = logged_in(&engine);
    let mut frame = Vec::new();
    rpc::encode_request(9, &Request::Stat, &mut frame);
    frame[0] ^= 0xff;
    c.stream.write_all(&frame).unwrap();
    assert_eq!(closing_error(&mut c), ErrorCode::Malformed);

    // After login: a header announcing a body over the limit.
    let mut c = logged_in(&engine);
    let mut head = FrameHeader::request(MessageType::Update, 3, 0).encode();
    head[16..20].copy_from_slice(&(64u32 << 20).to_le_bytes());
    c.stream.write_all(&head).unwrap();
    assert_eq!(closing_error(&mut c), ErrorCode::Oversized);

    // After login: a body that does not decode as its type.
    let mut c = logged_in(&engine);
    let head = FrameHeader::request(MessageType::Update, 4, 5).encode();
    c.stream.write_all(&head).unwrap();
    c.stream.write_all(&[1, 2, 3, 4, 5]).unwrap();
    assert_eq!(closing_error(&mut c), ErrorCode::Malformed);

    // After login: a frame flagged as a reply, then a repeated Hello.
    let mut c = logged_in(&engine);
    let mut frame = Vec::new();
    rpc::encode_reply(MessageType::Stat, 5, &Reply::Stat(vec![]), &mut frame);
    c.stream.write_all(&frame).unwrap();
    assert_eq!(closing_error(&mut c), ErrorCode::Malformed);
    let mut c = logged_in(&engine);
    c.send(&Request::Hello(Hello {
        flags: 0,
        client_nonce: [0; 16],
    }))
    .unwrap();
    assert_eq!(closing_error(&mut c), ErrorCode::Malformed);

    // A request in flight on a connection that then breaks the protocol
    // still leaves the engine serving everyone else.
    healthy(&mut good, 2);
    drop(engine);
}

#[test]
fn random_frames_never_take_the_engine_down() {
    let seed = test_seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = temp_dir();
    let engine = EngineProcess::start(dir.path(), &[]);
    let mut good = logged_in(&engine);
    for round in 0..150u64 {
        let mut c = if rng.gen_bool(0.5) {
            logged_in(&engine)
        } else {
            RawClient::tcp(engine.tcp).unwrap()
        };
        let mut bytes = Vec::new();
        match rng.gen_range(0..3) {
            // Entirely random bytes.
            0 => bytes.extend((0..rng.gen_range(HEADER_BYTES..400)).map(|_| rng.gen::<u8>())),
            // A valid header of a random type with a random body.
            1 => {
                let kind = MessageType::ALL[rng.gen_range(0..MessageType::ALL.len())];
                let len = rng.gen_range(0..300);
                bytes.extend(FrameHeader::request(kind, round, len).encode());
                bytes.extend((0..len).map(|_| rng.gen::<u8>()));
            }
            // A valid request with one byte changed.
            _ => {
                let req = Request::Update {
                    key: key(2, "f", "z"),
                    value: vec![7; rng.gen_range(0..64)],
                };
                rpc::encode_request(round, &req, &mut bytes);
                let at = rng.gen_range(0..bytes.len());
                bytes[at] = rng.gen();
            }
        }
        let _ = c.stream.write_all(&bytes);
        // Whatever the engine answers, it must answer or close, not hang.
        if let Stream::Tcp(s) = &c.stream {
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
        let _ = c.drain_until_closed();
        if round % 25 == 0 {
            healthy(&mut good, round);
        }
    }
    healthy(&mut good, 1000);
    assert_eq!(
        engine.terminate(),
        Some(0),
        "engine survived and shut down cleanly"
    );
}

/// A fresh TCP connection after its Hello, with the engine's challenge.
fn hello(engine: &EngineProcess, client_nonce: [u8; 16]) -> (RawClient, Challenge) {
    let mut c = RawClient::tcp(engine.tcp).unwrap();
    let hello = Request::Hello(Hello {
        flags: 0,
        client_nonce,
    });
    match c.call(&hello).unwrap() {
        Reply::Challenge(ch) => (c, ch),
        other => panic!("expected a challenge, got {other:?}"),
    }
}

#[test]
fn token_login_is_checked_and_needs_no_secret_on_the_wire() {
    let dir = temp_dir();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "correct horse\n").unwrap();
    let owner_only = std::os::unix::fs::PermissionsExt::from_mode(0o600);
    std::fs::set_permissions(&token_file, owner_only).unwrap();
    let engine = EngineProcess::start(dir.path(), &["--token-file", token_file.to_str().unwrap()]);

    // Right token: the engine proves it holds the token too.
    let nonce = [3u8; 16];
    let (mut c, ch) = hello(&engine, nonce);
    assert_eq!(ch.auth, 1, "TCP needs the token");
    let proof =
        ferrite_proto::rpc::handshake::login_proof(b"correct horse", &ch.server_nonce, &nonce);
    let Reply::Welcome(w) = c
        .call(&Request::Login(ferrite_proto::rpc::Login { proof }))
        .unwrap()
    else {
        panic!("welcome")
    };
    assert_eq!(
        w.server_proof,
        engine_proof(b"correct horse", &ch.server_nonce, &nonce)
    );
    healthy(&mut c, 0);

    // Wrong token, and no proof at all: refused.
    for token in [Some(&b"wrong"[..]), None] {
        let mut bad = RawClient::tcp(engine.tcp).unwrap();
        assert!(bad.login(0, token).is_err());
    }
    let (mut bad, _) = hello(&engine, nonce);
    bad.send(&Request::Login(ferrite_proto::rpc::Login {
        proof: [0; 32],
    }))
    .unwrap();
    assert_eq!(closing_error(&mut bad), ErrorCode::Unauthenticated);

    // The Unix socket is guarded by the peer's uid, not the token.
    let mut u = RawClient::connect_unix(&engine.unix, HELLO_WANT_SHM != 0).unwrap();
    healthy(&mut u, 1);
    healthy(&mut c, 2);
}
