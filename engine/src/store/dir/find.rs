//! Finding a key's entry without rebuilding the keys the search passes.
//!
//! A block's entries are front-coded: each shares a prefix with the one
//! before. [`Directory::seek`] rebuilds every composite key it passes (a copy
//! per entry) because an insert needs its neighbours; an exact lookup does
//! not. [`Directory::find`] keeps only `m`, the length of the longest
//! prefix the wanted key shares with the entry just passed, and that
//! entry's byte at `m`. An entry sharing more than `m` bytes with the one
//! before it agrees with it at `m`, so it is ordered against the key by
//! the same bytes and its suffix is never looked at; one sharing at most
//! `m` is compared from where it starts differing.

use std::cmp::Ordering;

use super::{get_varint, put_header, tail_end, Directory, Key, Raw, OBJ_BYTES};

/// Composite keys up to this length are built on the stack.
const STACK_KEY_BYTES: usize = 128;

/// Bytes `a` and `b` share at their start.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Orders the wanted key (composite `kc`, dkey length `dk`) against a
/// stored entry (dkey length `de`) whose composite shares exactly `m` bytes
/// with `kc` and has `e_at_m` at position `m` (`None`: it ends there).
/// Keys order by object, then dkey, then akey: past the object, bytes
/// decide while both are inside their dkeys; a dkey that is a prefix of
/// the other is less; equal dkeys leave it to the akeys' bytes.
fn order(kc: &[u8], dk: usize, m: usize, e_at_m: Option<u8>, de: usize) -> Ordering {
    let bytes = || match (kc.get(m), e_at_m) {
        (Some(k), Some(e)) => k.cmp(&e),
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    };
    if m < OBJ_BYTES + dk.min(de) || dk == de {
        bytes()
    } else {
        dk.cmp(&de)
    }
}

impl Key<'_> {
    /// Calls `with` on this key's composite bytes `object ‖ dkey ‖ akey`,
    /// built on the stack when short.
    pub(super) fn with_composite<T>(&self, with: impl FnOnce(&[u8]) -> T) -> T {
        let len = OBJ_BYTES + self.dkey.len() + self.akey.len();
        if len > STACK_KEY_BYTES {
            return with(&self.composite().0);
        }
        let mut buf = [0u8; STACK_KEY_BYTES];
        let d = OBJ_BYTES + self.dkey.len();
        buf[..OBJ_BYTES].copy_from_slice(&self.obj);
        buf[OBJ_BYTES..d].copy_from_slice(self.dkey);
        buf[d..len].copy_from_slice(self.akey);
        with(&buf[..len])
    }
}

impl Directory {
    /// The block holding `k` and where its entry is in it; `None` if `k`
    /// is not in the directory.
    pub(super) fn find(&self, k: &Key<'_>) -> Option<(usize, Raw)> {
        let block = self.block_for(k);
        Some((block, self.find_in(block, k)?))
    }

    /// [`find`](Self::find) in `block`, which [`Directory::block_for`]
    /// gave for `k`.
    pub(super) fn find_in(&self, block: usize, k: &Key<'_>) -> Option<Raw> {
        self.find_or_gap(block, k).ok()
    }

    /// [`find_in`](Self::find_in), or where in `block` the absent `k`
    /// goes.
    pub(super) fn find_or_gap(&self, block: usize, k: &Key<'_>) -> Result<Raw, Gap> {
        let Some(bytes) = self.blocks.get(block) else {
            return Err(Gap::default());
        };
        let dk = k.dkey.len();
        k.with_composite(|kc| find_in_block(bytes, kc, dk))
    }
}

/// Where an absent key goes in a block: at byte `at`, after an entry (if
/// any) that shares exactly `shared` bytes with it and has dkey length
/// `prev_dkey_len`, and before `next` (if any).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Gap {
    pub at: usize,
    pub shared: usize,
    pub prev_dkey_len: Option<usize>,
    pub next: Option<NextEntry>,
}

/// The entry after a [`Gap`]: it shares `shared` bytes with the entry
/// before it, its suffix is `suffix` of the block's bytes (its tail
/// follows: `(start, end)`), and its dkey is `dkey_len` long.
#[derive(Debug, Clone, Copy)]
pub(super) struct NextEntry {
    pub shared: usize,
    pub suffix: (usize, usize),
    pub dkey_len: usize,
}

impl Gap {
    /// Writes the block `b` with the key `kc` (dkey length `dk`) and its
    /// entry's `tail` inserted here, in one pass over the block: the new
    /// entry shares [`Gap::shared`] bytes with the one before, and the next
    /// entry keeps its shared count and suffix (valid when the key shares at
    /// least as many bytes with the entry before: the next entry's shared
    /// bytes are then the key's too). `None` otherwise (keys order by
    /// object, dkey, akey, and a dkey that is a prefix of another's can put
    /// such a key between two entries): the caller then seeks.
    pub(super) fn insert(&self, b: &[u8], kc: &[u8], dk: usize, tail: &[u8]) -> Option<Vec<u8>> {
        if self.next.is_some_and(|n| n.shared > self.shared) {
            return None;
        }
        let mut out = Vec::with_capacity(b.len() + kc.len() + tail.len() + 8);
        out.extend_from_slice(&b[..self.at]);
        put_header(&mut out, self.shared, kc.len(), self.prev_dkey_len, dk);
        out.extend_from_slice(&kc[self.shared..]);
        out.extend_from_slice(tail);
        if let Some(n) = self.next {
            put_header(
                &mut out,
                n.shared,
                n.suffix.1 - n.suffix.0 + n.shared,
                Some(dk),
                n.dkey_len,
            );
            out.extend_from_slice(&b[n.suffix.0..]);
        }
        Some(out)
    }
}

/// The entry of the key with composite `kc` and dkey length `dk` in the
/// block `b`, or the gap where it goes.
fn find_in_block(b: &[u8], kc: &[u8], dk: usize) -> Result<Raw, Gap> {
    // The entry before the first one shares nothing with the key.
    let (mut m, mut e_at_m) = (0usize, None);
    let mut dkey_len = None;
    let mut pos = 0;
    while pos < b.len() {
        let start = pos;
        let (m_before, dkey_before) = (m, dkey_len);
        let shared = get_varint(b, &mut pos);
        let head = get_varint(b, &mut pos);
        let (suffix_len, explicit) = (head >> 1, head & 1 == 1);
        let de = match (explicit, dkey_len) {
            (false, Some(d)) => d,
            _ => get_varint(b, &mut pos),
        };
        dkey_len = Some(de);
        let tail = pos + suffix_len;
        if shared <= m {
            // Equal to the key up to `shared`: compare from there.
            let suffix = &b[pos..tail];
            let n = common_prefix(&kc[shared..], suffix);
            m = shared + n;
            e_at_m = suffix.get(n).copied();
        }
        let end = tail_end(b, tail);
        match order(kc, dk, m, e_at_m, de) {
            Ordering::Greater => pos = end,
            Ordering::Equal => {
                return Ok(Raw {
                    start,
                    tail,
                    end,
                    dkey_len: de,
                })
            }
            Ordering::Less => {
                return Err(Gap {
                    at: start,
                    shared: m_before,
                    prev_dkey_len: dkey_before,
                    next: Some(NextEntry {
                        shared,
                        suffix: (pos, tail),
                        dkey_len: de,
                    }),
                })
            }
        }
    }
    Err(Gap {
        at: b.len(),
        shared: m,
        prev_dkey_len: dkey_len,
        next: None,
    })
}
