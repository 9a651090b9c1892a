//! The file namespace on the engine, shaped like DAOS DFS.
//!
//! A directory is an object whose dkeys are entry names; each entry's value
//! (akey `"entry"`) is an [`Entry`]: object id, kind, mode, owner, size,
//! times. Because the dkey decides the target, a big directory's entries
//! spread over every target. A file is an array object cut into chunks
//! (default 1 MiB): chunk `i` is the array under dkey `"c" ‖ i (8 bytes BE)`,
//! akey `"d"`, so a file's chunks spread over targets too. The root directory
//! is object [`ROOT_OBJECT`] and has no entry of its own.
//!
//! Consistency between clients comes from the engine: a create is a
//! conditional insert (one of two racing creates wins, the other gets
//! `EEXIST`); a file's size lives in its entry and grows by compare-version
//! updates when a writer closes, so data written and closed by one client is
//! read back whole by another.
//!
//! Every dkey of the namespace holds exactly one akey (an entry's, a chunk's),
//! so a name or a chunk is removed by punching that akey: the same effect as
//! punching the dkey, without what a pending dkey punch costs the target (its
//! other conditional updates wait for the punch's commit, and its cleaner and
//! keeper skip every key meanwhile).

pub mod entry;
pub mod error;
mod file;
pub mod io500;
mod many;
pub mod space;

pub use entry::{Entry, EntryKind};
pub use error::{FsError, FsResult};
pub use file::FileHandle;
pub use many::NewFile;

use crate::client::{Client, Error as ClientError, Key, PunchScope, Reply, Request};
use error::{client_err, unexpected_reply};
use std::sync::Arc;

/// The root directory's object id.
pub const ROOT_OBJECT: u128 = 1;
/// Default container of the namespace.
pub const DEFAULT_CONTAINER: u64 = 0x4653_0001;
/// Default bytes per file chunk.
pub const DEFAULT_CHUNK_BYTES: u32 = 1 << 20;
/// Longest entry name.
pub const NAME_MAX_BYTES: usize = 255;
/// How names and chunks are removed (see the module guide).
pub(crate) const REMOVE_SCOPE: PunchScope = PunchScope::Akey;
/// Entries per readdir page asked of the engine: the most a listing gives
/// (`LIST_KEYS_MAX`). Against 1024, io500's find over 1.78 million entries
/// (separate engine, three runs each, alternating) took 36-39 engine CPU
/// ticks instead of 45-48, at 4.98-5.43 against 4.85-4.93 M entries/s.
pub const READDIR_PAGE: u32 = ferrite_proto::rpc::message::LIST_KEYS_MAX as u32;

/// A page of directory entry names, each with its encoded entry when the
/// listing carried it.
pub type ListedEntries = Vec<(String, Option<Vec<u8>>)>;

/// An operation sent to the engine whose replies are checked when awaited.
pub type FsFuture = std::pin::Pin<Box<dyn std::future::Future<Output = FsResult<()>> + Send>>;

/// A file namespace in one container of an engine.
#[derive(Clone)]
pub struct Namespace {
    client: Arc<Client>,
    container: u64,
    chunk_bytes: u32,
}

impl std::fmt::Debug for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespace")
            .field("container", &self.container)
            .field("chunk_bytes", &self.chunk_bytes)
            .finish()
    }
}

/// A handle on the file `name` of `dir` whose entry is `e` (at `version`);
/// a directory or a symlink is refused as `open` refuses it.
fn file_handle(dir: u128, name: &str, e: Entry, version: u64) -> FsResult<FileHandle> {
    match e.kind {
        EntryKind::File => Ok(FileHandle::new(dir, name, e, version)),
        EntryKind::Dir => Err(FsError::IsDir(name.to_string())),
        EntryKind::Symlink => Err(FsError::Invalid(name.to_string(), "is a symlink")),
    }
}

fn check_name(name: &str) -> FsResult<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(FsError::Invalid(name.to_string(), "bad entry name"));
    }
    if name.len() > NAME_MAX_BYTES {
        return Err(FsError::NameTooLong(name.to_string()));
    }
    Ok(())
}

/// A fresh object id: random, never the root.
fn new_object_id() -> u128 {
    loop {
        let id: u128 = rand::random();
        if id > ROOT_OBJECT {
            return id;
        }
    }
}

impl Namespace {
    /// The namespace in `container` (created on first use: the root exists
    /// implicitly).
    pub fn new(client: Arc<Client>, container: u64) -> Self {
        Self {
            client,
            container,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
        }
    }

    /// Sets the chunk size for files created from now on.
    pub fn with_chunk_bytes(mut self, chunk_bytes: u32) -> FsResult<Self> {
        check_chunk_bytes(chunk_bytes)?;
        self.chunk_bytes = chunk_bytes;
        Ok(self)
    }

    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }
    pub fn container(&self) -> u64 {
        self.container
    }

    fn entry_key(&self, dir: u128, name: &str) -> Key {
        Key::new(self.container, dir, name.as_bytes(), entry::ENTRY_AKEY)
    }

    /// The root directory as an entry (synthesized: it has none stored).
    pub fn root_entry(&self) -> Entry {
        let mut e = Entry::new(EntryKind::Dir, 0o755, ROOT_OBJECT, 0);
        e.mtime_ns = 0;
        e.ctime_ns = 0;
        e
    }

    /// The entry `name` in directory object `dir`, and its version.
    pub fn lookup_versioned(&self, dir: u128, name: &str) -> FsResult<(Entry, u64)> {
        check_name(name)?;
        let found = self
            .client
            .get_versioned(&self.entry_key(dir, name))
            .map_err(client_err(format!("lookup {name}")))?
            .ok_or_else(|| FsError::NotFound(name.to_string()))?;
        let e = Entry::decode(&found.value).map_err(|e| FsError::Corrupt(name.to_string(), e))?;
        Ok((e, found.version))
    }

    /// The entry `name` in directory object `dir`.
    pub fn lookup(&self, dir: u128, name: &str) -> FsResult<Entry> {
        self.lookup_versioned(dir, name).map(|(e, _)| e)
    }

    /// Resolves a `/`-separated path from the root (symlinks are not
    /// followed). Returns the parent directory object and the entry.
    pub fn resolve(&self, path: &str) -> FsResult<(u128, Entry)> {
        let mut parent = ROOT_OBJECT;
        let mut cur = self.root_entry();
        for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
            if cur.kind != EntryKind::Dir {
                return Err(FsError::NotDir(path.to_string()));
            }
            parent = cur.object;
            cur = self.lookup(cur.object, comp)?;
        }
        Ok((parent, cur))
    }

    /// Inserts `entry` as `name` in `dir` unless the name exists.
    fn insert(&self, dir: u128, name: &str, entry: &Entry) -> FsResult<u64> {
        check_name(name)?;
        match self
            .client
            .put_if_version(&self.entry_key(dir, name), 0, &entry.encode())
        {
            Ok(v) => Ok(v),
            Err(ClientError::VersionMismatch { .. }) => Err(FsError::Exists(name.to_string())),
            Err(e) => Err(client_err(format!("create {name}"))(e)),
        }
    }

    /// Makes directory `name` in `dir`.
    pub fn mkdir(&self, dir: u128, name: &str, mode: u32) -> FsResult<Entry> {
        let e = Entry::new(EntryKind::Dir, mode, new_object_id(), 0);
        self.insert(dir, name, &e)?;
        Ok(e)
    }

    /// Creates an empty file `name` in `dir`; `EEXIST` if the name exists.
    pub fn create(&self, dir: u128, name: &str, mode: u32) -> FsResult<FileHandle> {
        self.create_chunked(dir, name, mode, self.chunk_bytes)
    }

    /// [`create`](Self::create) with chunks of `chunk_bytes` for this file
    /// (the namespace's setting for the others): a file that many clients
    /// write at once in interleaved transfers (ior-hard's) is best cut at
    /// the transfer size, so that no transfer straddles two chunks.
    pub fn create_chunked(
        &self,
        dir: u128,
        name: &str,
        mode: u32,
        chunk_bytes: u32,
    ) -> FsResult<FileHandle> {
        check_chunk_bytes(chunk_bytes)?;
        let e = Entry::new(EntryKind::File, mode, new_object_id(), chunk_bytes);
        let version = self.insert(dir, name, &e)?;
        Ok(FileHandle::new(dir, name, e, version))
    }

    /// Opens file `name` in `dir`.
    pub fn open(&self, dir: u128, name: &str) -> FsResult<FileHandle> {
        let (e, version) = self.lookup_versioned(dir, name)?;
        file_handle(dir, name, e, version)
    }

    /// Makes symlink `name` in `dir` pointing at `target`.
    pub fn symlink(&self, dir: u128, name: &str, target: &[u8]) -> FsResult<Entry> {
        if target.is_empty() || target.len() > entry::LINK_MAX_BYTES {
            return Err(FsError::Invalid(name.to_string(), "symlink target length"));
        }
        let mut e = Entry::new(EntryKind::Symlink, 0o777, new_object_id(), 0);
        e.link = target.to_vec();
        e.size = target.len() as u64;
        self.insert(dir, name, &e)?;
        Ok(e)
    }

    /// Removes file or symlink `name` from `dir`, then its data.
    pub fn unlink(&self, dir: u128, name: &str) -> FsResult<()> {
        match self.unlink_behind(dir, name)? {
            Some(data) => futures::executor::block_on(data),
            None => Ok(()),
        }
    }

    /// Removes the name now (the entry is gone when this returns) and sends
    /// the removal of the file's data, returning it as a future to await
    /// later (`None`: nothing to remove). The entry goes first, so a crash
    /// in between leaves unreachable chunks, never a name without its data.
    pub fn unlink_behind(&self, dir: u128, name: &str) -> FsResult<Option<FsFuture>> {
        let e = self.lookup(dir, name)?;
        if e.kind == EntryKind::Dir {
            return Err(FsError::IsDir(name.to_string()));
        }
        self.remove_entry(dir, name)?;
        if e.kind != EntryKind::File || e.size == 0 {
            return Ok(None);
        }
        Ok(Some(self.remove_data_many(&[(e, name)])))
    }

    /// Removes the empty directory `name` from `dir`.
    pub fn rmdir(&self, dir: u128, name: &str) -> FsResult<()> {
        let e = self.lookup(dir, name)?;
        if e.kind != EntryKind::Dir {
            return Err(FsError::NotDir(name.to_string()));
        }
        let (names, _) = self.readdir_page(e.object, None, 1)?;
        if !names.is_empty() {
            return Err(FsError::NotEmpty(name.to_string()));
        }
        self.remove_entry(dir, name)
    }

    fn remove_entry(&self, dir: u128, name: &str) -> FsResult<()> {
        let key = self.entry_key(dir, name);
        self.client
            .punch(REMOVE_SCOPE, &key)
            .map_err(client_err(format!("remove {name}")))?;
        Ok(())
    }

    fn punch_object(&self, object: u128, name: &str) -> FsResult<()> {
        let key = Key::new(self.container, object, b"", b"");
        self.client
            .punch(PunchScope::Object, &key)
            .map_err(client_err(format!("remove data of {name}")))?;
        Ok(())
    }

    /// Renames `src_dir/src_name` to `dst_dir/dst_name`, replacing a
    /// destination file (or empty directory). The entry is never lost: the
    /// new name is written before the old one is removed.
    pub fn rename(
        &self,
        src_dir: u128,
        src_name: &str,
        dst_dir: u128,
        dst_name: &str,
    ) -> FsResult<()> {
        check_name(dst_name)?;
        let e = self.lookup(src_dir, src_name)?;
        if src_dir == dst_dir && src_name == dst_name {
            return Ok(());
        }
        let replaced = match self.lookup_versioned(dst_dir, dst_name) {
            Ok((old, v)) => Some((old, v)),
            Err(FsError::NotFound(_)) => None,
            Err(err) => return Err(err),
        };
        let key = self.entry_key(dst_dir, dst_name);
        match &replaced {
            Some((old, version)) => {
                if old.kind == EntryKind::Dir {
                    if e.kind != EntryKind::Dir {
                        return Err(FsError::IsDir(dst_name.to_string()));
                    }
                    if !self.readdir_page(old.object, None, 1)?.0.is_empty() {
                        return Err(FsError::NotEmpty(dst_name.to_string()));
                    }
                } else if e.kind == EntryKind::Dir {
                    return Err(FsError::NotDir(dst_name.to_string()));
                }
                self.client
                    .put_if_version(&key, *version, &e.encode())
                    .map_err(client_err(format!("rename to {dst_name}")))?;
            }
            None => {
                self.insert(dst_dir, dst_name, &e)?;
            }
        }
        self.remove_entry(src_dir, src_name)?;
        if let Some((old, _)) = replaced {
            if old.kind == EntryKind::File && old.object != e.object {
                self.punch_object(old.object, dst_name)?;
            }
        }
        Ok(())
    }

    /// One page of entry names of directory object `dir`, sorted, after
    /// `after`; the bool says whether more follow.
    pub fn readdir_page(
        &self,
        dir: u128,
        after: Option<&str>,
        limit: u32,
    ) -> FsResult<(Vec<String>, bool)> {
        let r = self
            .client
            .request(&Request::ListDkeys {
                container: self.container,
                object: dir,
                after: after.map(|a| a.as_bytes().to_vec()),
                limit,
            })
            .map_err(client_err("readdir"))?;
        match r {
            Reply::Keys { keys, more } => Ok((
                keys.into_iter()
                    .map(|k| String::from_utf8_lossy(&k).into_owned())
                    .collect(),
                more,
            )),
            other => Err(unexpected_reply(
                "readdir",
                "list dkeys",
                self.client.url(),
                other,
            )),
        }
    }

    /// One page of the entries of directory object `dir`, sorted, after
    /// `after`, each with its encoded entry when the engine sent it (it
    /// sends those still in its memory rings); the bool says whether more
    /// follow.
    pub fn readdir_values_page(
        &self,
        dir: u128,
        after: Option<&str>,
        limit: u32,
    ) -> FsResult<(ListedEntries, bool)> {
        let r = self
            .client
            .request(&Request::ListValues {
                container: self.container,
                object: dir,
                akey: entry::ENTRY_AKEY.to_vec(),
                after: after.map(|a| a.as_bytes().to_vec()),
                limit,
            })
            .map_err(client_err("readdir"))?;
        match r {
            Reply::Values { entries, more } => Ok((
                entries
                    .into_iter()
                    .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
                    .collect(),
                more,
            )),
            other => Err(unexpected_reply(
                "readdir",
                "list values",
                self.client.url(),
                other,
            )),
        }
    }

    /// Calls `visit` for every entry of `dir` (paged): one listing per page
    /// carries the entries the engine holds in memory; the others are
    /// looked up together.
    pub fn readdir(
        &self,
        dir: u128,
        mut visit: impl FnMut(&str, Entry) -> FsResult<()>,
    ) -> FsResult<()> {
        let mut after: Option<String> = None;
        loop {
            let (page, more) = self.readdir_values_page(dir, after.as_deref(), READDIR_PAGE)?;
            let missing: Vec<String> = page
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(name, _)| name.clone())
                .collect();
            let mut looked_up = self.lookup_many(dir, &missing)?.into_iter();
            for (name, value) in &page {
                let e = match value {
                    Some(v) => {
                        Some(Entry::decode(v).map_err(|e| FsError::Corrupt(name.clone(), e))?)
                    }
                    None => looked_up.next().flatten(),
                };
                if let Some(e) = e {
                    visit(name, e)?; // None: removed while listing
                }
            }
            match page.last() {
                Some((last, _)) if more => after = Some(last.clone()),
                _ => return Ok(()),
            }
        }
    }

    /// The entries `names` of `dir` at once (one-sided reads overlapped,
    /// the rest in one batch); `None` for names that are gone.
    pub fn lookup_many(&self, dir: u128, names: &[String]) -> FsResult<Vec<Option<Entry>>> {
        let at: Vec<(u128, &str)> = names.iter().map(|n| (dir, n.as_str())).collect();
        (self.lookup_entries(&at).into_iter())
            .map(|r| match r {
                Ok((e, _)) => Ok(Some(e)),
                Err(FsError::NotFound(_)) => Ok(None),
                Err(e) => Err(e),
            })
            .collect()
    }

    /// Changes mode, owner or times of `name` in `dir` (None = unchanged).
    pub fn setattr(&self, dir: u128, name: &str, attr: SetAttr) -> FsResult<Entry> {
        self.update_entry(dir, name, |e| {
            if let Some(m) = attr.mode {
                e.mode = m & 0o7777;
            }
            if let Some(u) = attr.uid {
                e.uid = u;
            }
            if let Some(g) = attr.gid {
                e.gid = g;
            }
            if let Some(t) = attr.mtime_ns {
                e.mtime_ns = t;
            }
            e.ctime_ns = entry::now_ns();
            true
        })
    }

    /// Read-modify-write of an entry by compare-version; `change` returns
    /// false to leave the entry as it is.
    pub(crate) fn update_entry(
        &self,
        dir: u128,
        name: &str,
        mut change: impl FnMut(&mut Entry) -> bool,
    ) -> FsResult<Entry> {
        const ATTEMPTS: usize = 64;
        for _ in 0..ATTEMPTS {
            let (mut e, version) = self.lookup_versioned(dir, name)?;
            if !change(&mut e) {
                return Ok(e);
            }
            match self
                .client
                .put_if_version(&self.entry_key(dir, name), version, &e.encode())
            {
                Ok(_) => return Ok(e),
                Err(ClientError::VersionMismatch { .. }) => continue,
                Err(err) => return Err(client_err(format!("update {name}"))(err)),
            }
        }
        Err(FsError::Invalid(
            name.to_string(),
            "too many concurrent updates of one entry",
        ))
    }
}

/// Attribute changes for [`Namespace::setattr`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mtime_ns: Option<i64>,
}

/// A file's chunks hold 1 B to 1 MiB (a chunk is one value).
fn check_chunk_bytes(chunk_bytes: u32) -> FsResult<()> {
    if chunk_bytes == 0 || chunk_bytes as usize > ferrite_proto::record::VALUE_MAX_BYTES {
        return Err(FsError::Invalid(
            format!("{chunk_bytes}"),
            "chunk size must be 1 B..1 MiB",
        ));
    }
    Ok(())
}
