//! The FUSE mount: the file namespace served to the kernel with `fuser`, so
//! that cp, tar, rsync, find, dd, fio and compilers work on Ferrite.
//!
//! Attributes and entries are cached by the kernel for [`ATTR_TTL`]; sizes
//! of files this mount has open include what its handles wrote and not yet
//! published. Data written through a handle is published (size, mtime) on
//! flush, fsync and release, so other clients see it after close.

mod inodes;

use crate::fs::{Entry, EntryKind, FileHandle, FsError, FsResult, Namespace, SetAttr, ROOT_OBJECT};
use fuser::{
    FileAttr, FileType, Filesystem, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};
use inodes::{Inodes, ROOT_INO};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may cache attributes and entries.
pub const ATTR_TTL: Duration = Duration::from_secs(1);
const BLOCK_BYTES: u32 = 4096;

/// A listing snapshot taken at opendir: (name, kind, object).
type Listing = Vec<(String, FileType, u128)>;

/// The filesystem the kernel talks to.
pub struct FerriteFuse {
    ns: Namespace,
    inodes: Inodes,
    files: HashMap<u64, (u64, Arc<FileHandle>)>,
    dirs: HashMap<u64, Listing>,
    next_handle: u64,
}

impl FerriteFuse {
    pub fn new(ns: Namespace) -> Self {
        Self {
            ns,
            inodes: Inodes::new(ROOT_OBJECT),
            files: HashMap::new(),
            dirs: HashMap::new(),
            next_handle: 1,
        }
    }

    fn handle_id(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    /// The directory object and entry name behind `ino`.
    fn node(&self, ino: u64) -> Result<(u128, String, u128), i32> {
        self.inodes
            .get(ino)
            .map(|n| (n.parent, n.name.clone(), n.object))
            .ok_or(libc::ESTALE)
    }

    fn entry_of(&self, ino: u64) -> Result<Entry, i32> {
        if ino == ROOT_INO {
            return Ok(self.ns.root_entry());
        }
        let (parent, name, object) = self.node(ino)?;
        let e = self.ns.lookup(parent, &name).map_err(|e| e.errno())?;
        if e.object != object {
            return Err(libc::ESTALE);
        }
        Ok(e)
    }

    /// Size including unpublished writes of this mount's open handles.
    fn local_size(&self, ino: u64, e: &Entry) -> u64 {
        self.files
            .values()
            .filter(|(i, _)| *i == ino)
            .map(|(_, fh)| fh.size())
            .fold(e.size, u64::max)
    }

    fn attr(&self, ino: u64, e: &Entry) -> FileAttr {
        let size = self.local_size(ino, e);
        let t = |ns: i64| UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64);
        let kind = file_type(e.kind);
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: t(e.mtime_ns),
            mtime: t(e.mtime_ns),
            ctime: t(e.ctime_ns),
            crtime: t(e.ctime_ns),
            kind,
            perm: (e.mode & 0o7777) as u16,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: e.uid,
            gid: e.gid,
            rdev: 0,
            blksize: BLOCK_BYTES,
            flags: 0,
        }
    }

    fn dir_object(&self, ino: u64) -> Result<u128, i32> {
        let e = self.entry_of(ino)?;
        if e.kind != EntryKind::Dir {
            return Err(libc::ENOTDIR);
        }
        Ok(e.object)
    }

    fn reply_new_entry(&mut self, parent_obj: u128, name: &str, e: &Entry, reply: ReplyEntry) {
        let ino = self.inodes.remember(parent_obj, name, e.object);
        let attr = self.attr(ino, e);
        reply.entry(&ATTR_TTL, &attr, 0);
    }

    /// Sets owner from the request, then stores the entry's change.
    fn own(&self, dir: u128, name: &str, req: &Request<'_>) -> Result<Entry, FsError> {
        let attr = SetAttr {
            uid: Some(req.uid()),
            gid: Some(req.gid()),
            ..SetAttr::default()
        };
        self.ns.setattr(dir, name, attr)
    }

    fn make_file(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &str,
        mode: u32,
    ) -> Result<(u64, u64, FileAttr), i32> {
        let dir = self.dir_object(parent)?;
        let fh = self.ns.create(dir, name, mode).map_err(|e| e.errno())?;
        let e = self.own(dir, name, req).map_err(|e| e.errno())?;
        let fh = self.ns.open(dir, name).unwrap_or(fh);
        let ino = self.inodes.remember(dir, name, e.object);
        let id = self.handle_id();
        self.files.insert(id, (ino, Arc::new(fh)));
        let attr = self.attr(ino, &e);
        Ok((ino, id, attr))
    }

    /// Runs `op` on the open handle `fh` (EBADF if there is none).
    fn on_handle(&self, fh: u64, op: impl FnOnce(&FileHandle) -> FsResult<()>) -> Result<(), i32> {
        match self.files.get(&fh) {
            Some((_, h)) => op(h).map_err(|e| e.errno()),
            None => Err(libc::EBADF),
        }
    }

    fn fsync_handle(&self, fh: u64) -> Result<(), i32> {
        self.on_handle(fh, |h| self.ns.fsync(h))
    }

    fn publish(&self, fh: u64) -> Result<(), i32> {
        self.on_handle(fh, |h| self.ns.publish(h))
    }
}

fn file_type(k: EntryKind) -> FileType {
    match k {
        EntryKind::Dir => FileType::Directory,
        EntryKind::File => FileType::RegularFile,
        EntryKind::Symlink => FileType::Symlink,
    }
}

fn name_str(name: &OsStr) -> Result<&str, i32> {
    name.to_str().ok_or(libc::EINVAL)
}

fn time_ns(t: TimeOrNow) -> i64 {
    let st = match t {
        TimeOrNow::SpecificTime(st) => st,
        TimeOrNow::Now => SystemTime::now(),
    };
    st.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

mod ops;
