//! Body encodings of [`Request`] and [`Reply`] (layouts in `FORMAT.md`).

use super::codec::{len_u16, len_u32, Put, Reader};
use super::extents::{get_extents, put_extents};
use super::frame::MessageType;
use super::handshake::{Challenge, Hello, Login, Welcome, TARGETS_MAX};
use super::message::*;
use crate::key::KEY_PART_MAX_BYTES;
use crate::record::VALUE_MAX_BYTES;
use crate::FormatError;

fn put_after(out: &mut Vec<u8>, limit: u32, after: &Option<Vec<u8>>) {
    out.put_u32(limit);
    out.put_u8(u8::from(after.is_some()));
    let a = after.as_deref().unwrap_or(&[]);
    out.put_u16(len_u16(a.len()));
    out.put_bytes(a);
}

fn get_bool(r: &mut Reader<'_>, field: &'static str) -> Result<bool, FormatError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(r.range(field, u64::from(v))),
    }
}

fn get_after(r: &mut Reader<'_>) -> Result<(u32, Option<Vec<u8>>), FormatError> {
    let limit = r.u32()?;
    let has = get_bool(r, "has_after")?;
    let len = usize::from(r.u16()?);
    let bytes = r.vec(len, KEY_PART_MAX_BYTES, "after_len")?;
    if !has && !bytes.is_empty() {
        return Err(r.range("after_len", len as u64));
    }
    Ok((limit, has.then_some(bytes)))
}

/// ListObjects request body: container u64, limit u32, has_after u8,
/// after u128 (0 without has_after).
pub const LIST_OBJECTS_BODY_BYTES: usize = 8 + 4 + 1 + 16;
const _: () = assert!(LIST_OBJECTS_BODY_BYTES == 29);
/// Verified reply body before its reason: outcome u8, records u32,
/// value_bytes u64, addr u64, reason_len u16.
pub const VERIFIED_FIXED_BYTES: usize = 1 + 4 + 8 + 8 + 2;
const _: () = assert!(VERIFIED_FIXED_BYTES == 23);

/// BulkWrite and BulkRead request bodies after their key: offset u64,
/// region_offset u64, len u32.
pub const BULK_FIXED_BYTES: usize = 8 + 8 + 4;
const _: () = assert!(BULK_FIXED_BYTES == 20);
/// Placed reply body: found u8, version u64, len u32 (both 0 when not found).
pub const PLACED_BODY_BYTES: usize = 1 + 8 + 4;
const _: () = assert!(PLACED_BODY_BYTES == 13);

fn put_bulk(out: &mut Vec<u8>, key: &Key, offset: u64, region_offset: u64, len: u32) {
    key.encode_into(out);
    out.put_u64(offset);
    out.put_u64(region_offset);
    out.put_u32(len);
}

/// Key, offset, region_offset and len of a bulk request; len ≤ [`READ_BYTES_MAX`].
fn get_bulk(r: &mut Reader<'_>) -> Result<(Key, u64, u64, u32), FormatError> {
    let key = Key::decode_from(r)?;
    let offset = r.u64()?;
    let region_offset = r.u64()?;
    let len = r.u32()?;
    if len as usize > READ_BYTES_MAX {
        return Err(r.range("len", u64::from(len)));
    }
    Ok((key, offset, region_offset, len))
}

fn put_placed(out: &mut Vec<u8>, p: &Option<Placed>) {
    out.put_u8(u8::from(p.is_some()));
    out.put_u64(p.map_or(0, |p| p.version));
    out.put_u32(p.map_or(0, |p| p.len));
}

/// Decodes a `placed` body; version and len must be 0 when not found.
fn get_placed(r: &mut Reader<'_>) -> Result<Option<Placed>, FormatError> {
    let found = get_bool(r, "found")?;
    let version = r.u64()?;
    let len = r.u32()?;
    if len as usize > READ_BYTES_MAX {
        return Err(r.range("len", u64::from(len)));
    }
    match found {
        true => Ok(Some(Placed { version, len })),
        false if version == 0 && len == 0 => Ok(None),
        false => Err(r.range("version/len (not found)", version | u64::from(len))),
    }
}

fn put_verified(out: &mut Vec<u8>, v: &Verified) {
    let (outcome, records, value_bytes, addr, reason) = match v {
        Verified::Absent => (0, 0, 0, 0, ""),
        Verified::Intact {
            records,
            value_bytes,
        } => (1, *records, *value_bytes, 0, ""),
        Verified::Corrupt {
            records,
            addr,
            reason,
        } => (
            2,
            *records,
            0,
            *addr,
            utf8_prefix(reason, MESSAGE_BYTES_MAX),
        ),
    };
    out.put_u8(outcome);
    out.put_u32(records);
    out.put_u64(value_bytes);
    out.put_u64(addr);
    out.put_u16(len_u16(reason.len()));
    out.put_bytes(reason.as_bytes());
}

/// Decodes a `verified` body; fields an outcome does not use must be 0.
fn get_verified(r: &mut Reader<'_>) -> Result<Verified, FormatError> {
    let outcome = r.u8()?;
    let records = r.u32()?;
    let value_bytes = r.u64()?;
    let addr = r.u64()?;
    let len = usize::from(r.u16()?);
    let reason = r.vec(len, MESSAGE_BYTES_MAX, "reason_len")?;
    let unused = |field, value: u64| match value {
        0 => Ok(()),
        v => Err(r.range(field, v)),
    };
    Ok(match outcome {
        0 => {
            unused("records", u64::from(records))?;
            unused("value_bytes", value_bytes)?;
            unused("addr", addr)?;
            unused("reason_len", len as u64)?;
            Verified::Absent
        }
        1 => {
            unused("addr", addr)?;
            unused("reason_len", len as u64)?;
            Verified::Intact {
                records,
                value_bytes,
            }
        }
        2 => {
            unused("value_bytes", value_bytes)?;
            let reason = String::from_utf8(reason).map_err(|_| r.range("reason (utf-8)", 0))?;
            Verified::Corrupt {
                records,
                addr,
                reason,
            }
        }
        v => return Err(r.range("outcome", u64::from(v))),
    })
}

/// A ListValues reply: u32 count, u8 more, then count × (u16 key_len, key,
/// u8 has_value, when 1 a blob value); at most [`LIST_VALUE_BYTES_MAX`] of
/// values in all.
fn put_values(out: &mut Vec<u8>, entries: &[(Vec<u8>, Option<Vec<u8>>)], more: bool) {
    out.put_u32(len_u32(entries.len()));
    out.put_u8(u8::from(more));
    for (key, value) in entries {
        out.put_u16(len_u16(key.len()));
        out.put_bytes(key);
        out.put_u8(u8::from(value.is_some()));
        if let Some(v) = value {
            put_blob(out, v);
        }
    }
}

type ListedValues = (Vec<(Vec<u8>, Option<Vec<u8>>)>, bool);

fn get_values(r: &mut Reader<'_>) -> Result<ListedValues, FormatError> {
    let mut left = LIST_VALUE_BYTES_MAX;
    get_list(r, "entry count", |r| {
        let len = usize::from(r.u16()?);
        let key = r.vec(len, KEY_PART_MAX_BYTES, "key_len")?;
        let value = match get_bool(r, "has_value")? {
            false => None,
            true => {
                let v = get_blob(r, left, "value bytes of the listing")?;
                left -= v.len();
                Some(v)
            }
        };
        Ok((key, value))
    })
}

/// The body of a listing under one key part (ListAkeys: a dkey;
/// ListValues: an akey): u64 container, u128 object, u16 part_len, part,
/// then the cursor.
type PartListing = (u64, u128, Vec<u8>, u32, Option<Vec<u8>>);

fn get_part_listing(
    r: &mut Reader<'_>,
    len_name: &'static str,
) -> Result<PartListing, FormatError> {
    let container = r.u64()?;
    let object = r.u128()?;
    let len = usize::from(r.u16()?);
    let part = r.vec(len, KEY_PART_MAX_BYTES, len_name)?;
    let (limit, after) = get_after(r)?;
    Ok((container, object, part, limit, after))
}

/// A listing reply: u32 count (≤ [`LIST_KEYS_MAX`]), u8 more, then count
/// items read by `item`.
fn get_list<T>(
    r: &mut Reader<'_>,
    field: &'static str,
    mut item: impl FnMut(&mut Reader<'_>) -> Result<T, FormatError>,
) -> Result<(Vec<T>, bool), FormatError> {
    let count = r.u32()? as usize;
    if count > LIST_KEYS_MAX {
        return Err(r.range(field, count as u64));
    }
    let more = get_bool(r, "more")?;
    let mut items = Vec::with_capacity(count);
    for _ in 0..count {
        items.push(item(r)?);
    }
    Ok((items, more))
}

fn put_blob(out: &mut Vec<u8>, b: &[u8]) {
    out.put_u32(len_u32(b.len()));
    out.put_bytes(b);
}

fn get_blob(r: &mut Reader<'_>, max: usize, field: &'static str) -> Result<Vec<u8>, FormatError> {
    let len = r.u32()? as usize;
    r.vec(len, max, field)
}

impl Request {
    /// The frame type that carries this request.
    pub fn kind(&self) -> MessageType {
        match self {
            Self::Hello(_) => MessageType::Hello,
            Self::Login(_) => MessageType::Login,
            Self::Update { .. } => MessageType::Update,
            Self::Fetch { .. } => MessageType::Fetch,
            Self::Punch { .. } => MessageType::Punch,
            Self::ListDkeys { .. } => MessageType::ListDkeys,
            Self::ListAkeys { .. } => MessageType::ListAkeys,
            Self::ListValues { .. } => MessageType::ListValues,
            Self::CondUpdate { .. } => MessageType::CondUpdate,
            Self::ExtentWrite { .. } => MessageType::ExtentWrite,
            Self::ExtentRead { .. } => MessageType::ExtentRead,
            Self::Batch(_) => MessageType::Batch,
            Self::Stat => MessageType::Stat,
            Self::Sync => MessageType::Sync,
            Self::ListObjects { .. } => MessageType::ListObjects,
            Self::Verify { .. } => MessageType::Verify,
            Self::BulkWrite { .. } => MessageType::BulkWrite,
            Self::BulkRead { .. } => MessageType::BulkRead,
            Self::ExtentList { .. } => MessageType::ExtentList,
            Self::RegionRead { .. } => MessageType::RegionRead,
        }
    }

    /// The target that owns a keyed request's dkey among `target_count`
    /// (a batch: its first keyed item's); `None` for requests of no one
    /// target (listing dkeys, stat, sync...).
    pub fn owner(&self, target_count: u32) -> Option<u32> {
        let (container, object, dkey) = match self {
            Self::Update { key, .. }
            | Self::Fetch { key }
            | Self::Punch { key, .. }
            | Self::CondUpdate { key, .. }
            | Self::ExtentWrite { key, .. }
            | Self::ExtentRead { key, .. }
            | Self::BulkWrite { key, .. }
            | Self::BulkRead { key, .. }
            | Self::ExtentList { key }
            | Self::Verify { key } => (key.container, key.object, key.dkey.as_slice()),
            Self::ListAkeys {
                container,
                object,
                dkey,
                ..
            } => (*container, *object, dkey.as_slice()),
            Self::Batch(items) => return items.iter().find_map(|i| i.owner(target_count)),
            _ => return None,
        };
        let hash = crate::key::dkey_hash(container, object, dkey);
        Some(crate::key::target_of(hash, target_count))
    }

    /// Appends the body (no frame header) to `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            Self::Hello(h) => h.encode_into(out),
            Self::Login(l) => out.put_bytes(&l.proof),
            Self::Update { key, value } => {
                key.encode_into(out);
                put_blob(out, value);
            }
            Self::Fetch { key } => key.encode_into(out),
            Self::Punch { scope, key } => {
                out.put_u8(*scope as u8);
                key.encode_into(out);
            }
            Self::ListDkeys {
                container,
                object,
                after,
                limit,
            } => {
                out.put_u64(*container);
                out.put_u128(*object);
                put_after(out, *limit, after);
            }
            Self::ListAkeys {
                container,
                object,
                dkey: part,
                after,
                limit,
            }
            | Self::ListValues {
                container,
                object,
                akey: part,
                after,
                limit,
            } => {
                out.put_u64(*container);
                out.put_u128(*object);
                out.put_u16(len_u16(part.len()));
                out.put_bytes(part);
                put_after(out, *limit, after);
            }
            Self::CondUpdate {
                key,
                expected_version,
                value,
            } => {
                key.encode_into(out);
                out.put_u64(*expected_version);
                put_blob(out, value);
            }
            Self::ExtentWrite { key, offset, data } => {
                key.encode_into(out);
                out.put_u64(*offset);
                put_blob(out, data);
            }
            Self::ExtentRead { key, offset, len } => {
                key.encode_into(out);
                out.put_u64(*offset);
                out.put_u32(*len);
            }
            Self::Batch(items) => {
                out.put_u16(len_u16(items.len()));
                for item in items {
                    put_item(out, item.kind(), |o| item.encode_body(o));
                }
            }
            Self::Stat | Self::Sync => {}
            Self::ListObjects {
                container,
                after,
                limit,
            } => {
                out.put_u64(*container);
                out.put_u32(*limit);
                out.put_u8(u8::from(after.is_some()));
                out.put_u128(after.unwrap_or(0));
            }
            Self::Verify { key } | Self::ExtentList { key } => key.encode_into(out),
            Self::BulkWrite {
                key,
                offset,
                region_offset,
                len,
            }
            | Self::BulkRead {
                key,
                offset,
                region_offset,
                len,
            } => put_bulk(out, key, *offset, *region_offset, *len),
            Self::RegionRead {
                region_id,
                access_key,
                offset,
                len,
            } => {
                out.put_u32(*region_id);
                out.put_u32(0);
                out.put_u64(*access_key);
                out.put_u64(*offset);
                out.put_u32(*len);
            }
        }
    }

    /// Decodes exactly one request body of frame type `kind`.
    pub fn decode_body(kind: MessageType, body: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(body, "request body");
        let req = Self::decode_from(kind, &mut r)?;
        r.finish()?;
        Ok(req)
    }

    fn decode_from(kind: MessageType, r: &mut Reader<'_>) -> Result<Self, FormatError> {
        Ok(match kind {
            MessageType::Hello => Self::Hello(Hello::decode_from(r)?),
            MessageType::Login => Self::Login(Login { proof: r.array()? }),
            MessageType::Update => Self::Update {
                key: Key::decode_from(r)?,
                value: get_blob(r, VALUE_MAX_BYTES, "value_len")?,
            },
            MessageType::Fetch => Self::Fetch {
                key: Key::decode_from(r)?,
            },
            MessageType::Punch => {
                let scope = match r.u8()? {
                    1 => PunchScope::Akey,
                    2 => PunchScope::Dkey,
                    3 => PunchScope::Object,
                    v => return Err(r.range("scope", u64::from(v))),
                };
                Self::Punch {
                    scope,
                    key: Key::decode_from(r)?,
                }
            }
            MessageType::ListDkeys => {
                let container = r.u64()?;
                let object = r.u128()?;
                let (limit, after) = get_after(r)?;
                Self::ListDkeys {
                    container,
                    object,
                    after,
                    limit,
                }
            }
            MessageType::ListAkeys => {
                let (container, object, dkey, limit, after) = get_part_listing(r, "dkey_len")?;
                Self::ListAkeys {
                    container,
                    object,
                    dkey,
                    after,
                    limit,
                }
            }
            MessageType::ListValues => {
                let (container, object, akey, limit, after) = get_part_listing(r, "akey_len")?;
                Self::ListValues {
                    container,
                    object,
                    akey,
                    after,
                    limit,
                }
            }
            MessageType::CondUpdate => Self::CondUpdate {
                key: Key::decode_from(r)?,
                expected_version: r.u64()?,
                value: get_blob(r, VALUE_MAX_BYTES, "value_len")?,
            },
            MessageType::ExtentWrite => Self::ExtentWrite {
                key: Key::decode_from(r)?,
                offset: r.u64()?,
                data: get_blob(r, VALUE_MAX_BYTES, "data_len")?,
            },
            MessageType::ExtentRead => {
                let key = Key::decode_from(r)?;
                let offset = r.u64()?;
                let len = r.u32()?;
                if len as usize > READ_BYTES_MAX {
                    return Err(r.range("len", u64::from(len)));
                }
                Self::ExtentRead { key, offset, len }
            }
            MessageType::Batch => Self::Batch(decode_items(r, |k, r| {
                if !k.is_batchable() {
                    return Err(r.range("batch item type", k as u64));
                }
                Self::decode_from(k, r)
            })?),
            MessageType::Stat => Self::Stat,
            MessageType::Sync => Self::Sync,
            MessageType::ListObjects => {
                let container = r.u64()?;
                let limit = r.u32()?;
                let has = get_bool(r, "has_after")?;
                let after = r.u128()?;
                if !has && after != 0 {
                    return Err(r.range("after", 1));
                }
                Self::ListObjects {
                    container,
                    after: has.then_some(after),
                    limit,
                }
            }
            MessageType::Verify => Self::Verify {
                key: Key::decode_from(r)?,
            },
            MessageType::BulkWrite => {
                let (key, offset, region_offset, len) = get_bulk(r)?;
                Self::BulkWrite {
                    key,
                    offset,
                    region_offset,
                    len,
                }
            }
            MessageType::BulkRead => {
                let (key, offset, region_offset, len) = get_bulk(r)?;
                Self::BulkRead {
                    key,
                    offset,
                    region_offset,
                    len,
                }
            }
            MessageType::ExtentList => Self::ExtentList {
                key: Key::decode_from(r)?,
            },
            MessageType::RegionRead => {
                let region_id = r.u32()?;
                if r.u32()? != 0 {
                    return Err(r.range("reserved", 1));
                }
                let access_key = r.u64()?;
                let offset = r.u64()?;
                let len = r.u32()?;
                if len as usize > READ_BYTES_MAX {
                    return Err(r.range("len", u64::from(len)));
                }
                Self::RegionRead {
                    region_id,
                    access_key,
                    offset,
                    len,
                }
            }
            MessageType::Error => return Err(r.range("request type", kind as u64)),
        })
    }
}

/// Batch item: type u8, body_len u32, body.
fn put_item(out: &mut Vec<u8>, kind: MessageType, body: impl FnOnce(&mut Vec<u8>)) {
    out.put_u8(kind as u8);
    let len_at = out.len();
    out.put_u32(0);
    body(out);
    let len = len_u32(out.len() - len_at - 4);
    out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
}

fn decode_items<T>(
    r: &mut Reader<'_>,
    mut one: impl FnMut(MessageType, &mut Reader<'_>) -> Result<T, FormatError>,
) -> Result<Vec<T>, FormatError> {
    let count = usize::from(r.u16()?);
    if count > BATCH_ITEMS_MAX {
        return Err(r.range("batch count", count as u64));
    }
    let mut items = Vec::with_capacity(count);
    for _ in 0..count {
        let type_byte = r.u8()?;
        let kind =
            MessageType::from_u8(type_byte).ok_or(r.range("item type", u64::from(type_byte)))?;
        let len = r.u32()? as usize;
        let mut item = Reader::new(r.bytes(len)?, "batch item");
        items.push(one(kind, &mut item)?);
        item.finish()?;
    }
    Ok(items)
}

impl Reply {
    /// The frame (or batch item) type of this reply to a `request` request.
    pub fn wire_kind(&self, request: MessageType) -> MessageType {
        match self {
            Self::Error { .. } => MessageType::Error,
            _ => request,
        }
    }

    /// A canonical request type whose reply has this reply's shape; used
    /// for batch reply items.
    pub fn shape_kind(&self) -> MessageType {
        match self {
            Self::Challenge(_) => MessageType::Hello,
            Self::Welcome(_) => MessageType::Login,
            Self::Version(_) => MessageType::Update,
            Self::Value(_) => MessageType::Fetch,
            Self::Keys { .. } => MessageType::ListDkeys,
            Self::Values { .. } => MessageType::ListValues,
            Self::Objects { .. } => MessageType::ListObjects,
            Self::Verified(_) => MessageType::Verify,
            Self::Cond { .. } => MessageType::CondUpdate,
            Self::Data(_) => MessageType::RegionRead,
            Self::Placed(_) => MessageType::BulkRead,
            Self::Extents(_) => MessageType::ExtentList,
            Self::Batch(_) => MessageType::Batch,
            Self::Stat(_) => MessageType::Stat,
            Self::Synced => MessageType::Sync,
            Self::Error { .. } => MessageType::Error,
        }
    }

    /// An error reply.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Error {
            code,
            message: message.into(),
        }
    }

    /// Appends the body (no frame header) to `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            Self::Challenge(c) => c.encode_into(out),
            Self::Welcome(w) => w.encode_into(out),
            Self::Version(v) => out.put_u64(*v),
            Self::Value(None) => out.put_u8(0),
            Self::Value(Some(f)) => {
                out.put_u8(1);
                out.put_u64(f.version);
                put_blob(out, &f.value);
            }
            Self::Keys { keys, more } => {
                out.put_u32(len_u32(keys.len()));
                out.put_u8(u8::from(*more));
                for k in keys {
                    out.put_u16(len_u16(k.len()));
                    out.put_bytes(k);
                }
            }
            Self::Values { entries, more } => put_values(out, entries, *more),
            Self::Cond { applied, version } => {
                out.put_u8(u8::from(*applied));
                out.put_u64(*version);
            }
            Self::Objects { objects, more } => {
                out.put_u32(len_u32(objects.len()));
                out.put_u8(u8::from(*more));
                for o in objects {
                    out.put_u128(*o);
                }
            }
            Self::Verified(v) => put_verified(out, v),
            Self::Data(d) => put_blob(out, d),
            Self::Placed(p) => put_placed(out, p),
            Self::Extents(l) => put_extents(out, l),
            Self::Batch(items) => {
                out.put_u16(len_u16(items.len()));
                for item in items {
                    put_item(out, item.shape_kind(), |o| item.encode_body(o));
                }
            }
            Self::Stat(targets) => encode_stat(out, targets),
            Self::Synced => {}
            Self::Error { code, message } => {
                let message = utf8_prefix(message, MESSAGE_BYTES_MAX);
                out.put_u16(*code as u16);
                out.put_u16(len_u16(message.len()));
                out.put_bytes(message.as_bytes());
            }
        }
    }

    /// Decodes exactly one reply body carried by a frame of type `kind`.
    pub fn decode_body(kind: MessageType, body: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(body, "reply body");
        let reply = Self::decode_from(kind, &mut r)?;
        r.finish()?;
        Ok(reply)
    }

    fn decode_from(kind: MessageType, r: &mut Reader<'_>) -> Result<Self, FormatError> {
        use MessageType as T;
        Ok(match kind {
            T::Hello => Self::Challenge(Challenge::decode_from(r)?),
            T::Login => Self::Welcome(Welcome::decode_from(r)?),
            T::Update | T::Punch | T::ExtentWrite | T::BulkWrite => Self::Version(r.u64()?),
            T::BulkRead => Self::Placed(get_placed(r)?),
            T::ExtentList => Self::Extents(get_extents(r)?),
            T::Fetch | T::ExtentRead => match get_bool(r, "found")? {
                false => Self::Value(None),
                true => Self::Value(Some(Found {
                    version: r.u64()?,
                    value: get_blob(r, VALUE_MAX_BYTES, "value_len")?,
                })),
            },
            T::ListDkeys | T::ListAkeys => {
                let (keys, more) = get_list(r, "key count", |r| {
                    let len = usize::from(r.u16()?);
                    r.vec(len, KEY_PART_MAX_BYTES, "key_len")
                })?;
                Self::Keys { keys, more }
            }
            T::ListValues => {
                let (entries, more) = get_values(r)?;
                Self::Values { entries, more }
            }
            T::CondUpdate => Self::Cond {
                applied: get_bool(r, "applied")?,
                version: r.u64()?,
            },
            T::ListObjects => {
                let (objects, more) = get_list(r, "object count", |r| r.u128())?;
                Self::Objects { objects, more }
            }
            T::Verify => Self::Verified(get_verified(r)?),
            T::RegionRead => Self::Data(get_blob(r, READ_BYTES_MAX, "data_len")?),
            T::Batch => Self::Batch(decode_items(r, |k, r| {
                if k != T::Error && !k.is_batchable() {
                    return Err(r.range("batch item type", k as u64));
                }
                Self::decode_from(k, r)
            })?),
            T::Stat => Self::Stat(decode_stat(r)?),
            T::Sync => Self::Synced,
            T::Error => {
                let code = ErrorCode::from_u16(r.u16()?);
                let len = usize::from(r.u16()?);
                let msg = r.vec(len, MESSAGE_BYTES_MAX, "message_len")?;
                Self::Error {
                    code,
                    message: String::from_utf8_lossy(&msg).into_owned(),
                }
            }
        })
    }
}

/// The longest prefix of `s` of at most `max` bytes that is still UTF-8.
fn utf8_prefix(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn encode_stat(out: &mut Vec<u8>, targets: &[TargetStat]) {
    out.put_u16(len_u16(targets.len()));
    for t in targets {
        out.put_u16(t.target);
        out.put_u16(len_u16(t.counters.len()));
        for (name, value) in &t.counters {
            let name = utf8_prefix(name, usize::from(u8::MAX));
            out.put_u8(name.len() as u8);
            out.put_bytes(name.as_bytes());
            out.put_u64(*value);
        }
    }
}

fn decode_stat(r: &mut Reader<'_>) -> Result<Vec<TargetStat>, FormatError> {
    let count = usize::from(r.u16()?);
    if count > TARGETS_MAX {
        return Err(r.range("target count", count as u64));
    }
    let mut targets = Vec::with_capacity(count);
    for _ in 0..count {
        let target = r.u16()?;
        let n = usize::from(r.u16()?);
        if n > STAT_COUNTERS_MAX {
            return Err(r.range("counter count", n as u64));
        }
        let mut counters = Vec::with_capacity(n);
        for _ in 0..n {
            let len = usize::from(r.u8()?);
            let name = String::from_utf8(r.bytes(len)?.to_vec())
                .map_err(|_| r.range("counter name (utf-8)", len as u64))?;
            counters.push((name, r.u64()?));
        }
        targets.push(TargetStat { target, counters });
    }
    Ok(targets)
}
