//! The IO500 runner's backend on the Ferrite namespace (like IOR's DFS
//! backend): every phase goes through the client library, no POSIX layer.

use super::{EntryKind as FsKind, FileHandle, FsError, Namespace, ROOT_OBJECT};
use crate::io500::backend::{DirEntry, EntryKind, FileStat, Io500Backend};
use std::collections::HashMap;
use std::io;
use std::sync::RwLock;
use std::time::{Duration, UNIX_EPOCH};

/// The namespace as an IO500 backend. Directory objects made through it are
/// cached by path (the runner makes every parent through the same value).
pub struct FerriteBackend {
    ns: Namespace,
    description: String,
    dirs: RwLock<HashMap<String, u128>>,
}

impl FerriteBackend {
    pub fn new(ns: Namespace, description: String) -> Self {
        Self {
            ns,
            description,
            dirs: RwLock::new(HashMap::new()),
        }
    }

    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    /// Splits `path` into its parent directory's object and the last name.
    fn parent_of<'p>(&self, path: &'p str) -> io::Result<(u128, &'p str)> {
        let (parent, name) = match path.rsplit_once('/') {
            Some((p, n)) => (p, n),
            None => ("", path),
        };
        Ok((self.dir_object(parent)?, name))
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

impl Io500Backend for FerriteBackend {
    type File = FileHandle;

    fn describe(&self) -> String {
        self.description.clone()
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
        let (parent, name) = self.parent_of(path)?;
        self.ns.rmdir(parent, name).map_err(FsError::into_io)?;
        if let Ok(mut d) = self.dirs.write() {
            d.remove(path);
        }
        Ok(())
    }

    fn create(&self, path: &str) -> io::Result<FileHandle> {
        let (parent, name) = self.parent_of(path)?;
        self.ns
            .create(parent, name, 0o644)
            .map_err(FsError::into_io)
    }

    fn open(&self, path: &str) -> io::Result<FileHandle> {
        let (parent, name) = self.parent_of(path)?;
        self.ns.open(parent, name).map_err(FsError::into_io)
    }

    fn write_at(&self, file: &FileHandle, offset: u64, data: &[u8]) -> io::Result<()> {
        self.ns.write(file, offset, data).map_err(FsError::into_io)
    }

    fn read_at(&self, file: &FileHandle, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.ns.read(file, offset, buf).map_err(FsError::into_io)
    }

    fn sync(&self, file: &FileHandle) -> io::Result<()> {
        self.ns.fsync(file).map_err(FsError::into_io)
    }

    fn close(&self, file: FileHandle) -> io::Result<()> {
        self.ns.close(file).map_err(FsError::into_io)
    }

    fn stat(&self, path: &str) -> io::Result<FileStat> {
        if path.is_empty() {
            return Ok(to_stat(&self.ns.root_entry()));
        }
        let (parent, name) = self.parent_of(path)?;
        let e = self.ns.lookup(parent, name).map_err(FsError::into_io)?;
        Ok(to_stat(&e))
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        let (parent, name) = self.parent_of(path)?;
        self.ns.unlink(parent, name).map_err(FsError::into_io)
    }

    fn readdir(
        &self,
        path: &str,
        visit: &mut dyn FnMut(DirEntry) -> io::Result<()>,
    ) -> io::Result<()> {
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
