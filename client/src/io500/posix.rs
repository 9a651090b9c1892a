//! [`PosixBackend`]: the IO500 phases through plain POSIX calls on any directory (ext4, tmpfs,
//! a FUSE mount), so a local file system and Ferrite are measured by the same code.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::backend::{DirEntry, EntryKind, FileStat, Io500Backend};

/// Runs every call as the matching system call under `root` (`mkdir`, `open(O_CREAT|O_EXCL)`,
/// `pwrite`, `pread`, `fsync`, `close`, `stat`, `unlink`, `rmdir`, `readdir`).
#[derive(Debug)]
pub struct PosixBackend {
    root: PathBuf,
}

impl PosixBackend {
    /// A backend rooted at the existing directory `root`.
    pub fn new(root: impl Into<PathBuf>) -> io::Result<Self> {
        let root = root.into();
        let meta = fs::metadata(&root)?;
        if !meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a directory", root.display()),
            ));
        }
        Ok(Self { root })
    }

    /// The directory every path is relative to.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn full(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }
}

/// The file system type under `path`, from statfs(2), for reports.
fn fs_type(path: &Path) -> &'static str {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return "unknown";
    };
    let mut info = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated string that outlives the call, and `info` points
    // to writable memory of the size statfs(2) fills.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), info.as_mut_ptr()) };
    if rc != 0 {
        return "unknown";
    }
    // SAFETY: statfs returned 0, so it initialised `info`.
    let info = unsafe { info.assume_init() };
    // Magic numbers from linux/magic.h.
    match info.f_type as u64 {
        0xEF53 => "ext4",
        0x0102_1994 => "tmpfs",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x6573_5546 => "fuse",
        0x6969 => "nfs",
        0x794C_7630 => "overlayfs",
        _ => "other",
    }
}

fn kind_of(file_type: fs::FileType) -> EntryKind {
    if file_type.is_file() {
        EntryKind::File
    } else if file_type.is_dir() {
        EntryKind::Directory
    } else {
        EntryKind::Other
    }
}

impl Io500Backend for PosixBackend {
    type File = File;

    fn describe(&self) -> String {
        format!("posix:{} ({})", self.root.display(), fs_type(&self.root))
    }

    fn mkdir(&self, path: &str) -> io::Result<()> {
        fs::create_dir(self.full(path))
    }

    fn rmdir(&self, path: &str) -> io::Result<()> {
        fs::remove_dir(self.full(path))
    }

    fn create(&self, path: &str) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(self.full(path))
    }

    fn open(&self, path: &str) -> io::Result<File> {
        File::open(self.full(path))
    }

    fn write_at(&self, file: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        file.write_all_at(data, offset)
    }

    fn read_at(&self, file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn sync(&self, file: &File) -> io::Result<()> {
        file.sync_all()
    }

    fn close(&self, file: File) -> io::Result<()> {
        // close(2) errors are not reported by std's Drop; data errors surface at fsync, which
        // the ior phases call before closing.
        drop(file);
        Ok(())
    }

    fn stat(&self, path: &str) -> io::Result<FileStat> {
        let meta = fs::symlink_metadata(self.full(path))?;
        Ok(FileStat {
            kind: kind_of(meta.file_type()),
            size_bytes: meta.len(),
            mtime: meta.modified()?,
        })
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        fs::remove_file(self.full(path))
    }

    fn readdir(
        &self,
        path: &str,
        visit: &mut dyn FnMut(DirEntry) -> io::Result<()>,
    ) -> io::Result<()> {
        for entry in fs::read_dir(self.full(path))? {
            let entry = entry?;
            let name = entry.file_name().into_string().map_err(|raw| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("entry name is not UTF-8: {raw:?}"),
                )
            })?;
            // d_type from getdents: no extra stat. The size and mtime are not in a dirent, so
            // `stat` stays None and the find phase stats the files it must check, as pfind does.
            let kind = kind_of(entry.file_type()?);
            visit(DirEntry {
                name,
                kind,
                stat: None,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_is_exclusive_and_rmdir_refuses_non_empty() {
        let dir = tempfile::tempdir().unwrap();
        let b = PosixBackend::new(dir.path()).unwrap();
        b.mkdir("d").unwrap();
        let f = b.create("d/f").unwrap();
        b.write_at(&f, 10, b"abc").unwrap();
        b.close(f).unwrap();
        let again = b.create("d/f").map(|_| ()).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AlreadyExists);
        assert!(b.rmdir("d").is_err(), "non-empty rmdir must fail");
        let st = b.stat("d/f").unwrap();
        assert_eq!(st.kind, EntryKind::File);
        assert_eq!(st.size_bytes, 13);
        let f = b.open("d/f").unwrap();
        let mut buf = [0xffu8; 20];
        assert_eq!(b.read_at(&f, 0, &mut buf).unwrap(), 13);
        assert_eq!(&buf[..13], b"\0\0\0\0\0\0\0\0\0\0abc");
        let mut names = Vec::new();
        b.readdir("d", &mut |e| {
            names.push((e.name, e.kind));
            Ok(())
        })
        .unwrap();
        assert_eq!(names, vec![("f".to_string(), EntryKind::File)]);
        b.unlink("d/f").unwrap();
        b.rmdir("d").unwrap();
    }

    #[test]
    fn new_rejects_a_file_as_root() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        fs::write(&file, b"x").unwrap();
        assert!(PosixBackend::new(&file).is_err());
    }
}
