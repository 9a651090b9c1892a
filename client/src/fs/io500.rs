//! The IO500 runner's backend on the Ferrite namespace (like IOR's DFS
//! backend): every phase goes through the client library, no POSIX layer.

use super::{
    EntryKind as FsKind, FileHandle, FsError, FsFuture, FsResult, Namespace, NewFile, ROOT_OBJECT,
};
use crate::io500::backend::{DirEntry, EntryKind, FileOpError, FileStat, Io500Backend};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, UNIX_EPOCH};

/// A write no bigger than this, first on its handle, waits for the close and
/// goes with the new size in one batch (mdtest-hard: create, then write and
/// close in one round trip).
const DEFERRED_WRITE_MAX: usize = 64 << 10;
/// Writes in flight per open file before `write_at` waits for the oldest
/// (write-behind: IOR's transfers pipeline on the connection).
const WRITES_IN_FLIGHT_MAX: usize = 64;
/// Bytes in flight per open file before `write_at` waits for the oldest.
const BYTES_IN_FLIGHT_MAX: usize = 16 << 20;
/// Chunk size of the file all tasks write at once (ior-hard's): one transfer. In 1 MiB
/// chunks (the default) about one transfer in 22 straddles two chunks (two requests, two
/// records) and a read of a transfer finds it in a record shared with others; with one
/// chunk per transfer each is one record, read and checked alone, and the transfers
/// spread over the targets by hash (embedded runs: ior-hard-read 10.2-10.6 GiB/s against
/// 6.8-7.2; ior-hard-write unchanged).
const SHARED_FILE_CHUNK_BYTES: u32 = crate::io500::config::IOR_HARD_TRANSFER_BYTES as u32;
/// Closes and unlinks whose last requests are in flight, across the backend,
/// before the next one waits for the oldest.
const BEHIND_MAX: usize = 256;

type PendingWrite = FsFuture;

/// An open file of the IO500 backend: the namespace's handle plus its
/// write-behind state. Every write is acknowledged (or its error reported)
/// before `sync`, `close` or a `read_at` through the same handle returns.
pub struct FerriteFile {
    fh: FileHandle,
    state: Mutex<WriteBehind>,
}

#[derive(Default)]
struct WriteBehind {
    /// The deferred first write (offset, data), sent at close or by the next call.
    deferred: Option<(u64, Vec<u8>)>,
    /// Sent writes not yet awaited, oldest first, with their sizes.
    in_flight: VecDeque<(usize, PendingWrite)>,
    bytes_in_flight: usize,
    /// Whether any write was issued through the handle (only the first may be deferred).
    wrote: bool,
}

impl FerriteFile {
    fn new(fh: FileHandle) -> Self {
        Self {
            fh,
            state: Mutex::new(WriteBehind::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, WriteBehind> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl WriteBehind {
    fn send(&mut self, ns: &Namespace, fh: &FileHandle, offset: u64, data: &[u8]) {
        self.in_flight
            .push_back((data.len(), Box::pin(ns.write_async(fh, offset, data))));
        self.bytes_in_flight += data.len();
    }

    /// Takes the writes beyond the in-flight limits (all with `all`), oldest first.
    fn take_excess(&mut self, all: bool) -> Vec<PendingWrite> {
        let mut out = Vec::new();
        while !self.in_flight.is_empty()
            && (all
                || self.in_flight.len() > WRITES_IN_FLIGHT_MAX
                || self.bytes_in_flight > BYTES_IN_FLIGHT_MAX)
        {
            if let Some((n, f)) = self.in_flight.pop_front() {
                self.bytes_in_flight -= n;
                out.push(f);
            }
        }
        out
    }
}

/// Awaits `writes`, all of them, and returns the first failure.
fn wait_all(writes: Vec<PendingWrite>) -> io::Result<()> {
    let results = futures::executor::block_on(futures::future::join_all(writes));
    results
        .into_iter()
        .collect::<Result<Vec<()>, _>>()
        .map(|_| ())
        .map_err(FsError::into_io)
}

/// The namespace as an IO500 backend. Directory objects made through it are
/// cached by path (the runner makes every parent through the same value).
///
/// Close-behind and unlink-behind: a close whose file's only write was
/// deferred sends that write with the size update and returns; an unlink
/// removes the name and sends the removal of the data. Their replies are
/// checked later — when more than [`BEHIND_MAX`] are in flight, before any
/// lookup through the backend (`open`, `stat`, `readdir`, `rmdir`), and in
/// [`drain`](Io500Backend::drain), which every task of a phase runs before it
/// finishes. So a phase's time includes every acknowledgment, and nothing
/// read through the backend misses an earlier close.
pub struct FerriteBackend {
    ns: Namespace,
    description: String,
    dirs: RwLock<HashMap<String, u128>>,
    behind: Mutex<VecDeque<FsFuture>>,
}

impl FerriteBackend {
    pub fn new(ns: Namespace, description: String) -> Self {
        Self {
            ns,
            description,
            dirs: RwLock::new(HashMap::new()),
            behind: Mutex::new(VecDeque::new()),
        }
    }

    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    /// Sends the deferred write and waits for every write of `file`.
    fn flush(&self, file: &FerriteFile) -> io::Result<()> {
        let pending = {
            let mut st = file.state();
            if let Some((o, d)) = st.deferred.take() {
                st.send(&self.ns, &file.fh, o, &d);
            }
            st.take_excess(true)
        };
        wait_all(pending)
    }

    /// Queues an operation in flight; waits for the oldest beyond the limit.
    fn push_behind(&self, op: FsFuture) -> io::Result<()> {
        let excess: Vec<FsFuture> = {
            let mut q = self.behind.lock().unwrap_or_else(|e| e.into_inner());
            q.push_back(op);
            let n = q.len().saturating_sub(BEHIND_MAX);
            q.drain(..n).collect()
        };
        wait_all(excess)
    }

    /// Creates the file `path` with `make` (namespace, parent object, name).
    fn create_with(
        &self,
        path: &str,
        make: impl FnOnce(&Namespace, u128, &str) -> FsResult<FileHandle>,
    ) -> io::Result<FerriteFile> {
        let (parent, name) = self.parent_of(path)?;
        make(&self.ns, parent, name)
            .map(FerriteFile::new)
            .map_err(FsError::into_io)
    }

    /// Splits `path` into its parent directory's object and the last name.
    fn parent_of<'p>(&self, path: &'p str) -> io::Result<(u128, &'p str)> {
        let (parent, name) = match path.rsplit_once('/') {
            Some((p, n)) => (p, n),
            None => ("", path),
        };
        Ok((self.dir_object(parent)?, name))
    }

    /// Each path's directory object and last name, for a call on a group of
    /// paths, and each path's own failure to find its directory. A path that
    /// failed keeps its place in the group with a stand-in (the root and an
    /// empty name, which a lookup refuses alone); its result is its failure.
    fn parents_of<'p>(
        &self,
        paths: &'p [String],
    ) -> (Vec<(u128, &'p str)>, Vec<Option<io::Error>>) {
        (paths.iter())
            .map(|p| match self.parent_of(p) {
                Ok(at) => (at, None),
                Err(e) => ((ROOT_OBJECT, ""), Some(e)),
            })
            .unzip()
    }

    fn dir_object(&self, path: &str) -> io::Result<u128> {
        if path.is_empty() {
            return Ok(ROOT_OBJECT);
        }
        if let Some(o) = self.dirs.read().ok().and_then(|d| d.get(path).copied()) {
            return Ok(o);
        }
        let (_, e) = self.ns.resolve(path).map_err(FsError::into_io)?;
        if e.kind != FsKind::Dir {
            return Err(FsError::NotDir(path.to_string()).into_io());
        }
        if let Ok(mut d) = self.dirs.write() {
            d.insert(path.to_string(), e.object);
        }
        Ok(e.object)
    }
}

/// The same error again (for each file of a group whose common step failed).
fn copy_error(e: &io::Error, op: &'static str) -> FileOpError {
    FileOpError::of(op)(io::Error::new(e.kind(), e.to_string()))
}

fn to_stat(e: &super::Entry) -> FileStat {
    FileStat {
        kind: kind_of(e.kind),
        size_bytes: e.size,
        mtime: UNIX_EPOCH + Duration::from_nanos(e.mtime_ns.max(0) as u64),
    }
}

fn kind_of(k: FsKind) -> EntryKind {
    match k {
        FsKind::Dir => EntryKind::Directory,
        FsKind::File => EntryKind::File,
        FsKind::Symlink => EntryKind::Other,
    }
}

/// The engine counters a run's report carries, each summed over the targets: what the
/// store's log and its cleaner did during the run.
const REPORTED_COUNTERS: &[&str] = &[
    "bytes_appended",
    "live_bytes",
    "log_used_bytes",
    "checkpoints",
    "cleaner_passes",
    "cleaner_bytes_copied",
    "cleaner_wait_timeouts",
    "cleaner_failures",
];

impl Io500Backend for FerriteBackend {
    type File = FerriteFile;

    fn describe(&self) -> String {
        self.description.clone()
    }

    fn round_trips(&self) -> Option<u64> {
        Some(self.ns.client().counters().rpc_requests)
    }

    fn storage_counters(&self) -> std::collections::BTreeMap<String, u64> {
        let Ok(stat) = self.ns.client().stat() else {
            return Default::default();
        };
        REPORTED_COUNTERS
            .iter()
            .map(|&name| {
                let sum = stat
                    .target_counters
                    .iter()
                    .flat_map(|t| t.counters.iter())
                    .filter(|(n, _)| n == name)
                    .map(|(_, v)| *v)
                    .sum();
                (name.to_string(), sum)
            })
            .collect()
    }

    fn mkdir(&self, path: &str) -> io::Result<()> {
        let (parent, name) = self.parent_of(path)?;
        let e = self
            .ns
            .mkdir(parent, name, 0o755)
            .map_err(FsError::into_io)?;
        if let Ok(mut d) = self.dirs.write() {
            d.insert(path.to_string(), e.object);
        }
        Ok(())
    }

    fn rmdir(&self, path: &str) -> io::Result<()> {
        self.drain()?;
        let (parent, name) = self.parent_of(path)?;
        self.ns.rmdir(parent, name).map_err(FsError::into_io)?;
        if let Ok(mut d) = self.dirs.write() {
            d.remove(path);
        }
        Ok(())
    }

    fn create(&self, path: &str) -> io::Result<FerriteFile> {
        self.create_with(path, |ns, parent, name| ns.create(parent, name, 0o644))
    }

    /// Chunks of one transfer each ([`SHARED_FILE_CHUNK_BYTES`]).
    fn create_shared(&self, path: &str) -> io::Result<FerriteFile> {
        self.create_with(path, |ns, parent, name| {
            ns.create_chunked(parent, name, 0o644, SHARED_FILE_CHUNK_BYTES)
        })
    }

    fn open(&self, path: &str) -> io::Result<FerriteFile> {
        self.drain()?;
        let (parent, name) = self.parent_of(path)?;
        self.ns
            .open(parent, name)
            .map(FerriteFile::new)
            .map_err(FsError::into_io)
    }

    fn write_at(&self, file: &FerriteFile, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut st = file.state();
        if !st.wrote && data.len() <= DEFERRED_WRITE_MAX {
            st.wrote = true;
            st.deferred = Some((offset, data.to_vec()));
            return Ok(());
        }
        st.wrote = true;
        if let Some((o, d)) = st.deferred.take() {
            st.send(&self.ns, &file.fh, o, &d);
        }
        st.send(&self.ns, &file.fh, offset, data);
        let excess = st.take_excess(false);
        drop(st);
        wait_all(excess)
    }

    fn read_at(&self, file: &FerriteFile, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.flush(file)?;
        self.ns
            .read(&file.fh, offset, buf)
            .map_err(FsError::into_io)
    }

    fn sync(&self, file: &FerriteFile) -> io::Result<()> {
        self.flush(file)?;
        self.ns.fsync(&file.fh).map_err(FsError::into_io)
    }

    fn close(&self, file: FerriteFile) -> io::Result<()> {
        let (deferred, pending) = {
            let mut st = file.state();
            (st.deferred.take(), st.take_excess(true))
        };
        match deferred {
            // The file's only write: it goes with the size update, behind.
            Some((offset, data)) if pending.is_empty() => {
                let FerriteFile { fh, .. } = file;
                let op = self.ns.write_and_close_async(fh, offset, &data);
                self.push_behind(op)
            }
            Some((offset, data)) => {
                wait_all(pending)?;
                self.ns
                    .write_and_close(file.fh, offset, &data)
                    .map_err(FsError::into_io)
            }
            None => {
                let waited = wait_all(pending);
                let closed = self.ns.close(file.fh);
                waited?;
                closed.map_err(FsError::into_io)
            }
        }
    }

    fn stat(&self, path: &str) -> io::Result<FileStat> {
        self.drain()?;
        if path.is_empty() {
            return Ok(to_stat(&self.ns.root_entry()));
        }
        let (parent, name) = self.parent_of(path)?;
        let e = self.ns.lookup(parent, name).map_err(FsError::into_io)?;
        Ok(to_stat(&e))
    }

    /// The entries in one go: overlapped one-sided reads, one batch for
    /// the keys they cannot resolve. A path whose directory fails fails alone.
    fn stat_files(&self, paths: &[String]) -> Vec<io::Result<FileStat>> {
        if paths.iter().any(|p| p.is_empty()) {
            return paths.iter().map(|p| self.stat(p)).collect();
        }
        if let Err(e) = self.drain() {
            return (paths.iter())
                .map(|_| Err(copy_error(&e, "stat").error))
                .collect();
        }
        let (at, failed) = self.parents_of(paths);
        (self.ns.lookup_entries(&at).into_iter().zip(failed))
            .map(|(found, failed)| match failed {
                Some(e) => Err(e),
                None => found.map(|(e, _)| to_stat(&e)).map_err(FsError::into_io),
            })
            .collect()
    }

    /// The entries looked up together, the files' first chunks loaded
    /// together (see [`Namespace::read_files`]). A failure is the file's
    /// `open` (its directory) or `read` (its lookup or its data).
    fn read_files(
        &self,
        paths: &[String],
        bufs: &mut [Vec<u8>],
    ) -> Vec<Result<usize, FileOpError>> {
        if let Err(e) = self.drain() {
            return paths.iter().map(|_| Err(copy_error(&e, "open"))).collect();
        }
        let (at, failed) = self.parents_of(paths);
        (self.ns.read_files(&at, bufs).into_iter().zip(failed))
            .map(|(read, failed)| match failed {
                Some(e) => Err(FileOpError::of("open")(e)),
                None => read.map_err(|e| FileOpError::of("read")(e.into_io())),
            })
            .collect()
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        let (parent, name) = self.parent_of(path)?;
        match self
            .ns
            .unlink_behind(parent, name)
            .map_err(FsError::into_io)?
        {
            Some(data) => self.push_behind(data),
            None => Ok(()),
        }
    }

    /// Two round trips for the whole group: the creates (conditional
    /// inserts) in one batch, then every file's write and size update in
    /// another; a file's result comes once its data and size are
    /// acknowledged.
    fn create_files(&self, files: &[(String, &[u8])]) -> Vec<Result<(), FileOpError>> {
        let mut parents = Vec::with_capacity(files.len());
        for (path, _) in files {
            match self.parent_of(path) {
                Ok(p) => parents.push(p),
                Err(e) => {
                    return (0..files.len())
                        .map(|_| Err(copy_error(&e, "create")))
                        .collect()
                }
            }
        }
        let new: Vec<NewFile<'_>> = (parents.iter().zip(files))
            .map(|(&(dir, name), (_, data))| NewFile { dir, name, data })
            .collect();
        (self.ns.create_files(&new, 0o644).into_iter())
            .map(|r| r.map_err(|e| FileOpError::of("create")(e.into_io())))
            .collect()
    }

    /// The names go in one round trip (after one-sided lookups); the removal
    /// of their data is left in flight like [`unlink`](Io500Backend::unlink)'s.
    fn unlink_files(&self, paths: &[String]) -> Vec<io::Result<()>> {
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            match self.parent_of(path) {
                Ok(p) => files.push(p),
                Err(e) => {
                    return paths
                        .iter()
                        .map(|_| Err(copy_error(&e, "unlink").error))
                        .collect()
                }
            }
        }
        let (results, behind) = self.ns.unlink_files(&files);
        let queued = behind.map_or(Ok(()), |data| self.push_behind(data));
        let mut out: Vec<io::Result<()>> = results
            .into_iter()
            .map(|r| r.map_err(FsError::into_io))
            .collect();
        if let (Err(e), Some(last)) = (queued, out.last_mut()) {
            if last.is_ok() {
                *last = Err(e);
            }
        }
        out
    }

    fn drain(&self) -> io::Result<()> {
        let all: Vec<FsFuture> = {
            let mut q = self.behind.lock().unwrap_or_else(|e| e.into_inner());
            q.drain(..).collect()
        };
        wait_all(all)
    }

    fn readdir(
        &self,
        path: &str,
        visit: &mut dyn FnMut(DirEntry) -> io::Result<()>,
    ) -> io::Result<()> {
        self.drain()?;
        let dir = self.dir_object(path)?;
        let mut failure: Option<io::Error> = None;
        let r = self.ns.readdir(dir, |name, e| {
            let entry = DirEntry {
                name: name.to_string(),
                kind: kind_of(e.kind),
                stat: Some(to_stat(&e)),
            };
            visit(entry).map_err(|err| {
                let msg = err.to_string();
                failure = Some(err);
                FsError::Invalid(msg, "stopped by the caller")
            })
        });
        match (r, failure) {
            (_, Some(err)) => Err(err),
            (Err(e), None) => Err(e.into_io()),
            (Ok(()), None) => Ok(()),
        }
    }
}
