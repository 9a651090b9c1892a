//! Feeds arbitrary bytes to the RPC frame parser the way the engine and the
//! client read a stream: split frames off the front, decode each body as a
//! request and as a reply. Nothing may panic; whatever decodes must encode
//! back to a frame that decodes to the same message (replies holding an
//! error excepted: their decoding is lossy by design). Covers the bulk
//! requests (BulkWrite, BulkRead) and the placed reply with every other
//! type.

#![no_main]

use ferrite_proto::rpc::{self, MessageType, Reply, Request, BODY_BYTES_MAX, HEADER_BYTES};
use libfuzzer_sys::fuzz_target;

fn check_request(header: &rpc::FrameHeader, body: &[u8]) {
    if let Ok(req) = rpc::decode_request(header, body) {
        let mut wire = Vec::new();
        rpc::encode_request(header.request_id, &req, &mut wire);
        let (h, len) = rpc::split_frame(&wire, BODY_BYTES_MAX)
            .expect("re-encoded frame has a valid header")
            .expect("re-encoded frame is whole");
        assert_eq!(len, wire.len());
        let again =
            rpc::decode_request(&h, &wire[HEADER_BYTES..]).expect("re-encoded body decodes");
        assert_eq!(again, req);
    }
}

/// Whether an error reply hides in `reply` (their decoding is lossy: unknown
/// codes, invalid UTF-8, so they are not compared after a re-encoding).
fn has_error(reply: &Reply) -> bool {
    match reply {
        Reply::Error { .. } => true,
        Reply::Batch(items) => items.iter().any(has_error),
        _ => false,
    }
}

fn check_reply(header: &rpc::FrameHeader, body: &[u8]) {
    if let Ok(reply) = rpc::decode_reply(header, body) {
        if has_error(&reply) {
            return;
        }
        let mut wire = Vec::new();
        rpc::encode_reply(header.kind, header.request_id, &reply, &mut wire);
        let (h, _) = rpc::split_frame(&wire, BODY_BYTES_MAX)
            .expect("re-encoded frame has a valid header")
            .expect("re-encoded frame is whole");
        let again = rpc::decode_reply(&h, &wire[HEADER_BYTES..]).expect("re-encoded reply decodes");
        assert_eq!(again, reply);
    }
}

fuzz_target!(|data: &[u8]| {
    // As a stream of frames.
    let mut at = 0;
    while let Ok(Some((header, len))) = rpc::split_frame(&data[at..], BODY_BYTES_MAX) {
        if at + len > data.len() {
            break;
        }
        let body = &data[at + HEADER_BYTES..at + len];
        check_request(&header, body);
        check_reply(&header, body);
        at += len;
    }
    // As a bare body of every type.
    if let Some((&kind, body)) = data.split_first() {
        if let Some(kind) = MessageType::from_u8(kind) {
            let _ = Request::decode_body(kind, body);
            let _ = Reply::decode_body(kind, body);
        }
    }
});
