//! Extent lists of byte arrays kept by a client, so that reads of pieces
//! not in an array's newest record are one-sided too (see
//! `onesided::listed` for why such a read returns the newest bytes).
//!
//! A list is asked of the engine (one ExtentList round trip) the first
//! time a read of an array needs it and kept, shared by every thread of the
//! client: ior-hard's readers of one 1 MiB chunk (~22 extents of 8 tasks)
//! then make one round trip for the chunk instead of one per read. Each
//! read checks the list against the key's bucket first; a list found stale
//! is asked for again once, and a read the list cannot serve goes by RPC.
//! Only over endpoints whose reads are loads (shm): elsewhere a piece read
//! costs round trips of its own, and the RPC read is cheaper.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ferrite_proto::rpc::{ExtentList, Key, Reply, Request};

use crate::client::counters::Counter;
use crate::client::error::Result;
use crate::client::handle::with_scratch;
use crate::client::onesided::{Listed, Newest, OneSidedReader};
use crate::client::{reply, Client};

/// Lists kept at most; the whole set is dropped when full (the lists of
/// the chunks being read now are asked for again, one round trip each).
pub const EXTENT_LISTS_MAX: usize = 4096;
/// Pieces kept at most over all lists (28 bytes each on the wire, about as
/// much kept): the same dropping when a new list would pass it.
pub const EXTENT_LIST_PIECES_MAX: usize = 1 << 18;

/// Locks that make threads missing the same list ask for it once (by key
/// hash): ior-hard's tasks reach each new chunk together.
const ASKING_STRIPES: usize = 64;

/// A client's extent lists, by key.
#[derive(Debug)]
pub struct ExtentLists {
    kept: Mutex<Kept>,
    asking: [Mutex<()>; ASKING_STRIPES],
}

/// The lists, and their pieces counted.
#[derive(Debug, Default)]
struct Kept {
    lists: HashMap<Key, Arc<ExtentList>>,
    pieces: usize,
}

impl Kept {
    fn remove(&mut self, key: &Key) {
        if let Some(old) = self.lists.remove(key) {
            self.pieces -= old.pieces.len();
        }
    }
}

impl Default for ExtentLists {
    fn default() -> Self {
        Self {
            kept: Mutex::default(),
            asking: std::array::from_fn(|_| Mutex::new(())),
        }
    }
}

impl ExtentLists {
    /// The kept list of `key`, else the one `ask` returns (kept); while one
    /// thread asks, the others missing the same key wait for its answer.
    fn get_or_ask(
        &self,
        key: &Key,
        ask: impl FnOnce() -> Result<Option<ExtentList>>,
    ) -> Result<Option<Arc<ExtentList>>> {
        if let Some(list) = self.get(key) {
            return Ok(Some(list));
        }
        let stripe = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            key.hash(&mut h);
            h.finish() as usize % ASKING_STRIPES
        };
        let _asking = self.asking[stripe]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(list) = self.get(key) {
            return Ok(Some(list));
        }
        let Some(list) = ask()? else {
            return Ok(None);
        };
        let list = Arc::new(list);
        self.put(key, list.clone());
        Ok(Some(list))
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, key: &Key) -> Option<Arc<ExtentList>> {
        self.kept().lists.get(key).cloned()
    }

    fn put(&self, key: &Key, list: Arc<ExtentList>) {
        let mut kept = self.kept();
        kept.remove(key);
        let pieces = list.pieces.len();
        if kept.lists.len() >= EXTENT_LISTS_MAX || kept.pieces + pieces > EXTENT_LIST_PIECES_MAX {
            kept.lists.clear();
            kept.pieces = 0;
        }
        kept.pieces += pieces;
        kept.lists.insert(key.clone(), list);
    }

    /// Drops `key`'s list if it is still `stale` (another thread may have
    /// kept a newer one since).
    fn forget(&self, key: &Key, stale: &Arc<ExtentList>) {
        let mut kept = self.kept();
        if kept.lists.get(key).is_some_and(|l| Arc::ptr_eq(l, stale)) {
            kept.remove(key);
        }
    }

    /// Whether a list of `key` is kept.
    pub fn has(&self, key: &Key) -> bool {
        self.kept().lists.contains_key(key)
    }

    /// Lists kept now.
    pub fn len(&self) -> usize {
        self.kept().lists.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Client {
    /// The extent list of the array under `key`, asked of the engine
    /// (`None`: the array does not exist).
    pub fn extent_list(&self, key: &Key) -> Result<Option<ExtentList>> {
        self.counters.add(Counter::ExtentList, 1);
        let r = self.request(&Request::ExtentList { key: key.clone() })?;
        match r {
            Reply::Extents(list) => Ok(list),
            other => Err(reply::unexpected("extent list", other)),
        }
    }

    /// The extent list of `key` (as [`extent_list`](Self::extent_list)),
    /// with those of `more` asked in the same batch and kept (those this
    /// client does not keep yet; absent arrays are skipped).
    fn extent_lists_with(&self, key: &Key, more: Vec<Key>) -> Result<Option<ExtentList>> {
        let more: Vec<Key> = more
            .into_iter()
            .filter(|k| k != key && !self.extent_lists.has(k))
            .collect();
        if more.is_empty() {
            return self.extent_list(key);
        }
        // Pipelined on the connection (ExtentList is not a batch item).
        let requests: Vec<Request> = std::iter::once(key)
            .chain(&more)
            .map(|k| Request::ExtentList { key: k.clone() })
            .collect();
        self.counters
            .add(Counter::ExtentList, requests.len() as u64);
        let futures: Vec<_> = requests.iter().map(|r| self.request_async(r)).collect();
        let mut replies =
            futures::executor::block_on(futures::future::join_all(futures)).into_iter();
        let first = match replies.next() {
            Some(Ok(Reply::Extents(list))) => list,
            Some(Ok(other)) => return Err(reply::unexpected("extent list", other)),
            Some(Err(e)) => return Err(e),
            None => unreachable!("one future per request, the first is the key's"),
        };
        for (k, r) in more.iter().zip(replies) {
            if let Ok(Reply::Extents(Some(list))) = r {
                self.extent_lists.put(k, Arc::new(list));
            }
        }
        Ok(first)
    }

    /// Reads `buf.len()` bytes at `offset` of the array under `key`
    /// one-sided when it can: `Some(true)` the bytes are in `buf`,
    /// `Some(false)` the array does not exist (`buf` untouched), `None` when
    /// only the engine can answer. Tries the newest record (value bytes
    /// straight into `buf`), the general lookup, then the extent list.
    pub fn read_extent_fast_into(
        &self,
        key: &Key,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<Option<bool>> {
        self.read_extent_fast_into_then(key, offset, buf, &Vec::new)
    }

    /// [`read_extent_fast_into`](Self::read_extent_fast_into), and when the
    /// read needs an extent list this client does not keep, the lists of
    /// the arrays `next()` names (those likely read next: a file's
    /// following chunks) are asked for in the same round trip and kept.
    /// ior-hard's tasks all stall on each new chunk's list; this makes one
    /// stall serve several chunks.
    pub fn read_extent_fast_into_then(
        &self,
        key: &Key,
        offset: u64,
        buf: &mut [u8],
        next: &dyn Fn() -> Vec<Key>,
    ) -> Result<Option<bool>> {
        let Some(reader) = self.reader().filter(|r| r.reads_are_loads()) else {
            return self.read_extent_one_sided_into(key, offset, buf);
        };
        self.check_alive("extent read")?;
        let record_key = key.as_record_key();
        let newest = with_scratch(|scratch| reader.read_newest(&record_key, offset, buf, scratch))?;
        match newest {
            Newest::Read => {
                self.counters.add(Counter::OneSidedHit, 1);
                return Ok(Some(true));
            }
            Newest::Elsewhere => {}
            Newest::Unknown => {
                if let Some(found) = self.read_extent_one_sided_into(key, offset, buf)? {
                    return Ok(Some(found));
                }
            }
        }
        Ok(self
            .read_listed(reader, key, offset, buf, next)?
            .then_some(true))
    }

    /// Reads through the extent list (kept, or asked for); `false` when the
    /// list cannot serve the read (or the array is gone).
    fn read_listed(
        &self,
        reader: &OneSidedReader,
        key: &Key,
        offset: u64,
        buf: &mut [u8],
        next: &dyn Fn() -> Vec<Key>,
    ) -> Result<bool> {
        let record_key = key.as_record_key();
        for round in 0..2 {
            let kept = self.extent_lists.get_or_ask(key, || match round {
                0 => self.extent_lists_with(key, next()),
                _ => self.extent_list(key),
            })?;
            let Some(list) = kept else {
                return Ok(false);
            };
            let listed = with_scratch(|scratch| {
                reader.read_listed(&record_key, &list, offset, buf, scratch)
            })?;
            match listed {
                Listed::Read => {
                    self.counters.add(Counter::ListedRead, 1);
                    return Ok(true);
                }
                Listed::Stale => self.extent_lists.forget(key, &list),
                Listed::Unreadable => return Ok(false),
            }
        }
        Ok(false)
    }

    /// The extent lists this client keeps.
    pub fn extent_lists(&self) -> &ExtentLists {
        &self.extent_lists
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_proto::rpc::ExtentSpan;

    fn list(pieces: usize) -> Arc<ExtentList> {
        let span = ExtentSpan {
            start: 0,
            end: 1,
            rec_addr: 0,
            rec_len: 0,
        };
        Arc::new(ExtentList {
            version: 1,
            newest_addr: 0,
            newest_len: 0,
            covered_end: u64::MAX,
            pieces: vec![span; pieces],
        })
    }

    fn key(i: usize) -> Key {
        Key::new(1, 1, &i.to_be_bytes(), b"d")
    }

    #[test]
    fn kept_lists_are_bounded_by_count_and_by_pieces() {
        let lists = ExtentLists::default();
        for i in 0..EXTENT_LISTS_MAX {
            lists.put(&key(i), list(1));
        }
        assert_eq!(lists.len(), EXTENT_LISTS_MAX);
        lists.put(&key(EXTENT_LISTS_MAX), list(1));
        assert_eq!(lists.len(), 1, "full: dropped, then kept the new one");
        // Replacing a list does not count its pieces twice.
        let half = EXTENT_LIST_PIECES_MAX / 2;
        lists.put(&key(0), list(half));
        lists.put(&key(0), list(half));
        assert_eq!(lists.len(), 2);
        lists.put(&key(1), list(half + 1));
        assert_eq!(lists.len(), 1, "too many pieces: dropped");
        // Only the list found stale is forgotten, not a newer one.
        let stale = lists.get(&key(1)).unwrap();
        lists.put(&key(1), list(3));
        lists.forget(&key(1), &stale);
        assert_eq!(lists.get(&key(1)).map(|l| l.pieces.len()), Some(3));
        let newest = lists.get(&key(1)).unwrap();
        lists.forget(&key(1), &newest);
        assert!(lists.is_empty());
    }
}
