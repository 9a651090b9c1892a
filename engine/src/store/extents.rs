//! A byte array's extent map for a one-sided reader (the ExtentList
//! request): which log record holds each live piece, and which record was
//! the array's newest when the map was taken.
//!
//! The directory and the buckets are published together on this xstream
//! (nothing awaits in between), so the map answered here is the one the
//! key's bucket slot stands for: while a client sees that slot still point
//! at `newest_addr`, the map holds (log addresses are never reused; every
//! write, punch or cleaner move of the newest record changes the slot).

use super::dir::{pieces_in, Entry, ExtentMap};
use super::{Store, StoreError};
use crate::store::error::Result;
use ferrite_proto::key::RecordKey;
use ferrite_proto::rpc::{ExtentList, ExtentSpan, EXTENT_PIECES_MAX};

impl Store {
    /// The extent map of the key's byte array, at most
    /// [`EXTENT_PIECES_MAX`] pieces (a longer one is cut, `covered_end`
    /// saying where); `None` if the key is absent.
    pub fn extent_list(&self, key: &RecordKey<'_>) -> Result<Option<ExtentList>> {
        Self::validate(key, 0)?;
        self.with_array(key, list_of)
    }

    /// `f` of the key's directory entry and extent map; `None` if the key
    /// is absent, an error if it holds a single value.
    pub(super) fn with_array<T>(
        &self,
        key: &RecordKey<'_>,
        f: impl FnOnce(&Entry, &ExtentMap) -> T,
    ) -> Result<Option<T>> {
        let dir = self.dir.borrow();
        let Some(e) = dir.get((key.container, key.object), key.dkey, key.akey) else {
            return Ok(None);
        };
        match &e.extents {
            Some(map) => Ok(Some(f(&e, map))),
            None => Err(StoreError::WrongKind {
                holds: "single value",
                wanted: "byte array",
            }),
        }
    }
}

/// The list of entry `e`'s extent `map`, cut at [`EXTENT_PIECES_MAX`].
fn list_of(e: &Entry, map: &ExtentMap) -> ExtentList {
    let all = pieces_in(map, 0, u64::MAX);
    let covered_end = match all.get(EXTENT_PIECES_MAX) {
        Some((first_out, _)) => *first_out,
        None => u64::MAX,
    };
    let pieces = all
        .into_iter()
        .take(EXTENT_PIECES_MAX)
        .map(|(start, p)| ExtentSpan {
            start,
            end: p.end,
            rec_addr: p.rec_addr,
            rec_len: p.rec_len,
        })
        .collect();
    ExtentList {
        version: e.version,
        newest_addr: e.addr,
        newest_len: e.len,
        covered_end,
        pieces,
    }
}
