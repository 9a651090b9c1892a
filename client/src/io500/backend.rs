//! The storage backend the IO500 runner drives, and what each call must guarantee.
//!
//! The runner only ever talks to storage through [`Io500Backend`]. The trait is shaped like a
//! DAOS DFS namespace (`dfs_mkdir`, `dfs_open`, `dfs_write`/`dfs_read` at an offset,
//! `dfs_release`, `dfs_stat`, `dfs_remove`, `dfs_readdir`) so that a namespace built on
//! engine objects implements it without a POSIX layer in between, and so that the same phases
//! run unchanged on a local file system through [`crate::io500::posix::PosixBackend`].
//!
//! # Paths
//! Every path the runner passes is *relative to the backend's root*, uses `/` as separator,
//! has no leading or trailing `/`, no empty component, and no `.` or `..`. The parent of a
//! path given to [`Io500Backend::mkdir`] or [`Io500Backend::create`] was made earlier by
//! `mkdir` through the same backend value, so a backend may cache directory lookups for the
//! life of the value. The runner never renames and never uses a directory deeper than three
//! components.
//!
//! # Concurrency
//! One backend value is shared by every client task (one thread each, `Send + Sync`). Calls
//! may come from all tasks at once. A [`Io500Backend::File`] handle may also be shared:
//! ior-hard creates one handle and all tasks call `write_at` on it concurrently at disjoint
//! ranges; every such write must land.
//!
//! # Errors
//! Methods return [`std::io::Result`] so any namespace can map its own errors onto the usual
//! kinds: `NotFound`, `AlreadyExists`, `DirectoryNotEmpty`, `InvalidInput`, or `Other` with
//! its own error as source. The runner adds the phase, operation and path as context.

use std::io;
use std::time::SystemTime;

/// What a directory entry or a stat result is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// Anything else (symlink, device...). The runner never creates one.
    Other,
}

/// What [`Io500Backend::stat`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    /// File or directory.
    pub kind: EntryKind,
    /// Size in bytes: the end of the highest byte written for a file.
    pub size_bytes: u64,
    /// Last modification time. A file created after another file was closed must have an
    /// `mtime` no earlier than that file's (the find phase relies on it).
    pub mtime: SystemTime,
}

/// Which call of a file's create, write and close failed, and how.
#[derive(Debug)]
pub struct FileOpError {
    /// The operation that failed: `create`, `open`, `read`, `read_at`, `write_at` or
    /// `close`.
    pub op: &'static str,
    pub error: io::Error,
}

impl FileOpError {
    /// Wraps the error of `op` (for `map_err`).
    pub fn of(op: &'static str) -> impl Fn(io::Error) -> Self {
        move |error| Self { op, error }
    }
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name (one path component).
    pub name: String,
    /// File or directory.
    pub kind: EntryKind,
    /// The entry's stat, if the backend gets it for free with the listing (a namespace whose
    /// directory entries carry size and times). When `None`, the find phase calls
    /// [`Io500Backend::stat`] itself.
    pub stat: Option<FileStat>,
}

/// A storage namespace the IO500 phases run against.
///
/// Contracts every implementation keeps (the runner's checks fail otherwise):
/// - After `write_at(f, o, d)` returned and `f` was closed, a fresh `open` + `read_at` of the
///   same range from any task returns `d` (the IO500 rule: written and closed by one client,
///   read back by another).
/// - Space never written inside a file's size reads as zeros.
/// - `create` on an existing name fails with `AlreadyExists`; `rmdir` of a non-empty
///   directory fails with `DirectoryNotEmpty` and changes nothing.
/// - `readdir` reports every entry present when it started and not removed while it ran,
///   exactly once, and never `.` or `..`.
pub trait Io500Backend: Send + Sync {
    /// An open file. May be used by several tasks at once (see the module guide).
    type File: Send + Sync;

    /// A short description for reports, e.g. `posix:/mnt/ext4 (ext4)`.
    fn describe(&self) -> String;

    /// Makes directory `path`. Its parent exists; `path` does not.
    fn mkdir(&self, path: &str) -> io::Result<()>;

    /// Removes the empty directory `path`.
    fn rmdir(&self, path: &str) -> io::Result<()>;

    /// Creates the file `path` (which must not exist) and opens it for writing and reading.
    fn create(&self, path: &str) -> io::Result<Self::File>;

    /// [`create`](Self::create) for the file every task writes at once, each at its own
    /// interleaved offsets (ior-hard's): a backend may lay it out for that, as IO500 runs
    /// on DAOS set ior-hard's chunk size. The default is `create`.
    fn create_shared(&self, path: &str) -> io::Result<Self::File> {
        self.create(path)
    }

    /// Opens the existing file `path` for reading.
    fn open(&self, path: &str) -> io::Result<Self::File>;

    /// Writes all of `data` at byte `offset` of the file, growing it as needed.
    fn write_at(&self, file: &Self::File, offset: u64, data: &[u8]) -> io::Result<()>;

    /// Reads into `buf` from byte `offset`, filling it completely unless the file ends first.
    /// Returns how many bytes were read (less than `buf.len()` only at end of file).
    fn read_at(&self, file: &Self::File, offset: u64, buf: &mut [u8]) -> io::Result<usize>;

    /// Makes the file's written data durable (IOR `-e`: fsync before close). Called once per
    /// file by the ior write phases, never by mdtest.
    fn sync(&self, file: &Self::File) -> io::Result<()>;

    /// Closes the handle. Other tasks see everything written through it once it returned
    /// and the backend was drained ([`drain`](Self::drain)).
    fn close(&self, file: Self::File) -> io::Result<()>;

    /// Size, kind and modification time of `path`.
    fn stat(&self, path: &str) -> io::Result<FileStat>;

    /// Removes the file `path`.
    fn unlink(&self, path: &str) -> io::Result<()>;

    /// Calls `visit` once per entry of directory `path`, in any order. An error from `visit`
    /// stops the listing and is returned. A namespace with paged listings pages inside.
    fn readdir(
        &self,
        path: &str,
        visit: &mut dyn FnMut(DirEntry) -> io::Result<()>,
    ) -> io::Result<()>;

    /// The mdtest write step for several files: creates each `files[i].0` (which must not
    /// exist), writes `files[i].1` at offset 0 if it is not empty, and closes it. Returns one
    /// result per file, in order: each file's own outcome (an existing name fails that file
    /// with `AlreadyExists`, whatever happened to the others), with the operation that failed.
    /// When it returns, every file that succeeded is closed as by [`close`](Self::close).
    /// A backend may keep the files' operations in flight together; the default runs them
    /// one file at a time.
    fn create_files(&self, files: &[(String, &[u8])]) -> Vec<Result<(), FileOpError>> {
        files
            .iter()
            .map(|(path, data)| {
                let file = self.create(path).map_err(FileOpError::of("create"))?;
                let written = if data.is_empty() {
                    Ok(())
                } else {
                    self.write_at(&file, 0, data)
                };
                let closed = self.close(file);
                written.map_err(FileOpError::of("write_at"))?;
                closed.map_err(FileOpError::of("close"))
            })
            .collect()
    }

    /// Removes the files `paths`, one result per path, in order, each the path's own
    /// outcome. When it returns, every name that succeeded is gone as after
    /// [`unlink`](Self::unlink). A backend may keep the removals in flight together; the
    /// default removes one file at a time.
    fn unlink_files(&self, paths: &[String]) -> Vec<io::Result<()>> {
        paths.iter().map(|p| self.unlink(p)).collect()
    }

    /// [`stat`](Self::stat) of each of `paths`: one result per path, in order, each the
    /// path's own outcome. A backend may look them up together; the default stats one path
    /// at a time.
    fn stat_files(&self, paths: &[String]) -> Vec<io::Result<FileStat>> {
        paths.iter().map(|p| self.stat(p)).collect()
    }

    /// The mdtest read step for several files: opens each of `paths`, reads it from offset 0
    /// into `bufs[i]` (as much as the file has, at most the buffer's length) and closes it.
    /// One result per path, in order: the bytes read, or the path's own failure with the
    /// operation that failed. `paths` and `bufs` have the same length. A backend may look
    /// the files up and load them together; the default reads one file at a time.
    fn read_files(
        &self,
        paths: &[String],
        bufs: &mut [Vec<u8>],
    ) -> Vec<Result<usize, FileOpError>> {
        (paths.iter().zip(bufs.iter_mut()))
            .map(|(path, buf)| {
                let file = self.open(path).map_err(FileOpError::of("open"))?;
                let got = self.read_at(&file, 0, buf);
                let closed = self.close(file);
                let got = got.map_err(FileOpError::of("read_at"))?;
                closed.map_err(FileOpError::of("close"))?;
                Ok(got)
            })
            .collect()
    }

    /// Completes every operation the backend left in flight (a close or unlink acknowledged
    /// before its storage requests were) and reports the first failure among them. Each
    /// task of a phase calls it before it finishes, so the phase's time includes them.
    fn drain(&self) -> io::Result<()> {
        Ok(())
    }

    /// Requests sent to the storage so far (a batch of requests counts once), for the
    /// per-phase round trips of the report; `None` when the backend does not count them.
    fn round_trips(&self) -> Option<u64> {
        None
    }

    /// The storage's own counters at the end of a run (for a Ferrite engine, summed over
    /// its targets: cleaner passes, bytes copied, waits...), for the report; empty when
    /// the backend has none.
    fn storage_counters(&self) -> std::collections::BTreeMap<String, u64> {
        Default::default()
    }
}
