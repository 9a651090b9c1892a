//! The handshake bodies, fed the way each side reads them: Hello and Login
//! as the engine decodes a request, Challenge and Welcome as the client
//! decodes a reply. The first input byte picks the message, the rest is its
//! body. What decodes must encode to a body that decodes to the same
//! message; a Welcome holds 1 to TARGETS_MAX targets and at most
//! REGIONS_MAX valid region descriptors; a login proof made from the nonces
//! just decoded verifies under its token and under no other.

#![no_main]

use ferrite_proto::rpc::handshake::{
    self, login_proof, verify_login_proof, NONCE_BYTES, REGIONS_MAX, TARGETS_MAX,
};
use ferrite_proto::rpc::{MessageType, Reply, Request};
use libfuzzer_sys::fuzz_target;

fn request(kind: MessageType, body: &[u8]) {
    let Ok(req) = Request::decode_body(kind, body) else {
        return;
    };
    let mut again = Vec::new();
    req.encode_body(&mut again);
    // Hello and Login have fixed sizes and no ignored bytes: the encoding
    // is the input itself.
    assert_eq!(again, body, "{req:?} re-encodes to other bytes");
    if let Request::Hello(hello) = req {
        check_proofs(&hello.client_nonce, body);
    }
}

fn reply(kind: MessageType, body: &[u8]) {
    let Ok(reply) = Reply::decode_body(kind, body) else {
        return;
    };
    if let Reply::Welcome(w) = &reply {
        assert!((1..=TARGETS_MAX).contains(&w.targets.len()));
        assert!(w.regions.len() <= REGIONS_MAX);
        for r in &w.regions {
            r.validate().expect("a decoded descriptor is valid");
        }
    }
    let mut wire = Vec::new();
    reply.encode_body(&mut wire);
    assert!(wire.len() <= body.len(), "re-encoding grew the body");
    let again = Reply::decode_body(kind, &wire).expect("re-encoded reply decodes");
    assert_eq!(again, reply);
}

/// Both proofs depend on the token and on both nonces.
fn check_proofs(client_nonce: &[u8; NONCE_BYTES], token: &[u8]) {
    let server_nonce = [0x5a; NONCE_BYTES];
    let proof = login_proof(token, &server_nonce, client_nonce);
    assert!(verify_login_proof(
        token,
        &server_nonce,
        client_nonce,
        &proof
    ));
    // (Not `token` with a zero byte appended: HMAC pads short keys with
    // zeros, so those two keys are the same key.)
    let mut other = token.to_vec();
    match other.last_mut() {
        Some(b) => *b ^= 1,
        None => other.push(1),
    }
    assert!(!verify_login_proof(
        &other,
        &server_nonce,
        client_nonce,
        &proof
    ));
    let mut flipped = proof;
    flipped[0] ^= 1;
    assert!(!verify_login_proof(
        token,
        &server_nonce,
        client_nonce,
        &flipped
    ));
    assert_ne!(
        handshake::engine_proof(token, &server_nonce, client_nonce),
        proof
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    match pick % 4 {
        0 => request(MessageType::Hello, body),
        1 => request(MessageType::Login, body),
        2 => reply(MessageType::Hello, body),
        _ => reply(MessageType::Login, body),
    }
});
