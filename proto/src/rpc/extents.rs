//! The `extents` reply of an ExtentList request: where each piece of a byte
//! array lies in the target's log, so that a client on one host can read
//! the pieces one-sided (layout in `FORMAT.md`).
//!
//! A byte array is a key whose extent records each hold some bytes of it;
//! the target's directory maps every live piece `[start, end)` of the array
//! to the record that holds it. The bucket slot of the key points only at
//! the newest record, so a piece held by an older record (ior-hard's
//! interleaved writers leave ~22 per 1 MiB chunk) cannot be found through
//! the buckets. The list says where it is, and which record was the newest
//! when it was made: as long as the key's slot still points at that record
//! (log addresses are never reused), no write changed the array since, and
//! the list is still the array's map.

use super::codec::{Put, Reader};
use crate::FormatError;

/// Most pieces one `extents` reply carries; a longer map is cut there
/// (see [`ExtentList::covered_end`]).
pub const EXTENT_PIECES_MAX: usize = 4096;
/// Bytes of the `extents` body before its pieces: found u8, version u64,
/// newest_addr u64, newest_len u32, covered_end u64, count u32.
pub const EXTENTS_FIXED_BYTES: usize = 1 + 8 + 8 + 4 + 8 + 4;
const _: () = assert!(EXTENTS_FIXED_BYTES == 33);
/// Bytes of one piece: start u64, end u64, rec_addr u64, rec_len u32.
pub const EXTENT_PIECE_BYTES: usize = 8 + 8 + 8 + 4;
const _: () = assert!(EXTENT_PIECE_BYTES == 28);

/// Bytes `[start, end)` of the array are those of the extent record at log
/// address `rec_addr`, `rec_len` bytes long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentSpan {
    pub start: u64,
    pub end: u64,
    pub rec_addr: u64,
    pub rec_len: u32,
}

/// A byte array's extent map as its target published it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentList {
    /// The array's version (its newest record's).
    pub version: u64,
    /// Log address and length of the newest record: the one the key's
    /// bucket slot points at while the map holds.
    pub newest_addr: u64,
    pub newest_len: u32,
    /// The pieces describe every byte of `[0, covered_end)` (bytes in no
    /// piece are holes); `u64::MAX` when the map was not cut.
    pub covered_end: u64,
    /// In order, non-empty, not overlapping.
    pub pieces: Vec<ExtentSpan>,
}

pub(super) fn put_extents(out: &mut Vec<u8>, list: &Option<ExtentList>) {
    let Some(l) = list else {
        out.put_u8(0);
        out.put_bytes(&[0; EXTENTS_FIXED_BYTES - 1]);
        return;
    };
    out.put_u8(1);
    out.put_u64(l.version);
    out.put_u64(l.newest_addr);
    out.put_u32(l.newest_len);
    // A longer map is cut before its first piece left out, so that what
    // is sent still describes every byte it covers.
    let covered_end = match l.pieces.get(EXTENT_PIECES_MAX) {
        Some(first_out) => l.covered_end.min(first_out.start),
        None => l.covered_end,
    };
    out.put_u64(covered_end);
    let pieces = &l.pieces[..l.pieces.len().min(EXTENT_PIECES_MAX)];
    out.put_u32(pieces.len() as u32);
    for p in pieces {
        out.put_u64(p.start);
        out.put_u64(p.end);
        out.put_u64(p.rec_addr);
        out.put_u32(p.rec_len);
    }
}

/// Decodes an `extents` body: at most [`EXTENT_PIECES_MAX`] pieces, each
/// non-empty and after the one before, none past `covered_end`; every
/// field 0 when not found.
pub(super) fn get_extents(r: &mut Reader<'_>) -> Result<Option<ExtentList>, FormatError> {
    let found = match r.u8()? {
        0 => false,
        1 => true,
        v => return Err(r.range("found", u64::from(v))),
    };
    let version = r.u64()?;
    let newest_addr = r.u64()?;
    let newest_len = r.u32()?;
    let covered_end = r.u64()?;
    let count = r.u32()? as usize;
    if !found {
        let any = version | newest_addr | u64::from(newest_len) | covered_end | count as u64;
        return match any {
            0 => Ok(None),
            v => Err(r.range("extents fields (not found)", v)),
        };
    }
    if count > EXTENT_PIECES_MAX {
        return Err(r.range("piece count", count as u64));
    }
    let mut pieces = Vec::with_capacity(count);
    let mut done = 0u64;
    for _ in 0..count {
        let p = ExtentSpan {
            start: r.u64()?,
            end: r.u64()?,
            rec_addr: r.u64()?,
            rec_len: r.u32()?,
        };
        if p.start < done || p.end <= p.start || p.end > covered_end {
            return Err(r.range("piece start", p.start));
        }
        done = p.end;
        pieces.push(p);
    }
    Ok(Some(ExtentList {
        version,
        newest_addr,
        newest_len,
        covered_end,
        pieces,
    }))
}
