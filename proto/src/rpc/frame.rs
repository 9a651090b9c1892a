//! The RPC frame header: 24 bytes in front of every message on a stream.
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `"FRPC"` |
//! | 4 | 1 | protocol version (1) |
//! | 5 | 1 | message type ([`MessageType`]) |
//! | 6 | 2 | flags (bit0 = reply) |
//! | 8 | 8 | request id |
//! | 16 | 4 | body length |
//! | 20 | 4 | reserved, 0 |

use crate::FormatError;

pub const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"FRPC");
pub const PROTOCOL_VERSION: u8 = 1;
/// Largest body a peer may send; a longer announced body closes the stream.
pub const BODY_BYTES_MAX: usize = 8 << 20;

pub const OFF_MAGIC: usize = 0;
pub const OFF_VERSION: usize = OFF_MAGIC + 4;
pub const OFF_TYPE: usize = OFF_VERSION + 1;
pub const OFF_FLAGS: usize = OFF_TYPE + 1;
pub const OFF_REQUEST_ID: usize = OFF_FLAGS + 2;
pub const OFF_BODY_LEN: usize = OFF_REQUEST_ID + 8;
pub const OFF_RESERVED: usize = OFF_BODY_LEN + 4;
pub const HEADER_BYTES: usize = OFF_RESERVED + 4;

const _: () = assert!(HEADER_BYTES == 24);
const _: () = assert!(BODY_BYTES_MAX <= u32::MAX as usize);

/// Flag bit: the frame answers the request with the same id.
pub const FLAG_REPLY: u16 = 1;
const KNOWN_FLAGS: u16 = FLAG_REPLY;

/// What a frame's body holds. A reply carries its request's type (or
/// [`MessageType::Error`]) with [`FLAG_REPLY`] set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageType {
    Hello = 0x01,
    Login = 0x02,
    Update = 0x10,
    Fetch = 0x11,
    Punch = 0x12,
    ListDkeys = 0x13,
    ListAkeys = 0x14,
    CondUpdate = 0x15,
    ExtentWrite = 0x16,
    ExtentRead = 0x17,
    Batch = 0x18,
    Stat = 0x19,
    Sync = 0x1a,
    ListObjects = 0x1b,
    Verify = 0x1c,
    BulkWrite = 0x1d,
    BulkRead = 0x1e,
    ExtentList = 0x1f,
    RegionRead = 0x20,
    ListValues = 0x21,
    Error = 0x7f,
}

impl MessageType {
    pub const ALL: [MessageType; 21] = [
        Self::Hello,
        Self::Login,
        Self::Update,
        Self::Fetch,
        Self::Punch,
        Self::ListDkeys,
        Self::ListAkeys,
        Self::CondUpdate,
        Self::ExtentWrite,
        Self::ExtentRead,
        Self::Batch,
        Self::Stat,
        Self::Sync,
        Self::ListObjects,
        Self::Verify,
        Self::BulkWrite,
        Self::BulkRead,
        Self::ExtentList,
        Self::RegionRead,
        Self::ListValues,
        Self::Error,
    ];

    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|t| *t as u8 == v)
    }

    /// Operations on one key's data that may appear inside a batch.
    pub fn is_batchable(self) -> bool {
        matches!(
            self,
            Self::Update
                | Self::Fetch
                | Self::Punch
                | Self::ListDkeys
                | Self::ListValues
                | Self::ListAkeys
                | Self::CondUpdate
                | Self::ExtentWrite
                | Self::ExtentRead
                | Self::Verify
                | Self::BulkWrite
                | Self::BulkRead
        )
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: MessageType,
    pub flags: u16,
    pub request_id: u64,
    pub body_len: u32,
}

impl FrameHeader {
    pub fn request(kind: MessageType, request_id: u64, body_len: usize) -> Self {
        Self {
            kind,
            flags: 0,
            request_id,
            body_len: super::codec::len_u32(body_len),
        }
    }

    pub fn reply(kind: MessageType, request_id: u64, body_len: usize) -> Self {
        Self {
            flags: FLAG_REPLY,
            ..Self::request(kind, request_id, body_len)
        }
    }

    pub fn is_reply(&self) -> bool {
        self.flags & FLAG_REPLY != 0
    }

    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[OFF_MAGIC..OFF_VERSION].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        b[OFF_VERSION] = PROTOCOL_VERSION;
        b[OFF_TYPE] = self.kind as u8;
        b[OFF_FLAGS..OFF_REQUEST_ID].copy_from_slice(&self.flags.to_le_bytes());
        b[OFF_REQUEST_ID..OFF_BODY_LEN].copy_from_slice(&self.request_id.to_le_bytes());
        b[OFF_BODY_LEN..OFF_RESERVED].copy_from_slice(&self.body_len.to_le_bytes());
        b
    }

    /// Decodes and checks a header against `max_body` (at most
    /// [`BODY_BYTES_MAX`]). Refuses bad magic, version, type, flags, a
    /// nonzero reserved word and an oversized body.
    pub fn decode(b: &[u8], max_body: usize) -> Result<Self, FormatError> {
        let mut r = super::codec::Reader::new(b, "frame header");
        let magic = r.u32()?;
        if magic != FRAME_MAGIC {
            return Err(FormatError::BadMagic {
                what: "frame header",
                found: magic,
            });
        }
        let version = r.u8()?;
        if version != PROTOCOL_VERSION {
            return Err(FormatError::BadVersion {
                what: "frame header",
                found: version,
            });
        }
        let type_byte = r.u8()?;
        let kind = MessageType::from_u8(type_byte).ok_or(r.range("type", u64::from(type_byte)))?;
        let flags = r.u16()?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(r.range("flags", u64::from(flags)));
        }
        let request_id = r.u64()?;
        let body_len = r.u32()?;
        if body_len as usize > max_body.min(BODY_BYTES_MAX) {
            return Err(r.range("body_len", u64::from(body_len)));
        }
        let reserved = r.u32()?;
        if reserved != 0 {
            return Err(r.range("reserved", u64::from(reserved)));
        }
        Ok(Self {
            kind,
            flags,
            request_id,
            body_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip() {
        for kind in MessageType::ALL {
            let h = FrameHeader::reply(kind, 0xdead_beef_0001, 77);
            assert_eq!(FrameHeader::decode(&h.encode(), BODY_BYTES_MAX), Ok(h));
        }
    }

    #[test]
    fn header_refusals() {
        let good = FrameHeader::request(MessageType::Fetch, 1, 10).encode();
        let mut b = good;
        b[0] ^= 1;
        assert!(matches!(
            FrameHeader::decode(&b, BODY_BYTES_MAX),
            Err(FormatError::BadMagic { .. })
        ));
        let mut b = good;
        b[OFF_VERSION] = 2;
        assert!(FrameHeader::decode(&b, BODY_BYTES_MAX).is_err());
        let mut b = good;
        b[OFF_TYPE] = 0x55;
        assert!(FrameHeader::decode(&b, BODY_BYTES_MAX).is_err());
        let mut b = good;
        b[OFF_FLAGS] = 0x80;
        assert!(FrameHeader::decode(&b, BODY_BYTES_MAX).is_err());
        let mut b = good;
        b[OFF_RESERVED] = 1;
        assert!(FrameHeader::decode(&b, BODY_BYTES_MAX).is_err());
        assert!(FrameHeader::decode(&good, 9).is_err(), "body over max");
        assert!(FrameHeader::decode(&good[..23], BODY_BYTES_MAX).is_err());
        let huge = FrameHeader::request(MessageType::Fetch, 1, BODY_BYTES_MAX + 1).encode();
        assert!(FrameHeader::decode(&huge, usize::MAX).is_err());
    }
}
