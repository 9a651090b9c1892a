//! The `fuser::Filesystem` operations of [`FerriteFuse`].

use super::*;

macro_rules! tri {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(errno) => return $reply.error(errno),
        }
    };
}

impl Filesystem for FerriteFuse {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let name = tri!(reply, name_str(name));
        let dir = tri!(reply, self.dir_object(parent));
        let e = tri!(reply, self.ns.lookup(dir, name).map_err(|e| e.errno()));
        self.reply_new_entry(dir, name, &e, reply);
    }

    fn forget(&mut self, _req: &Request<'_>, ino: u64, nlookup: u64) {
        self.inodes.forget(ino, nlookup);
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        let e = tri!(reply, self.entry_of(ino));
        reply.attr(&ATTR_TTL, &self.attr(ino, &e));
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        if ino == ROOT_INO {
            return reply.attr(&ATTR_TTL, &self.attr(ino, &self.ns.root_entry()));
        }
        let (parent, name, _) = tri!(reply, self.node(ino));
        if let Some(size) = size {
            tri!(
                reply,
                self.ns.truncate(parent, &name, size).map_err(|e| e.errno())
            );
        }
        let change = SetAttr {
            mode,
            uid,
            gid,
            mtime_ns: mtime.map(time_ns),
        };
        let e = tri!(
            reply,
            self.ns
                .setattr(parent, &name, change)
                .map_err(|e| e.errno())
        );
        reply.attr(&ATTR_TTL, &self.attr(ino, &e));
    }

    fn readlink(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyData) {
        let e = tri!(reply, self.entry_of(ino));
        if e.kind != EntryKind::Symlink {
            return reply.error(libc::EINVAL);
        }
        reply.data(&e.link);
    }

    fn mknod(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(libc::EPERM);
        }
        let name = tri!(reply, name_str(name));
        let (ino, id, attr) = tri!(reply, self.make_file(req, parent, name, mode & !umask));
        if let Some((_, fh)) = self.files.remove(&id) {
            if let Ok(fh) = Arc::try_unwrap(fh) {
                tri!(reply, self.ns.close(fh).map_err(|e| e.errno()));
            }
        }
        let _ = ino;
        reply.entry(&ATTR_TTL, &attr, 0);
    }

    fn mkdir(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let name = tri!(reply, name_str(name));
        let dir = tri!(reply, self.dir_object(parent));
        tri!(
            reply,
            self.ns
                .mkdir(dir, name, mode & !umask)
                .map_err(|e| e.errno())
        );
        let e = tri!(reply, self.own(dir, name, req).map_err(|e| e.errno()));
        self.reply_new_entry(dir, name, &e, reply);
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let name = tri!(reply, name_str(name));
        let dir = tri!(reply, self.dir_object(parent));
        tri!(reply, self.ns.unlink(dir, name).map_err(|e| e.errno()));
        reply.ok();
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let name = tri!(reply, name_str(name));
        let dir = tri!(reply, self.dir_object(parent));
        tri!(reply, self.ns.rmdir(dir, name).map_err(|e| e.errno()));
        reply.ok();
    }

    fn symlink(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        use std::os::unix::ffi::OsStrExt;
        let name = tri!(reply, name_str(link_name));
        let dir = tri!(reply, self.dir_object(parent));
        tri!(
            reply,
            self.ns
                .symlink(dir, name, target.as_os_str().as_bytes())
                .map_err(|e| e.errno())
        );
        let e = tri!(reply, self.own(dir, name, req).map_err(|e| e.errno()));
        self.reply_new_entry(dir, name, &e, reply);
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        let name = tri!(reply, name_str(name));
        let newname = tri!(reply, name_str(newname));
        let src = tri!(reply, self.dir_object(parent));
        let dst = tri!(reply, self.dir_object(newparent));
        if flags & !libc::RENAME_NOREPLACE != 0 {
            return reply.error(libc::EINVAL);
        }
        if flags & libc::RENAME_NOREPLACE != 0 && self.ns.lookup(dst, newname).is_ok() {
            return reply.error(libc::EEXIST);
        }
        let e = tri!(reply, self.ns.lookup(src, name).map_err(|e| e.errno()));
        tri!(
            reply,
            self.ns
                .rename(src, name, dst, newname)
                .map_err(|e| e.errno())
        );
        self.inodes.moved(e.object, dst, newname);
        reply.ok();
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        let (parent, name, _) = tri!(reply, self.node(ino));
        let fh = tri!(reply, self.ns.open(parent, &name).map_err(|e| e.errno()));
        let id = self.handle_id();
        self.files.insert(id, (ino, Arc::new(fh)));
        reply.opened(id, 0);
    }

    fn create(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let name = tri!(reply, name_str(name));
        let (_, id, attr) = tri!(reply, self.make_file(req, parent, name, mode & !umask));
        reply.created(&ATTR_TTL, &attr, 0, id, 0);
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock: Option<u64>,
        reply: ReplyData,
    ) {
        let Some((_, h)) = self.files.get(&fh) else {
            return reply.error(libc::EBADF);
        };
        let mut buf = vec![0u8; size as usize];
        let n = tri!(
            reply,
            self.ns
                .read(h, offset.max(0) as u64, &mut buf)
                .map_err(|e| e.errno())
        );
        reply.data(&buf[..n]);
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        _wflags: u32,
        _flags: i32,
        _lock: Option<u64>,
        reply: ReplyWrite,
    ) {
        let Some((_, h)) = self.files.get(&fh) else {
            return reply.error(libc::EBADF);
        };
        tri!(
            reply,
            self.ns
                .write(h, offset.max(0) as u64, data)
                .map_err(|e| e.errno())
        );
        reply.written(data.len() as u32);
    }

    fn flush(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _lock_owner: u64,
        reply: ReplyEmpty,
    ) {
        tri!(reply, self.publish(fh));
        reply.ok();
    }

    fn fsync(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        tri!(reply, self.fsync_handle(fh));
        reply.ok();
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        _lock: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let result = self.publish(fh);
        self.files.remove(&fh);
        tri!(reply, result);
        reply.ok();
    }

    fn opendir(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        let dir = tri!(reply, self.dir_object(ino));
        let mut listing: Listing = vec![
            (".".into(), FileType::Directory, dir),
            ("..".into(), FileType::Directory, dir),
        ];
        tri!(
            reply,
            self.ns
                .readdir(dir, |name, e| {
                    listing.push((name.to_string(), file_type(e.kind), e.object));
                    Ok(())
                })
                .map_err(|e| e.errno())
        );
        let id = self.handle_id();
        self.dirs.insert(id, listing);
        reply.opened(id, 0);
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let Some(listing) = self.dirs.get(&fh) else {
            return reply.error(libc::EBADF);
        };
        for (i, (name, kind, object)) in listing.iter().enumerate().skip(offset.max(0) as usize) {
            // d_ino is informational; the object id's low bits keep it stable.
            let d_ino = (*object as u64) | 2;
            if reply.add(d_ino, i as i64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        reply: ReplyEmpty,
    ) {
        self.dirs.remove(&fh);
        reply.ok();
    }

    /// The engine's space ([`ferrite_client::fs::space::Space`]): its targets'
    /// ceilings as the size, their live data as used. Inodes are not
    /// counted apart (each takes a few records of the same space): the
    /// free inodes are the free blocks.
    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let space = match self.ns.space() {
            Ok(space) => space,
            Err(e) => return reply.error(e.errno()),
        };
        let block = u64::from(BLOCK_BYTES);
        let (blocks, free) = (space.total_bytes / block, space.free_bytes() / block);
        reply.statfs(
            blocks,
            free,
            free,
            blocks,
            free,
            BLOCK_BYTES,
            255,
            BLOCK_BYTES,
        );
    }
}
