//! The key directory: every live key of the target, sorted, in DRAM.
//!
//! It answers listings (sorted, paged), conditional updates (full version
//! without I/O), the cleaner's liveness question (does the key still point at
//! this record?) and is what a checkpoint serialises. Byte arrays keep their
//! extent map here: non-overlapping pieces, each naming the record that holds
//! the newest bytes of its range.

use std::collections::BTreeMap;
use std::ops::Bound;

/// (container, object)
pub type ObjectId = (u64, u128);

/// One piece of a byte array: bytes `start..end` are in the record at
/// `rec_addr` (whose value starts at the record's own extent offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub end: u64,
    pub rec_addr: u64,
    pub rec_len: u32,
}

/// Extent map of a byte array: piece start → piece.
pub type ExtentMap = BTreeMap<u64, Piece>;

/// A live key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub version: u64,
    /// The record the bucket slot points at (for arrays: the newest extent).
    pub addr: u64,
    pub len: u32,
    /// `Some` for byte arrays.
    pub extents: Option<Box<ExtentMap>>,
}

impl Entry {
    pub fn kind_name(&self) -> &'static str {
        if self.extents.is_some() {
            "byte array"
        } else {
            "single value"
        }
    }
    /// Does this key still use the record at `addr`?
    pub fn references(&self, addr: u64) -> bool {
        match &self.extents {
            None => self.addr == addr,
            Some(m) => m.values().any(|p| p.rec_addr == addr),
        }
    }
    /// Bytes of log records this key keeps alive.
    pub fn live_bytes(&self) -> u64 {
        match &self.extents {
            None => u64::from(self.len),
            Some(m) => {
                let mut seen: Vec<u64> = Vec::new();
                let mut total = 0;
                for p in m.values() {
                    if !seen.contains(&p.rec_addr) {
                        seen.push(p.rec_addr);
                        total += u64::from(p.rec_len);
                    }
                }
                total
            }
        }
    }
}

/// Inserts `[start, start+piece)` over whatever was there.
pub fn insert_piece(map: &mut ExtentMap, start: u64, piece: Piece) {
    let (s, e) = (start, piece.end);
    if s >= e {
        return;
    }
    let overlapping: Vec<(u64, Piece)> = map
        .range(..e)
        .rev()
        .take_while(|(_, p)| p.end > s)
        .map(|(k, p)| (*k, *p))
        .collect();
    for (ps, p) in overlapping {
        map.remove(&ps);
        if ps < s {
            map.insert(ps, Piece { end: s, ..p });
        }
        if p.end > e {
            map.insert(e, p);
        }
    }
    map.insert(s, piece);
}

/// Pieces overlapping `[start, end)`, in order.
pub fn pieces_in(map: &ExtentMap, start: u64, end: u64) -> Vec<(u64, Piece)> {
    let first = map
        .range(..=start)
        .next_back()
        .filter(|(_, p)| p.end > start)
        .map(|(k, _)| *k)
        .unwrap_or(start);
    map.range(first..end)
        .filter(|(_, p)| p.end > start)
        .map(|(k, p)| (*k, *p))
        .collect()
}

type Akeys = BTreeMap<Box<[u8]>, Entry>;
type Dkeys = BTreeMap<Box<[u8]>, Akeys>;
/// A removed key: dkey, akey, entry.
pub type Removed = (Box<[u8]>, Box<[u8]>, Entry);

#[derive(Default)]
pub struct Directory {
    objects: BTreeMap<ObjectId, Dkeys>,
    keys: usize,
}

impl Directory {
    pub fn len(&self) -> usize {
        self.keys
    }

    pub fn get(&self, obj: ObjectId, dkey: &[u8], akey: &[u8]) -> Option<&Entry> {
        self.objects.get(&obj)?.get(dkey)?.get(akey)
    }

    pub fn get_mut(&mut self, obj: ObjectId, dkey: &[u8], akey: &[u8]) -> Option<&mut Entry> {
        self.objects.get_mut(&obj)?.get_mut(dkey)?.get_mut(akey)
    }

    /// Inserts or replaces; returns the previous entry.
    pub fn put(&mut self, obj: ObjectId, dkey: &[u8], akey: &[u8], e: Entry) -> Option<Entry> {
        let dk = self.objects.entry(obj).or_default();
        let ak = match dk.get_mut(dkey) {
            Some(a) => a,
            None => dk.entry(dkey.into()).or_default(),
        };
        let old = match ak.get_mut(akey) {
            Some(slot) => Some(std::mem::replace(slot, e)),
            None => {
                ak.insert(akey.into(), e);
                None
            }
        };
        if old.is_none() {
            self.keys += 1;
        }
        old
    }

    pub fn remove(&mut self, obj: ObjectId, dkey: &[u8], akey: &[u8]) -> Option<Entry> {
        let dk = self.objects.get_mut(&obj)?;
        let ak = dk.get_mut(dkey)?;
        let e = ak.remove(akey)?;
        if ak.is_empty() {
            dk.remove(dkey);
        }
        if dk.is_empty() {
            self.objects.remove(&obj);
        }
        self.keys -= 1;
        Some(e)
    }

    /// Removes every akey of a dkey: `(akey, entry)` pairs.
    pub fn remove_dkey(&mut self, obj: ObjectId, dkey: &[u8]) -> Vec<(Box<[u8]>, Entry)> {
        let Some(dk) = self.objects.get_mut(&obj) else {
            return Vec::new();
        };
        let out: Vec<_> = dk
            .remove(dkey)
            .map(|a| a.into_iter().collect())
            .unwrap_or_default();
        if dk.is_empty() {
            self.objects.remove(&obj);
        }
        self.keys -= out.len();
        out
    }

    /// Removes a whole object: `(dkey, akey, entry)` triples.
    pub fn remove_object(&mut self, obj: ObjectId) -> Vec<Removed> {
        let Some(dk) = self.objects.remove(&obj) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (d, ak) in dk {
            for (a, e) in ak {
                out.push((d.clone(), a, e));
            }
        }
        self.keys -= out.len();
        out
    }

    fn page<V>(map: &BTreeMap<Box<[u8]>, V>, after: Option<&[u8]>, limit: usize) -> Vec<Vec<u8>> {
        let lower = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        map.range::<[u8], _>((lower, Bound::Unbounded))
            .take(limit)
            .map(|(k, _)| k.to_vec())
            .collect()
    }

    /// Dkeys of an object after `after`, sorted, at most `limit`.
    pub fn list_dkeys(&self, obj: ObjectId, after: Option<&[u8]>, limit: usize) -> Vec<Vec<u8>> {
        self.objects
            .get(&obj)
            .map(|d| Self::page(d, after, limit))
            .unwrap_or_default()
    }

    /// Akeys of a dkey after `after`, sorted, at most `limit`.
    pub fn list_akeys(
        &self,
        obj: ObjectId,
        dkey: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Vec<Vec<u8>> {
        self.objects
            .get(&obj)
            .and_then(|d| d.get(dkey))
            .map(|a| Self::page(a, after, limit))
            .unwrap_or_default()
    }

    /// Every key, in order: `(object, dkey, akey, entry)`.
    pub fn iter(&self) -> impl Iterator<Item = (ObjectId, &[u8], &[u8], &Entry)> {
        self.objects.iter().flat_map(|(o, dk)| {
            dk.iter()
                .flat_map(move |(d, ak)| ak.iter().map(move |(a, e)| (*o, &d[..], &a[..], e)))
        })
    }

    /// Estimated heap bytes held: map nodes, key copies and extent maps.
    pub fn estimated_bytes(&self) -> usize {
        // A BTreeMap entry costs its key and value plus about a third for
        // node slack and edges; boxed keys cost their allocation (16-byte
        // malloc granules, 16 bytes minimum plus 8 of header).
        fn boxed(len: usize) -> usize {
            (len + 8).div_ceil(16) * 16
        }
        let entry = std::mem::size_of::<(Box<[u8]>, Entry)>() * 4 / 3;
        let mut total = 0;
        for (_, dk) in self.objects.iter() {
            total += std::mem::size_of::<(ObjectId, Dkeys)>() * 4 / 3;
            for (d, ak) in dk {
                total += std::mem::size_of::<(Box<[u8]>, Akeys)>() * 4 / 3 + boxed(d.len());
                for (a, e) in ak {
                    total += entry + boxed(a.len());
                    if let Some(m) = &e.extents {
                        total += 48 + m.len() * std::mem::size_of::<(u64, Piece)>() * 4 / 3;
                    }
                }
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(end: u64, rec: u64) -> Piece {
        Piece {
            end,
            rec_addr: rec,
            rec_len: 100,
        }
    }

    #[test]
    fn newest_extent_wins_and_splits() {
        let mut m = ExtentMap::new();
        insert_piece(&mut m, 0, piece(100, 1));
        insert_piece(&mut m, 40, piece(60, 2));
        insert_piece(&mut m, 90, piece(120, 3));
        let v: Vec<_> = m.iter().map(|(s, p)| (*s, p.end, p.rec_addr)).collect();
        assert_eq!(v, vec![(0, 40, 1), (40, 60, 2), (60, 90, 1), (90, 120, 3)]);
        let inside = pieces_in(&m, 50, 95);
        let got: Vec<_> = inside.iter().map(|(s, p)| (*s, p.rec_addr)).collect();
        assert_eq!(got, vec![(40, 2), (60, 1), (90, 3)]);
        insert_piece(&mut m, 0, piece(200, 4));
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn listing_is_sorted_and_paged() {
        let mut d = Directory::default();
        let e = Entry {
            version: 1,
            addr: 0,
            len: 80,
            extents: None,
        };
        for k in [b"c".as_slice(), b"a", b"b", b"d"] {
            d.put((1, 2), k, b"x", e.clone());
        }
        assert_eq!(
            d.list_dkeys((1, 2), None, 2),
            vec![b"a".to_vec(), b"b".to_vec()]
        );
        assert_eq!(
            d.list_dkeys((1, 2), Some(b"b"), 10),
            vec![b"c".to_vec(), b"d".to_vec()]
        );
        assert_eq!(d.len(), 4);
        assert_eq!(d.remove_object((1, 2)).len(), 4);
        assert_eq!(d.len(), 0);
    }
}
