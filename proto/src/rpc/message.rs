//! Request and reply bodies of the data operations, and their encodings.
//!
//! Every decoder takes exactly one body and refuses leftovers, lengths over
//! their limits and unknown enum values; none of them panics.

use super::codec::{len_u16, Put, Reader};
pub use super::extents::{ExtentList, ExtentSpan, EXTENT_PIECES_MAX};
use super::handshake::{Challenge, Hello, Login, Welcome};
use crate::key::{RecordKey, KEY_PART_MAX_BYTES};
use crate::record::VALUE_MAX_BYTES;
use crate::FormatError;

/// Most operations in one batch.
pub const BATCH_ITEMS_MAX: usize = 1024;
/// Most keys one list reply may carry.
pub const LIST_KEYS_MAX: usize = 4096;
/// Value bytes one ListValues reply carries at most (values past it are
/// left out, to be fetched).
pub const LIST_VALUE_BYTES_MAX: usize = 1 << 20;
/// Most bytes one extent or region read may return.
pub const READ_BYTES_MAX: usize = VALUE_MAX_BYTES;
/// Reply bytes the items of one batch share (each item's body and its
/// 5-byte item header): an item whose reply would pass it is answered with
/// [`ErrorCode::TooLarge`] instead, and a listing is cut to what is left
/// (with `more` set). Also the most a listing alone returns. Below
/// [`BODY_BYTES_MAX`](super::BODY_BYTES_MAX) with room for the refusals,
/// so a batch reply always fits the frame a client accepts.
pub const BATCH_REPLY_BUDGET_BYTES: usize = 4 << 20;
/// Longest error message carried, in bytes.
pub const MESSAGE_BYTES_MAX: usize = 4096;
/// Most counters one target reports in a stat reply.
pub const STAT_COUNTERS_MAX: usize = 256;

/// A full key, owned (wire: container u64, object u128, dkey_len u16,
/// akey_len u16, dkey, akey — 28 bytes plus the key parts).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub container: u64,
    pub object: u128,
    pub dkey: Vec<u8>,
    pub akey: Vec<u8>,
}

impl Key {
    pub fn new(container: u64, object: u128, dkey: &[u8], akey: &[u8]) -> Self {
        Self {
            container,
            object,
            dkey: dkey.to_vec(),
            akey: akey.to_vec(),
        }
    }
    pub fn as_record_key(&self) -> RecordKey<'_> {
        RecordKey::new(self.container, self.object, &self.dkey, &self.akey)
    }
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.put_u64(self.container);
        out.put_u128(self.object);
        out.put_u16(len_u16(self.dkey.len()));
        out.put_u16(len_u16(self.akey.len()));
        out.put_bytes(&self.dkey);
        out.put_bytes(&self.akey);
    }
    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Result<Self, FormatError> {
        let container = r.u64()?;
        let object = r.u128()?;
        let dkey_len = usize::from(r.u16()?);
        let akey_len = usize::from(r.u16()?);
        Ok(Self {
            container,
            object,
            dkey: r.vec(dkey_len, KEY_PART_MAX_BYTES, "dkey_len")?,
            akey: r.vec(akey_len, KEY_PART_MAX_BYTES, "akey_len")?,
        })
    }
}

/// What a punch removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PunchScope {
    /// One akey.
    Akey = 1,
    /// Every akey under the dkey (the key's akey is ignored).
    Dkey = 2,
    /// The whole object on every target (dkey and akey are ignored).
    Object = 3,
}

/// A request body. Handshake messages come first on every connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Hello(Hello),
    Login(Login),
    Update {
        key: Key,
        value: Vec<u8>,
    },
    Fetch {
        key: Key,
    },
    Punch {
        scope: PunchScope,
        key: Key,
    },
    /// Dkeys of an object, sorted, strictly after `after`; from every target.
    ListDkeys {
        container: u64,
        object: u128,
        after: Option<Vec<u8>>,
        limit: u32,
    },
    /// Dkeys of an object that hold akey `akey`, sorted, strictly after
    /// `after`, each with that akey's single value when its target holds the
    /// record in memory (else the value is left out: fetch it); from every
    /// target. A directory listing with its entries in one round trip.
    ListValues {
        container: u64,
        object: u128,
        akey: Vec<u8>,
        after: Option<Vec<u8>>,
        limit: u32,
    },
    /// Akeys of a dkey, sorted, strictly after `after`.
    ListAkeys {
        container: u64,
        object: u128,
        dkey: Vec<u8>,
        after: Option<Vec<u8>>,
        limit: u32,
    },
    /// Update only if the key's version is `expected_version` (0 = absent).
    CondUpdate {
        key: Key,
        expected_version: u64,
        value: Vec<u8>,
    },
    ExtentWrite {
        key: Key,
        offset: u64,
        data: Vec<u8>,
    },
    ExtentRead {
        key: Key,
        offset: u64,
        len: u32,
    },
    /// Data operations, answered in order by a batch reply.
    Batch(Vec<Request>),
    Stat,
    /// Make every acknowledged update of every target survive a power loss
    /// (flush the devices of engines acknowledging at process durability).
    Sync,
    /// Objects of a container that hold at least one key, sorted by id,
    /// strictly after `after`; from every target.
    ListObjects {
        container: u64,
        after: Option<u128>,
        limit: u32,
    },
    /// Reads every record the key's value is made of from the device (and
    /// from the memory ring while it is there) and checks each one: CRC,
    /// key, address. Answered by [`Reply::Verified`].
    Verify {
        key: Key,
    },
    /// [`Request::ExtentWrite`] whose `len` bytes are taken from the
    /// connection's bulk region at `region_offset` instead of the frame.
    BulkWrite {
        key: Key,
        offset: u64,
        region_offset: u64,
        len: u32,
    },
    /// [`Request::ExtentRead`] whose bytes the engine places into the
    /// connection's bulk region at `region_offset` (holes as zero); answered
    /// by [`Reply::Placed`].
    BulkRead {
        key: Key,
        offset: u64,
        region_offset: u64,
        len: u32,
    },
    /// Where the pieces of the byte array under `key` lie in the owning
    /// target's log, answered by [`Reply::Extents`], so that a local client
    /// can read pieces that are not in the newest record one-sided.
    ExtentList {
        key: Key,
    },
    /// One-sided read of `len` bytes at `offset` of a tcp-provider region.
    RegionRead {
        region_id: u32,
        access_key: u64,
        offset: u64,
        len: u32,
    },
}

/// A value found by a fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub version: u64,
    pub value: Vec<u8>,
}

/// What a [`Request::Verify`] found (wire: the `verified` reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// The key has no value.
    Absent,
    /// Every record checked: how many, and the value bytes they hold.
    Intact { records: u32, value_bytes: u64 },
    /// The record at log address `addr` failed its check (`reason`), after
    /// `records` good ones.
    Corrupt {
        records: u32,
        addr: u64,
        reason: String,
    },
}

/// What a [`Request::BulkRead`] placed into the bulk region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// The array's version.
    pub version: u64,
    /// Bytes placed at the request's `region_offset` (its whole `len`).
    pub len: u32,
}

/// Counters of one target in a stat reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetStat {
    pub target: u16,
    pub counters: Vec<(String, u64)>,
}

/// Why a request failed (wire: u16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// The frame or body did not decode; the connection is closed.
    Malformed = 1,
    /// The announced body exceeds the limit; the connection is closed.
    Oversized = 2,
    /// No valid login yet, or a wrong proof; the connection is closed.
    Unauthenticated = 3,
    UnsupportedVersion = 4,
    /// A well-formed request the engine refuses (bad length, bad range...).
    InvalidArgument = 5,
    /// The device failed; the target refuses writes (poisoned).
    Io = 6,
    ReadOnly = 7,
    /// Store or queue full.
    NoSpace = 8,
    ShuttingDown = 9,
    /// Region read with an unknown region, wrong access key or out of
    /// bounds; a bulk request out of its bulk region's bounds or on a
    /// connection without one.
    BadRegion = 10,
    Internal = 11,
    /// A batch item whose reply would pass the batch's reply budget
    /// ([`BATCH_REPLY_BUDGET_BYTES`]): ask for it alone. Only batch items
    /// get it; the connection goes on.
    TooLarge = 12,
}

impl ErrorCode {
    const ALL: [ErrorCode; 12] = [
        Self::Malformed,
        Self::Oversized,
        Self::Unauthenticated,
        Self::UnsupportedVersion,
        Self::InvalidArgument,
        Self::Io,
        Self::ReadOnly,
        Self::NoSpace,
        Self::ShuttingDown,
        Self::BadRegion,
        Self::Internal,
        Self::TooLarge,
    ];
    /// Unknown codes decode as `Internal` so newer engines stay readable.
    pub fn from_u16(v: u16) -> Self {
        Self::ALL
            .into_iter()
            .find(|c| *c as u16 == v)
            .unwrap_or(Self::Internal)
    }
}

/// A reply body. Its frame type is the request's type, or `Error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Reply to Hello.
    Challenge(Challenge),
    /// Reply to Login.
    Welcome(Welcome),
    /// Reply to Update, Punch, ExtentWrite: the version assigned.
    Version(u64),
    /// Reply to Fetch and ExtentRead (the array's version and the bytes,
    /// holes read as zero).
    Value(Option<Found>),
    /// Reply to ListDkeys/ListAkeys; `more` = call again after the last key.
    Keys {
        keys: Vec<Vec<u8>>,
        more: bool,
    },
    /// Reply to ListValues: dkeys in order, each with the akey's value or
    /// `None` (not sent: fetch it); `more` = call again after the last dkey.
    Values {
        entries: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        more: bool,
    },
    /// Reply to CondUpdate: whether applied, and the key's version now.
    Cond {
        applied: bool,
        version: u64,
    },
    /// Reply to ListObjects; `more` = call again after the last object.
    Objects {
        objects: Vec<u128>,
        more: bool,
    },
    /// Reply to Verify.
    Verified(Verified),
    /// Reply to BulkRead: `None` when the array does not exist (nothing
    /// was placed).
    Placed(Option<Placed>),
    /// Reply to ExtentList: `None` when the array does not exist.
    Extents(Option<ExtentList>),
    /// Reply to RegionRead.
    Data(Vec<u8>),
    /// Reply to Batch: one reply per operation, in order.
    Batch(Vec<Reply>),
    Stat(Vec<TargetStat>),
    /// Reply to Sync.
    Synced,
    Error {
        code: ErrorCode,
        message: String,
    },
}
