//! File data: chunked extent writes and reads, size publication on close,
//! truncate.

use super::entry::{now_ns, Entry};
use super::error::{client_err, unexpected_reply, FsError, FsResult};
use super::Namespace;
use crate::client::bulk::BulkLease;
use crate::client::{Error as ClientError, Key, PunchScope, Reply, Request};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Chunks after the one read whose extent lists come with its list, when a
/// read has to ask for one (`Client::read_extent_fast_into_then`).
const LIST_AHEAD: u64 = 7;

/// The akey of a chunk's array.
pub const CHUNK_AKEY: &[u8] = b"d";

/// The dkey of chunk `index`: `"c"` and the index, 8 bytes big-endian.
pub fn chunk_dkey(index: u64) -> [u8; 9] {
    let mut d = [0u8; 9];
    d[0] = b'c';
    d[1..].copy_from_slice(&index.to_be_bytes());
    d
}

/// An open file. Shareable between threads: concurrent `write`s at disjoint
/// ranges all land.
#[derive(Debug)]
pub struct FileHandle {
    dir: u128,
    name: String,
    entry: Entry,
    /// Entry version seen at open/create (for a cheap size update on close).
    version: AtomicU64,
    /// End of the highest byte written through this handle.
    written_end: AtomicU64,
    dirty: AtomicBool,
}

impl FileHandle {
    pub(crate) fn new(dir: u128, name: &str, entry: Entry, version: u64) -> Self {
        Self {
            dir,
            name: name.to_string(),
            written_end: AtomicU64::new(entry.size),
            entry,
            version: AtomicU64::new(version),
            dirty: AtomicBool::new(false),
        }
    }
    pub fn entry(&self) -> &Entry {
        &self.entry
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn dir(&self) -> u128 {
        self.dir
    }
    /// Size as this handle sees it: stored size or what it wrote past it.
    pub fn size(&self) -> u64 {
        self.entry
            .size
            .max(self.written_end.load(Ordering::Acquire))
    }
}

/// Splits `[offset, offset+len)` into (chunk index, offset in chunk,
/// position in the caller's buffer, length) pieces.
fn pieces(chunk: u64, offset: u64, len: usize) -> impl Iterator<Item = (u64, u64, usize, usize)> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        if pos >= len {
            return None;
        }
        let abs = offset + pos as u64;
        let index = abs / chunk;
        let within = abs % chunk;
        let n = ((chunk - within) as usize).min(len - pos);
        let item = (index, within, pos, n);
        pos += n;
        Some(item)
    })
}

fn expect_version(what: &str, r: crate::client::Result<Reply>) -> FsResult<()> {
    match r {
        Ok(Reply::Version(_)) => Ok(()),
        Ok(other) => Err(unexpected_reply(what, "extent write", String::new(), other)),
        Err(e) => Err(client_err(what)(e)),
    }
}

impl Namespace {
    pub(super) fn chunk_key(&self, object: u128, index: u64) -> Key {
        Key::new(self.container, object, &chunk_dkey(index), CHUNK_AKEY)
    }

    /// The extent writes of `data` at `offset` of the file object of
    /// `entry` (its object id and chunk size), one per chunk piece, each
    /// through the bulk region when it has a free slot (the leases are
    /// settled once the writes are answered).
    pub(super) fn write_requests(
        &self,
        entry: &Entry,
        offset: u64,
        data: &[u8],
    ) -> (Vec<Request>, Vec<BulkLease>) {
        let chunk = u64::from(entry.chunk_size);
        let mut leases = Vec::new();
        let requests = pieces(chunk, offset, data.len())
            .map(|(index, within, pos, n)| {
                let key = self.chunk_key(entry.object, index);
                let (req, lease) =
                    self.client
                        .extent_write_request(key, within, &data[pos..pos + n]);
                leases.extend(lease);
                req
            })
            .collect();
        (requests, leases)
    }

    /// Notes that `fh` wrote up to `end` (published by the next close).
    fn note_written(fh: &FileHandle, end: u64) {
        fh.written_end.fetch_max(end, Ordering::AcqRel);
        fh.dirty.store(true, Ordering::Release);
    }

    /// Writes `data` at `offset` of the file; chunks are written in parallel.
    pub fn write(&self, fh: &FileHandle, offset: u64, data: &[u8]) -> FsResult<()> {
        futures::executor::block_on(self.write_async(fh, offset, data))
    }

    /// Sends the writes of `data` at `offset` now (chunks in parallel) and
    /// resolves when all are acknowledged. Issuing several before awaiting
    /// any pipelines them; a `close` or `publish` must come after every
    /// one of them resolved.
    pub fn write_async(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
    ) -> impl std::future::Future<Output = FsResult<()>> + Send + 'static {
        let (requests, leases) = self.write_requests(&fh.entry, offset, data);
        let futures: Vec<_> = requests
            .iter()
            .map(|r| self.client.request_async(r))
            .collect();
        Self::note_written(fh, offset + data.len() as u64);
        let name = fh.name.clone();
        async move {
            let replies = futures::future::join_all(futures).await;
            // Every reply is in; a failed one leaves the slots to the engine.
            match replies.iter().find(|r| r.is_err()) {
                Some(_) => leases.into_iter().for_each(BulkLease::abandon),
                None => drop(leases),
            }
            for r in replies {
                expect_version(&name, r)?;
            }
            Ok(())
        }
    }

    /// Writes `data` at `offset` and closes the handle in one round trip:
    /// the extent writes and the entry's new size go to the engine as one
    /// batch. Once this returns, every client reads the data back (a reader
    /// opening the file while this runs may see the new size before the
    /// data, as with any write racing an open).
    pub fn write_and_close(&self, fh: FileHandle, offset: u64, data: &[u8]) -> FsResult<()> {
        let (requests, leases, seen) = self.close_batch(&fh, offset, data);
        let replies = self.client.batch(requests);
        settle_all(leases, &replies);
        let replies = replies.map_err(client_err(fh.name.clone()))?;
        self.finish_close(&fh, seen, replies)
    }

    /// [`write_and_close`](Self::write_and_close) as a future: the batch is
    /// sent now and its replies are checked when the future is awaited.
    /// Writes too big for one batch are done before this returns.
    pub fn write_and_close_async(
        &self,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
    ) -> super::FsFuture {
        let chunk = u64::from(fh.entry.chunk_size.max(1));
        let pieces = (offset + data.len() as u64).div_ceil(chunk) - offset / chunk;
        if pieces as usize + 1 > ferrite_proto::rpc::message::BATCH_ITEMS_MAX {
            let done = self.write_and_close(fh, offset, data);
            return Box::pin(async move { done });
        }
        let (requests, leases, seen) = self.close_batch(&fh, offset, data);
        let sent = self.client.batch_async(requests);
        let ns = self.clone();
        Box::pin(async move {
            let replies = sent.await;
            settle_all(leases, &replies);
            let replies = replies.map_err(client_err(fh.name.clone()))?;
            ns.finish_close(&fh, seen, replies)
        })
    }

    /// The requests of a final write plus the size update, the leases of
    /// its bulk slots, and the entry version the update expects.
    pub(super) fn close_batch(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
    ) -> (Vec<Request>, Vec<BulkLease>, u64) {
        let (mut requests, leases) = self.write_requests(&fh.entry, offset, data);
        Self::note_written(fh, offset + data.len() as u64);
        let mut grown = fh.entry.clone();
        grown.size = grown.size.max(fh.written_end.load(Ordering::Acquire));
        grown.mtime_ns = now_ns();
        let seen = fh.version.load(Ordering::Acquire);
        requests.push(Request::CondUpdate {
            key: self.entry_key(fh.dir, &fh.name),
            expected_version: seen,
            value: grown.encode(),
        });
        (requests, leases, seen)
    }

    /// Checks the replies of a [`close_batch`](Self::close_batch).
    pub(super) fn finish_close(
        &self,
        fh: &FileHandle,
        seen: u64,
        mut replies: Vec<Reply>,
    ) -> FsResult<()> {
        let writes = replies.len().saturating_sub(1);
        let cond = replies.pop();
        for r in replies.into_iter().take(writes) {
            expect_version(&fh.name, Ok(r))?;
        }
        let cond = cond.ok_or_else(|| FsError::Invalid(fh.name.clone(), "short batch reply"))?;
        match crate::client::reply::cond(seen, cond) {
            Ok(_) => {
                fh.dirty.store(false, Ordering::Release);
                Ok(())
            }
            // Someone else changed the entry since open: merge the size in.
            Err(ClientError::VersionMismatch { .. }) => self.publish(fh),
            Err(e) => Err(client_err(fh.name.clone())(e)),
        }
    }

    /// Reads into `buf` from `offset`, up to the file's size; returns bytes read.
    pub fn read(&self, fh: &FileHandle, offset: u64, buf: &mut [u8]) -> FsResult<usize> {
        let size = fh.size();
        if offset >= size {
            return Ok(0);
        }
        let len = buf.len().min((size - offset) as usize);
        let chunk = u64::from(fh.entry.chunk_size);
        // Chunks whose newest extent is in memory and covers the range are
        // read one-sided, and so are those whose extent list says where
        // their pieces are; the engine assembles the others, in parallel.
        let mut parts = Vec::new();
        let chunks = size.div_ceil(chunk);
        for (index, within, pos, n) in pieces(chunk, offset, len) {
            let key = self.chunk_key(fh.entry.object, index);
            let out = &mut buf[pos..pos + n];
            // A list asked for brings those of the file's next chunks along.
            let next = || {
                (index + 1..chunks.min(index + 1 + LIST_AHEAD))
                    .map(|i| self.chunk_key(fh.entry.object, i))
                    .collect()
            };
            match self
                .client
                .read_extent_fast_into_then(&key, within, out, &next)
                .map_err(client_err(fh.name.clone()))?
            {
                Some(true) => {}
                Some(false) => out.fill(0),
                None => parts.push((key, within, pos, n)),
            }
        }
        let (requests, leases): (Vec<_>, Vec<_>) = parts
            .into_iter()
            .map(|(key, within, pos, n)| {
                let (req, lease) = self.client.extent_read_request(key, within, n as u32);
                (req, (lease, pos, n))
            })
            .unzip();
        let futures: Vec<_> = requests
            .iter()
            .map(|r| self.client.request_async(r))
            .collect();
        let replies = futures::executor::block_on(futures::future::join_all(futures));
        let mut first_error = None;
        for ((lease, pos, n), r) in leases.into_iter().zip(replies) {
            let out = &mut buf[pos..pos + n];
            // Every outcome is looked at, so that each lease is settled.
            if let Err(e) = self.client.extent_read_outcome(lease, r, out) {
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(client_err(fh.name.clone())(e));
        }
        Ok(len)
    }

    /// fsync: publishes the handle's size and makes every acknowledged
    /// update survive a power loss of the engine (which matters when the
    /// engine acknowledges at `process` durability).
    pub fn fsync(&self, fh: &FileHandle) -> FsResult<()> {
        self.publish(fh)?;
        self.client
            .sync()
            .map_err(super::error::client_err(format!("fsync {}", fh.name)))
    }

    /// Publishes what this handle wrote (size, mtime) so that every other
    /// client sees it. Called by `close`; callable on its own (fsync, flush).
    pub fn publish(&self, fh: &FileHandle) -> FsResult<()> {
        if !fh.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let end = fh.written_end.load(Ordering::Acquire);
        let mut fast = fh.entry.clone();
        fast.size = fast.size.max(end);
        fast.mtime_ns = now_ns();
        let key = self.entry_key(fh.dir, &fh.name);
        let seen = fh.version.load(Ordering::Acquire);
        match self.client.put_if_version(&key, seen, &fast.encode()) {
            Ok(v) => {
                fh.version.store(v, Ordering::Release);
                return Ok(());
            }
            Err(ClientError::VersionMismatch { .. }) => {}
            Err(e) => return Err(client_err(fh.name.clone())(e)),
        }
        let object = fh.entry.object;
        let e = self.update_entry(fh.dir, &fh.name, |e| {
            if e.object != object {
                return false; // replaced by another file meanwhile
            }
            e.size = e.size.max(end);
            e.mtime_ns = now_ns();
            true
        })?;
        let _ = e;
        Ok(())
    }

    /// Closes a handle, publishing its size.
    pub fn close(&self, fh: FileHandle) -> FsResult<()> {
        self.publish(&fh)
    }

    /// Sets the size of file `name` in `dir`: chunks past it are removed,
    /// the tail of the last partial chunk reads as zero.
    pub fn truncate(&self, dir: u128, name: &str, size: u64) -> FsResult<Entry> {
        let before = self.lookup(dir, name)?;
        if before.kind != super::EntryKind::File {
            return Err(FsError::Invalid(name.to_string(), "truncate of a non-file"));
        }
        let chunk = u64::from(before.chunk_size);
        if size < before.size {
            let first_gone = size.div_ceil(chunk);
            let last = before.size.div_ceil(chunk);
            for index in first_gone..last {
                self.client
                    .punch(PunchScope::Dkey, &self.chunk_key(before.object, index))
                    .map_err(client_err(format!("truncate {name}")))?;
            }
            let within = size % chunk;
            if within != 0 {
                let tail_end = chunk.min(before.size - (size - within));
                let zeros = vec![0u8; (tail_end - within) as usize];
                if !zeros.is_empty() {
                    self.client
                        .write_extent(&self.chunk_key(before.object, size / chunk), within, &zeros)
                        .map_err(client_err(format!("truncate {name}")))?;
                }
            }
        }
        let object = before.object;
        self.update_entry(dir, name, |e| {
            if e.object != object {
                return false;
            }
            e.size = size;
            e.mtime_ns = now_ns();
            e.ctime_ns = e.mtime_ns;
            true
        })
    }
}

/// Frees the bulk slots of a batch once it was answered; keeps them from
/// reuse when it was not (the engine may still use them).
fn settle_all<T>(leases: Vec<BulkLease>, outcome: &crate::client::Result<T>) {
    for lease in leases {
        lease.settle(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_at_chunk_boundaries() {
        let p: Vec<_> = pieces(10, 7, 15).collect();
        assert_eq!(p, vec![(0, 7, 0, 3), (1, 0, 3, 10), (2, 0, 13, 2)]);
        assert_eq!(pieces(10, 0, 0).count(), 0);
        let q: Vec<_> = pieces(1 << 20, 2 << 20, 2 << 20).collect();
        assert_eq!(q, vec![(2, 0, 0, 1 << 20), (3, 0, 1 << 20, 1 << 20)]);
    }

    #[test]
    fn chunk_dkeys_sort_by_index() {
        assert!(chunk_dkey(1) < chunk_dkey(2));
        assert!(chunk_dkey(255) < chunk_dkey(256));
    }
}
