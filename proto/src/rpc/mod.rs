//! The RPC protocol: frames on a TCP or Unix stream between a client and an
//! engine (byte layouts in `proto/FORMAT.md`, section "RPC frame").
//!
//! Every message is a 24-byte [`FrameHeader`] and a body of at most
//! [`BODY_BYTES_MAX`]. Requests carry a client-chosen request id; the reply
//! carries the same id, so a client may pipeline many requests and match the
//! replies, which can arrive in any order. A connection starts with the
//! [`handshake`]; a malformed, oversized or unauthenticated frame makes the
//! engine send an [`ErrorCode`] reply with request id 0 and close that
//! connection only.
//!
//! ```
//! use ferrite_proto::rpc::{self, Key, MessageType, Reply, Request};
//!
//! let mut wire = Vec::new();
//! let req = Request::Fetch { key: Key::new(1, 2, b"dkey", b"akey") };
//! rpc::encode_request(7, &req, &mut wire);
//! let (header, frame_len) = rpc::split_frame(&wire, rpc::BODY_BYTES_MAX).unwrap().unwrap();
//! assert_eq!(frame_len, wire.len());
//! assert_eq!(rpc::decode_request(&header, &wire[rpc::HEADER_BYTES..]).unwrap(), req);
//!
//! let mut answer = Vec::new();
//! rpc::encode_reply(MessageType::Fetch, 7, &Reply::Value(None), &mut answer);
//! let (header, _) = rpc::split_frame(&answer, rpc::BODY_BYTES_MAX).unwrap().unwrap();
//! assert_eq!(header.request_id, 7);
//! assert_eq!(rpc::decode_reply(&header, &answer[rpc::HEADER_BYTES..]).unwrap(), Reply::Value(None));
//! ```

mod body;
mod codec;
mod extents;
pub mod frame;
pub mod handshake;
pub mod message;
#[cfg(test)]
mod tests;

pub use frame::{FrameHeader, MessageType, BODY_BYTES_MAX, FLAG_REPLY, HEADER_BYTES};
pub use handshake::{Challenge, Hello, Login, TargetInfo, Welcome};
pub use message::{
    ErrorCode, ExtentList, ExtentSpan, Found, Key, Placed, PunchScope, Reply, Request, TargetStat,
    Verified, BATCH_REPLY_BUDGET_BYTES, EXTENT_PIECES_MAX, LIST_VALUE_BYTES_MAX,
};

use crate::FormatError;

fn encode_frame(out: &mut Vec<u8>, header: FrameHeader, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER_BYTES]);
    body(out);
    let body_len = out.len() - start - HEADER_BYTES;
    let header = FrameHeader {
        body_len: codec::len_u32(body_len),
        ..header
    };
    out[start..start + HEADER_BYTES].copy_from_slice(&header.encode());
}

/// Appends one request frame to `out`.
pub fn encode_request(request_id: u64, request: &Request, out: &mut Vec<u8>) {
    let header = FrameHeader::request(request.kind(), request_id, 0);
    encode_frame(out, header, |o| request.encode_body(o));
}

/// Appends the frame answering request `request_id` of type `request_kind`.
pub fn encode_reply(request_kind: MessageType, request_id: u64, reply: &Reply, out: &mut Vec<u8>) {
    let header = FrameHeader::reply(reply.wire_kind(request_kind), request_id, 0);
    encode_frame(out, header, |o| reply.encode_body(o));
}

/// Looks at the front of a receive buffer: `Ok(None)` if a whole header is
/// not there yet, else the header and the length of the whole frame (header
/// plus body; the body may not have arrived yet). A bad header is an error,
/// after which the stream cannot be resynchronised.
pub fn split_frame(
    buf: &[u8],
    max_body: usize,
) -> Result<Option<(FrameHeader, usize)>, FormatError> {
    if buf.len() < HEADER_BYTES {
        return Ok(None);
    }
    let header = FrameHeader::decode(&buf[..HEADER_BYTES], max_body)?;
    Ok(Some((header, HEADER_BYTES + header.body_len as usize)))
}

fn direction(header: &FrameHeader, reply: bool) -> Result<(), FormatError> {
    if header.is_reply() == reply {
        return Ok(());
    }
    Err(FormatError::Range {
        what: "frame header",
        field: "flags (direction)",
        value: u64::from(header.flags),
    })
}

fn check_body_len(header: &FrameHeader, body: &[u8]) -> Result<(), FormatError> {
    if body.len() == header.body_len as usize {
        return Ok(());
    }
    Err(FormatError::Short {
        what: "frame body",
        need: header.body_len as usize,
        have: body.len(),
    })
}

/// Decodes the body of a request frame (engine side).
pub fn decode_request(header: &FrameHeader, body: &[u8]) -> Result<Request, FormatError> {
    direction(header, false)?;
    check_body_len(header, body)?;
    Request::decode_body(header.kind, body)
}

/// Decodes the body of a reply frame (client side).
pub fn decode_reply(header: &FrameHeader, body: &[u8]) -> Result<Reply, FormatError> {
    direction(header, true)?;
    check_body_len(header, body)?;
    Reply::decode_body(header.kind, body)
}
