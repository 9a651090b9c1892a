//! What the directory's entries take in a checkpoint
//! ([`checkpoint_entry_bytes`]), kept up to date as entries change so
//! admission (`space.rs`) can refuse a new key whose checkpoint would not
//! fit its area instead of the cleaner failing on it later.

use super::{Directory, Entry};
use crate::store::format::checkpoint_entry_bytes;

impl Directory {
    /// Bytes a checkpoint of every entry would take now.
    pub fn checkpoint_bytes(&self) -> u64 {
        self.checkpoint_bytes
    }

    /// Checkpoint bytes of entry `e` of keys `dk`, `ak` (0 for none).
    pub(super) fn entry_size(dk: &[u8], ak: &[u8], e: Option<&Entry>) -> u64 {
        e.map_or(0, |e| {
            let pieces = e.extents.as_ref().map_or(0, |m| m.len());
            checkpoint_entry_bytes(dk.len(), ak.len(), pieces)
        })
    }

    /// Accounts for the entry of keys `dk`, `ak` going from `old` to `new`
    /// (`None`: absent).
    pub(super) fn account(
        &mut self,
        dk: &[u8],
        ak: &[u8],
        old: Option<&Entry>,
        new: Option<&Entry>,
    ) {
        let (old, new) = (Self::entry_size(dk, ak, old), Self::entry_size(dk, ak, new));
        self.checkpoint_bytes = self.checkpoint_bytes + new - old;
    }
}
