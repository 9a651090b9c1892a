//! The key directory: every live key of the target, sorted, in DRAM.
//!
//! It answers listings (sorted, paged), conditional updates (full version
//! without I/O), the cleaner's liveness question (does the key still point at
//! this record?) and is what a checkpoint serialises. Byte arrays keep their
//! extent map here: non-overlapping pieces, each naming the record that holds
//! the newest bytes of its range.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use blocks::Blocks;
use fence::Fence;

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

/// A removed key: dkey, akey, entry.
pub type Removed = (Box<[u8]>, Box<[u8]>, Entry);

/// Bytes of the object part of a composite key: container and object, big
/// endian, so that byte order is numeric order.
const OBJ_BYTES: usize = 24;
/// Record address bytes in an entry (log addresses are 48-bit).
const ADDR_BYTES: usize = 6;
/// Low bits of an entry's `length code` (see [`Directory`]): the entry is a
/// byte array (a piece count and pieces follow) ...
const CODE_ARRAY: u64 = 1;
/// ... the record length is stored whole (else in units of 8: record lengths
/// are multiples of 8, so a 64-byte value's record takes one byte).
const CODE_UNALIGNED: u64 = 2;
const CODE_SHIFT: u32 = 2;
/// Extent piece: start (8), end (8), record address (6), record length (4).
const PIECE_BYTES: usize = 26;
/// A block is split in two once it grows past this many bytes.
const BLOCK_MAX_BYTES: usize = 1024;
const ADDR_LIMIT: u64 = 1 << 48;

fn put_varint(out: &mut Vec<u8>, v: usize) {
    put_varint64(out, v as u64);
}

fn put_varint64(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
fn get_varint(b: &[u8], pos: &mut usize) -> usize {
    get_varint64(b, pos) as usize
}

/// Most varints a search reads (shared lengths, suffix lengths, length
/// codes) are one byte: that case is inlined, longer ones take the loop.
#[inline]
fn get_varint64(b: &[u8], pos: &mut usize) -> u64 {
    let first = b[*pos];
    if first < 0x80 {
        *pos += 1;
        return u64::from(first);
    }
    get_varint64_long(b, pos)
}

#[inline(never)]
fn get_varint64_long(b: &[u8], pos: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let byte = b[*pos];
        *pos += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return v;
        }
        shift += 7;
    }
}

fn put_addr(out: &mut Vec<u8>, addr: u64) {
    assert!(addr < ADDR_LIMIT, "log address {addr} exceeds 48 bits");
    out.extend_from_slice(&addr.to_le_bytes()[..6]);
}

fn le(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(w)
}

/// An entry's value part: version, record pointer, extent pieces.
fn encode_tail(out: &mut Vec<u8>, e: &Entry) {
    put_varint64(out, e.version);
    put_addr(out, e.addr);
    let len = u64::from(e.len);
    let mut code = match len % 8 {
        0 => (len / 8) << CODE_SHIFT,
        _ => len << CODE_SHIFT | CODE_UNALIGNED,
    };
    if e.extents.is_some() {
        code |= CODE_ARRAY;
    }
    put_varint64(out, code);
    if let Some(m) = &e.extents {
        put_varint(out, m.len());
        for (start, p) in m.iter() {
            out.extend_from_slice(&start.to_le_bytes());
            out.extend_from_slice(&p.end.to_le_bytes());
            put_addr(out, p.rec_addr);
            out.extend_from_slice(&p.rec_len.to_le_bytes());
        }
    }
}

/// The parts of an entry's value bytes at `b[pos..]`: version, record
/// address, length code, piece count, and the offset of the first piece.
fn read_tail(b: &[u8], mut pos: usize) -> (u64, u64, u64, usize, usize) {
    let version = get_varint64(b, &mut pos);
    let addr = le(&b[pos..pos + ADDR_BYTES]);
    pos += ADDR_BYTES;
    let code = get_varint64(b, &mut pos);
    let pieces = match code & CODE_ARRAY {
        0 => 0,
        _ => get_varint(b, &mut pos),
    };
    (version, addr, code, pieces, pos)
}

/// Where the entry whose value bytes start at `b[pos..]` ends (skips what
/// [`read_tail`] decodes: a scan passes most entries without their values).
#[inline]
fn tail_end(b: &[u8], mut pos: usize) -> usize {
    while b[pos] >= 0x80 {
        pos += 1;
    }
    pos += 1 + ADDR_BYTES;
    let code = get_varint64(b, &mut pos);
    if code & CODE_ARRAY == 0 {
        return pos;
    }
    let pieces = get_varint(b, &mut pos);
    pos + pieces * PIECE_BYTES
}

fn decode_tail(b: &[u8]) -> Entry {
    let (version, addr, code, pieces, pos) = read_tail(b, 0);
    let len = match code & CODE_UNALIGNED {
        0 => (code >> CODE_SHIFT) * 8,
        _ => code >> CODE_SHIFT,
    };
    let extents = (code & CODE_ARRAY != 0).then(|| {
        let mut m = ExtentMap::new();
        for p in b[pos..].chunks_exact(PIECE_BYTES).take(pieces) {
            let piece = Piece {
                end: le(&p[8..16]),
                rec_addr: le(&p[16..22]),
                rec_len: le(&p[22..26]) as u32,
            };
            m.insert(le(&p[..8]), piece);
        }
        Box::new(m)
    });
    Entry {
        version,
        addr,
        len: len as u32,
        extents,
    }
}

/// A key as the directory orders it: object, then dkey, then akey.
#[derive(Clone, Copy)]
struct Key<'a> {
    obj: [u8; OBJ_BYTES],
    dkey: &'a [u8],
    akey: &'a [u8],
}

impl<'a> Key<'a> {
    fn new(obj: ObjectId, dkey: &'a [u8], akey: &'a [u8]) -> Self {
        let mut o = [0u8; OBJ_BYTES];
        o[..8].copy_from_slice(&obj.0.to_be_bytes());
        o[8..].copy_from_slice(&obj.1.to_be_bytes());
        Self { obj: o, dkey, akey }
    }

    /// The composite bytes `object ‖ dkey ‖ akey` and the dkey length.
    fn composite(&self) -> (Vec<u8>, usize) {
        let mut c = Vec::with_capacity(OBJ_BYTES + self.dkey.len() + self.akey.len());
        c.extend_from_slice(&self.obj);
        c.extend_from_slice(self.dkey);
        c.extend_from_slice(self.akey);
        (c, self.dkey.len())
    }

    /// Orders this key against a stored composite key.
    fn cmp_stored(&self, c: &[u8], dkey_len: usize) -> Ordering {
        let d = OBJ_BYTES + dkey_len;
        self.obj[..]
            .cmp(&c[..OBJ_BYTES])
            .then_with(|| self.dkey.cmp(&c[OBJ_BYTES..d]))
            .then_with(|| self.akey.cmp(&c[d..]))
    }
}

fn object_of(c: &[u8]) -> ObjectId {
    let mut container = [0u8; 8];
    let mut object = [0u8; 16];
    container.copy_from_slice(&c[..8]);
    object.copy_from_slice(&c[8..OBJ_BYTES]);
    (u64::from_be_bytes(container), u128::from_be_bytes(object))
}

/// The entry before a position: its composite key and dkey length (`None`
/// at a block's start).
type Prev<'a> = (&'a [u8], Option<usize>);

/// Appends one entry, front-coded against the previous one: the dkey length
/// is written only when it differs from the previous entry's.
fn encode_entry(out: &mut Vec<u8>, prev: Prev<'_>, key: &[u8], dkey_len: usize, tail: &[u8]) {
    let shared = prev.0.iter().zip(key).take_while(|(a, b)| a == b).count();
    put_header(out, shared, key.len(), prev.1, dkey_len);
    out.extend_from_slice(&key[shared..]);
    out.extend_from_slice(tail);
}

/// An entry's header: shared bytes, suffix length and explicit-dkey flag,
/// and the dkey length when it differs from the entry before's.
pub(super) fn put_header(
    out: &mut Vec<u8>,
    shared: usize,
    key_len: usize,
    prev_dkey: Option<usize>,
    dk: usize,
) {
    let explicit = prev_dkey != Some(dk);
    put_varint(out, shared);
    put_varint(out, (key_len - shared) << 1 | usize::from(explicit));
    if explicit {
        put_varint(out, dk);
    }
}

/// Where one entry sits in its block.
#[derive(Debug, Clone, Copy)]
struct Raw {
    start: usize,
    tail: usize,
    end: usize,
    dkey_len: usize,
}

/// Walks a block's entries in order, rebuilding each composite key.
struct Scan<'a> {
    bytes: &'a [u8],
    pos: usize,
    key: Vec<u8>,
    /// Dkey length of the entry last read.
    dkey_len: Option<usize>,
}

impl<'a> Scan<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            pos: 0,
            key: Vec::with_capacity(64),
            dkey_len: None,
        }
    }

    fn next_entry(&mut self) -> Option<Raw> {
        let b = self.bytes;
        if self.pos >= b.len() {
            return None;
        }
        let start = self.pos;
        let mut p = start;
        let shared = get_varint(b, &mut p);
        let head = get_varint(b, &mut p);
        let (suffix, explicit) = (head >> 1, head & 1 == 1);
        let dkey_len = match (explicit, self.dkey_len) {
            (false, Some(d)) => d,
            _ => get_varint(b, &mut p),
        };
        self.key.truncate(shared);
        self.key.extend_from_slice(&b[p..p + suffix]);
        self.dkey_len = Some(dkey_len);
        let tail = p + suffix;
        let end = tail_end(b, tail);
        self.pos = end;
        Some(Raw {
            start,
            tail,
            end,
            dkey_len,
        })
    }
}

/// The first key of a block (stored whole: it shares nothing).
fn first_key(b: &[u8]) -> (&[u8], usize) {
    let mut p = 0;
    let _shared = get_varint(b, &mut p);
    let len = get_varint(b, &mut p) >> 1;
    let dkey_len = get_varint(b, &mut p);
    (&b[p..p + len], dkey_len)
}

/// Where a key is, or would go, in its block.
struct Seek {
    block: usize,
    /// Composite key of the entry before the position (empty at a block's
    /// start) and its dkey length.
    prev: Vec<u8>,
    prev_dkey_len: Option<usize>,
    /// The first entry at or after the key, its composite key, and whether
    /// it is the key itself.
    at: Option<(Raw, Vec<u8>, bool)>,
}

/// The key directory: every live key in sorted order, packed.
///
/// Entries live in blocks of about a kilobyte, each a byte string of
/// entries in key order, front-coded. An entry (all varints LEB128, 7 bits
/// a byte):
///
/// | part | bytes | meaning |
/// |---|---|---|
/// | `shared` | varint | bytes shared with the previous entry's composite key `object ‖ dkey ‖ akey`: all it shares when written, or fewer once a key is inserted before it (0 for a block's first entry) |
/// | `head` | varint | `suffix_len << 1 \| explicit` |
/// | `dkey_len` | varint | only if `explicit` (always for a block's first entry): else the previous entry's |
/// | suffix | `suffix_len` | the composite key's bytes after `shared` |
/// | version | varint | the key's full version |
/// | address | 6 | record log address, little endian (48 bits) |
/// | `code` | varint | `length << 2 \| unaligned << 1 \| array`, `length` in units of 8 bytes unless `unaligned` |
/// | `pieces` | varint | only if `array`: the extent map's piece count n |
/// | pieces | 26 × n | start u64, end u64, record address 48 bits, record length u32 |
///
/// Blocks are kept in key order in runs of a few hundred ([`blocks`]), and
/// found by binary search on their fences (fixed-size summaries of their
/// first keys). No per-key
/// allocation: a single value costs its front-coded suffix plus 2 (`shared`
/// and `head`), the version (3 bytes below 2^21, 4 below 2^28), 6 and 1
/// (records below 256 bytes), and its share of its block's fence, first key
/// and allocation (about 3 bytes at 1 KiB blocks). This layout lives only in DRAM: checkpoints write entries in
/// their own format (`engine/FORMAT.md`, "Checkpoint areas").
#[derive(Default)]
pub struct Directory {
    blocks: Blocks,
    keys: usize,
    /// See [`Directory::checkpoint_bytes`] (`dir/size.rs`).
    checkpoint_bytes: u64,
}

impl Directory {
    pub fn len(&self) -> usize {
        self.keys
    }

    /// Index of the block that holds (or would hold) `k`: the last block
    /// whose first key is at most `k`.
    fn block_for(&self, k: &Key<'_>) -> usize {
        let fk = Fence::new(&k.obj, k.dkey, k.akey);
        self.blocks.search(|fence, block| match fence.cmp(&fk) {
            Ordering::Less => true,
            Ordering::Greater => false,
            Ordering::Equal => {
                let (c, dl) = first_key(block);
                k.cmp_stored(c, dl) != Ordering::Less
            }
        })
    }

    fn seek(&self, k: &Key<'_>) -> Seek {
        self.seek_in(self.block_for(k), k)
    }

    /// [`seek`](Self::seek) in `block`, which [`block_for`](Self::block_for)
    /// gave for `k`.
    fn seek_in(&self, block: usize, k: &Key<'_>) -> Seek {
        let mut s = Seek {
            block,
            prev: Vec::new(),
            prev_dkey_len: None,
            at: None,
        };
        let Some(bytes) = self.blocks.get(block) else {
            return s;
        };
        let mut scan = Scan::new(bytes);
        while let Some(raw) = scan.next_entry() {
            match k.cmp_stored(&scan.key, raw.dkey_len) {
                Ordering::Greater => {
                    s.prev.clear();
                    s.prev.extend_from_slice(&scan.key);
                    s.prev_dkey_len = Some(raw.dkey_len);
                }
                o => {
                    s.at = Some((raw, scan.key, o == Ordering::Equal));
                    return s;
                }
            }
        }
        s
    }

    pub fn get(&self, obj: ObjectId, dkey: &[u8], akey: &[u8]) -> Option<Entry> {
        let (block, raw) = self.find(&Key::new(obj, dkey, akey))?;
        Some(decode_tail(&self.blocks[block][raw.tail..raw.end]))
    }

    /// Inserts or replaces; returns the previous entry.
    pub fn put(&mut self, obj: ObjectId, dkey: &[u8], akey: &[u8], e: Entry) -> Option<Entry> {
        self.upsert(obj, dkey, akey, |old| (Some(e), old))
    }

    /// Calls `change` with the key's entry (`None` if absent) and stores
    /// the entry it returns (`None`: nothing changes), with one block
    /// search where a `get` then a `put` take two (three for a new key).
    pub fn upsert<T>(
        &mut self,
        obj: ObjectId,
        dkey: &[u8],
        akey: &[u8],
        change: impl FnOnce(Option<Entry>) -> (Option<Entry>, T),
    ) -> T {
        let k = Key::new(obj, dkey, akey);
        let block = self.block_for(&k);
        let gap = match self.find_or_gap(block, &k) {
            Ok(raw) => {
                let old = decode_tail(&self.blocks[block][raw.tail..raw.end]);
                let before = Self::entry_size(dkey, akey, Some(&old));
                let (new, out) = change(Some(old));
                if let Some(e) = new {
                    self.checkpoint_bytes -= before;
                    self.account(dkey, akey, None, Some(&e));
                    let mut tail = Vec::with_capacity(32);
                    encode_tail(&mut tail, &e);
                    self.set_tail(block, &raw, &tail);
                }
                return out;
            }
            Err(gap) => gap,
        };
        let (new, out) = change(None);
        if let Some(e) = new {
            self.account(dkey, akey, None, Some(&e));
            self.insert_in_gap(block, &k, &e, &gap);
        }
        out
    }

    /// Inserts `k`, absent from the directory, into `block` at `gap` (from
    /// [`find_or_gap`](Self::find_or_gap)) without a second pass over the
    /// block; else as [`insert_new`](Self::insert_new) does.
    fn insert_in_gap(&mut self, block: usize, k: &Key<'_>, e: &Entry, gap: &find::Gap) {
        if self.blocks.is_empty() {
            return self.insert_new(block, k, e);
        }
        let mut tail = Vec::with_capacity(32);
        encode_tail(&mut tail, e);
        let dk = k.dkey.len();
        let bytes = &self.blocks[block];
        match k.with_composite(|kc| gap.insert(bytes, kc, dk, &tail)) {
            Some(b) => {
                self.replace_block(block, b);
                self.keys += 1;
            }
            None => self.insert_new(block, k, e),
        }
    }

    /// Inserts `k`, absent from the directory, into `block` (from
    /// [`block_for`](Self::block_for)): its neighbours are re-encoded
    /// around it.
    fn insert_new(&mut self, block: usize, k: &Key<'_>, e: &Entry) {
        let mut tail = Vec::with_capacity(32);
        encode_tail(&mut tail, e);
        let (c, dl) = k.composite();
        if self.blocks.is_empty() {
            let mut b = Vec::new();
            encode_entry(&mut b, (&[], None), &c, dl, &tail);
            self.blocks.insert(0, b.into_boxed_slice());
            self.keys += 1;
            return;
        }
        let s = self.seek_in(block, k);
        let bytes = &self.blocks[s.block];
        let mut b = Vec::with_capacity(bytes.len() + c.len() + tail.len() + 8);
        match &s.at {
            Some((next, next_key, _)) => {
                b.extend_from_slice(&bytes[..next.start]);
                encode_entry(&mut b, (&s.prev, s.prev_dkey_len), &c, dl, &tail);
                let next_tail = &bytes[next.tail..next.end];
                encode_entry(&mut b, (&c, Some(dl)), next_key, next.dkey_len, next_tail);
                b.extend_from_slice(&bytes[next.end..]);
            }
            None => {
                b.extend_from_slice(bytes);
                encode_entry(&mut b, (&s.prev, s.prev_dkey_len), &c, dl, &tail);
            }
        }
        self.replace_block(s.block, b);
        self.keys += 1;
    }

    /// Replaces the entry of an existing key with `e` only if `still(old)`
    /// holds of the entry there: one seek where a `get` and a `put` take
    /// two. Returns the replaced entry; `None` (nothing changed) if the key
    /// is absent or `still` refused.
    pub fn replace_if(
        &mut self,
        obj: ObjectId,
        dkey: &[u8],
        akey: &[u8],
        e: &Entry,
        still: impl FnOnce(&Entry) -> bool,
    ) -> Option<Entry> {
        let (block, raw) = self.find(&Key::new(obj, dkey, akey))?;
        let old = decode_tail(&self.blocks[block][raw.tail..raw.end]);
        if !still(&old) {
            return None;
        }
        self.account(dkey, akey, Some(&old), Some(e));
        let mut tail = Vec::with_capacity(32);
        encode_tail(&mut tail, e);
        self.set_tail(block, &raw, &tail);
        Some(old)
    }

    /// Writes `tail` as the value part of the entry `raw` of block `block`
    /// (in place when its length is unchanged).
    fn set_tail(&mut self, block: usize, raw: &Raw, tail: &[u8]) {
        let bytes = &mut self.blocks[block];
        if raw.end - raw.tail == tail.len() {
            bytes[raw.tail..raw.end].copy_from_slice(tail);
            return;
        }
        let mut b = Vec::with_capacity(bytes.len() + tail.len());
        b.extend_from_slice(&bytes[..raw.tail]);
        b.extend_from_slice(tail);
        b.extend_from_slice(&bytes[raw.end..]);
        self.replace_block(block, b);
    }

    /// Stores a rebuilt block, splitting it when it grew too large and
    /// dropping it when empty.
    fn replace_block(&mut self, i: usize, b: Vec<u8>) {
        if b.is_empty() {
            self.blocks.remove(i);
            return;
        }
        if b.len() <= BLOCK_MAX_BYTES {
            self.blocks.set(i, b.into_boxed_slice());
            return;
        }
        let mut scan = Scan::new(&b);
        let _first = scan.next_entry();
        while let Some(raw) = scan.next_entry() {
            if raw.start >= b.len() / 2 || raw.end == b.len() {
                let mut second = Vec::with_capacity(b.len() - raw.start + scan.key.len());
                encode_entry(
                    &mut second,
                    (&[], None),
                    &scan.key,
                    raw.dkey_len,
                    &b[raw.tail..raw.end],
                );
                second.extend_from_slice(&b[raw.end..]);
                self.blocks.set(i, b[..raw.start].into());
                self.blocks.insert(i + 1, second.into_boxed_slice());
                return;
            }
        }
        // One entry larger than a block: it stays alone.
        self.blocks.set(i, b.into_boxed_slice());
    }

    pub fn remove(&mut self, obj: ObjectId, dkey: &[u8], akey: &[u8]) -> Option<Entry> {
        let s = self.seek(&Key::new(obj, dkey, akey));
        let Some((raw, key, true)) = s.at else {
            return None;
        };
        let bytes = &self.blocks[s.block];
        let old = decode_tail(&bytes[raw.tail..raw.end]);
        let mut scan = Scan {
            bytes,
            pos: raw.end,
            key,
            dkey_len: Some(raw.dkey_len),
        };
        let mut b = Vec::with_capacity(bytes.len());
        b.extend_from_slice(&bytes[..raw.start]);
        if let Some(next) = scan.next_entry() {
            let next_tail = &bytes[next.tail..next.end];
            let prev = (s.prev.as_slice(), s.prev_dkey_len);
            encode_entry(&mut b, prev, &scan.key, next.dkey_len, next_tail);
            b.extend_from_slice(&bytes[next.end..]);
        }
        self.replace_block(s.block, b);
        self.keys -= 1;
        self.account(dkey, akey, Some(&old), None);
        Some(old)
    }

    /// Calls `visit(object, dkey, akey, tail bytes)` on every entry from
    /// `from` on, in order, while it returns `true`.
    fn walk(&self, from: &Key<'_>, mut visit: impl FnMut(ObjectId, &[u8], &[u8], &[u8]) -> bool) {
        let first = self.block_for(from);
        for bytes in self.blocks.iter_from(first) {
            let mut scan = Scan::new(bytes);
            while let Some(raw) = scan.next_entry() {
                let c = &scan.key;
                if from.cmp_stored(c, raw.dkey_len) == Ordering::Greater {
                    continue;
                }
                let d = OBJ_BYTES + raw.dkey_len;
                let tail = &bytes[raw.tail..raw.end];
                if !visit(object_of(c), &c[OBJ_BYTES..d], &c[d..], tail) {
                    return;
                }
            }
        }
    }

    /// Objects of `container` holding a key, after `after`, sorted by id,
    /// at most `limit`. Seeks past each object found instead of walking
    /// its keys.
    pub fn list_objects(&self, container: u64, after: Option<u128>, limit: usize) -> Vec<u128> {
        let mut out = Vec::new();
        let mut from = match after {
            None => Some(0),
            Some(a) => a.checked_add(1),
        };
        while let Some(object) = from.filter(|_| out.len() < limit) {
            let mut next = None;
            self.walk(&Key::new((container, object), &[], &[]), |o, _, _, _| {
                next = Some(o);
                false
            });
            match next {
                Some((c, o)) if c == container => {
                    out.push(o);
                    from = o.checked_add(1);
                }
                _ => break,
            }
        }
        out
    }

    /// Dkeys of an object after `after`, sorted, at most `limit`.
    pub fn list_dkeys(&self, obj: ObjectId, after: Option<&[u8]>, limit: usize) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = Vec::new();
        if limit == 0 {
            return out;
        }
        self.walk(&Key::new(obj, after.unwrap_or(&[]), &[]), |o, d, _, _| {
            if o != obj {
                return false;
            }
            if Some(d) != after && out.last().is_none_or(|l| l.as_slice() != d) {
                out.push(d.to_vec());
            }
            out.len() < limit
        });
        out
    }

    /// Dkeys of an object that hold `akey`, strictly after `after`, sorted,
    /// at most `limit`, each with its entry for that akey.
    pub fn list_dkeys_holding(
        &self,
        obj: ObjectId,
        akey: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Vec<(Vec<u8>, Entry)> {
        let mut out = Vec::new();
        if limit == 0 {
            return out;
        }
        self.walk(
            &Key::new(obj, after.unwrap_or(&[]), &[]),
            |o, d, a, tail| {
                if o != obj {
                    return false;
                }
                if a == akey && Some(d) != after {
                    out.push((d.to_vec(), decode_tail(tail)));
                }
                out.len() < limit
            },
        );
        out
    }

    /// Akeys of a dkey after `after`, sorted, at most `limit`.
    pub fn list_akeys(
        &self,
        obj: ObjectId,
        dkey: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if limit == 0 {
            return out;
        }
        self.walk(&Key::new(obj, dkey, after.unwrap_or(&[])), |o, d, a, _| {
            if o != obj || d != dkey {
                return false;
            }
            if Some(a) != after {
                out.push(a.to_vec());
            }
            out.len() < limit
        });
        out
    }

    /// Calls `visit(object, dkey, akey, entry)` on every key, in order.
    pub fn for_each(&self, mut visit: impl FnMut(ObjectId, &[u8], &[u8], &Entry)) {
        let from = Key::new((0, 0), &[], &[]);
        self.walk(&from, |o, d, a, tail| {
            visit(o, d, a, &decode_tail(tail));
            true
        });
    }

    /// Heap bytes held: the block and fence vectors and every block's
    /// allocation (malloc rounds to 16 bytes and adds 8 of header).
    pub fn estimated_bytes(&self) -> usize {
        let blocks: usize = (self.blocks.iter_from(0))
            .map(|b| (b.len() + 8).div_ceil(16) * 16)
            .sum();
        blocks + self.blocks.vector_bytes()
    }
}

mod blocks;
mod fence;
mod find;
mod remove;
mod size;
#[cfg(test)]
mod tests;
