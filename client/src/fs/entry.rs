//! A directory entry: the value stored under a directory object's dkey
//! (the entry name), akey [`ENTRY_AKEY`]. Layout in `client/FORMAT.md`.

use std::time::{SystemTime, UNIX_EPOCH};

pub const ENTRY_AKEY: &[u8] = b"entry";
pub const ENTRY_FORMAT: u8 = 1;
pub const ENTRY_FIXED_BYTES: usize = 64;
/// Longest symlink target stored.
pub const LINK_MAX_BYTES: usize = 4096;

const OFF_FORMAT: usize = 0;
const OFF_KIND: usize = OFF_FORMAT + 1;
const OFF_RESERVED: usize = OFF_KIND + 1;
const OFF_MODE: usize = OFF_RESERVED + 2;
const OFF_UID: usize = OFF_MODE + 4;
const OFF_GID: usize = OFF_UID + 4;
const OFF_OBJECT: usize = OFF_GID + 4;
const OFF_SIZE: usize = OFF_OBJECT + 16;
const OFF_MTIME: usize = OFF_SIZE + 8;
const OFF_CTIME: usize = OFF_MTIME + 8;
const OFF_CHUNK: usize = OFF_CTIME + 8;
const OFF_LINK_LEN: usize = OFF_CHUNK + 4;
const _: () = assert!(OFF_LINK_LEN + 4 == ENTRY_FIXED_BYTES);

/// What an entry names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EntryKind {
    Dir = 1,
    File = 2,
    Symlink = 3,
}

/// A decoded entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    /// Permission bits (and setuid/gid/sticky), without the type bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The object holding the directory's entries or the file's chunks.
    pub object: u128,
    /// File size in bytes (0 for directories).
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// Bytes per chunk of a file (each chunk its own dkey).
    pub chunk_size: u32,
    /// Symlink target.
    pub link: Vec<u8>,
}

/// Nanoseconds since the epoch, now.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Why stored entry bytes did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt directory entry: {0}")]
pub struct EntryError(pub &'static str);

impl Entry {
    pub fn new(kind: EntryKind, mode: u32, object: u128, chunk_size: u32) -> Self {
        let now = now_ns();
        Self {
            kind,
            mode: mode & 0o7777,
            uid: 0,
            gid: 0,
            object,
            size: 0,
            mtime_ns: now,
            ctime_ns: now,
            chunk_size,
            link: Vec::new(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; ENTRY_FIXED_BYTES + self.link.len()];
        b[OFF_FORMAT] = ENTRY_FORMAT;
        b[OFF_KIND] = self.kind as u8;
        b[OFF_MODE..OFF_MODE + 4].copy_from_slice(&self.mode.to_le_bytes());
        b[OFF_UID..OFF_UID + 4].copy_from_slice(&self.uid.to_le_bytes());
        b[OFF_GID..OFF_GID + 4].copy_from_slice(&self.gid.to_le_bytes());
        b[OFF_OBJECT..OFF_OBJECT + 16].copy_from_slice(&self.object.to_le_bytes());
        b[OFF_SIZE..OFF_SIZE + 8].copy_from_slice(&self.size.to_le_bytes());
        b[OFF_MTIME..OFF_MTIME + 8].copy_from_slice(&self.mtime_ns.to_le_bytes());
        b[OFF_CTIME..OFF_CTIME + 8].copy_from_slice(&self.ctime_ns.to_le_bytes());
        b[OFF_CHUNK..OFF_CHUNK + 4].copy_from_slice(&self.chunk_size.to_le_bytes());
        b[OFF_LINK_LEN..OFF_LINK_LEN + 4].copy_from_slice(&(self.link.len() as u32).to_le_bytes());
        b[ENTRY_FIXED_BYTES..].copy_from_slice(&self.link);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, EntryError> {
        if b.len() < ENTRY_FIXED_BYTES {
            return Err(EntryError("shorter than 64 bytes"));
        }
        if b[OFF_FORMAT] != ENTRY_FORMAT {
            return Err(EntryError("unknown format version"));
        }
        let kind = match b[OFF_KIND] {
            1 => EntryKind::Dir,
            2 => EntryKind::File,
            3 => EntryKind::Symlink,
            _ => return Err(EntryError("unknown kind")),
        };
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(w)
        };
        let mut obj = [0u8; 16];
        obj.copy_from_slice(&b[OFF_OBJECT..OFF_OBJECT + 16]);
        let link_len = u32_at(OFF_LINK_LEN) as usize;
        if link_len > LINK_MAX_BYTES || b.len() != ENTRY_FIXED_BYTES + link_len {
            return Err(EntryError("bad symlink length"));
        }
        let chunk_size = u32_at(OFF_CHUNK);
        if kind == EntryKind::File && chunk_size == 0 {
            return Err(EntryError("file with chunk size 0"));
        }
        Ok(Self {
            kind,
            mode: u32_at(OFF_MODE),
            uid: u32_at(OFF_UID),
            gid: u32_at(OFF_GID),
            object: u128::from_le_bytes(obj),
            size: u64_at(OFF_SIZE),
            mtime_ns: u64_at(OFF_MTIME) as i64,
            ctime_ns: u64_at(OFF_CTIME) as i64,
            chunk_size,
            link: b[ENTRY_FIXED_BYTES..].to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrip() {
        let mut e = Entry::new(EntryKind::Symlink, 0o777, 99, 0);
        e.link = b"../target".to_vec();
        e.size = 9;
        assert_eq!(Entry::decode(&e.encode()), Ok(e));
        let f = Entry::new(EntryKind::File, 0o100644, 5, 1 << 20);
        assert_eq!(f.mode, 0o644);
        assert_eq!(Entry::decode(&f.encode()), Ok(f));
    }

    #[test]
    fn corrupt_entries_are_refused() {
        let e = Entry::new(EntryKind::File, 0o644, 5, 1 << 20).encode();
        assert!(Entry::decode(&e[..63]).is_err());
        let mut bad = e.clone();
        bad[OFF_KIND] = 9;
        assert!(Entry::decode(&bad).is_err());
        let mut bad = e;
        bad[OFF_LINK_LEN] = 3;
        assert!(Entry::decode(&bad).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Entry::decode(&b);
        }
    }
}
