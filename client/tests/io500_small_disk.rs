//! Guards the embedded `ferrite io500` on a file system with little free space: the
//! engine's device files are sparse, so a run sized for the device alone would hit ENOSPC
//! mid-run and poison its targets. The run fits its write phases to the free space instead,
//! says so, and passes. Mounts a 1 GiB tmpfs as the temp directory (needs root, as the
//! FUSE tests do).

use std::path::Path;
use std::process::Command;

struct Mounted<'a>(&'a Path);

impl Drop for Mounted<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

#[test]
fn a_run_on_a_small_disk_fits_its_caps_and_passes() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "mounting a tmpfs needs root");
    let dir = tempfile::tempdir().unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1g", "tmpfs"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(ok.success(), "mount -t tmpfs");
    let _mounted = Mounted(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .env("TMPDIR", dir.path())
        .args([
            "io500",
            "--stonewall",
            "1s",
            "--tasks",
            "2",
            "--no-progress",
            "--json",
        ])
        .args(["--embedded-bdev-size", "2GiB"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    assert!(stderr.contains("caps are scaled"), "stderr: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert!(
        report["score"].as_f64().is_some_and(|s| s > 0.0),
        "{report}"
    );
    assert_eq!(report["verify_errors"].as_u64(), Some(0), "{report}");
    // The engine removed its directory: the tmpfs is empty again.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
