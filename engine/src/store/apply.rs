//! Applying a durable record to the index: the key directory and the bucket
//! slots. Used when publishing a commit and when replaying the log, so both
//! reach the same state from the same records in the same order.

use super::dir::{insert_piece, Entry, ExtentMap, Piece};
use super::format::{get_u128, get_u16, get_u32, get_u64};
use super::{Store, StoreError};
use crate::store::error::Result;
use ferrite_proto::bucket::Slot;
use ferrite_proto::key::{KeyHash, RecordKey};
use ferrite_proto::record::{
    RecordFlags, HEADER_BYTES, OFF_AKEY_LEN, OFF_CONTAINER, OFF_DKEY_LEN, OFF_EXTENT_OFFSET,
    OFF_FLAGS, OFF_OBJECT, OFF_VALUE_LEN, OFF_VERSION,
};

/// A record's header fields and key, read without checking the CRC (for
/// records this store wrote and still holds in its ring, or already checked).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head<'a> {
    pub flags: RecordFlags,
    pub version: u64,
    pub extent_offset: u64,
    pub key: RecordKey<'a>,
    pub value: &'a [u8],
}

impl<'a> Head<'a> {
    /// `None` if the lengths do not fit `b`.
    pub fn peek(b: &'a [u8]) -> Option<Self> {
        if b.len() < HEADER_BYTES {
            return None;
        }
        let dl = usize::from(get_u16(b, OFF_DKEY_LEN));
        let al = usize::from(get_u16(b, OFF_AKEY_LEN));
        let vl = get_u32(b, OFF_VALUE_LEN) as usize;
        let k = HEADER_BYTES;
        if b.len() < k + dl + al + vl {
            return None;
        }
        Some(Self {
            flags: RecordFlags(b[OFF_FLAGS]),
            version: get_u64(b, OFF_VERSION),
            extent_offset: get_u64(b, OFF_EXTENT_OFFSET),
            key: RecordKey::new(
                get_u64(b, OFF_CONTAINER),
                get_u128(b, OFF_OBJECT),
                &b[k..k + dl],
                &b[k + dl..k + dl + al],
            ),
            value: &b[k + dl + al..k + dl + al + vl],
        })
    }
}

fn slot_for(key: &RecordKey<'_>, addr: u64, len: u32, version: u64) -> (u64, Slot) {
    let h = key.hash();
    (
        h.0,
        Slot {
            fingerprint: h.fingerprint(),
            length: len,
            addr,
            version_low: version as u16,
        },
    )
}

impl Store {
    /// Applies the record `bytes` found at log address `addr`. `origin` is set
    /// for the cleaner's copies: they apply only if the key still uses the
    /// record they were copied from.
    pub(crate) fn apply_record(&self, bytes: &[u8], addr: u64, origin: Option<u64>) -> Result<()> {
        let h = Head::peek(bytes).ok_or_else(|| StoreError::Invalid("short record".into()))?;
        let len = bytes.len() as u32;
        let obj = (h.key.container, h.key.object);
        if h.flags.has(RecordFlags::PAD) {
            return Ok(());
        }
        if h.flags.has(RecordFlags::PUNCH_OBJECT) {
            let gone = self.dir.borrow_mut().remove_object(obj);
            for (d, a, e) in gone {
                self.unindex(&RecordKey::new(obj.0, obj.1, &d, &a), &e);
            }
            return Ok(());
        }
        if h.flags.has(RecordFlags::PUNCH_DKEY) {
            let gone = self.dir.borrow_mut().remove_dkey(obj, h.key.dkey);
            for (a, e) in gone {
                self.unindex(&RecordKey::new(obj.0, obj.1, h.key.dkey, &a), &e);
            }
            return Ok(());
        }
        if h.flags.has(RecordFlags::TOMBSTONE) {
            let gone = self.dir.borrow_mut().remove(obj, h.key.dkey, h.key.akey);
            if let Some(e) = gone {
                self.unindex(&h.key, &e);
            }
            return Ok(());
        }
        if h.flags.has(RecordFlags::EXTENT) {
            return self.apply_extent(&h, addr, len, origin);
        }
        self.apply_single(&h, addr, len, origin)
    }

    fn apply_single(&self, h: &Head<'_>, addr: u64, len: u32, origin: Option<u64>) -> Result<()> {
        let obj = (h.key.container, h.key.object);
        let entry = Entry {
            version: h.version,
            addr,
            len,
            extents: None,
        };
        let mut dir = self.dir.borrow_mut();
        let old = match origin {
            // A copy applies only while the key still uses the original:
            // checked and replaced in one seek.
            Some(o) => match dir.replace_if(obj, h.key.dkey, h.key.akey, &entry, |e| e.addr == o) {
                None => return Ok(()),
                old => old,
            },
            None => dir.put(obj, h.key.dkey, h.key.akey, entry),
        };
        drop(dir);
        let (hash, slot) = slot_for(&h.key, addr, len, h.version);
        let mut live = self.live_bytes.get() + u64::from(len);
        self.seg_live(addr, u64::from(len), 0);
        match old {
            Some(old) => {
                live -= old.live_bytes();
                self.seg_live(old.addr, 0, old.live_bytes());
                self.move_slot(hash, slot, old.addr)?;
                self.mark_superseded(old.addr);
            }
            None => self.insert_slot(hash, slot)?,
        }
        self.live_bytes.set(live);
        Ok(())
    }

    fn apply_extent(&self, h: &Head<'_>, addr: u64, len: u32, origin: Option<u64>) -> Result<()> {
        let obj = (h.key.container, h.key.object);
        let piece = Piece {
            end: h.extent_offset + h.value.len() as u64,
            rec_addr: addr,
            rec_len: len,
        };
        let (hash, slot) = slot_for(&h.key, addr, len, h.version);
        // One directory search: the entry is read and rewritten in place.
        let outcome =
            (self.dir.borrow_mut()).upsert(obj, h.key.dkey, h.key.akey, |current| match current {
                Some(mut e) if e.extents.is_some() => {
                    if origin.is_some_and(|o| !e.references(o)) {
                        return (None, ExtentOutcome::Unchanged);
                    }
                    let before = e.live_bytes();
                    let map = e.extents.get_or_insert_with(Default::default);
                    insert_piece(map, h.extent_offset, piece);
                    let old_slot_addr = e.addr;
                    let moves_slot = origin.is_none_or(|o| o == e.addr);
                    if moves_slot {
                        e.addr = addr;
                        e.len = len;
                    }
                    e.version = e.version.max(h.version);
                    let after = e.live_bytes();
                    let moved = moves_slot.then_some(old_slot_addr);
                    (
                        Some(e),
                        ExtentOutcome::Extended {
                            before,
                            after,
                            moved,
                        },
                    )
                }
                _ if origin.is_some() => (None, ExtentOutcome::Unchanged),
                existing => {
                    let had = existing.map(|e| (e.addr, e.live_bytes()));
                    let mut map = ExtentMap::new();
                    insert_piece(&mut map, h.extent_offset, piece);
                    let e = Entry {
                        version: h.version,
                        addr,
                        len,
                        extents: Some(Box::new(map)),
                    };
                    (Some(e), ExtentOutcome::Replaced { had })
                }
            });
        match outcome {
            ExtentOutcome::Unchanged => {}
            ExtentOutcome::Extended {
                before,
                after,
                moved,
            } => {
                self.live_bytes
                    .set((self.live_bytes.get() + after).saturating_sub(before));
                self.seg_live(addr, after, before);
                if let Some(old_slot_addr) = moved {
                    self.move_slot(hash, slot, old_slot_addr)?;
                }
            }
            ExtentOutcome::Replaced { had } => {
                let mut live = self.live_bytes.get() + u64::from(len);
                self.seg_live(addr, u64::from(len), 0);
                match had {
                    Some((old_addr, old_live)) => {
                        live -= old_live;
                        self.seg_live(old_addr, 0, old_live);
                        self.move_slot(hash, slot, old_addr)?;
                        self.mark_superseded(old_addr);
                    }
                    None => self.insert_slot(hash, slot)?,
                }
                self.live_bytes.set(live);
            }
        }
        Ok(())
    }

    fn insert_slot(&self, hash: u64, slot: Slot) -> Result<()> {
        if self.table.borrow_mut().insert(hash, slot) {
            Ok(())
        } else {
            Err(StoreError::IndexFull {
                keys: self.dir.borrow().len(),
            })
        }
    }

    /// Points the slot that held `old_addr` at the new record.
    fn move_slot(&self, hash: u64, slot: Slot, old_addr: u64) -> Result<()> {
        let at = self.table.borrow().locate(hash, slot.fingerprint, old_addr);
        match at {
            Some(at) => {
                self.table.borrow().replace(at, slot);
                Ok(())
            }
            None => self.insert_slot(hash, slot),
        }
    }

    /// Removes a deleted key's slot and marks its record superseded.
    fn unindex(&self, key: &RecordKey<'_>, e: &Entry) {
        let hash = key.hash();
        let fp = KeyHash(hash.0).fingerprint();
        let at = self.table.borrow().locate(hash.0, fp, e.addr);
        if let Some(at) = at {
            self.table.borrow_mut().remove(hash.0, at);
        }
        self.mark_superseded(e.addr);
        self.live_bytes
            .set(self.live_bytes.get().saturating_sub(e.live_bytes()));
        self.seg_live(e.addr, 0, e.live_bytes());
    }

    /// Adjusts the live-byte estimate of the segment holding `addr` (a
    /// byte array's bytes are all counted at its newest record's segment:
    /// the exact figures come with each checkpoint).
    fn seg_live(&self, addr: u64, add: u64, sub: u64) {
        let n = addr / self.geo.segment_bytes;
        let mut log = self.log.borrow_mut();
        log.slots.add_live(n, add);
        log.slots.sub_live(n, sub);
    }
}

impl Store {
    /// Indexes an entry loaded from a checkpoint.
    pub(crate) fn index_loaded(&self, key: &RecordKey<'_>, e: Entry) -> Result<()> {
        let (hash, slot) = slot_for(key, e.addr, e.len, e.version);
        self.live_bytes.set(self.live_bytes.get() + e.live_bytes());
        let old = self
            .dir
            .borrow_mut()
            .put((key.container, key.object), key.dkey, key.akey, e);
        match old {
            Some(old) => self.move_slot(hash, slot, old.addr),
            None => self.insert_slot(hash, slot),
        }
    }
}

/// What applying an extent record did to its key's directory entry.
enum ExtentOutcome {
    /// A relocated piece whose bytes are no longer the key's: nothing.
    Unchanged,
    /// A piece added to the array's map: its live bytes before and after,
    /// and the address the bucket slot moves from (if it moves).
    Extended {
        before: u64,
        after: u64,
        moved: Option<u64>,
    },
    /// A new array (over a single value, `had`: its address and bytes).
    Replaced { had: Option<(u64, u64)> },
}
