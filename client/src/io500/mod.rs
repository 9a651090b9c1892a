//! The IO500-style benchmark behind `ferrite io500`, generic over a storage backend.
//!
//! [`run`] executes the twelve IO500 phases in IO500's order with IO500's shapes against any
//! [`Io500Backend`], with N client tasks (threads):
//!
//! | phase | what each task does |
//! |---|---|
//! | ior-easy-write | 2 MiB transfers into its own file until the stonewall, then fsync |
//! | mdtest-easy-write | empty files in its own directory until the stonewall |
//! | ior-hard-write | 47008-byte transfers into one shared file, segment-interleaved by task |
//! | mdtest-hard-write | 3901-byte files in one shared directory until the stonewall |
//! | find | walk the data tree: newer than the timestamp, 3901 bytes, name `*01*` |
//! | ior-easy-read | read and verify the next task's file |
//! | mdtest-easy-stat | stat the next task's files, check size 0 |
//! | ior-hard-read | read and verify the next task's segments |
//! | mdtest-hard-stat | stat the next task's files, check size 3901 |
//! | mdtest-easy-delete | unlink the next task's files |
//! | mdtest-hard-read | read and verify the next task's 3901-byte files |
//! | mdtest-hard-delete | unlink the next task's files |
//!
//! Write phases follow IO500's stonewall rule: each task stops once the stonewall time has
//! passed, then all tasks continue until each has done the largest count any task reached
//! (IOR `stoneWallingWearOut`); the phase time includes that wear-out. Read phases read back exactly what was
//! written; every byte is checked against the data [`pattern`]. The score is IO500's
//! ([`score`]). After the delete phases the runner checks that the mdtest directories are
//! empty and that find found exactly the files the phases created that match.
//!
//! The mdtest phases hand the backend groups of files (`MDTEST_FILES_PER_GROUP`):
//! [`Io500Backend::create_files`], `stat_files`, `read_files` and `unlink_files`. Each file
//! keeps its own outcome; the posix backend runs a group one file at a time (a kernel file
//! system answers each call on its own), the Ferrite backend keeps a group's requests in
//! flight together and overlaps its one-sided reads.
//!
//! ```
//! use ferrite_client::io500::{run, Config, PosixBackend};
//! use std::time::Duration;
//! let dir = tempfile::tempdir().unwrap();
//! let backend = PosixBackend::new(dir.path()).unwrap();
//! let mut config = Config::new(2, Duration::from_millis(50));
//! config.ior_easy_max_transfers = 2;
//! config.ior_hard_max_segments = 4;
//! config.mdtest_easy_max_files = 20;
//! config.mdtest_hard_max_files = 120;
//! let report = run(&backend, &config).unwrap();
//! assert_eq!(report.phases.len(), 12);
//! assert_eq!(report.verify_errors, 0);
//! assert_eq!(report.find_found, report.find_expected);
//! assert!(report.score.score > 0.0);
//! ```

use std::io;

pub mod backend;
pub mod config;
mod find;
mod ior;
pub mod layout;
mod mdtest;
pub mod pattern;
pub mod phases;
pub mod posix;
pub mod report;
mod runner;
pub mod score;
mod tasks;
#[cfg(test)]
mod tests;
pub mod validity;

pub use backend::{DirEntry, EntryKind, FileOpError, FileStat, Io500Backend};
pub use config::Config;
pub use posix::PosixBackend;
pub use report::RunReport;
pub use runner::run;

/// Everything that can stop a run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Io500Error {
    /// The settings cannot work (zero tasks, zero stonewall...).
    #[error("invalid settings: {0}")]
    Config(String),
    /// A backend call failed.
    #[error("{phase}: {op} {path}: {source}")]
    Io {
        /// The phase that made the call.
        phase: &'static str,
        /// The backend method, e.g. `create`.
        op: &'static str,
        /// The path it was called on.
        path: String,
        /// The backend's error.
        #[source]
        source: io::Error,
    },
    /// This task stopped because another task of the phase failed.
    #[error("{phase}: stopped because another task failed")]
    Aborted {
        /// The phase.
        phase: &'static str,
    },
    /// What the backend holds disagrees with what the phases did.
    #[error("{phase}: {what}")]
    Inconsistent {
        /// The phase or check that noticed.
        phase: &'static str,
        /// What disagreed.
        what: String,
    },
    /// A task thread could not be started or panicked.
    #[error("task thread: {0}")]
    Thread(String),
}

/// Adds phase, operation and path to a backend error.
pub(crate) fn io_context(
    phase: &'static str,
    op: &'static str,
    path: &str,
) -> impl FnOnce(io::Error) -> Io500Error {
    let path = path.to_string();
    move |source| Io500Error::Io {
        phase,
        op,
        path,
        source,
    }
}

/// What every phase needs: the backend, the settings and the paths.
pub(crate) struct Ctx<'a, B: Io500Backend> {
    pub(crate) backend: &'a B,
    pub(crate) config: &'a Config,
    pub(crate) layout: &'a layout::Layout,
}

impl<B: Io500Backend> Ctx<'_, B> {
    /// A progress tracker for `name` honouring the run's progress setting.
    pub(crate) fn progress(
        &self,
        name: &'static str,
        unit: score::Unit,
        goal: tasks::Goal,
    ) -> tasks::Progress {
        tasks::Progress::new(name, unit, goal, self.config.progress)
    }
}
