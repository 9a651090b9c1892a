//! Whole runs through the POSIX backend on a temp directory: every phase's counts agree with
//! each other, reads verify, find finds what was made, deletes empty the directories, and a
//! corrupted byte or a failing call is caught. Each run is bounded by per-task caps (and a
//! stonewall), so none depends on the machine's speed for what it asserts.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::backend::{DirEntry, FileStat, Io500Backend};
use super::find::name_matches;
use super::layout::Layout;
use super::{run, Config, Io500Error, PosixBackend, RunReport};

const ORDER: [&str; 12] = [
    "ior-easy-write",
    "mdtest-easy-write",
    "ior-hard-write",
    "mdtest-hard-write",
    "find",
    "ior-easy-read",
    "mdtest-easy-stat",
    "ior-hard-read",
    "mdtest-hard-stat",
    "mdtest-easy-delete",
    "mdtest-hard-read",
    "mdtest-hard-delete",
];

/// A config whose caps, not the (long) stonewall, end every write phase.
fn capped(tasks: usize) -> Config {
    let mut c = Config::new(tasks, Duration::from_secs(600));
    c.ior_easy_max_transfers = 3;
    c.ior_hard_max_segments = 40;
    c.mdtest_easy_max_files = 150;
    c.mdtest_hard_max_files = 230;
    c
}

fn ops(report: &RunReport, phase: &str) -> u64 {
    report.phase(phase).map(|p| p.ops).unwrap_or(u64::MAX)
}

fn assert_consistent(report: &RunReport, tasks: u64) {
    let names: Vec<&str> = report.phases.iter().map(|p| p.name).collect();
    assert_eq!(names, ORDER);
    assert_eq!(report.verify_errors, 0, "{}", report.table());
    assert_eq!(report.leftover_entries, 0);
    assert!(report.passed());
    // Every task ends a write phase with the same count (wear-out) and the follow-up
    // phases handle exactly what was written.
    for (write, follow_ups) in [
        ("ior-easy-write", &["ior-easy-read"][..]),
        ("ior-hard-write", &["ior-hard-read"][..]),
        (
            "mdtest-easy-write",
            &["mdtest-easy-stat", "mdtest-easy-delete"][..],
        ),
        (
            "mdtest-hard-write",
            &["mdtest-hard-stat", "mdtest-hard-read", "mdtest-hard-delete"][..],
        ),
    ] {
        let written = ops(report, write);
        assert!(written >= tasks, "{write} did at least one op per task");
        assert_eq!(written % tasks, 0, "{write}: equal counts per task");
        for f in follow_ups {
            assert_eq!(ops(report, f), written, "{f} vs {write}");
        }
    }
    // find's expectation, recomputed here from the mdtest-hard count alone.
    let per_task = ops(report, "mdtest-hard-write") / tasks;
    let expected: u64 = (0..tasks as usize)
        .map(|t| {
            (0..per_task)
                .filter(|&i| name_matches(&Layout::mdtest_name(t, i)))
                .count() as u64
        })
        .sum();
    assert_eq!(report.find_expected, expected);
    assert_eq!(report.find_found, expected);
    let files = tasks * 2 + ops(report, "mdtest-easy-write") + ops(report, "mdtest-hard-write");
    // Every file present (ior-easy per task, ior-hard, mdtest) was examined.
    assert_eq!(ops(report, "find"), files - tasks + 1);
    assert!(report.score.score > 0.0);
}

fn dir_is_empty(path: &std::path::Path) -> bool {
    std::fs::read_dir(path)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false)
}

#[test]
fn capped_run_has_exact_counts_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let backend = PosixBackend::new(dir.path()).unwrap();
    let report = run(&backend, &capped(3)).unwrap();
    assert_consistent(&report, 3);
    assert_eq!(ops(&report, "ior-easy-write"), 9);
    assert_eq!(ops(&report, "ior-hard-write"), 120);
    assert_eq!(ops(&report, "mdtest-easy-write"), 450);
    assert_eq!(ops(&report, "mdtest-hard-write"), 690);
    // Indices 101 and 201 of each task contain "01".
    assert_eq!(report.find_found, 6);
    let easy = report.phase("ior-easy-read").unwrap();
    assert_eq!(easy.bytes, 9 * (2 << 20));
    assert!(dir_is_empty(dir.path()), "run directory removed");
}

#[test]
fn short_stonewall_run_is_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let backend = PosixBackend::new(dir.path()).unwrap();
    let mut config = Config::new(2, Duration::from_millis(100));
    config.ior_easy_max_transfers = 16;
    config.ior_hard_max_segments = 500;
    config.mdtest_easy_max_files = 5000;
    config.mdtest_hard_max_files = 5000;
    let report = run(&backend, &config).unwrap();
    assert_consistent(&report, 2);
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    for key in ["score", "bw_gib_s", "md_kiops"] {
        assert!(json[key].as_f64().unwrap() > 0.0, "{key}");
    }
    let phases = json["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 12);
    assert_eq!(phases[0]["unit"], "GiB/s");
    assert_eq!(phases[4]["name"], "find");
    assert_eq!(phases[4]["unit"], "kIOPS");
    assert!(phases.iter().all(|p| p["seconds"].as_f64().unwrap() > 0.0));
}

#[test]
fn keep_leaves_the_ior_files() {
    let dir = tempfile::tempdir().unwrap();
    let backend = PosixBackend::new(dir.path()).unwrap();
    let mut config = capped(1);
    config.keep = true;
    let report = run(&backend, &config).unwrap();
    assert!(report.passed());
    let layout = Layout::new(config.run_seed);
    let easy = dir.path().join(layout.ior_easy_file(0));
    assert_eq!(std::fs::metadata(easy).unwrap().len(), 3 * (2 << 20));
    assert!(dir.path().join(layout.ior_hard_file()).exists());
    assert!(dir_is_empty(&dir.path().join(layout.mdtest_hard_dir())));
}

/// Wraps a backend: flips one byte of what the first read of a path ending in
/// `corrupt_suffix` returns, and, with `fail_stat`, fails the stat of one mdtest-easy file.
struct Faulty {
    inner: PosixBackend,
    corrupt_suffix: Option<&'static str>,
    corrupted: AtomicBool,
    fail_stat: bool,
}

struct FaultyFile {
    file: std::fs::File,
    path: String,
}

impl Io500Backend for Faulty {
    type File = FaultyFile;
    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }
    fn mkdir(&self, path: &str) -> io::Result<()> {
        self.inner.mkdir(path)
    }
    fn rmdir(&self, path: &str) -> io::Result<()> {
        self.inner.rmdir(path)
    }
    fn create(&self, path: &str) -> io::Result<FaultyFile> {
        let file = self.inner.create(path)?;
        Ok(FaultyFile {
            file,
            path: path.into(),
        })
    }
    fn open(&self, path: &str) -> io::Result<FaultyFile> {
        let file = self.inner.open(path)?;
        Ok(FaultyFile {
            file,
            path: path.into(),
        })
    }
    fn write_at(&self, f: &FaultyFile, offset: u64, data: &[u8]) -> io::Result<()> {
        self.inner.write_at(&f.file, offset, data)
    }
    fn read_at(&self, f: &FaultyFile, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read_at(&f.file, offset, buf)?;
        let hit = self.corrupt_suffix.is_some_and(|s| f.path.ends_with(s));
        if hit && n > 100 && !self.corrupted.swap(true, Ordering::Relaxed) {
            buf[100] ^= 0x20;
        }
        Ok(n)
    }
    fn sync(&self, f: &FaultyFile) -> io::Result<()> {
        self.inner.sync(&f.file)
    }
    fn close(&self, f: FaultyFile) -> io::Result<()> {
        self.inner.close(f.file)
    }
    fn stat(&self, path: &str) -> io::Result<FileStat> {
        // A name without "01", so find never stats it and mdtest-easy-stat is the first.
        if self.fail_stat && path.ends_with("/file.mdtest.1.5") {
            return Err(io::Error::other("injected stat failure"));
        }
        self.inner.stat(path)
    }
    fn unlink(&self, path: &str) -> io::Result<()> {
        self.inner.unlink(path)
    }
    fn readdir(
        &self,
        path: &str,
        visit: &mut dyn FnMut(DirEntry) -> io::Result<()>,
    ) -> io::Result<()> {
        self.inner.readdir(path, visit)
    }
}

fn faulty(dir: &std::path::Path, corrupt_suffix: Option<&'static str>, fail_stat: bool) -> Faulty {
    Faulty {
        inner: PosixBackend::new(dir).unwrap(),
        corrupt_suffix,
        corrupted: AtomicBool::new(false),
        fail_stat,
    }
}

#[test]
fn one_corrupted_byte_in_each_kind_of_read_is_counted() {
    for (suffix, phase) in [
        ("ior_file_easy.00000001", "ior-easy-read"),
        ("IOR_file", "ior-hard-read"),
        ("file.mdtest.0.7", "mdtest-hard-read"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let backend = faulty(dir.path(), Some(suffix), false);
        let report = run(&backend, &capped(2)).unwrap();
        assert_eq!(report.verify_errors, 1, "{phase}");
        assert_eq!(report.phase(phase).unwrap().errors, 1, "{phase}");
        assert!(!report.passed());
    }
}

#[test]
fn a_failing_call_stops_the_run_with_context_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let backend = faulty(dir.path(), None, true);
    let err = run(&backend, &capped(2)).unwrap_err();
    match &err {
        Io500Error::Io {
            phase, op, path, ..
        } => {
            assert_eq!(*phase, "mdtest-easy-stat");
            assert_eq!(*op, "stat");
            assert!(path.contains("mdtest-easy"), "{path}");
        }
        other => panic!("unexpected error {other}"),
    }
    assert!(err.to_string().contains("injected stat failure"));
    assert!(
        dir_is_empty(dir.path()),
        "run directory removed after the failure"
    );
}
